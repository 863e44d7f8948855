//! The API's ACL tokens, kept in the agent's store (`Table::ACL`).
//!
//! A token's secret id is a random UUID shown once, when the token is made; the store holds its
//! SHA-256 only, so a copy of `state.redb` holds no usable secret. The tokens are also held in
//! memory by hash, so checking a request reads no file. Bootstrap works once in the store's
//! life: its record is written in the same transaction as the first token.

use std::{
    collections::HashMap,
    fmt,
    path::Path,
    sync::{Arc, Mutex, RwLock},
};

use berth_api::{
    ApiError,
    acl::{AclToken, NewToken, Policy, SecretId, TokenCreateRequest},
    server::{AclStore, ListenOptions, Listeners, ServerTls},
};
use berth_state::{StateError, Store, Table};
use serde::{Deserialize, Serialize};

use crate::{AgentError, AgentOptions};

/// The name of the token bootstrap makes.
pub const BOOTSTRAP_NAME: &str = "Bootstrap Token";

/// The record of `Table::ACL` written by bootstrap.
const BOOTSTRAP_KEY: &str = "bootstrap";

/// The prefix of token records in `Table::ACL`.
const TOKEN_PREFIX: &str = "token/";

type Hash = [u8; 32];

/// A token as stored: the listed fields and the SHA-256 of its secret (hex).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct TokenRecord {
    #[serde(flatten)]
    token: AclToken,
    secret_sha256: String,
}

/// The bootstrap record: which token it made, and when.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct BootstrapRecord {
    accessor_id: String,
    time: u64,
}

/// The agent's ACL tokens.
pub struct AclTokens {
    store: Arc<Store>,
    /// Every token by the hash of its secret.
    by_hash: RwLock<HashMap<Hash, AclToken>>,
    /// Serializes changes: bootstrap's check and write, and the last-management check of
    /// delete, see no change in between.
    writes: Mutex<()>,
}

impl fmt::Debug for AclTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AclTokens")
            .field("tokens", &self.read().len())
            .finish_non_exhaustive()
    }
}

