//! Where the agent's API is: a unix socket, a loopback-style `http://IP:PORT`, or
//! `https://HOST:PORT`.

use std::{
    fmt,
    net::{Ipv4Addr, SocketAddr},
    os::unix::ffi::OsStrExt as _,
    path::PathBuf,
    str::FromStr,
};

use berth_csi::MAX_SOCKET_PATH;

/// The agent's API address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Address {
    /// An absolute unix socket path that fits in [`MAX_SOCKET_PATH`] bytes.
    Unix(PathBuf),
    /// A TCP address, plain HTTP.
    Tcp(SocketAddr),
    /// HTTPS: a host name or IP literal (without brackets) and a port; the agent's
    /// certificate must be valid for the host.
    Https {
        /// The host, as the certificate must name it.
        host: String,
        /// The port.
        port: u16,
    },
}

/// An address that cannot be parsed; says which forms are accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid agent address {address:?}: {reason}")]
pub struct InvalidAddress {
    /// The address as given.
    pub address: String,
    /// What is wrong with it.
    pub reason: String,
}

const FORMS: &str = "expected unix:///path/to/berth.sock, /path/to/berth.sock, \
                     http://127.0.0.1:PORT, http://[::1]:PORT or https://HOST:PORT";

impl Address {
    /// Parses `unix:///abs/path.sock`, `/abs/path.sock`, `http://IP:PORT` (an IP literal,
    /// IPv6 in brackets, or `localhost` for 127.0.0.1), or `https://HOST:PORT` (a DNS name or an
    /// IP literal, IPv6 in brackets). A trailing `/` is allowed, a path is not.
    pub fn parse(address: &str) -> Result<Self, InvalidAddress> {
        let invalid = |reason: String| InvalidAddress {
            address: address.to_string(),
            reason,
        };
        if let Some(path) = address.strip_prefix("unix://") {
            if !path.starts_with('/') {
                return Err(invalid(format!(
                    "a unix address needs an absolute path after unix:// (three slashes in \
                     all, as in unix:///var/lib/berth/berth.sock); {FORMS}"
                )));
            }
            return unix_path(path).map_err(invalid);
        }
        if address.starts_with('/') {
            return unix_path(address).map_err(invalid);
        }
        if let Some(rest) = address.strip_prefix("http://") {
            let authority = rest.strip_suffix('/').unwrap_or(rest);
            if authority.contains('/') {
                return Err(invalid(
                    "an http address must not have a path (http://IP:PORT)".into(),
                ));
            }
            if let Some(port) = authority.strip_prefix("localhost:") {
                let port = port
                    .parse::<u16>()
                    .map_err(|_| invalid(format!("invalid port {port:?}")))?;
                return Ok(Self::Tcp(SocketAddr::from((Ipv4Addr::LOCALHOST, port))));
            }
            return authority
                .parse::<SocketAddr>()
                .map(Self::Tcp)
                .map_err(|_| invalid(format!("{authority:?} is not IP:PORT; {FORMS}")));
        }
        if let Some(rest) = address.strip_prefix("https://") {
            return https(rest).map_err(invalid);
        }
        if address.is_empty() {
            return Err(invalid(format!("it is empty; {FORMS}")));
        }
        Err(invalid(FORMS.into()))
    }
}

fn unix_path(path: &str) -> Result<Address, String> {
    if path.as_bytes().contains(&0) {
        return Err("the socket path must not contain a NUL byte".into());
    }
    let path = PathBuf::from(path);
    let len = path.as_os_str().as_bytes().len();
    if len > MAX_SOCKET_PATH {
        return Err(format!(
            "the socket path is {len} bytes; a unix socket path must fit in {MAX_SOCKET_PATH} \
             bytes"
        ));
    }
    Ok(Address::Unix(path))
}

