//! A client for the agent's API (HTTP/1.1 over the unix socket, loopback TCP or HTTPS), one
//! connection per call. Errors name the agent's address. With a token
//! ([`Client::with_token`]) every request, event streams included, carries it in
//! [`crate::acl::TOKEN_HEADER`]; no `Debug` output or error shows it.

mod acl;
mod address;
mod allocs;
mod events;
mod jobs;
mod tls;
mod volumes;

use std::{fmt, io, time::Duration};

use berth_csi::Rpc;

use http_body_util::{BodyExt as _, Full};
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
    client::conn::http1::{self, SendRequest},
    header,
};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpStream, UnixStream},
    task::JoinHandle,
};

pub use address::{Address, InvalidAddress};
pub(crate) use allocs::encode_component;
pub use allocs::{ExecFrames, ExecInput, ExecStream, LogBytes};
pub use events::{EventStream, LineStream, MAX_EVENT_LINE, StreamReader};
pub use tls::TrustError;

use crate::{
    acl::SecretId,
    types::{ErrorBody, NodeStatus, PluginList, PluginStatus, RegisterRequest},
};

/// How long a call may take, connecting included, unless set with [`Client::with_timeout`].
/// For [`Client::events`] it bounds the wait for the response head only.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The CSI calls the agent makes one after another, each retried up to its overall deadline in
/// berth_csi's retry table ([`Rpc::policy`]), for one call of this client: a claim
/// (controller publish, node stage, node publish), a release (the same undone), an expand
/// (controller, then node), a create, a register (validation), a delete, a snapshot, a snapshot
/// list. The agent answers with its own error once the last of them gives up.
pub const AGENT_RPC_CHAINS: &[&[Rpc]] = &[
    &[
        Rpc::ControllerPublishVolume,
        Rpc::NodeStageVolume,
        Rpc::NodePublishVolume,
    ],
    &[
        Rpc::NodeUnpublishVolume,
        Rpc::NodeUnstageVolume,
        Rpc::ControllerUnpublishVolume,
    ],
    &[Rpc::ControllerExpandVolume, Rpc::NodeExpandVolume],
    &[Rpc::CreateVolume],
    &[Rpc::ValidateVolumeCapabilities],
    &[Rpc::DeleteVolume],
    &[Rpc::CreateSnapshot],
    &[Rpc::DeleteSnapshot],
    &[Rpc::ListSnapshots],
];

/// What [`CHANGE_TIMEOUT`] adds to the longest chain of [`AGENT_RPC_CHAINS`]: the agent's own
/// waits (up to 30 s for a node plugin to turn healthy), its store writes, and the exchange.
pub const CHANGE_TIMEOUT_MARGIN: Duration = Duration::from_secs(60);

/// How long a change may take (volume claims, releases, creates, deletes, expands, snapshots,
/// snapshot lists, detaches; job runs and stops), unless set with
/// [`Client::with_change_timeout`]: the longest chain of [`AGENT_RPC_CHAINS`] plus
/// [`CHANGE_TIMEOUT_MARGIN`], so the agent's own error (a plugin that gave up, a deadline it
/// hit) reaches the user before this client gives up waiting.
///
/// A call that waits on more than one chain (a detach or forced deregister releasing several
/// claims, a change queued behind another change of the same volume, a paged snapshot list)
/// can take longer: give it more with [`Client::with_change_timeout`].
pub const CHANGE_TIMEOUT: Duration =
    longest_chain(AGENT_RPC_CHAINS).saturating_add(CHANGE_TIMEOUT_MARGIN);

/// The longest sum of overall deadlines among `chains`.
const fn longest_chain(chains: &[&[Rpc]]) -> Duration {
    let mut longest = Duration::ZERO;
    let mut i = 0;
    while i < chains.len() {
        let chain = chains[i];
        let mut sum = Duration::ZERO;
        let mut j = 0;
        while j < chain.len() {
            sum = sum.saturating_add(chain[j].policy().overall_timeout);
            j += 1;
        }
        if sum.as_nanos() > longest.as_nanos() {
            longest = sum;
        }
        i += 1;
    }
    longest
}

