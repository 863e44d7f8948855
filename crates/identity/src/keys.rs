//! ES256 signing keys and the key set as it is stored.
//!
//! Stored form (JSON, version 1):
//! `{"version":1,"keys":[{"kid":"…","pkcs8":"<base64 PKCS#8 DER>","created_ms":…,"retired_ms":…}]}`
//! where `retired_ms` is left out for the one active key.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::jwk::{Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey};
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
use serde::{Deserialize, Serialize};

use crate::b64;
use crate::error::IdentityError;

/// The version of the stored JSON this build writes and reads.
pub const KEY_SET_VERSION: u32 = 1;

const KID_BYTES: usize = 8;
const MAX_KID_LEN: usize = 64;

/// Private key bytes: never printed, zeroed when dropped.
struct SecretBytes(Vec<u8>);

impl fmt::Debug for SecretBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Drop for SecretBytes {
    fn drop(&mut self) {
        self.0.fill(0);
        std::hint::black_box(&self.0);
    }
}

/// Everything derived from one private key.
struct KeyMaterial {
    pkcs8: SecretBytes,
    encoding: EncodingKey,
    decoding: DecodingKey,
    jwk: Jwk,
}

impl KeyMaterial {
    /// Checks that `der` is a consistent P-256 PKCS#8 private key and prepares it for use.
    fn from_pkcs8(kid: &str, der: Vec<u8>) -> Result<Self, &'static str> {
        let pkcs8 = SecretBytes(der);
        EcdsaKeyPair::from_pkcs8(
            &ECDSA_P256_SHA256_FIXED_SIGNING,
            &pkcs8.0,
            &SystemRandom::new(),
        )
        .map_err(|_| "not a P-256 PKCS#8 private key")?;
        let encoding = EncodingKey::from_ec_der(&pkcs8.0);
        let mut jwk = Jwk::from_encoding_key(&encoding, Algorithm::ES256)
            .map_err(|_| "its public key cannot be derived")?;
        jwk.common.key_id = Some(kid.to_owned());
        jwk.common.public_key_use = Some(PublicKeyUse::Signature);
        let decoding = DecodingKey::from_jwk(&jwk).map_err(|_| "its public key is unusable")?;
        Ok(Self {
            pkcs8,
            encoding,
            decoding,
            jwk,
        })
    }
}

/// One key of the set. Cheap to clone; its private half is never exposed or printed.
#[derive(Clone)]
pub struct StoredKey {
    kid: String,
    created_ms: u64,
    retired_ms: Option<u64>,
    material: Arc<KeyMaterial>,
}

impl StoredKey {
    /// The key id, as written in token headers and the JWKS.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// When the key was made, milliseconds since the Unix epoch.
    pub fn created_ms(&self) -> u64 {
        self.created_ms
    }

    /// When the key stopped signing, if it did.
    pub fn retired_ms(&self) -> Option<u64> {
        self.retired_ms
    }

    /// Whether this is the key that signs new tokens.
    pub fn is_active(&self) -> bool {
        self.retired_ms.is_none()
    }

    /// The public key as a JWK (`kty` EC, `crv` P-256, `alg` ES256, `use` sig, `kid`).
    pub fn jwk(&self) -> &Jwk {
        &self.material.jwk
    }

    pub(crate) fn encoding_key(&self) -> &EncodingKey {
        &self.material.encoding
    }

    pub(crate) fn decoding_key(&self) -> &DecodingKey {
        &self.material.decoding
    }
}

impl fmt::Debug for StoredKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredKey")
            .field("kid", &self.kid)
            .field("created_ms", &self.created_ms)
            .field("retired_ms", &self.retired_ms)
            .field("pkcs8", &self.material.pkcs8)
            .finish()
    }
}

/// The key set: exactly one active key plus the retired keys still kept for verification.
#[derive(Clone)]
pub struct StoredKeySet {
    keys: Vec<StoredKey>,
}

impl fmt::Debug for StoredKeySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredKeySet")
            .field("keys", &self.keys)
            .finish()
    }
}

#[derive(Serialize, Deserialize)]
struct KeySetRecord {
    version: u32,
    keys: Vec<KeyRecord>,
}

#[derive(Serialize, Deserialize)]
struct KeyRecord {
    kid: String,
    pkcs8: String,
    created_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    retired_ms: Option<u64>,
}

fn corrupt(reason: impl Into<String>) -> IdentityError {
    IdentityError::Corrupt {
        reason: reason.into(),
    }
}

