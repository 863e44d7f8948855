//! The server side: [`router`] answers the routes over any [`AgentView`]; [`Listeners`] binds
//! the unix socket (and optionally a TCP port: loopback, or any address with TLS) and serves a
//! router until shut down. With ACLs on ([`AgentView::acl`]), a layer around the whole router
//! admits a request only with a token that grants what [`required_access`] says it needs.
//!
//! What the router guarantees before it calls the agent: every id (in the path, the query or
//! the body) passed the same check ([`berth_sys::validate_path_segment`] for ids that name
//! things berth stores; a printable, bounded string for a provider's snapshot id); the body
//! was at most [`MAX_BODY_BYTES`], arrived within [`BODY_READ_TIMEOUT`], parsed, and passed
//! its type's `validate`. No error it writes quotes a value of the body, and it quotes an id
//! only escaped and cut.

mod acl;
mod alloc_routes;
mod body;
mod extract;
mod job_routes;
mod json;
mod listen;
mod routes;
mod slots;
mod stream_route;
mod tls;
mod ui;
mod volume_routes;

use std::future::Future;

use axum::{
    Json,
    http::StatusCode,
    response::{IntoResponse, Response},
};

use crate::types::{ErrorBody, Event, InvalidField, NodeStatus, PluginStatus, RegisterRequest};

pub use acl::{AclStore, Caller, required_access};
pub use body::{BODY_READ_TIMEOUT, MAX_BODY_BYTES};
pub use listen::{
    DRAIN_TIMEOUT, HEAD_READ_TIMEOUT, ListenOptions, Listeners, MAX_CONNECTIONS, ServeError, serve,
};
pub use routes::router;
pub use tls::{ServerTls, TlsError};
pub use ui::{CONTENT_SECURITY_POLICY, UI_PATH};
pub use volume_routes::SpecOp;

use crate::volumes::{
    ClaimRequest, ClaimResponse, DetachRequest, DetachResponse, ExpandRequest, ExpandResponse,
    ReleaseRequest, ReleaseResponse, SnapshotCreateRequest, SnapshotDeleteRequest, SnapshotList,
    SnapshotView, VolumeList, VolumeSpecRequest, VolumeStatus,
};