/// How many bytes of a non-JSON error body an error repeats.
const SHOWN_BODY: usize = 200;

/// Why a call failed. Every variant but [`ClientError::InvalidAddress`] names the agent's
/// address (in [`Address`]'s display form).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The address cannot be parsed.
    #[error(transparent)]
    InvalidAddress(#[from] InvalidAddress),
    /// Nothing answers at the address.
    #[error("cannot reach the agent at {address}: {failure}")]
    Connect {
        /// The agent's address.
        address: String,
        /// What went wrong.
        failure: ConnectFailure,
    },
    /// The connection failed during the call.
    #[error("talking to the agent at {address} failed during {method} {path}")]
    Http {
        /// The agent's address.
        address: String,
        /// The request method.
        method: Method,
        /// The request path.
        path: String,
        /// Why.
        #[source]
        source: hyper::Error,
    },
    /// No answer within the timeout.
    #[error("the agent at {address} did not answer {method} {path} within {timeout:?}")]
    Timeout {
        /// The agent's address.
        address: String,
        /// The request method.
        method: Method,
        /// The request path.
        path: String,
        /// The timeout.
        timeout: Duration,
    },
    /// The agent answered with an error status. Displays as the agent's message alone for a
    /// 4xx (it names what is wrong, e.g. `no plugin "x"`), with the status for a 5xx.
    #[error("{}", api_message(*status, method, path, message))]
    Api {
        /// The agent's address.
        address: String,
        /// The request method.
        method: Method,
        /// The request path.
        path: String,
        /// The HTTP status.
        status: u16,
        /// The agent's `error` text (or the start of the body when it was not an error
        /// document).
        message: String,
    },
    /// The answer is not the expected document.
    #[error("the agent at {address} sent an unreadable answer to {method} {path}")]
    Decode {
        /// The agent's address.
        address: String,
        /// The request method.
        method: Method,
        /// The request path.
        path: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// A request body cannot be encoded.
    #[error("cannot encode the body of {method} {path}")]
    Encode {
        /// The request method.
        method: Method,
        /// The request path.
        path: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// A request cannot be built (e.g. a path that is not a valid URI).
    #[error("cannot build the request {method} {path}")]
    BuildRequest {
        /// The request method.
        method: Method,
        /// The request path.
        path: String,
        /// Why.
        #[source]
        source: hyper::http::Error,
    },
    /// The CA file (or the system's roots) cannot be used.
    #[error(transparent)]
    Trust(#[from] TrustError),
    /// The TLS handshake with the agent failed (e.g. its certificate is not trusted or not
    /// valid for the host).
    #[error("TLS with the agent at {address} failed: {source}")]
    Tls {
        /// The agent's address.
        address: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A log or exec stream broke (or the exec route did not switch protocols).
    #[error("the stream of {path} from the agent at {address} broke")]
    Stream {
        /// The agent's address.
        address: String,
        /// The request path.
        path: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The event stream broke its line format.
    #[error("the event stream from the agent at {address} is broken: {reason}")]
    EventStream {
        /// The agent's address.
        address: String,
        /// What is wrong.
        reason: String,
    },
}

impl ClientError {
    /// The HTTP status, when the agent answered with an error.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Whether the agent answered 404 (e.g. no such plugin).
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(404)
    }
}

fn api_message(status: u16, method: &Method, path: &str, message: &str) -> String {
    if (400..500).contains(&status) {
        message.to_string()
    } else {
        format!("the agent failed {method} {path} ({status}): {message}")
    }
}

/// Why a connection could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectFailure {
    /// The socket file does not exist.
    NoSocket,
    /// Nothing listens (a stale socket file, or a closed port).
    Refused,
    /// The socket is not open to this user.
    PermissionDenied,
    /// Anything else, in the system's words.
    Other(String),
}

impl ConnectFailure {
    fn from_io(e: &io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::NotFound => Self::NoSocket,
            io::ErrorKind::ConnectionRefused => Self::Refused,
            io::ErrorKind::PermissionDenied => Self::PermissionDenied,
            _ => Self::Other(e.to_string()),
        }
    }
}

impl fmt::Display for ConnectFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoSocket => f.write_str("socket does not exist (is `berth agent` running?)"),
            Self::Refused => f.write_str("connection refused (is `berth agent` running?)"),
            Self::PermissionDenied => f.write_str(
                "permission denied (the API socket is open to the agent's user, and to \
                     the members of api.socket_group when the agent sets one)",
            ),
            Self::Other(e) => f.write_str(e),
        }
    }
}

