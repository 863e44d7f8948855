//! A kubelet-compatible plugin registration directory.
//!
//! A CSI driver deployed with the stock `node-driver-registrar` sidecar creates a unix socket in
//! the directory and serves the Kubernetes plugin registration API v1 on it (package
//! `pluginregistration`, service `Registration`: `GetInfo`, `NotifyRegistrationStatus`).
//! [`RegistrationDir`] finds those sockets (inotify plus periodic rescans), checks what each
//! one announces, hands the plugin to the agent's [`Sink`], tells the registrar the verdict, and
//! deregisters the plugin when its socket goes away.
//!
//! [`testing::FakeRegistrar`] drops such a socket into a directory, for tests.

#![warn(missing_docs)]

mod dir;
mod error;
mod plugin;
mod registrar;
mod sink;
mod slots;
pub mod testing;

/// Generated messages, `Registration` client and server (package `pluginregistration`).
#[allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
pub mod pb {
    tonic::include_proto!("pluginregistration");
}

pub use dir::{DEFAULT_RPC_TIMEOUT, MIN_RESCAN_INTERVAL, RegistrationDir};
pub use error::RegDirError;
pub use plugin::{CSI_PLUGIN_TYPE, DiscoveredPlugin, InvalidPlugin};
pub use sink::Sink;