impl StoredKeySet {
    /// A set holding one new active key created at `now`.
    pub(crate) fn generate(now: SystemTime) -> Result<Self, IdentityError> {
        let mut set = Self { keys: Vec::new() };
        set.keys.push(set.new_key(now)?);
        Ok(set)
    }

    /// Parses and checks the stored JSON: the version, every key (id, base64, a consistent
    /// P-256 PKCS#8 key), unique ids and exactly one active key. Errors name the key id or
    /// the JSON position, never the bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, IdentityError> {
        let record: KeySetRecord = serde_json::from_slice(bytes).map_err(|e| {
            let what = match e.classify() {
                serde_json::error::Category::Io => "unreadable",
                serde_json::error::Category::Syntax => "not valid JSON",
                serde_json::error::Category::Data => "JSON of the wrong shape",
                serde_json::error::Category::Eof => "truncated JSON",
            };
            corrupt(format!("{what} at line {} column {}", e.line(), e.column()))
        })?;
        if record.version != KEY_SET_VERSION {
            return Err(corrupt(format!(
                "version {} is not supported (this build reads {KEY_SET_VERSION})",
                record.version
            )));
        }
        if record.keys.is_empty() {
            return Err(corrupt("it holds no keys"));
        }
        let mut seen = HashSet::new();
        let mut keys = Vec::with_capacity(record.keys.len());
        for (index, key) in record.keys.into_iter().enumerate() {
            if !valid_kid(&key.kid) {
                return Err(corrupt(format!("key #{index} has an invalid kid")));
            }
            if !seen.insert(key.kid.clone()) {
                return Err(corrupt(format!("kid {} appears twice", key.kid)));
            }
            let der = b64::decode(&key.pkcs8)
                .map_err(|_| corrupt(format!("key {}: pkcs8 is not valid base64", key.kid)))?;
            let material = KeyMaterial::from_pkcs8(&key.kid, der)
                .map_err(|why| corrupt(format!("key {}: {why}", key.kid)))?;
            keys.push(StoredKey {
                kid: key.kid,
                created_ms: key.created_ms,
                retired_ms: key.retired_ms,
                material: Arc::new(material),
            });
        }
        match keys.iter().filter(|k| k.is_active()).count() {
            1 => Ok(Self { keys }),
            0 => Err(corrupt("no key is active")),
            n => Err(corrupt(format!("{n} keys are active, expected one"))),
        }
    }

    /// The stored JSON. It holds the private keys: it goes only to a [`KeyStore`](crate::KeyStore).
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let record = KeySetRecord {
            version: KEY_SET_VERSION,
            keys: self
                .keys
                .iter()
                .map(|k| KeyRecord {
                    kid: k.kid.clone(),
                    pkcs8: b64::encode(&k.material.pkcs8.0),
                    created_ms: k.created_ms,
                    retired_ms: k.retired_ms,
                })
                .collect(),
        };
        let out = serde_json::to_vec(&record).unwrap_or_default();
        for key in record.keys {
            let mut text = key.pkcs8.into_bytes();
            text.fill(0);
            std::hint::black_box(&text);
        }
        out
    }

    /// Every key, oldest first.
    pub fn keys(&self) -> &[StoredKey] {
        &self.keys
    }

    /// The key that signs new tokens.
    pub fn active(&self) -> &StoredKey {
        self.keys
            .iter()
            .find(|k| k.is_active())
            .unwrap_or(&self.keys[0])
    }

    /// The key with this id, active or retired.
    pub fn find(&self, kid: &str) -> Option<&StoredKey> {
        self.keys.iter().find(|k| k.kid == kid)
    }

    /// Retires the active key at `now` and makes a new active one; returns its id.
    pub(crate) fn rotate(&mut self, now: SystemTime) -> Result<String, IdentityError> {
        let fresh = self.new_key(now)?;
        let now_ms = unix_ms(now);
        for key in &mut self.keys {
            if key.retired_ms.is_none() {
                key.retired_ms = Some(now_ms);
            }
        }
        let kid = fresh.kid.clone();
        self.keys.push(fresh);
        Ok(kid)
    }

    /// Drops retired keys retired at least `keep_ms` before `now`; returns their ids.
    pub(crate) fn prune(&mut self, now: SystemTime, keep_ms: u64) -> Vec<String> {
        let now_ms = unix_ms(now);
        let mut dropped = Vec::new();
        self.keys.retain(|k| match k.retired_ms {
            Some(retired) if now_ms >= retired.saturating_add(keep_ms) => {
                dropped.push(k.kid.clone());
                false
            }
            _ => true,
        });
        dropped
    }

    fn new_key(&self, now: SystemTime) -> Result<StoredKey, IdentityError> {
        let kid = loop {
            let kid = hex(&rand::random::<[u8; KID_BYTES]>());
            if self.find(&kid).is_none() {
                break kid;
            }
        };
        let document =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &SystemRandom::new())
                .map_err(|_| IdentityError::KeyGeneration)?;
        let material = KeyMaterial::from_pkcs8(&kid, document.as_ref().to_vec())
            .map_err(|_| IdentityError::KeyGeneration)?;
        Ok(StoredKey {
            kid,
            created_ms: unix_ms(now),
            retired_ms: None,
            material: Arc::new(material),
        })
    }
}

