//! Errors of the plugin process and their gRPC statuses.

use std::{error::Error as StdError, io, path::PathBuf};

use tonic::Status;

use crate::{
    endpoint::EndpointError,
    faults::FaultsError,
    nodestate::NodeStateError,
    state::StateError,
    statelock::{EXIT_STATEDIR_IN_USE, StateLockError},
};

/// Why [`run`](crate::run) could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The endpoint is malformed or its socket cannot be set up.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// The state directory cannot be prepared.
    #[error("preparing the state directory {}", path.display())]
    StateDir {
        /// The directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// Another process holds the state directory, or its lock file cannot be used.
    #[error(transparent)]
    StateLock(#[from] StateLockError),
    /// The persisted state cannot be loaded.
    #[error(transparent)]
    State(#[from] StateError),
    /// The node's records cannot be loaded.
    #[error(transparent)]
    NodeState(#[from] NodeStateError),
    /// The fault switch cannot be set up.
    #[error(transparent)]
    Faults(#[from] FaultsError),
    /// No `--nodeid` was given and the host name cannot be read.
    #[error("no --nodeid given and the host name cannot be read")]
    Hostname(#[source] io::Error),
    /// A flag has a value the plugin cannot use.
    #[error("invalid --{flag}: {reason}")]
    InvalidFlag {
        /// The flag, without dashes.
        flag: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The call log cannot be opened.
    #[error("opening the call log {}", path.display())]
    CallLog {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The mount table cannot be read.
    #[error("reading the mount table")]
    Mounts(#[source] berth_sys::MountError),
    /// The gRPC server failed.
    #[error("serving gRPC")]
    Serve(#[source] tonic::transport::Error),
}

impl RunError {
    /// The exit code `berth-hostpath` ends with for this error: [`EXIT_STATEDIR_IN_USE`] when
    /// another copy holds the state directory, else 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::StateLock(StateLockError::InUse { .. }) => EXIT_STATEDIR_IN_USE,
            _ => 1,
        }
    }
}

/// `err` and its sources, joined by `": "`.
pub(crate) fn chain(err: &dyn StdError) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// `INTERNAL` with the whole error chain as message. Error messages of this crate carry ids and
/// paths, never secrets or mount flags.
pub(crate) fn internal(err: &dyn StdError) -> Status {
    Status::internal(chain(err))
}

impl From<StateError> for Status {
    fn from(err: StateError) -> Self {
        internal(&err)
    }
}

impl From<NodeStateError> for Status {
    fn from(err: NodeStateError) -> Self {
        internal(&err)
    }
}
