//! ACL enforcement: the layer that checks every request's token before any handler runs, the
//! one function that decides what a request needs ([`required_access`]), and the `/v1/acl/…`
//! routes.
//!
//! The layer wraps the whole router, the fallbacks (unknown route, wrong method) included: with
//! ACLs on, nothing but the public requests is answered without a valid token, so an unknown
//! path says nothing about which paths exist. A refused request never reaches its handler, so
//! it changes nothing. Errors are [`crate::ErrorBody`] documents that never repeat the token.

use std::sync::Arc;

use axum::{
    Extension, Json, Router,
    extract::{Path, Request, State, rejection::PathRejection},
    http::{HeaderMap, Method, StatusCode},
    middleware::Next,
    response::{IntoResponse, Response},
    routing::{delete, get, post},
};

use super::{
    AgentView, ApiError, Refusal, error_response,
    extract::{json_body, path_id},
};
use crate::acl::{
    Access, AclToken, AclTokenList, NewToken, SecretId, TOKEN_HEADER, TokenCreateRequest,
};

/// The agent's ACL tokens, as the layer and the `/v1/acl` routes need them. The agent keeps
/// only a hash of each secret.
pub trait AclStore: Send + Sync + 'static {
    /// The token whose secret id is `secret`, or `None`. Runs on every request: it must not
    /// block (no store reads).
    fn resolve(&self, secret: &str) -> Option<AclToken>;
    /// Makes the first `management` token and returns it with its secret; works once in the
    /// store's life: afterwards [`ApiError::Conflict`], and nothing changes. May block (called
    /// on a blocking thread).
    fn bootstrap(&self) -> Result<NewToken, ApiError>;
    /// Makes a token (the request passed [`TokenCreateRequest::validate`]). May block.
    fn create(&self, req: TokenCreateRequest) -> Result<NewToken, ApiError>;
    /// Every token, without secrets.
    fn list(&self) -> Result<Vec<AclToken>, ApiError>;
    /// Deletes the token with this accessor id ([`ApiError::NotFound`] when there is none);
    /// from then on its secret is refused. May block.
    fn delete(&self, accessor_id: &str) -> Result<(), ApiError>;
}

/// The token a request was admitted with, put in its extensions by the layer (absent when ACLs
/// are off, and on public requests). A handler that wants to know who calls takes
/// `Option<Extension<Caller>>`.
#[derive(Debug, Clone)]
pub struct Caller(pub AclToken);

/// What a request needs, from its method and path alone. Every route is decided here, with
/// `management` for any write it does not know, so a route added later is closed to all but
/// management tokens until it is named here.
///
/// - public: `POST /v1/acl/bootstrap`; `GET`/`HEAD` of `/ui`, anything under `/ui/`, and
///   `/.well-known/jwks.json`;
/// - any token: `GET /v1/acl/token/self`;
/// - management: everything else under `/v1/acl`;
/// - job-operator: `…/exec` under `/v1/client/` (whatever its method), and writes under
///   `/v1/job`, `/v1/jobs`, `/v1/alloc`, `/v1/allocs`, `/v1/client`;
/// - read: every other `GET` and `HEAD`;
/// - volume-operator: writes under `/v1/volume`, `/v1/volumes`, `/v1/snapshot`,
///   `/v1/snapshots`;
/// - management: any other write (plugin registration, node drain, routes not named here).
///
/// Paths are taken as sent (percent-encoded, not normalized), as the router matches them; a
/// public path must not hold an empty, `.` or `..` segment.
pub fn required_access(method: &Method, path: &str) -> Access {
    let read = *method == Method::GET || *method == Method::HEAD;
    let segments: Vec<&str> = path.strip_prefix('/').unwrap_or(path).split('/').collect();
    let plain = segments
        .iter()
        .enumerate()
        .all(|(i, s)| !matches!(*s, "." | "..") && (!s.is_empty() || i + 1 == segments.len()));
    match segments.as_slice() {
        ["v1", "acl", "bootstrap"] if *method == Method::POST => Access::Public,
        ["ui", ..] if read && plain => Access::Public,
        // `/` only redirects to `/ui/`.
        [""] if read => Access::Public,
        [".well-known", "jwks.json"] if read => Access::Public,
        ["v1", "acl", "token", "self"] if read => Access::AnyToken,
        ["v1", "acl", ..] => Access::Management,
        ["v1", "client", .., "exec"] => Access::JobWrite,
        _ if read => Access::Read,
        ["v1", "job" | "jobs" | "alloc" | "allocs" | "client", ..] => Access::JobWrite,
        ["v1", "volume" | "volumes" | "snapshot" | "snapshots", ..] => Access::VolumeWrite,
        _ => Access::Management,
    }
}

