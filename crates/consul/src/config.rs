//! Where Consul is and how to talk to it: the agent's `consul` block.

use std::{net::Ipv6Addr, path::PathBuf};

use serde::Deserialize;

use crate::{ConfigError, Secret};

/// The address of the local Consul agent when none is configured.
pub const DEFAULT_ADDRESS: &str = "127.0.0.1:8500";

/// The auth method `nomad setup consul` creates, used for both kinds of identity by default.
pub const DEFAULT_AUTH_METHOD: &str = "nomad-workloads";

/// The agent's Consul settings, named as in Nomad's `consul` block.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsulConfig {
    /// `host:port`, `http://host:port` or `https://host:port` (IPv6 hosts in brackets).
    pub address: String,
    /// The agent's own token. Logins never send it (Consul refuses a login that carries one);
    /// it is kept for the agent's own calls.
    pub token: Option<Secret>,
    /// Auth method that turns service identities into tokens.
    pub service_identity_auth_method: String,
    /// Auth method that turns task identities into tokens.
    pub task_identity_auth_method: String,
    /// Talk TLS to Consul (not supported yet: [`crate::Client::new`] refuses it).
    pub ssl: bool,
    /// CA certificate that signs Consul's certificate, for `ssl`.
    pub ca_file: Option<PathBuf>,
}

impl Default for ConsulConfig {
    fn default() -> Self {
        Self {
            address: DEFAULT_ADDRESS.to_owned(),
            token: None,
            service_identity_auth_method: DEFAULT_AUTH_METHOD.to_owned(),
            task_identity_auth_method: DEFAULT_AUTH_METHOD.to_owned(),
            ssl: false,
            ca_file: None,
        }
    }
}

/// The scheme an address asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheme {
    Http,
    Https,
}

/// A checked address: what to connect to and what to send as `Host`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    pub(crate) scheme: Scheme,
    /// `host:port` (`[v6]:port`), for both the connection and the `Host` header.
    pub(crate) authority: String,
}

impl ConsulConfig {
    /// Checks every field and names the first bad one (`consul.address: ...`). Changes nothing.
    pub fn check(&self) -> Result<(), ConfigError> {
        self.endpoint()?;
        if self.token.as_ref().is_some_and(Secret::is_empty) {
            return Err(ConfigError::new(
                "consul.token",
                "empty: leave it out to run without a token",
            ));
        }
        check_auth_method(
            "consul.service_identity_auth_method",
            &self.service_identity_auth_method,
        )?;
        check_auth_method(
            "consul.task_identity_auth_method",
            &self.task_identity_auth_method,
        )?;
        if self
            .ca_file
            .as_ref()
            .is_some_and(|path| path.as_os_str().is_empty())
        {
            return Err(ConfigError::new(
                "consul.ca_file",
                "empty: give the path of a PEM file or leave it out",
            ));
        }
        Ok(())
    }

    /// The parsed [`ConsulConfig::address`].
    pub(crate) fn endpoint(&self) -> Result<Endpoint, ConfigError> {
        parse_address(&self.address).map_err(|message| {
            ConfigError::new("consul.address", format!("{:?} {message}", self.address))
        })
    }
}

fn check_auth_method(field: &'static str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty() {
        return Err(ConfigError::new(field, "empty: name a Consul auth method"));
    }
    if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ConfigError::new(
            field,
            format!("{name:?} has spaces or control characters"),
        ));
    }
    Ok(())
}

/// Parses `host:port`, `http://host[:port]` or `https://host[:port]`; the error completes
/// "`<address>` ...".
fn parse_address(address: &str) -> Result<Endpoint, String> {
    const WANT: &str = "(want host:port, e.g. 127.0.0.1:8500)";
    if address.is_empty() {
        return Err(format!("is empty {WANT}"));
    }
    if address.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("has spaces or control characters".to_owned());
    }
    let (scheme, rest, default_port) = match address.split_once("://") {
        None => (Scheme::Http, address, None),
        Some(("http", rest)) => (Scheme::Http, rest, Some(80)),
        Some(("https", rest)) => (Scheme::Https, rest, Some(443)),
        Some((other, _)) => {
            return Err(format!(
                "has the unsupported scheme {other:?} (want http or https)"
            ));
        }
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if let Some(bad) = rest.chars().find(|c| matches!(c, '/' | '?' | '#' | '@')) {
        return Err(format!(
            "has {bad:?}: give only a host and a port, no path, query or user"
        ));
    }
    let (host, port) = split_host_port(rest)?;
    let port = match (port, default_port) {
        (Some(port), _) => port,
        (None, Some(port)) => port,
        (None, None) => return Err(format!("has no port {WANT}")),
    };
    Ok(Endpoint {
        scheme,
        authority: format!("{host}:{port}"),
    })
}

