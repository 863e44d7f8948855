//! The agent's HTTP API (`/v1/…`): the JSON documents it serves ([`types`], re-exported here),
//! the server side ([`server`]: routes over an [`AgentView`], served on a unix socket and
//! optionally loopback TCP) and the client the CLI uses ([`client`]).
//!
//! Routes (JSON unless said otherwise; errors are [`ErrorBody`] with a 4xx/5xx status):
//!
//! | route | answer |
//! |---|---|
//! | `GET /v1/plugins` | [`PluginList`] |
//! | `POST /v1/plugins` | body [`RegisterRequest`] → [`PluginStatus`] |
//! | `GET /v1/plugin/csi/{id}` | [`PluginStatus`], or 404 |
//! | `DELETE /v1/plugin/csi/{id}/instances/{instance}` | 204 |
//! | `GET /v1/node` | [`NodeStatus`] |
//! | `GET /v1/events` | newline-delimited [`EventLine`]s, live from the request on |
//! | `GET /v1/event/stream[?topic=T:key&index=N&heartbeat=10s]` | newline-delimited [`stream::StreamLine`]s: the persisted window after `N`, then live; `{}` while idle |
//! | `GET /v1/metrics` | Prometheus text ([`METRICS_CONTENT_TYPE`]) |
//! | `GET /.well-known/jwks.json` | the JWK set that verifies the agent's workload identities |
//! | `GET /v1/volumes` | [`volumes::VolumeList`] |
//! | `POST /v1/volumes/register`, `/v1/volumes/create` | body [`volumes::VolumeSpecRequest`] → [`volumes::VolumeStatus`] |
//! | `GET /v1/volumes/snapshots?plugin_id=…` | [`volumes::SnapshotList`] |
//! | `POST /v1/volumes/snapshot/delete` | body [`volumes::SnapshotDeleteRequest`] → 204 |
//! | `GET /v1/volume/csi/{id}` | [`volumes::VolumeStatus`], or 404 |
//! | `DELETE /v1/volume/csi/{id}[?force=true]` | deregister → [`volumes::DetachResponse`] |
//! | `POST /v1/volume/csi/{id}/delete` | DeleteVolume → 204 |
//! | `POST /v1/volume/csi/{id}/detach` | body [`volumes::DetachRequest`] (may be empty) → [`volumes::DetachResponse`] |
//! | `POST /v1/volume/csi/{id}/expand` | body [`volumes::ExpandRequest`] → [`volumes::ExpandResponse`] |
//! | `POST /v1/volume/csi/{id}/claim` | body [`volumes::ClaimRequest`] → [`volumes::ClaimResponse`] |
//! | `POST /v1/volume/csi/{id}/release` | body [`volumes::ReleaseRequest`] → [`volumes::ReleaseResponse`] |
//! | `GET /v1/jobs` | [`jobs::JobList`] |
//! | `POST /v1/jobs` | body [`jobs::JobRunRequest`] → [`jobs::JobStatus`] (placed and started) |
//! | `GET /v1/job/{id}` | [`jobs::JobStatus`] |
//! | `DELETE /v1/job/{id}` | stop → [`jobs::JobStatus`] |
//! | `GET /v1/alloc/{id}` | [`jobs::AllocStatus`] |
//! | `POST /v1/volume/csi/{id}/snapshot` | body [`volumes::SnapshotCreateRequest`] → [`volumes::SnapshotView`] |
//! | `GET /v1/client/fs/logs/{alloc_id}?task=&type=stdout\|stderr&origin=start\|end&offset=&follow=&lines=` | a task's log, raw bytes ([`LOGS_CONTENT_TYPE`]; see [`allocs::LogsRequest`]) |
//! | `POST /v1/client/allocation/{alloc_id}/exec?task=&command=<JSON array>&tty=&cols=&rows=` | `101` upgrade to [`allocs::EXEC_PROTOCOL`] frames (see [`allocs`]) |
//! | `GET /ui/`, `/ui/{file}` | the web UI (HTML, CSS, JS embedded in the binary); `/` and `/ui` redirect there |
//! | `POST /v1/acl/bootstrap` | the first management token, with its secret ([`acl::NewToken`]); 409 once done |
//! | `GET /v1/acl/tokens` | [`acl::AclTokenList`] (no secrets) |
//! | `POST /v1/acl/tokens` | body [`acl::TokenCreateRequest`] → [`acl::NewToken`] |
//! | `DELETE /v1/acl/token/{accessor}` | 204 |
//! | `GET /v1/acl/token/self` | the caller's [`acl::AclToken`] |
//!
//! With ACLs on, every request but `POST /v1/acl/bootstrap`, `GET /ui…` and the JWK set sends
//! a token's secret id in [`acl::TOKEN_HEADER`]: 401 without one, 403 with one that is unknown
//! or lacks the policy the route needs ([`server::required_access`]).
//!
//! Every id in a path, a query or a body is checked before the agent is called (see
//! [`server`]); bodies are at most [`server::MAX_BODY_BYTES`] (413 beyond) and must arrive
//! within [`server::BODY_READ_TIMEOUT`] (408); no error repeats a value of the body. The
//! server serves at most [`server::MAX_CONNECTIONS`] connections at once, one request each, and
//! closes a connection that has not sent its request head within
//! [`server::HEAD_READ_TIMEOUT`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod acl;
pub mod allocs;
mod checks;
pub mod client;
pub mod jobs;
pub mod nodes;
pub mod server;
pub mod stream;
pub mod types;
pub mod volumes;

pub use client::{Address, Client, ClientError, ConnectFailure, EventStream};
pub use server::{
    AgentView, ApiError, JobView, Listeners, ServeError, SpecOp, VolumeView, router, serve,
};
pub use types::*;

/// The agent's default data dir.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/berth";

/// The API socket's file name under the data dir.
pub const SOCKET_NAME: &str = "berth.sock";

/// Where the CLI looks for the agent unless told otherwise: the socket under
/// [`DEFAULT_DATA_DIR`].
pub const DEFAULT_ADDRESS: &str = "unix:///var/lib/berth/berth.sock";

/// `Content-Type` of `GET /v1/metrics` (Prometheus text exposition format).
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `Content-Type` of `GET /v1/client/fs/logs/{alloc_id}`: the task's own bytes.
pub const LOGS_CONTENT_TYPE: &str = "application/octet-stream";

/// `Content-Type` of `GET /v1/events`.
pub const EVENTS_CONTENT_TYPE: &str = "application/x-ndjson";

/// The response header that carries the newest event index when the response was made (the
/// event stream's `index` to read what follows from).
pub const INDEX_HEADER: &str = "x-berth-index";

/// Where the agent serves the public keys of its workload identities (a JWK set).
pub const JWKS_PATH: &str = "/.well-known/jwks.json";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_address_is_the_socket_in_the_default_data_dir() {
        assert_eq!(
            DEFAULT_ADDRESS,
            format!("unix://{DEFAULT_DATA_DIR}/{SOCKET_NAME}")
        );
    }
}
