//! Errors of this crate. None of them carries key material or a whole token: they name the
//! operation, the key id or the field, and chain the cause where the cause is safe to print.

use std::path::PathBuf;

/// A [`KeyStore`](crate::KeyStore) could not read or write the key set.
#[derive(Debug, thiserror::Error)]
pub enum KeyStoreError {
    /// A file operation of [`FileKeyStore`](crate::FileKeyStore) failed.
    #[error("key store file {}: {op} failed", path.display())]
    Io {
        /// The file (or its temporary sibling) involved.
        path: PathBuf,
        /// What was being done: "read", "create", "write", "sync", "rename"...
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// Any other backend (the agent's database, a test double) failed.
    #[error("key store backend failed: {what}")]
    Backend {
        /// What the backend was doing.
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Failures of [`Signer`](crate::Signer) operations.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// Reading the key set from its store failed.
    #[error("loading the signing key set failed")]
    Load(#[source] KeyStoreError),
    /// Writing the key set to its store failed; the signer kept its previous keys.
    #[error("saving the signing key set failed; the previous keys stay in use")]
    Save(#[source] KeyStoreError),
    /// The stored key set could not be used. It was left exactly as found.
    #[error("stored signing key set is unusable ({reason}); it was left untouched")]
    Corrupt {
        /// What is wrong, without any stored bytes.
        reason: String,
    },
    /// The random generator could not produce a new key pair.
    #[error("generating a new ES256 signing key failed")]
    KeyGeneration,
    /// The rotation policy cannot be honoured.
    #[error("invalid key rotation policy: {reason}")]
    InvalidRotation {
        /// Which setting is wrong.
        reason: &'static str,
    },
    /// Serializing the claims or computing the signature failed.
    #[error("signing a token with key {kid} failed")]
    Sign {
        /// The key that was to sign.
        kid: String,
        #[source]
        source: jsonwebtoken::errors::Error,
    },
    /// A token was refused by [`Signer::verify`](crate::Signer::verify).
    #[error(transparent)]
    Refused(#[from] VerifyError),
}

/// Why a token was refused. The token itself is never repeated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// Not a compact JWS, or its header or claims are not the JSON expected.
    #[error("token is malformed")]
    Malformed,
    /// The header names no key id.
    #[error("token header has no key id (kid)")]
    MissingKeyId,
    /// The header names another algorithm than ES256.
    #[error("token algorithm is not ES256")]
    WrongAlgorithm,
    /// No key of the JWKS has this id (never issued here, or retired and dropped).
    #[error("token key id {kid:?} is not in the key set")]
    UnknownKey {
        /// The key id from the header, cut to 64 characters.
        kid: String,
    },
    /// The signature does not match the header and claims.
    #[error("token signature is invalid")]
    BadSignature,
    /// The token is not meant for the expected audience.
    #[error("token audience does not include {expected:?}")]
    WrongAudience {
        /// The audience the verifier asked for.
        expected: String,
    },
    /// The token has expired.
    #[error("token expired")]
    Expired,
    /// The token is not valid yet (its `nbf` is in the future).
    #[error("token is not valid yet")]
    NotYetValid,
}
