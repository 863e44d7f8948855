//! The `/v1` routes over an [`AgentView`].

use std::sync::Arc;

use axum::{
    Extension, Json, Router,
    body::{Body, Bytes},
    extract::{DefaultBodyLimit, Path, Request, State, rejection::PathRejection},
    http::{Method, StatusCode, Uri, header},
    response::{IntoResponse, Response},
    routing::get,
};
use tokio::sync::broadcast::{self, error::RecvError};
use tokio_util::sync::CancellationToken;

use super::{
    AgentView, ApiError, MAX_BODY_BYTES, Refusal, error_response,
    extract::{json_body, path_id, path_ids},
};
use crate::{
    EVENTS_CONTENT_TYPE, METRICS_CONTENT_TYPE,
    types::{EventLine, PluginList, PluginStatus, RegisterRequest},
};

/// Set by [`super::Listeners::serve`]: cancelled when the server starts draining, so endless
/// responses (the event stream) end and their connections can close.
#[derive(Debug, Clone)]
pub(super) struct Draining(pub(super) CancellationToken);

/// The API's routes over `view` (see the crate docs for the table). Every error, including an
/// unknown route (404) or method (405), is a JSON [`crate::ErrorBody`]. Ids and bodies are
/// checked before the view is called (see the [module docs](super)): a request that fails a
/// check is answered 400 (413 for a body over [`MAX_BODY_BYTES`], 408 for one that is too
/// slow) naming the field, and the view never sees it.
///
/// Served by [`super::Listeners::serve`], `GET /v1/events` ends when the server drains; served
/// any other way it ends only when the view's broadcast sender is dropped.
pub fn router<V: AgentView>(view: Arc<V>) -> Router {
    Router::new()
        .route("/v1/plugins", get(list_plugins::<V>).post(register::<V>))
        .route("/v1/plugin/csi/{id}", get(get_plugin::<V>))
        .route(
            "/v1/plugin/csi/{id}/instances/{instance}",
            axum::routing::delete(deregister::<V>),
        )
        .route("/v1/node", get(node::<V>))
        .route("/v1/nodes", get(list_nodes::<V>))
        .route("/v1/nodes/{id}", get(get_node::<V>))
        .route("/v1/nodes/{id}/drain", axum::routing::post(drain_node::<V>))
        .route("/v1/events", get(events::<V>))
        .route(
            "/v1/event/stream",
            get(super::stream_route::event_stream::<V>),
        )
        .route("/v1/metrics", get(metrics::<V>))
        .route(crate::JWKS_PATH, get(jwks::<V>))
        .merge(super::volume_routes::routes::<V>())
        .merge(super::job_routes::routes::<V>())
        .merge(super::acl::routes::<V>())
        .merge(super::ui::routes())
        .merge(super::alloc_routes::routes::<V>())
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        // Bodies are read by `super::body`, which applies the same limit; this covers any
        // other extractor.
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        // With ACLs on, no route (nor the fallbacks) runs without a token.
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&view),
            super::acl::guard::<V>,
        ))
        // Outermost: a browser's request from another site is refused before anything else.
        .layer(axum::middleware::from_fn(same_origin))
        .with_state(view)
}

async fn list_plugins<V: AgentView>(State(view): State<Arc<V>>) -> Json<PluginList> {
    let mut plugins = view.plugins();
    plugins.sort_by(|a, b| a.id.cmp(&b.id));
    Json(PluginList { plugins })
}

