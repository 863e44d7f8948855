//! Helpers shared by the alloc runner tests: a node (real raw_exec and exec drivers behind a
//! driver manager, a fake volume host, a store), job specs, polling, and a reaper that kills
//! every task process when a test ends, failed or not.

#![allow(dead_code)]

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use berth_allocrunner::{
    AllocDeps, AllocError, AllocRunner, AllocSpec, AllocStatus, AllocStore, Backoff, ClientStatus,
    EventKind, FakeVolumeHost, MemoryAllocStore, RunnerConfig,
};
use berth_drivers::{
    CgroupSetting, DriverManager, ExecConfig, ExecDriver, ManagerConfig, ProcessConfig,
    RawExecDriver,
};
use berth_job::JobSpec;
use nix::{
    sys::signal::{Signal, killpg},
    unistd::Pid,
};
use tempfile::TempDir;
use tokio::{sync::watch, task::JoinHandle};
use tokio_util::sync::CancellationToken;

/// How long a polled condition may take.
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// Process options that notice a recovered process's exit quickly.
pub fn process_config() -> ProcessConfig {
    ProcessConfig {
        poll_interval: Duration::from_millis(25),
        kill_timeout: Duration::from_secs(5),
        task_path: None,
    }
}

/// A driver manager with `raw_exec` and `exec` (no cgroups).
pub fn drivers(cancel: &CancellationToken) -> DriverManager {
    let mut builder = DriverManager::builder(ManagerConfig::default(), cancel);
    let sink = builder.event_sink();
    builder
        .add(Arc::new(RawExecDriver::new(sink.clone(), process_config())))
        .expect("add raw_exec");
    builder
        .add(Arc::new(ExecDriver::new(
            sink,
            ExecConfig {
                cgroup: CgroupSetting::Disabled,
                process: process_config(),
                ..ExecConfig::default()
            },
        )))
        .expect("add exec");
    builder.start()
}

/// Runner options with quick retries.
pub fn fast_config() -> RunnerConfig {
    let quick = Backoff {
        attempts: 5,
        initial: Duration::from_millis(10),
        max: Duration::from_millis(40),
    };
    RunnerConfig {
        claim_retry: quick,
        release_retry: quick,
        kill_retry: quick,
        upstream_timeout: Duration::from_secs(5),
        max_events: 200,
        ..RunnerConfig::default()
    }
}

/// One node: a temp dir under /tmp, drivers, a fake volume host whose targets are under the
/// temp dir, an in-memory store, and the servers-contacted gate (open).
pub struct Node {
    pub dir: TempDir,
    pub volumes: Arc<FakeVolumeHost>,
    pub store: Arc<dyn AllocStore>,
    pub drivers: DriverManager,
    pub drivers_cancel: CancellationToken,
    pub gate: watch::Sender<bool>,
}

impl Node {
    /// Must be called within a runtime.
    pub fn new() -> Self {
        Self::with_store(|_| Arc::new(MemoryAllocStore::new()))
    }

    /// A node whose store is made by `store` (given the temp dir).
    pub fn with_store(store: impl FnOnce(&Path) -> Arc<dyn AllocStore>) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("berth-allocrunner-")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let volumes = Arc::new(FakeVolumeHost::new(dir.path().join("volumes")));
        let store = store(dir.path());
        let drivers_cancel = CancellationToken::new();
        let drivers = drivers(&drivers_cancel);
        let (gate, _) = watch::channel(true);
        Self {
            dir,
            volumes,
            store,
            drivers,
            drivers_cancel,
            gate,
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn deps(&self) -> AllocDeps {
        let mut deps = AllocDeps::new(
            Arc::new(self.drivers.clone()),
            self.volumes.clone(),
            self.store.clone(),
            self.dir.path().join("allocs"),
        );
        deps.servers_contacted = self.gate.subscribe();
        deps.config = fast_config();
        deps
    }

    /// Shuts the drivers down (tasks keep running) and makes new ones, as a restarted agent
    /// would.
    pub async fn restart_drivers(&mut self) {
        self.drivers.shutdown().await;
        self.drivers_cancel.cancel();
        self.drivers_cancel = CancellationToken::new();
        self.drivers = drivers(&self.drivers_cancel);
    }
}

/// Parses an HCL job.
pub fn job(hcl: &str) -> JobSpec {
    JobSpec::parse_hcl(Path::new("test.hcl"), hcl).expect("job spec")
}

/// Alloc 0 of the job's first group.
pub fn alloc(job: &JobSpec, alloc_id: &str) -> AllocSpec {
    AllocSpec::from_job(job, &job.groups[0].name, alloc_id, 0).expect("alloc spec")
}

/// Kills, when dropped, the process group of every task the watched runners show running
/// and of every pid tracked, so no task outlives a test.
#[derive(Debug, Default)]
pub struct Reaper {
    runners: Mutex<Vec<AllocRunner>>,
    pids: Mutex<Vec<u32>>,
}

impl Reaper {
    pub fn watch(&self, runner: &AllocRunner) {
        self.runners.lock().unwrap().push(runner.clone());
    }

