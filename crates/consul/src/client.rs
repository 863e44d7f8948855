//! The HTTP calls: login, token/self, logout.

use std::{collections::BTreeMap, fmt, pin::pin, time::Duration};

use http_body_util::{BodyExt as _, Full};
use hyper::{
    Method, Request,
    body::Bytes,
    client::conn::http1,
    header::{CONTENT_TYPE, HOST, HeaderValue, USER_AGENT},
};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use tokio::net::TcpStream;

use crate::{AclToken, ConsulConfig, ConsulError, Secret, config::Scheme, error::answer_text};

/// Bound on one call (connect, send, read the whole answer).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

const LOGIN: &str = "/v1/acl/login";
const LOGOUT: &str = "/v1/acl/logout";
const TOKEN_SELF: &str = "/v1/acl/token/self";
/// `?stale`: any server may answer, as for Nomad's preflight check; a token that answers here
/// has reached the server that answered.
const TOKEN_SELF_QUERY: &str = "/v1/acl/token/self?stale";
const TOKEN_HEADER: &str = "x-consul-token";

/// A client of one Consul agent's ACL API over plain HTTP. Cheap to clone; every call opens
/// its own connection and is bounded by [`REQUEST_TIMEOUT`].
#[derive(Clone)]
pub struct Client {
    /// `host:port`.
    authority: String,
    host_header: HeaderValue,
    agent_token: Option<Secret>,
    service_identity_auth_method: String,
    task_identity_auth_method: String,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("address", &self.authority)
            .field("agent_token", &self.agent_token)
            .field(
                "service_identity_auth_method",
                &self.service_identity_auth_method,
            )
            .field("task_identity_auth_method", &self.task_identity_auth_method)
            .finish()
    }
}

#[derive(Serialize)]
struct LoginBody<'a> {
    #[serde(rename = "AuthMethod")]
    auth_method: &'a str,
    #[serde(rename = "BearerToken")]
    bearer_token: &'a str,
    #[serde(rename = "Meta", skip_serializing_if = "BTreeMap::is_empty")]
    meta: &'a BTreeMap<String, String>,
}

impl Client {
    /// A client for `config`, once [`ConsulConfig::check`] passes. Refuses TLS (`ssl = true`
    /// or an `https://` address) with [`ConsulError::SslUnsupported`]. Connects to nothing.
    pub fn new(config: &ConsulConfig) -> Result<Self, ConsulError> {
        config.check()?;
        let endpoint = config.endpoint()?;
        if config.ssl || endpoint.scheme == Scheme::Https {
            return Err(ConsulError::SslUnsupported {
                address: config.address.clone(),
            });
        }
        let host_header = HeaderValue::from_str(&endpoint.authority)
            .expect("a checked host:port is a valid header value");
        Ok(Self {
            authority: endpoint.authority,
            host_header,
            agent_token: config.token.clone(),
            service_identity_auth_method: config.service_identity_auth_method.clone(),
            task_identity_auth_method: config.task_identity_auth_method.clone(),
        })
    }

    /// The `host:port` this client talks to.
    pub fn address(&self) -> &str {
        &self.authority
    }

    /// The agent's own token, as configured; no call of this client sends it.
    pub fn agent_token(&self) -> Option<&Secret> {
        self.agent_token.as_ref()
    }

    /// The auth method for service identities.
    pub fn service_identity_auth_method(&self) -> &str {
        &self.service_identity_auth_method
    }

    /// The auth method for task identities.
    pub fn task_identity_auth_method(&self) -> &str {
        &self.task_identity_auth_method
    }

    /// Trades `jwt` for a new ACL token through `auth_method` (`POST /v1/acl/login`); `meta`
    /// ends up in the token's description. The token may not be usable at once on every
    /// server: check it with [`Client::preflight`]. On success the caller owns the token and
    /// should [`Client::logout`] when done with it.
    pub async fn login(
        &self,
        auth_method: &str,
        jwt: &str,
        meta: BTreeMap<String, String>,
    ) -> Result<AclToken, ConsulError> {
        let body = serde_json::to_vec(&LoginBody {
            auth_method,
            bearer_token: jwt,
            meta: &meta,
        })
        .map_err(|e| decode_error("POST", LOGIN, &e, "encoding the login request"))?;
        let answer = self
            .call(Method::POST, LOGIN, LOGIN, None, Some(body))
            .await?;
        let token: AclToken = serde_json::from_slice(&answer)
            .map_err(|e| decode_error("POST", LOGIN, &e, "decoding the token"))?;
        if token.secret_id.is_empty() {
            return Err(ConsulError::Decode {
                method: "POST",
                path: LOGIN,
                problem: format!("the token {:?} has no SecretID", token.accessor_id),
            });
        }
        Ok(token)
    }

