//! Workload identities as Nomad signs them.
//!
//! A [`Signer`] holds the agent's ES256 (ECDSA P-256) signing keys, kept in a [`KeyStore`] and
//! rotated on a [`Rotation`] policy. It signs [`Claims`] built with a [`ClaimsBuilder`] (Nomad's
//! claim names and subject), publishes the public keys as a JWKS for
//! `/.well-known/jwks.json`, and verifies tokens against that JWKS.
//!
//! Private keys never appear in `Debug` output or errors; only the store sees them, serialized.

mod b64;
mod claims;
mod error;
mod keys;
mod signer;
mod store;

pub use claims::{
    CONSUL_AUDIENCE, Claims, ClaimsBuilder, DEFAULT_IDENTITY_NAME, DEFAULT_NAMESPACE,
    DEFAULT_REGION,
};
pub use error::{IdentityError, KeyStoreError, VerifyError};
pub use jsonwebtoken::jwk::{Jwk, JwkSet};
pub use keys::{KEY_SET_VERSION, StoredKey, StoredKeySet};
pub use signer::{Rotation, RotationReport, Signer, VERIFY_LEEWAY_SECS};
pub use store::{FileKeyStore, KeyStore, MemoryKeyStore};

/// The path where the JWKS is served.
pub const JWKS_PATH: &str = "/.well-known/jwks.json";