impl AclTokens {
    /// Loads the tokens from `store`. A damaged record is an error (the agent does not start
    /// with some tokens silently gone).
    pub fn load(store: Arc<Store>) -> Result<Self, StateError> {
        let mut by_hash = HashMap::new();
        for (key, record) in store.list_prefix::<TokenRecord>(Table::ACL, TOKEN_PREFIX)? {
            match from_hex(&record.secret_sha256) {
                Some(hash) => {
                    by_hash.insert(hash, record.token);
                }
                None => {
                    tracing::warn!(%key, "an ACL token record has no valid hash; it is ignored")
                }
            }
        }
        tracing::info!(tokens = by_hash.len(), "ACLs enabled");
        Ok(Self {
            store,
            by_hash: RwLock::new(by_hash),
            writes: Mutex::new(()),
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<Hash, AclToken>> {
        self.by_hash.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.writes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new token's record and its secret (not stored).
    fn mint(name: String, policies: Vec<Policy>) -> (TokenRecord, SecretId) {
        let secret = SecretId::new(uuid::Uuid::new_v4().to_string());
        let token = AclToken {
            accessor_id: uuid::Uuid::new_v4().to_string(),
            name,
            policies,
            create_time: crate::now_ms(),
        };
        let record = TokenRecord {
            token,
            secret_sha256: to_hex(&hash(secret.expose())),
        };
        (record, secret)
    }

    /// Keeps `record` in memory once it is stored; the token made, with its secret.
    fn remember(&self, record: TokenRecord, secret: SecretId) -> NewToken {
        let hash = hash(secret.expose());
        self.by_hash
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(hash, record.token.clone());
        tracing::info!(
            accessor_id = %record.token.accessor_id,
            name = %berth_input::Shown(&record.token.name),
            policies = %record
                .token
                .policies
                .iter()
                .map(|p| p.name())
                .collect::<Vec<_>>()
                .join(","),
            "ACL token created"
        );
        NewToken {
            token: record.token,
            secret_id: secret,
        }
    }
}

impl AclStore for AclTokens {
    fn resolve(&self, secret: &str) -> Option<AclToken> {
        self.read().get(&hash(secret)).cloned()
    }

    fn bootstrap(&self) -> Result<NewToken, ApiError> {
        let _guard = self.write_lock();
        let done: Option<BootstrapRecord> = self
            .store
            .get(Table::ACL, BOOTSTRAP_KEY)
            .map_err(internal)?;
        if done.is_some() {
            return Err(ApiError::Conflict(
                "ACLs are already bootstrapped: ask the holder of a management token for a \
                 token (berth acl token create)"
                    .into(),
            ));
        }
        let (record, secret) = Self::mint(BOOTSTRAP_NAME.into(), vec![Policy::Management]);
        let marker = BootstrapRecord {
            accessor_id: record.token.accessor_id.clone(),
            time: record.token.create_time,
        };
        let key = token_key(&record.token.accessor_id);
        let items = [
            (BOOTSTRAP_KEY, serde_json::to_value(&marker).map_err(json)?),
            (key.as_str(), serde_json::to_value(&record).map_err(json)?),
        ];
        let items: Vec<(&str, &serde_json::Value)> = items.iter().map(|(k, v)| (*k, v)).collect();
        self.store.put_all(Table::ACL, &items).map_err(internal)?;
        Ok(self.remember(record, secret))
    }

    fn create(&self, req: TokenCreateRequest) -> Result<NewToken, ApiError> {
        let _guard = self.write_lock();
        let (record, secret) = Self::mint(req.name, req.policies);
        self.store
            .put(Table::ACL, &token_key(&record.token.accessor_id), &record)
            .map_err(internal)?;
        Ok(self.remember(record, secret))
    }

    fn list(&self) -> Result<Vec<AclToken>, ApiError> {
        Ok(self.read().values().cloned().collect())
    }

    fn delete(&self, accessor_id: &str) -> Result<(), ApiError> {
        let _guard = self.write_lock();
        let (hash, token) = {
            let tokens = self.read();
            let Some((hash, token)) = tokens.iter().find(|(_, t)| t.accessor_id == accessor_id)
            else {
                return Err(ApiError::NotFound(format!(
                    "no ACL token with accessor id {}",
                    berth_input::quoted(accessor_id)
                )));
            };
            let managers = tokens
                .values()
                .filter(|t| t.policies.contains(&Policy::Management))
                .count();
            if token.policies.contains(&Policy::Management) && managers == 1 {
                return Err(ApiError::Conflict(
                    "refusing to delete the last management token: nobody could manage tokens \
                     afterwards (bootstrap works once)"
                        .into(),
                ));
            }
            (*hash, token.clone())
        };
        self.store
            .delete(Table::ACL, &token_key(accessor_id))
            .map_err(internal)?;
        self.by_hash
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&hash);
        tracing::info!(accessor_id = %token.accessor_id, "ACL token deleted");
        Ok(())
    }
}

/// Binds the API's listeners as `opts` say (TLS on TCP, the socket's group) and loads the ACL
/// tokens when ACLs are on. A TCP address beyond loopback is refused unless it has TLS and
/// ACLs are on, whatever built `opts`.
pub(crate) fn listen(
    opts: &AgentOptions,
    socket: &Path,
    store: &Arc<Store>,
) -> Result<(Listeners, Option<Arc<AclTokens>>), AgentError> {
    if let Some(addr) = opts.api_address
        && !addr.ip().is_loopback()
        && !opts.acl
    {
        return Err(AgentError::OpenWithoutAcl(addr));
    }
    let acl = if opts.acl {
        Some(Arc::new(AclTokens::load(Arc::clone(store))?))
    } else {
        None
    };
    let tls = match &opts.api_tls {
        Some(t) => Some(ServerTls::load(&t.cert_file, &t.key_file)?),
        None => None,
    };
    let options = ListenOptions {
        tls,
        socket_group: opts.api_socket_group.as_ref().map(|g| g.gid),
    };
    let listeners = Listeners::bind_with(socket, opts.api_address, options)?;
    if let Some(addr) = listeners.tcp_addr() {
        tracing::info!(%addr, tls = opts.api_tls.is_some(), "API listening on TCP");
    }
    Ok((listeners, acl))
}

fn token_key(accessor_id: &str) -> String {
    format!("{TOKEN_PREFIX}{accessor_id}")
}

fn hash(secret: &str) -> Hash {
    let digest = ring::digest::digest(&ring::digest::SHA256, secret.as_bytes());
    let mut out = [0; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(text: &str) -> Option<Hash> {
    if text.len() != 64 {
        return None;
    }
    let mut out = [0; 32];
    for (i, slot) in out.iter_mut().enumerate() {
        *slot = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn internal(e: StateError) -> ApiError {
    ApiError::Internal(format!("ACL store: {e}"))
}

fn json(e: serde_json::Error) -> ApiError {
    ApiError::Internal(format!("ACL store: cannot encode a record: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &std::path::Path) -> AclTokens {
        let store = Arc::new(Store::open(dir.join("state.redb")).unwrap());
        AclTokens::load(store).unwrap()
    }

    #[test]
    fn tokens_survive_a_reload_and_only_their_hash_is_stored() {
        let dir = tempfile::tempdir().unwrap();
        let acl = open(dir.path());
        let boot = acl.bootstrap().unwrap();
        assert_eq!(boot.token.policies, vec![Policy::Management]);
        let ops = acl
            .create(TokenCreateRequest {
                name: "ops".into(),
                policies: vec![Policy::JobOperator],
            })
            .unwrap();
        assert_eq!(
            acl.resolve(ops.secret_id.expose()).unwrap().accessor_id,
            ops.token.accessor_id
        );
        assert!(matches!(acl.bootstrap(), Err(ApiError::Conflict(_))));
        drop(acl);

        let bytes = std::fs::read(dir.path().join("state.redb")).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        for secret in [&boot.secret_id, &ops.secret_id] {
            assert!(!text.contains(secret.expose()), "a secret is in the store");
        }
        let acl = open(dir.path());
        assert_eq!(acl.list().unwrap().len(), 2);
        let me = acl.resolve(boot.secret_id.expose()).expect("still valid");
        assert_eq!(me, boot.token);
        assert!(
            matches!(acl.bootstrap(), Err(ApiError::Conflict(_))),
            "bootstrap stays done across restarts"
        );
        assert!(acl.resolve(&uuid::Uuid::new_v4().to_string()).is_none());
    }

    #[test]
    fn delete_revokes_but_keeps_the_last_management_token() {
        let dir = tempfile::tempdir().unwrap();
        let acl = open(dir.path());
        let boot = acl.bootstrap().unwrap();
        let reader = acl
            .create(TokenCreateRequest {
                name: "r".into(),
                policies: vec![Policy::Read],
            })
            .unwrap();
        acl.delete(&reader.token.accessor_id).unwrap();
        assert!(acl.resolve(reader.secret_id.expose()).is_none());
        assert!(matches!(
            acl.delete(&reader.token.accessor_id),
            Err(ApiError::NotFound(_))
        ));
        assert!(matches!(
            acl.delete(&boot.token.accessor_id),
            Err(ApiError::Conflict(_))
        ));
        let second = acl
            .create(TokenCreateRequest {
                name: "m2".into(),
                policies: vec![Policy::Management],
            })
            .unwrap();
        acl.delete(&boot.token.accessor_id).unwrap();
        assert!(acl.resolve(boot.secret_id.expose()).is_none());
        assert!(acl.resolve(second.secret_id.expose()).is_some());
        drop(acl);
        let acl = open(dir.path());
        assert_eq!(acl.list().unwrap(), vec![second.token]);
    }

    #[test]
    fn hex_round_trips() {
        let h = hash("x");
        assert_eq!(from_hex(&to_hex(&h)), Some(h));
        assert_eq!(from_hex("zz"), None);
        assert_eq!(from_hex(&"g".repeat(64)), None);
    }
}