/// What the volume routes need from the agent. Every method has a default that answers 404
/// "volumes are not served here", so a view without volumes implements it empty. The router
/// calls these only with ids that are valid path segments and bodies that parsed and passed
/// their type's `validate` (see the [module docs](self)).
pub trait VolumeView: Send + Sync + 'static {
    /// Every volume in the catalog, by id.
    fn volumes(&self) -> Result<VolumeList, ApiError> {
        Err(not_served())
    }
    /// Every volume id (for id prefixes); none by default.
    fn volume_ids(&self) -> Vec<String> {
        Vec::new()
    }
    /// One volume with its claims and its usages on this node.
    fn volume(&self, id: &str) -> impl Future<Output = Result<VolumeStatus, ApiError>> + Send {
        let _ = id;
        async { Err(not_served()) }
    }
    /// Registers or creates a volume from a spec.
    fn put_volume(
        &self,
        op: SpecOp,
        req: VolumeSpecRequest,
    ) -> impl Future<Output = Result<VolumeStatus, ApiError>> + Send {
        let _ = (op, req);
        async { Err(not_served()) }
    }
    /// Removes a volume from the catalog (not from the provider); refused while claimed unless
    /// `force`, which releases every claim first.
    fn deregister_volume(
        &self,
        id: &str,
        force: bool,
    ) -> impl Future<Output = Result<DetachResponse, ApiError>> + Send {
        let _ = (id, force);
        async { Err(not_served()) }
    }
    /// Deletes the volume at the provider (DeleteVolume) and from the catalog.
    fn delete_volume(&self, id: &str) -> impl Future<Output = Result<(), ApiError>> + Send {
        let _ = id;
        async { Err(not_served()) }
    }
    /// Releases every claim of one node.
    fn detach_volume(
        &self,
        id: &str,
        req: DetachRequest,
    ) -> impl Future<Output = Result<DetachResponse, ApiError>> + Send {
        let _ = (id, req);
        async { Err(not_served()) }
    }
    /// Grows the volume.
    fn expand_volume(
        &self,
        id: &str,
        req: ExpandRequest,
    ) -> impl Future<Output = Result<ExpandResponse, ApiError>> + Send {
        let _ = (id, req);
        async { Err(not_served()) }
    }
    /// Claims and mounts the volume for an alloc on this node.
    fn claim_volume(
        &self,
        id: &str,
        req: ClaimRequest,
    ) -> impl Future<Output = Result<ClaimResponse, ApiError>> + Send {
        let _ = (id, req);
        async { Err(not_served()) }
    }
    /// Unmounts and releases an alloc's claim.
    fn release_volume(
        &self,
        id: &str,
        req: ReleaseRequest,
    ) -> impl Future<Output = Result<ReleaseResponse, ApiError>> + Send {
        let _ = (id, req);
        async { Err(not_served()) }
    }
    /// Snapshots the volume.
    fn create_snapshot(
        &self,
        id: &str,
        req: SnapshotCreateRequest,
    ) -> impl Future<Output = Result<SnapshotView, ApiError>> + Send {
        let _ = (id, req);
        async { Err(not_served()) }
    }
    /// Deletes a snapshot.
    fn delete_snapshot(
        &self,
        req: SnapshotDeleteRequest,
    ) -> impl Future<Output = Result<(), ApiError>> + Send {
        let _ = req;
        async { Err(not_served()) }
    }
    /// The snapshots a controller plugin lists.
    fn list_snapshots(
        &self,
        plugin_id: &str,
    ) -> impl Future<Output = Result<SnapshotList, ApiError>> + Send {
        let _ = plugin_id;
        async { Err(not_served()) }
    }
}

