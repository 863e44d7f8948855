//! Errors of the alloc runner's API. Failures while the alloc runs (a claim refused, a task
//! that cannot start) are not errors of a call: they become events and the alloc's status.

use std::{io, path::PathBuf};

use berth_sys::InvalidId;

use crate::store::AllocStoreError;

/// An alloc runner could not be made, or a call on it is not legal now.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    /// An id is not a valid path segment (alloc id, task name).
    #[error(transparent)]
    InvalidId(#[from] InvalidId),
    /// The job has no such group.
    #[error("job {job_id:?} has no group {group:?}")]
    NoGroup {
        /// The job.
        job_id: String,
        /// The group asked for.
        group: String,
    },
    /// The alloc's index is not below its group's count.
    #[error("alloc {alloc_id}: index {index} is not below the group's count {count}")]
    BadIndex {
        /// The alloc.
        alloc_id: String,
        /// Its index.
        index: u32,
        /// The group's count.
        count: u32,
    },
    /// A `volume_mount` names a volume the group does not have.
    #[error(
        "alloc {alloc_id}: task {task}: volume_mount names volume {volume:?}, which the group does not have"
    )]
    UnknownVolume {
        /// The alloc.
        alloc_id: String,
        /// The task.
        task: String,
        /// The volume named.
        volume: String,
    },
    /// The group has no task of this name.
    #[error("alloc {alloc_id}: the group has no task {task:?}")]
    NoTask {
        /// The alloc.
        alloc_id: String,
        /// The task asked for.
        task: String,
    },
    /// The record does not match its group (a task or volume without its state).
    #[error("alloc {alloc_id}: damaged record: {reason}")]
    BadRecord {
        /// The alloc.
        alloc_id: String,
        /// What does not match.
        reason: String,
    },
    /// The record was written by a build with another record version.
    #[error(
        "alloc {alloc_id}: record version {found} is not supported (this build reads {supported})"
    )]
    RecordVersion {
        /// The alloc.
        alloc_id: String,
        /// The record's version.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// The alloc's directory could not be made.
    #[error("alloc {alloc_id}: creating {}", path.display())]
    AllocDir {
        /// The alloc.
        alloc_id: String,
        /// The directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The record could not be written.
    #[error(transparent)]
    Store(#[from] AllocStoreError),
    /// [`run`](crate::AllocRunner::run) was called a second time.
    #[error("alloc {alloc_id}: the runner is already running (run may be called once)")]
    AlreadyRunning {
        /// The alloc.
        alloc_id: String,
    },
    /// An alloc hook's name is a built-in hook's or another hook's.
    #[error("alloc {alloc_id}: an alloc hook named {name:?} is already there")]
    HookName {
        /// The alloc.
        alloc_id: String,
        /// The name.
        name: String,
    },
    /// `run` was cancelled: the agent is shutting down. Tasks keep running and volumes stay
    /// claimed; a new runner recovers them from the record.
    #[error("alloc {alloc_id}: cancelled (tasks keep running for the next agent to recover)")]
    Cancelled {
        /// The alloc.
        alloc_id: String,
    },
}
