//! What stops a [`RegistrationDir`](crate::RegistrationDir) from running.

use std::{io, path::PathBuf};

/// Why [`RegistrationDir::run`](crate::RegistrationDir::run) could not start. Once running,
/// nothing stops it but its shutdown token: per-socket failures are logged, not returned.
#[derive(Debug, thiserror::Error)]
pub enum RegDirError {
    /// The directory (or a parent) could not be created, or a non-directory is in its way.
    #[error("cannot create registration directory {path}: {source}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The failure.
        #[source]
        source: io::Error,
    },
    /// The directory could not be listed for the initial scan.
    #[error("cannot read registration directory {path}: {source}")]
    ReadDir {
        /// The directory.
        path: PathBuf,
        /// The failure.
        #[source]
        source: io::Error,
    },
    /// inotify could not watch the directory (e.g. `fs.inotify.max_user_watches` reached).
    #[error("cannot watch registration directory {path}: {source}")]
    Watch {
        /// The directory.
        path: PathBuf,
        /// The failure.
        #[source]
        source: notify::Error,
    },
}
