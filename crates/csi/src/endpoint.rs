//! Where a plugin listens: a unix socket, checked before anything connects to it.

use std::{
    io,
    os::unix::ffi::OsStrExt as _,
    os::unix::fs::FileTypeExt as _,
    path::{Path, PathBuf},
    sync::Arc,
};

pub use berth_sys::MAX_SOCKET_PATH;

/// Why an endpoint is unusable. Names the path or value it is about.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EndpointError {
    /// Not `unix://…` nor an absolute path.
    #[error(
        "endpoint {value:?} is not a unix socket (expected unix:///abs/path.sock or an absolute path)"
    )]
    Scheme {
        /// The value as given.
        value: String,
    },
    /// A relative path.
    #[error("endpoint {value:?}: socket path must be absolute")]
    Relative {
        /// The value as given.
        value: String,
    },
    /// Longer than a unix socket path can be.
    #[error(
        "socket path {path} is {len} bytes; a unix socket path must fit in {MAX_SOCKET_PATH} bytes"
    )]
    TooLong {
        /// The path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
    },
    /// Nothing exists at the path.
    #[error("socket {path} does not exist (is the plugin running?)")]
    Missing {
        /// The path.
        path: PathBuf,
    },
    /// Something that is not a socket exists at the path.
    #[error("{path} exists but is not a unix socket")]
    NotSocket {
        /// The path.
        path: PathBuf,
    },
    /// The socket exists but nothing accepts connections on it.
    #[error("nothing accepts connections on socket {path} (the plugin may be restarting)")]
    Refused {
        /// The path.
        path: PathBuf,
    },
    /// The path has a NUL byte.
    #[error("endpoint {value:?}: socket path must not contain a NUL byte")]
    Nul {
        /// The value as given.
        value: String,
    },
    /// Another I/O failure.
    #[error("cannot use socket {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The failure (shared, so the error can be cloned).
        #[source]
        source: Arc<io::Error>,
    },
}

impl EndpointError {
    /// True when waiting may fix it (the plugin may be starting or restarting).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Missing { .. } | Self::Refused { .. } => true,
            Self::Io { source, .. } => !matches!(
                source.kind(),
                io::ErrorKind::PermissionDenied
                    | io::ErrorKind::InvalidInput
                    | io::ErrorKind::NotADirectory
                    | io::ErrorKind::InvalidFilename
            ),
            Self::Scheme { .. }
            | Self::Relative { .. }
            | Self::TooLong { .. }
            | Self::NotSocket { .. }
            | Self::Nul { .. } => false,
        }
    }
}

/// A plugin's unix socket, syntactically valid and short enough to connect to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    path: PathBuf,
}

impl Endpoint {
    /// Parses `unix:///abs/path`, `unix:/abs/path` or `/abs/path`.
    pub fn parse(value: &str) -> Result<Self, EndpointError> {
        let path = if let Some(rest) = value.strip_prefix("unix://") {
            rest
        } else if let Some(rest) = value.strip_prefix("unix:") {
            rest
        } else if value.contains("://") {
            return Err(EndpointError::Scheme {
                value: value.into(),
            });
        } else {
            value
        };
        if path.is_empty() {
            return Err(EndpointError::Scheme {
                value: value.into(),
            });
        }
        if !path.starts_with('/') {
            return Err(EndpointError::Relative {
                value: value.into(),
            });
        }
        Self::from_path(path)
    }

    /// Takes an absolute socket path.
    pub fn from_path(path: impl Into<PathBuf>) -> Result<Self, EndpointError> {
        let path = path.into();
        if !path.is_absolute() {
            return Err(EndpointError::Relative {
                value: path.display().to_string(),
            });
        }
        if path.as_os_str().as_bytes().contains(&0) {
            return Err(EndpointError::Nul {
                value: path.display().to_string(),
            });
        }
        let len = path.as_os_str().len();
        if len > MAX_SOCKET_PATH {
            return Err(EndpointError::TooLong { path, len });
        }
        Ok(Self { path })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `unix:///…`, the form CSI tools use.
    pub fn uri(&self) -> String {
        format!("unix://{}", self.path.display())
    }

    /// Checks now that a socket exists at the path (it may still refuse connections).
    pub fn check(&self) -> Result<(), EndpointError> {
        match std::fs::metadata(&self.path) {
            Ok(m) if m.file_type().is_socket() => Ok(()),
            Ok(_) => Err(EndpointError::NotSocket {
                path: self.path.clone(),
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(EndpointError::Missing {
                path: self.path.clone(),
            }),
            Err(source) => Err(EndpointError::Io {
                path: self.path.clone(),
                source: Arc::new(source),
            }),
        }
    }

    /// Turns a failed `connect(2)` into the error that says what is wrong with the socket.
    pub(crate) fn classify(&self, err: io::Error) -> EndpointError {
        match self.check() {
            Err(e) => e,
            Ok(()) if err.kind() == io::ErrorKind::ConnectionRefused => EndpointError::Refused {
                path: self.path.clone(),
            },
            Ok(()) => EndpointError::Io {
                path: self.path.clone(),
                source: Arc::new(err),
            },
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.uri())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_forms() {
        for v in [
            "unix:///run/csi.sock",
            "unix:/run/csi.sock",
            "/run/csi.sock",
        ] {
            assert_eq!(
                Endpoint::parse(v).unwrap().path(),
                Path::new("/run/csi.sock")
            );
        }
    }

    #[test]
    fn refuses_bad_endpoints_with_a_clear_reason() {
        let e = Endpoint::parse("tcp://127.0.0.1:1").unwrap_err();
        assert!(e.to_string().contains("not a unix socket"), "{e}");
        let e = Endpoint::parse("unix://csi.sock").unwrap_err();
        assert!(e.to_string().contains("absolute"), "{e}");
        let long = format!("/{}", "a".repeat(MAX_SOCKET_PATH));
        let e = Endpoint::parse(&long).unwrap_err();
        assert!(matches!(e, EndpointError::TooLong { len: 108, .. }), "{e}");
        assert!(e.to_string().contains("107 bytes"), "{e}");
        let ok = format!("/{}", "a".repeat(MAX_SOCKET_PATH - 1));
        assert!(Endpoint::parse(&ok).is_ok());
    }

    #[test]
    fn nul_is_refused_and_permission_problems_are_permanent() {
        let e = Endpoint::parse("/run/a\0b.sock").unwrap_err();
        assert!(
            matches!(e, EndpointError::Nul { .. }) && !e.is_transient(),
            "{e}"
        );
        let io = |kind| EndpointError::Io {
            path: "/x".into(),
            source: Arc::new(io::Error::from(kind)),
        };
        assert!(!io(io::ErrorKind::PermissionDenied).is_transient());
        assert!(io(io::ErrorKind::ConnectionReset).is_transient());
    }

    #[test]
    fn check_tells_missing_from_not_a_socket() {
        let dir = tempfile::tempdir().unwrap();
        let missing = Endpoint::from_path(dir.path().join("nope.sock")).unwrap();
        let e = missing.check().unwrap_err();
        assert!(
            matches!(e, EndpointError::Missing { .. }) && e.to_string().contains("does not exist")
        );
        let file = dir.path().join("file.sock");
        std::fs::write(&file, b"").unwrap();
        let e = Endpoint::from_path(&file).unwrap().check().unwrap_err();
        assert!(
            matches!(e, EndpointError::NotSocket { .. })
                && e.to_string().contains("not a unix socket")
        );
        assert!(!e.is_transient());
    }
}
