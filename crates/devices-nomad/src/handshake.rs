//! go-plugin's handshake as Nomad uses it: what the host puts in a plugin's environment, and
//! the line a plugin prints on its stdout once it listens
//! (`CORE-VERSION|APP-VERSION|NETWORK|ADDRESS|PROTOCOL|CERT`).

use std::{
    fmt,
    net::{IpAddr, SocketAddr},
    path::PathBuf,
};

use berth_input::Quoted;

/// The environment variable holding Nomad's magic cookie: a plugin started without it refuses
/// to run ("This binary is a plugin…").
pub const MAGIC_COOKIE_KEY: &str = "NOMAD_PLUGIN_MAGIC_COOKIE";
/// The value of [`MAGIC_COOKIE_KEY`].
pub const MAGIC_COOKIE_VALUE: &str =
    "e4327c2e01eabfd75a8a67adb114fb34a757d57eee7728d857a8cec6e91a7255";
/// go-plugin's own protocol version, the first field of the line.
pub const CORE_PROTOCOL_VERSION: u32 = 1;
/// Nomad's plugin protocol version (gRPC plugins), the second field of the line and the only
/// entry of [`PROTOCOL_VERSIONS_VAR`].
pub const APP_PROTOCOL_VERSION: u32 = 2;
/// The device plugin API version berth speaks (`SetConfig`'s `plugin_api_version`).
pub const DEVICE_API_VERSION: &str = "v0.1.0";

/// The app protocol versions the host accepts, comma-separated.
pub const PROTOCOL_VERSIONS_VAR: &str = "PLUGIN_PROTOCOL_VERSIONS";
/// The lowest TCP port a plugin may listen on (plugins that do not use unix sockets).
pub const MIN_PORT_VAR: &str = "PLUGIN_MIN_PORT";
/// The highest TCP port a plugin may listen on.
pub const MAX_PORT_VAR: &str = "PLUGIN_MAX_PORT";
/// The directory a plugin makes its unix socket in.
pub const UNIX_SOCKET_DIR_VAR: &str = "PLUGIN_UNIX_SOCKET_DIR";

/// How go-plugin's notice to someone who runs a plugin by hand begins: a plugin that prints it
/// was started without the cookie it expects, so it belongs to another program.
pub const NOT_RUN_DIRECTLY_NOTICE: &str = "This binary is a plugin";

/// Where a plugin listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginAddress {
    /// A unix socket (what go-plugin uses on Linux).
    Unix(PathBuf),
    /// A TCP address on loopback.
    Tcp(SocketAddr),
}

impl fmt::Display for PluginAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
            Self::Tcp(addr) => write!(f, "tcp:{addr}"),
        }
    }
}

/// Why a handshake line is not acceptable. Fields hold what the plugin printed; messages quote
/// it escaped and cut.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// Not of the form `CORE|APP|NETWORK|ADDRESS[|PROTOCOL…]`.
    #[error(
        "not a go-plugin handshake line (expected CORE|APP|NETWORK|ADDRESS|PROTOCOL): {}",
        Quoted(line)
    )]
    Unrecognized {
        /// The line.
        line: String,
    },
    /// No newline in the first `max` bytes printed: no handshake line at all.
    #[error(
        "no go-plugin handshake line: no newline in the first {max} bytes, which begin {}",
        Quoted(start)
    )]
    NoNewline {
        /// The bytes read.
        max: u64,
        /// What was printed.
        start: String,
    },
    /// The core protocol version is not 1.
    #[error(
        "go-plugin core protocol version {}; berth speaks {CORE_PROTOCOL_VERSION} (line {})",
        Quoted(found),
        Quoted(line)
    )]
    CoreVersion {
        /// What the plugin said.
        found: String,
        /// The line.
        line: String,
    },
    /// The app protocol version is not 2.
    #[error(
        "plugin protocol version {}; berth speaks Nomad's version {APP_PROTOCOL_VERSION} (gRPC plugins) (line {})",
        Quoted(found),
        Quoted(line)
    )]
    AppVersion {
        /// What the plugin said.
        found: String,
        /// The line.
        line: String,
    },
    /// The network is neither `unix` nor `tcp`.
    #[error(
        "plugin listens on network {}; berth connects to unix or tcp (line {})",
        Quoted(network),
        Quoted(line)
    )]
    Network {
        /// What the plugin said.
        network: String,
        /// The line.
        line: String,
    },
    /// The address is not usable: empty, not an address, or TCP not on loopback.
    #[error("plugin address {}: {reason} (line {})", Quoted(address), Quoted(line))]
    Address {
        /// What the plugin said.
        address: String,
        /// Why it is refused.
        reason: String,
        /// The line.
        line: String,
    },
    /// The protocol is not gRPC (net/rpc plugins are not Nomad's 0.9+ plugins).
    #[error(
        "plugin speaks protocol {}; berth speaks grpc only (line {})",
        Quoted(protocol),
        Quoted(line)
    )]
    Protocol {
        /// What the plugin said (`netrpc` when absent, as go-plugin assumes).
        protocol: String,
        /// The line.
        line: String,
    },
    /// The plugin sent a TLS certificate: it expects mutual TLS, which berth does not set up.
    #[error(
        "plugin offers a TLS certificate (go-plugin AutoMTLS); berth connects without TLS and never asks for it"
    )]
    Tls,
}

