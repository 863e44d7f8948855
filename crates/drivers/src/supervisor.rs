//! Supervision of task processes, shared by the drivers: the task table, exit watchers,
//! signals, stop, destroy, stats and recovery.

use std::{
    collections::{BTreeMap, HashMap},
    io,
    os::{fd::OwnedFd, unix::process::ExitStatusExt as _},
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, SystemTime},
};

use nix::{
    errno::Errno,
    sys::signal::{Signal, kill, killpg},
    unistd::Pid,
};
use rustix::process::{PidfdFlags, pidfd_open, pidfd_send_signal};
use tokio::{process::Child, sync::watch};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::{
    cgroup::{CgroupKind, TaskCgroup, empty_within},
    error::DriverError,
    event::{EventSink, TaskEvent, TaskEventKind},
    logs::RotatedOutput,
    procfs,
    task::{
        ExitResult, HANDLE_VERSION, TaskConfig, TaskHandle, TaskId, TaskState, TaskStats,
        TaskStatus,
    },
};

/// How drivers watch and stop processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessConfig {
    /// How often the pid of a recovered task (not the agent's child, so no `SIGCHLD`) is
    /// checked for its exit.
    pub poll_interval: Duration,
    /// How long to wait for a task to exit after `SIGKILL` (and for its cgroup to empty)
    /// before giving up with `KillTimeout`.
    pub kill_timeout: Duration,
    /// `PATH` of tasks whose environment sets none; `None`: the agent's own.
    pub task_path: Option<String>,
}

impl Default for ProcessConfig {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_millis(500),
            kill_timeout: Duration::from_secs(10),
            task_path: None,
        }
    }
}

/// The task table of one driver instance, and the background tasks watching its processes.
#[derive(Debug)]
pub(crate) struct Supervisor {
    driver: &'static str,
    events: EventSink,
    config: ProcessConfig,
    tasks: Mutex<HashMap<TaskId, Slot>>,
    tracker: TaskTracker,
    cancel: CancellationToken,
}

#[derive(Debug)]
enum Slot {
    /// Reserved by a `start` or `recover` in progress.
    Starting,
    Ready(Arc<TaskEntry>),
}

#[derive(Debug)]
struct TaskEntry {
    handle: TaskHandle,
    /// A pidfd of the main process, when the kernel has `pidfd_open`: signals through it can
    /// never reach a process that recycled the pid.
    pidfd: Option<Arc<OwnedFd>>,
    /// `Some` once the main process has exited.
    exit: watch::Sender<Option<ExitResult>>,
    isolation: Isolation,
    /// Whether the process is our child (its exit status can be read).
    child: bool,
}

impl TaskEntry {
    fn exit(&self) -> Option<ExitResult> {
        *self.exit.borrow()
    }

    fn pid(&self) -> u32 {
        self.handle.pid
    }

    fn nix_pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.handle.pid).unwrap_or(i32::MAX))
    }

    /// Whether the main process still runs as far as `/proc` tells; only checked for processes
    /// that are not our children (a child's pid is ours until we reap it).
    fn identity_holds(&self) -> bool {
        self.child || procfs::is_same_live_process(self.handle.pid, self.handle.start_ticks)
    }
}

/// A running task, as an exec into it needs it.
#[derive(Debug, Clone)]
pub(crate) struct ExecTarget {
    /// Its main process.
    pub pid: u32,
    /// Its processes.
    pub pids: Vec<u32>,
    /// The `cgroup.procs` files of its cgroups (to join).
    pub cgroup_procs: Vec<std::path::PathBuf>,
}

/// The cgroups a task was put in; the supervisor kills through them and removes them when the
/// task is destroyed.
#[derive(Debug, Default)]
pub(crate) struct Isolation {
    /// Its cgroup v2.
    pub cgroup: Option<TaskCgroup>,
    /// Its cgroup v1 `devices` cgroup.
    pub devices: Option<TaskCgroup>,
}

