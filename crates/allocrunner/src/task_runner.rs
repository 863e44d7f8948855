//! One task's runner: prestart hooks, start through the driver, poststart hooks, supervision
//! with the restart policy, and stop.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use berth_drivers::{
    BindMount, Driver, DriverError, ExitResult, FsIsolation, LogCollector, LogRotation, PidMode,
    Propagation, Resources, Signal, TaskConfig, TaskDirs, TaskEvent, TaskEventKind, TaskLogs,
};
use berth_job::{PropagationMode, RestartPolicy};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use berth_devices::{assignment::DeviceAssignment, model::ContainerEdits};

use crate::{
    config::Backoff,
    device_host::DeviceHost,
    devices_hook,
    hooks::{TaskContext, TaskHook},
    record::{AllocEvent, AllocRecord, EventKind, TaskRecord, TaskRunState, hook_names},
    restart::{self, Decision},
    shared::Shared,
};

/// How a task runner begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    /// Start the task.
    Start,
    /// The task's process was recovered: supervise it.
    Attached,
    /// The task's process was lost while the agent was down: restart it under its policy
    /// once the servers-contacted gate opens.
    Lost,
}

/// How a task runner ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The task is dead; `failed` when it failed for good.
    Dead { failed: bool },
    /// The agent is shutting down: the task was left as it is (running or not).
    Detached,
}

enum Phase {
    Start,
    Running,
    Lost,
    /// The process ended (`None`: it never started, or how it ended is unknown); the event
    /// says how.
    Exited(Option<ExitResult>, AllocEvent),
    /// The operator asked for a restart: stop the process, then start it again.
    Restart,
    Kill,
    Dead {
        failed: bool,
    },
    Detached,
}

/// Everything a task runner needs; made by the alloc runner.
pub(crate) struct TaskRunner {
    pub shared: Arc<Shared>,
    pub ctx: TaskContext,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
    pub index: u32,
    pub driver: Option<Arc<dyn Driver>>,
    pub hooks: Vec<Arc<dyn TaskHook>>,
    pub batch: bool,
    pub restart: RestartPolicy,
    /// Stop the task (the alloc stops, or a sibling failed).
    pub kill: CancellationToken,
    /// Leave the task as it is and return (the agent shuts down).
    pub detach: CancellationToken,
    /// The node's device side.
    pub devices: Arc<dyn DeviceHost>,
    /// The devices the task was assigned at placement.
    pub assignments: Vec<DeviceAssignment>,
    pub servers_contacted: watch::Receiver<bool>,
    /// Waits between `SIGKILL`s of a process that outlived its stop.
    pub kill_retry: Backoff,
    /// Fired when the operator asks for a restart of the running task.
    pub restart_now: Arc<tokio::sync::Notify>,
    /// The node's log collector (see [`crate::AllocDeps::log_collector`]).
    pub log_collector: Option<LogCollector>,
    /// The node's task start slots.
    pub start_slots: crate::config::StartSlots,
}

impl TaskRunner {
    fn name(&self) -> &str {
        &self.ctx.task.name
    }

    fn event(&self, kind: EventKind, message: impl Into<String>) {
        self.shared.event(Some(self.name()), kind, message);
    }

    fn new_event(&self, kind: EventKind, message: impl Into<String>) -> AllocEvent {
        AllocEvent::new(Some(self.name()), kind, message)
    }

    fn update_task(&self, f: impl FnOnce(&mut TaskRecord)) {
        let name = self.name().to_owned();
        let _ = self.shared.update(|rec| {
            if let Some(t) = rec.tasks.get_mut(&name) {
                f(t);
            }
        });
    }

    fn update_task_with(&self, event: AllocEvent, f: impl FnOnce(&mut TaskRecord)) {
        let name = self.name().to_owned();
        let _ = self.shared.update_with(event, |rec| {
            if let Some(t) = rec.tasks.get_mut(&name) {
                f(t);
            }
        });
    }

    fn task_record(&self) -> Option<TaskRecord> {
        self.shared.read(|rec| rec.tasks.get(self.name()).cloned())
    }