/// The layer's function: with ACLs on, admits a request only with a token whose policies
/// grant what [`required_access`] says it needs; 401 without a token, 403 with one that is
/// malformed, unknown, or lacks the policy. The token header is removed before the request
/// goes on.
pub(super) async fn guard<V: AgentView>(
    State(view): State<Arc<V>>,
    mut req: Request,
    next: Next,
) -> Response {
    let Some(acl) = view.acl() else {
        return next.run(req).await;
    };
    let access = required_access(req.method(), req.uri().path());
    if access == Access::Public {
        return next.run(req).await;
    }
    let secret = match token_of(req.headers()) {
        Ok(secret) => secret,
        Err((status, message)) => return error_response(status, message),
    };
    req.headers_mut().remove(TOKEN_HEADER);
    let Some(token) = acl.resolve(secret.expose()) else {
        return forbidden("ACL token not found".into());
    };
    if !token.allows(access) {
        return forbidden(format!(
            "permission denied: {} {} needs the {} policy",
            berth_input::Shown(req.method().as_str()),
            berth_input::Shown(req.uri().path()),
            access.granted_by(),
        ));
    }
    req.extensions_mut().insert(Caller(token));
    next.run(req).await
}

/// The request's secret id, checked for shape (a UUID): 401 when absent, 403 when malformed
/// (the status and the message to answer).
fn token_of(headers: &HeaderMap) -> Result<SecretId, (StatusCode, String)> {
    let mut values = headers.get_all(TOKEN_HEADER).iter();
    let Some(value) = values.next() else {
        return Err((
            StatusCode::UNAUTHORIZED,
            format!(
                "ACLs are enabled: send a token's secret id in the {TOKEN_HEADER} header \
                 (berth --token or BERTH_TOKEN)"
            ),
        ));
    };
    if values.next().is_some() {
        return Err((
            StatusCode::FORBIDDEN,
            format!("more than one {TOKEN_HEADER} header"),
        ));
    }
    match value.to_str() {
        Ok(text) if is_uuid(text) => Ok(SecretId::new(text)),
        _ => Err((
            StatusCode::FORBIDDEN,
            "malformed ACL token: a secret id is a UUID".into(),
        )),
    }
}

/// `8-4-4-4-12` hex digits.
fn is_uuid(text: &str) -> bool {
    text.len() == 36
        && text.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

fn forbidden(message: String) -> Response {
    error_response(StatusCode::FORBIDDEN, message)
}

/// The `/v1/acl` routes; merged into [`super::router`].
pub(super) fn routes<V: AgentView>() -> Router<Arc<V>> {
    Router::new()
        .route("/v1/acl/bootstrap", post(bootstrap::<V>))
        .route("/v1/acl/tokens", get(list::<V>).post(create::<V>))
        .route("/v1/acl/token/self", get(token_self))
        .route("/v1/acl/token/{accessor}", delete(remove::<V>))
}

/// The agent's token store; 400 when ACLs are off.
fn store<V: AgentView>(view: &V) -> Result<Arc<dyn AclStore>, ApiError> {
    view.acl().ok_or_else(|| {
        ApiError::BadRequest(
            "ACLs are disabled on this agent (agent config: acl { enabled = true })".into(),
        )
    })
}

/// Runs a store call that may block off the server's tasks.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::Internal(format!("the ACL store task failed: {e}")))?
}

async fn bootstrap<V: AgentView>(State(view): State<Arc<V>>) -> Result<Json<NewToken>, ApiError> {
    let acl = store(&*view)?;
    blocking(move || acl.bootstrap()).await.map(Json)
}

async fn list<V: AgentView>(State(view): State<Arc<V>>) -> Result<Json<AclTokenList>, ApiError> {
    let acl = store(&*view)?;
    let mut tokens = blocking(move || acl.list()).await?;
    tokens.sort_by(|a, b| a.accessor_id.cmp(&b.accessor_id));
    Ok(Json(AclTokenList { tokens }))
}

async fn create<V: AgentView>(
    State(view): State<Arc<V>>,
    req: Request,
) -> Result<Json<NewToken>, Refusal> {
    let acl = store(&*view)?;
    let mut body: TokenCreateRequest = json_body(req).await?;
    body.policies.sort_unstable();
    body.policies.dedup();
    Ok(Json(blocking(move || acl.create(body)).await?))
}

