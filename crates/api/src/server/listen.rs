//! Binding the API's listeners, and serving a router on them until shutdown.

use std::{
    convert::Infallible,
    io,
    net::SocketAddr,
    os::unix::fs::{DirBuilderExt as _, FileTypeExt as _, MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    sync::Arc,
    task::Poll,
    time::Duration,
};

use axum::{Extension, Router, extract::Request, response::Response};
use berth_csi::MAX_SOCKET_PATH;
use hyper::{body::Incoming, server::conn::http1};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, UnixListener},
    task::JoinSet,
};
use tokio_util::sync::CancellationToken;

use super::{
    routes::Draining,
    slots::{Slot, Slots},
    tls::ServerTls,
};

/// How long [`Listeners::serve`] waits, once shut down, for requests in flight to finish before
/// it cuts their connections.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// How many connections [`Listeners::serve`] serves at once, unix socket and TCP together (set
/// with [`Listeners::with_max_connections`]).
///
/// At the limit, one connection more is accepted and waits for a slot: if some connections
/// have not sent their request head yet, the oldest of them is closed to make room for it, so
/// connections opened and left silent cannot keep a real request out; otherwise it waits until
/// a connection ends. Meanwhile nothing else is accepted: later connections wait in the
/// kernel's listen backlog, holding no file descriptor of the agent. So the agent holds at most
/// this many connections plus one. A connection serves one request (no keep-alive); an event
/// stream holds its slot while it runs.
pub const MAX_CONNECTIONS: usize = 256;