    /// Runs the task from `entry` until it is dead or the runner is detached.
    pub async fn run(self, entry: Entry) -> Outcome {
        let mut phase = match entry {
            Entry::Start => Phase::Start,
            Entry::Attached => {
                if let Some(handle) = self.task_record().and_then(|t| t.handle) {
                    for hook in &self.hooks {
                        hook.recovered(&self.ctx, &handle).await;
                    }
                }
                Phase::Running
            }
            Entry::Lost => Phase::Lost,
        };
        loop {
            phase = match phase {
                Phase::Start => self.start().await,
                Phase::Running => self.supervise().await,
                Phase::Lost => self.wait_for_servers().await,
                Phase::Exited(exit, event) => self.after_exit(exit, event).await,
                Phase::Restart => self.restart().await,
                Phase::Kill => self.stop().await,
                Phase::Dead { failed } => return Outcome::Dead { failed },
                Phase::Detached => return Outcome::Detached,
            };
        }
    }

    /// The task will not run (again): dead, not failed.
    fn dead_unstarted(&self, message: &str) -> Phase {
        self.update_task_with(self.new_event(EventKind::Killing, message), |t| {
            t.state = TaskRunState::Dead;
            t.handle = None;
            t.lost = false;
            t.finished_at = Some(SystemTime::now());
        });
        Phase::Dead { failed: false }
    }

    async fn start(&self) -> Phase {
        if self.kill.is_cancelled() {
            return self.dead_unstarted("stopped before it started");
        }
        let Some(driver) = self.driver.clone() else {
            let message = format!("no task driver {:?} on this node", self.ctx.task.driver);
            self.update_task_with(self.new_event(EventKind::StartFailed, message), |t| {
                t.state = TaskRunState::Dead;
                t.failed = true;
                t.lost = false;
                t.finished_at = Some(SystemTime::now());
            });
            return Phase::Dead { failed: true };
        };
        let id = &self.ctx.task_id;
        // A previous process of the task is still known to the driver: forget it first.
        if driver.inspect(id).is_ok()
            && let Err(e) = driver.destroy(id).await
        {
            self.event(
                EventKind::StopFailed,
                format!("destroying the previous process failed: {e}"),
            );
        }
        self.update_task(|t| {
            t.state = TaskRunState::Starting;
            t.handle = None;
            t.prestart_done.clear();
            t.poststart_done.clear();
        });
        let config = match self.prestart().await {
            Ok(config) => config,
            Err(message) => {
                return Phase::Exited(None, self.new_event(EventKind::StartFailed, message));
            }
        };
        // The node's start slots: held until the handle is persisted (or the start failed).
        // Prestart hooks (which may wait on the outside world) run before, without one.
        let _slot = tokio::select! {
            slot = self.start_slots.acquire() => slot,
            () = self.kill.cancelled() => return self.dead_unstarted("stopped before it started"),
        };
        // Not cancellable: a start cut short could leave a process without a persisted
        // handle.
        match driver.start(config).await {
            Ok(handle) => {
                let pid = handle.pid;
                let name = self.name().to_owned();
                // The handle is written before anything else is done with the process.
                let persisted = self.shared.update_with(
                    self.new_event(EventKind::Started, format!("started pid {pid}")),
                    |rec| {
                        if let Some(t) = rec.tasks.get_mut(&name) {
                            t.handle = Some(handle);
                            t.state = TaskRunState::Running;
                            t.lost = false;
                            t.started_at = Some(SystemTime::now());
                            t.finished_at = None;
                        }
                    },
                );
                if let Err(e) = persisted {
                    let _ = driver.destroy(id).await;
                    let message = format!(
                        "its handle could not be persisted ({e}): the process was killed, as a restarted agent could not recover it"
                    );
                    return Phase::Exited(None, self.new_event(EventKind::StartFailed, message));
                }
                Phase::Running
            }
            Err(e) => Phase::Exited(
                None,
                self.new_event(EventKind::StartFailed, format!("start failed: {e}")),
            ),
        }
    }

    fn mark_prestart(&self, hook: &str) {
        let hook = hook.to_owned();
        self.update_task(|t| {
            t.prestart_done.insert(hook);
        });
    }