    /// Asks Consul whether `token` is usable (`GET /v1/acl/token/self`); Ok when it answers
    /// the token. A token that has not replicated yet fails with
    /// [`ConsulError::is_acl_not_found`].
    pub async fn token_self(&self, token: &AclToken) -> Result<(), ConsulError> {
        self.call(Method::GET, TOKEN_SELF, TOKEN_SELF_QUERY, Some(token), None)
            .await
            .map(drop)
    }

    /// Destroys a token made by a login (`POST /v1/acl/logout`). Ok only when Consul answers
    /// that it destroyed it; a token already gone fails with
    /// [`ConsulError::is_acl_not_found`].
    pub async fn logout(&self, token: &AclToken) -> Result<(), ConsulError> {
        self.call(Method::POST, LOGOUT, LOGOUT, Some(token), None)
            .await
            .map(drop)
    }

    /// One request on a connection of its own, bounded by [`REQUEST_TIMEOUT`]: the body of a
    /// 2xx answer, or the error.
    async fn call(
        &self,
        method: Method,
        path: &'static str,
        path_and_query: &str,
        token: Option<&AclToken>,
        body: Option<Vec<u8>>,
    ) -> Result<Bytes, ConsulError> {
        let method_name = method_name(&method);
        let request = self.request(method, path, path_and_query, token, body)?;
        match tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(method_name, path, request)).await
        {
            Ok(result) => result,
            Err(_elapsed) => Err(ConsulError::Timeout {
                method: method_name,
                path,
                address: self.authority.clone(),
                timeout: REQUEST_TIMEOUT,
            }),
        }
    }

    fn request(
        &self,
        method: Method,
        path: &'static str,
        path_and_query: &str,
        token: Option<&AclToken>,
        body: Option<Vec<u8>>,
    ) -> Result<Request<Full<Bytes>>, ConsulError> {
        let method_name = method_name(&method);
        let has_body = body.is_some();
        let mut request = Request::builder()
            .method(method)
            .uri(path_and_query)
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .expect("a fixed path and method make a valid request");
        let headers = request.headers_mut();
        headers.insert(HOST, self.host_header.clone());
        headers.insert(USER_AGENT, HeaderValue::from_static("berth"));
        if has_body {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        if let Some(token) = token {
            let mut value = HeaderValue::from_str(token.secret_id.expose()).map_err(|_| {
                ConsulError::UnsendableToken {
                    method: method_name,
                    path,
                    accessor_id: token.accessor_id.clone(),
                }
            })?;
            value.set_sensitive(true);
            headers.insert(TOKEN_HEADER, value);
        }
        Ok(request)
    }

    async fn exchange(
        &self,
        method: &'static str,
        path: &'static str,
        request: Request<Full<Bytes>>,
    ) -> Result<Bytes, ConsulError> {
        let transport = |source| ConsulError::Transport {
            method,
            path,
            address: self.authority.clone(),
            source,
        };
        let stream = TcpStream::connect(&self.authority)
            .await
            .map_err(|source| ConsulError::Connect {
                method,
                path,
                address: self.authority.clone(),
                source,
            })?;
        let (mut sender, conn) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(transport)?;
        let answer = async {
            let response = sender.send_request(request).await?;
            let status = response.status();
            let body = response.into_body().collect().await?.to_bytes();
            Ok::<_, hyper::Error>((status, body))
        };
        // The connection is driven here, not spawned: it ends with this call.
        let mut conn = pin!(conn);
        let mut answer = pin!(answer);
        let mut conn_done = false;
        let (status, body) = loop {
            tokio::select! {
                result = &mut answer => break result.map_err(transport)?,
                result = &mut conn, if !conn_done => {
                    result.map_err(transport)?;
                    conn_done = true;
                }
            }
        };
        if status.is_success() {
            return Ok(body);
        }
        Err(ConsulError::Status {
            method,
            path,
            status,
            message: answer_text(&body, status),
        })
    }
}

fn method_name(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        _ => "request",
    }
}

/// Describes a JSON problem by its category and position only: serde_json's messages may
/// quote the answer, which may hold a SecretID.
fn decode_error(
    method: &'static str,
    path: &'static str,
    error: &serde_json::Error,
    doing: &str,
) -> ConsulError {
    let kind = match error.classify() {
        serde_json::error::Category::Io => "I/O error",
        serde_json::error::Category::Syntax => "not JSON",
        serde_json::error::Category::Data => "JSON of the wrong shape",
        serde_json::error::Category::Eof => "truncated JSON",
    };
    ConsulError::Decode {
        method,
        path,
        problem: format!(
            "{doing}: {kind} at line {} column {}",
            error.line(),
            error.column()
        ),
    }
}
