//! The `/v1` routes over an [`AgentView`].

use std::sync::Arc;

use axum::{
    Extension, Json, Router,
    body::{Body, Bytes},
    extract::{
        Path, State,
        rejection::{BytesRejection, PathRejection},
    },
    http::{Method, StatusCode, Uri, header},
    response::{IntoResponse, Response},
    routing::get,
};
use tokio::sync::broadcast::{self, error::RecvError};
use tokio_util::sync::CancellationToken;

use super::{AgentView, ApiError, error_response};
use crate::{
    EVENTS_CONTENT_TYPE, METRICS_CONTENT_TYPE,
    types::{EventLine, PluginList, PluginStatus, RegisterRequest},
};

/// Set by [`super::Listeners::serve`]: cancelled when the server starts draining, so endless
/// responses (the event stream) end and their connections can close.
#[derive(Debug, Clone)]
pub(super) struct Draining(pub(super) CancellationToken);

/// The API's routes over `view` (see the crate docs for the table). Every error, including an
/// unknown route (404) or method (405), is a JSON [`crate::ErrorBody`]. A `POST /v1/plugins`
/// whose body does not parse or validate is answered 400, naming the field, without calling
/// [`AgentView::register`].
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
        .route("/v1/events", get(events::<V>))
        .route("/v1/metrics", get(metrics::<V>))
        .merge(super::volume_routes::routes::<V>())
        .merge(super::job_routes::routes::<V>())
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
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
    let Path(id) = id.map_err(path_error)?;
    view.plugin(&id)
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no plugin {id:?}")))
}

async fn register<V: AgentView>(
    State(view): State<Arc<V>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<PluginStatus>, Response> {
    let body = body.map_err(|e| error_response(e.status(), e.body_text()))?;
    let req = parse_register(&body).map_err(IntoResponse::into_response)?;
    req.validate()
        .map_err(|e| ApiError::from(e).into_response())?;
    view.register(req)
        .await
        .map(Json)
        .map_err(IntoResponse::into_response)
}

/// Parses a registration body; the error names the field (or the line and column) at fault.
fn parse_register(body: &[u8]) -> Result<RegisterRequest, ApiError> {
    let bad = |what: String| ApiError::BadRequest(format!("invalid registration: {what}"));
    let mut de = serde_json::Deserializer::from_slice(body);
    let req: RegisterRequest = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            bad(e.inner().to_string())
        } else {
            bad(format!("field `{path}`: {}", e.inner()))
        }
    })?;
    de.end().map_err(|e| bad(e.to_string()))?;
    Ok(req)
}

async fn deregister<V: AgentView>(
    State(view): State<Arc<V>>,
    params: Result<Path<(String, String)>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let Path((id, instance)) = params.map_err(path_error)?;
    berth_sys::validate_path_segment("plugin id", &id)
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    berth_sys::validate_path_segment("instance name", &instance)
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    view.deregister(&id, &instance).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn node<V: AgentView>(State(view): State<Arc<V>>) -> Json<crate::types::NodeStatus> {
    Json(view.node())
}

async fn metrics<V: AgentView>(State(view): State<Arc<V>>) -> Response {
    (
        [(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)],
        view.metrics(),
    )
        .into_response()
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

pub(super) fn path_error(e: PathRejection) -> ApiError {
    ApiError::BadRequest(e.body_text())
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no route {method} {}", uri.path()))
}

async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    error_response(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("method {method} is not allowed on {}", uri.path()),
    )
}