/// What the job routes need from the agent; every method defaults to 404 "jobs are not served
/// here". The router checks ids and bodies first, as for [`VolumeView`].
pub trait JobView: Send + Sync + 'static {
    /// Every job, by id.
    fn jobs(&self) -> Result<crate::jobs::JobList, ApiError> {
        Err(ApiError::NotFound("jobs are not served here".into()))
    }
    /// One job with its allocs.
    fn job(&self, id: &str) -> Result<crate::jobs::JobStatus, ApiError> {
        let _ = id;
        Err(ApiError::NotFound("jobs are not served here".into()))
    }
    /// One alloc.
    fn alloc(&self, id: &str) -> Result<crate::jobs::AllocStatus, ApiError> {
        let _ = id;
        Err(ApiError::NotFound("jobs are not served here".into()))
    }
    /// Parses, places and starts a job.
    fn run_job(
        &self,
        req: crate::jobs::JobRunRequest,
    ) -> impl Future<Output = Result<crate::jobs::JobStatus, ApiError>> + Send {
        let _ = req;
        async { Err(ApiError::NotFound("jobs are not served here".into())) }
    }
    /// Stops a job: its tasks stop, then its volumes are released. With `purge`, the job and
    /// its allocs are forgotten once every alloc has finished.
    fn stop_job(
        &self,
        id: &str,
        purge: bool,
    ) -> impl Future<Output = Result<crate::jobs::JobStatus, ApiError>> + Send {
        let _ = (id, purge);
        async { Err(ApiError::NotFound("jobs are not served here".into())) }
    }
    /// Every alloc id the agent knows (for id prefixes); none by default.
    fn alloc_ids(&self) -> Vec<String> {
        Vec::new()
    }
    /// Every job id (for id prefixes); none by default.
    fn job_ids(&self) -> Vec<String> {
        Vec::new()
    }
    /// What a run of the request would place, with nothing written.
    fn plan_job(
        &self,
        req: crate::jobs::JobRunRequest,
    ) -> impl Future<Output = Result<crate::jobs::JobPlan, ApiError>> + Send {
        let _ = req;
        async { Err(ApiError::NotFound("jobs are not served here".into())) }
    }
    /// The job as kept, mount flags redacted.
    fn job_spec(&self, id: &str) -> Result<crate::jobs::JobSpecView, ApiError> {
        let _ = id;
        Err(ApiError::NotFound("jobs are not served here".into()))
    }
    /// Stops one alloc.
    fn stop_alloc(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<crate::jobs::AllocStatus, ApiError>> + Send {
        let _ = id;
        async { Err(ApiError::NotFound("jobs are not served here".into())) }
    }
    /// Restarts an alloc's running tasks (or one).
    fn restart_alloc(
        &self,
        id: &str,
        task: Option<&str>,
    ) -> Result<crate::jobs::AllocActionResponse, ApiError> {
        let _ = (id, task);
        Err(ApiError::NotFound("jobs are not served here".into()))
    }
    /// Resource use of an alloc's running tasks, read now.
    fn alloc_stats(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<crate::jobs::AllocStats, ApiError>> + Send {
        let _ = id;
        async { Err(ApiError::NotFound("jobs are not served here".into())) }
    }
    /// Signals an alloc's running tasks (or one).
    fn signal_alloc(
        &self,
        id: &str,
        task: Option<&str>,
        signal: &str,
    ) -> Result<crate::jobs::AllocActionResponse, ApiError> {
        let _ = (id, task, signal);
        Err(ApiError::NotFound("jobs are not served here".into()))
    }
    /// A task's log, from the byte the request names on: 404 for an unknown alloc or task,
    /// 400 when the task is left out of an alloc with several. Errors come before the stream
    /// starts; a `follow` stream ends once the alloc is terminal and every byte was sent.
    fn alloc_logs(
        &self,
        req: crate::allocs::LogsRequest,
    ) -> impl Future<Output = Result<crate::allocs::LogStream, ApiError>> + Send {
        let _ = req;
        async { Err(ApiError::NotFound("allocs are not served here".into())) }
    }
    /// Starts a command in a running task: 404 for an unknown alloc or task, 409 when the
    /// task does not run, 400 when the task is left out of an alloc with several.
    fn alloc_exec(
        &self,
        req: crate::allocs::ExecRequest,
    ) -> impl Future<Output = Result<crate::allocs::ExecSession, ApiError>> + Send {
        let _ = req;
        async { Err(ApiError::NotFound("allocs are not served here".into())) }
    }
}

fn not_served() -> ApiError {
    ApiError::NotFound("volumes are not served here".into())
}

/// What the API needs from the agent. Reads are synchronous snapshots and must not block (they
/// run on the server's tasks); registration changes go through the async methods.
pub trait AgentView: VolumeView + JobView {
    /// Every registered plugin (the router sorts them by id).
    fn plugins(&self) -> Vec<PluginStatus>;
    /// One plugin, or `None` when no plugin has that id.
    fn plugin(&self, id: &str) -> Option<PluginStatus>;
    /// This node.
    fn node(&self) -> NodeStatus;
    /// Every node of the fleet; without a fleet, this node alone.
    fn nodes(&self) -> crate::nodes::NodeList {
        crate::nodes::NodeList {
            fleet: false,
            nodes: vec![crate::nodes::FleetNode::from_status(&self.node())],
        }
    }
    /// Sets or clears `drain` on a node of the fleet (`id` is a whole node id).
    fn set_drain(
        &self,
        id: &str,
        enable: bool,
    ) -> impl Future<Output = Result<crate::nodes::FleetNode, ApiError>> + Send {
        let _ = (id, enable);
        async {
            Err(ApiError::Conflict(
                "drain is a fleet operation; this agent has no etcd control plane".into(),
            ))
        }
    }
    /// Live events from now on. The router calls it once per `GET /v1/events`, before it
    /// answers, so an event sent after the client has the response head reaches it. A reader
    /// that falls behind the channel's capacity loses the oldest events and is told how many.
    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Event>;
    /// The window of the event stream (`GET /v1/event/stream`); `None` when the agent keeps
    /// none (the route answers 404).
    fn event_source(&self) -> Option<std::sync::Arc<dyn crate::stream::EventSource>> {
        None
    }
    /// Prometheus text exposition.
    fn metrics(&self) -> String;
    /// The JWK set that verifies the workload identities the agent signs, as
    /// `/.well-known/jwks.json` serves it; `None` when it signs none.
    fn jwks(&self) -> Option<serde_json::Value> {
        None
    }
    /// The ACL tokens when ACLs are on: then every request but the public ones needs a token
    /// (see [`required_access`]). `None` (the default): ACLs are off, and every request is
    /// answered without one.
    fn acl(&self) -> Option<std::sync::Arc<dyn AclStore>> {
        None
    }
    /// Registers one plugin instance. Only called with a request that passed
    /// [`RegisterRequest::validate`].
    fn register(
        &self,
        req: RegisterRequest,
    ) -> impl Future<Output = Result<PluginStatus, ApiError>> + Send;
    /// Deregisters one instance. Only called with an id and instance that are valid path
    /// segments.
    fn deregister(
        &self,
        id: &str,
        instance: &str,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;
}

/// Why the agent refuses or fails a request; becomes an [`ErrorBody`] with the status of
/// [`ApiError::status`]. The text must name the field or object it is about, and must never
/// hold a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// 400: the request is malformed or invalid; nothing changed.
    #[error("{0}")]
    BadRequest(String),
    /// 404: the object does not exist.
    #[error("{0}")]
    NotFound(String),
    /// 409: the request contradicts the current state (e.g. an instance registered with
    /// another socket); nothing changed.
    #[error("{0}")]
    Conflict(String),
    /// 422: a plugin refused the request for a reason the caller must fix (no capacity, no
    /// node in the requested topology, an operation the plugin does not implement); nothing
    /// was retried, and the text names the plugin and its reason.
    #[error("{0}")]
    Unprocessable(String),
    /// 500: the agent failed.
    #[error("{0}")]
    Internal(String),
    /// 503: something the request needs (a plugin) cannot serve now; try again later.
    #[error("{0}")]
    Unavailable(String),
}

impl ApiError {
    /// The HTTP status it is answered with.
    pub fn status(&self) -> u16 {
        self.status_code().as_u16()
    }

    fn status_code(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl From<InvalidField> for ApiError {
    fn from(e: InvalidField) -> Self {
        Self::BadRequest(e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error_response(self.status_code(), self.to_string())
    }
}

/// Why the router refuses a request: the agent's or the router's [`ApiError`], or a body it
/// would not read.
#[derive(Debug)]
pub(super) enum Refusal {
    /// Answered with the error's status.
    Api(ApiError),
    /// 413: the body is larger than [`MAX_BODY_BYTES`].
    TooLarge,
    /// 408: the body did not arrive within [`BODY_READ_TIMEOUT`].
    TooSlow,
}

impl From<ApiError> for Refusal {
    fn from(e: ApiError) -> Self {
        Self::Api(e)
    }
}

impl From<InvalidField> for Refusal {
    fn from(e: InvalidField) -> Self {
        Self::Api(e.into())
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Self::Api(e) => e.into_response(),
            Self::TooLarge => error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request body is larger than {MAX_BODY_BYTES} bytes"),
            ),
            Self::TooSlow => error_response(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {} s",
                    BODY_READ_TIMEOUT.as_secs()
                ),
            ),
        }
    }
}

/// A JSON [`ErrorBody`] with `status`.
fn error_response(status: StatusCode, error: String) -> Response {
    (status, Json(ErrorBody { error })).into_response()
}