/// A client of one agent. Cheap to clone; holds no connection between calls. Its `Debug`
/// hides the token.
#[derive(Debug, Clone)]
pub struct Client {
    address: Address,
    name: String,
    timeout: Duration,
    change_timeout: Duration,
    token: Option<SecretId>,
    tls: Option<tls::ClientTls>,
}

/// The task driving one client connection; aborted when dropped, so nothing outlives a call.
#[derive(Debug)]
struct ConnTask(JoinHandle<()>);

impl Drop for ConnTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Client {
    /// A client for `address` (see [`Address::parse`]). Does not connect: an agent that is not
    /// running is reported by the first call.
    pub fn new(address: &str) -> Result<Self, ClientError> {
        Ok(Self::for_address(Address::parse(address)?))
    }

    /// A client for a parsed address.
    pub fn for_address(address: Address) -> Self {
        Self {
            name: address.to_string(),
            address,
            timeout: REQUEST_TIMEOUT,
            change_timeout: CHANGE_TIMEOUT,
            token: None,
            tls: None,
        }
    }

    /// Sends `token` (an ACL token's secret id) with every request.
    pub fn with_token(mut self, token: SecretId) -> Self {
        self.token = Some(token);
        self
    }

    /// Trusts the CA certificates of the PEM file `ca_file` (and no other) for an `https://`
    /// address; without it, the system's roots are trusted.
    pub fn with_ca_cert(mut self, ca_file: &std::path::Path) -> Result<Self, ClientError> {
        self.tls = Some(tls::ClientTls::with_ca_file(ca_file)?);
        Ok(self)
    }

    /// Sets the timeout of reads and plugin registration calls (default [`REQUEST_TIMEOUT`]).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the timeout of volume changes, snapshot lists, and job runs and stops (default
    /// [`CHANGE_TIMEOUT`]).
    pub fn with_change_timeout(mut self, timeout: Duration) -> Self {
        self.change_timeout = timeout;
        self
    }

    /// The agent's address.
    pub fn address(&self) -> &Address {
        &self.address
    }

    /// `GET /v1/plugins`: every plugin, by id.
    pub async fn plugins(&self) -> Result<PluginList, ClientError> {
        self.call_json(Method::GET, "/v1/plugins".into(), None)
            .await
    }

    /// `GET /v1/plugin/csi/{id}`; a plugin that does not exist is an [`ClientError::Api`] with
    /// status 404 (see [`ClientError::is_not_found`]).
    pub async fn plugin(&self, id: &str) -> Result<PluginStatus, ClientError> {
        let path = format!("/v1/plugin/csi/{}", encode_segment(id));
        self.call_json(Method::GET, path, None).await
    }

    /// `GET /v1/node`.
    pub async fn node(&self) -> Result<NodeStatus, ClientError> {
        self.call_json(Method::GET, "/v1/node".into(), None).await
    }

    /// `GET /v1/nodes`: every node of the fleet (this node alone without one).
    pub async fn nodes(&self) -> Result<crate::nodes::NodeList, ClientError> {
        self.call_json(Method::GET, "/v1/nodes".into(), None).await
    }

    /// `GET /v1/nodes/{id}`: one node, by id or unique id prefix.
    pub async fn fleet_node(&self, id: &str) -> Result<crate::nodes::FleetNode, ClientError> {
        self.call_json(
            Method::GET,
            format!("/v1/nodes/{}", encode_segment(id)),
            None,
        )
        .await
    }

    /// `POST /v1/nodes/{id}/drain`.
    pub async fn drain_node(
        &self,
        id: &str,
        enable: bool,
    ) -> Result<crate::nodes::FleetNode, ClientError> {
        let path = format!("/v1/nodes/{}/drain", encode_segment(id));
        let body = encode(&Method::POST, &path, &crate::nodes::DrainRequest { enable })?;
        self.call_json(Method::POST, path, Some(body)).await
    }

