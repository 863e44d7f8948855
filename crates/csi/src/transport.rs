//! The gRPC transport to one plugin socket: a single HTTP/2 connection, made on first use and
//! made again once it closes.
//!
//! It is what [`crate::CsiClient`] sends on, and the generated stubs accept it too. Unlike
//! tonic's `Channel` it has no request queue, worker task or timeout layer of its own: the
//! caller's task puts a call's frames straight onto the connection (headers and the whole
//! message in one write), a task per connection reads and writes the socket, and the caller's
//! own deadline is the only timer. With a thousand plugins probed every second that is most of
//! the agent's idle cost.
//!
//! CSI's calls are all unary: a request's message is read whole before it is sent.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    task::{Context, Poll, ready},
};

use bytes::{Bytes, BytesMut};
use h2::{RecvStream, client::SendRequest};
use http_body::Frame;
use http_body_util::BodyExt as _;
use tokio::net::UnixStream;
use tonic::{
    Status,
    body::Body,
    codegen::http::{HeaderMap, Request, Response, Uri, uri},
};
use tracing::debug;

use crate::endpoint::Endpoint;

/// The authority every request carries. Over a unix socket there is no host to name; this
/// is the one other gRPC clients send there.
const AUTHORITY: &str = "localhost";

/// A cheaply cloned handle on one plugin socket's connection. Creating one never touches the
/// socket; clones share the connection.
#[derive(Clone)]
pub struct PluginChannel {
    shared: Arc<Shared>,
}

struct Shared {
    endpoint: Endpoint,
    /// The current connection, if any. Held only to clone or replace it, never across an
    /// await.
    current: Mutex<Option<Connection>>,
    /// Held while connecting, so that calls arriving meanwhile share the new connection
    /// instead of each opening one.
    connecting: tokio::sync::Mutex<()>,
    /// Connections opened so far.
    opened: AtomicU64,
}

#[derive(Clone)]
struct Connection {
    sender: SendRequest<Bytes>,
    /// Set by the connection's task when the connection has ended.
    closed: Arc<AtomicBool>,
}

impl Connection {
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

impl fmt::Debug for PluginChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PluginChannel")
            .field("endpoint", &self.shared.endpoint)
            .finish_non_exhaustive()
    }
}

impl PluginChannel {
    /// A channel to `endpoint`; nothing connects until the first call.
    pub fn new(endpoint: Endpoint) -> Self {
        Self {
            shared: Arc::new(Shared {
                endpoint,
                current: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
                opened: AtomicU64::new(0),
            }),
        }
    }

    /// The socket this channel talks to.
    pub fn endpoint(&self) -> &Endpoint {
        &self.shared.endpoint
    }

    /// How many connections this channel has opened. A change means the last one ended (the
    /// plugin may have restarted) and a call opened another.
    pub fn connections(&self) -> u64 {
        self.shared.opened.load(Ordering::Acquire)
    }

    /// Sends one request and waits for the answer's headers.
    ///
    /// A request that found its connection gone before any of it was sent is sent once more
    /// on a new connection: the plugin has not seen it, so this cannot run anything twice.
    async fn send(self, request: Request<Body>) -> Result<Response<H2Body>, Status> {
        let (parts, body) = request.into_parts();
        let message = read_whole(body).await?;
        let uri = with_authority(parts.uri)?;
        let head = || {
            let mut head = Request::new(());
            *head.method_mut() = parts.method.clone();
            *head.uri_mut() = uri.clone();
            *head.headers_mut() = parts.headers.clone();
            head
        };
        let connection = self.shared.connection().await?;
        let response = match start(&connection, head(), message.clone()).await {
            Ok(response) => response,
            Err(e) if connection.is_closed() || e.is_go_away() || e.is_io() => {
                debug!(endpoint = %self.shared.endpoint, "connection closed; reconnecting");
                let connection = self.shared.connection().await?;
                start(&connection, head(), message).await.map_err(status)?
            }
            Err(e) => return Err(status(e)),
        };
        let response = response.await.map_err(status)?;
        Ok(response.map(|recv| H2Body {
            recv,
            state: BodyState::Data,
        }))
    }
}

/// Opens a stream on `connection` and queues the request's headers and message on it, to go
/// out in one write. Fails without sending anything when the connection cannot take a stream.
async fn start(
    connection: &Connection,
    head: Request<()>,
    message: Bytes,
) -> Result<h2::client::ResponseFuture, h2::Error> {
    let mut sender = connection.sender.clone().ready().await?;
    let empty = message.is_empty();
    let (response, mut stream) = sender.send_request(head, empty)?;
    if !empty {
        stream.send_data(message, true)?;
    }
    Ok(response)
}

