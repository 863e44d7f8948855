//! Binding the API's listeners, and serving a router on them until shutdown.

use std::{
    io,
    net::SocketAddr,
    os::unix::fs::{DirBuilderExt as _, FileTypeExt as _, MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    time::Duration,
};

use axum::{Extension, Router, extract::Request};
use berth_csi::MAX_SOCKET_PATH;
use hyper::{body::Incoming, server::conn::http1};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, UnixListener},
    task::JoinSet,
};
use tokio_util::sync::CancellationToken;

use super::routes::Draining;

/// How long [`Listeners::serve`] waits, once shut down, for requests in flight to finish before
/// it cuts their connections.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client may take to send a request head.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Pause after a failed `accept` (e.g. out of file descriptors) before the next one.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Why the API cannot be served. Every variant names the path or address it is about.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The socket path does not fit in a unix socket address.
    #[error(
        "API socket path {} is {len} bytes; a unix socket path must fit in {MAX_SOCKET_PATH} bytes",
        path.display()
    )]
    SocketPathTooLong {
        /// The socket path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
    },
    /// The socket's directory cannot be created.
    #[error("cannot create the API socket's directory {}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// What is at the socket path cannot be inspected.
    #[error("cannot inspect {}", path.display())]
    Inspect {
        /// The socket path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Something other than a socket is at the socket path; it is left alone.
    #[error("{} exists and is not a socket; refusing to replace it", path.display())]
    NotASocket {
        /// The socket path.
        path: PathBuf,
    },
    /// A live process answers on the socket path; it is left alone.
    #[error(
        "another process is serving on {} (is another `berth agent` running?)",
        path.display()
    )]
    InUse {
        /// The socket path.
        path: PathBuf,
    },
    /// A stale socket cannot be removed.
    #[error("cannot remove the stale socket {}", path.display())]
    RemoveStale {
        /// The socket path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The socket cannot be bound.
    #[error("cannot bind the API socket {}", path.display())]
    BindUnix {
        /// The socket path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The socket's mode cannot be set to 0600 (the socket is removed again).
    #[error("cannot restrict the API socket {} to mode 0600", path.display())]
    Chmod {
        /// The socket path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The TCP address is not a loopback address; nothing was bound.
    #[error(
        "refusing to serve the API on {addr}: only a loopback address (127.0.0.0/8 or ::1) is \
         allowed, the API has no authentication"
    )]
    NotLoopback {
        /// The refused address.
        addr: SocketAddr,
    },
    /// The TCP address cannot be bound.
    #[error("cannot listen on {addr}")]
    BindTcp {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// The API's bound listeners: a unix socket (mode 0600) and optionally a loopback TCP port.
/// Clients can connect as soon as [`Listeners::bind`] returns; their requests are answered
/// once [`Listeners::serve`] runs. Dropping it (served or not) removes the socket file, unless
/// something else has replaced it since.
#[derive(Debug)]
pub struct Listeners {
    unix: UnixListener,
    tcp: Option<TcpListener>,
    socket: SocketFile,
    drain_timeout: Duration,
}

impl Listeners {
    /// Binds the unix socket at `unix` and, if given, the TCP address `tcp`.
    ///
    /// `tcp` must be a loopback address (port 0 picks a free port: see [`Self::tcp_addr`]); any
    /// other is refused before anything is touched. The socket's directory is created (mode
    /// 0700) when missing; a stale socket at `unix` (one nobody answers on) is replaced, but a
    /// live one or a file that is not a socket is an error. The socket gets mode 0600. On any
    /// error nothing stays bound and no socket file is left behind.
    ///
    /// Must be called inside a Tokio runtime.
    pub fn bind(unix: &Path, tcp: Option<SocketAddr>) -> Result<Self, ServeError> {
        if let Some(addr) = tcp
            && !addr.ip().is_loopback()
        {
            return Err(ServeError::NotLoopback { addr });
        }
        let (unix, socket) = bind_unix(unix)?;
        let tcp = match tcp {
            None => None,
            Some(addr) => Some(bind_tcp(addr)?),
        };
        Ok(Self {
            unix,
            tcp,
            socket,
            drain_timeout: DRAIN_TIMEOUT,
        })
    }

    /// How long [`Self::serve`] waits for requests in flight once shut down (default
    /// [`DRAIN_TIMEOUT`]).
    pub fn with_drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// The unix socket's path.
    pub fn unix_path(&self) -> &Path {
        &self.socket.path
    }

    /// The bound TCP address (with the actual port), when serving TCP.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Serves `router` (HTTP/1.1) on every listener until `shutdown` is cancelled, then stops
    /// accepting, ends event streams, lets requests in flight finish for up to the drain
    /// timeout, cuts the connections still open, and removes the socket file. Returns only
    /// after every connection task has ended. A failed `accept` is logged and retried; it never
    /// stops the server.
    pub async fn serve(self, router: Router, shutdown: CancellationToken) {
        let Self {
            unix,
            tcp,
            socket,
            drain_timeout,
        } = self;
        let router = router.layer(Extension(Draining(shutdown.clone())));
        let unix_label = socket.path.display().to_string();
        let tcp_label = tcp
            .as_ref()
            .and_then(|l| l.local_addr().ok())
            .map_or_else(String::new, |a| a.to_string());
        let mut conns = JoinSet::new();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                accepted = unix.accept() => match accepted {
                    Ok((stream, _)) => {
                        conns.spawn(serve_connection(stream, router.clone(), shutdown.clone()));
                    }
                    Err(e) => accept_failed(&unix_label, e).await,
                },
                accepted = accept_tcp(tcp.as_ref()) => match accepted {
                    Ok(stream) => {
                        // Request/response traffic: do not hold small writes back.
                        let _ = stream.set_nodelay(true);
                        conns.spawn(serve_connection(stream, router.clone(), shutdown.clone()));
                    }
                    Err(e) => accept_failed(&tcp_label, e).await,
                },
                Some(joined) = conns.join_next(), if !conns.is_empty() => log_join(joined),
            }
        }
        drop(unix);
        drop(tcp);
        let drained = tokio::time::timeout(drain_timeout, async {
            while let Some(joined) = conns.join_next().await {
                log_join(joined);
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                connections = conns.len(),
                timeout = ?drain_timeout,
                "API requests still running after the drain timeout; closing their connections"
            );
            conns.abort_all();
            while conns.join_next().await.is_some() {}
        }
        drop(socket);
    }
}

/// Binds the listeners ([`Listeners::bind`]) and serves `router` on them until `shutdown` is
/// cancelled ([`Listeners::serve`]). Errors only while binding.
pub async fn serve(
    router: Router,
    unix: &Path,
    tcp: Option<SocketAddr>,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    Listeners::bind(unix, tcp)?.serve(router, shutdown).await;
    Ok(())
}

/// The socket file this server created; removed on drop unless it was replaced meanwhile.
#[derive(Debug)]
struct SocketFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) if m.dev() == self.dev && m.ino() == self.ino => {
                if let Err(e) = std::fs::remove_file(&self.path) {
                    tracing::warn!(path = %self.path.display(), error = %e, "cannot remove the API socket");
                }
            }
            _ => {}
        }
    }
}

