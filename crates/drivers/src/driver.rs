//! The driver trait and what a driver says about itself.

use std::{collections::BTreeMap, fmt, future::Future, pin::Pin, time::Duration};

use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};

use crate::{
    error::DriverError,
    task::{ExitResult, TaskConfig, TaskHandle, TaskId, TaskStats, TaskStatus},
    task_exec::{ExecRequest, ExecSession},
};

/// The future returned by the async methods of [`Driver`]: boxed so that the trait stays
/// dyn-compatible (`Arc<dyn Driver>`), `Send` so it can run on any runtime thread.
pub type DriverFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How a driver isolates a task's view of the filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FsIsolation {
    /// The task sees the host's filesystem as the agent does.
    None,
    /// The task has its own mount namespace: the host's filesystem plus its bind mounts.
    MountNamespace,
    /// The task has a root of its own (a chroot in its own mount namespace).
    Chroot,
}

/// What a driver can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// Filesystem isolation.
    pub fs_isolation: FsIsolation,
    /// Whether [`Driver::signal`] works.
    pub send_signals: bool,
    /// Whether [`Driver::exec`] runs a command inside a running task (`alloc exec`).
    pub exec: bool,
    /// Whether [`TaskConfig::mounts`] is honoured.
    pub bind_mounts: bool,
    /// Whether [`Resources`](crate::Resources) limits are applied (when the host allows).
    pub resource_limits: bool,
    /// Whether [`TaskConfig::devices`] is honoured: the nodes appear in the task's root. A
    /// driver without it refuses a task with devices.
    pub device_nodes: bool,
}

/// A driver's health, as found by its fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    /// Not fingerprinted yet, or nothing of it was found on this host.
    Undetected,
    /// Present but unable to run tasks; the description says why.
    Unhealthy,
    /// Can run tasks.
    Healthy,
}

impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Undetected => "undetected",
            Self::Unhealthy => "unhealthy",
            Self::Healthy => "healthy",
        })
    }
}

/// The result of one fingerprint of a driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// Health.
    pub health: Health,
    /// One line about it (the reason when not healthy).
    pub description: String,
    /// Node attributes, e.g. `driver.exec.cgroup`.
    pub attributes: BTreeMap<String, String>,
}

impl Fingerprint {
    /// A fingerprint with no attributes.
    pub fn new(health: Health, description: impl Into<String>) -> Self {
        Self {
            health,
            description: description.into(),
            attributes: BTreeMap::new(),
        }
    }

    /// The fingerprint of a driver not fingerprinted yet.
    pub fn undetected() -> Self {
        Self::new(Health::Undetected, "not fingerprinted yet")
    }
}

/// A task driver: starts tasks' processes and supervises them.
///
/// Tasks are identified by their [`TaskId`]; a task stays known to the driver after it exits,
/// until [`destroy`](Self::destroy). Async methods return a [`DriverFuture`] so that drivers
/// can be held as `Arc<dyn Driver>`. Task events (started, notes, signaled, killed, exited) go
/// to the [`EventSink`](crate::EventSink) the driver was made with.
pub trait Driver: Send + Sync + fmt::Debug {
    /// The driver's name, e.g. `raw_exec`; tasks' handles carry it.
    fn name(&self) -> &str;

    /// What the driver can do.
    fn capabilities(&self) -> Capabilities;

    /// Checks whether the driver can run tasks on this host. Never fails: problems make the
    /// result unhealthy with a reason.
    fn fingerprint(&self) -> DriverFuture<'_, Fingerprint>;

    /// Starts a task and returns its handle (persist it to [`recover`](Self::recover) the
    /// task later). When this returns an error, nothing of the task is left running.
    fn start(&self, config: TaskConfig) -> DriverFuture<'_, Result<TaskHandle, DriverError>>;

    /// Waits until the task's main process exits and says how; returns at once if it has.
    /// Any number of callers may wait.
    fn wait<'a>(&'a self, task_id: &'a TaskId)
    -> DriverFuture<'a, Result<ExitResult, DriverError>>;

    /// Sends `signal` to the task's process group, waits up to `timeout` for the main process
    /// to exit, then sends `SIGKILL` to the group (and the task's cgroup). Remaining processes
    /// of the group are killed once the main process is gone. Does nothing if it has exited.
    fn stop<'a>(
        &'a self,
        task_id: &'a TaskId,
        timeout: Duration,
        signal: Signal,
    ) -> DriverFuture<'a, Result<(), DriverError>>;

    /// Kills the task (`SIGKILL`, no grace period) if it runs, waits for it, removes its cgroup
    /// and forgets it. On error the task stays known, so destroy can be retried.
    fn destroy<'a>(&'a self, task_id: &'a TaskId) -> DriverFuture<'a, Result<(), DriverError>>;

    /// The task's state. Reads no files; never blocks.
    fn inspect(&self, task_id: &TaskId) -> Result<TaskStatus, DriverError>;

    /// Sends `signal` to the task's main process. Fails with `NotRunning` once it has exited.
    fn signal(&self, task_id: &TaskId, signal: Signal) -> Result<(), DriverError>;

    /// CPU and memory use of the task's processes, from `/proc`.
    fn stats<'a>(&'a self, task_id: &'a TaskId)
    -> DriverFuture<'a, Result<TaskStats, DriverError>>;

    /// Re-attaches to a task started by an earlier instance of this driver (before an agent
    /// restart), without restarting it. Refused when the handle is for another driver, another
    /// boot, or a process that is gone or whose pid now belongs to another process (then the
    /// caller treats the task as lost). Recovering a task the driver already supervises with
    /// the same handle is a no-op.
    ///
    /// The recovered process is not the agent's child: its exit is seen but its exit status
    /// is not ([`ExitResult::UNKNOWN`]).
    fn recover(&self, handle: TaskHandle) -> DriverFuture<'_, Result<(), DriverError>>;

    /// Runs a command inside the running task (`alloc exec`): as the task's user, with its
    /// environment, in what it sees of the machine (its root, namespaces and cgroup, as far
    /// as the driver isolates it). Refused with `NotRunning` once the task has exited; the
    /// default refuses with `Unsupported`. The command is not part of the task: nothing of
    /// it is recovered by a later agent, and dropping the session kills it.
    fn exec<'a>(
        &'a self,
        task_id: &'a TaskId,
        request: ExecRequest,
    ) -> DriverFuture<'a, Result<ExecSession, DriverError>> {
        let _ = request;
        Box::pin(async move {
            Err(DriverError::Unsupported {
                task_id: task_id.clone(),
                driver: self.name().to_owned(),
                what: "running a command inside a task (exec)",
            })
        })
    }

    /// Stops supervising: background waiters end, pending `wait`s fail with `ShutDown`.
    /// Tasks keep running (they are recovered by the next agent). Call before dropping.
    fn shutdown(&self) -> DriverFuture<'_, ()>;
}
