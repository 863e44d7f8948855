//! Consul ACL tokens for an alloc's services, from their workload identities (Nomad's
//! `consul` alloc hook and `consul_si_token` task hook, rebuilt).
//!
//! - [`ConsulHook`] (alloc prerun): for every Consul service of the group with an `identity`
//!   block, signs the service's workload identity, logs in to Consul with it
//!   (`service_identity_auth_method`, meta `requested_by = nomad_service_<name>` and
//!   `node_id`), and checks the token with `token/self` until Consul has replicated it (about
//!   every second, up to [`PREFLIGHT_TIMEOUT`]). Each token is persisted
//!   (`Table::CONSUL_TOKENS`, by alloc id) the moment Consul hands it over, so a crash never
//!   leaks one and a prerun run again after a crash reuses it instead of logging in twice. If
//!   any step fails, every token obtained is revoked (`logout`) and the alloc fails with
//!   Consul's answer.
//! - [`ConsulHook`] (alloc postrun): revokes the alloc's tokens once its tasks are dead.
//! - [`SiTokenHook`] (task prestart, on every start): writes the SecretID of the token of the
//!   service a `connect-proxy:<service>` task fronts to `<task>/secrets/si_token` (mode 0440,
//!   no newline), through a path that cannot leave the task's directory; so a restarted task,
//!   after an agent restart or on a fresh tmpfs, finds it again without a second login.
//!
//! A token's SecretID and the JWTs never reach a log, an event, the API or an error: events
//! and errors name services and AccessorIDs.

use std::{
    collections::BTreeMap,
    path::Path,
    sync::Arc,
    time::{Duration, SystemTime},
};

use berth_allocrunner::{
    AllocContext, AllocHook, BoxFuture, EventKind, HookError, TaskContext, TaskHook,
};
use berth_consul::{AclToken, Client, ConsulError};
use berth_drivers::TaskConfig;
use berth_identity::{CONSUL_AUDIENCE, ClaimsBuilder, Signer};
use berth_job::{GroupSpec, ServiceProvider, ServiceSpec};
use berth_state::{Store, Table};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

/// How long a fresh token may take to become usable.
pub const PREFLIGHT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a fresh token is checked, at least (each pause is drawn between this and twice
/// it, as Nomad's client does).
pub const PREFLIGHT_INTERVAL: Duration = Duration::from_secs(1);
/// How many times a logout is tried before the token is given up on.
const REVOKE_ATTEMPTS: u32 = 3;
/// The file a sidecar task finds its token in, in its secrets directory.
pub const SI_TOKEN_FILE: &str = "si_token";
/// The mode of [`SI_TOKEN_FILE`] (Nomad's).
const SI_TOKEN_MODE: u32 = 0o440;
/// The name of the alloc hook.
pub const CONSUL_HOOK: &str = "consul";
/// The name of the task hook.
pub const SI_TOKEN_HOOK: &str = "consul_si_token";
/// The version of the persisted record.
const RECORD_VERSION: u32 = 1;

/// An alloc's tokens as persisted: service name → token.
#[derive(Debug, Default, Serialize, Deserialize)]
struct AllocTokens {
    version: u32,
    services: BTreeMap<String, AclToken>,
}

/// The hooks of one alloc.
#[derive(Debug)]
pub struct AllocHooks {
    /// The alloc hook.
    pub alloc: Arc<dyn AllocHook>,
    /// Task hooks, by task name.
    pub tasks: Vec<(String, Arc<dyn TaskHook>)>,
}

/// The node's side of the token flow: Consul, the signer, the store. One per agent, shared by
/// every alloc's hooks.
pub struct ConsulTokens {
    client: Client,
    signer: Signer,
    store: Arc<Store>,
    node_id: String,
    region: String,
    preflight_timeout: Duration,
    preflight_interval: Duration,
    revoke_pause: Duration,
}

impl std::fmt::Debug for ConsulTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsulTokens")
            .field("consul", &self.client.address())
            .field("node_id", &self.node_id)
            .finish_non_exhaustive()
    }
}

/// The services of `group` that get a Consul token: Consul services with an `identity`.
fn token_services(group: &GroupSpec) -> impl Iterator<Item = &ServiceSpec> {
    group
        .services
        .iter()
        .filter(|s| s.provider == ServiceProvider::Consul && s.identity.is_some())
}

/// Nomad's name of a service's identity: `consul-service_<name>-<port label>`.
fn identity_name(service: &ServiceSpec) -> String {
    format!(
        "consul-service_{}-{}",
        service.name,
        service.port.as_deref().unwrap_or("")
    )
}

impl ConsulTokens {
    /// The token flow over `client`, signing with `signer`, persisting in `store`.
    pub fn new(
        client: Client,
        signer: Signer,
        store: Arc<Store>,
        node_id: &str,
        region: &str,
    ) -> Self {
        Self {
            client,
            signer,
            store,
            node_id: node_id.to_owned(),
            region: region.to_owned(),
            preflight_timeout: PREFLIGHT_TIMEOUT,
            preflight_interval: PREFLIGHT_INTERVAL,
            revoke_pause: Duration::from_secs(1),
        }
    }