impl Isolation {
    /// The task's cgroups: its cgroup v2, then its devices cgroup.
    pub fn cgroups(&self) -> impl Iterator<Item = &TaskCgroup> {
        self.cgroup.iter().chain(&self.devices)
    }

    /// `SIGKILL`s every process of both cgroups and removes them (best effort: a cgroup
    /// still emptying stays, and is reused by the next start of the id).
    pub fn abandon(&self) {
        for cgroup in self.cgroups() {
            let _ = cgroup.kill_all();
            let _ = cgroup.remove();
        }
    }
}

/// A reserved task id; dropping it without [`commit`](Self::commit) frees the id again.
#[derive(Debug)]
pub(crate) struct Reservation<'a> {
    sup: &'a Supervisor,
    id: TaskId,
    committed: bool,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.committed {
            self.sup.lock().remove(&self.id);
        }
    }
}

impl Reservation<'_> {
    /// Takes over a freshly spawned child: records its handle, watches for its exit, emits
    /// `Started` and then one `Note` per note. On error the child (and its group and cgroups)
    /// is killed and reaped.
    pub async fn commit_child(
        mut self,
        mut child: Child,
        isolation: Isolation,
        notes: Vec<String>,
        logs: Option<RotatedOutput>,
    ) -> Result<TaskHandle, DriverError> {
        let sup = self.sup;
        let id = self.id.clone();
        let described = describe_child(sup.driver, &id, &child, isolation.cgroup.as_ref());
        let (handle, pidfd) = match described {
            Ok((mut handle, pidfd)) => {
                handle.logs = logs;
                (handle, pidfd)
            }
            Err(e) => {
                if let Some(pid) = child.id() {
                    let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
                }
                let _ = child.kill().await;
                isolation.abandon();
                return Err(e);
            }
        };
        let (exit, _) = watch::channel(None);
        let entry = Arc::new(TaskEntry {
            handle: handle.clone(),
            pidfd,
            exit,
            isolation,
            child: true,
        });
        sup.lock().insert(id.clone(), Slot::Ready(entry.clone()));
        self.committed = true;
        sup.emit(
            &id,
            TaskEventKind::Started { pid: handle.pid },
            format!("started pid {}", handle.pid),
        );
        for note in notes {
            sup.emit(&id, TaskEventKind::Note, note);
        }
        let events = sup.events.clone();
        let cancel = sup.cancel.clone();
        let driver = sup.driver;
        sup.tracker.spawn(async move {
            let status = tokio::select! {
                status = child.wait() => status,
                // The child is dropped without being killed: tokio reaps it if it exits while
                // this process lives; a new agent recovers it.
                () = cancel.cancelled() => return,
            };
            let result = match status {
                Ok(status) => ExitResult {
                    exit_code: status.code(),
                    signal: status.signal(),
                    oom_killed: false,
                },
                Err(e) => {
                    tracing::warn!(task_id = %entry.handle.task_id, error = %e, "waiting for the task's process failed; its exit status is unknown");
                    ExitResult::UNKNOWN
                }
            };
            finish(driver, &events, &entry, result);
        });
        Ok(handle)
    }
}

fn describe_child(
    driver: &str,
    id: &TaskId,
    child: &Child,
    cgroup: Option<&TaskCgroup>,
) -> Result<(TaskHandle, Option<Arc<OwnedFd>>), DriverError> {
    let Some(pid) = child.id() else {
        return Err(DriverError::NotRunning {
            task_id: id.clone(),
            pid: 0,
        });
    };
    let proc_err = |source| DriverError::Proc {
        task_id: id.clone(),
        pid,
        source,
    };
    // Not reaped yet, so the pid is still this child's, even if it already exited.
    let pidfd = open_pidfd(pid).map_err(proc_err)?;
    let stat = procfs::read_stat(pid)
        .map_err(proc_err)?
        .ok_or_else(|| proc_err(io::Error::from(io::ErrorKind::NotFound)))?;
    let boot_id = procfs::boot_id().map_err(proc_err)?;
    Ok((
        TaskHandle {
            version: HANDLE_VERSION,
            driver: driver.to_owned(),
            task_id: id.clone(),
            pid,
            start_ticks: stat.start_ticks,
            boot_id,
            started_at: SystemTime::now(),
            cgroup: cgroup.map(|c| c.dir.clone()),
            container_id: None,
            logs: None,
        },
        pidfd,
    ))
}