    /// The built-in prestart hooks (task directory, volume mounts), then the added ones;
    /// each one's progress persisted. `Err` says why the start failed.
    async fn prestart(&self) -> Result<TaskConfig, String> {
        let ctx = &self.ctx;
        let logs = self.stdout.parent().unwrap_or(&ctx.alloc_dir).to_path_buf();
        for dir in [&ctx.alloc_dir, &logs, &ctx.task_dir] {
            berth_sys::create_private_dir(dir)
                .map_err(|e| format!("creating {}: {e}", dir.display()))?;
        }
        let shared_dir = ctx.alloc_dir.join(SHARED_DIR);
        let chroot = self
            .driver
            .as_ref()
            .is_some_and(|d| d.capabilities().fs_isolation == FsIsolation::Chroot);
        task_layout(&shared_dir, &ctx.task_dir, chroot)?;
        self.mark_prestart(hook_names::TASK_DIR);

        let spec = &ctx.task;
        let literal = |t: &berth_job::Template, field: &str| -> Result<String, String> {
            t.as_literal().map(str::to_owned).ok_or_else(|| {
                format!("{field} still holds a variable ({t}): the alloc was not rendered")
            })
        };
        // With a root of its own, the task works in it (its `/` is its task directory).
        let workdir = if chroot {
            PathBuf::from("/")
        } else {
            ctx.task_dir.clone()
        };
        let mut config = TaskConfig::new(
            ctx.task_id.clone(),
            literal(&spec.command, "config.command")?,
            workdir,
            &self.stdout,
            &self.stderr,
        );
        config.args = spec
            .args
            .iter()
            .map(|a| literal(a, "config.args"))
            .collect::<Result<_, _>>()?;
        config.env = spec
            .env
            .iter()
            .map(|(k, v)| Ok((k.clone(), literal(v, "env")?)))
            .collect::<Result<_, String>>()?;
        for (key, value) in [
            ("BERTH_ALLOC_ID", ctx.alloc_id.clone()),
            ("BERTH_ALLOC_INDEX", self.index.to_string()),
            ("BERTH_JOB_ID", ctx.job_id.clone()),
            ("BERTH_GROUP_NAME", ctx.group.clone()),
            ("BERTH_TASK_NAME", spec.name.clone()),
            ("BERTH_ALLOC_DIR", ctx.alloc_dir.display().to_string()),
            ("BERTH_TASK_DIR", ctx.task_dir.display().to_string()),
        ] {
            config.env.entry(key.to_owned()).or_insert(value);
        }
        config.resources = Resources {
            memory_max_bytes: Some(u64::from(spec.resources.memory_mb) * 1024 * 1024),
        };
        config.dirs = Some(TaskDirs {
            task_dir: ctx.task_dir.clone(),
            alloc_dir: shared_dir,
        });
        config.logs = task_logs(&spec.logs, self.log_collector.as_ref());
        config.user = spec.user.clone();
        config.pid_mode = match spec.pid_mode {
            Some(berth_job::PidMode::Host) => PidMode::Host,
            Some(berth_job::PidMode::Private) | None => PidMode::Private,
        };

        if let Some(docker) = &spec.docker {
            let (container, devices) = crate::container::container_config(docker, &ctx.task_dir)?;
            config.container = Some(container);
            config.devices.extend(devices);
            config.privileged = docker.privileged;
        }

        config.mounts = self.shared.read(|rec| volume_mounts(rec, spec))?;
        self.mark_prestart(hook_names::VOLUME_MOUNTS);

        if !self.assignments.is_empty() {
            self.devices_prestart(&mut config).await?;
            self.mark_prestart(hook_names::DEVICES);
        }

        for hook in &self.hooks {
            hook.prestart(ctx, &mut config)
                .await
                .map_err(|e| format!("prestart hook {}: {e}", hook.name()))?;
            self.mark_prestart(hook.name());
        }
        Ok(config)
    }

