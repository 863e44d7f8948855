//! `docker`: Nomad's docker task config, run as containers through podman (its command line;
//! no daemon) with runc.
//!
//! A start is `podman create` (every option checked first), then `podman start --attach`,
//! whose standard output and error are the task's log files: with podman's `passthrough` log
//! driver the container writes to them directly, so nothing is copied and nothing is lost
//! while the agent is down. That `podman start` process is also the driver's waiter: it ends
//! when the container does, with its exit code. The container's first process (its pid read
//! from the runtime's pid file) is what signals go to; conmon, not the agent, is the
//! container's parent, so a container outlives the agent and is re-attached by id
//! ([`Driver::recover`], then `podman wait`), its exit code known either way.

mod config;
mod create;
mod podman;

use std::{
    collections::{BTreeMap, HashMap},
    fs,
    io::Read as _,
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, SystemTime},
};

use nix::{sys::signal::Signal, unistd::Pid};
use tokio::sync::watch;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

pub use config::{ContainerConfig, DockerConfig, NetworkMode, TmpfsMount, Ulimit};

use crate::{
    driver::{Capabilities, Driver, DriverFuture, Fingerprint, FsIsolation, Health},
    error::DriverError,
    event::{EventSink, TaskEvent, TaskEventKind},
    logs::{RotatedOutput, TaskLogs, prepare_outputs},
    procfs,
    task::{
        ExitResult, HANDLE_VERSION, TaskConfig, TaskHandle, TaskId, TaskState, TaskStats,
        TaskStatus,
    },
    task_exec::{ExecCommand, ExecRequest, ExecSession, spawn_exec},
};
use podman::{COMMAND_TIMEOUT, Podman, PodmanError};

/// The driver's name (the one Nomad's job files use).
pub const DOCKER: &str = "docker";

/// podman lowers its own `RLIMIT_NPROC` to this before it starts a container, so no container
/// may be given more.
const PODMAN_NPROC: u64 = 32768;

/// How long a container may take from `podman start` to its first process running.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a container may take to go after `SIGKILL`.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// How often the start polls for the runtime's pid file (a stat of one file).
const PIDFILE_POLL: Duration = Duration::from_millis(2);

/// Why an image podman does not have fails the task.
const NOT_STORED: &str = "is not in podman's storage, and berth pulls from no registry: load it \
     first (podman load, podman import) or name an archive (docker-archive:/path.tar, \
     oci-archive:/path.tar, oci:/dir:tag)";

/// The name of the task's private directory (its start's files) under its task directory.
const PRIVATE_DIR: &str = ".container";

/// Runs tasks as podman containers. See the module documentation.
#[derive(Debug)]
pub struct DockerDriver {
    config: DockerConfig,
    podman: Podman,
    events: EventSink,
    tasks: Mutex<HashMap<TaskId, Slot>>,
    cancel: CancellationToken,
    tracker: TaskTracker,
}

#[derive(Debug)]
enum Slot {
    /// A start or recover is under way.
    Reserved,
    Ready(Arc<Container>),
}

#[derive(Debug)]
struct Container {
    handle: TaskHandle,
    id: String,
    exit: watch::Sender<Option<ExitResult>>,
}

impl Container {
    fn exit(&self) -> Option<ExitResult> {
        *self.exit.borrow()
    }

    /// Whether its first process is still the one started (not a recycled pid).
    fn identity_holds(&self) -> bool {
        procfs::is_same_live_process(self.handle.pid, self.handle.start_ticks)
    }
}

