//! What can go wrong talking to Consul. No error holds a JWT or a SecretID.

use std::time::Duration;

use hyper::StatusCode;

/// How many bytes of Consul's answer text an error keeps.
pub const ANSWER_TEXT_LIMIT: usize = 512;

/// What Consul answers (in the text of a 403) for a token it does not know, e.g. one that has
/// not replicated yet.
const ACL_NOT_FOUND: &str = "ACL not found";

/// A bad setting, named by its field (`consul.address: ...`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ConfigError {
    /// The field, e.g. `consul.address`.
    pub field: &'static str,
    /// What is wrong with it.
    pub message: String,
}

impl ConfigError {
    pub(crate) fn new(field: &'static str, message: impl Into<String>) -> Self {
        Self {
            field,
            message: message.into(),
        }
    }
}

/// Why a call to Consul failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsulError {
    /// A setting is bad.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// TLS was asked for (`ssl = true` or an `https://` address); this client speaks plain
    /// HTTP only.
    #[error(
        "consul.ssl: ssl is not supported yet (Consul at {address}): use a plain http \
         address with ssl = false"
    )]
    SslUnsupported {
        /// The configured address.
        address: String,
    },
    /// No connection could be made.
    #[error("consul {method} {path}: cannot connect to {address}")]
    Connect {
        /// The request method.
        method: &'static str,
        /// The request path.
        path: &'static str,
        /// Consul's address.
        address: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The connection failed during the exchange.
    #[error("consul {method} {path}: the exchange with {address} failed")]
    Transport {
        /// The request method.
        method: &'static str,
        /// The request path.
        path: &'static str,
        /// Consul's address.
        address: String,
        /// Why.
        #[source]
        source: hyper::Error,
    },
    /// Consul did not answer in time.
    #[error("consul {method} {path}: no answer from {address} within {timeout:?}")]
    Timeout {
        /// The request method.
        method: &'static str,
        /// The request path.
        path: &'static str,
        /// Consul's address.
        address: String,
        /// How long the call waited.
        timeout: Duration,
    },
    /// Consul answered with an error status; `message` is its answer text (trimmed, at most
    /// [`ANSWER_TEXT_LIMIT`] bytes), or the status's reason when the answer was empty.
    #[error("consul {method} {path}: {status}: {message}")]
    Status {
        /// The request method.
        method: &'static str,
        /// The request path.
        path: &'static str,
        /// The HTTP status.
        status: StatusCode,
        /// Consul's answer text.
        message: String,
    },
    /// Consul's answer is not the JSON expected. Says where, never what (the answer may hold
    /// a SecretID).
    #[error("consul {method} {path}: unexpected answer: {problem}")]
    Decode {
        /// The request method.
        method: &'static str,
        /// The request path.
        path: &'static str,
        /// What is wrong, without the answer's content.
        problem: String,
    },
    /// The token cannot be sent (its SecretID is not a valid header value).
    #[error("consul {method} {path}: the token {accessor_id:?} has a SecretID that cannot be sent")]
    UnsendableToken {
        /// The request method.
        method: &'static str,
        /// The request path.
        path: &'static str,
        /// The token's AccessorID.
        accessor_id: String,
    },
    /// The operation was cancelled before it finished.
    #[error("consul {operation}: cancelled")]
    Cancelled {
        /// What was cancelled.
        operation: &'static str,
    },
}

impl ConsulError {
    /// The HTTP status Consul answered, for [`ConsulError::Status`].
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Self::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Consul's answer text, for [`ConsulError::Status`].
    pub fn answer_text(&self) -> Option<&str> {
        match self {
            Self::Status { message, .. } => Some(message),
            _ => None,
        }
    }

    /// True for Consul's `403 ACL not found`: the token (or the auth method) does not exist,
    /// or not yet on the server that answered.
    pub fn is_acl_not_found(&self) -> bool {
        matches!(
            self,
            Self::Status { status, message, .. }
                if *status == StatusCode::FORBIDDEN && message.contains(ACL_NOT_FOUND)
        )
    }

    /// True when the operation was cancelled.
    pub fn is_cancelled(&self) -> bool {
        matches!(self, Self::Cancelled { .. })
    }
}

/// Consul's answer text as an error shows it: lossy UTF-8, control characters as spaces,
/// trimmed, cut at [`ANSWER_TEXT_LIMIT`] bytes (on a character boundary, marked with `…`).
pub(crate) fn answer_text(body: &[u8], status: StatusCode) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return status
            .canonical_reason()
            .unwrap_or("no answer text")
            .to_owned();
    }
    let mut out = String::with_capacity(text.len().min(ANSWER_TEXT_LIMIT + 3));
    for c in text.chars() {
        if out.len() + c.len_utf8() > ANSWER_TEXT_LIMIT {
            out.truncate(out.trim_end().len());
            out.push('…');
            break;
        }
        out.push(if c.is_control() { ' ' } else { c });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_error_reads_like_consul() {
        let err = ConsulError::Status {
            method: "POST",
            path: "/v1/acl/login",
            status: StatusCode::FORBIDDEN,
            message: answer_text(
                b"  ACL not found: auth method \"x\" not found\n",
                StatusCode::FORBIDDEN,
            ),
        };
        assert_eq!(
            err.to_string(),
            "consul POST /v1/acl/login: 403 Forbidden: ACL not found: auth method \"x\" not found"
        );
        assert!(err.is_acl_not_found());
        assert_eq!(err.status(), Some(StatusCode::FORBIDDEN));
    }

    #[test]
    fn answer_text_is_capped_on_a_char_boundary() {
        let long = "é".repeat(600);
        let text = answer_text(long.as_bytes(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(
            text.len() <= ANSWER_TEXT_LIMIT + '…'.len_utf8(),
            "{}",
            text.len()
        );
        assert!(text.ends_with('…'));
        assert!(text.starts_with("éé"));
    }

    #[test]
    fn empty_answer_shows_the_reason_and_controls_become_spaces() {
        assert_eq!(
            answer_text(b" \n", StatusCode::INTERNAL_SERVER_ERROR),
            "Internal Server Error"
        );
        assert_eq!(answer_text(b"a\nb\tc", StatusCode::FORBIDDEN), "a b c");
    }
}
