//! The signer: signs identities with the active key, rotates keys, serves and checks the JWKS.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, Header, Validation};

use crate::claims::Claims;
use crate::error::{IdentityError, VerifyError};
use crate::keys::{StoredKey, StoredKeySet, unix_ms};
use crate::store::KeyStore;

/// Clock skew tolerated by [`Signer::verify`] on `exp` and `nbf`, in seconds.
pub const VERIFY_LEEWAY_SECS: u64 = 60;

/// When keys are replaced and how long replaced keys still verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    /// The active key is replaced once it is this old. Must be more than zero.
    pub rotate_every: Duration,
    /// A replaced key stays in the JWKS this long, so tokens it signed keep verifying. Make it
    /// at least the longest identity ttl handed out.
    pub keep_retired_for: Duration,
}

impl Default for Rotation {
    /// 30 days each (Nomad rotates its root key every 30 days by default).
    fn default() -> Self {
        let thirty_days = Duration::from_secs(30 * 24 * 3600);
        Self {
            rotate_every: thirty_days,
            keep_retired_for: thirty_days,
        }
    }
}

/// What a rotation changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RotationReport {
    /// The id of the new active key, if one was made.
    pub new_kid: Option<String>,
    /// Retired keys dropped from the set (they no longer verify anything).
    pub dropped: Vec<String>,
}

impl RotationReport {
    /// Whether the key set changed (and was saved).
    pub fn changed(&self) -> bool {
        self.new_kid.is_some() || !self.dropped.is_empty()
    }
}

struct Inner {
    store: Box<dyn KeyStore>,
    rotation: Rotation,
    /// Serializes changes to the key set (held across the store write).
    writer: Mutex<()>,
    /// The current key set; held only long enough to read or swap it.
    keys: Mutex<StoredKeySet>,
}

/// Signs workload identities with ES256 and publishes the keys that verify them.
///
/// Every method takes `&self`; clones share the same keys and store, so a `Signer` can be
/// handed to many tasks. Private keys never leave it except, serialized, to its [`KeyStore`].
#[derive(Clone)]
pub struct Signer {
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every change swaps a complete value in, so a poisoned lock still guards a whole set.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn wipe(mut bytes: Vec<u8>) {
    bytes.fill(0);
    std::hint::black_box(&bytes);
}

impl Signer {
    /// Opens the signer over `store`, as of the current time. See [`Signer::open_at`].
    pub fn open<S: KeyStore + 'static>(
        store: S,
        rotation: Rotation,
    ) -> Result<Self, IdentityError> {
        Self::open_at(store, rotation, SystemTime::now())
    }

