//! CSI v1.12.0 for berth: generated bindings ([`pb`]), a retrying client over unix sockets
//! ([`CsiClient`]), and the domain model the rest of berth speaks ([`model`]).
//!
//! Secrets and mount flags never print: the generated messages that carry them have a
//! redacting `Debug`, the model's wrappers too, and plugin error text is scrubbed of them.

/// Generated messages and Identity / Controller / Node clients and servers (package `csi.v1`).
#[allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
pub mod pb {
    tonic::include_proto!("csi.v1");
}

mod client;
mod endpoint;
mod error;
pub mod model;
mod redact;
mod requests;
pub mod retry;
mod transport;

pub use client::{CallObserver, ClientBuilder, CsiClient, ListedVolume, Page, Validation, channel};
pub use endpoint::{Endpoint, EndpointError, MAX_SOCKET_PATH};
pub use error::{CsiError, code_name, sanitize};
pub use redact::REDACTED;
pub use requests::{
    CapacityRange, ContentSource, ControllerPublish, CreateVolume, NodeExpand, NodePublish,
    NodeStage,
};
pub use retry::{RetryPolicy, Rpc};
/// gRPC status codes, as the errors report them.
pub use tonic::Code;
pub use transport::PluginChannel;