impl Shared {
    /// The open connection, connecting first if there is none.
    async fn connection(&self) -> Result<Connection, Status> {
        if let Some(c) = self.open() {
            return Ok(c);
        }
        let _connecting = self.connecting.lock().await;
        if let Some(c) = self.open() {
            return Ok(c);
        }
        let c = self.connect().await?;
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(c.clone());
        Ok(c)
    }

    /// The current connection, unless there is none or it has ended.
    fn open(&self) -> Option<Connection> {
        let current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        current.as_ref().filter(|c| !c.is_closed()).cloned()
    }

    /// Opens the socket and runs the HTTP/2 handshake. The connection is driven by a task of
    /// its own that ends when either side closes it, or once every handle on it is dropped.
    async fn connect(&self) -> Result<Connection, Status> {
        let stream = UnixStream::connect(self.endpoint.path())
            .await
            .map_err(|e| {
                let e = self.endpoint.classify(e);
                let mut status = Status::unavailable(e.to_string());
                status.set_source(Arc::new(e));
                status
            })?;
        let (sender, connection) = h2::client::handshake(stream).await.map_err(status)?;
        self.opened.fetch_add(1, Ordering::AcqRel);
        let closed = Arc::new(AtomicBool::new(false));
        let ended = Arc::clone(&closed);
        let endpoint = self.endpoint.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                debug!(%endpoint, error = %e, "plugin connection ended");
            }
            ended.store(true, Ordering::Release);
        });
        Ok(Connection { sender, closed })
    }
}

/// Reads a request body to its end: the one message of a unary call.
async fn read_whole(mut body: Body) -> Result<Bytes, Status> {
    let mut first: Option<Bytes> = None;
    let mut rest: Option<BytesMut> = None;
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        match (&mut first, &mut rest) {
            (None, _) => first = Some(data),
            (Some(f), None) => {
                let mut joined = BytesMut::from(&f[..]);
                joined.extend_from_slice(&data);
                rest = Some(joined);
            }
            (Some(_), Some(r)) => r.extend_from_slice(&data),
        }
    }
    Ok(match (first, rest) {
        (_, Some(r)) => r.freeze(),
        (Some(f), None) => f,
        (None, None) => Bytes::new(),
    })
}

/// Gives a request from a generated stub (which carries only a path) the scheme and authority
/// HTTP/2 requires.
fn with_authority(uri: Uri) -> Result<Uri, Status> {
    let mut parts = uri.into_parts();
    if parts.scheme.is_none() {
        parts.scheme = Some(uri::Scheme::HTTP);
    }
    if parts.authority.is_none() {
        parts.authority = Some(uri::Authority::from_static(AUTHORITY));
    }
    Uri::from_parts(parts)
        .map_err(|e| Status::internal(format!("request path is not a valid URI: {e}")))
}

/// The status of a call the connection failed, with tonic's codes for HTTP/2 errors (a reset
/// stream carries its reason's code).
fn status(e: h2::Error) -> Status {
    Status::from_error(Box::new(e))
}

/// An answer's body: its data frames, then its trailers (where gRPC puts the status).
pub struct H2Body {
    recv: RecvStream,
    state: BodyState,
}

enum BodyState {
    Data,
    Trailers,
    Done,
}

impl fmt::Debug for H2Body {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("H2Body").finish_non_exhaustive()
    }
}

impl http_body::Body for H2Body {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let this = &mut *self;
        if let BodyState::Data = this.state {
            match ready!(this.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    // Read, so the plugin may send more; an error here is the stream's and
                    // surfaces on the next poll.
                    let _ = this.recv.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(e)) => {
                    this.state = BodyState::Done;
                    return Poll::Ready(Some(Err(e)));
                }
                None => this.state = BodyState::Trailers,
            }
        }
        if let BodyState::Trailers = this.state {
            let trailers: Option<HeaderMap> = match ready!(this.recv.poll_trailers(cx)) {
                Ok(t) => t,
                Err(e) => {
                    this.state = BodyState::Done;
                    return Poll::Ready(Some(Err(e)));
                }
            };
            this.state = BodyState::Done;
            return Poll::Ready(trailers.map(|t| Ok(Frame::trailers(t))));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, BodyState::Done) || self.recv.is_end_stream()
    }
}

impl tower::Service<Request<Body>> for PluginChannel {
    type Response = Response<H2Body>;
    type Error = Status;
    type Future = Pin<Box<dyn Future<Output = Result<Response<H2Body>, Status>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        // Readiness is the connection's, and a call makes one when there is none.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        Box::pin(self.clone().send(request))
    }
}
