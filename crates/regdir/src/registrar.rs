//! The client side of the registration API: connect to a registrar's socket, ask `GetInfo`,
//! answer with `NotifyRegistrationStatus`. Every step has a deadline.

use std::{
    io,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use berth_csi::{Endpoint, EndpointError};
use hyper_util::rt::TokioIo;
use tokio::{net::UnixStream, time::Instant};
use tonic::{Code, Request, Status, transport::Channel};

use crate::pb::{self, registration_client::RegistrationClient};

/// Longest wait between two connection attempts on a socket nothing listens on yet.
const MAX_CONNECT_BACKOFF: Duration = Duration::from_millis(200);
/// How many characters of a registrar's error message are repeated.
const SHOWN_CHARS: usize = 200;

/// Why a socket could not be asked `GetInfo` or told its status. The message names the socket.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RegistrarError {
    /// The socket's own path cannot be connected to (e.g. too long for a socket address).
    #[error("registration socket unusable: {0}")]
    Path(#[source] EndpointError),
    /// `connect(2)` failed (or was refused until the deadline).
    #[error("cannot connect to {path}: {source}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// The last failure.
        #[source]
        source: io::Error,
    },
    /// The connection broke before a gRPC exchange could start.
    #[error("connection to {path} failed before GetInfo: {detail}")]
    Handshake {
        /// The socket.
        path: PathBuf,
        /// What went wrong, with its causes.
        detail: String,
    },
    /// No answer within the deadline.
    #[error("{path} did not answer {rpc} within {after:?}")]
    Timeout {
        /// The socket.
        path: PathBuf,
        /// The RPC asked.
        rpc: &'static str,
        /// The deadline.
        after: Duration,
    },
    /// A gRPC server that does not serve `pluginregistration.Registration` (a CSI socket…).
    #[error("{path} does not serve the plugin registration API ({rpc}: unimplemented)")]
    NotRegistrar {
        /// The socket.
        path: PathBuf,
        /// The RPC asked.
        rpc: &'static str,
    },
    /// Any other failed call.
    #[error("{rpc} on {path} failed: {code:?}: {message}")]
    Rpc {
        /// The socket.
        path: PathBuf,
        /// The RPC asked.
        rpc: &'static str,
        /// The gRPC status code.
        code: Code,
        /// The status message (at most 200 characters of it).
        message: String,
    },
}

/// A connection to one registrar.
#[derive(Debug)]
pub(crate) struct Registrar {
    client: RegistrationClient<Channel>,
    path: PathBuf,
    timeout: Duration,
}

impl Registrar {
    /// Connects to `path` and asks `GetInfo`, all within `timeout`. A socket that refuses
    /// connections (bound, not yet listening) is retried until the deadline.
    pub(crate) async fn get_info(
        path: &Path,
        timeout: Duration,
    ) -> Result<(Self, pb::PluginInfo), RegistrarError> {
        const RPC: &str = "GetInfo";
        let deadline = Instant::now() + timeout;
        let endpoint = Endpoint::from_path(path).map_err(RegistrarError::Path)?;
        let timed_out = || RegistrarError::Timeout {
            path: path.to_path_buf(),
            rpc: RPC,
            after: timeout,
        };
        let stream = tokio::time::timeout_at(deadline, connect(endpoint.path(), deadline))
            .await
            .map_err(|_| timed_out())??;
        let channel = tokio::time::timeout_at(deadline, channel_over(stream))
            .await
            .map_err(|_| timed_out())?
            .map_err(|e| RegistrarError::Handshake {
                path: path.to_path_buf(),
                detail: with_causes(&e),
            })?;
        let mut client = RegistrationClient::new(channel);
        let mut request = Request::new(pb::InfoRequest {});
        request.set_timeout(deadline.saturating_duration_since(Instant::now()));
        let info = tokio::time::timeout_at(deadline, client.get_info(request))
            .await
            .map_err(|_| timed_out())?
            .map_err(|s| {
                // tonic enforces the grpc-timeout it sends, as CANCELLED: a timeout all the same.
                if Instant::now() >= deadline {
                    timed_out()
                } else {
                    rpc_error(path, RPC, &s)
                }
            })?
            .into_inner();
        Ok((
            Self {
                client,
                path: path.to_path_buf(),
                timeout,
            },
            info,
        ))
    }

    /// Tells the registrar whether its plugin is registered (and why not), within the timeout.
    pub(crate) async fn notify(
        &mut self,
        registered: bool,
        error: String,
    ) -> Result<(), RegistrarError> {
        const RPC: &str = "NotifyRegistrationStatus";
        let mut request = Request::new(pb::RegistrationStatus {
            plugin_registered: registered,
            error,
        });
        request.set_timeout(self.timeout);
        let deadline = Instant::now() + self.timeout;
        let timed_out = || RegistrarError::Timeout {
            path: self.path.clone(),
            rpc: RPC,
            after: self.timeout,
        };
        tokio::time::timeout_at(deadline, self.client.notify_registration_status(request))
            .await
            .map_err(|_| timed_out())?
            .map_err(|s| {
                if Instant::now() >= deadline {
                    timed_out()
                } else {
                    rpc_error(&self.path, RPC, &s)
                }
            })?;
        Ok(())
    }
}

/// Connects, retrying while nothing listens yet (`ECONNREFUSED`) until `deadline`.
async fn connect(path: &Path, deadline: Instant) -> Result<UnixStream, RegistrarError> {
    let mut backoff = Duration::from_millis(10);
    loop {
        match UnixStream::connect(path).await {
            Ok(stream) => return Ok(stream),
            Err(e)
                if e.kind() == io::ErrorKind::ConnectionRefused
                    && Instant::now() + backoff < deadline =>
            {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_CONNECT_BACKOFF);
            }
            Err(source) => {
                return Err(RegistrarError::Connect {
                    path: path.to_path_buf(),
                    source,
                });
            }
        }
    }
}

/// A gRPC channel over an already connected stream. It does not reconnect: one registration
/// exchange uses one connection, as kubelet does.
async fn channel_over(stream: UnixStream) -> Result<Channel, tonic::transport::Error> {
    let stream = Arc::new(Mutex::new(Some(stream)));
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let taken = stream.lock().map(|mut s| s.take()).unwrap_or(None);
        async move {
            taken.map(TokioIo::new).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotConnected,
                    "the registrar connection is closed",
                )
            })
        }
    });
    // The URI is required by the API and unused: the connector ignores it.
    tonic::transport::Endpoint::from_static("http://registrar.invalid")
        .connect_with_connector(connector)
        .await
}

fn rpc_error(path: &Path, rpc: &'static str, status: &Status) -> RegistrarError {
    match status.code() {
        Code::Unimplemented => RegistrarError::NotRegistrar {
            path: path.to_path_buf(),
            rpc,
        },
        code => RegistrarError::Rpc {
            path: path.to_path_buf(),
            rpc,
            code,
            message: {
                let mut message = status.message().to_owned();
                if let Some(source) = std::error::Error::source(status) {
                    message = format!("{message}: {}", with_causes(source));
                }
                message.chars().take(SHOWN_CHARS).collect()
            },
        },
    }
}

/// `error: cause: cause…`, skipping causes that repeat what is already said.
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text = format!("{text}: {said}");
        }
        source = cause.source();
    }
    text
}