/// `HOST:PORT` of an https address, with an optional trailing `/`.
fn https(rest: &str) -> Result<Address, String> {
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.contains('/') {
        return Err("an https address must not have a path (https://HOST:PORT)".into());
    }
    let no_port = || format!("{authority:?} is not HOST:PORT; {FORMS}");
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (ip, port) = v6.split_once("]:").ok_or_else(no_port)?;
            ip.parse::<std::net::Ipv6Addr>()
                .map_err(|_| format!("{ip:?} is not an IPv6 address"))?;
            (ip, port)
        }
        None => {
            let (host, port) = authority.rsplit_once(':').ok_or_else(no_port)?;
            if host.contains(':') {
                return Err(format!(
                    "{host:?}: an IPv6 address goes in brackets ([::1])"
                ));
            }
            (host, port)
        }
    };
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("invalid port {port:?}"))?;
    let name_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b':'));
    if !name_ok {
        return Err(format!("{host:?} is not a host name or IP address"));
    }
    Ok(Address::Https {
        host: host.to_ascii_lowercase(),
        port,
    })
}

impl FromStr for Address {
    type Err = InvalidAddress;
    fn from_str(s: &str) -> Result<Self, InvalidAddress> {
        Self::parse(s)
    }
}

/// `unix:///path`, `http://IP:PORT` or `https://HOST:PORT`: a form [`Address::parse`] reads
/// back.
impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unix(path) => write!(f, "unix://{}", path.display()),
            Self::Tcp(addr) => write!(f, "http://{addr}"),
            Self::Https { host, port } if host.contains(':') => {
                write!(f, "https://[{host}]:{port}")
            }
            Self::Https { host, port } => write!(f, "https://{host}:{port}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_forms() {
        let unix = Address::Unix("/run/berth/berth.sock".into());
        assert_eq!(
            Address::parse("unix:///run/berth/berth.sock"),
            Ok(unix.clone())
        );
        assert_eq!(Address::parse("/run/berth/berth.sock"), Ok(unix.clone()));
        assert_eq!(unix.to_string(), "unix:///run/berth/berth.sock");
        let v4 = Address::Tcp("127.0.0.1:4646".parse().unwrap());
        assert_eq!(Address::parse("http://127.0.0.1:4646"), Ok(v4.clone()));
        assert_eq!(Address::parse("http://127.0.0.1:4646/"), Ok(v4.clone()));
        assert_eq!(Address::parse("http://localhost:4646"), Ok(v4.clone()));
        assert_eq!(v4.to_string(), "http://127.0.0.1:4646");
        let v6 = Address::Tcp("[::1]:4646".parse().unwrap());
        assert_eq!(Address::parse("http://[::1]:4646"), Ok(v6.clone()));
        assert_eq!(Address::parse(&v6.to_string()), Ok(v6));
        for (text, host) in [
            ("https://agent-1.example.com:4646", "agent-1.example.com"),
            ("https://Agent.Example.com:4646/", "agent.example.com"),
            ("https://10.0.0.7:4646", "10.0.0.7"),
            ("https://[fd00::7]:4646", "fd00::7"),
        ] {
            let a = Address::parse(text).unwrap();
            assert_eq!(
                a,
                Address::Https {
                    host: host.into(),
                    port: 4646
                },
                "{text}"
            );
            assert_eq!(Address::parse(&a.to_string()), Ok(a), "{text}");
        }
    }

    #[test]
    fn refused_forms_say_why() {
        for (address, says) in [
            ("", "empty"),
            ("unix://run/berth.sock", "absolute path"),
            ("berth.sock", "expected unix:///"),
            ("http://127.0.0.1", "not IP:PORT"),
            ("http://127.0.0.1:80/v1", "path"),
            ("http://localhost:x", "invalid port"),
            ("https://127.0.0.1", "not HOST:PORT"),
            ("https://host:0", "invalid port"),
            ("https://host:1/v1", "path"),
            ("https://ho st:1", "not a host name"),
            ("https://[x]:1", "not an IPv6 address"),
            ("https://fd00::7:1", "in brackets"),
            ("tcp://127.0.0.1:1", "expected unix:///"),
        ] {
            let err = Address::parse(address).unwrap_err();
            assert!(err.to_string().contains(says), "{address:?}: {err}");
            assert!(err.to_string().contains(&format!("{address:?}")), "{err}");
        }
        let long = format!("/{}", "s".repeat(MAX_SOCKET_PATH));
        let err = Address::parse(&long).unwrap_err();
        assert!(err.reason.contains("must fit in 107 bytes"), "{err}");
    }
}