fn bind_unix(path: &Path) -> Result<(UnixListener, SocketFile), ServeError> {
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(ServeError::SocketPathTooLong {
            path: path.to_path_buf(),
            len,
        });
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| ServeError::CreateDir {
                path: dir.to_path_buf(),
                source,
            })?;
    }
    remove_stale_socket(path)?;
    let listener = UnixListener::bind(path).map_err(|source| ServeError::BindUnix {
        path: path.to_path_buf(),
        source,
    })?;
    let meta = std::fs::symlink_metadata(path).map_err(|source| ServeError::Inspect {
        path: path.to_path_buf(),
        source,
    })?;
    // From here on the guard removes the socket if anything fails.
    let file = SocketFile {
        path: path.to_path_buf(),
        dev: meta.dev(),
        ino: meta.ino(),
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|source| {
        ServeError::Chmod {
            path: path.to_path_buf(),
            source,
        }
    })?;
    Ok((listener, file))
}

/// Removes a socket at `path` that nobody answers on; leaves anything else and says why.
fn remove_stale_socket(path: &Path) -> Result<(), ServeError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(ServeError::Inspect {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    if !meta.file_type().is_socket() {
        return Err(ServeError::NotASocket {
            path: path.to_path_buf(),
        });
    }
    // A connect to a socket without a listener fails at once (ECONNREFUSED).
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(ServeError::InUse {
            path: path.to_path_buf(),
        });
    }
    std::fs::remove_file(path).map_err(|source| ServeError::RemoveStale {
        path: path.to_path_buf(),
        source,
    })
}

fn bind_tcp(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    let bind_error = |source| ServeError::BindTcp { addr, source };
    let std_listener = std::net::TcpListener::bind(addr).map_err(bind_error)?;
    std_listener.set_nonblocking(true).map_err(bind_error)?;
    TcpListener::from_std(std_listener).map_err(bind_error)
}

async fn accept_tcp(listener: Option<&TcpListener>) -> io::Result<tokio::net::TcpStream> {
    match listener {
        Some(l) => l.accept().await.map(|(stream, _)| stream),
        None => std::future::pending().await,
    }
}

fn log_join(joined: Result<(), tokio::task::JoinError>) {
    if let Err(e) = joined
        && e.is_panic()
    {
        tracing::error!(error = %e, "an API connection task panicked");
    }
}

async fn accept_failed(listener: &str, error: io::Error) {
    tracing::warn!(%listener, %error, "API accept failed");
    tokio::time::sleep(ACCEPT_BACKOFF).await;
}

/// Serves one connection until the client closes it or, once `shutdown` is cancelled, until
/// its request in flight is answered.
async fn serve_connection<S>(stream: S, router: Router, shutdown: CancellationToken)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        tower::ServiceExt::oneshot(router.clone(), req)
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    let mut conn = std::pin::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(error) = result {
        tracing::debug!(%error, "API connection ended with an error");
    }
}