    /// `POST /v1/plugins`: registers one plugin instance and returns the plugin's status.
    pub async fn register(&self, req: &RegisterRequest) -> Result<PluginStatus, ClientError> {
        let path = "/v1/plugins".to_string();
        let body = encode(&Method::POST, &path, req)?;
        self.call_json(Method::POST, path, Some(body)).await
    }

    /// `DELETE /v1/plugin/csi/{id}/instances/{instance}`.
    pub async fn deregister(&self, id: &str, instance: &str) -> Result<(), ClientError> {
        let path = format!(
            "/v1/plugin/csi/{}/instances/{}",
            encode_segment(id),
            encode_segment(instance)
        );
        self.call(Method::DELETE, path, None).await.map(drop)
    }

    /// `GET /v1/metrics`: the Prometheus text.
    pub async fn metrics(&self) -> Result<String, ClientError> {
        let path = "/v1/metrics".to_string();
        let body = self.call(Method::GET, path, None).await?;
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    /// `GET /.well-known/jwks.json`: the public keys of the agent's workload identities, as
    /// the JSON text served (what a Consul auth method's `JWKSURL` fetches).
    pub async fn jwks(&self) -> Result<String, ClientError> {
        let path = crate::JWKS_PATH.to_string();
        let body = self.call(Method::GET, path, None).await?;
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    /// `GET /v1/events`: events from the moment this returns on (the agent has subscribed by
    /// then), in order, with a [`crate::EventLine::Lagged`] line wherever this reader fell
    /// behind and lost events.
    pub async fn events(&self) -> Result<EventStream, ClientError> {
        let path = "/v1/events".to_string();
        let (response, conn) = self
            .timed(
                self.timeout,
                &Method::GET,
                &path,
                self.send(Method::GET, &path, None),
            )
            .await?;
        let response = self.check_status(&Method::GET, &path, response).await?;
        Ok(EventStream::new(
            self.name.clone(),
            path,
            None,
            response.into_body(),
            conn,
        ))
    }

    /// `GET /v1/event/stream`: the events `filter` passes, after index `after` (those the
    /// agent's window still holds, then live ones), or from the moment this returns when
    /// `after` is `None`; a heartbeat line every `heartbeat` while idle.
    pub async fn event_stream(
        &self,
        filter: &crate::stream::TopicFilter,
        after: Option<u64>,
        heartbeat: Option<Duration>,
    ) -> Result<events::StreamReader, ClientError> {
        let mut query: Vec<String> = filter
            .terms()
            .iter()
            .map(|t| format!("topic={}", encode_segment(t)))
            .collect();
        if let Some(i) = after {
            query.push(format!("index={i}"));
        }
        if let Some(h) = heartbeat {
            query.push(format!("heartbeat={}ms", h.as_millis().max(1)));
        }
        let mut path = "/v1/event/stream".to_string();
        if !query.is_empty() {
            path = format!("{path}?{}", query.join("&"));
        }
        let (response, conn) = self
            .timed(
                self.timeout,
                &Method::GET,
                &path,
                self.send(Method::GET, &path, None),
            )
            .await?;
        let response = self.check_status(&Method::GET, &path, response).await?;
        let index = index_header(&response);
        Ok(events::StreamReader::new(
            self.name.clone(),
            path,
            index,
            response.into_body(),
            conn,
        ))
    }

    /// One call within the read timeout: the successful answer's body, or the error.
    async fn call(
        &self,
        method: Method,
        path: String,
        body: Option<Vec<u8>>,
    ) -> Result<Bytes, ClientError> {
        self.call_within(self.timeout, method, path, body).await
    }

    /// One call within `timeout`.
    async fn call_within(
        &self,
        timeout: Duration,
        method: Method,
        path: String,
        body: Option<Vec<u8>>,
    ) -> Result<Bytes, ClientError> {
        let exchange = async {
            let (response, _conn) = self.send(method.clone(), &path, body).await?;
            let response = self.check_status(&method, &path, response).await?;
            self.collect(&method, &path, response).await
        };
        self.timed(timeout, &method, &path, exchange).await
    }

    async fn call_json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: String,
        body: Option<Vec<u8>>,
    ) -> Result<T, ClientError> {
        self.call_json_within(self.timeout, method, path, body)
            .await
    }

    async fn call_json_within<T: DeserializeOwned>(
        &self,
        timeout: Duration,
        method: Method,
        path: String,
        body: Option<Vec<u8>>,
    ) -> Result<T, ClientError> {
        let bytes = self
            .call_within(timeout, method.clone(), path.clone(), body)
            .await?;
        serde_json::from_slice(&bytes).map_err(|source| ClientError::Decode {
            address: self.name.clone(),
            method,
            path,
            source,
        })
    }

    async fn timed<T>(
        &self,
        timeout: Duration,
        method: &Method,
        path: &str,
        fut: impl Future<Output = Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        tokio::time::timeout(timeout, fut)
            .await
            .map_err(|_| ClientError::Timeout {
                address: self.name.clone(),
                method: method.clone(),
                path: path.to_string(),
                timeout,
            })?
    }

    /// Connects and sends one request; the response body is read through the returned
    /// connection task, which must be kept until then.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(Response<Incoming>, ConnTask), ClientError> {
        let (stream, host) = self.connect().await?;
        let (mut sender, conn) = self.handshake(stream, &method, path).await?;
        let mut request = self.request_head(&method, path, &host)?;
        if body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|source| ClientError::BuildRequest {
                method: method.clone(),
                path: path.to_string(),
                source,
            })?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|source| self.http_error(&method, path, source))?;
        Ok((response, conn))
    }

    /// Connects to the agent (TLS included): the stream and the `Host` to send.
    pub(super) async fn connect(&self) -> Result<(Box<dyn Io>, String), ClientError> {
        let connect_error = |e: io::Error| ClientError::Connect {
            address: self.name.clone(),
            failure: ConnectFailure::from_io(&e),
        };
        Ok(match &self.address {
            Address::Unix(socket) => (
                Box::new(UnixStream::connect(socket).await.map_err(connect_error)?),
                "localhost".into(),
            ),
            Address::Tcp(addr) => {
                let stream = TcpStream::connect(addr).await.map_err(connect_error)?;
                let _ = stream.set_nodelay(true);
                (Box::new(stream), addr.to_string())
            }
            Address::Https { host, port } => {
                let tls = match &self.tls {
                    Some(tls) => tls.clone(),
                    None => tls::ClientTls::system()?,
                };
                let stream = TcpStream::connect((host.as_str(), *port))
                    .await
                    .map_err(connect_error)?;
                let _ = stream.set_nodelay(true);
                let stream =
                    tls.connect(host, stream)
                        .await
                        .map_err(|source| ClientError::Tls {
                            address: self.name.clone(),
                            source,
                        })?;
                let authority = self.name.strip_prefix("https://").unwrap_or(&self.name);
                (Box::new(stream), authority.to_string())
            }
        })
    }

    /// A request's method, path, `Host`, `User-Agent` and, with a token, the token header
    /// (marked sensitive).
    pub(super) fn request_head(
        &self,
        method: &Method,
        path: &str,
        host: &str,
    ) -> Result<hyper::http::request::Builder, ClientError> {
        let mut request = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(header::HOST, host)
            .header(
                header::USER_AGENT,
                concat!("berth/", env!("CARGO_PKG_VERSION")),
            );
        if let Some(token) = &self.token {
            let mut value = header::HeaderValue::from_str(token.expose()).map_err(|e| {
                ClientError::BuildRequest {
                    method: method.clone(),
                    path: path.to_string(),
                    source: e.into(),
                }
            })?;
            value.set_sensitive(true);
            request = request.header(crate::acl::TOKEN_HEADER, value);
        }
        Ok(request)
    }

    async fn handshake<S>(
        &self,
        stream: S,
        method: &Method,
        path: &str,
    ) -> Result<(SendRequest<Full<Bytes>>, ConnTask), ClientError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, conn) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|source| self.http_error(method, path, source))?;
        let task = tokio::spawn(async move {
            if let Err(error) = conn.await {
                tracing::debug!(%error, "agent API connection ended with an error");
            }
        });
        Ok((sender, ConnTask(task)))
    }

    /// Passes a success through; turns an error status into [`ClientError::Api`].
    async fn check_status(
        &self,
        method: &Method,
        path: &str,
        response: Response<Incoming>,
    ) -> Result<Response<Incoming>, ClientError> {
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = self.collect(method, path, response).await?;
        let message = match serde_json::from_slice::<ErrorBody>(&body) {
            Ok(ErrorBody { error }) => error,
            Err(_) if body.is_empty() => reason(status),
            Err(_) => {
                let text = String::from_utf8_lossy(&body);
                text.chars()
                    .take(SHOWN_BODY)
                    .collect::<String>()
                    .trim()
                    .to_string()
            }
        };
        Err(ClientError::Api {
            address: self.name.clone(),
            method: method.clone(),
            path: path.to_string(),
            status: status.as_u16(),
            message,
        })
    }

    async fn collect(
        &self,
        method: &Method,
        path: &str,
        response: Response<Incoming>,
    ) -> Result<Bytes, ClientError> {
        response
            .into_body()
            .collect()
            .await
            .map(|collected| collected.to_bytes())
            .map_err(|source| self.http_error(method, path, source))
    }

    fn http_error(&self, method: &Method, path: &str, source: hyper::Error) -> ClientError {
        ClientError::Http {
            address: self.name.clone(),
            method: method.clone(),
            path: path.to_string(),
            source,
        }
    }
}

