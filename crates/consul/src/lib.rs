//! A client of Consul's ACL HTTP API, for the tokens a node agent derives from workload
//! identities, as Nomad's client does:
//!
//! - [`Client::login`]: `POST /v1/acl/login` trades a signed workload identity (a JWT) for an
//!   ACL token through one of Consul's auth methods;
//! - [`Client::token_self`]: `GET /v1/acl/token/self` asks whether the token is usable yet;
//! - [`Client::preflight`]: polls `token_self` until a fresh token has replicated (Consul answers
//!   `403 ACL not found` until then);
//! - [`Client::logout`]: `POST /v1/acl/logout` destroys a token made by a login.
//!
//! Secrets never print: a token's SecretID and the agent's own token are [`Secret`]s, whose
//! `Debug` and `Display` show `[REDACTED]`, and no [`ConsulError`] holds a JWT or a SecretID.
//!
//! Plain HTTP only for now: [`Client::new`] refuses `ssl = true` and `https://` addresses with
//! [`ConsulError::SslUnsupported`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod client;
mod config;
mod error;
mod preflight;
mod secret;
mod token;

pub use client::{Client, REQUEST_TIMEOUT};
pub use config::{ConsulConfig, DEFAULT_ADDRESS, DEFAULT_AUTH_METHOD};
pub use error::{ANSWER_TEXT_LIMIT, ConfigError, ConsulError};
pub use hyper::StatusCode;
pub use secret::Secret;
pub use token::{AclLink, AclToken, NodeIdentity, ServiceIdentity};