/// `pidfd_open(pid)`; `Ok(None)` when the kernel lacks it.
fn open_pidfd(pid: u32) -> io::Result<Option<Arc<OwnedFd>>> {
    let raw = i32::try_from(pid).map_err(io::Error::other)?;
    let Some(rpid) = rustix::process::Pid::from_raw(raw) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    match pidfd_open(rpid, PidfdFlags::empty()) {
        Ok(fd) => Ok(Some(Arc::new(fd))),
        Err(e) if e == rustix::io::Errno::NOSYS => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Records the exit and emits `Exited`.
fn finish(driver: &str, events: &EventSink, entry: &TaskEntry, mut result: ExitResult) {
    if entry
        .isolation
        .cgroup
        .as_ref()
        .is_some_and(TaskCgroup::oom_killed)
    {
        result.oom_killed = true;
    }
    entry.exit.send_replace(Some(result));
    events.emit(TaskEvent::new(
        entry.handle.task_id.clone(),
        driver,
        TaskEventKind::Exited {
            code: result.exit_code,
            signal: result.signal,
            oom_killed: result.oom_killed,
        },
        result.to_string(),
    ));
}

impl Supervisor {
    /// How processes are watched and started.
    pub(crate) fn process_config(&self) -> &ProcessConfig {
        &self.config
    }

    pub fn new(driver: &'static str, events: EventSink, config: ProcessConfig) -> Self {
        Self {
            driver,
            events,
            config,
            tasks: Mutex::new(HashMap::new()),
            tracker: TaskTracker::new(),
            cancel: CancellationToken::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<TaskId, Slot>> {
        // A panic while holding the lock leaves the map consistent (single inserts/removes).
        self.tasks.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn emit(&self, id: &TaskId, kind: TaskEventKind, message: impl Into<String>) {
        self.events
            .emit(TaskEvent::new(id.clone(), self.driver, kind, message));
    }

    /// Reserves `id` for a task being started or recovered.
    pub fn reserve(&self, id: &TaskId) -> Result<Reservation<'_>, DriverError> {
        let mut tasks = self.lock();
        if tasks.contains_key(id) {
            return Err(DriverError::AlreadyExists {
                task_id: id.clone(),
                driver: self.driver.into(),
            });
        }
        tasks.insert(id.clone(), Slot::Starting);
        Ok(Reservation {
            sup: self,
            id: id.clone(),
            committed: false,
        })
    }

    fn get(&self, id: &TaskId) -> Result<Arc<TaskEntry>, DriverError> {
        match self.lock().get(id) {
            Some(Slot::Ready(entry)) => Ok(entry.clone()),
            _ => Err(DriverError::NotFound {
                task_id: id.clone(),
                driver: self.driver.into(),
            }),
        }
    }

    fn shut_down(&self) -> DriverError {
        DriverError::ShutDown {
            driver: self.driver.into(),
        }
    }

    /// Waits up to `timeout` for the main process to exit; `Ok(false)` on timeout.
    async fn wait_exit(&self, entry: &TaskEntry, timeout: Duration) -> Result<bool, DriverError> {
        let mut rx = entry.exit.subscribe();
        tokio::select! {
            r = tokio::time::timeout(timeout, rx.wait_for(Option::is_some)) => match r {
                Ok(Ok(_)) => Ok(true),
                Ok(Err(_)) => Err(self.shut_down()),
                Err(_) => Ok(false),
            },
            () = self.cancel.cancelled() => Err(self.shut_down()),
        }
    }

    pub async fn wait(&self, id: &TaskId) -> Result<ExitResult, DriverError> {
        let entry = self.get(id)?;
        let mut rx = entry.exit.subscribe();
        tokio::select! {
            r = rx.wait_for(Option::is_some) => match r {
                Ok(exit) => Ok(exit.unwrap_or(ExitResult::UNKNOWN)),
                Err(_) => Err(self.shut_down()),
            },
            () = self.cancel.cancelled() => Err(self.shut_down()),
        }
    }

    pub fn inspect(&self, id: &TaskId) -> Result<TaskStatus, DriverError> {
        let entry = self.get(id)?;
        let exit = entry.exit();
        Ok(TaskStatus {
            task_id: id.clone(),
            state: if exit.is_some() {
                TaskState::Exited
            } else {
                TaskState::Running
            },
            pid: entry.pid(),
            started_at: entry.handle.started_at,
            exit,
        })
    }

    /// Sends `signal` to the main process only.
    pub fn signal(&self, id: &TaskId, signal: Signal) -> Result<(), DriverError> {
        let entry = self.get(id)?;
        let not_running = || DriverError::NotRunning {
            task_id: id.clone(),
            pid: entry.pid(),
        };
        if entry.exit().is_some() || !entry.identity_holds() {
            return Err(not_running());
        }
        let sent = match &entry.pidfd {
            Some(fd) => {
                let sig = rustix::process::Signal::from_named_raw(signal as i32)
                    .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput));
                sig.and_then(|sig| pidfd_send_signal(fd.as_ref(), sig).map_err(io::Error::from))
            }
            None => kill(entry.nix_pid(), signal).map_err(io::Error::from),
        };
        match sent {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(Errno::ESRCH as i32) => return Err(not_running()),
            Err(source) => {
                return Err(DriverError::Signal {
                    task_id: id.clone(),
                    pid: entry.pid(),
                    signal: signal.as_str().into(),
                    source,
                });
            }
        }
        self.emit(
            id,
            TaskEventKind::Signaled {
                signal: signal as i32,
            },
            format!("sent {} to pid {}", signal.as_str(), entry.pid()),
        );
        Ok(())
    }

    /// Like [`Self::signal`], for a task started as `unshare --pid --fork … sh`: its main
    /// process is `unshare`, which only waits for the namespace's PID 1 (and dies of a signal
    /// it does not handle, taking the task with it), so the signal goes to that PID 1, which
    /// passes it on to the command. Without such a child, to the main process.
    pub fn signal_namespace_init(&self, id: &TaskId, signal: Signal) -> Result<(), DriverError> {
        let entry = self.get(id)?;
        if entry.exit().is_some() || !entry.identity_holds() {
            return Err(DriverError::NotRunning {
                task_id: id.clone(),
                pid: entry.pid(),
            });
        }
        let Some(init) = namespace_init(entry.pid()) else {
            return self.signal(id, signal);
        };
        kill(Pid::from_raw(init as i32), signal).map_err(|e| DriverError::Signal {
            task_id: id.clone(),
            pid: init,
            signal: signal.as_str().into(),
            source: io::Error::from(e),
        })?;
        self.emit(
            id,
            TaskEventKind::Signaled {
                signal: signal as i32,
            },
            format!("sent {} to the task's PID 1 (pid {init})", signal.as_str()),
        );
        Ok(())
    }

    /// Sends `signal` to the task's process group while its main process runs.
    fn signal_group(&self, entry: &TaskEntry, signal: Signal) -> Result<(), DriverError> {
        if entry.exit().is_some() || !entry.identity_holds() {
            return Ok(());
        }
        match killpg(entry.nix_pid(), signal) {
            Ok(()) | Err(Errno::ESRCH) => Ok(()),
            Err(e) => Err(DriverError::Signal {
                task_id: entry.handle.task_id.clone(),
                pid: entry.pid(),
                signal: signal.as_str().into(),
                source: e.into(),
            }),
        }
    }

    /// `SIGKILL` to the group and the cgroup.
    fn kill_everything(&self, entry: &TaskEntry) -> Result<(), DriverError> {
        self.signal_group(entry, Signal::SIGKILL)?;
        self.kill_cgroup(entry)
    }

    fn kill_cgroup(&self, entry: &TaskEntry) -> Result<(), DriverError> {
        for cgroup in entry.isolation.cgroups() {
            cgroup.kill_all().map_err(|source| DriverError::Cgroup {
                task_id: entry.handle.task_id.clone(),
                what: "killing the processes of",
                path: cgroup.dir.clone(),
                source,
            })?;
        }
        Ok(())
    }

    /// Once the main process is gone: `SIGKILL` to what is left of its group and cgroup. The
    /// group's members are looked up one by one (not `killpg`), so that a new process that
    /// recycled the leader's pid as its own group id is never hit.
    fn kill_stragglers(&self, entry: &TaskEntry) -> Result<(), DriverError> {
        self.kill_cgroup(entry)?;
        let members = procfs::group_members(entry.pid()).unwrap_or_default();
        for pid in members.into_iter().filter(|&p| p != entry.pid()) {
            match kill(Pid::from_raw(pid as i32), Signal::SIGKILL) {
                Ok(()) => {
                    tracing::debug!(task_id = %entry.handle.task_id, pid, "killed a process left in the task's group");
                }
                Err(e) => {
                    tracing::debug!(task_id = %entry.handle.task_id, pid, error = %e, "killing a process left in the task's group");
                }
            }
        }
        Ok(())
    }

    pub async fn stop(
        &self,
        id: &TaskId,
        timeout: Duration,
        signal: Signal,
    ) -> Result<(), DriverError> {
        let entry = self.get(id)?;
        if entry.exit().is_none() {
            self.emit(
                id,
                TaskEventKind::Signaled {
                    signal: signal as i32,
                },
                format!(
                    "stopping: sent {} to process group {}, SIGKILL after {}",
                    signal.as_str(),
                    entry.pid(),
                    berth_sys::short_duration(timeout)
                ),
            );
            self.signal_group(&entry, signal)?;
            if !self.wait_exit(&entry, timeout).await? {
                self.emit(
                    id,
                    TaskEventKind::Killed,
                    format!(
                        "did not exit within {} of {}: sent SIGKILL",
                        berth_sys::short_duration(timeout),
                        signal.as_str()
                    ),
                );
                self.kill_everything(&entry)?;
                if !self.wait_exit(&entry, self.config.kill_timeout).await? {
                    return Err(DriverError::KillTimeout {
                        task_id: id.clone(),
                        pid: entry.pid(),
                        waited: self.config.kill_timeout,
                    });
                }
            }
        }
        self.kill_stragglers(&entry)
    }

    pub async fn destroy(&self, id: &TaskId) -> Result<(), DriverError> {
        let entry = self.get(id)?;
        if entry.exit().is_none() {
            self.emit(id, TaskEventKind::Killed, "destroyed: sent SIGKILL");
            self.kill_everything(&entry)?;
            if !self.wait_exit(&entry, self.config.kill_timeout).await? {
                return Err(DriverError::KillTimeout {
                    task_id: id.clone(),
                    pid: entry.pid(),
                    waited: self.config.kill_timeout,
                });
            }
        }
        self.kill_stragglers(&entry)?;
        for cgroup in entry.isolation.cgroups() {
            self.remove_cgroup(&entry, cgroup).await?;
        }
        self.lock().remove(id);
        Ok(())
    }

    /// Waits (bounded by `kill_timeout`) for one of the task's cgroups to empty, killing what
    /// is left in it, then removes it.
    async fn remove_cgroup(
        &self,
        entry: &TaskEntry,
        cgroup: &TaskCgroup,
    ) -> Result<(), DriverError> {
        let task_id = &entry.handle.task_id;
        empty_within(cgroup, self.config.kill_timeout)
            .await
            .map_err(|e| e.for_task(task_id))?;
        cgroup.remove().map_err(|source| DriverError::Cgroup {
            task_id: task_id.clone(),
            what: "removing",
            path: cgroup.dir.clone(),
            source,
        })
    }

    pub fn stats(&self, id: &TaskId) -> Result<TaskStats, DriverError> {
        let entry = self.get(id)?;
        let not_running = || DriverError::NotRunning {
            task_id: id.clone(),
            pid: entry.pid(),
        };
        if entry.exit().is_some() || !entry.identity_holds() {
            return Err(not_running());
        }
        let proc_err = |source| DriverError::Proc {
            task_id: id.clone(),
            pid: entry.pid(),
            source,
        };
        let pids = match (&entry.isolation.cgroup, &entry.isolation.devices) {
            (Some(cg), _) => cg.pids().map_err(proc_err)?,
            (None, Some(dev)) => dev.pids().map_err(proc_err)?,
            (None, None) => procfs::group_members(entry.pid()).map_err(proc_err)?,
        };
        let stats = procfs::stats_of(&pids);
        if stats.pids.is_empty() {
            return Err(not_running());
        }
        Ok(stats)
    }

    /// What an exec into task `id` needs: its handle, the pids of its processes (its cgroup's,
    /// or its process group's), and the `cgroup.procs` files of its cgroups. Refused with
    /// `NotRunning` once its main process has exited.
    pub fn exec_target(&self, id: &TaskId) -> Result<ExecTarget, DriverError> {
        let entry = self.get(id)?;
        let not_running = || DriverError::NotRunning {
            task_id: id.clone(),
            pid: entry.pid(),
        };
        if entry.exit().is_some() || !entry.identity_holds() {
            return Err(not_running());
        }
        let proc_err = |source| DriverError::Proc {
            task_id: id.clone(),
            pid: entry.pid(),
            source,
        };
        let pids = match &entry.isolation.cgroup {
            Some(cg) => cg.pids().map_err(proc_err)?,
            None => procfs::group_members(entry.pid()).map_err(proc_err)?,
        };
        Ok(ExecTarget {
            pid: entry.pid(),
            pids,
            cgroup_procs: entry
                .isolation
                .cgroups()
                .map(TaskCgroup::procs_file)
                .collect(),
        })
    }

    /// Re-attaches to the process of `handle` (see `Driver::recover`); `devices` is the task's
    /// devices cgroup, when it has one (it is not in the handle: the driver derives it from the
    /// task id).
    pub fn recover(
        &self,
        handle: TaskHandle,
        devices: Option<TaskCgroup>,
    ) -> Result<(), DriverError> {
        let id = handle.task_id.clone();
        if handle.driver != self.driver {
            return Err(DriverError::WrongDriver {
                task_id: id,
                found: handle.driver,
                expected: self.driver.into(),
            });
        }
        if handle.version != HANDLE_VERSION {
            return Err(DriverError::HandleVersion {
                task_id: id,
                found: handle.version,
                supported: HANDLE_VERSION,
            });
        }
        if let Some(Slot::Ready(existing)) = self.lock().get(&id)
            && existing.handle == handle
        {
            return Ok(());
        }
        let reservation = self.reserve(&id)?;
        let pid = handle.pid;
        let proc_err = |source| DriverError::Proc {
            task_id: id.clone(),
            pid,
            source,
        };
        let current = procfs::boot_id().map_err(proc_err)?;
        if current != handle.boot_id {
            return Err(DriverError::OtherBoot {
                task_id: id,
                found: handle.boot_id,
                current,
            });
        }
        // Open the pidfd first, then check the start time: if the pid was recycled between the
        // two, the check sees the newer process and refuses.
        let pidfd = match open_pidfd(pid) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(Errno::ESRCH as i32) => {
                return Err(DriverError::NotRunning { task_id: id, pid });
            }
            Err(e) => return Err(proc_err(e)),
        };
        match procfs::read_stat(pid).map_err(proc_err)? {
            None => return Err(DriverError::NotRunning { task_id: id, pid }),
            Some(stat) if stat.start_ticks != handle.start_ticks => {
                return Err(DriverError::PidRecycled {
                    task_id: id,
                    pid,
                    found: stat.start_ticks,
                    expected: handle.start_ticks,
                });
            }
            Some(stat) if stat.exited() => {
                return Err(DriverError::NotRunning { task_id: id, pid });
            }
            Some(_) => {}
        }
        let cgroup = handle
            .cgroup
            .as_ref()
            .filter(|dir| dir.is_dir())
            .map(|dir| TaskCgroup::new(CgroupKind::V2, dir.clone()));
        let (exit, _) = watch::channel(None);
        let entry = Arc::new(TaskEntry {
            handle,
            pidfd,
            exit,
            isolation: Isolation {
                cgroup,
                devices: devices.filter(|d| d.dir.is_dir()),
            },
            child: false,
        });
        self.lock().insert(id.clone(), Slot::Ready(entry.clone()));
        let mut reservation = reservation;
        reservation.committed = true;
        self.emit(
            &id,
            TaskEventKind::Recovered { pid },
            format!("re-attached to pid {pid}"),
        );
        let events = self.events.clone();
        let cancel = self.cancel.clone();
        let driver = self.driver;
        let poll = self.config.poll_interval;
        self.tracker.spawn(async move {
            if watch_foreign(&entry, poll, &cancel).await {
                finish(driver, &events, &entry, ExitResult::UNKNOWN);
            }
        });
        Ok(())
    }

    /// For a task just recovered: restarts the log collectors of its rotated output that are
    /// gone; what could not be done is a `Note` event (the task runs on).
    pub async fn ensure_collectors(&self, id: &TaskId, logs: Option<&RotatedOutput>) {
        let Some(logs) = logs else {
            return;
        };
        for problem in crate::logs::ensure_collectors(logs).await {
            tracing::warn!(task_id = %id, "{problem}");
            self.emit(id, TaskEventKind::Note, problem);
        }
    }

    /// Ends the background watchers and waits for them. Tasks keep running.
    pub async fn shutdown(&self) {
        self.cancel.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Waits until a process that is not our child exits, polling `/proc/<pid>/stat` every
/// `poll` (gone, a zombie, or another process holding the pid). `false` when cancelled first.
///
/// A pidfd would signal the exit at once, but registering a raw fd with tokio's reactor is
/// `unsafe` (`AsyncFd::register`), which this workspace forbids.
async fn watch_foreign(entry: &TaskEntry, poll: Duration, cancel: &CancellationToken) -> bool {
    let mut tick = tokio::time::interval(poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = cancel.cancelled() => return false,
        }
        if !procfs::is_same_live_process(entry.handle.pid, entry.handle.start_ticks) {
            return true;
        }
    }
}

/// The environment a task gets: exactly `config.env`, plus the agent's `PATH` when it has
/// none.
pub(crate) fn task_env(config: &TaskConfig, process: &ProcessConfig) -> BTreeMap<String, String> {
    let mut env = config.env.clone();
    if !env.contains_key("PATH") {
        let path = process
            .task_path
            .clone()
            .or_else(|| std::env::var("PATH").ok())
            .unwrap_or_else(|| {
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()
            });
        env.insert("PATH".into(), path);
    }
    env
}

/// The only child of `pid` when it is PID 1 of a PID namespace of its own (`NSpid` ends in 1).
fn namespace_init(pid: u32) -> Option<u32> {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    let mut it = children.split_whitespace();
    let child: u32 = it.next()?.parse().ok()?;
    if it.next().is_some() {
        return None;
    }
    let status = std::fs::read_to_string(format!("/proc/{child}/status")).ok()?;
    let nspid = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let ids: Vec<&str> = nspid.split_whitespace().collect();
    (ids.len() > 1 && ids.last() == Some(&"1")).then_some(child)
}