/// How long a connection may take, from its accept, to send its request head before it is
/// closed (set with [`Listeners::with_head_read_timeout`]). Real clients send it at once; a
/// client that trickles it (slow-loris) holds a slot at most this long.
pub const HEAD_READ_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// The socket's mode cannot be set to 0600 (0660 with a group; the socket is removed
    /// again).
    #[error("cannot restrict the API socket {} to mode {mode:04o}", path.display())]
    Chmod {
        /// The socket path.
        path: PathBuf,
        /// The mode it was to get.
        mode: u32,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The socket cannot be given to its group (the socket is removed again).
    #[error("cannot give the API socket {} to group {gid}", path.display())]
    Chown {
        /// The socket path.
        path: PathBuf,
        /// The group.
        gid: u32,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The TCP address is not a loopback address and the listener has no TLS; nothing was
    /// bound.
    #[error(
        "refusing to serve the API on {addr}: only a loopback address (127.0.0.0/8 or ::1) is \
         allowed without TLS (api {{ tls {{ … }} }} with acl {{ enabled = true }})"
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

/// How [`Listeners::bind_with`] binds, beyond the addresses.
#[derive(Debug, Clone, Default)]
pub struct ListenOptions {
    /// TLS on the TCP listener (the unix socket stays plain). Required for a TCP address that
    /// is not loopback (whose router should then require tokens: see [`super::AgentView::acl`]).
    pub tls: Option<ServerTls>,
    /// The group (gid) that may use the unix socket: it gets mode 0660 and this group instead
    /// of 0600. Its members must also be able to traverse the socket's directories.
    pub socket_group: Option<u32>,
}

/// The API's bound listeners: a unix socket (mode 0600, or 0660 for its group) and optionally
/// a TCP port (loopback, or any address with TLS). Clients can connect as soon as
/// [`Listeners::bind`] returns; their requests are answered once [`Listeners::serve`] runs.
/// Dropping it (served or not) removes the socket file, unless something else has replaced it
/// since.
#[derive(Debug)]
pub struct Listeners {
    unix: UnixListener,
    tcp: Option<TcpListener>,
    tls: Option<ServerTls>,
    socket: SocketFile,
    drain_timeout: Duration,
    max_connections: usize,
    head_read_timeout: Duration,
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
        Self::bind_with(unix, tcp, ListenOptions::default())
    }

    /// [`Self::bind`] with TLS on the TCP listener (which may then listen on any address) and
    /// the socket's group, as `options` say.
    pub fn bind_with(
        unix: &Path,
        tcp: Option<SocketAddr>,
        options: ListenOptions,
    ) -> Result<Self, ServeError> {
        if let Some(addr) = tcp
            && !addr.ip().is_loopback()
            && options.tls.is_none()
        {
            return Err(ServeError::NotLoopback { addr });
        }
        let (unix, socket) = bind_unix(unix, options.socket_group)?;
        let tcp = match tcp {
            None => None,
            Some(addr) => Some(bind_tcp(addr)?),
        };
        Ok(Self {
            unix,
            tcp,
            tls: options.tls,
            socket,
            drain_timeout: DRAIN_TIMEOUT,
            max_connections: MAX_CONNECTIONS,
            head_read_timeout: HEAD_READ_TIMEOUT,
        })
    }

    /// How long [`Self::serve`] waits for requests in flight once shut down (default
    /// [`DRAIN_TIMEOUT`]).
    pub fn with_drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// How many connections [`Self::serve`] serves at once (default [`MAX_CONNECTIONS`]; at
    /// least 1).
    pub fn with_max_connections(mut self, max: usize) -> Self {
        self.max_connections = max.max(1);
        self
    }

    /// How long a connection may take to send its request head (default
    /// [`HEAD_READ_TIMEOUT`]).
    pub fn with_head_read_timeout(mut self, timeout: Duration) -> Self {
        self.head_read_timeout = timeout;
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

    /// Serves `router` (HTTP/1.1, one request per connection) on every listener until
    /// `shutdown` is cancelled, at most the configured number of connections at once (see
    /// [`MAX_CONNECTIONS`]); then stops accepting, ends event streams, lets requests in flight
    /// finish for up to the drain timeout, cuts the connections still open, and removes the
    /// socket file. Exec sessions (upgraded connections) end as the drain starts. Returns only
    /// after every connection task has ended. A failed `accept` is
    /// logged and retried; it never stops the server.
    pub async fn serve(self, router: Router, shutdown: CancellationToken) {
        let Self {
            unix,
            tcp,
            tls,
            socket,
            drain_timeout,
            max_connections,
            head_read_timeout,
        } = self;
        let sessions = super::alloc_routes::Sessions::new();
        let router = router
            .layer(Extension(Draining(shutdown.clone())))
            .layer(Extension(sessions.clone()));
        let unix_label = socket.path.display().to_string();
        let tcp_label = tcp
            .as_ref()
            .and_then(|l| l.local_addr().ok())
            .map_or_else(String::new, |a| a.to_string());
        let mut slots = Slots::new(max_connections);
        let mut conns = JoinSet::new();
        'accept: loop {
            let free = slots.try_reserve();
            // At the limit this accepts one connection more, which waits for a slot below;
            // nothing else is accepted meanwhile: the rest wait in the kernel's backlog.
            let accepted = loop {
                tokio::select! {
                    () = shutdown.cancelled() => break 'accept,
                    accepted = unix.accept() => match accepted {
                        Ok((stream, _)) => break Accepted::Unix(stream),
                        Err(e) => accept_failed(&unix_label, e).await,
                    },
                    accepted = accept_tcp(tcp.as_ref()) => match accepted {
                        Ok(stream) => {
                            // Request/response traffic: do not hold small writes back.
                            let _ = stream.set_nodelay(true);
                            break Accepted::Tcp(stream);
                        }
                        Err(e) => accept_failed(&tcp_label, e).await,
                    },
                    Some(joined) = conns.join_next(), if !conns.is_empty() => log_join(joined),
                }
            };
            let permit = match free.or_else(|| slots.try_reserve()) {
                Some(permit) => permit,
                None => {
                    tracing::debug!(max_connections, "API connections at the limit");
                    tokio::select! {
                        () = shutdown.cancelled() => break 'accept,
                        permit = slots.make_room() => permit,
                    }
                }
            };
            let slot = slots.slot(permit);
            let config = ConnConfig {
                router: router.clone(),
                shutdown: shutdown.clone(),
                head_read_timeout,
            };
            match accepted {
                Accepted::Unix(stream) => conns.spawn(serve_connection(stream, config, slot)),
                Accepted::Tcp(stream) => match &tls {
                    None => conns.spawn(serve_connection(stream, config, slot)),
                    Some(tls) => conns.spawn(serve_tls(stream, tls.clone(), config, slot)),
                },
            };
        }
        drop(unix);
        drop(tcp);
        let drained = tokio::time::timeout(drain_timeout, async {
            while let Some(joined) = conns.join_next().await {
                log_join(joined);
            }
            // Exec sessions end as the drain starts (their commands are killed).
            sessions.close_and_wait().await;
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                connections = conns.len(),
                exec_sessions = sessions.len(),
                timeout = ?drain_timeout,
                "API requests still running after the drain timeout; closing their connections"
            );
            conns.abort_all();
            while conns.join_next().await.is_some() {}
        }
        drop(socket);
    }
}

/// A connection just accepted, not served yet.
enum Accepted {
    Unix(tokio::net::UnixStream),
    Tcp(tokio::net::TcpStream),
}

/// What each connection task needs besides its stream and slot.
#[derive(Clone)]
struct ConnConfig {
    router: Router,
    shutdown: CancellationToken,
    head_read_timeout: Duration,
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

fn bind_unix(path: &Path, group: Option<u32>) -> Result<(UnixListener, SocketFile), ServeError> {
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
    // The group first, then the mode that opens the socket to it.
    if let Some(gid) = group {
        std::os::unix::fs::chown(path, None, Some(gid)).map_err(|source| ServeError::Chown {
            path: path.to_path_buf(),
            gid,
            source,
        })?;
    }
    let mode = if group.is_some() { 0o660 } else { 0o600 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|source| {
        ServeError::Chmod {
            path: path.to_path_buf(),
            mode,
            source,
        }
    })?;
    if let Some(gid) = group {
        warn_untraversable(path, gid);
    }
    Ok((listener, file))
}

/// Warns about each directory above the socket that members of `gid` cannot traverse (no
/// search permission for others, nor for the group when it is the directory's): they could not
/// reach the socket.
fn warn_untraversable(socket: &Path, gid: u32) {
    for dir in socket.ancestors().skip(1) {
        let Ok(meta) = std::fs::metadata(dir) else {
            continue;
        };
        let mode = meta.mode();
        let searchable = mode & 0o001 != 0 || (meta.gid() == gid && mode & 0o010 != 0);
        if !searchable {
            tracing::warn!(
                dir = %dir.display(),
                gid,
                "members of the API socket's group cannot traverse this directory, so they cannot reach the socket; give it the group with mode 0710, or o+x"
            );
        }
    }
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

/// Serves one TLS connection: the handshake must end within the head read timeout (and the
/// connection may be evicted to make room meanwhile, as one that has sent no head), then the
/// request is served as on a plain connection.
async fn serve_tls(stream: tokio::net::TcpStream, tls: ServerTls, config: ConnConfig, slot: Slot) {
    slot.wait_for_head();
    let handshake = tokio::time::timeout(config.head_read_timeout, tls.acceptor.accept(stream));
    let stream = tokio::select! {
        done = handshake => match done {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => {
                tracing::debug!(%error, "API TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!("API TLS handshake timed out");
                return;
            }
        },
        () = slot.evicted() => return,
        () = config.shutdown.cancelled() => return,
    };
    serve_connection(stream, config, slot).await;
}

/// Serves one connection (one request) until it is answered, the client closes it, it misses
/// the head read timeout, or it is evicted before sending its head; once `shutdown` is
/// cancelled, until its request in flight is answered.
async fn serve_connection<S>(stream: S, config: ConnConfig, slot: Slot)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let ConnConfig {
        router,
        shutdown,
        head_read_timeout,
    } = config;
    let slot = Arc::new(slot);
    let service = {
        let slot = Arc::clone(&slot);
        hyper::service::service_fn(move |req: Request<Incoming>| {
            let admitted = slot.admit();
            let router = router.clone();
            async move {
                if !admitted {
                    return Ok::<Response, Infallible>(super::slots::evicted());
                }
                tower::ServiceExt::oneshot(router, req).await
            }
        })
    };
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(head_read_timeout)
        .keep_alive(false);
    // Upgrades are served (the exec route): the connection then hands its stream over.
    let conn = builder
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    let mut conn = std::pin::pin!(conn);
    // One poll first: a head already sent is read and admitted now, so only a connection that
    // was read and found without one can be evicted.
    let result = match futures::poll!(conn.as_mut()) {
        Poll::Ready(result) => result,
        Poll::Pending => {
            slot.wait_for_head();
            tokio::select! {
                result = conn.as_mut() => result,
                () = slot.evicted() => return,
                () = shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            }
        }
    };
    if let Err(error) = result {
        tracing::debug!(%error, "API connection ended with an error");
    }
}
