//! CSI v1.12.0 for berth: generated bindings ([`pb`]), a retrying client over unix sockets, and
//! the domain model the rest of berth speaks.

/// Generated messages and Identity / Controller / Node clients and servers (package `csi.v1`).
#[allow(missing_docs, missing_debug_implementations, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("csi.v1");
}

mod redact;
pub use redact::REDACTED;
