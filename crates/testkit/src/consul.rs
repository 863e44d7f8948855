//! A fake Consul agent speaking the ACL HTTP API used for workload identities:
//! [`FakeConsul`].

use std::{
    collections::BTreeMap,
    convert::Infallible,
    fmt, io,
    net::{Ipv4Addr, SocketAddr, TcpListener},
    sync::{Arc, Mutex, MutexGuard},
    thread::JoinHandle,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use http_body_util::{BodyExt as _, Full};
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header::{CONTENT_TYPE, HeaderValue},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use jsonwebtoken::{Algorithm, DecodingKey, Validation, jwk::JwkSet};
use rand::Rng as _;
use serde_json::{Value, json};
use tokio::{sync::oneshot, task::JoinSet};

/// The audience `nomad setup consul` binds: the default of [`FakeConsulConfig::new`].
pub const CONSUL_AUDIENCE: &str = "consul.io";

/// The auth method `nomad setup consul` creates: the default of [`FakeConsulConfig::new`].
pub const CONSUL_AUTH_METHOD: &str = "nomad-workloads";

/// Clock skew allowed on `exp`, `nbf` and `iat` (go-jose's default leeway).
const CLOCK_SKEW_SECS: i64 = 60;

/// How long a JWT without `exp` lives after its `iat`/`nbf` (Consul's default).
const IMPLIED_LIFETIME_SECS: i64 = 150;

/// How long a stopping fake waits for JWKS sources still running.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(1);

/// Consul's text for an unknown token.
const ACL_NOT_FOUND: &str = "ACL not found";

/// Where the fake gets the JWKS (the JSON text of a JWK set) that verifies login JWTs: called
/// for every login, on a blocking thread, so it may block (e.g. fetch the agent's JWKS).
pub type JwksSource = Box<dyn Fn() -> Result<String, String> + Send + Sync>;

/// How a [`FakeConsul`] checks logins.
pub struct FakeConsulConfig {
    /// Auth methods that exist; a login naming another is refused.
    pub auth_methods: Vec<String>,
    /// A login JWT's `aud` must name one of these.
    pub bound_audiences: Vec<String>,
    /// The JWKS that verifies login JWTs.
    pub jwks: JwksSource,
}

impl FakeConsulConfig {
    /// Consul as `nomad setup consul` leaves it: the auth method [`CONSUL_AUTH_METHOD`],
    /// bound to the audience [`CONSUL_AUDIENCE`], verifying with `jwks`.
    pub fn new(jwks: impl Fn() -> Result<String, String> + Send + Sync + 'static) -> Self {
        Self {
            auth_methods: vec![CONSUL_AUTH_METHOD.to_owned()],
            bound_audiences: vec![CONSUL_AUDIENCE.to_owned()],
            jwks: Box::new(jwks),
        }
    }
}

impl fmt::Debug for FakeConsulConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeConsulConfig")
            .field("auth_methods", &self.auth_methods)
            .field("bound_audiences", &self.bound_audiences)
            .finish_non_exhaustive()
    }
}

/// One `POST /v1/acl/login`, whatever its outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct LoginRecord {
    /// The `AuthMethod` asked for.
    pub auth_method: String,
    /// The `BearerToken` sent.
    pub bearer_token: String,
    /// The JWT's claims, decoded without verification (None when it does not decode).
    pub claims: Option<Value>,
    /// The `Meta` sent.
    pub meta: BTreeMap<String, String>,
    /// What the fake answered.
    pub outcome: LoginOutcome,
}

/// What a login got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoginOutcome {
    /// A token was made.
    Issued {
        /// Its AccessorID.
        accessor_id: String,
    },
    /// The login was refused.
    Refused {
        /// The HTTP status.
        status: u16,
        /// The answer text.
        body: String,
    },
}

/// One `POST /v1/acl/logout`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogoutRecord {
    /// The `X-Consul-Token` sent (empty when none).
    pub secret_id: String,
    /// True when it named a live token, which is now gone.
    pub removed: bool,
}

/// A token the fake made and has not destroyed.
#[derive(Debug, Clone, PartialEq)]
pub struct IssuedToken {
    /// Its AccessorID.
    pub accessor_id: String,
    /// Its SecretID.
    pub secret_id: String,
    /// The auth method that made it.
    pub auth_method: String,
    /// Its description.
    pub description: String,
    /// The service of its service identity, if it has one.
    pub service_name: Option<String>,
    /// The token as the fake answers it.
    pub json: Value,
}