    /// The `devices` hook: the task's reservation (made at its first start and persisted
    /// before it, reused for every later start), the devices' pre-start call, then their env,
    /// mounts and device nodes applied to `config`.
    async fn devices_prestart(&self, config: &mut TaskConfig) -> Result<(), String> {
        let ctx = &self.ctx;
        let name = self.name().to_owned();
        let kept = self.task_record().and_then(|t| t.device_edits);
        let edits: ContainerEdits = match kept {
            Some(edits) => edits,
            None => {
                let edits = match self
                    .devices
                    .reserve(&ctx.alloc_id, &name, &self.assignments)
                    .await
                {
                    Ok(e) => e,
                    Err(e) => {
                        let message = format!("reserving its devices failed: {e}");
                        self.event(EventKind::DevicesFailed, message.clone());
                        return Err(message);
                    }
                };
                let devices: Vec<String> = self
                    .assignments
                    .iter()
                    .flat_map(DeviceAssignment::device_names)
                    .collect();
                // Durable before the task can start with them: a restart, even after a kill
                // -9 of the agent, gets these same devices.
                self.shared
                    .update_with(
                        self.new_event(
                            EventKind::DevicesReserved,
                            devices_hook::describe(&devices, &edits),
                        ),
                        |rec| {
                            if let Some(t) = rec.tasks.get_mut(&name) {
                                t.device_edits = Some(edits.clone());
                            }
                        },
                    )
                    .map_err(|e| format!("its device reservation could not be persisted: {e}"))?;
                edits
            }
        };
        match self.devices.pre_start(&self.assignments).await {
            Ok(notes) => {
                for note in notes {
                    self.event(EventKind::DeviceNote, note);
                }
            }
            Err(e) => {
                let message = format!("preparing its devices failed: {e}");
                self.event(EventKind::DevicesFailed, message.clone());
                return Err(message);
            }
        }
        let (caps, driver) = match &self.driver {
            Some(d) => (d.capabilities(), d.name().to_owned()),
            None => return Err(format!("no task driver {:?}", ctx.task.driver)),
        };
        let notes = devices_hook::apply(config, &edits, &caps, &driver)?;
        for note in notes {
            self.event(EventKind::DeviceNote, note);
        }
        Ok(())
    }

    /// Poststart hooks not done yet for this process (all of them after a start; those a
    /// crash interrupted after a recovery). A failure is reported; the task keeps running.
    async fn poststart(&self) {
        let Some(task) = self.task_record() else {
            return;
        };
        let Some(handle) = task.handle else {
            return;
        };
        for hook in &self.hooks {
            if task.poststart_done.contains(hook.name()) {
                continue;
            }
            if let Err(e) = hook.poststart(&self.ctx, &handle).await {
                self.event(
                    EventKind::HookFailed,
                    format!("poststart hook {}: {e}", hook.name()),
                );
            }
            let name = hook.name().to_owned();
            self.update_task(|t| {
                t.poststart_done.insert(name);
            });
        }
    }

    async fn supervise(&self) -> Phase {
        let Some(driver) = self.driver.clone() else {
            return Phase::Exited(
                None,
                self.new_event(EventKind::Exited, "its driver is gone"),
            );
        };
        if !self.kill.is_cancelled() {
            tokio::select! {
                biased;
                () = self.detach.cancelled() => return Phase::Detached,
                () = self.poststart() => {}
            }
        }
        let id = &self.ctx.task_id;
        tokio::select! {
            biased;
            () = self.detach.cancelled() => Phase::Detached,
            () = self.kill.cancelled() => Phase::Kill,
            () = self.restart_now.notified() => Phase::Restart,
            r = driver.wait(id) => match r {
                Ok(exit) => Phase::Exited(Some(exit), self.new_event(EventKind::Exited, exit.to_string())),
                Err(DriverError::ShutDown { .. }) => Phase::Detached,
                Err(e) => Phase::Exited(
                    None,
                    self.new_event(EventKind::Exited, format!("lost track of the process: {e}")),
                ),
            },
        }
    }

