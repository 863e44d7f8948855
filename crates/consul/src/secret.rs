//! A string that must never be printed.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A secret string (a token's SecretID, the agent's own token). `Debug` and `Display` show
/// `[REDACTED]`; the value is reached only through [`Secret::expose`]. It serializes as the
/// plain string, so it can be stored; never serialize it into a log or an API answer.
#[derive(Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret value, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// True when the value is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[REDACTED]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[REDACTED]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_redact() {
        let secret = Secret::new("s3cr3t-value");
        assert_eq!(format!("{secret:?}"), "[REDACTED]");
        assert_eq!(format!("{secret}"), "[REDACTED]");
        assert_eq!(format!("{:?}", Some(secret.clone())), "Some([REDACTED])");
        assert_eq!(secret.expose(), "s3cr3t-value");
    }

    #[test]
    fn serializes_as_the_plain_string() {
        let secret: Secret = serde_json::from_str("\"abc\"").expect("a string");
        assert_eq!(secret.expose(), "abc");
        assert_eq!(serde_json::to_string(&secret).expect("encodes"), "\"abc\"");
    }
}