/// What a valid handshake line says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handshake {
    /// Where the plugin listens.
    pub address: PluginAddress,
}

/// Parses and checks one handshake line (surrounding whitespace ignored): core version 1,
/// app version 2, network `unix` (or `tcp` on loopback), protocol `grpc`, no certificate.
pub fn parse(line: &str) -> Result<Handshake, HandshakeError> {
    let line = line.trim();
    let quoted = || line.to_string();
    let parts: Vec<&str> = line.split('|').collect();
    if parts.len() < 4 {
        return Err(HandshakeError::Unrecognized { line: quoted() });
    }
    if parts[0].trim().parse::<u32>() != Ok(CORE_PROTOCOL_VERSION) {
        return Err(HandshakeError::CoreVersion {
            found: parts[0].to_string(),
            line: quoted(),
        });
    }
    if parts[1].trim().parse::<u32>() != Ok(APP_PROTOCOL_VERSION) {
        return Err(HandshakeError::AppVersion {
            found: parts[1].to_string(),
            line: quoted(),
        });
    }
    let address = parts[3];
    let bad_address = |reason: &str| HandshakeError::Address {
        address: address.to_string(),
        reason: reason.to_string(),
        line: quoted(),
    };
    let address = match parts[2] {
        "unix" => {
            if address.is_empty() {
                return Err(bad_address("empty"));
            }
            if !address.starts_with('/') {
                return Err(bad_address("a unix socket path must be absolute"));
            }
            PluginAddress::Unix(PathBuf::from(address))
        }
        "tcp" => {
            let addr: SocketAddr = address
                .parse()
                .map_err(|_| bad_address("not an IP address and port"))?;
            if !is_loopback(addr.ip()) {
                return Err(bad_address(
                    "berth connects to TCP plugins on loopback only",
                ));
            }
            PluginAddress::Tcp(addr)
        }
        other => {
            return Err(HandshakeError::Network {
                network: other.to_string(),
                line: quoted(),
            });
        }
    };
    let protocol = parts.get(4).copied().unwrap_or("netrpc");
    if protocol != "grpc" {
        return Err(HandshakeError::Protocol {
            protocol: protocol.to_string(),
            line: quoted(),
        });
    }
    // go-plugin's own rule: a sixth field longer than 50 bytes is a certificate.
    if parts.get(5).is_some_and(|cert| cert.len() > 50) {
        return Err(HandshakeError::Tls);
    }
    Ok(Handshake { address })
}

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_unix_and_loopback_tcp_grpc() {
        let h = parse("1|2|unix|/run/p/plugin123|grpc|\n").unwrap();
        assert_eq!(h.address, PluginAddress::Unix("/run/p/plugin123".into()));
        let h = parse("1|2|tcp|127.0.0.1:14001|grpc|").unwrap();
        assert_eq!(
            h.address,
            PluginAddress::Tcp("127.0.0.1:14001".parse().unwrap())
        );
        // A seventh field (broker multiplexing) is ignored.
        assert!(parse("1|2|unix|/p|grpc||true").is_ok());
    }

    #[test]
    fn refuses_everything_else_clearly() {
        let cases: &[(&str, &str)] = &[
            ("hello world", "not a go-plugin handshake line"),
            ("", "not a go-plugin handshake line"),
            ("2|2|unix|/p|grpc|", "core protocol version \"2\""),
            ("1|1|unix|/p|grpc|", "plugin protocol version \"1\""),
            ("1|x|unix|/p|grpc|", "plugin protocol version \"x\""),
            ("1|2|udp|/p|grpc|", "network \"udp\""),
            ("1|2|unix||grpc|", "empty"),
            ("1|2|unix|rel/p|grpc|", "must be absolute"),
            ("1|2|tcp|10.0.0.1:80|grpc|", "loopback only"),
            ("1|2|tcp|nothere|grpc|", "not an IP address"),
            ("1|2|unix|/p|netrpc|", "protocol \"netrpc\""),
            ("1|2|unix|/p", "protocol \"netrpc\""),
        ];
        for (line, expected) in cases {
            let err = parse(line).unwrap_err().to_string();
            assert!(err.contains(expected), "{line:?}: {err}");
        }
        let cert = "A".repeat(60);
        assert_eq!(
            parse(&format!("1|2|unix|/p|grpc|{cert}")),
            Err(HandshakeError::Tls)
        );
    }

    #[test]
    fn quotes_the_line_escaped() {
        let err = parse("bad\u{1b}[31m line").unwrap_err().to_string();
        assert!(err.contains("bad\\u{1b}[31m line"), "{err}");
    }
}