    /// Records how the process ended, decides about a restart (one write), runs the exited
    /// hooks, and waits out the restart delay.
    async fn after_exit(&self, exit: Option<ExitResult>, event: AllocEvent) -> Phase {
        let now = SystemTime::now();
        let name = self.name().to_owned();
        let (policy, batch) = (self.restart, self.batch);
        let mut decision = Decision::Fail;
        let mut restarts = 0;
        let _ = self.shared.update_with(event, |rec| {
            let Some(t) = rec.tasks.get_mut(&name) else {
                return;
            };
            t.handle = None;
            t.lost = false;
            if exit.is_some() {
                t.last_exit = exit;
            }
            decision = restart::decide(&policy, &mut t.restart_window, now, batch, exit.as_ref());
            match decision {
                Decision::Done | Decision::Fail => {
                    t.state = TaskRunState::Dead;
                    t.failed = decision == Decision::Fail;
                    t.finished_at = Some(now);
                }
                Decision::Restart { .. } => {
                    t.state = TaskRunState::Pending;
                    t.restarts += 1;
                    restarts = t.restarts;
                }
            }
        });
        if let Some(exit) = &exit {
            for hook in &self.hooks {
                hook.exited(&self.ctx, exit).await;
            }
        }
        match decision {
            Decision::Done => Phase::Dead { failed: false },
            Decision::Fail => {
                self.event(
                    EventKind::NotRestarting,
                    format!(
                        "not restarting: {} restarts within {} used up (mode fail)",
                        policy.attempts,
                        berth_sys::short_duration(policy.interval)
                    ),
                );
                Phase::Dead { failed: true }
            }
            Decision::Restart { delay, attempt } => {
                let message = if attempt > policy.attempts {
                    format!(
                        "{} restarts within {} used up (mode delay): restart {restarts} in {}",
                        policy.attempts,
                        berth_sys::short_duration(policy.interval),
                        berth_sys::short_duration(delay)
                    )
                } else {
                    format!(
                        "restart {restarts} in {} (attempt {attempt} of {} within {})",
                        berth_sys::short_duration(delay),
                        policy.attempts,
                        berth_sys::short_duration(policy.interval)
                    )
                };
                self.event(EventKind::Restarting, message);
                tokio::select! {
                    biased;
                    () = self.detach.cancelled() => Phase::Detached,
                    () = self.kill.cancelled() => self.dead_unstarted("stopped while waiting to restart"),
                    () = tokio::time::sleep(delay) => Phase::Start,
                }
            }
        }
    }

    /// A restart the operator asked for: the process is stopped as a stop does, and started
    /// again at once; it does not count against the restart policy.
    async fn restart(&self) -> Phase {
        let Some(driver) = self.driver.clone() else {
            return Phase::Start;
        };
        let timeout = self.ctx.task.kill_timeout;
        self.event(
            EventKind::Restarting,
            format!(
                "restart asked for: SIGTERM, then SIGKILL after {}",
                berth_sys::short_duration(timeout)
            ),
        );
        let id = &self.ctx.task_id;
        if let Err(e) = driver.stop(id, timeout, Signal::SIGTERM).await {
            self.event(EventKind::StopFailed, format!("stop failed: {e}"));
            if let Err(e) = driver.destroy(id).await {
                // The old process may still run: go on supervising it rather than start a
                // second one.
                self.event(EventKind::StopFailed, format!("destroy failed: {e}"));
                return Phase::Running;
            }
        }
        let exit = driver.inspect(id).ok().and_then(|s| s.exit);
        let message = exit.map_or_else(|| "stopped for a restart".to_owned(), |e| e.to_string());
        self.update_task_with(self.new_event(EventKind::Exited, message), |t| {
            t.handle = None;
            t.state = TaskRunState::Pending;
            t.restarts += 1;
            if exit.is_some() {
                t.last_exit = exit;
            }
        });
        if let Some(exit) = &exit {
            for hook in &self.hooks {
                hook.exited(&self.ctx, exit).await;
            }
        }
        if self.kill.is_cancelled() {
            return self.dead_unstarted("stopped while restarting");
        }
        Phase::Start
    }

