//! Errors of driver operations.

use std::{io, path::PathBuf, time::Duration};

use berth_sys::InvalidId;

use crate::task::TaskId;

/// A driver operation failed. Every variant names the task (or driver) it is about.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// An id is not a valid path segment.
    #[error(transparent)]
    InvalidId(#[from] InvalidId),
    /// A field of a task config is invalid; nothing was started.
    #[error("task {task_id}: invalid {field}: {reason}")]
    InvalidConfig {
        /// The task.
        task_id: TaskId,
        /// The field, e.g. `mounts[0].source`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The driver cannot do this (e.g. bind mounts in `raw_exec`).
    #[error("task {task_id}: driver {driver} does not support {what}")]
    Unsupported {
        /// The task.
        task_id: TaskId,
        /// The driver.
        driver: String,
        /// The feature asked for.
        what: &'static str,
    },
    /// The driver is not healthy enough to start tasks.
    #[error("task {task_id}: driver {driver} cannot start tasks: {reason}")]
    DriverUnhealthy {
        /// The task.
        task_id: TaskId,
        /// The driver.
        driver: String,
        /// Why.
        reason: String,
    },
    /// A task with this id already exists (running, or exited and not yet destroyed).
    #[error("task {task_id} already exists in driver {driver}")]
    AlreadyExists {
        /// The task.
        task_id: TaskId,
        /// The driver.
        driver: String,
    },
    /// The driver has no task with this id.
    #[error("driver {driver} has no task {task_id}")]
    NotFound {
        /// The task.
        task_id: TaskId,
        /// The driver.
        driver: String,
    },
    /// The task's main process is not running (any more).
    #[error("task {task_id} (pid {pid}) is not running")]
    NotRunning {
        /// The task.
        task_id: TaskId,
        /// Its pid.
        pid: u32,
    },
    /// A file or directory the task needs could not be prepared.
    #[error("task {task_id}: {what} {}", path.display())]
    Io {
        /// The task.
        task_id: TaskId,
        /// What was being done, e.g. `creating the working directory`.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The task's output could not be made ready (a log collector that would not start).
    #[error("task {task_id}: output {}: {message}", path.display())]
    Logs {
        /// The task.
        task_id: TaskId,
        /// The stream's base path.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The process could not be spawned.
    #[error("task {task_id}: spawning {program}")]
    Spawn {
        /// The task.
        task_id: TaskId,
        /// The program.
        program: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The task's set-up inside its mount namespace (bind mounts, cgroup, working directory,
    /// command lookup) failed; the process is gone.
    #[error("task {task_id}: set-up failed: {message}")]
    Setup {
        /// The task.
        task_id: TaskId,
        /// What the set-up script reported (its stderr), or why it could not finish.
        message: String,
    },
    /// A cgroup operation failed.
    #[error("task {task_id}: {what} {}", path.display())]
    Cgroup {
        /// The task.
        task_id: TaskId,
        /// What was being done.
        what: &'static str,
        /// The cgroup file or directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Reading the task's process from `/proc` failed.
    #[error("task {task_id}: reading /proc/{pid}")]
    Proc {
        /// The task.
        task_id: TaskId,
        /// The pid.
        pid: u32,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Sending a signal failed.
    #[error("task {task_id}: sending {signal} to pid {pid}")]
    Signal {
        /// The task.
        task_id: TaskId,
        /// The pid (or process group id).
        pid: u32,
        /// The signal's name.
        signal: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The task did not exit within the given time after `SIGKILL` (a process stuck in the
    /// kernel); the driver keeps the task, so the operation can be retried.
    #[error("task {task_id} (pid {pid}) did not exit within {} of SIGKILL", berth_sys::short_duration(*waited))]
    KillTimeout {
        /// The task.
        task_id: TaskId,
        /// Its pid.
        pid: u32,
        /// How long was waited.
        waited: Duration,
    },
    /// A handle given to `recover` was written by another driver.
    #[error("task {task_id}: handle belongs to driver {found:?}, not {expected:?}")]
    WrongDriver {
        /// The task.
        task_id: TaskId,
        /// The handle's driver.
        found: String,
        /// This driver.
        expected: String,
    },
    /// A handle given to `recover` has a version this build does not read.
    #[error(
        "task {task_id}: handle version {found} is not supported (this build reads {supported})"
    )]
    HandleVersion {
        /// The task.
        task_id: TaskId,
        /// The handle's version.
        found: u32,
        /// The version read by this build.
        supported: u32,
    },
    /// The machine rebooted since the handle was written: its process is gone.
    #[error("task {task_id}: handle is from another boot ({found}), this is {current}")]
    OtherBoot {
        /// The task.
        task_id: TaskId,
        /// The handle's boot id.
        found: String,
        /// The current boot id.
        current: String,
    },
    /// The handle's pid now belongs to another process: the task's process is gone.
    #[error(
        "task {task_id}: pid {pid} was recycled (start time {found} ticks, the handle says {expected})"
    )]
    PidRecycled {
        /// The task.
        task_id: TaskId,
        /// The pid.
        pid: u32,
        /// The start time of the process now holding the pid.
        found: u64,
        /// The start time in the handle.
        expected: u64,
    },
    /// A container task's image cannot be used; nothing was started.
    #[error("task {task_id}: image {image:?} {reason}")]
    Image {
        /// The task.
        task_id: TaskId,
        /// The image as the task names it.
        image: String,
        /// Why.
        reason: String,
    },
    /// The driver was shut down while the operation waited.
    #[error("driver {driver} is shut down")]
    ShutDown {
        /// The driver.
        driver: String,
    },
}