    pub fn track(&self, pid: u32) {
        self.pids.lock().unwrap().push(pid);
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        let mut pids: Vec<u32> = self
            .pids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        for runner in self
            .runners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            pids.extend(runner.status().tasks.values().filter_map(|t| t.pid));
        }
        for pid in pids {
            let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    }
}

/// Runs `runner` in the background.
pub fn spawn_run(
    runner: &AllocRunner,
    cancel: &CancellationToken,
) -> JoinHandle<Result<ClientStatus, AllocError>> {
    let runner = runner.clone();
    let cancel = cancel.clone();
    tokio::spawn(async move { runner.run(cancel).await })
}

/// The result of a background run, within [`TIMEOUT`].
pub async fn finished(
    handle: JoinHandle<Result<ClientStatus, AllocError>>,
) -> Result<ClientStatus, AllocError> {
    tokio::time::timeout(TIMEOUT, handle)
        .await
        .expect("the run ends within the timeout")
        .expect("the run does not panic")
}

/// Polls until `cond` holds for the runner's status.
pub async fn wait_status(
    runner: &AllocRunner,
    what: &str,
    cond: impl Fn(&AllocStatus) -> bool,
) -> AllocStatus {
    let ok = berth_testkit::eventually(TIMEOUT, || {
        let holds = cond(&runner.status());
        async move { holds }
    })
    .await;
    let status = runner.status();
    assert!(
        ok,
        "not true within {TIMEOUT:?}: {what}; status: {status:#?}"
    );
    status
}

/// Waits until `task` runs; returns its pid (tracked by `reaper`).
pub async fn wait_running(runner: &AllocRunner, task: &str, reaper: &Reaper) -> u32 {
    let status = wait_status(runner, &format!("task {task} running"), |s| {
        s.tasks[task].pid.is_some()
    })
    .await;
    let pid = status.tasks[task].pid.expect("pid");
    reaper.track(pid);
    pid
}

/// The kinds of the events of `task` (`None`: of the alloc), oldest first.
pub fn kinds(status: &AllocStatus, task: Option<&str>) -> Vec<EventKind> {
    status.events_of(task).map(|e| e.kind).collect()
}

/// Whether `kinds` holds `want` in this order (other kinds may come between).
pub fn in_order(kinds: &[EventKind], want: &[EventKind]) -> bool {
    let mut it = kinds.iter();
    want.iter().all(|w| it.any(|k| k == w))
}

/// Whether `pid` is a live (not zombie) process.
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        let state = s.rsplit_once(')').map(|(_, rest)| rest.trim_start());
        !matches!(state.and_then(|r| r.chars().next()), Some('Z' | 'X') | None)
    })
}

/// Polls until `pid` is gone.
pub async fn wait_dead(pid: u32) {
    berth_testkit::assert_eventually!(
        TIMEOUT,
        || async move { !alive(pid) },
        "pid {pid} still alive"
    );
}

/// The content of a file, or empty.
pub fn read(path: impl AsRef<Path>) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Polls until `path` contains `needle`.
pub async fn wait_for_text(path: PathBuf, needle: &str) {
    let needle = needle.to_owned();
    berth_testkit::assert_eventually!(
        TIMEOUT,
        || {
            let (path, needle) = (path.clone(), needle.clone());
            async move { read(&path).contains(&needle) }
        },
        "{} never contained {needle:?}; it holds {:?}",
        path.display(),
        read(&path)
    );
}