/// Splits `host[:port]` / `[v6][:port]`; the host keeps its brackets.
fn split_host_port(rest: &str) -> Result<(&str, Option<u16>), String> {
    let (host, port) = if let Some(inner) = rest.strip_prefix('[') {
        let Some((v6, after)) = inner.split_once(']') else {
            return Err("has an IPv6 host without its closing ']'".to_owned());
        };
        if v6.parse::<Ipv6Addr>().is_err() {
            return Err(format!("has {v6:?}, which is not an IPv6 address"));
        }
        let port = match after {
            "" => None,
            _ => Some(
                after
                    .strip_prefix(':')
                    .ok_or_else(|| format!("has {after:?} after the IPv6 host"))?,
            ),
        };
        (&rest[..v6.len() + 2], port)
    } else {
        match rest.split_once(':') {
            Some((_, port)) if port.contains(':') => {
                return Err("has several ':': put an IPv6 host in brackets".to_owned());
            }
            Some((host, port)) => (host, Some(port)),
            None => (rest, None),
        }
    };
    if host.is_empty() {
        return Err("has no host".to_owned());
    }
    if !host.starts_with('[')
        && !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
    {
        return Err(format!(
            "has the host {host:?}, which is not a name or an IP address"
        ));
    }
    let port = match port {
        None => None,
        Some(port) => match port.parse::<u16>() {
            Ok(port) if port != 0 => Some(port),
            _ => return Err(format!("has the port {port:?} (want 1-65535)")),
        },
    };
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(address: &str) -> Result<Endpoint, String> {
        ConsulConfig {
            address: address.to_owned(),
            ..ConsulConfig::default()
        }
        .endpoint()
        .map_err(|e| e.to_string())
    }

    #[test]
    fn default_is_valid_and_local() {
        let config = ConsulConfig::default();
        config.check().expect("valid");
        assert_eq!(config.address, "127.0.0.1:8500");
        assert_eq!(config.service_identity_auth_method, "nomad-workloads");
        assert_eq!(config.task_identity_auth_method, "nomad-workloads");
    }

    #[test]
    fn addresses_accepted() {
        for (address, authority, scheme) in [
            ("127.0.0.1:8500", "127.0.0.1:8500", Scheme::Http),
            ("consul.service:8500", "consul.service:8500", Scheme::Http),
            ("http://127.0.0.1:8500", "127.0.0.1:8500", Scheme::Http),
            ("http://127.0.0.1:8500/", "127.0.0.1:8500", Scheme::Http),
            ("http://consul", "consul:80", Scheme::Http),
            ("https://consul", "consul:443", Scheme::Https),
            ("[::1]:8500", "[::1]:8500", Scheme::Http),
            ("http://[::1]", "[::1]:80", Scheme::Http),
        ] {
            let got = endpoint(address).unwrap_or_else(|e| panic!("{address}: {e}"));
            assert_eq!(got.authority, authority, "{address}");
            assert_eq!(got.scheme, scheme, "{address}");
        }
    }

    #[test]
    fn bad_addresses_name_the_field_and_the_problem() {
        for (address, problem) in [
            ("", "is empty"),
            ("127.0.0.1", "has no port"),
            ("127.0.0.1:0", "has the port \"0\""),
            ("127.0.0.1:99999", "has the port \"99999\""),
            ("127.0.0.1:http", "has the port \"http\""),
            ("unix:///run/consul.sock", "unsupported scheme \"unix\""),
            ("http://127.0.0.1:8500/v1", "no path"),
            ("http://user@127.0.0.1:8500", "no path, query or user"),
            ("::1:8500", "put an IPv6 host in brackets"),
            ("[::1:8500", "closing ']'"),
            ("[zz]:8500", "not an IPv6 address"),
            (":8500", "has no host"),
            (" 127.0.0.1:8500", "spaces"),
            ("a b:1", "spaces"),
            ("caf\u{e9}:1", "not a name or an IP address"),
        ] {
            let err = endpoint(address).expect_err(address);
            assert!(err.starts_with("consul.address: "), "{address}: {err}");
            assert!(err.contains(problem), "{address}: {err}");
        }
    }

    #[test]
    fn other_fields_are_checked() {
        let cases: [(ConsulConfig, &str); 4] = [
            (
                ConsulConfig {
                    token: Some(Secret::new("")),
                    ..ConsulConfig::default()
                },
                "consul.token: empty",
            ),
            (
                ConsulConfig {
                    service_identity_auth_method: String::new(),
                    ..ConsulConfig::default()
                },
                "consul.service_identity_auth_method: empty",
            ),
            (
                ConsulConfig {
                    task_identity_auth_method: "a b".to_owned(),
                    ..ConsulConfig::default()
                },
                "consul.task_identity_auth_method: \"a b\" has spaces",
            ),
            (
                ConsulConfig {
                    ca_file: Some(PathBuf::new()),
                    ..ConsulConfig::default()
                },
                "consul.ca_file: empty",
            ),
        ];
        for (config, want) in cases {
            let err = config.check().expect_err(want).to_string();
            assert!(err.starts_with(want), "{err}");
        }
    }

    #[test]
    fn deserializes_with_defaults_and_a_redacted_token() {
        let config: ConsulConfig =
            serde_json::from_str(r#"{"address": "10.0.0.1:8500", "token": "agent-secret-token"}"#)
                .expect("decodes");
        assert_eq!(config.address, "10.0.0.1:8500");
        assert_eq!(config.service_identity_auth_method, DEFAULT_AUTH_METHOD);
        assert!(!format!("{config:?}").contains("agent-secret-token"));
    }
}