/// A failure answered instead of the real outcome.
#[derive(Debug, Clone)]
struct Injected {
    status: StatusCode,
    body: String,
}

#[derive(Debug)]
struct LiveToken {
    issued: IssuedToken,
    /// token/self calls still to answer `ACL not found`.
    hidden_for: u32,
}

#[derive(Debug, Default)]
struct State {
    tokens: Vec<LiveToken>,
    logins: Vec<LoginRecord>,
    token_self_calls: BTreeMap<String, u32>,
    logouts: Vec<LogoutRecord>,
    login_failures: Option<(Injected, u32)>,
    hide_new_tokens_for: u32,
    token_self_failure: Option<Injected>,
    index: u64,
}

#[derive(Debug)]
struct Shared {
    config: FakeConsulConfig,
    state: Mutex<State>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A fake Consul agent that speaks the part of Consul's ACL HTTP API a node agent uses for
/// workload identities: `POST /v1/acl/login`, `GET /v1/acl/token/self`, `POST /v1/acl/logout`.
///
/// A real HTTP/1.1 server on 127.0.0.1 with a runtime of its own on a thread of its own, so
/// blocking and async tests can both use it; dropping it stops and joins that thread.
///
/// Logins are checked as Consul's `jwt` auth method checks them, with the bindings that
/// `nomad setup consul` creates: the JWT's signature against the JWKS (`kid` looked up, every
/// key when the JWT names none; HMAC refused), its times (`exp`, `nbf`, `iat`, 60 s of clock
/// skew; a JWT without `exp` expires 150 s after its `iat`/`nbf`, as in Consul), its `aud`
/// against the bound audiences; then a `nomad_service` claim gets a token with that service
/// identity, a `nomad_task` claim (and no service) a token with no policy, role or identity.
/// Tokens have random UUIDs, `Local: true`, the auth method, and Consul's description
/// (`token created via login: {meta as JSON}`).
///
/// Answers and texts are Consul's as a server gives them (through a client agent Consul
/// prefixes `rpc error making call: `):
///
/// | case | status | text |
/// |---|---|---|
/// | unknown auth method | 403 | `ACL not found: auth method "x" not found` |
/// | empty `BearerToken` | 500 | `missing jwt` |
/// | not three dot-separated parts | 500 | `error verifying token: oidc: malformed jwt: go-jose/go-jose: compact JWS format must have three parts` |
/// | HMAC `alg` | 500 | `error verifying token: oidc: malformed jwt: go-jose/go-jose: unexpected signature algorithm "HS256"` |
/// | unknown `kid`, bad signature | 500 | `error verifying token: failed to verify id token signature` |
/// | JWKS source failed | 500 | `error verifying token: fetching keys oidc: get keys failed: <its error>` |
/// | no `iat`, `nbf` nor `exp` | 500 | `no issue time, notbefore, or expiration time encoded in token` |
/// | expired | 500 | `error validating claims: go-jose/go-jose/jwt: validation failed, token is expired (exp)` |
/// | not yet valid | 500 | `error validating claims: go-jose/go-jose/jwt: validation failed, token not valid yet (nbf)` |
/// | issued in the future | 500 | `error validating claims: go-jose/go-jose/jwt: validation field, token issued in the future (iat)` |
/// | wrong audience | 500 | `error validating claims: aud claim does not match any bound audience` |
/// | no binding rule matches | 403 | `Permission denied` |
/// | unknown token (token/self, logout) | 403 | `ACL not found` |
///
/// Failures can be injected: [`FakeConsul::fail_logins`], [`FakeConsul::token_self_not_found`],
/// [`FakeConsul::fail_token_self`].
#[derive(Debug)]
pub struct FakeConsul {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeConsul {
    /// Starts serving on a free port of 127.0.0.1; it answers as soon as this returns.
    pub fn start(config: FakeConsulConfig) -> io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let shared = Arc::new(Shared {
            config,
            state: Mutex::new(State::default()),
        });
        let (shutdown, stop) = oneshot::channel();
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("fake-consul".to_owned())
                .spawn(move || {
                    runtime.block_on(serve(listener, shared, stop));
                    // A JWKS source still blocking must not hold up the drop for long.
                    runtime.shutdown_timeout(SHUTDOWN_TIMEOUT);
                })?
        };
        Ok(Self {
            addr,
            shared,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// `127.0.0.1:<port>`: what a Consul client's `address` setting wants.
    pub fn address(&self) -> String {
        self.addr.to_string()
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every login so far, in order, with its outcome.
    pub fn logins(&self) -> Vec<LoginRecord> {
        self.shared.state().logins.clone()
    }

    /// How many token/self calls each `X-Consul-Token` made (known or not; `""` for none).
    pub fn token_self_calls(&self) -> BTreeMap<String, u32> {
        self.shared.state().token_self_calls.clone()
    }

    /// How many token/self calls `secret_id` made.
    pub fn token_self_count(&self, secret_id: &str) -> u32 {
        self.shared
            .state()
            .token_self_calls
            .get(secret_id)
            .copied()
            .unwrap_or(0)
    }

    /// Every logout so far, in order.
    pub fn logouts(&self) -> Vec<LogoutRecord> {
        self.shared.state().logouts.clone()
    }

    /// The tokens made and not destroyed, oldest first.
    pub fn live_tokens(&self) -> Vec<IssuedToken> {
        self.shared
            .state()
            .tokens
            .iter()
            .map(|live| live.issued.clone())
            .collect()
    }

    /// The next `times` logins answer `status` with `body`, before anything is checked (they
    /// are still recorded). Replaces an earlier call's failures; `times` 0 stops them.
    pub fn fail_logins(&self, status: u16, body: impl Into<String>, times: u32) {
        let injected = Injected {
            status: status_code(status),
            body: body.into(),
        };
        self.shared.state().login_failures = (times > 0).then_some((injected, times));
    }

    /// Replication lag: every token made from now on answers `403 ACL not found` to its first
    /// `times` token/self calls (counted per token), then itself. Tokens made before keep
    /// their own count; `times` 0 stops hiding new tokens. Logout sees tokens at once.
    pub fn token_self_not_found(&self, times: u32) {
        self.shared.state().hide_new_tokens_for = times;
    }

    /// Every token/self call answers `status` with `body`, whatever its token, until
    /// [`FakeConsul::clear_token_self_failure`].
    pub fn fail_token_self(&self, status: u16, body: impl Into<String>) {
        self.shared.state().token_self_failure = Some(Injected {
            status: status_code(status),
            body: body.into(),
        });
    }

    /// Ends [`FakeConsul::fail_token_self`].
    pub fn clear_token_self_failure(&self) {
        self.shared.state().token_self_failure = None;
    }
}

impl Drop for FakeConsul {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn status_code(status: u16) -> StatusCode {
    StatusCode::from_u16(status).unwrap_or_else(|_| panic!("{status} is not an HTTP status"))
}

/// Accepts and serves connections until `stop` fires (or its sender is dropped); then drops
/// every connection.
async fn serve(listener: TcpListener, shared: Arc<Shared>, mut stop: oneshot::Receiver<()>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(error) => panic!("fake consul: adopting its listener: {error}"),
    };
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let shared = Arc::clone(&shared);
                connections.spawn(async move {
                    let service = service_fn(move |request| {
                        let shared = Arc::clone(&shared);
                        async move { Ok::<_, Infallible>(route(&shared, request).await) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    connections.shutdown().await;
}

type Answer = Response<Full<Bytes>>;

fn text(status: StatusCode, body: impl Into<String>) -> Answer {
    let mut answer = Response::new(Full::new(Bytes::from(body.into())));
    *answer.status_mut() = status;
    answer.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    answer
}

fn json_answer(value: &Value) -> Answer {
    let mut answer = Response::new(Full::new(Bytes::from(value.to_string())));
    answer
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    answer
}

async fn route(shared: &Arc<Shared>, request: Request<Incoming>) -> Answer {
    let method = request.method().clone();
    let wanted = match request.uri().path() {
        "/v1/acl/login" => Method::POST,
        "/v1/acl/token/self" => Method::GET,
        "/v1/acl/logout" => Method::POST,
        _ => return text(StatusCode::NOT_FOUND, "404 page not found"),
    };
    if method != wanted {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("method {method} not allowed"),
        );
    }
    let token = request_token(&request);
    match request.uri().path() {
        "/v1/acl/login" => {
            let body = match request.into_body().collect().await {
                Ok(body) => body.to_bytes(),
                Err(error) => {
                    return text(
                        StatusCode::BAD_REQUEST,
                        format!("Request decode failed: {error}"),
                    );
                }
            };
            login(shared, &body).await
        }
        "/v1/acl/token/self" => token_self(shared, &token),
        _ => logout(shared, &token),
    }
}

/// The token a request carries: `X-Consul-Token`, else `?token=`; empty when none.
fn request_token(request: &Request<Incoming>) -> String {
    if let Some(value) = request.headers().get("x-consul-token") {
        return value.to_str().unwrap_or_default().to_owned();
    }
    request
        .uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .find_map(|pair| pair.strip_prefix("token="))
        .unwrap_or_default()
        .to_owned()
}

fn token_self(shared: &Shared, secret_id: &str) -> Answer {
    let mut state = shared.state();
    *state
        .token_self_calls
        .entry(secret_id.to_owned())
        .or_default() += 1;
    if let Some(injected) = &state.token_self_failure {
        return text(injected.status, injected.body.clone());
    }
    let Some(live) = state
        .tokens
        .iter_mut()
        .find(|live| live.issued.secret_id == secret_id)
    else {
        return text(StatusCode::FORBIDDEN, ACL_NOT_FOUND);
    };
    if live.hidden_for > 0 {
        live.hidden_for -= 1;
        return text(StatusCode::FORBIDDEN, ACL_NOT_FOUND);
    }
    json_answer(&live.issued.json)
}

fn logout(shared: &Shared, secret_id: &str) -> Answer {
    let mut state = shared.state();
    let found = state
        .tokens
        .iter()
        .position(|live| !secret_id.is_empty() && live.issued.secret_id == secret_id);
    if let Some(index) = found {
        state.tokens.remove(index);
    }
    state.logouts.push(LogoutRecord {
        secret_id: secret_id.to_owned(),
        removed: found.is_some(),
    });
    match found {
        Some(_) => json_answer(&Value::Bool(true)),
        None => text(StatusCode::FORBIDDEN, ACL_NOT_FOUND),
    }
}

/// A refusal: status and Consul's text.
type Refusal = (StatusCode, String);

fn server_error(message: impl Into<String>) -> Refusal {
    (StatusCode::INTERNAL_SERVER_ERROR, message.into())
}

async fn login(shared: &Arc<Shared>, body: &[u8]) -> Answer {
    let request: Value = match serde_json::from_slice(body) {
        Ok(request) => request,
        Err(error) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("Request decode failed: {error}"),
            );
        }
    };
    let auth_method = request["AuthMethod"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let bearer_token = request["BearerToken"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let meta: BTreeMap<String, String> = request["Meta"]
        .as_object()
        .map(|meta| {
            meta.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect()
        })
        .unwrap_or_default();
    let claims = jsonwebtoken::dangerous::insecure_decode::<Value>(&bearer_token)
        .ok()
        .map(|data| data.claims);

    let outcome = match take_login_failure(shared) {
        Some(injected) => Err((injected.status, injected.body)),
        None => check_login(shared, &auth_method, &bearer_token).await,
    };
    let mut state = shared.state();
    let (answer, outcome) = match outcome {
        Ok(verified) => {
            let issued = issue(&mut state, &auth_method, &verified, &meta);
            let answer = json_answer(&issued.json);
            let outcome = LoginOutcome::Issued {
                accessor_id: issued.accessor_id.clone(),
            };
            let hidden_for = state.hide_new_tokens_for;
            state.tokens.push(LiveToken { issued, hidden_for });
            (answer, outcome)
        }
        Err((status, body)) => (
            text(status, body.clone()),
            LoginOutcome::Refused {
                status: status.as_u16(),
                body,
            },
        ),
    };
    state.logins.push(LoginRecord {
        auth_method,
        bearer_token,
        claims,
        meta,
        outcome,
    });
    answer
}

fn take_login_failure(shared: &Shared) -> Option<Injected> {
    let mut state = shared.state();
    let (injected, left) = state.login_failures.as_mut()?;
    let injected = injected.clone();
    *left -= 1;
    if *left == 0 {
        state.login_failures = None;
    }
    Some(injected)
}

/// What a verified JWT binds to.
#[derive(Debug)]
enum Binding {
    Service(String),
    Task,
}

/// Checks a login as Consul's `jwt` auth method does (see [`FakeConsul`]'s table of answers).
async fn check_login(
    shared: &Arc<Shared>,
    auth_method: &str,
    jwt: &str,
) -> Result<Binding, Refusal> {
    if !shared.config.auth_methods.iter().any(|m| m == auth_method) {
        return Err((
            StatusCode::FORBIDDEN,
            format!("{ACL_NOT_FOUND}: auth method {auth_method:?} not found"),
        ));
    }
    if jwt.is_empty() {
        return Err(server_error("missing jwt"));
    }
    let jwks = {
        let shared = Arc::clone(shared);
        tokio::task::spawn_blocking(move || (shared.config.jwks)())
            .await
            .unwrap_or_else(|_| Err("the JWKS source panicked".to_owned()))
            .map_err(|error| {
                server_error(format!(
                    "error verifying token: fetching keys oidc: get keys failed: {error}"
                ))
            })?
    };
    let claims = verify_signature(jwt, &jwks)?;
    check_times(&claims, now_secs())?;
    check_audience(&claims, &shared.config.bound_audiences)?;
    let claim = |name: &str| {
        claims
            .get(name)
            .and_then(Value::as_str)
            .filter(|value| !value.is_empty())
    };
    match (claim("nomad_service"), claim("nomad_task")) {
        (Some(service), _) => Ok(Binding::Service(service.to_owned())),
        (None, Some(_)) => Ok(Binding::Task),
        (None, None) => Err((StatusCode::FORBIDDEN, "Permission denied".to_owned())),
    }
}

/// Verifies the signature with the JWK named by `kid` (every JWK when there is no `kid`);
/// the claims, unchecked, when one verifies.
fn verify_signature(jwt: &str, jwks: &str) -> Result<serde_json::Map<String, Value>, Refusal> {
    let malformed = |detail: &str| {
        server_error(format!(
            "error verifying token: oidc: malformed jwt: {detail}"
        ))
    };
    if jwt.split('.').count() != 3 {
        return Err(malformed(
            "go-jose/go-jose: compact JWS format must have three parts",
        ));
    }
    let header = jsonwebtoken::decode_header(jwt).map_err(|e| malformed(&e.to_string()))?;
    let asymmetric = !matches!(
        header.alg,
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512
    );
    if !asymmetric {
        return Err(malformed(&format!(
            "go-jose/go-jose: unexpected signature algorithm \"{:?}\"",
            header.alg
        )));
    }
    let set: JwkSet = serde_json::from_str(jwks).map_err(|error| {
        server_error(format!(
            "error verifying token: fetching keys oidc: failed to decode keys: {error}"
        ))
    })?;
    let mut validation = Validation::new(header.alg);
    validation.required_spec_claims.clear();
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    let verified = set
        .keys
        .iter()
        .filter(|jwk| header.kid.is_none() || jwk.common.key_id == header.kid)
        .filter_map(|jwk| DecodingKey::from_jwk(jwk).ok())
        .find_map(|key| jsonwebtoken::decode::<Value>(jwt, &key, &validation).ok());
    let Some(verified) = verified else {
        return Err(server_error(
            "error verifying token: failed to verify id token signature",
        ));
    };
    match verified.claims {
        Value::Object(claims) => Ok(claims),
        _ => Err(server_error(
            "error verifying token: failed to unmarshal claims: not a JSON object",
        )),
    }
}

/// Consul's time checks, with its defaults for missing claims.
fn check_times(claims: &serde_json::Map<String, Value>, now: i64) -> Result<(), Refusal> {
    let time = |name: &str| -> Result<i64, Refusal> {
        match claims.get(name) {
            None | Some(Value::Null) => Ok(0),
            // Whole seconds, as Go's NumericDate keeps them.
            Some(Value::Number(n)) => Ok(n.as_f64().map_or(0, |secs| secs as i64)),
            Some(_) => Err(server_error(format!(
                "error verifying token: failed to unmarshal claims: {name:?} is not a number"
            ))),
        }
    };
    let (iat, mut exp, mut nbf) = (time("iat")?, time("exp")?, time("nbf")?);
    if iat == 0 && exp == 0 && nbf == 0 {
        return Err(server_error(
            "no issue time, notbefore, or expiration time encoded in token",
        ));
    }
    if exp == 0 {
        exp = iat.max(nbf) + IMPLIED_LIFETIME_SECS;
    }
    if nbf == 0 {
        nbf = if iat != 0 {
            iat
        } else {
            exp - IMPLIED_LIFETIME_SECS
        };
    }
    let failed = |what: &str| {
        server_error(format!(
            "error validating claims: go-jose/go-jose/jwt: {what}"
        ))
    };
    if now + CLOCK_SKEW_SECS < nbf {
        return Err(failed("validation failed, token not valid yet (nbf)"));
    }
    if now - CLOCK_SKEW_SECS > exp {
        return Err(failed("validation failed, token is expired (exp)"));
    }
    if now + CLOCK_SKEW_SECS < iat {
        return Err(failed("validation field, token issued in the future (iat)"));
    }
    Ok(())
}

/// Consul's strict audience check: some `aud` must be bound; an `aud` with nothing bound fails.
fn check_audience(
    claims: &serde_json::Map<String, Value>,
    bound: &[String],
) -> Result<(), Refusal> {
    let audiences: Vec<&str> = match claims.get("aud") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(one)) => vec![one.as_str()],
        Some(Value::Array(many)) => many.iter().filter_map(Value::as_str).collect(),
        Some(_) => {
            return Err(server_error(
                "error verifying token: failed to unmarshal claims: \"aud\" is not a string or a list",
            ));
        }
    };
    if bound.is_empty() {
        if audiences.is_empty() {
            return Ok(());
        }
        return Err(server_error(
            "error validating claims: audience claim found in JWT but no audiences are bound",
        ));
    }
    if bound.iter().any(|b| audiences.contains(&b.as_str())) {
        return Ok(());
    }
    Err(server_error(
        "error validating claims: aud claim does not match any bound audience",
    ))
}

/// Makes a login token as Consul does: random ids, `Local`, the auth method, a description
/// from the login's meta.
fn issue(
    state: &mut State,
    auth_method: &str,
    binding: &Binding,
    meta: &BTreeMap<String, String>,
) -> IssuedToken {
    state.index += 1;
    let accessor_id = uuid();
    let secret_id = uuid();
    let description = login_description(meta);
    let mut json = json!({
        "AccessorID": accessor_id,
        "SecretID": secret_id,
        "Description": description,
        "Local": true,
        "AuthMethod": auth_method,
        "CreateTime": rfc3339(SystemTime::now()),
        "Hash": base64(&rand::rng().random::<[u8; 32]>()),
        "CreateIndex": state.index,
        "ModifyIndex": state.index,
    });
    let service_name = match binding {
        Binding::Service(name) => {
            json["ServiceIdentities"] = json!([{ "ServiceName": name }]);
            Some(name.clone())
        }
        Binding::Task => None,
    };
    IssuedToken {
        accessor_id,
        secret_id,
        auth_method: auth_method.to_owned(),
        description,
        service_name,
        json,
    }
}

/// `token created via login`, then `: ` and the meta as Go's JSON encoder writes it (sorted
/// keys, `<`, `>`, `&`, U+2028 and U+2029 escaped) when there is any.
fn login_description(meta: &BTreeMap<String, String>) -> String {
    const PREFIX: &str = "token created via login";
    if meta.is_empty() {
        return PREFIX.to_owned();
    }
    let encoded = serde_json::to_string(meta)
        .expect("a map of strings encodes")
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029");
    format!("{PREFIX}: {encoded}")
}

/// A random UUID (version 4), as Consul's ids look.
fn uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// `YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ` (UTC).
fn rfc3339(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60,
        since.subsec_nanos()
    )
}

/// Standard base64 with padding.
fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One blocking HTTP/1.1 exchange: the status line and the body.
    fn exchange(address: &str, request: &str) -> (String, String) {
        use std::io::{Read as _, Write as _};
        let mut stream = std::net::TcpStream::connect(address).expect("connects");
        stream.write_all(request.as_bytes()).expect("sends");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).expect("reads");
        let (head, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
        let status = head.lines().next().unwrap_or_default().to_owned();
        (status, body.to_owned())
    }

    #[test]
    fn serves_blocking_callers_and_stops_on_drop() {
        let fake = FakeConsul::start(FakeConsulConfig::new(|| Err("no JWKS here".to_owned())))
            .expect("starts");
        let address = fake.address();

        let (status, body) = exchange(
            &address,
            "GET /v1/acl/token/self HTTP/1.1\r\nHost: x\r\nX-Consul-Token: nope\r\n\
             Connection: close\r\n\r\n",
        );
        assert_eq!(status, "HTTP/1.1 403 Forbidden");
        assert_eq!(body, "ACL not found");
        assert_eq!(fake.token_self_count("nope"), 1);

        let login = r#"{"AuthMethod": "nomad-workloads", "BearerToken": "x"}"#;
        let (status, body) = exchange(
            &address,
            &format!(
                "POST /v1/acl/login HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{login}",
                login.len()
            ),
        );
        assert_eq!(status, "HTTP/1.1 500 Internal Server Error");
        assert_eq!(
            body,
            "error verifying token: fetching keys oidc: get keys failed: no JWKS here"
        );
        assert!(matches!(
            fake.logins()[0].outcome,
            LoginOutcome::Refused { status: 500, .. }
        ));

        drop(fake);
        assert!(
            std::net::TcpStream::connect(&address).is_err(),
            "still listening"
        );
    }

    #[test]
    fn rfc3339_formats_known_instants() {
        let at = |secs| UNIX_EPOCH + Duration::from_secs(secs);
        assert_eq!(rfc3339(at(0)), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(rfc3339(at(951_782_400)), "2000-02-29T00:00:00.000000000Z");
        assert_eq!(rfc3339(at(1_714_557_600)), "2024-05-01T10:00:00.000000000Z");
    }

    #[test]
    fn base64_pads_like_the_standard() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(&[0xfb, 0xff]), "+/8=");
    }

    #[test]
    fn uuids_look_like_consul_ids() {
        let id = uuid();
        assert_eq!(id.len(), 36);
        assert_eq!(id.matches('-').count(), 4);
        assert_eq!(&id[14..15], "4");
        assert_ne!(id, uuid());
    }

    #[test]
    fn description_is_consuls() {
        assert_eq!(
            login_description(&BTreeMap::new()),
            "token created via login"
        );
        let meta = BTreeMap::from([
            ("requested_by".to_owned(), "nomad_task_web".to_owned()),
            ("a".to_owned(), "<&>".to_owned()),
        ]);
        assert_eq!(
            login_description(&meta),
            r#"token created via login: {"a":"\u003c\u0026\u003e","requested_by":"nomad_task_web"}"#
        );
    }

    #[test]
    fn times_are_checked_as_consul_does() {
        let now = 1_000_000;
        let claims = |value: Value| value.as_object().cloned().expect("an object");
        assert!(check_times(&claims(json!({"iat": now, "exp": now + 60})), now).is_ok());
        let text = |r: Result<(), Refusal>| r.expect_err("refused").1;
        assert!(text(check_times(&claims(json!({})), now)).starts_with("no issue time"));
        assert!(text(check_times(&claims(json!({"exp": now - 61})), now)).ends_with("(exp)"));
        assert!(text(check_times(&claims(json!({"nbf": now + 61})), now)).ends_with("(nbf)"));
        assert!(
            text(check_times(
                &claims(json!({"iat": now + 61, "nbf": now, "exp": now + 300})),
                now
            ))
            .ends_with("(iat)")
        );
        // No exp: 150 s after iat, plus the skew.
        assert!(check_times(&claims(json!({"iat": now - 200})), now).is_ok());
        assert!(text(check_times(&claims(json!({"iat": now - 211})), now)).ends_with("(exp)"));
    }

    #[test]
    fn audience_is_checked_strictly() {
        let claims = |value: Value| value.as_object().cloned().expect("an object");
        let bound = [CONSUL_AUDIENCE.to_owned()];
        assert!(check_audience(&claims(json!({"aud": "consul.io"})), &bound).is_ok());
        assert!(check_audience(&claims(json!({"aud": ["x", "consul.io"]})), &bound).is_ok());
        assert!(check_audience(&claims(json!({"aud": "x"})), &bound).is_err());
        assert!(check_audience(&claims(json!({})), &bound).is_err());
        assert!(check_audience(&claims(json!({})), &[]).is_ok());
        assert!(check_audience(&claims(json!({"aud": "x"})), &[]).is_err());
    }
}