impl DockerDriver {
    /// A driver running podman as `config` says, sending task events to `events`.
    pub fn new(events: EventSink, config: DockerConfig) -> Self {
        let podman = Podman::new(
            &config.podman,
            &config.runtime,
            config.storage_root.as_deref(),
            config.run_root.as_deref(),
        );
        Self {
            config,
            podman,
            events,
            tasks: Mutex::new(HashMap::new()),
            cancel: CancellationToken::new(),
            tracker: TaskTracker::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<TaskId, Slot>> {
        self.tasks.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn emit(&self, id: &TaskId, kind: TaskEventKind, message: impl Into<String>) {
        self.events
            .emit(TaskEvent::new(id.clone(), DOCKER, kind, message));
    }

    fn get(&self, id: &TaskId) -> Result<Arc<Container>, DriverError> {
        match self.lock().get(id) {
            Some(Slot::Ready(c)) => Ok(Arc::clone(c)),
            _ => Err(DriverError::NotFound {
                task_id: id.clone(),
                driver: DOCKER.into(),
            }),
        }
    }

    fn reserve(&self, id: &TaskId) -> Result<Reserved<'_>, DriverError> {
        let mut tasks = self.lock();
        if tasks.contains_key(id) {
            return Err(DriverError::AlreadyExists {
                task_id: id.clone(),
                driver: DOCKER.into(),
            });
        }
        tasks.insert(id.clone(), Slot::Reserved);
        Ok(Reserved {
            driver: self,
            id: Some(id.clone()),
        })
    }

    fn shut_down(&self) -> DriverError {
        DriverError::ShutDown {
            driver: DOCKER.into(),
        }
    }

    fn podman_err(&self, id: &TaskId, what: &str, e: PodmanError) -> DriverError {
        DriverError::Setup {
            task_id: id.clone(),
            message: format!("{what}: {e}"),
        }
    }

    /// What `podman create` is given besides a task's own limits.
    fn defaults() -> create::Defaults {
        use nix::sys::resource::{Resource, getrlimit};
        let mut ulimits = BTreeMap::new();
        let mut ceilings = BTreeMap::new();
        if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
            ulimits.insert("nofile".into(), Ulimit { soft, hard });
            ceilings.insert("nofile".into(), hard);
        }
        if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NPROC) {
            let most = hard.min(PODMAN_NPROC);
            ulimits.insert(
                "nproc".into(),
                Ulimit {
                    soft: most,
                    hard: most,
                },
            );
            ceilings.insert("nproc".into(), most);
        }
        create::Defaults { ulimits, ceilings }
    }

    /// The image to create the container from: a name already in podman's storage as is; an
    /// archive or layout loaded first (by its transport, which reaches no registry), then its
    /// image id. A missing image fails at once: the driver pulls from no registry.
    async fn resolve_image(&self, id: &TaskId, image: &str) -> Result<String, DriverError> {
        let bad = |reason: String| DriverError::Image {
            task_id: id.clone(),
            image: image.to_owned(),
            reason,
        };
        const LOADABLE: [&str; 4] = ["docker-archive:", "oci-archive:", "oci:", "dir:"];
        if let Some(transport) = LOADABLE.iter().find(|t| image.starts_with(**t)) {
            let rest = &image[transport.len()..];
            let path = rest.split(':').next().unwrap_or_default();
            if !Path::new(path).is_absolute() {
                return Err(bad(format!("{path:?} is not an absolute path")));
            }
            if !Path::new(path).exists() {
                return Err(bad(format!("{path} does not exist")));
            }
            let out = self
                .podman
                .run(["pull", "--quiet", image], COMMAND_TIMEOUT)
                .await
                .map_err(|e| bad(format!("loading it: {e}")))?;
            let image_id = out.lines().last().unwrap_or_default().trim().to_owned();
            if image_id.is_empty() {
                return Err(bad("podman pull named no image".into()));
            }
            return Ok(image_id);
        }
        if image.contains("://") || image.starts_with('-') || image.contains(char::is_whitespace) {
            return Err(bad("is not an image reference".into()));
        }
        // Whether podman has it is learnt from the create itself (`--pull never`).
        Ok(image.to_owned())
    }

    /// Checks what the agent's settings decide: privileged mode and host paths.
    fn check_allowed(&self, config: &TaskConfig, c: &ContainerConfig) -> Result<(), DriverError> {
        let bad = |field: String, reason: String| DriverError::InvalidConfig {
            task_id: config.id.clone(),
            field,
            reason,
        };
        if config.privileged && !self.config.allow_privileged {
            return Err(bad(
                "privileged".into(),
                "this agent does not allow privileged containers (plugin \"docker\" { config { \
                 allow_privileged = true } })"
                    .into(),
            ));
        }
        let dirs = config.dirs.as_ref();
        for (i, m) in c.host_volumes.iter().enumerate() {
            let field = format!("host_volumes[{i}].source");
            if !m.source.is_absolute() {
                return Err(bad(
                    field,
                    format!("{} is not absolute", m.source.display()),
                ));
            }
            let inside = dirs.is_some_and(|d| {
                config::lies_in(&m.source, &d.task_dir) || config::lies_in(&m.source, &d.alloc_dir)
            });
            if !inside && !self.config.volumes_enabled {
                return Err(bad(
                    field,
                    format!(
                        "{} lies outside the task's directories, and this agent does not allow \
                         host volumes (plugin \"docker\" {{ config {{ volumes {{ enabled = true \
                         }} }} }})",
                        m.source.display()
                    ),
                ));
            }
            if !m.source.exists() {
                return Err(bad(field, format!("{} does not exist", m.source.display())));
            }
        }
        for (i, m) in config.mounts.iter().enumerate() {
            if !m.source.exists() {
                return Err(bad(
                    format!("mounts[{i}].source"),
                    format!("{} does not exist", m.source.display()),
                ));
            }
        }
        Ok(())
    }

