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
    time::Duration,
};

use bytes::{BufMut as _, Bytes, BytesMut};
use h2::{RecvStream, client::SendRequest};
use http_body::Frame;
use http_body_util::BodyExt as _;
use percent_encoding::percent_decode;
use tokio::net::UnixStream;
use tonic::{
    Code, Status,
    body::Body,
    codegen::http::{
        HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri, header, uri,
    },
};
use tracing::debug;

use crate::endpoint::Endpoint;

/// The header that carries a call's deadline to the plugin.
static GRPC_TIMEOUT: header::HeaderName = header::HeaderName::from_static("grpc-timeout");

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

    /// Makes one unary call of `path` (e.g. `/csi.v1.Identity/Probe`) and decodes its answer.
    /// `timeout` goes to the plugin as `grpc-timeout`; bounding the wait is the caller's.
    ///
    /// Codes: a socket that cannot be connected to is `UNAVAILABLE` (with the
    /// [`EndpointError`](crate::EndpointError) as its source); a stream the plugin reset
    /// carries its reason's code, and a connection lost mid-call is `UNKNOWN`, as tonic
    /// reports both; an answer that ends without a status is `UNKNOWN`, a malformed one
    /// `INTERNAL`.
    pub async fn unary<Req, Resp>(
        &self,
        path: &'static str,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, Status>
    where
        Req: prost::Message,
        Resp: prost::Message + Default,
    {
        let len = request.encoded_len();
        let mut message = BytesMut::with_capacity(PREFIX + len);
        message.put_u8(0);
        message.put_u32(u32::try_from(len).map_err(|_| {
            Status::resource_exhausted(format!("request of {len} bytes is too large to send"))
        })?);
        // Cannot fail: the buffer has room for the whole message.
        request
            .encode(&mut message)
            .map_err(|e| Status::internal(format!("encoding the request: {e}")))?;
        let uri = path_uri(path)?;
        let timeout = grpc_timeout(timeout);
        let head = || {
            let mut head = Request::new(());
            *head.method_mut() = Method::POST;
            *head.uri_mut() = uri.clone();
            let h = head.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            );
            h.insert(header::TE, HeaderValue::from_static("trailers"));
            h.insert(&GRPC_TIMEOUT, timeout.clone());
            head
        };
        let response = self.exchange(head, message.freeze()).await?;
        let (parts, recv) = response.into_parts();
        if let Some(status) = status_of(&parts.headers) {
            // Trailers-only: the status came with the headers, and no message.
            return Err(status.err().unwrap_or_else(|| {
                Status::internal("the answer carries no message (trailers only)")
            }));
        }
        if parts.status != StatusCode::OK {
            return Err(http_status(parts.status));
        }
        let mut body = H2Body {
            recv,
            state: BodyState::Data,
        };
        let mut data = BytesMut::new();
        let mut trailers = None;
        while let Some(frame) = body.frame().await {
            match frame.map_err(status)?.into_data() {
                Ok(chunk) => {
                    if data.len() + chunk.len() > PREFIX + MAX_MESSAGE {
                        return Err(Status::resource_exhausted(format!(
                            "the answer is larger than {MAX_MESSAGE} bytes"
                        )));
                    }
                    data.extend_from_slice(&chunk);
                }
                Err(frame) => trailers = frame.into_trailers().ok(),
            }
        }
        match trailers.as_ref().and_then(status_of) {
            Some(Ok(())) => decode(&data),
            Some(Err(status)) => Err(status),
            None => Err(Status::unknown(
                "the answer ended without a grpc-status (the plugin may have stopped)",
            )),
        }
    }

    /// Sends one request and waits for the answer's headers.
    ///
    /// A request that found its connection gone before any of it was sent is sent once more
    /// on a new connection: the plugin has not seen it, so this cannot run anything twice.
    async fn exchange(
        &self,
        head: impl Fn() -> Request<()>,
        message: Bytes,
    ) -> Result<Response<RecvStream>, Status> {
        let mut connection = self.shared.connection().await?;
        let response = match start(&mut connection, head(), message.clone()).await {
            Ok(response) => response,
            Err(e) if connection.is_closed() || e.is_go_away() || e.is_io() => {
                debug!(endpoint = %self.shared.endpoint, "connection closed; reconnecting");
                let mut connection = self.shared.connection().await?;
                start(&mut connection, head(), message)
                    .await
                    .map_err(status)?
            }
            Err(e) => return Err(status(e)),
        };
        response.await.map_err(status)
    }

    /// What a generated stub's request goes through.
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
        let response = self.exchange(head, message).await?;
        Ok(response.map(|recv| H2Body {
            recv,
            state: BodyState::Data,
        }))
    }
}