fn valid_kid(kid: &str) -> bool {
    !kid.is_empty()
        && kid.len() <= MAX_KID_LEN
        && kid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// Milliseconds since the Unix epoch; 0 before it, saturating far after it.
pub(crate) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    #[test]
    fn generated_set_round_trips_through_bytes() {
        let set = StoredKeySet::generate(at(1_000)).unwrap();
        let again = StoredKeySet::from_bytes(&set.to_bytes()).unwrap();
        assert_eq!(again.keys().len(), 1);
        assert_eq!(again.active().kid(), set.active().kid());
        assert_eq!(again.active().created_ms(), 1_000);
        assert_eq!(again.active().jwk(), set.active().jwk());
        assert_eq!(set.active().kid().len(), KID_BYTES * 2);
    }

    #[test]
    fn debug_shows_no_key_bytes_in_any_encoding() {
        let set = StoredKeySet::generate(at(0)).unwrap();
        let der = set.active().material.pkcs8.0.clone();
        let shown = format!("{set:?} {:?}", set.active());
        assert!(shown.contains(set.active().kid()));
        assert!(shown.contains("<redacted>"));
        assert!(!shown.contains(&b64::encode(&der)));
        assert!(!shown.contains(&hex(&der)));
        assert!(!shown.contains(&format!("{der:?}")));
        // The private scalar sits after the fixed PKCS#8 prefix.
        assert!(!shown.contains(&format!("{:?}", &der[36..68])[1..40]));
    }

    #[test]
    fn rotate_and_prune_keep_exactly_one_active_key() {
        let mut set = StoredKeySet::generate(at(0)).unwrap();
        let first = set.active().kid().to_owned();
        let second = set.rotate(at(10)).unwrap();
        assert_ne!(first, second);
        assert_eq!(set.active().kid(), second);
        assert_eq!(set.find(&first).unwrap().retired_ms(), Some(10));
        assert!(set.prune(at(19), 10).is_empty());
        assert_eq!(set.prune(at(20), 10), vec![first]);
        assert_eq!(set.keys().len(), 1);
    }

    #[test]
    fn invalid_sets_are_refused_with_a_reason() {
        let good = StoredKeySet::generate(at(0)).unwrap();
        let mut value: serde_json::Value = serde_json::from_slice(&good.to_bytes()).unwrap();
        let reason =
            |v: &serde_json::Value| match StoredKeySet::from_bytes(&serde_json::to_vec(v).unwrap())
            {
                Err(IdentityError::Corrupt { reason }) => reason,
                other => panic!("expected Corrupt, got {other:?}"),
            };

        let mut v = value.clone();
        v["version"] = 2.into();
        assert!(reason(&v).contains("version 2"));

        let mut v = value.clone();
        v["keys"][0]["retired_ms"] = 5.into();
        assert_eq!(reason(&v), "no key is active");

        let mut v = value.clone();
        v["keys"][0]["pkcs8"] = "not base64!".into();
        assert!(reason(&v).contains("not valid base64"));

        let mut v = value.clone();
        v["keys"][0]["pkcs8"] = b64::encode(b"0123456789").into();
        assert!(reason(&v).contains("not a P-256 PKCS#8"));

        let mut v = value.clone();
        v["keys"][0]["kid"] = "../x".into();
        assert!(reason(&v).contains("invalid kid"));

        let key = value["keys"][0].clone();
        value["keys"].as_array_mut().unwrap().push(key);
        assert!(reason(&value).contains("appears twice"));

        assert!(matches!(
            StoredKeySet::from_bytes(b"{\"version\":1,"),
            Err(IdentityError::Corrupt { reason }) if reason.starts_with("truncated JSON")
        ));
    }
}