    async fn start_task(&self, config: TaskConfig) -> Result<TaskHandle, DriverError> {
        config.validate()?;
        let id = config.id.clone();
        let bad = |field: &str, reason: String| DriverError::InvalidConfig {
            task_id: id.clone(),
            field: field.into(),
            reason,
        };
        let Some(container) = config.container.clone() else {
            return Err(bad("container", "the docker driver needs an image".into()));
        };
        if container.image.trim().is_empty() {
            return Err(bad("container.image", "must not be empty".into()));
        }
        let Some(dirs) = config.dirs.clone() else {
            return Err(bad(
                "dirs",
                "the docker driver mounts the task's directories: they must be given".into(),
            ));
        };
        self.check_allowed(&config, &container)?;
        let env = create::env_file(&config.env).map_err(|(f, r)| bad(&f, r))?;
        let reserved = self.reserve(&id)?;

        let image = self.resolve_image(&id, &container.image).await?;
        let private = dirs.task_dir.join(PRIVATE_DIR);
        let io = |what: &'static str, path: &Path| {
            let task_id = id.clone();
            let path = path.to_path_buf();
            move |source| DriverError::Io {
                task_id,
                what,
                path,
                source,
            }
        };
        make_dir(&private, 0o700).map_err(io("creating", &private))?;
        let files = create::StartFiles::in_dir(&private);
        for f in [&files.cidfile, &files.pidfile] {
            match fs::remove_file(f) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("removing", f)(e)),
            }
        }
        let mut mounted: Vec<(PathBuf, &str)> = vec![(dirs.alloc_dir.clone(), "/alloc")];
        for (name, mode) in [("local", 0o777), ("secrets", 0o777)] {
            let dir = dirs.task_dir.join(name);
            make_dir(&dir, mode).map_err(io("creating", &dir))?;
        }
        mounted.push((dirs.task_dir.join("local"), "/local"));
        mounted.push((dirs.task_dir.join("secrets"), "/secrets"));
        let name = container_name(&id);
        let args = create::create_args(
            &config,
            &container,
            &image,
            &name,
            &files,
            &Self::defaults(),
            &mounted,
        )
        .map_err(|(f, r)| bad(&f, r))?;

        // A container of this name left by a start that did not finish (the agent died
        // between create and persisting the handle) is not any task's: remove it.
        self.podman
            .remove(&name)
            .await
            .map_err(|e| self.podman_err(&id, "removing a leftover container", e))?;
        write_private(&files.envfile, env.as_bytes()).map_err(io("writing", &files.envfile))?;
        let created = self.podman.run(&args, COMMAND_TIMEOUT).await;
        // The environment may hold secrets: it lives no longer than the create.
        let _ = fs::remove_file(&files.envfile);
        match created {
            Ok(_) => {}
            Err(PodmanError::Failed { message, .. }) if message.contains("image not known") => {
                return Err(DriverError::Image {
                    task_id: id.clone(),
                    image: container.image.clone(),
                    reason: NOT_STORED.into(),
                });
            }
            Err(e) => return Err(self.podman_err(&id, "creating the container", e)),
        }
        let cid = fs::read_to_string(&files.cidfile)
            .map(|s| s.trim().to_owned())
            .map_err(io("reading", &files.cidfile))?;
        match self.run_created(&config, &cid, &files).await {
            Ok((handle, waiter)) => {
                let (exit, _) = watch::channel(None);
                let entry = Arc::new(Container {
                    handle: handle.clone(),
                    id: cid.clone(),
                    exit,
                });
                reserved.commit(Arc::clone(&entry));
                self.emit(&id, TaskEventKind::Started { pid: handle.pid }, "started");
                self.emit(
                    &id,
                    TaskEventKind::Note,
                    format!(
                        "container {} ({name}) from image {}",
                        short(&cid),
                        container.image
                    ),
                );
                self.watch(entry, Waiter::Start(waiter));
                Ok(handle)
            }
            Err(e) => {
                if let Err(rm) = self.podman.remove(&cid).await {
                    tracing::warn!(task = %id, error = %rm, "removing a container that did not start");
                }
                Err(e)
            }
        }
    }

    /// Starts created container `cid` with its output on the task's log files; returns once
    /// its first process runs.
    async fn run_created(
        &self,
        config: &TaskConfig,
        cid: &str,
        files: &create::StartFiles,
    ) -> Result<(TaskHandle, tokio::process::Child), DriverError> {
        let id = &config.id;
        let outputs = prepare_outputs(config, false).await?;
        let mark = ErrorMark::before(config);
        let mut cmd = self
            .podman
            .command(["start", "--attach", "--sig-proxy=false", cid]);
        // It must outlive the driver: killed before it has recorded the start, it would leave
        // podman believing the running container is only initialized (then no later agent
        // could re-attach it). It ends with the container.
        cmd.stdout(outputs.stdout.file)
            .stderr(outputs.stderr.file)
            .kill_on_drop(false);
        let spawned = cmd.spawn();
        // The command holds the output ends until dropped: podman and the container hold
        // them from now on.
        drop(cmd);
        let mut child = spawned.map_err(|source| DriverError::Spawn {
            task_id: id.clone(),
            program: self.podman.program().display().to_string(),
            source,
        })?;
        let started = tokio::time::Instant::now();
        let pid = loop {
            if let Some(pid) = fs::read_to_string(&files.pidfile)
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
            {
                break pid;
            }
            if let Ok(Some(status)) = child.try_wait() {
                let said = mark.read_since(config).await;
                return Err(DriverError::Setup {
                    task_id: id.clone(),
                    message: format!(
                        "podman start ended ({status}) before the container ran: {said}"
                    ),
                });
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(DriverError::Setup {
                    task_id: id.clone(),
                    message: format!(
                        "the container did not start within {}",
                        berth_sys::short_duration(START_TIMEOUT)
                    ),
                });
            }
            tokio::select! {
                () = tokio::time::sleep(PIDFILE_POLL) => {}
                () = self.cancel.cancelled() => return Err(self.shut_down()),
            }
        };
        let proc_err = |source| DriverError::Proc {
            task_id: id.clone(),
            pid,
            source,
        };
        // A container that has already ended has no start time to read: its handle then
        // matches no live process, and the waiter reports how it ended.
        let start_ticks = procfs::read_stat(pid)
            .map_err(proc_err)?
            .map_or(0, |stat| stat.start_ticks);
        let handle = TaskHandle {
            version: HANDLE_VERSION,
            driver: DOCKER.into(),
            task_id: id.clone(),
            pid,
            start_ticks,
            boot_id: procfs::boot_id().map_err(proc_err)?,
            started_at: SystemTime::now(),
            cgroup: None,
            container_id: Some(cid.to_owned()),
            logs: outputs.rotated,
        };
        Ok((handle, child))
    }

    /// Waits in the background for the container to end, then records how it ended.
    fn watch(&self, entry: Arc<Container>, waiter: Waiter) {
        let podman = self.podman.clone();
        let events = self.events.clone();
        let cancel = self.cancel.clone();
        self.tracker.spawn(async move {
            match waiter {
                Waiter::Start(mut child) => tokio::select! {
                    _ = child.wait() => {}
                    () = cancel.cancelled() => return,
                },
                Waiter::Wait => {
                    let waited =
                        podman.run(["wait", "--interval", "250ms", &entry.id], Duration::MAX);
                    tokio::select! {
                        _ = waited => {}
                        () = cancel.cancelled() => return,
                    }
                }
            }
            // A waiter can end without the container ending (podman itself failed): then
            // the container's first process is watched until it is gone.
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            while entry.identity_holds() {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = cancel.cancelled() => return,
                }
            }
            // The process is gone; if conmon has not recorded the exit yet, `podman wait`
            // waits for it.
            let mut state = podman.inspect(&entry.id).await;
            if matches!(&state, Ok(Some(s)) if s.running) {
                let _ = podman
                    .run(["wait", "--interval", "50ms", &entry.id], COMMAND_TIMEOUT)
                    .await;
                state = podman.inspect(&entry.id).await;
            }
            let result = match state {
                Ok(Some(state)) if !state.running => ExitResult {
                    exit_code: (state.exit_code >= 0 && state.exit_code < 128)
                        .then_some(state.exit_code),
                    signal: (state.exit_code > 128).then_some(state.exit_code - 128),
                    oom_killed: state.oom_killed,
                },
                _ => ExitResult::UNKNOWN,
            };
            let (code, signal) = (result.exit_code, result.signal);
            entry.exit.send_replace(Some(result));
            events.emit(TaskEvent::new(
                entry.handle.task_id.clone(),
                DOCKER,
                TaskEventKind::Exited {
                    code,
                    signal,
                    oom_killed: result.oom_killed,
                },
                result.to_string(),
            ));
        });
    }

    async fn wait_exit(&self, entry: &Container, timeout: Duration) -> Result<bool, DriverError> {
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

    /// Sends `signal` to the container's first process (when it is still the one started).
    fn send(&self, entry: &Container, signal: Signal) -> Result<(), DriverError> {
        let id = &entry.handle.task_id;
        if entry.exit().is_some() || !entry.identity_holds() {
            return Err(DriverError::NotRunning {
                task_id: id.clone(),
                pid: entry.handle.pid,
            });
        }
        nix::sys::signal::kill(Pid::from_raw(entry.handle.pid as i32), signal).map_err(|e| {
            DriverError::Signal {
                task_id: id.clone(),
                pid: entry.handle.pid,
                signal: signal.as_str().into(),
                source: e.into(),
            }
        })
    }

    /// Kills the container (every process of it, through podman) and waits for it to go.
    async fn kill(&self, entry: &Container) -> Result<(), DriverError> {
        let id = &entry.handle.task_id;
        if entry.exit().is_some() {
            return Ok(());
        }
        self.emit(id, TaskEventKind::Killed, "sent SIGKILL");
        match self
            .podman
            .run(["kill", "--signal", "KILL", &entry.id], COMMAND_TIMEOUT)
            .await
        {
            Ok(_) => {}
            // It ended between the check and the kill.
            Err(PodmanError::Failed { .. }) if !entry.identity_holds() => {}
            Err(e) => return Err(self.podman_err(id, "killing the container", e)),
        }
        if self.wait_exit(entry, KILL_WAIT).await? {
            Ok(())
        } else {
            Err(DriverError::KillTimeout {
                task_id: id.clone(),
                pid: entry.handle.pid,
                waited: KILL_WAIT,
            })
        }
    }

    async fn stop_task(
        &self,
        id: &TaskId,
        timeout: Duration,
        signal: Signal,
    ) -> Result<(), DriverError> {
        let entry = self.get(id)?;
        if entry.exit().is_some() {
            return Ok(());
        }
        match self.send(&entry, signal) {
            Ok(()) => self.emit(
                id,
                TaskEventKind::Signaled {
                    signal: signal as i32,
                },
                format!("sent {}", signal.as_str()),
            ),
            Err(DriverError::NotRunning { .. }) => {}
            Err(e) => return Err(e),
        }
        if self.wait_exit(&entry, timeout).await? {
            return Ok(());
        }
        self.kill(&entry).await
    }

    async fn destroy_task(&self, id: &TaskId) -> Result<(), DriverError> {
        let entry = match self.lock().get(id) {
            Some(Slot::Ready(c)) => Arc::clone(c),
            Some(Slot::Reserved) => {
                return Err(DriverError::AlreadyExists {
                    task_id: id.clone(),
                    driver: DOCKER.into(),
                });
            }
            None => return Ok(()),
        };
        self.kill(&entry).await?;
        self.podman
            .remove(&entry.id)
            .await
            .map_err(|e| self.podman_err(id, "removing the container", e))?;
        self.lock().remove(id);
        Ok(())
    }

    fn stats_of(&self, id: &TaskId) -> Result<TaskStats, DriverError> {
        let entry = self.get(id)?;
        let pid = entry.handle.pid;
        if entry.exit().is_some() || !entry.identity_holds() {
            return Err(DriverError::NotRunning {
                task_id: id.clone(),
                pid,
            });
        }
        let pids = container_pids(pid).unwrap_or_else(|| vec![pid]);
        let stats = procfs::stats_of(&pids);
        if stats.pids.is_empty() {
            return Err(DriverError::NotRunning {
                task_id: id.clone(),
                pid,
            });
        }
        Ok(stats)
    }

    async fn recover_task(&self, handle: TaskHandle) -> Result<(), DriverError> {
        let id = handle.task_id.clone();
        if handle.driver != DOCKER {
            return Err(DriverError::WrongDriver {
                task_id: id,
                found: handle.driver,
                expected: DOCKER.into(),
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
        let Some(cid) = handle.container_id.clone() else {
            return Err(DriverError::Setup {
                task_id: id,
                message: "the handle names no container".into(),
            });
        };
        let reserved = self.reserve(&id)?;
        let pid = handle.pid;
        let current = procfs::boot_id().map_err(|source| DriverError::Proc {
            task_id: id.clone(),
            pid,
            source,
        })?;
        if current != handle.boot_id {
            return Err(DriverError::OtherBoot {
                task_id: id,
                found: handle.boot_id,
                current,
            });
        }
        let state = self
            .podman
            .inspect(&cid)
            .await
            .map_err(|e| self.podman_err(&id, "inspecting the container", e))?;
        match state {
            Some(s) if s.running && s.pid == pid => {}
            _ => return Err(DriverError::NotRunning { task_id: id, pid }),
        }
        if !procfs::is_same_live_process(pid, handle.start_ticks) {
            return Err(DriverError::NotRunning { task_id: id, pid });
        }
        let (exit, _) = watch::channel(None);
        let entry = Arc::new(Container {
            handle,
            id: cid,
            exit,
        });
        reserved.commit(Arc::clone(&entry));
        self.emit(&id, TaskEventKind::Recovered { pid }, "re-attached");
        self.watch(entry, Waiter::Wait);
        Ok(())
    }

    async fn fingerprint_podman(&self) -> Fingerprint {
        let version = match self
            .podman
            .run(
                ["version", "--format", "{{.Client.Version}}"],
                COMMAND_TIMEOUT,
            )
            .await
        {
            Ok(v) => v.trim().to_owned(),
            Err(PodmanError::Spawn { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Fingerprint::new(
                    Health::Undetected,
                    format!("{} not found", self.config.podman.display()),
                );
            }
            Err(e) => return Fingerprint::new(Health::Unhealthy, e.to_string()),
        };
        // The runtime as podman finds it: a path, or a name on PATH (podman's own list of
        // runtime paths holds the standard directories, as Debian's PATH does).
        let runtime = if self.config.runtime.starts_with('/') {
            Some(PathBuf::from(&self.config.runtime))
        } else {
            procfs::find_program(&self.config.runtime).or_else(|| {
                [
                    "/usr/sbin",
                    "/usr/bin",
                    "/usr/local/bin",
                    "/usr/local/sbin",
                    "/sbin",
                    "/bin",
                ]
                .iter()
                .map(|d| Path::new(d).join(&self.config.runtime))
                .find(|p| p.is_file())
            })
        };
        let Some(runtime) = runtime else {
            return Fingerprint::new(
                Health::Unhealthy,
                format!(
                    "podman {version}: OCI runtime {:?} not found",
                    self.config.runtime
                ),
            );
        };
        let works = tokio::process::Command::new(&runtime)
            .arg("--version")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .status()
            .await
            .is_ok_and(|s| s.success());
        if !works {
            return Fingerprint::new(
                Health::Unhealthy,
                format!(
                    "podman {version}: OCI runtime {} does not run",
                    runtime.display()
                ),
            );
        }
        let mut fp = Fingerprint::new(
            Health::Healthy,
            format!("podman {version} with {}", self.config.runtime),
        );
        let attr = |k: &str| format!("driver.{DOCKER}{k}");
        fp.attributes.insert(attr(""), "1".into());
        fp.attributes.insert(attr(".version"), version);
        fp.attributes
            .insert(attr(".runtime"), self.config.runtime.clone());
        fp.attributes.insert(attr(".os_type"), "linux".into());
        if self.config.allow_privileged {
            fp.attributes
                .insert(attr(".privileged.enabled"), "1".into());
        }
        if self.config.volumes_enabled {
            fp.attributes.insert(attr(".volumes.enabled"), "1".into());
        }
        fp
    }
}

enum Waiter {
    /// The `podman start --attach` the driver began.
    Start(tokio::process::Child),
    /// A recovered container: `podman wait`.
    Wait,
}

/// A task id held while a start or recovery runs; released unless committed.
struct Reserved<'a> {
    driver: &'a DockerDriver,
    id: Option<TaskId>,
}

impl Reserved<'_> {
    fn commit(mut self, entry: Arc<Container>) {
        if let Some(id) = self.id.take() {
            self.driver.lock().insert(id, Slot::Ready(entry));
        }
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.driver.lock().remove(&id);
        }
    }
}

impl Driver for DockerDriver {
    fn name(&self) -> &str {
        DOCKER
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fs_isolation: FsIsolation::Chroot,
            send_signals: true,
            exec: true,
            bind_mounts: true,
            resource_limits: true,
            device_nodes: true,
        }
    }

    fn fingerprint(&self) -> DriverFuture<'_, Fingerprint> {
        Box::pin(self.fingerprint_podman())
    }

    fn start(&self, config: TaskConfig) -> DriverFuture<'_, Result<TaskHandle, DriverError>> {
        Box::pin(self.start_task(config))
    }

    fn wait<'a>(
        &'a self,
        task_id: &'a TaskId,
    ) -> DriverFuture<'a, Result<ExitResult, DriverError>> {
        Box::pin(async move {
            let entry = self.get(task_id)?;
            let mut rx = entry.exit.subscribe();
            tokio::select! {
                r = rx.wait_for(Option::is_some) => match r {
                    Ok(exit) => Ok(exit.unwrap_or(ExitResult::UNKNOWN)),
                    Err(_) => Err(self.shut_down()),
                },
                () = self.cancel.cancelled() => Err(self.shut_down()),
            }
        })
    }

    fn stop<'a>(
        &'a self,
        task_id: &'a TaskId,
        timeout: Duration,
        signal: Signal,
    ) -> DriverFuture<'a, Result<(), DriverError>> {
        Box::pin(self.stop_task(task_id, timeout, signal))
    }

    fn destroy<'a>(&'a self, task_id: &'a TaskId) -> DriverFuture<'a, Result<(), DriverError>> {
        Box::pin(self.destroy_task(task_id))
    }

    fn inspect(&self, task_id: &TaskId) -> Result<TaskStatus, DriverError> {
        let entry = self.get(task_id)?;
        let exit = entry.exit();
        Ok(TaskStatus {
            task_id: task_id.clone(),
            state: if exit.is_some() {
                TaskState::Exited
            } else {
                TaskState::Running
            },
            pid: entry.handle.pid,
            started_at: entry.handle.started_at,
            exit,
        })
    }

    fn signal(&self, task_id: &TaskId, signal: Signal) -> Result<(), DriverError> {
        let entry = self.get(task_id)?;
        self.send(&entry, signal)?;
        self.emit(
            task_id,
            TaskEventKind::Signaled {
                signal: signal as i32,
            },
            format!("sent {}", signal.as_str()),
        );
        Ok(())
    }

    fn stats<'a>(
        &'a self,
        task_id: &'a TaskId,
    ) -> DriverFuture<'a, Result<TaskStats, DriverError>> {
        Box::pin(async move { self.stats_of(task_id) })
    }

    fn recover(&self, handle: TaskHandle) -> DriverFuture<'_, Result<(), DriverError>> {
        Box::pin(async move {
            let logs = handle.logs.clone();
            let id = handle.task_id.clone();
            self.recover_task(handle).await?;
            if let Some(logs) = &logs {
                for problem in crate::logs::ensure_collectors(logs).await {
                    tracing::warn!(task_id = %id, "{problem}");
                    self.emit(&id, TaskEventKind::Note, problem);
                }
            }
            Ok(())
        })
    }

    fn exec<'a>(
        &'a self,
        task_id: &'a TaskId,
        request: ExecRequest,
    ) -> DriverFuture<'a, Result<ExecSession, DriverError>> {
        Box::pin(async move {
            request
                .validate()
                .map_err(|reason| DriverError::InvalidConfig {
                    task_id: task_id.clone(),
                    field: "exec".into(),
                    reason,
                })?;
            let entry = self.get(task_id)?;
            if entry.exit().is_some() || !entry.identity_holds() {
                return Err(DriverError::NotRunning {
                    task_id: task_id.clone(),
                    pid: entry.handle.pid,
                });
            }
            // `podman exec` runs it as the container's user, in its working directory, with
            // its environment.
            let mut args: Vec<std::ffi::OsString> = self.podman.globals().to_vec();
            args.push("exec".into());
            args.push("--interactive".into());
            if request.tty.is_some() {
                args.push("--tty".into());
            }
            args.push(entry.id.clone().into());
            args.extend(request.command.iter().map(Into::into));
            let cmd = ExecCommand {
                program: self.podman.program().to_path_buf(),
                args,
                env: std::env::vars_os().collect(),
                cwd: "/".into(),
                user: None,
            };
            spawn_exec(task_id, cmd, request.tty)
        })
    }

    fn shutdown(&self) -> DriverFuture<'_, ()> {
        Box::pin(async {
            self.cancel.cancel();
            self.tracker.close();
            self.tracker.wait().await;
        })
    }
}