async fn get_plugin<V: AgentView>(
    State(view): State<Arc<V>>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<PluginStatus>, ApiError> {
    let id = path_id("plugin id", id)?;
    view.plugin(&id)
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no plugin {}", berth_input::quoted(&id))))
}

async fn register<V: AgentView>(
    State(view): State<Arc<V>>,
    req: Request,
) -> Result<Json<PluginStatus>, Refusal> {
    let req: RegisterRequest = json_body(req).await?;
    Ok(Json(view.register(req).await?))
}

async fn deregister<V: AgentView>(
    State(view): State<Arc<V>>,
    ids: Result<Path<(String, String)>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let (id, instance) = path_ids(["plugin id", "instance name"], ids)?;
    view.deregister(&id, &instance).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn node<V: AgentView>(State(view): State<Arc<V>>) -> Json<crate::types::NodeStatus> {
    Json(view.node())
}

async fn list_nodes<V: AgentView>(State(view): State<Arc<V>>) -> Json<crate::nodes::NodeList> {
    let mut list = view.nodes();
    list.nodes.sort_by(|a, b| a.id.cmp(&b.id));
    Json(list)
}

/// The node whose id is `id` or the only one that starts with it.
fn find_node<V: AgentView>(view: &V, id: &str) -> Result<crate::nodes::FleetNode, ApiError> {
    let nodes = view.nodes().nodes;
    if let Some(n) = nodes.iter().find(|n| n.id == id) {
        return Ok(n.clone());
    }
    let mut matches: Vec<&crate::nodes::FleetNode> =
        nodes.iter().filter(|n| n.id.starts_with(id)).collect();
    match matches.len() {
        1 => Ok(matches.remove(0).clone()),
        0 => Err(ApiError::NotFound(format!(
            "no node {}",
            berth_input::quoted(id)
        ))),
        _ => {
            let mut ids: Vec<&str> = matches.iter().map(|n| n.id.as_str()).collect();
            ids.sort_unstable();
            Err(ApiError::BadRequest(format!(
                "node id prefix {} matches {} nodes: {}",
                berth_input::quoted(id),
                ids.len(),
                ids.join(", ")
            )))
        }
    }
}

async fn get_node<V: AgentView>(
    State(view): State<Arc<V>>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<crate::nodes::FleetNode>, ApiError> {
    let id = path_id("node id", id)?;
    find_node(&*view, &id).map(Json)
}

async fn drain_node<V: AgentView>(
    State(view): State<Arc<V>>,
    id: Result<Path<String>, PathRejection>,
    req: Request,
) -> Result<Json<crate::nodes::FleetNode>, Refusal> {
    let id = path_id("node id", id)?;
    let body: crate::nodes::DrainRequest = json_body(req).await?;
    let node = find_node(&*view, &id)?;
    Ok(Json(view.set_drain(&node.id, body.enable).await?))
}

async fn metrics<V: AgentView>(State(view): State<Arc<V>>) -> Response {
    (
        [(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)],
        view.metrics(),
    )
        .into_response()
}

/// The public keys that verify the agent's workload identities (a JWK set), for Consul's
/// auth method; 404 when the agent signs none.
async fn jwks<V: AgentView>(
    State(view): State<Arc<V>>,
) -> Result<Json<serde_json::Value>, ApiError> {
    view.jwks()
        .map(Json)
        .ok_or_else(|| ApiError::NotFound("this agent signs no workload identities".into()))
}

/// Newline-delimited JSON, one [`EventLine`] per body chunk (hyper writes each chunk out as it
/// comes). The receiver is created before the response, so the client has subscribed once it
/// has the response head; a reader that cannot keep up loses events, never stalls the sender.
async fn events<V: AgentView>(
    State(view): State<Arc<V>>,
    draining: Option<Extension<Draining>>,
) -> Response {
    let rx = view.subscribe();
    let stop = draining.map(|Extension(Draining(token))| token);
    let lines = futures::stream::unfold((rx, stop), |(mut rx, stop)| async move {
        let line = next_line(&mut rx, stop.as_ref()).await?;
        let mut bytes = match serde_json::to_vec(&line) {
            Ok(bytes) => bytes,
            Err(e) => return Some((Err(e), (rx, stop))),
        };
        bytes.push(b'\n');
        Some((Ok(Bytes::from(bytes)), (rx, stop)))
    });
    (
        [(header::CONTENT_TYPE, EVENTS_CONTENT_TYPE)],
        Body::from_stream(lines),
    )
        .into_response()
}

/// The next line to send; `None` when the sender is gone or the server drains.
async fn next_line(
    rx: &mut broadcast::Receiver<crate::types::Event>,
    stop: Option<&CancellationToken>,
) -> Option<EventLine> {
    let received = match stop {
        Some(stop) => tokio::select! {
            biased;
            () = stop.cancelled() => return None,
            r = rx.recv() => r,
        },
        None => rx.recv().await,
    };
    match received {
        Ok(event) => Some(EventLine::Event(event)),
        Err(RecvError::Lagged(n)) => Some(EventLine::Lagged(n)),
        Err(RecvError::Closed) => None,
    }
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::NotFound(format!(
        "no route {} {}",
        berth_input::Shown(method.as_str()),
        berth_input::Shown(uri.path())
    ))
}

async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    error_response(
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "method {} is not allowed on {}",
            berth_input::Shown(method.as_str()),
            berth_input::Shown(uri.path())
        ),
    )
}

/// Refuses (403) a request whose `Origin` is not the site it is sent to: a page of another
/// site in a browser on the agent's machine cannot make the browser call the API (with ACLs
/// off, that would run jobs). Requests without `Origin` (the CLI, curl) pass.
async fn same_origin(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let headers = req.headers();
    if let Some(origin) = headers.get(header::ORIGIN) {
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
        let origin_host = origin.to_str().ok().and_then(|o| {
            o.strip_prefix("http://")
                .or_else(|| o.strip_prefix("https://"))
        });
        if host.is_none() || origin_host != host {
            return error_response(
                StatusCode::FORBIDDEN,
                "a request from another site's page is refused (its Origin is not this agent)"
                    .into(),
            );
        }
    }
    next.run(req).await
}