    /// A recovered task whose process is gone: wait for the servers-contacted gate, then let
    /// the restart policy decide (the loss counts as a failure).
    async fn wait_for_servers(&self) -> Phase {
        let mut gate = self.servers_contacted.clone();
        if !*gate.borrow_and_update() {
            self.event(
                EventKind::WaitingForServers,
                "waiting for the agent to contact the servers before restarting",
            );
            let opened = async {
                if gate.wait_for(|open| *open).await.is_err() {
                    // The gate was dropped closed: it never opens.
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                biased;
                () = self.detach.cancelled() => return Phase::Detached,
                () = self.kill.cancelled() => return self.dead_unstarted("stopped while its process was lost"),
                () = opened => {}
            }
        }
        if self.kill.is_cancelled() {
            return self.dead_unstarted("stopped while its process was lost");
        }
        Phase::Exited(
            None,
            self.new_event(
                EventKind::Exited,
                "its process was lost while the agent was down",
            ),
        )
    }

    /// Stops the running process: stop hooks, then the kill signal, `SIGKILL` after the
    /// task's `kill_timeout`.
    async fn stop(&self) -> Phase {
        let Some(driver) = self.driver.clone() else {
            return self.dead_unstarted("stopped");
        };
        for hook in &self.hooks {
            hook.stop(&self.ctx).await;
        }
        let timeout = self.ctx.task.kill_timeout;
        self.event(
            EventKind::Killing,
            format!(
                "stopping: SIGTERM, then SIGKILL after {}",
                berth_sys::short_duration(timeout)
            ),
        );
        let id = &self.ctx.task_id;
        if let Err(e) = driver.stop(id, timeout, Signal::SIGTERM).await {
            self.event(EventKind::StopFailed, format!("stop failed: {e}"));
            let mut result = driver.destroy(id).await;
            // A process that survives SIGKILL (stuck in the kernel) may still use the alloc's
            // volumes: the task is not dead, so nothing is released, until it dies.
            let mut attempt = 0;
            while let Err(e) = result {
                if !matches!(e, DriverError::KillTimeout { .. }) {
                    self.event(EventKind::StopFailed, format!("destroy failed: {e}"));
                    break;
                }
                attempt += 1;
                // Whole milliseconds, for the event.
                let wait = Duration::from_millis(
                    u64::try_from(self.kill_retry.delay(attempt).as_millis()).unwrap_or(u64::MAX),
                );
                self.event(
                    EventKind::StopFailed,
                    format!(
                        "{e}; its volumes stay mounted while it lives; SIGKILL again in {}",
                        berth_sys::short_duration(wait)
                    ),
                );
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    // The next agent recovers the task and goes on stopping it.
                    () = self.detach.cancelled() => return Phase::Detached,
                }
                result = driver.destroy(id).await;
            }
        }
        let exit = driver.inspect(id).ok().and_then(|s| s.exit);
        let message = exit.map_or_else(|| "stopped".to_owned(), |e| e.to_string());
        let now = SystemTime::now();
        self.update_task_with(self.new_event(EventKind::Exited, message), |t| {
            t.state = TaskRunState::Dead;
            t.handle = None;
            t.lost = false;
            if exit.is_some() {
                t.last_exit = exit;
            }
            t.finished_at = Some(now);
        });
        if let Some(exit) = &exit {
            for hook in &self.hooks {
                hook.exited(&self.ctx, exit).await;
            }
        }
        Phase::Dead { failed: false }
    }
}

/// The directory an alloc's tasks share, in the alloc's directory (Nomad's `alloc/`).
pub(crate) const SHARED_DIR: &str = "alloc";

/// Nomad's task directory layout: the alloc's shared `alloc/` (with `data/` and `tmp/`, open
/// to every user the tasks run as: the alloc's directory itself stays 0700, so only the tasks
/// reach it, through their roots), and, for a task without a root of its own, `local/`,
/// `secrets/` (0700) and `tmp/` in its directory. A driver that gives the task a root makes
/// those itself. A task may have put anything in these (a symlink to a host directory, say):
/// an existing entry is never followed or changed, only refused when it is not a directory.
fn task_layout(shared: &Path, task_dir: &Path, chroot: bool) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    let make = |dir: &Path, mode: u32| -> Result<(), String> {
        let fail = |e: &dyn std::fmt::Display| format!("creating {}: {e}", dir.display());
        match std::fs::symlink_metadata(dir) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => Err(fail(&"something other than a directory is there")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                match std::fs::DirBuilder::new().mode(mode).create(dir) {
                    Ok(()) => {}
                    // A sibling task's prestart made it just now.
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        return match std::fs::symlink_metadata(dir) {
                            Ok(m) if m.is_dir() => Ok(()),
                            _ => Err(fail(&"something other than a directory is there")),
                        };
                    }
                    Err(e) => return Err(fail(&e)),
                }
                // Exactly `mode`, whatever the umask.
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
                    .map_err(|e| fail(&e))
            }
            Err(e) => Err(fail(&e)),
        }
    };
    make(shared, 0o1777)?;
    make(&shared.join("data"), 0o1777)?;
    make(&shared.join("tmp"), 0o1777)?;
    if chroot {
        // The task's `/`: every user must be able to walk it (the alloc's directory, 0700,
        // still keeps the host's users out).
        std::fs::set_permissions(task_dir, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("opening {}: {e}", task_dir.display()))?;
    } else {
        make(&task_dir.join("local"), 0o700)?;
        make(&task_dir.join("secrets"), 0o700)?;
        make(&task_dir.join("tmp"), 0o700)?;
    }
    Ok(())
}

