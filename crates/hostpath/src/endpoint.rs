//! The CSI endpoint's listening socket. What an endpoint may be (`unix:///abs/path.sock`,
//! `unix:/abs/path.sock` or `/abs/path.sock`, at most [`berth_csi::MAX_SOCKET_PATH`] bytes, no
//! NUL) is [`berth_csi::Endpoint`]'s to say; this module sets up the socket the plugin serves
//! on.

use std::{
    fs, io,
    os::unix::fs::{DirBuilderExt as _, FileTypeExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

use berth_csi::Endpoint;
use tokio::net::UnixListener;

/// The endpoint cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// The `--endpoint` value is not a usable unix socket endpoint.
    #[error("invalid --endpoint")]
    Invalid(#[source] berth_csi::EndpointError),
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

/// Parses the `--endpoint` value.
pub fn parse(value: &str) -> Result<Endpoint, EndpointError> {
    Endpoint::parse(value).map_err(EndpointError::Invalid)
}

/// Listens on `endpoint`'s socket: creates its parent directory (0700) if missing, removes a
/// stale socket left by a dead process (never anything else), binds, and makes the socket 0600.
pub fn listen(endpoint: &Endpoint) -> Result<UnixListener, EndpointError> {
    let path = endpoint.path();
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
    fn endpoints_are_parsed_by_berth_csi() {
        for value in [
            "unix:///run/csi.sock",
            "unix:/run/csi.sock",
            "/run/csi.sock",
        ] {
            let endpoint = parse(value).unwrap_or_else(|e| panic!("{value:?}: {e}"));
            assert_eq!(endpoint.path(), Path::new("/run/csi.sock"));
        }
        let long = format!("/{}", "a".repeat(berth_csi::MAX_SOCKET_PATH));
        for bad in [
            "unix://run/csi.sock",
            "run/csi.sock",
            "tcp://1.2.3.4:5",
            "",
            "unix://",
            "/run/a\0b.sock",
            &long,
        ] {
            let err = parse(bad).unwrap_err();
            assert!(matches!(err, EndpointError::Invalid(_)), "{bad:?}: {err:?}");
            assert_eq!(err.to_string(), "invalid --endpoint");
        }
        let err = parse(&long).unwrap_err();
        assert!(
            matches!(
                err,
                EndpointError::Invalid(berth_csi::EndpointError::TooLong { len: 108, .. })
            ),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn listen_replaces_stale_sockets_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub/csi.sock");
        let endpoint = Endpoint::from_path(&path).expect("endpoint");
        let first = listen(&endpoint).expect("listen");
        let mode = fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let parent = fs::metadata(path.parent().expect("parent")).expect("stat");
        assert_eq!(parent.permissions().mode() & 0o777, 0o700);
        assert!(matches!(
            listen(&endpoint),
            Err(EndpointError::InUse { .. })
        ));
        drop(first);
        let _second = listen(&endpoint).expect("stale socket is replaced");

        let file = dir.path().join("file");
        fs::write(&file, b"x").expect("write");
        assert!(matches!(
            listen(&Endpoint::from_path(&file).expect("endpoint")),
            Err(EndpointError::NotASocket { .. })
        ));
        assert!(file.exists());
    }
}