/// podman's name for the task's container: `<task>-<alloc id>` as Nomad names them, when
/// both parts hold only the characters podman allows; else `berth-` and the task id with
/// every other character written as `_xx` (hex).
fn container_name(id: &TaskId) -> String {
    let allowed = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    };
    if let Some((alloc, task)) = id.alloc_and_task()
        && allowed(&alloc)
        && allowed(&task)
        && task.starts_with(|c: char| c.is_ascii_alphanumeric())
    {
        return format!("{task}-{alloc}");
    }
    let mut out = String::from("berth-");
    for b in id.as_str().bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("_{b:02x}"));
        }
    }
    out
}

fn short(cid: &str) -> &str {
    &cid[..cid.len().min(12)]
}

/// The pids of the cgroup holding `pid` (the container's), from `/proc/<pid>/cgroup`.
fn container_pids(pid: u32) -> Option<Vec<u32>> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let mut dirs: Vec<PathBuf> = Vec::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let rel = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == "pids") {
            dirs.push(Path::new("/sys/fs/cgroup/pids").join(rel));
        } else if controllers.is_empty() {
            dirs.push(Path::new("/sys/fs/cgroup").join(rel));
            dirs.push(Path::new("/sys/fs/cgroup/unified").join(rel));
        }
    }
    dirs.iter()
        .find_map(|d| procfs::cgroup_procs(d).ok().filter(|p| !p.is_empty()))
}

