//! The CSI endpoint: `unix:///abs/path.sock` or a bare absolute path, and its listening socket.

use std::{
    fs, io,
    os::unix::fs::{DirBuilderExt as _, FileTypeExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

use tokio::net::UnixListener;

/// Longest unix socket path Linux accepts (`sun_path` is 108 bytes with the trailing NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// The endpoint cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// Not `unix:///abs/path` nor an absolute path.
    #[error("endpoint {endpoint:?} is not unix:///absolute/path.sock or an absolute path")]
    Malformed {
        /// The endpoint as given.
        endpoint: String,
    },
    /// The socket path does not fit in `sun_path`.
    #[error(
        "socket path {} is {len} bytes long; unix socket paths must be at most {MAX_SOCKET_PATH} \
         bytes",
        path.display()
    )]
    TooLong {
        /// The socket path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
    },
    /// Something that is not a socket is in the way.
    #[error("{} exists and is not a socket; not removing it", path.display())]
    NotASocket {
        /// The socket path.
        path: PathBuf,
    },
    /// Another process is serving on the socket.
    #[error("{} is in use by another process", path.display())]
    InUse {
        /// The socket path.
        path: PathBuf,
    },
    /// Creating, removing, binding or chmod-ing failed.
    #[error("{action} {}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

/// The socket path of `endpoint`.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, EndpointError> {
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    if !path.starts_with('/') || path.contains('\0') {
        return Err(EndpointError::Malformed {
            endpoint: endpoint.to_owned(),
        });
    }
    let path = PathBuf::from(path);
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(EndpointError::TooLong { path, len });
    }
    Ok(path)
}

/// Listens on `path`: creates its parent directory (0700) if missing, removes a stale socket
/// left by a dead process (never anything else), binds, and makes the socket 0600.
pub fn listen(path: &Path) -> Result<UnixListener, EndpointError> {
    let io_err = |action, source| EndpointError::Io {
        action,
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|e| io_err("creating the parent directory of", e))?;
    }
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(EndpointError::InUse {
                    path: path.to_path_buf(),
                });
            }
            fs::remove_file(path).map_err(|e| io_err("removing the stale socket", e))?;
        }
        Ok(_) => {
            return Err(EndpointError::NotASocket {
                path: path.to_path_buf(),
            });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("inspecting", e)),
    }
    let listener = UnixListener::bind(path).map_err(|e| io_err("binding", e))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))
        .map_err(|e| io_err("setting permissions of", e))?;
    Ok(listener)
}

/// Removes the socket at `path` if it is (still) a socket.
pub fn remove_socket(path: &Path) {
    if fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
        && let Err(e) = fs::remove_file(path)
    {
        tracing::warn!(path = %path.display(), error = %e, "could not remove the socket");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_endpoints() {
        assert_eq!(
            socket_path("unix:///run/csi.sock").ok(),
            Some("/run/csi.sock".into())
        );
        assert_eq!(
            socket_path("/run/csi.sock").ok(),
            Some("/run/csi.sock".into())
        );
        for bad in [
            "unix://run/csi.sock",
            "run/csi.sock",
            "tcp://1.2.3.4:5",
            "",
            "unix://",
        ] {
            assert!(
                matches!(socket_path(bad), Err(EndpointError::Malformed { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn rejects_long_socket_paths() {
        let long = format!("/{}", "a".repeat(107));
        let err = socket_path(&format!("unix://{long}")).unwrap_err();
        assert!(
            matches!(err, EndpointError::TooLong { len: 108, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("at most 107 bytes"), "{err}");
        assert!(socket_path(&format!("/{}", "a".repeat(106))).is_ok());
    }

    #[tokio::test]
    async fn listen_replaces_stale_sockets_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub/csi.sock");
        let first = listen(&path).expect("listen");
        let mode = fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(matches!(listen(&path), Err(EndpointError::InUse { .. })));
        drop(first);
        let _second = listen(&path).expect("stale socket is replaced");

        let file = dir.path().join("file");
        fs::write(&file, b"x").expect("write");
        assert!(matches!(
            listen(&file),
            Err(EndpointError::NotASocket { .. })
        ));
        assert!(file.exists());
    }
}