    /// Loads the key set from `store`; when the store is empty, makes a first key (created
    /// `now`) and saves it before returning. A store that holds anything unusable gives
    /// [`IdentityError::Corrupt`] and is never written. Opening does not rotate: call
    /// [`Signer::rotate_if_due`] for that.
    pub fn open_at<S: KeyStore + 'static>(
        store: S,
        rotation: Rotation,
        now: SystemTime,
    ) -> Result<Self, IdentityError> {
        if rotation.rotate_every.is_zero() {
            return Err(IdentityError::InvalidRotation {
                reason: "rotate_every must be more than zero",
            });
        }
        let keys = match store.load().map_err(IdentityError::Load)? {
            Some(bytes) => {
                let parsed = StoredKeySet::from_bytes(&bytes);
                wipe(bytes);
                parsed?
            }
            None => {
                let fresh = StoredKeySet::generate(now)?;
                let bytes = fresh.to_bytes();
                let saved = store.save(&bytes);
                wipe(bytes);
                saved.map_err(IdentityError::Save)?;
                fresh
            }
        };
        Ok(Self {
            inner: Arc::new(Inner {
                store: Box::new(store),
                rotation,
                writer: Mutex::new(()),
                keys: Mutex::new(keys),
            }),
        })
    }

    /// The rotation policy this signer was opened with.
    pub fn rotation(&self) -> Rotation {
        self.inner.rotation
    }

    /// The id of the key that signs new tokens.
    pub fn active_kid(&self) -> String {
        lock(&self.inner.keys).active().kid().to_owned()
    }

    /// A snapshot of the key set (ids, ages, public keys; private halves stay hidden).
    pub fn key_set(&self) -> StoredKeySet {
        lock(&self.inner.keys).clone()
    }

    /// Signs `claims` with the active key: header `alg` ES256, `typ` JWT, `kid` the key's id.
    /// The claims are signed as given (build them with [`ClaimsBuilder`](crate::ClaimsBuilder)).
    pub fn sign(&self, claims: &Claims) -> Result<String, IdentityError> {
        let key: StoredKey = lock(&self.inner.keys).active().clone();
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(key.kid().to_owned());
        jsonwebtoken::encode(&header, claims, key.encoding_key()).map_err(|source| {
            IdentityError::Sign {
                kid: key.kid().to_owned(),
                source,
            }
        })
    }

    /// Makes a new active key if the active one is at least `rotate_every` old at `now`, then
    /// drops retired keys retired at least `keep_retired_for` before `now`. A changed set is
    /// saved before it is used; if the save fails the signer keeps its previous keys.
    /// Call it periodically; nothing rotates on its own.
    pub fn rotate_if_due(&self, now: SystemTime) -> Result<RotationReport, IdentityError> {
        self.update(now, false)
    }

    /// Like [`Signer::rotate_if_due`], but always makes a new active key (an operator's
    /// "rotate now").
    pub fn rotate_now(&self, now: SystemTime) -> Result<RotationReport, IdentityError> {
        self.update(now, true)
    }

    fn update(&self, now: SystemTime, force: bool) -> Result<RotationReport, IdentityError> {
        let _writer = lock(&self.inner.writer);
        let mut next = self.key_set();
        let mut report = RotationReport::default();
        let age_ms = unix_ms(now).saturating_sub(next.active().created_ms());
        if force || age_ms >= duration_ms(self.inner.rotation.rotate_every) {
            report.new_kid = Some(next.rotate(now)?);
        }
        report.dropped = next.prune(now, duration_ms(self.inner.rotation.keep_retired_for));
        if report.changed() {
            let bytes = next.to_bytes();
            let saved = self.inner.store.save(&bytes);
            wipe(bytes);
            saved.map_err(IdentityError::Save)?;
            *lock(&self.inner.keys) = next;
        }
        Ok(report)
    }

    /// The public keys that verify tokens: the active key first, then retired keys still
    /// kept, newest first (retired keys leave it when [`Signer::rotate_if_due`] drops them).
    /// Serialized, this is the body of `/.well-known/jwks.json`.
    pub fn jwks(&self) -> JwkSet {
        let set = self.key_set();
        let mut keys: Vec<&StoredKey> = set.keys().iter().collect();
        keys.sort_by_key(|k| std::cmp::Reverse(k.retired_ms().unwrap_or(u64::MAX)));
        JwkSet {
            keys: keys.into_iter().map(|k| k.jwk().clone()).collect(),
        }
    }

    /// [`Signer::jwks`] as JSON: `{"keys":[{"kty":"EC","crv":"P-256","x":…,"y":…,"kid":…,
    /// "alg":"ES256","use":"sig"}]}`.
    pub fn jwks_json(&self) -> serde_json::Value {
        serde_json::to_value(self.jwks()).unwrap_or(serde_json::Value::Null)
    }

    /// Checks `token` against the JWKS as of the current time. See [`Signer::verify_at`].
    pub fn verify(&self, token: &str, audience: &str) -> Result<Claims, VerifyError> {
        self.verify_at(token, audience, SystemTime::now())
    }

    /// Accepts `token` only if it is an ES256 JWT signed by a key of the JWKS (named by its
    /// `kid`), `audience` is among its `aud`, and at `now` it is neither expired nor early
    /// (allowing [`VERIFY_LEEWAY_SECS`] of skew). Returns its claims.
    pub fn verify_at(
        &self,
        token: &str,
        audience: &str,
        now: SystemTime,
    ) -> Result<Claims, VerifyError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| VerifyError::Malformed)?;
        if header.alg != Algorithm::ES256 {
            return Err(VerifyError::WrongAlgorithm);
        }
        let kid = header.kid.ok_or(VerifyError::MissingKeyId)?;
        let key =
            lock(&self.inner.keys)
                .find(&kid)
                .cloned()
                .ok_or_else(|| VerifyError::UnknownKey {
                    kid: kid.chars().take(64).collect(),
                })?;

        let mut validation = Validation::new(Algorithm::ES256);
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.leeway = 0;
        validation.set_required_spec_claims(&["aud", "sub"]);
        validation.set_audience(&[audience]);
        let wrong_audience = || VerifyError::WrongAudience {
            expected: audience.to_owned(),
        };
        let claims = jsonwebtoken::decode::<Claims>(token, key.decoding_key(), &validation)
            .map_err(|e| match e.kind() {
                ErrorKind::InvalidSignature => VerifyError::BadSignature,
                ErrorKind::InvalidAudience | ErrorKind::MissingRequiredClaim(_) => wrong_audience(),
                ErrorKind::InvalidAlgorithm => VerifyError::WrongAlgorithm,
                ErrorKind::ExpiredSignature => VerifyError::Expired,
                ErrorKind::ImmatureSignature => VerifyError::NotYetValid,
                _ => VerifyError::Malformed,
            })?
            .claims;
        if !claims.has_audience(audience) {
            return Err(wrong_audience());
        }
        let now_secs = unix_ms(now) / 1000;
        if let Some(exp) = claims.exp
            && now_secs >= exp.saturating_add(VERIFY_LEEWAY_SECS)
        {
            return Err(VerifyError::Expired);
        }
        if claims.nbf > now_secs.saturating_add(VERIFY_LEEWAY_SECS) {
            return Err(VerifyError::NotYetValid);
        }
        Ok(claims)
    }
}

