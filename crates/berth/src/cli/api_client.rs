//! Reaching the agent's API from the CLI, and the words and times its answers are shown in.

use std::{
    path::PathBuf,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use berth_api::{Client, ClientError, acl::SecretId};

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

/// How the CLI proves itself to the agent: an ACL token, and the CA that signed an `https://`
/// agent's certificate. `Debug` never shows the token.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AuthArgs {
    /// The secret id of an ACL token, sent with every request (when the agent has
    /// acl { enabled = true }).
    #[arg(long, global = true, env = "BERTH_TOKEN", hide_env_values = true, value_parser = token_arg)]
    pub token: Option<SecretId>,
    /// A PEM file of the CA that signed the agent's certificate (https:// addresses); without
    /// it, the system's roots are trusted.
    #[arg(long, global = true, env = "BERTH_CACERT", value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
}

/// Takes any text: a token is checked by [`connect`], whose error does not repeat it (clap's
/// would).
fn token_arg(s: &str) -> Result<SecretId, std::convert::Infallible> {
    Ok(SecretId::new(s))
}

/// The agent's API address as given, and where it came from.
#[derive(Debug, Clone)]
pub struct AgentAddress {
    /// The address as given.
    pub value: String,
    /// Where it came from.
    pub source: AddressSource,
    /// The token and CA to use.
    pub auth: AuthArgs,
}

/// A client for the agent's address, with the token and CA of `--token` and `--ca-cert`; an
/// address that does not parse, a token that is not one, or a CA file that cannot be used is
/// a usage error (exit 2) that names where it came from.
pub fn connect(address: &AgentAddress) -> anyhow::Result<Client> {
    let mut client = Client::new(&address.value).map_err(|e| match e {
        ClientError::InvalidAddress(e) => {
            anyhow::Error::from(UsageError(format!("{}: {e}", address.source.name())))
        }
        e => e.into(),
    })?;
    if let Some(token) = &address.auth.token {
        let shown = token.expose();
        if !shown.is_empty() {
            if shown.parse::<SecretId>().is_err() {
                return Err(UsageError(
                    "--token (or BERTH_TOKEN): a token's secret id is printable ASCII without \
                     spaces"
                        .into(),
                )
                .into());
            }
            client = client.with_token(token.clone());
        }
    }
    if let Some(ca) = &address.auth.ca_cert {
        client = client
            .with_ca_cert(ca)
            .map_err(|e| UsageError(format!("--ca-cert (or BERTH_CACERT): {e}")))?;
    }
    Ok(client)
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
    ago_time(UNIX_EPOCH + Duration::from_millis(ms), now)
}

/// A wall-clock time as `3s ago (2026-01-02T03:04:05Z)`.
pub fn ago_time(then: SystemTime, now: SystemTime) -> String {
    format!(
        "{} ({})",
        since(then, now),
        humantime::format_rfc3339_seconds(then)
    )
}

/// A wall-clock time as `3s ago`, for table cells; a time ahead of this machine's clock
/// reads as `0s ago`.
pub fn since(then: SystemTime, now: SystemTime) -> String {
    format!(
        "{} ago",
        duration(now.duration_since(then).unwrap_or_default())
    )
}

/// A duration for people, to the second: `3s`, `2m5s`, `3h1m`, `2d1h` (under a second:
/// `250ms`).
pub fn duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs == 0 && !d.is_zero() {
        return format!("{}ms", d.as_millis());
    }
    let (d, h, m, s) = (secs / 86_400, secs / 3_600 % 24, secs / 60 % 60, secs % 60);
    match secs {
        0..60 => format!("{s}s"),
        60..3_600 => format!("{m}m{s}s"),
        3_600..86_400 => format!("{h}h{m}m"),
        _ => format!("{d}d{h}h"),
    }
}

/// `healthy/expected`, as Nomad shows instance counts.
pub fn ratio(healthy: usize, expected: usize) -> String {
    format!("{healthy}/{expected}")
}

/// The healthy and registered instances of `plugin` that serve the controller role, and
/// those that serve the node role (a monolith's instances count in both).
pub fn plugin_roles(plugin: &berth_api::PluginStatus) -> ((usize, usize), (usize, usize)) {
    let expected = plugin.instances.len();
    let healthy = plugin.instances.iter().filter(|i| i.health.healthy).count();
    let role = |serves: bool| if serves { (healthy, expected) } else { (0, 0) };
    (
        role(plugin.plugin_type.is_controller()),
        role(plugin.plugin_type.is_node()),
    )
}

/// The columns an alloc adds to a table, after its id: TASK GROUP, DESIRED, STATUS, CREATED
/// (its first event), MODIFIED (its latest); `-` each when the alloc is unknown.
pub const ALLOC_COLUMNS: [&str; 5] = ["TASK GROUP", "DESIRED", "STATUS", "CREATED", "MODIFIED"];

/// The cells of [`ALLOC_COLUMNS`] for `alloc`; `verbose` writes times in full.
pub fn alloc_cells(
    alloc: Option<&berth_api::jobs::AllocStatus>,
    now: SystemTime,
    verbose: bool,
) -> Vec<String> {
    let Some(a) = alloc else {
        return vec!["-".into(); ALLOC_COLUMNS.len()];
    };
    let at = |t: Option<SystemTime>| {
        t.map_or_else(
            || "-".into(),
            |t| {
                if verbose {
                    ago_time(t, now)
                } else {
                    since(t, now)
                }
            },
        )
    };
    vec![
        a.group.clone(),
        word(&a.desired),
        a.client_status.to_string(),
        at(a.events.first().map(|e| e.time)),
        at(a.events.last().map(|e| e.time)),
    ]
}

/// An enum's word as the API spells it (`run`, `volume_claimed`).
pub fn word<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        _ => "?".into(),
    }
}

/// `--type` of `volume status` and `plugin status`: Nomad's `-type csi`, the only kind berth
/// has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KindArg {
    /// CSI volumes and plugins.
    Csi,
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
        assert_eq!(duration(Duration::from_millis(250)), "250ms");
        assert_eq!(duration(Duration::ZERO), "0s");
        assert_eq!(duration(Duration::from_secs(90_061)), "1d1h");
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
                auth: AuthArgs::default(),
            })
            .expect_err("refused");
            assert!(err.is::<UsageError>());
            let text = err.to_string();
            assert!(text.starts_with(name), "{text}");
            assert!(text.contains("\"ftp://x\""), "{text}");
        }
    }
}
