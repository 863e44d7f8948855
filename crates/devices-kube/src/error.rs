//! What stops the registration server from starting or serving.

use std::{io, path::PathBuf};

use berth_sys::MAX_SOCKET_PATH;

/// Why [`KubeDevices`](crate::KubeDevices) cannot be made or cannot run. Once it serves,
/// nothing a plugin does stops it: per-plugin failures become events and log lines.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// A configuration value is unusable.
    #[error("device plugin config: {field}: {reason}")]
    Config {
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The registration socket's path does not fit in a unix socket address.
    #[error(
        "registration socket path {path} is {len} bytes; a unix socket path must fit in \
         {MAX_SOCKET_PATH} bytes (use a shorter device plugin directory)"
    )]
    SocketPathTooLong {
        /// The path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
    },
    /// The device plugin directory cannot be created or used.
    #[error("device plugin directory {path}: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The failure.
        #[source]
        source: io::Error,
    },
    /// A stale socket in the directory cannot be removed.
    #[error("cannot remove stale socket {path}: {source}")]
    RemoveStale {
        /// The socket.
        path: PathBuf,
        /// The failure.
        #[source]
        source: io::Error,
    },
    /// Another registration server answers on the registration socket.
    #[error(
        "registration socket {path} is in use: another agent or kubelet serves this device \
         plugin directory"
    )]
    InUse {
        /// The socket.
        path: PathBuf,
    },
    /// Something other than a socket is where the registration socket goes.
    #[error("{path} exists and is not a unix socket; refusing to replace it")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// The registration socket cannot be bound.
    #[error("cannot listen on registration socket {path}: {source}")]
    Bind {
        /// The socket.
        path: PathBuf,
        /// The failure.
        #[source]
        source: io::Error,
    },
    /// The gRPC server failed while serving.
    #[error("registration server on {path} failed: {source}")]
    Serve {
        /// The socket.
        path: PathBuf,
        /// The failure.
        #[source]
        source: tonic::transport::Error,
    },
}
