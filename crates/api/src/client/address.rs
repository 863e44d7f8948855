//! Where the agent's API is: a unix socket or a loopback-style `http://IP:PORT`.

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
    /// A TCP address (`http://` only).
    Tcp(SocketAddr),
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
                     http://127.0.0.1:PORT or http://[::1]:PORT";

impl Address {
    /// Parses `unix:///abs/path.sock`, `/abs/path.sock`, or `http://IP:PORT` (an IP literal,
    /// IPv6 in brackets, or `localhost` for 127.0.0.1; a trailing `/` is allowed, a path is
    /// not).
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
        if address.starts_with("https://") {
            return Err(invalid(
                "https is not supported; the agent serves plain HTTP on loopback only".into(),
            ));
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

impl FromStr for Address {
    type Err = InvalidAddress;
    fn from_str(s: &str) -> Result<Self, InvalidAddress> {
        Self::parse(s)
    }
}

/// `unix:///path` or `http://IP:PORT`: a form [`Address::parse`] reads back.
impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unix(path) => write!(f, "unix://{}", path.display()),
            Self::Tcp(addr) => write!(f, "http://{addr}"),
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
            ("https://127.0.0.1:1", "https is not supported"),
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