fn reason(status: StatusCode) -> String {
    status
        .canonical_reason()
        .map_or_else(|| status.to_string(), str::to_string)
}

/// A request body as JSON.
fn encode<T: serde::Serialize>(
    method: &Method,
    path: &str,
    body: &T,
) -> Result<Vec<u8>, ClientError> {
    serde_json::to_vec(body).map_err(|source| ClientError::Encode {
        method: method.clone(),
        path: path.to_string(),
        source,
    })
}

/// A connection to the agent, whatever its transport.
pub(super) trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// The `x-berth-index` header of `response`, when it has a number.
fn index_header<B>(response: &Response<B>) -> Option<u64> {
    response
        .headers()
        .get(crate::INDEX_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// Percent-encodes one path segment (or query value): everything but RFC 3986's unreserved
/// characters, and the dots of `.` and `..` too, so that no hop can read them as a relative
/// reference: the server gets the id as given and judges it.
fn encode_segment(segment: &str) -> String {
    if segment == "." || segment == ".." {
        return segment.replace('.', "%2E");
    }
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_percent_encoded() {
        assert_eq!(encode_segment("hostpath-1.x_~"), "hostpath-1.x_~");
        assert_eq!(encode_segment("a/b c?%"), "a%2Fb%20c%3F%25");
        assert_eq!(encode_segment("é"), "%C3%A9");
        assert_eq!(encode_segment(".."), "%2E%2E");
        assert_eq!(encode_segment("."), "%2E");
        assert_eq!(encode_segment("..."), "...");
        assert_eq!(encode_segment("a/../b"), "a%2F..%2Fb");
    }

    #[test]
    fn changes_outwait_every_agent_deadline() {
        for rpc in Rpc::ALL {
            assert!(
                CHANGE_TIMEOUT > rpc.policy().overall_timeout + CHANGE_TIMEOUT_MARGIN,
                "{rpc}"
            );
        }
        // Today: a claim or release is 3 × 180 s, an expand 2 × 300 s.
        assert_eq!(CHANGE_TIMEOUT, Duration::from_secs(600 + 60));
        assert!(REQUEST_TIMEOUT < CHANGE_TIMEOUT);
    }

    #[test]
    fn api_errors_show_the_agents_words() {
        let err = |status| ClientError::Api {
            address: "unix:///s".into(),
            method: Method::GET,
            path: "/v1/plugin/csi/x".into(),
            status,
            message: "no plugin \"x\"".into(),
        };
        assert_eq!(err(404).to_string(), "no plugin \"x\"");
        assert!(err(404).is_not_found());
        assert_eq!(
            err(500).to_string(),
            "the agent failed GET /v1/plugin/csi/x (500): no plugin \"x\""
        );
    }
}