    /// The hooks an alloc of `group` needs when a service has an identity: the alloc hook,
    /// and a task hook per `connect-proxy` (or other Connect) task whose service gets a
    /// token.
    pub fn hooks(self: &Arc<Self>, group: &GroupSpec) -> Option<AllocHooks> {
        let services: Vec<&str> = token_services(group).map(|s| s.name.as_str()).collect();
        if services.is_empty() {
            return None;
        }
        let tasks = group
            .consul_si_token_tasks()
            .into_iter()
            .filter(|(service, _)| services.contains(service))
            .map(|(service, task)| {
                let hook: Arc<dyn TaskHook> = Arc::new(SiTokenHook {
                    tokens: Arc::clone(self),
                    service: service.to_owned(),
                });
                (task.to_owned(), hook)
            })
            .collect();
        let alloc: Arc<dyn AllocHook> = Arc::new(ConsulHook {
            tokens: Arc::clone(self),
        });
        Some(AllocHooks { alloc, tasks })
    }

    fn load(&self, alloc_id: &str) -> Result<AllocTokens, String> {
        let record: Option<AllocTokens> = self
            .store
            .get(Table::CONSUL_TOKENS, alloc_id)
            .map_err(|e| format!("consul: cannot read the alloc's tokens: {e}"))?;
        match record {
            Some(r) if r.version != RECORD_VERSION => Err(format!(
                "consul: the alloc's token record has version {}; this agent reads {RECORD_VERSION}",
                r.version
            )),
            Some(r) => Ok(r),
            None => Ok(AllocTokens {
                version: RECORD_VERSION,
                services: BTreeMap::new(),
            }),
        }
    }

    fn save(&self, alloc_id: &str, tokens: &AllocTokens) -> Result<(), String> {
        let result = if tokens.services.is_empty() {
            self.store.delete(Table::CONSUL_TOKENS, alloc_id).map(drop)
        } else {
            self.store.put(Table::CONSUL_TOKENS, alloc_id, tokens)
        };
        result.map_err(|e| format!("consul: cannot persist the alloc's tokens: {e}"))
    }

    /// Logs in for `service`: its identity signed, traded for a token.
    async fn login(&self, ctx: &AllocContext, service: &ServiceSpec) -> Result<AclToken, String> {
        let Some(identity) = &service.identity else {
            return Err(format!(
                "consul: service {:?} has no identity",
                service.name
            ));
        };
        let audiences: Vec<&str> = if identity.aud.is_empty() {
            vec![CONSUL_AUDIENCE]
        } else {
            identity.aud.iter().map(String::as_str).collect()
        };
        let claims =
            ClaimsBuilder::service(&ctx.job_id, &ctx.group.name, &ctx.alloc_id, &service.name)
                .region(&self.region)
                .identity(&identity_name(service))
                .audiences(audiences)
                .ttl(identity.ttl)
                .build(SystemTime::now());
        let jwt = self.signer.sign(&claims).map_err(|e| {
            format!(
                "consul: cannot sign the identity of service {:?}: {e}",
                service.name
            )
        })?;
        let meta = BTreeMap::from([
            (
                "requested_by".to_owned(),
                format!("nomad_service_{}", service.name),
            ),
            ("node_id".to_owned(), self.node_id.clone()),
        ]);
        let method = self.client.service_identity_auth_method();
        self.client.login(method, &jwt, meta).await.map_err(|e| {
            format!(
                "consul: login for service {:?} through auth method {method:?} failed: {e}",
                service.name
            )
        })
    }

    /// Logs `token` out, retrying a few times; Ok when Consul no longer has it.
    async fn logout(&self, token: &AclToken) -> Result<(), ConsulError> {
        let mut attempt = 1;
        loop {
            match self.client.logout(token).await {
                Ok(()) => return Ok(()),
                Err(e) if e.is_acl_not_found() => return Ok(()),
                Err(e) if attempt >= REVOKE_ATTEMPTS => return Err(e),
                Err(_) => {
                    tokio::time::sleep(self.revoke_pause * attempt).await;
                    attempt += 1;
                }
            }
        }
    }

    /// Revokes every token of the alloc's record and forgets them; says what it did in the
    /// alloc's events. A token Consul would not revoke is named by its AccessorID.
    async fn revoke_all(&self, ctx: &AllocContext, tokens: &mut AllocTokens) {
        if tokens.services.is_empty() {
            return;
        }
        let mut revoked = Vec::new();
        for (service, token) in std::mem::take(&mut tokens.services) {
            match self.logout(&token).await {
                Ok(()) => revoked.push(service),
                Err(e) => {
                    tracing::warn!(alloc_id = %ctx.alloc_id, service, accessor = %token.accessor_id, error = %e, "cannot revoke a Consul token");
                    ctx.events.emit(
                        EventKind::ConsulRevokeFailed,
                        format!(
                            "the token of service {service:?} (accessor {}) could not be revoked: {e}",
                            token.accessor_id
                        ),
                    );
                }
            }
        }
        if let Err(e) = self.save(&ctx.alloc_id, tokens) {
            tracing::warn!(alloc_id = %ctx.alloc_id, error = %e, "cannot forget the alloc's Consul tokens");
        }
        if !revoked.is_empty() {
            ctx.events.emit(
                EventKind::ConsulTokensRevoked,
                format!(
                    "revoked the Consul token(s) of service(s) {}",
                    revoked.join(", ")
                ),
            );
        }
    }