/// The bind mounts of `task`'s volume mounts: each claimed volume's target at the mount's
/// destination, read-only when the mount or the volume is.
fn volume_mounts(rec: &AllocRecord, task: &berth_job::TaskSpec) -> Result<Vec<BindMount>, String> {
    task.volume_mounts
        .iter()
        .map(|m| {
            let vol = rec.volumes.get(&m.volume).ok_or_else(|| {
                format!(
                    "volume_mount names volume {:?}, which the group does not have",
                    m.volume
                )
            })?;
            let target = vol.target.as_ref().filter(|_| vol.claimed).ok_or_else(|| {
                format!(
                    "volume {} ({}) is not claimed: nothing to mount at {}",
                    m.volume, vol.volume_id, m.destination
                )
            })?;
            let destination = m.destination.as_literal().ok_or_else(|| {
                format!(
                    "volume_mount of {} still holds a variable: the alloc was not rendered",
                    m.volume
                )
            })?;
            Ok(BindMount {
                source: target.clone(),
                destination: destination.into(),
                read_only: m.read_only || vol.read_only,
                propagation: match m.propagation {
                    PropagationMode::Private => Propagation::Private,
                    PropagationMode::HostToTask => Propagation::HostToTask,
                    PropagationMode::Bidirectional => Propagation::Bidirectional,
                },
            })
        })
        .collect()
}

/// Copies the driver's events that add to the runner's own (signals, kills, drops) into the
/// alloc's events, until the handler is deregistered.
pub(crate) async fn forward_driver_events(
    shared: Arc<Shared>,
    task: String,
    mut rx: mpsc::Receiver<TaskEvent>,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while let Ok(more) = rx.try_recv() {
            batch.push(more);
        }
        let events = batch
            .into_iter()
            .filter_map(|e| {
                let kind = match e.kind {
                    TaskEventKind::Signaled { .. } => EventKind::Signaled,
                    TaskEventKind::Killed => EventKind::Killed,
                    TaskEventKind::Dropped { .. } => EventKind::EventsDropped,
                    TaskEventKind::Note => EventKind::DriverNote,
                    // The runner makes its own start, recovery and exit events.
                    TaskEventKind::Started { .. }
                    | TaskEventKind::Recovered { .. }
                    | TaskEventKind::Exited { .. } => return None,
                };
                Some(AllocEvent {
                    time: e.time,
                    task: Some(task.clone()),
                    kind,
                    message: e.message,
                })
            })
            .collect::<Vec<_>>();
        if !events.is_empty() {
            shared.events(events);
        }
    }
}

/// Where a task's output goes: thrown away when its `logs` block disables it, rotated by the
/// node's collector when there is one, else appended to its two files.
fn task_logs(logs: &berth_job::LogConfig, collector: Option<&LogCollector>) -> TaskLogs {
    if logs.disabled {
        return TaskLogs::Discarded;
    }
    match collector {
        Some(c) => TaskLogs::Rotated {
            collector: c.clone(),
            rotation: LogRotation {
                max_files: logs.max_files,
                max_file_size_mb: logs.max_file_size_mb,
            },
        },
        None => TaskLogs::Files,
    }
}

/// `<alloc dir>/logs/<task>.stdout` and `.stderr`: the files, or with a collector the base of
/// the numbered files (`<task>.stdout.0`…).
pub(crate) fn log_paths(alloc_dir: &Path, task: &str) -> (PathBuf, PathBuf) {
    let logs = alloc_dir.join("logs");
    (
        logs.join(format!("{task}.stdout")),
        logs.join(format!("{task}.stderr")),
    )
}
