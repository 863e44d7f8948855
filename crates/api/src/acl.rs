//! ACL tokens: what `/v1/acl/…` takes and answers, and the built-in policies a token holds.
//!
//! With ACLs on (agent config `acl { enabled = true }`), every request but the public ones
//! sends a token's secret in the [`TOKEN_HEADER`] header; which policy a route needs is
//! decided by [`crate::server::required_access`]. The secret is shown once, when the token is
//! made ([`NewToken`]); the agent keeps only its SHA-256 hash.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};

use crate::types::InvalidField;

/// The header that carries a token's secret id.
pub const TOKEN_HEADER: &str = "X-Berth-Token";

/// Longest token name, in bytes.
pub const MAX_TOKEN_NAME: usize = 128;

/// A built-in policy. Each one includes `read`; `management` includes everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Every `GET` and `HEAD`.
    Read,
    /// `read`, and writes to jobs and allocs (run, plan, stop, restart, signal, exec).
    JobOperator,
    /// `read`, and writes to volumes and snapshots (register, create, delete, claim, release,
    /// detach, expand, snapshot).
    VolumeOperator,
    /// Everything: ACL tokens, plugin registration, node drain, and any write no other policy
    /// names.
    Management,
}

impl Policy {
    /// Every policy, weakest first.
    pub const ALL: [Policy; 4] = [
        Policy::Read,
        Policy::JobOperator,
        Policy::VolumeOperator,
        Policy::Management,
    ];

    /// Its name in configs, bodies and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::JobOperator => "job-operator",
            Self::VolumeOperator => "volume-operator",
            Self::Management => "management",
        }
    }

    /// Whether a holder of this policy may do what `access` needs.
    pub fn grants(self, access: Access) -> bool {
        matches!(
            (self, access),
            (_, Access::Public | Access::AnyToken | Access::Read)
                | (Self::Management, _)
                | (Self::JobOperator, Access::JobWrite)
                | (Self::VolumeOperator, Access::VolumeWrite)
        )
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown policy; the policies are {}", policy_names()))
    }
}

/// `read, job-operator, volume-operator, management`.
pub fn policy_names() -> String {
    Policy::ALL.map(Policy::name).join(", ")
}

/// What a request needs ([`crate::server::required_access`] decides it from the method and
/// the path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No token at all (bootstrap, the UI's static files, the JWK set).
    Public,
    /// Any valid token, whatever its policies (`GET /v1/acl/token/self`).
    AnyToken,
    /// `read` or any policy above it.
    Read,
    /// `job-operator` or `management`.
    JobWrite,
    /// `volume-operator` or `management`.
    VolumeWrite,
    /// `management`.
    Management,
}

impl Access {
    /// The policies that grant it, for error messages.
    pub fn granted_by(self) -> &'static str {
        match self {
            Self::Public | Self::AnyToken => "any token",
            Self::Read => "read, job-operator, volume-operator or management",
            Self::JobWrite => "job-operator or management",
            Self::VolumeWrite => "volume-operator or management",
            Self::Management => "management",
        }
    }
}

/// A token's secret id. Its `Debug` shows no part of it; it is sent in [`TOKEN_HEADER`] and
/// shown to the user once, by [`NewToken`].
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretId(String);

impl SecretId {
    /// Wraps a secret.
    pub fn new(secret: impl Into<String>) -> Self {
        Self(secret.into())
    }

    /// The secret itself, for the one place that must send or show it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretId(<hidden>)")
    }
}

impl FromStr for SecretId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.is_empty() {
            return Err("a token must not be empty".into());
        }
        // A header value: visible ASCII only (no value is repeated).
        if !s.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("a token is printable ASCII without spaces".into());
        }
        Ok(Self(s.to_string()))
    }
}

/// A token as listed: never its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclToken {
    /// The public id (a UUID): how the token is named, listed and deleted.
    pub accessor_id: String,
    /// What its holder called it.
    pub name: String,
    /// Its policies, sorted, without duplicates.
    pub policies: Vec<Policy>,
    /// When it was made, in milliseconds since the Unix epoch.
    pub create_time: u64,
}

impl AclToken {
    /// Whether one of its policies grants `access`.
    pub fn allows(&self, access: Access) -> bool {
        self.policies.iter().any(|p| p.grants(access))
    }
}

/// A token just made (`POST /v1/acl/bootstrap`, `POST /v1/acl/tokens`): the only answer that
/// holds its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewToken {
    /// The token.
    #[serde(flatten)]
    pub token: AclToken,
    /// The secret to send in [`TOKEN_HEADER`]; not shown again.
    pub secret_id: SecretId,
}

/// `GET /v1/acl/tokens`, by accessor id.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclTokenList {
    /// The tokens, without secrets.
    pub tokens: Vec<AclToken>,
}

/// `POST /v1/acl/tokens`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenCreateRequest {
    /// A name for people: 1 to [`MAX_TOKEN_NAME`] bytes without control characters.
    pub name: String,
    /// At least one policy.
    pub policies: Vec<Policy>,
}

impl TokenCreateRequest {
    /// Checks the name and that there is at least one policy (unknown policy names are
    /// refused when the body is read, naming `policies[i]`).
    pub fn validate(&self) -> Result<(), InvalidField> {
        crate::checks::printable("name", &self.name, MAX_TOKEN_NAME)?;
        if self.policies.is_empty() {
            return Err(InvalidField {
                field: "policies",
                reason: format!("give at least one of {}", policy_names()),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_grant_their_own_writes_and_every_read() {
        use Access::*;
        for p in Policy::ALL {
            assert!(
                p.grants(Read) && p.grants(AnyToken) && p.grants(Public),
                "{p}"
            );
            assert_eq!(p.grants(Management), p == Policy::Management, "{p}");
        }
        assert!(Policy::JobOperator.grants(JobWrite));
        assert!(!Policy::JobOperator.grants(VolumeWrite));
        assert!(Policy::VolumeOperator.grants(VolumeWrite));
        assert!(!Policy::VolumeOperator.grants(JobWrite));
        assert!(!Policy::Read.grants(JobWrite) && !Policy::Read.grants(VolumeWrite));
        assert!(Policy::Management.grants(JobWrite) && Policy::Management.grants(VolumeWrite));
    }

    #[test]
    fn names_round_trip_and_unknown_ones_are_refused_without_an_echo() {
        for p in Policy::ALL {
            assert_eq!(p.name().parse::<Policy>(), Ok(p));
            assert_eq!(
                serde_json::to_string(&p).unwrap(),
                format!("\"{}\"", p.name())
            );
        }
        let err = "root-canary".parse::<Policy>().unwrap_err();
        assert!(
            !err.contains("root-canary") && err.contains("job-operator"),
            "{err}"
        );
    }

    #[test]
    fn a_secret_never_shows_in_debug() {
        let secret: SecretId = "0b9f3c1e-secret-canary".parse().unwrap();
        let new = NewToken {
            token: AclToken {
                accessor_id: "a".into(),
                name: "n".into(),
                policies: vec![Policy::Read],
                create_time: 1,
            },
            secret_id: secret.clone(),
        };
        assert!(!format!("{new:?} {secret:?}").contains("canary"));
        // It is in the JSON answer, at the top level.
        let json = serde_json::to_value(&new).unwrap();
        assert_eq!(json["secret_id"], "0b9f3c1e-secret-canary");
        assert_eq!(json["accessor_id"], "a");
        assert!("has space".parse::<SecretId>().is_err());
        assert!("".parse::<SecretId>().is_err());
    }
}
