//! The alloc runner: prerun hooks, the task runners, then stop, postrun and destroy.

use std::{
    collections::BTreeMap,
    fmt,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use berth_drivers::{DriverError, TaskId};
use berth_job::{JobType, TaskSpec};
use berth_sys::short_duration;
use tokio::{sync::mpsc, task::JoinSet};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::{
    config::AllocDeps,
    csi_hook::{self, PrerunEnd, interruptible},
    error::AllocError,
    hooks::{AllocContext, AllocHook, TaskContext, TaskEvents, TaskHook},
    record::{
        AllocEvent, AllocRecord, AllocSpec, ClientStatus, DesiredState, EventKind, RECORD_VERSION,
        TaskRunState, hook_names,
    },
    shared::Shared,
    status::AllocStatus,
    task_runner::{Entry, Outcome, TaskRunner, forward_driver_events, log_paths},
};

/// Room in a task's driver-event channel.
const DRIVER_EVENTS: usize = 64;

/// Runs one alloc on this node (Nomad's `allocrunner`, rebuilt): its prerun hooks (wait for
/// upstream allocs, claim the group's volumes), a task runner per task (prestart hooks,
/// start, poststart hooks, restarts), and, once a stop is asked for or every task is dead,
/// stop, postrun (release the volumes) and destroy (forget the tasks in their drivers).
///
/// Every step is written to the [`AllocStore`](crate::AllocStore) before and after it is
/// taken, so that [`AllocRunner::recover`] picks the alloc up after an agent restart. Cheap to
/// clone: clones share the alloc.
#[derive(Clone)]
pub struct AllocRunner {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    spec: AllocSpec,
    task_ids: BTreeMap<String, TaskId>,
    deps: AllocDeps,
    alloc_dir: PathBuf,
    /// Fired by [`AllocRunner::stop`] (or a recovered record that says stop).
    stop: CancellationToken,
    hooks: Mutex<BTreeMap<String, Vec<Arc<dyn TaskHook>>>>,
    alloc_hooks: Mutex<Vec<Arc<dyn AllocHook>>>,
    /// How each task runner begins; taken by `run`.
    entries: Mutex<BTreeMap<String, Entry>>,
    started: AtomicBool,
    /// Per task: fired by [`AllocRunner::restart`].
    restart_now: Mutex<BTreeMap<String, Arc<tokio::sync::Notify>>>,
}

impl fmt::Debug for AllocRunner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AllocRunner")
            .field("alloc_id", &self.inner.spec.alloc_id)
            .field("alloc_dir", &self.inner.alloc_dir)
            .field("started", &self.inner.started.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// How long a restarted agent waits for a task's unrecorded processes to die.
const ORPHAN_KILL_TIMEOUT: Duration = Duration::from_secs(10);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Checks what becomes paths and ids, and that every mount names a group volume; returns
/// the tasks' driver ids.
fn validate(spec: &AllocSpec) -> Result<BTreeMap<String, TaskId>, AllocError> {
    berth_sys::validate_path_segment("alloc id", &spec.alloc_id)?;
    if spec.index >= spec.group.count {
        return Err(AllocError::BadIndex {
            alloc_id: spec.alloc_id.clone(),
            index: spec.index,
            count: spec.group.count,
        });
    }
    if let Some(task) = spec.devices.keys().find(|t| spec.group.task(t).is_none()) {
        return Err(AllocError::NoTask {
            alloc_id: spec.alloc_id.clone(),
            task: task.clone(),
        });
    }
    let mut ids = BTreeMap::new();
    for task in &spec.group.tasks {
        ids.insert(
            task.name.clone(),
            TaskId::for_alloc(&spec.alloc_id, &task.name)?,
        );
        for m in &task.volume_mounts {
            if !spec.group.volumes.contains_key(&m.volume) {
                return Err(AllocError::UnknownVolume {
                    alloc_id: spec.alloc_id.clone(),
                    task: task.name.clone(),
                    volume: m.volume.clone(),
                });
            }
        }
    }
    Ok(ids)
}

impl AllocRunner {
    /// Checks what [`new`](Self::new) checks (ids that become paths, volume mounts naming
    /// group volumes) without writing anything.
    pub fn check(spec: &AllocSpec) -> Result<(), AllocError> {
        validate(spec).map(drop)
    }

    /// A runner for a new alloc; its record is written at once. Call [`run`](Self::run) to
    /// start it.
    pub fn new(spec: AllocSpec, deps: AllocDeps) -> Result<Self, AllocError> {
        let mut runners = Self::new_all(vec![spec], deps)?;
        Ok(runners.remove(0))
    }

    /// Runners for several new allocs (a job's), in the order given. Every spec is checked
    /// before anything is written; then their records are written together (one commit in the
    /// agent's store), so placing many allocs costs one durable write, not one each.
    pub fn new_all(specs: Vec<AllocSpec>, deps: AllocDeps) -> Result<Vec<Self>, AllocError> {
        let mut checked = Vec::with_capacity(specs.len());
        for spec in specs {
            let task_ids = validate(&spec)?;
            let mut record = AllocRecord::new(&spec);
            record.push_event(
                AllocEvent::new(
                    None,
                    EventKind::Received,
                    format!(
                        "alloc {} of group {} of job {}",
                        spec.index, spec.group.name, spec.job_id
                    ),
                ),
                deps.config.max_events,
            );
            checked.push((spec, task_ids, record));
        }
        let records: Vec<AllocRecord> = checked.iter().map(|(_, _, r)| r.clone()).collect();
        deps.store.put_all(&records)?;
        Ok(checked
            .into_iter()
            .map(|(spec, task_ids, record)| {
                let entries = spec
                    .group
                    .tasks
                    .iter()
                    .map(|t| (t.name.clone(), Entry::Start))
                    .collect();
                Self::build(spec, task_ids, record, deps.clone(), entries)
            })
            .collect())
    }

    fn build(
        spec: AllocSpec,
        task_ids: BTreeMap<String, TaskId>,
        record: AllocRecord,
        deps: AllocDeps,
        entries: BTreeMap<String, Entry>,
    ) -> Self {
        let alloc_dir = deps.allocs_dir.join(&spec.alloc_id);
        let shared = Arc::new(Shared::new(
            record,
            deps.store.clone(),
            deps.config.max_events,
        ));
        Self {
            inner: Arc::new(Inner {
                shared,
                spec,
                task_ids,
                deps,
                alloc_dir,
                stop: CancellationToken::new(),
                hooks: Mutex::new(BTreeMap::new()),
                alloc_hooks: Mutex::new(Vec::new()),
                entries: Mutex::new(entries),
                started: AtomicBool::new(false),
                restart_now: Mutex::new(BTreeMap::new()),
            }),
        }
    }

    /// A runner for an alloc found in the store after an agent restart. Every task that was
    /// running is re-attached with its driver's `recover`, without restarting it; claimed
    /// volumes are not claimed again (the volume side kept them). A task whose process is
    /// gone is restarted under its restart policy by [`run`](Self::run), but only once
    /// `deps.servers_contacted` opens. Hooks that were done are not run again.
    pub async fn recover(record: AllocRecord, deps: AllocDeps) -> Result<Self, AllocError> {
        if record.version != RECORD_VERSION {
            return Err(AllocError::RecordVersion {
                alloc_id: record.alloc_id,
                found: record.version,
                supported: RECORD_VERSION,
            });
        }
        let spec = AllocSpec {
            alloc_id: record.alloc_id.clone(),
            job_id: record.job_id.clone(),
            job_type: record.job_type,
            group: record.group.clone(),
            index: record.index,
            devices: record.devices.clone(),
        };
        let task_ids = validate(&spec)?;
        let bad = |reason: String| AllocError::BadRecord {
            alloc_id: spec.alloc_id.clone(),
            reason,
        };
        for task in &spec.group.tasks {
            if !record.tasks.contains_key(&task.name) {
                return Err(bad(format!("task {} has no state", task.name)));
            }
        }
        for name in spec.group.volumes.keys() {
            if !record.volumes.contains_key(name) {
                return Err(bad(format!("volume {name} has no state")));
            }
        }
        let stopping = record.desired == DesiredState::Stop;
        let finished = record.is_finished();
        // Its devices stay taken until it is finished.
        if finished {
            deps.devices.release(&spec.alloc_id);
        } else {
            for (task, assignments) in &spec.devices {
                deps.devices.restore(&spec.alloc_id, task, assignments);
            }
        }
        let runner = Self::build(spec, task_ids, record, deps, BTreeMap::new());
        if stopping {
            runner.inner.stop.cancel();
        }
        if !finished {
            let entries = runner.reattach().await;
            *lock(&runner.inner.entries) = entries;
        }
        Ok(runner)
    }

    /// Re-attaches the tasks that were running; says how each task runner begins.
    async fn reattach(&self) -> BTreeMap<String, Entry> {
        let inner = &self.inner;
        let mut entries = BTreeMap::new();
        for task in &inner.spec.group.tasks {
            let name = task.name.as_str();
            let Some(t) = inner.shared.read(|rec| rec.tasks.get(name).cloned()) else {
                continue;
            };
            let entry = match (t.state, t.handle) {
                (TaskRunState::Dead, _) => continue,
                (TaskRunState::Pending, _) if t.lost => Entry::Lost,
                (TaskRunState::Pending, _) => Entry::Start,
                (_, None) => {
                    let message = self.kill_orphans(name).await;
                    self.lose(name, message)
                }
                (_, Some(handle)) => {
                    let pid = handle.pid;
                    match inner.deps.drivers.driver(&handle.driver) {
                        None => self.lose(
                            name,
                            format!(
                                "cannot re-attach to pid {pid}: no task driver {:?} on this node",
                                handle.driver
                            ),
                        ),
                        Some(driver) => match driver.recover(handle).await {
                            Ok(()) => {
                                let _ = inner.shared.update_with(
                                    AllocEvent::new(
                                        Some(name),
                                        EventKind::Recovered,
                                        format!("re-attached to pid {pid}"),
                                    ),
                                    |rec| {
                                        if let Some(t) = rec.tasks.get_mut(name) {
                                            t.state = TaskRunState::Running;
                                        }
                                    },
                                );
                                Entry::Attached
                            }
                            Err(e) => {
                                self.lose(name, format!("cannot re-attach to pid {pid}: {e}"))
                            }
                        },
                    }
                }
            };
            entries.insert(name.to_owned(), entry);
        }
        entries
    }

    /// Kills the processes of `task` started by an agent that stopped before it recorded
    /// their handle (found by the `BERTH_ALLOC_ID` and `BERTH_TASK_NAME` every task gets), so
    /// the restart that follows does not run the task twice. Says what it did.
    async fn kill_orphans(&self, task: &str) -> String {
        let alloc_id = self.inner.spec.alloc_id.as_str();
        let pids = berth_sys::procs::pids_with_env(&[
            ("BERTH_ALLOC_ID", alloc_id),
            ("BERTH_TASK_NAME", task),
        ]);
        let head = "the agent stopped while the task was starting";
        if pids.is_empty() {
            return format!("{head}; no process of it runs");
        }
        let list = |p: &[i32]| {
            p.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let alive = berth_sys::procs::kill_and_wait(&pids, ORPHAN_KILL_TIMEOUT).await;
        if alive.is_empty() {
            format!("{head}; killed its unrecorded process(es) {}", list(&pids))
        } else {
            tracing::error!(alloc_id, task, pids = %list(&alive), "unrecorded task processes survive SIGKILL");
            format!(
                "{head}; its unrecorded process(es) {} survive SIGKILL",
                list(&alive)
            )
        }
    }

    /// Records that `task`'s process is lost.
    fn lose(&self, task: &str, message: String) -> Entry {
        let _ = self.inner.shared.update_with(
            AllocEvent::new(Some(task), EventKind::RecoverFailed, message),
            |rec| {
                if let Some(t) = rec.tasks.get_mut(task) {
                    t.state = TaskRunState::Pending;
                    t.handle = None;
                    t.lost = true;
                }
            },
        );
        Entry::Lost
    }

    /// Adds a hook to task `task`, run after the built-in ones and those added before. Legal
    /// only before [`run`](Self::run).
    pub fn add_task_hook(&self, task: &str, hook: Arc<dyn TaskHook>) -> Result<(), AllocError> {
        let inner = &self.inner;
        if inner.started.load(Ordering::SeqCst) {
            return Err(AllocError::AlreadyRunning {
                alloc_id: inner.spec.alloc_id.clone(),
            });
        }
        if inner.spec.group.task(task).is_none() {
            return Err(AllocError::NoTask {
                alloc_id: inner.spec.alloc_id.clone(),
                task: task.to_owned(),
            });
        }
        lock(&inner.hooks)
            .entry(task.to_owned())
            .or_default()
            .push(hook);
        Ok(())
    }

    /// Adds an alloc hook, run after the built-in ones and those added before. Legal only
    /// before [`run`](Self::run); its name must not be taken.
    pub fn add_alloc_hook(&self, hook: Arc<dyn AllocHook>) -> Result<(), AllocError> {
        let inner = &self.inner;
        if inner.started.load(Ordering::SeqCst) {
            return Err(AllocError::AlreadyRunning {
                alloc_id: inner.spec.alloc_id.clone(),
            });
        }
        let mut hooks = lock(&inner.alloc_hooks);
        let name = hook.name();
        if [hook_names::UPSTREAM_ALLOCS, hook_names::CSI].contains(&name)
            || hooks.iter().any(|h| h.name() == name)
        {
            return Err(AllocError::HookName {
                alloc_id: inner.spec.alloc_id.clone(),
                name: name.to_owned(),
            });
        }
        hooks.push(hook);
        Ok(())
    }

    fn alloc_context(&self) -> AllocContext {
        let inner = &self.inner;
        AllocContext {
            alloc_id: inner.spec.alloc_id.clone(),
            job_id: inner.spec.job_id.clone(),
            group: inner.spec.group.clone(),
            index: inner.spec.index,
            alloc_dir: inner.alloc_dir.clone(),
            events: TaskEvents::for_alloc(inner.shared.clone()),
        }
    }

    /// The alloc's id.
    pub fn alloc_id(&self) -> &str {
        &self.inner.spec.alloc_id
    }

    /// The alloc's group: its tasks and volumes.
    pub fn group(&self) -> &berth_job::GroupSpec {
        &self.inner.spec.group
    }

    /// The alloc's directory: `<task>/` working directories and `logs/<task>.stdout|stderr`.
    pub fn alloc_dir(&self) -> &Path {
        &self.inner.alloc_dir
    }

    /// The alloc's status as last persisted: nothing shows (a task's pid, an event) before
    /// it is durable, so what a status reports survives a kill -9 of the agent.
    pub fn status(&self) -> AllocStatus {
        self.inner.shared.read_durable(AllocStatus::from_record)
    }

    /// A copy of the alloc's record as last persisted.
    pub fn record(&self) -> AllocRecord {
        self.inner.shared.read_durable(Clone::clone)
    }

    /// Asks the alloc to stop: [`run`](Self::run) stops every task (kill signal, then
    /// `SIGKILL` after the task's `kill_timeout`), releases the volumes, destroys the tasks
    /// and returns. Persisted, so a recovered alloc goes on stopping. Legal at any time;
    /// later calls, and calls once the alloc is finished, only record the desired state.
    pub fn stop(&self) {
        let inner = &self.inner;
        let mut first = false;
        let _ = inner.shared.update(|rec| {
            first = rec.desired != DesiredState::Stop && !rec.is_finished();
            rec.desired = DesiredState::Stop;
        });
        if first {
            inner
                .shared
                .event(None, EventKind::AllocStopping, "stop requested");
        }
        inner.stop.cancel();
    }

    /// The tasks `task` names (every task when `None`), or [`AllocError::NoTask`].
    fn tasks_named(&self, task: Option<&str>) -> Result<Vec<String>, AllocError> {
        let group = &self.inner.spec.group;
        match task {
            None => Ok(group.tasks.iter().map(|t| t.name.clone()).collect()),
            Some(t) if group.task(t).is_some() => Ok(vec![t.to_owned()]),
            Some(t) => Err(AllocError::NoTask {
                alloc_id: self.inner.spec.alloc_id.clone(),
                task: t.to_owned(),
            }),
        }
    }

    fn restart_notify(&self, task: &str) -> Arc<tokio::sync::Notify> {
        Arc::clone(
            lock(&self.inner.restart_now)
                .entry(task.to_owned())
                .or_default(),
        )
    }

    /// Restarts the running tasks `task` names (every running task when `None`): each is
    /// stopped as a stop does (kill signal, `SIGKILL` after its `kill_timeout`) and started
    /// again at once, without counting against its restart policy. Returns the tasks that
    /// were running and will restart; a task that is not running is left alone.
    pub fn restart(&self, task: Option<&str>) -> Result<Vec<String>, AllocError> {
        let names = self.tasks_named(task)?;
        let running = self.running_tasks(&names);
        for name in &running {
            self.restart_notify(name).notify_one();
        }
        Ok(running)
    }

    /// Sends `signal` to the running tasks `task` names (every running task when `None`);
    /// returns those it was sent to.
    pub fn signal(
        &self,
        task: Option<&str>,
        signal: berth_drivers::Signal,
    ) -> Result<Vec<String>, AllocError> {
        let names = self.tasks_named(task)?;
        let mut sent = Vec::new();
        for name in self.running_tasks(&names) {
            let Some(spec) = self.inner.spec.group.task(&name) else {
                continue;
            };
            let (Some(driver), Some(id)) = (
                self.inner.deps.drivers.driver(&spec.driver),
                self.inner.task_ids.get(&name),
            ) else {
                continue;
            };
            // The driver reports the signal as a task event.
            match driver.signal(id, signal) {
                Ok(()) => sent.push(name),
                Err(e) => self.inner.shared.event(
                    Some(&name),
                    EventKind::Signaled,
                    format!("{signal} could not be sent: {e}"),
                ),
            }
        }
        Ok(sent)
    }

    /// Of `names`, those whose process runs now.
    fn running_tasks(&self, names: &[String]) -> Vec<String> {
        self.inner.shared.read(|rec| {
            names
                .iter()
                .filter(|n| {
                    rec.tasks
                        .get(*n)
                        .is_some_and(|t| t.state == crate::record::TaskRunState::Running)
                })
                .cloned()
                .collect()
        })
    }

    /// Runs the alloc until it is finished, and returns its final status (complete or
    /// failed). May be called once.
    ///
    /// When `cancel` fires (the agent shuts down) the runner stops supervising and returns
    /// [`AllocError::Cancelled`]: tasks keep running and volumes stay claimed, for the next
    /// agent to [`recover`](Self::recover).
    pub async fn run(&self, cancel: CancellationToken) -> Result<ClientStatus, AllocError> {
        let inner = &self.inner;
        if inner.started.swap(true, Ordering::SeqCst) {
            return Err(AllocError::AlreadyRunning {
                alloc_id: inner.spec.alloc_id.clone(),
            });
        }
        let cancelled = || AllocError::Cancelled {
            alloc_id: inner.spec.alloc_id.clone(),
        };
        let (finished, over) = inner.shared.read(|rec| {
            (
                rec.is_finished(),
                rec.client_status.is_terminal() || rec.failure.is_some(),
            )
        });
        if finished {
            inner.deps.devices.release(&inner.spec.alloc_id);
            return Ok(inner.shared.read(|rec| rec.client_status));
        }

        let kill = CancellationToken::new();
        if over || inner.stop.is_cancelled() {
            kill.cancel();
        } else {
            match self.prerun(&cancel).await {
                Ok(()) => {
                    let _ = inner.shared.update(|rec| {
                        if rec.client_status == ClientStatus::Pending {
                            rec.client_status = ClientStatus::Running;
                        }
                    });
                }
                Err(PrerunEnd::Cancelled) => return Err(cancelled()),
                Err(PrerunEnd::Stopped) => kill.cancel(),
                Err(PrerunEnd::Failed(message)) => {
                    let _ = inner.shared.update(|rec| rec.failure = Some(message));
                    kill.cancel();
                }
            }
        }

        let detached = self.run_tasks(&cancel, &kill).await;
        if detached || cancel.is_cancelled() {
            return Err(cancelled());
        }

        // Postrun: every task is dead here.
        let hooks = lock(&inner.alloc_hooks).clone();
        if !hooks.is_empty() {
            let ctx = self.alloc_context();
            for hook in hooks {
                let name = hook.name();
                if inner.shared.read(|rec| rec.hooks.postrun.contains(name)) {
                    continue;
                }
                tokio::select! {
                    () = cancel.cancelled() => return Err(cancelled()),
                    () = hook.postrun(&ctx) => {}
                }
                let _ = inner.shared.update(|rec| {
                    rec.hooks.postrun.insert(name.to_owned());
                });
            }
        }
        let postrun_done = inner
            .shared
            .read(|rec| rec.hooks.postrun.contains(hook_names::CSI));
        if !postrun_done {
            let released = csi_hook::release_volumes(
                &inner.shared,
                inner.deps.volumes.as_ref(),
                inner.deps.config.release_retry,
                &cancel,
            )
            .await;
            match released {
                Ok(true) => {
                    let _ = inner.shared.update(|rec| {
                        rec.hooks.postrun.insert(hook_names::CSI.to_owned());
                    });
                }
                Ok(false) => {}
                Err(()) => return Err(cancelled()),
            }
        }

        // Destroy.
        if !inner.shared.read(|rec| rec.hooks.destroyed) {
            self.destroy_tasks().await;
            let _ = inner.shared.update(|rec| rec.hooks.destroyed = true);
        }
        // Every task is destroyed: nothing uses the alloc's devices any more.
        if inner.spec.devices.values().any(|a| !a.is_empty()) {
            inner.deps.devices.release(&inner.spec.alloc_id);
            inner
                .shared
                .event(None, EventKind::DevicesReleased, "devices released");
        }

        let (status, event) = inner.shared.read(|rec| {
            let failed_tasks: Vec<&str> = rec
                .tasks
                .iter()
                .filter(|(_, t)| t.failed)
                .map(|(n, _)| n.as_str())
                .collect();
            if let Some(failure) = &rec.failure {
                (
                    ClientStatus::Failed,
                    AllocEvent::new(None, EventKind::AllocFailed, failure.clone()),
                )
            } else if !failed_tasks.is_empty() {
                (
                    ClientStatus::Failed,
                    AllocEvent::new(
                        None,
                        EventKind::AllocFailed,
                        format!("task {} failed", failed_tasks.join(", ")),
                    ),
                )
            } else {
                let how = if rec.desired == DesiredState::Stop {
                    "stopped as asked"
                } else {
                    "every task finished"
                };
                (
                    ClientStatus::Complete,
                    AllocEvent::new(None, EventKind::AllocComplete, how),
                )
            }
        });
        let _ = inner
            .shared
            .update_with(event, |rec| rec.client_status = status);
        Ok(status)
    }

    /// Prerun hooks not done yet, in order: upstream allocs, volume claims, then the alloc
    /// hooks.
    async fn prerun(&self, cancel: &CancellationToken) -> Result<(), PrerunEnd> {
        let inner = &self.inner;
        let done = |hook: &str| inner.shared.read(|rec| rec.hooks.prerun.contains(hook));
        let mark = |hook: &str| {
            let _ = inner.shared.update(|rec| {
                rec.hooks.prerun.insert(hook.to_owned());
            });
        };
        if !done(hook_names::UPSTREAM_ALLOCS) {
            self.wait_upstream(cancel).await?;
            mark(hook_names::UPSTREAM_ALLOCS);
        }
        if !done(hook_names::CSI) {
            csi_hook::claim_volumes(
                &inner.shared,
                inner.deps.volumes.as_ref(),
                inner.deps.config.claim_retry,
                &inner.spec.group,
                cancel,
                &inner.stop,
            )
            .await?;
            mark(hook_names::CSI);
        }
        let hooks = lock(&inner.alloc_hooks).clone();
        if !hooks.is_empty() {
            let ctx = self.alloc_context();
            for hook in hooks {
                if done(hook.name()) {
                    continue;
                }
                interruptible(hook.prerun(&ctx), cancel, &inner.stop)
                    .await?
                    .map_err(|e| PrerunEnd::Failed(e.message))?;
                mark(hook.name());
            }
        }
        Ok(())
    }

    /// Waits (bounded) for the allocs this one replaces; goes on when waiting fails or times
    /// out.
    async fn wait_upstream(&self, cancel: &CancellationToken) -> Result<(), PrerunEnd> {
        let inner = &self.inner;
        let upstream = inner.deps.upstream.upstream(&inner.spec);
        if upstream.is_empty() {
            return Ok(());
        }
        let timeout = inner.deps.config.upstream_timeout;
        inner.shared.event(
            None,
            EventKind::UpstreamWaiting,
            format!(
                "waiting up to {} for previous allocs {} to finish",
                short_duration(timeout),
                upstream.join(", ")
            ),
        );
        let waited = interruptible(
            tokio::time::timeout(timeout, inner.deps.upstream.wait(&inner.spec)),
            cancel,
            &inner.stop,
        )
        .await?;
        let (kind, message) = match waited {
            Ok(Ok(())) => (
                EventKind::UpstreamDone,
                "previous allocs finished".to_owned(),
            ),
            Ok(Err(e)) => (
                EventKind::UpstreamGaveUp,
                format!("waiting for previous allocs failed: {e}; going on"),
            ),
            Err(_) => (
                EventKind::UpstreamGaveUp,
                format!(
                    "previous allocs still not finished after {}; going on",
                    short_duration(timeout)
                ),
            ),
        };
        inner.shared.event(None, kind, message);
        Ok(())
    }

    fn task_runner(
        &self,
        task: &TaskSpec,
        task_id: TaskId,
        kill: &CancellationToken,
        detach: &CancellationToken,
    ) -> TaskRunner {
        let inner = &self.inner;
        let (stdout, stderr) = log_paths(&inner.alloc_dir, &task.name);
        TaskRunner {
            shared: inner.shared.clone(),
            ctx: TaskContext {
                alloc_id: inner.spec.alloc_id.clone(),
                job_id: inner.spec.job_id.clone(),
                group: inner.spec.group.name.clone(),
                task: task.clone(),
                task_id,
                alloc_dir: inner.alloc_dir.clone(),
                task_dir: inner.alloc_dir.join(&task.name),
                events: TaskEvents::new(inner.shared.clone(), &task.name),
            },
            stdout,
            stderr,
            index: inner.spec.index,
            driver: inner.deps.drivers.driver(&task.driver),
            hooks: lock(&inner.hooks)
                .get(&task.name)
                .cloned()
                .unwrap_or_default(),
            batch: inner.spec.job_type == JobType::Batch,
            restart: task.restart,
            kill: kill.clone(),
            detach: detach.clone(),
            devices: inner.deps.devices.clone(),
            assignments: inner
                .spec
                .devices
                .get(&task.name)
                .cloned()
                .unwrap_or_default(),
            servers_contacted: inner.deps.servers_contacted.clone(),
            kill_retry: inner.deps.config.kill_retry,
            restart_now: self.restart_notify(&task.name),
            start_slots: inner.deps.config.start_slots.clone(),
            log_collector: inner.deps.log_collector.clone(),
        }
    }

    /// Runs a task runner per task that is not dead and supervises them: a stop kills every
    /// task, a task that fails kills the others. Returns whether a runner was detached
    /// (the agent shuts down); otherwise every task is dead.
    async fn run_tasks(&self, cancel: &CancellationToken, kill: &CancellationToken) -> bool {
        let inner = &self.inner;
        let entries = std::mem::take(&mut *lock(&inner.entries));
        let detach = cancel.child_token();
        let forwarders = TaskTracker::new();
        let mut runners = JoinSet::new();
        let mut names = BTreeMap::new();
        for task in &inner.spec.group.tasks {
            let (Some(&entry), Some(task_id)) =
                (entries.get(&task.name), inner.task_ids.get(&task.name))
            else {
                continue;
            };
            let (tx, rx) = mpsc::channel(DRIVER_EVENTS);
            inner.deps.drivers.register_handler(task_id, tx);
            forwarders.spawn(forward_driver_events(
                inner.shared.clone(),
                task.name.clone(),
                rx,
            ));
            let runner = self.task_runner(task, task_id.clone(), kill, &detach);
            let name = task.name.clone();
            let handle = runners.spawn(async move { (name, runner.run(entry).await) });
            names.insert(handle.id(), task.name.clone());
        }

        let mut detached = false;
        loop {
            tokio::select! {
                () = inner.stop.cancelled(), if !kill.is_cancelled() => kill.cancel(),
                joined = runners.join_next() => match joined {
                    None => break,
                    Some(Ok((_, Outcome::Detached))) => detached = true,
                    Some(Ok((_, Outcome::Dead { failed: false }))) => {}
                    Some(Ok((name, Outcome::Dead { failed: true }))) => {
                        if !kill.is_cancelled() {
                            kill.cancel();
                            inner.shared.event(
                                None,
                                EventKind::AllocStopping,
                                format!("task {name} failed: stopping the other tasks"),
                            );
                        }
                    }
                    Some(Err(e)) => {
                        // Its process may still run: kill it now, before the volumes go.
                        let name = names.get(&e.id()).cloned().unwrap_or_default();
                        tracing::error!(alloc_id = %inner.spec.alloc_id, task = %name, error = %e, "a task runner panicked");
                        self.destroy_task(&name).await;
                        let _ = inner.shared.update(|rec| {
                            if let Some(t) = rec.tasks.get_mut(&name) {
                                t.state = TaskRunState::Dead;
                                t.handle = None;
                                t.failed = true;
                            }
                            rec.failure
                                .get_or_insert_with(|| format!("the runner of task {name} panicked"));
                        });
                        kill.cancel();
                    }
                },
            }
        }
        // Driver events of the tasks end with their handlers.
        for task_id in inner.task_ids.values() {
            inner.deps.drivers.deregister_handler(task_id);
        }
        forwarders.close();
        forwarders.wait().await;
        detached
    }

    /// Forgets every task in its driver (killing what would still run).
    async fn destroy_tasks(&self) {
        for task in &self.inner.spec.group.tasks {
            self.destroy_task(&task.name).await;
        }
    }

    /// Forgets task `name` in its driver (killing it if it still runs).
    async fn destroy_task(&self, name: &str) {
        let inner = &self.inner;
        let (Some(task), Some(task_id)) = (inner.spec.group.task(name), inner.task_ids.get(name))
        else {
            return;
        };
        let Some(driver) = inner.deps.drivers.driver(&task.driver) else {
            return;
        };
        match driver.destroy(task_id).await {
            Ok(()) => inner.shared.event(
                Some(name),
                EventKind::Destroyed,
                format!("forgotten by driver {}", task.driver),
            ),
            Err(DriverError::NotFound { .. }) => {}
            Err(e) => inner.shared.event(
                Some(name),
                EventKind::StopFailed,
                format!("destroy failed: {e}"),
            ),
        }
    }
}
