//! Reaching the agent's API from the CLI, and the words and times its answers are shown in.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use berth_api::{Client, ClientError};

use super::UsageError;

/// Where the agent's address came from, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AddressSource {
    /// `--address`.
    Flag,
    /// The `BERTH_ADDR` environment variable.
    Env,
    /// Neither: [`berth_api::DEFAULT_ADDRESS`].
    #[default]
    Default,
}

impl AddressSource {
    /// How the source is named in an error.
    pub fn name(self) -> &'static str {
        match self {
            Self::Flag => "--address",
            Self::Env => "BERTH_ADDR",
            Self::Default => "the default address",
        }
    }
}

/// The agent's API address as given, and where it came from.
#[derive(Debug, Clone)]
pub struct AgentAddress {
    /// The address as given.
    pub value: String,
    /// Where it came from.
    pub source: AddressSource,
}

/// A client for the agent's address; an address that does not parse is a usage error (exit
/// 2) that names where it came from (`--address` or `BERTH_ADDR`).
pub fn connect(address: &AgentAddress) -> anyhow::Result<Client> {
    Client::new(&address.value).map_err(|e| match e {
        ClientError::InvalidAddress(e) => {
            UsageError(format!("{}: {e}", address.source.name())).into()
        }
        e => e.into(),
    })
}

/// `healthy` or `unhealthy`.
pub fn health_word(healthy: bool) -> &'static str {
    if healthy { "healthy" } else { "unhealthy" }
}

/// `yes` or `no`.
pub fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// `-` for an empty list, else the items joined by `, `.
pub fn list(items: Vec<String>) -> String {
    if items.is_empty() {
        "-".into()
    } else {
        items.join(", ")
    }
}

/// A time in milliseconds since the epoch as `3s ago (2026-01-02T03:04:05Z)`; `never` for 0.
pub fn ago(ms: u64, now: SystemTime) -> String {
    if ms == 0 {
        return "never".into();
    }
    let then = UNIX_EPOCH + Duration::from_millis(ms);
    // A time ahead of this machine's clock reads as "0s ago".
    let secs = now.duration_since(then).unwrap_or_default().as_secs();
    let (d, h, m, s) = (secs / 86_400, secs / 3_600 % 24, secs / 60 % 60, secs % 60);
    let rel = match secs {
        0..60 => format!("{s}s"),
        60..3_600 => format!("{m}m{s}s"),
        3_600..86_400 => format!("{h}h{m}m"),
        _ => format!("{d}d{h}h"),
    };
    format!("{rel} ago ({})", humantime::format_rfc3339_seconds(then))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_ago() {
        let at = |secs: u64| UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs);
        let ms = 1_700_000_000_000;
        assert_eq!(ago(0, at(0)), "never");
        assert_eq!(ago(ms, at(3)), "3s ago (2023-11-14T22:13:20Z)");
        assert!(ago(ms, at(125)).starts_with("2m5s ago"));
        assert!(ago(ms, at(3 * 3_600 + 60)).starts_with("3h1m ago"));
        assert!(ago(ms, at(2 * 86_400 + 3_600)).starts_with("2d1h ago"));
        assert!(ago(ms + 5_000, at(0)).starts_with("0s ago"), "clock skew");
    }

    #[test]
    fn a_bad_address_names_where_it_came_from() {
        for (source, name) in [
            (AddressSource::Flag, "--address: "),
            (AddressSource::Env, "BERTH_ADDR: "),
            (AddressSource::Default, "the default address: "),
        ] {
            let err = connect(&AgentAddress {
                value: "ftp://x".into(),
                source,
            })
            .expect_err("refused");
            assert!(err.is::<UsageError>());
            let text = err.to_string();
            assert!(text.starts_with(name), "{text}");
            assert!(text.contains("\"ftp://x\""), "{text}");
        }
    }
}