fn make_dir(dir: &Path, mode: u32) -> std::io::Result<()> {
    match fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => fs::set_permissions(dir, fs::Permissions::from_mode(mode)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if fs::symlink_metadata(dir)?.is_dir() {
                Ok(())
            } else {
                Err(std::io::Error::other(
                    "something other than a directory is there",
                ))
            }
        }
        Err(e) => Err(e),
    }
}

/// Writes `bytes` to a new file only the agent reads (mode 0600), replacing one there.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let _ = fs::remove_file(path);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)
}

/// Where the task's stderr stood before a start: podman writes its error there when the start
/// fails.
struct ErrorMark {
    /// The file and its length then; `None` when the output is discarded.
    at: Option<(PathBuf, u64)>,
}

impl ErrorMark {
    fn before(config: &TaskConfig) -> Self {
        let at = match &config.logs {
            TaskLogs::Files => {
                let len = fs::metadata(&config.stderr_path).map_or(0, |m| m.len());
                Some((config.stderr_path.clone(), len))
            }
            TaskLogs::Rotated { .. } => RotatedOutput::newest(&config.stderr_path),
            TaskLogs::Discarded => None,
        };
        Self { at }
    }

    /// What podman wrote to the task's stderr since the mark, on one line (once a collector
    /// has written all it read).
    async fn read_since(&self, config: &TaskConfig) -> String {
        let Some((path, len)) = &self.at else {
            return String::new();
        };
        if matches!(config.logs, TaskLogs::Rotated { .. }) {
            crate::logs::wait_collector_gone(&config.stderr_path, Duration::from_secs(2)).await;
        }
        tail_since(path, *len)
    }
}

/// What was appended to `path` after `offset` (at most 4 KiB), on one line: podman's error
/// when a start fails (it writes it to the task's stderr).
fn tail_since(path: &Path, offset: u64) -> String {
    use std::io::{Seek as _, SeekFrom};
    let mut buf = Vec::new();
    if let Ok(mut f) = fs::File::open(path)
        && f.seek(SeekFrom::Start(offset)).is_ok()
    {
        let _ = f.take(4096).read_to_end(&mut buf);
    }
    podman::error_text(&buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_names_follow_nomad_when_they_can() {
        let id = TaskId::for_alloc("0b1c-77", "web").unwrap();
        assert_eq!(container_name(&id), "web-0b1c-77");
        let odd = TaskId::for_alloc("a.b", "my task").unwrap();
        let name = container_name(&odd);
        assert!(name.starts_with("berth-"), "{name}");
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'),
            "{name}"
        );
        assert_ne!(
            name,
            container_name(&TaskId::for_alloc("a.b", "my_task").unwrap())
        );
    }
}