    /// Gets a usable token for every service that needs one; the first failure is returned
    /// with every token obtained still in `tokens` (the caller revokes them).
    async fn derive(&self, ctx: &AllocContext, tokens: &mut AllocTokens) -> Result<(), String> {
        let never = CancellationToken::new();
        for service in token_services(&ctx.group) {
            let token = match tokens.services.get(&service.name) {
                // An interrupted prerun got it already.
                Some(t) => t.clone(),
                None => {
                    let token = self.login(ctx, service).await?;
                    tokens.services.insert(service.name.clone(), token.clone());
                    self.save(&ctx.alloc_id, tokens)?;
                    token
                }
            };
            self.client
                .preflight(
                    &token,
                    self.preflight_timeout,
                    self.preflight_interval,
                    &never,
                )
                .await
                .map_err(|e| {
                    format!(
                        "consul: the token of service {:?} (accessor {}) was not usable within {}: {e}",
                        service.name,
                        token.accessor_id,
                        berth_sys::short_duration(self.preflight_timeout)
                    )
                })?;
        }
        Ok(())
    }
}

/// The alloc hook: tokens in prerun, revoked in postrun.
#[derive(Debug)]
pub struct ConsulHook {
    tokens: Arc<ConsulTokens>,
}

impl AllocHook for ConsulHook {
    fn name(&self) -> &str {
        CONSUL_HOOK
    }

    fn prerun<'a>(&'a self, ctx: &'a AllocContext) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async move {
            let side = &self.tokens;
            let mut tokens = side.load(&ctx.alloc_id).map_err(HookError::new)?;
            match side.derive(ctx, &mut tokens).await {
                Ok(()) => {
                    let list: Vec<String> = tokens
                        .services
                        .iter()
                        .map(|(s, t)| format!("{s} (accessor {})", t.accessor_id))
                        .collect();
                    ctx.events.emit(
                        EventKind::ConsulTokensDerived,
                        format!("Consul tokens ready for service(s) {}", list.join(", ")),
                    );
                    Ok(())
                }
                Err(message) => {
                    tracing::warn!(alloc_id = %ctx.alloc_id, error = %message, "cannot derive Consul tokens");
                    ctx.events
                        .emit(EventKind::ConsulTokensFailed, message.clone());
                    side.revoke_all(ctx, &mut tokens).await;
                    Err(HookError::new(message))
                }
            }
        })
    }

    fn postrun<'a>(&'a self, ctx: &'a AllocContext) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let side = &self.tokens;
            match side.load(&ctx.alloc_id) {
                Ok(mut tokens) => side.revoke_all(ctx, &mut tokens).await,
                Err(e) => {
                    tracing::warn!(alloc_id = %ctx.alloc_id, error = %e, "cannot read the alloc's Consul tokens to revoke them");
                    ctx.events.emit(EventKind::ConsulRevokeFailed, e);
                }
            }
        })
    }
}

/// The task hook of a Connect task: its service's token in `secrets/si_token` before every
/// start.
#[derive(Debug)]
pub struct SiTokenHook {
    tokens: Arc<ConsulTokens>,
    service: String,
}

impl SiTokenHook {
    fn write(&self, ctx: &TaskContext) -> Result<(), String> {
        let tokens = self.tokens.load(&ctx.alloc_id)?;
        let Some(token) = tokens.services.get(&self.service) else {
            return Err(format!(
                "consul: no token for service {:?} (the alloc's consul hook has not derived one)",
                self.service
            ));
        };
        berth_sys::write_file_beneath(
            &ctx.task_dir,
            Path::new("secrets"),
            SI_TOKEN_FILE,
            token.secret_id.expose().as_bytes(),
            SI_TOKEN_MODE,
        )
        .map_err(|e| format!("consul: cannot write secrets/{SI_TOKEN_FILE}: {e}"))
    }
}

impl TaskHook for SiTokenHook {
    fn name(&self) -> &str {
        SI_TOKEN_HOOK
    }

    fn prestart<'a>(
        &'a self,
        ctx: &'a TaskContext,
        _config: &'a mut TaskConfig,
    ) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async move {
            self.write(ctx).map_err(HookError::new)?;
            ctx.events.emit(
                EventKind::SecretWritten,
                format!(
                    "the Consul token of service {:?} is in secrets/{SI_TOKEN_FILE}",
                    self.service
                ),
            );
            Ok(())
        })
    }
}