/// The length of gRPC's message prefix: a compression flag and a 4-byte length.
const PREFIX: usize = 5;
/// The largest answer decoded, as tonic's default.
const MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// `path` as a whole URI (no copy of the path is made).
fn path_uri(path: &'static str) -> Result<Uri, Status> {
    let uri = Uri::from_maybe_shared(Bytes::from_static(path.as_bytes()))
        .map_err(|e| Status::internal(format!("{path} is not a valid request path: {e}")))?;
    with_authority(uri)
}

/// `timeout` as gRPC writes it: at most 8 digits and a unit, rounded up.
fn grpc_timeout(timeout: Duration) -> HeaderValue {
    const MAX: u128 = 99_999_999;
    let micros = timeout.as_micros().max(1);
    let value = if micros <= MAX {
        format!("{micros}u")
    } else if micros.div_ceil(1000) <= MAX {
        format!("{}m", micros.div_ceil(1000))
    } else {
        format!("{}S", timeout.as_secs().min(MAX as u64))
    };
    HeaderValue::try_from(value).expect("digits and a letter")
}

/// The gRPC status in `headers`, if there is one: `Ok(())` for OK.
fn status_of(headers: &HeaderMap) -> Option<Result<(), Status>> {
    let code = Code::from_bytes(headers.get("grpc-status")?.as_bytes());
    if code == Code::Ok {
        return Some(Ok(()));
    }
    let message = headers
        .get("grpc-message")
        .map(|m| {
            percent_decode(m.as_bytes())
                .decode_utf8_lossy()
                .into_owned()
        })
        .unwrap_or_default();
    Some(Err(Status::new(code, message)))
}

/// The status of an answer that is not HTTP 200 and has no gRPC status, as gRPC maps them.
fn http_status(code: StatusCode) -> Status {
    let grpc = match code {
        StatusCode::BAD_REQUEST => Code::Internal,
        StatusCode::UNAUTHORIZED => Code::Unauthenticated,
        StatusCode::FORBIDDEN => Code::PermissionDenied,
        StatusCode::NOT_FOUND => Code::Unimplemented,
        StatusCode::TOO_MANY_REQUESTS
        | StatusCode::BAD_GATEWAY
        | StatusCode::SERVICE_UNAVAILABLE
        | StatusCode::GATEWAY_TIMEOUT => Code::Unavailable,
        _ => Code::Unknown,
    };
    Status::new(grpc, format!("the plugin answered HTTP {code}"))
}