async fn remove<V: AgentView>(
    State(view): State<Arc<V>>,
    accessor: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let acl = store(&*view)?;
    let accessor = path_id("accessor id", accessor)?;
    blocking(move || acl.delete(&accessor)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The caller's own token; with ACLs off there is none (400).
async fn token_self(caller: Option<Extension<Caller>>) -> Response {
    match caller {
        Some(Extension(Caller(token))) => Json(token).into_response(),
        None => ApiError::BadRequest(
            "ACLs are disabled on this agent (agent config: acl { enabled = true })".into(),
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(method: &str, path: &str) -> Access {
        required_access(&method.parse().unwrap(), path)
    }

    #[test]
    fn public_requests_are_few_and_exact() {
        for (m, p) in [
            ("POST", "/v1/acl/bootstrap"),
            ("GET", "/ui"),
            ("GET", "/ui/"),
            ("HEAD", "/ui/app.js"),
            ("GET", "/ui/assets/style.css"),
            ("GET", "/.well-known/jwks.json"),
        ] {
            assert_eq!(access(m, p), Access::Public, "{m} {p}");
        }
        for (m, p) in [
            ("GET", "/v1/acl/bootstrap"),
            ("POST", "/v1/acl/bootstrap/"),
            ("POST", "//v1/acl/bootstrap"),
            ("POST", "/ui"),
            ("DELETE", "/ui/app.js"),
            ("GET", "/ui/../v1/jobs"),
            ("GET", "/ui/./x"),
            ("GET", "/ui//x"),
            ("POST", "/.well-known/jwks.json"),
            ("GET", "/uix"),
        ] {
            assert_ne!(access(m, p), Access::Public, "{m} {p}");
        }
    }

    #[test]
    fn acl_routes_need_management_but_self() {
        assert_eq!(access("GET", "/v1/acl/token/self"), Access::AnyToken);
        assert_eq!(access("HEAD", "/v1/acl/token/self"), Access::AnyToken);
        for (m, p) in [
            ("GET", "/v1/acl/tokens"),
            ("POST", "/v1/acl/tokens"),
            (
                "DELETE",
                "/v1/acl/token/0b8f3c1e-8d44-4d3c-9c9e-3c2b7c0a5f11",
            ),
            ("DELETE", "/v1/acl/token/self"),
            ("GET", "/v1/acl/policies"),
        ] {
            assert_eq!(access(m, p), Access::Management, "{m} {p}");
        }
    }

    #[test]
    fn reads_are_read_and_writes_go_by_prefix() {
        for (m, p) in [
            ("GET", "/v1/jobs"),
            ("GET", "/v1/job/web"),
            ("GET", "/v1/alloc/a1"),
            ("GET", "/v1/volumes"),
            ("GET", "/v1/volume/csi/v1"),
            ("GET", "/v1/plugins"),
            ("GET", "/v1/plugin/csi/hp"),
            ("GET", "/v1/node"),
            ("GET", "/v1/nodes/n1"),
            ("GET", "/v1/events"),
            ("GET", "/v1/event/stream"),
            ("GET", "/v1/metrics"),
            ("GET", "/v1/client/fs/logs/a1"),
            ("HEAD", "/v1/jobs"),
            ("GET", "/v1/not-a-route"),
        ] {
            assert_eq!(access(m, p), Access::Read, "{m} {p}");
        }
        for (m, p) in [
            ("POST", "/v1/jobs"),
            ("POST", "/v1/job/web/plan"),
            ("DELETE", "/v1/job/web"),
            ("POST", "/v1/alloc/a1/stop"),
            ("POST", "/v1/allocs/x"),
            // Any method but GET and HEAD is a write.
            ("OPTIONS", "/v1/jobs"),
            ("POST", "/v1/client/allocation/a1/restart"),
            ("POST", "/v1/client/allocation/a1/signal"),
            ("POST", "/v1/client/allocation/a1/exec"),
            // An exec is a write whatever its method (a websocket upgrade is a GET).
            ("GET", "/v1/client/allocation/a1/exec"),
        ] {
            assert_eq!(access(m, p), Access::JobWrite, "{m} {p}");
        }
        for (m, p) in [
            ("POST", "/v1/volumes/register"),
            ("POST", "/v1/volumes/create"),
            ("POST", "/v1/volumes/snapshot/delete"),
            ("DELETE", "/v1/volume/csi/v1"),
            ("POST", "/v1/volume/csi/v1/claim"),
            ("POST", "/v1/volume/csi/v1/release"),
            ("POST", "/v1/volume/csi/v1/snapshot"),
            ("POST", "/v1/snapshot/x"),
            ("PUT", "/v1/snapshots"),
        ] {
            assert_eq!(access(m, p), Access::VolumeWrite, "{m} {p}");
        }
        for (m, p) in [
            ("POST", "/v1/plugins"),
            ("DELETE", "/v1/plugin/csi/hp/instances/i"),
            ("POST", "/v1/nodes/n1/drain"),
            ("POST", "/v1/not-a-route"),
            ("PATCH", "/v1/metrics"),
            ("OPTIONS", "/v1/metrics"),
            ("POST", "/v1/jobsx"),
            ("POST", "/v1/volumesx/create"),
            ("POST", "/"),
            ("POST", ""),
        ] {
            assert_eq!(access(m, p), Access::Management, "{m} {p}");
        }
    }

    #[test]
    fn token_shape_is_checked_before_any_lookup() {
        assert!(is_uuid("0b8f3c1e-8d44-4d3c-9c9e-3c2b7c0a5f11"));
        assert!(is_uuid("0B8F3C1E-8D44-4D3C-9C9E-3C2B7C0A5F11"));
        for bad in [
            "",
            "0b8f3c1e8d444d3c9c9e3c2b7c0a5f11",
            "0b8f3c1e-8d44-4d3c-9c9e-3c2b7c0a5f1",
            "0b8f3c1e-8d44-4d3c-9c9e-3c2b7c0a5f11x",
            "0b8f3c1e-8d44-4d3c-9c9e_3c2b7c0a5f11",
            "zb8f3c1e-8d44-4d3c-9c9e-3c2b7c0a5f11",
        ] {
            assert!(!is_uuid(bad), "{bad}");
        }
    }
}