impl fmt::Debug for Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys = lock(&self.inner.keys);
        let kids: Vec<&str> = keys.keys().iter().map(StoredKey::kid).collect();
        f.debug_struct("Signer")
            .field("active_kid", &keys.active().kid())
            .field("kids", &kids)
            .field("rotation", &self.inner.rotation)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ClaimsBuilder, MemoryKeyStore};
    use std::time::UNIX_EPOCH;

    fn assert_send_sync<T: Send + Sync + Clone + 'static>() {}

    #[test]
    fn signer_is_shareable_between_threads() {
        assert_send_sync::<Signer>();
        let signer = Signer::open(MemoryKeyStore::new(), Rotation::default()).unwrap();
        let claims = ClaimsBuilder::task("j", "g", "a", "t")
            .audience("consul.io")
            .build(SystemTime::now());
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (signer, claims) = (signer.clone(), claims.clone());
                std::thread::spawn(move || signer.sign(&claims).unwrap())
            })
            .collect();
        for handle in handles {
            let token = handle.join().unwrap();
            assert_eq!(signer.verify(&token, "consul.io").unwrap(), claims);
        }
    }

    #[test]
    fn zero_rotate_every_is_refused() {
        let rotation = Rotation {
            rotate_every: Duration::ZERO,
            keep_retired_for: Duration::ZERO,
        };
        let store = MemoryKeyStore::new();
        let err = Signer::open(store.clone(), rotation).unwrap_err();
        assert!(matches!(err, IdentityError::InvalidRotation { .. }));
        assert_eq!(store.bytes(), None);
    }

    #[test]
    fn expiry_and_not_before_are_checked_against_now_with_leeway() {
        let t0 = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let signer = Signer::open_at(MemoryKeyStore::new(), Rotation::default(), t0).unwrap();
        let claims = ClaimsBuilder::task("j", "g", "a", "t")
            .audience("consul.io")
            .ttl(Some(Duration::from_secs(600)))
            .build(t0);
        let token = signer.sign(&claims).unwrap();
        let secs = |s| t0 + Duration::from_secs(s);
        assert!(signer.verify_at(&token, "consul.io", secs(600)).is_ok());
        assert!(signer.verify_at(&token, "consul.io", secs(659)).is_ok());
        assert_eq!(
            signer.verify_at(&token, "consul.io", secs(660)),
            Err(VerifyError::Expired)
        );
        let early = t0 - Duration::from_secs(VERIFY_LEEWAY_SECS + 1);
        assert_eq!(
            signer.verify_at(&token, "consul.io", early),
            Err(VerifyError::NotYetValid)
        );
    }

    #[test]
    fn a_failed_save_keeps_the_previous_keys() {
        let t0 = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let store = MemoryKeyStore::new();
        let signer = Signer::open_at(store.clone(), Rotation::default(), t0).unwrap();
        let before = signer.active_kid();
        let stored = store.bytes();
        store.fail_saves(true);
        let err = signer.rotate_now(t0).unwrap_err();
        assert!(matches!(err, IdentityError::Save(_)), "{err:?}");
        assert_eq!(signer.active_kid(), before);
        assert_eq!(signer.key_set().keys().len(), 1);
        assert_eq!(store.bytes(), stored);
    }
}