/// Decodes the one message of a unary answer.
fn decode<Resp: prost::Message + Default>(data: &[u8]) -> Result<Resp, Status> {
    let Some((head, rest)) = data.split_first_chunk::<PREFIX>() else {
        return Err(Status::internal("the answer carries no message"));
    };
    if head[0] != 0 {
        // No grpc-accept-encoding was sent, so a plugin must not compress.
        return Err(Status::internal(
            "the answer is compressed, which was not offered",
        ));
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if rest.len() != len {
        return Err(Status::internal(format!(
            "the answer's message is {} bytes where its prefix says {len}",
            rest.len()
        )));
    }
    Resp::decode(rest).map_err(|e| Status::internal(format!("decoding the answer: {e}")))
}

/// Opens a stream on `connection` and queues the request's headers and message on it, to go
/// out in one write. Fails without sending anything when the connection cannot take a stream.
async fn start(
    connection: &mut Connection,
    head: Request<()>,
    message: Bytes,
) -> Result<h2::client::ResponseFuture, h2::Error> {
    let sender = &mut connection.sender;
    std::future::poll_fn(|cx| sender.poll_ready(cx)).await?;
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
        // No HPACK dynamic table for the plugin's answers: a server that sends a `date` header
        // (tonic's does) puts a new entry in it every second, so each idle connection's table
        // grew to its full 4 KiB (about 12 KiB of memory) within a minute: 12 MiB for a
        // thousand plugins. Answers are a few headers on a local socket; sent literally, they
        // cost nothing that matters.
        let (sender, connection) = h2::client::Builder::new()
            .header_table_size(0)
            .handshake(stream)
            .await
            .map_err(status)?;
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
async fn read_whole(body: Body) -> Result<Bytes, Status> {
    Ok(body.collect().await?.to_bytes())
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

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;
    use crate::pb;

    #[test]
    fn deadlines_are_written_in_at_most_eight_digits_and_never_shorter() {
        let t = |d: Duration| grpc_timeout(d).to_str().expect("ascii").to_owned();
        assert_eq!(t(Duration::from_secs(2)), "2000000u");
        assert_eq!(t(Duration::ZERO), "1u");
        assert_eq!(t(Duration::from_micros(99_999_999)), "99999999u");
        // Past 8 digits of microseconds, milliseconds rounded up.
        assert_eq!(t(Duration::from_micros(100_000_001)), "100001m");
        assert_eq!(t(Duration::from_secs(200_000)), "200000S");
        assert_eq!(t(Duration::from_secs(u64::MAX)), "99999999S");
    }

    #[test]
    fn a_status_is_read_from_grpc_status_and_its_percent_encoded_message() {
        let mut h = HeaderMap::new();
        assert!(status_of(&h).is_none());
        h.insert("grpc-status", HeaderValue::from_static("0"));
        assert!(matches!(status_of(&h), Some(Ok(()))));
        h.insert("grpc-status", HeaderValue::from_static("5"));
        h.insert(
            "grpc-message",
            HeaderValue::from_static("volume %22v1%22 not found: 100%25"),
        );
        let s = status_of(&h).expect("present").expect_err("not ok");
        assert_eq!(s.code(), Code::NotFound);
        assert_eq!(s.message(), "volume \"v1\" not found: 100%");
        h.insert("grpc-status", HeaderValue::from_static("banana"));
        let s = status_of(&h).expect("present").expect_err("not ok");
        assert_eq!(s.code(), Code::Unknown);
    }

    #[test]
    fn an_answer_is_one_uncompressed_message_of_the_length_its_prefix_says() {
        let probe = pb::ProbeResponse { ready: Some(true) };
        let body = probe.encode_to_vec();
        let framed = |flag: u8, len: usize, body: &[u8]| {
            let mut v = vec![flag];
            v.extend_from_slice(&u32::try_from(len).expect("small").to_be_bytes());
            v.extend_from_slice(body);
            v
        };
        let ok: pb::ProbeResponse = decode(&framed(0, body.len(), &body)).expect("decodes");
        assert_eq!(ok, probe);
        let code = |data: &[u8]| decode::<pb::ProbeResponse>(data).expect_err("bad").code();
        assert_eq!(code(&[]), Code::Internal, "no message");
        assert_eq!(
            code(&framed(1, body.len(), &body)),
            Code::Internal,
            "compressed"
        );
        assert_eq!(
            code(&framed(0, body.len() + 1, &body)),
            Code::Internal,
            "short"
        );
        assert_eq!(
            code(&framed(0, 2, &[0xff, 0xff])),
            Code::Internal,
            "garbage"
        );
    }

    /// The client's first SETTINGS frame, read off a real socket: the plugin may not keep an
    /// HPACK dynamic table for its answers (see [`Shared::connect`]).
    #[tokio::test]
    async fn the_client_asks_for_no_header_table() {
        use tokio::io::AsyncReadExt as _;

        let tmp = tempfile::tempdir().expect("tmp");
        let path = tmp.path().join("csi.sock");
        let listener = tokio::net::UnixListener::bind(&path).expect("bind");
        let channel =
            PluginChannel::new(Endpoint::parse(path.to_str().expect("utf-8")).expect("endpoint"));
        let call = tokio::spawn(async move {
            channel
                .unary::<pb::ProbeRequest, pb::ProbeResponse>(
                    "/csi.v1.Identity/Probe",
                    &pb::ProbeRequest {},
                    Duration::from_secs(5),
                )
                .await
        });
        let (mut conn, _) = listener.accept().await.expect("accept");
        const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        let mut preface = [0u8; PREFACE.len()];
        conn.read_exact(&mut preface).await.expect("preface");
        assert_eq!(preface, PREFACE);
        // A frame header: 24-bit length, type (4: SETTINGS), flags, stream id.
        let mut frame = [0u8; 9];
        conn.read_exact(&mut frame).await.expect("frame header");
        assert_eq!(frame[3], 4, "the first frame is SETTINGS");
        let len = usize::from(frame[0]) << 16 | usize::from(frame[1]) << 8 | usize::from(frame[2]);
        let mut payload = vec![0u8; len];
        conn.read_exact(&mut payload).await.expect("settings");
        // Six bytes per setting: a 16-bit id (1: HEADER_TABLE_SIZE) and a 32-bit value.
        let table = payload
            .chunks_exact(6)
            .find(|s| s[..2] == [0, 1])
            .map(|s| u32::from_be_bytes([s[2], s[3], s[4], s[5]]));
        assert_eq!(table, Some(0), "settings sent: {payload:?}");
        drop(conn);
        call.abort();
    }

    #[test]
    fn http_errors_without_a_grpc_status_map_as_grpc_says() {
        assert_eq!(
            http_status(StatusCode::NOT_FOUND).code(),
            Code::Unimplemented
        );
        assert_eq!(
            http_status(StatusCode::SERVICE_UNAVAILABLE).code(),
            Code::Unavailable
        );
        assert_eq!(http_status(StatusCode::IM_A_TEAPOT).code(), Code::Unknown);
    }
}
