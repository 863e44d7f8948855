//! Shared by the integration tests: a recording sink, a short private directory per test,
//! configs with test timings, running an instance, and looking for processes left behind.

#![allow(dead_code)]

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use berth_devices::{
    model::DeviceGroup,
    plugin::{Generation, PluginEvent, PluginId, PluginOps, PluginSink},
};
use berth_devices_nomad::{NomadPlugin, NomadPluginConfig};
use berth_sys::slot::{DIR_VAR, RestartPolicy};
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

/// How long any awaited event may take.
pub const WAIT: Duration = Duration::from_secs(20);

/// The example plugin binary.
pub fn plugin_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_berth-nomad-device"))
}

/// What the sink saw.
#[derive(Debug, Clone)]
pub enum Seen {
    Attached(Generation),
    Event(Generation, PluginEvent, Instant),
}

/// Called at every event.
pub type Callback = Box<dyn Fn(&PluginEvent) + Send + Sync>;

/// A sink that records everything and keeps the ops of each attachment.
#[derive(Default)]
pub struct Recorder {
    seen: Mutex<Vec<Seen>>,
    ops: Mutex<Vec<(Generation, Arc<dyn PluginOps>)>>,
    next: Mutex<u64>,
    /// Called at every event (the agent helper writes a file on Ready).
    pub on_event: Option<Callback>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("seen", &self.seen.lock().unwrap().len())
            .finish_non_exhaustive()
    }
}

impl PluginSink for Recorder {
    fn attach(&self, _plugin: &PluginId, ops: Arc<dyn PluginOps>) -> Generation {
        let mut next = self.next.lock().unwrap();
        *next += 1;
        let generation = Generation(*next);
        self.ops.lock().unwrap().push((generation, ops));
        self.seen.lock().unwrap().push(Seen::Attached(generation));
        generation
    }

    fn event(&self, _plugin: &PluginId, generation: Generation, event: PluginEvent) {
        if let Some(cb) = &self.on_event {
            cb(&event);
        }
        self.seen
            .lock()
            .unwrap()
            .push(Seen::Event(generation, event, Instant::now()));
    }
}

impl Recorder {
    /// A recorder that also calls `f` at every event.
    pub fn with_callback(f: impl Fn(&PluginEvent) + Send + Sync + 'static) -> Self {
        Self {
            on_event: Some(Box::new(f)),
            ..Self::default()
        }
    }

    /// How many times the plugin was attached.
    pub fn attachments(&self) -> usize {
        self.ops.lock().unwrap().len()
    }

    /// Every event so far, with its generation.
    pub fn events(&self) -> Vec<(Generation, PluginEvent)> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter_map(|s| match s {
                Seen::Event(g, e, _) => Some((*g, e.clone())),
                Seen::Attached(_) => None,
            })
            .collect()
    }

    /// Every event with when it arrived.
    pub fn timed(&self) -> Vec<(Generation, PluginEvent, Instant)> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter_map(|s| match s {
                Seen::Event(g, e, t) => Some((*g, e.clone(), *t)),
                Seen::Attached(_) => None,
            })
            .collect()
    }

    /// The ops of attachment `generation`.
    pub fn ops(&self, generation: Generation) -> Arc<dyn PluginOps> {
        self.ops
            .lock()
            .unwrap()
            .iter()
            .find(|(g, _)| *g == generation)
            .map(|(_, o)| Arc::clone(o))
            .expect("attached")
    }

    /// Waits (bounded by [`WAIT`]) until `find` finds something in the events from index
    /// `from` on; returns it and the index after it.
    pub async fn wait_for<T>(
        &self,
        from: usize,
        what: &str,
        mut find: impl FnMut(Generation, &PluginEvent) -> Option<T>,
    ) -> (T, usize) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let events = self.events();
            for (i, (g, e)) in events.iter().enumerate().skip(from) {
                if let Some(t) = find(*g, e) {
                    return (t, i + 1);
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {what} within {WAIT:?}; events: {events:#?}"
            );
            tokio::time::sleep(berth_testkit::POLL_INTERVAL).await;
        }
    }

    /// Waits for `Ready` from index `from` on: its generation and the index after it.
    pub async fn ready(&self, from: usize) -> (Generation, usize) {
        self.wait_for(from, "Ready", |g, e| {
            matches!(e, PluginEvent::Ready { .. }).then_some(g)
        })
        .await
    }

    /// Waits for `Devices` of generation `g` from index `from` on.
    pub async fn devices(&self, from: usize, g: Generation) -> (Vec<DeviceGroup>, usize) {
        self.wait_for(from, "Devices", |eg, e| match e {
            PluginEvent::Devices(d) if eg == g => Some(d.clone()),
            _ => None,
        })
        .await
    }

    /// Waits for `Down` from index `from` on: its reason and the index after it.
    pub async fn down(&self, from: usize) -> (String, Option<Duration>, usize) {
        let ((reason, retry), i) = self
            .wait_for(from, "Down", |_, e| match e {
                PluginEvent::Down { reason, retry_in } => Some((reason.clone(), *retry_in)),
                _ => None,
            })
            .await;
        (reason, retry, i)
    }
}

/// A test's private directory, short (under /tmp) so socket paths fit: `dev/` holds the
/// devices, `p/` is the plugin's directory, `faults` the fault file.
#[derive(Debug)]
pub struct Place {
    pub tmp: TempDir,
}

/// Whatever a failed test left running in the place is killed.
impl Drop for Place {
    fn drop(&mut self) {
        for pid in marked_processes(&self.plugin_dir()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

impl Place {
    pub fn new() -> Self {
        let tmp = tempfile::Builder::new()
            .prefix("bnd")
            .tempdir_in("/tmp")
            .expect("temp dir");
        std::fs::create_dir(tmp.path().join("dev")).unwrap();
        Self { tmp }
    }

    pub fn dev(&self) -> PathBuf {
        self.tmp.path().join("dev")
    }

    pub fn plugin_dir(&self) -> PathBuf {
        self.tmp.path().join("p")
    }

    pub fn fault_file(&self) -> PathBuf {
        self.tmp.path().join("faults")
    }

    /// Sets the faults in force (an empty slice clears them); written atomically.
    pub fn set_faults(&self, faults: &[&str]) {
        let mut text = faults.join("\n");
        text.push('\n');
        berth_sys::write_atomic(&self.fault_file(), text.as_bytes()).unwrap();
    }

    /// Creates device file `name` with `content`.
    pub fn add_device(&self, name: &str, content: &[u8]) -> PathBuf {
        let path = self.dev().join(name);
        std::fs::write(&path, content).unwrap();
        path
    }

    /// A config of the example plugin over `dev/` with test timings: list every 100 ms,
    /// stats every 200 ms, quick restarts and liveness checks.
    pub fn config(&self, name: &str) -> NomadPluginConfig {
        config_at(self.tmp.path(), name)
    }

    /// The processes carrying the slot mark of the plugin directory.
    pub fn marked_processes(&self) -> Vec<i32> {
        marked_processes(&self.plugin_dir())
    }
}

/// [`Place::config`] for a place at `root`.
pub fn config_at(root: &Path, name: &str) -> NomadPluginConfig {
    let mut c = NomadPluginConfig::new(name, plugin_bin(), root.join("p"));
    c.config = serde_json::json!({
        "dir": root.join("dev"),
        "list_period": "100ms",
        "fault_file": root.join("faults"),
    });
    c.stats_interval = Duration::from_millis(200);
    c.restart = RestartPolicy {
        initial: Duration::from_millis(100),
        max: Duration::from_secs(1),
        reset_after: Duration::from_secs(30),
        stop_grace: Duration::from_secs(3),
    };
    c.call_timeout = Duration::from_secs(3);
    c.start_timeout = Duration::from_secs(10);
    c.liveness_interval = Duration::from_millis(200);
    c.liveness_timeout = Duration::from_millis(300);
    c.liveness_failures = 2;
    c
}

/// The processes whose slot mark is `dir` (as the slot writes it: canonical).
pub fn marked_processes(dir: &Path) -> Vec<i32> {
    let Ok(dir) = std::fs::canonicalize(dir) else {
        return Vec::new();
    };
    let dir = dir.to_string_lossy().into_owned();
    berth_sys::procs::pids_with_env(&[(DIR_VAR, dir.as_str())])
        .into_iter()
        .filter(|p| berth_sys::procs::is_alive(*p))
        .collect()
}

/// A running instance; [`Running::stop`] shuts it down and waits for `run` to return.
#[derive(Debug)]
pub struct Running {
    pub sink: Arc<Recorder>,
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Running {
    pub fn start(config: NomadPluginConfig) -> Self {
        Self::start_with(config, Recorder::default())
    }

    pub fn start_with(config: NomadPluginConfig, recorder: Recorder) -> Self {
        let plugin = NomadPlugin::new(config).expect("a valid config");
        let sink = Arc::new(recorder);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(plugin.run(sink.clone(), shutdown.clone()));
        Self {
            sink,
            shutdown,
            task: Some(task),
        }
    }

    /// Waits for `run` to return by itself (no shutdown); panics if it panicked.
    pub async fn finished(mut self) {
        let task = self.task.take().expect("running");
        task.await.expect("run does not panic");
    }

    /// Shuts the instance down; panics unless `run` returns within [`WAIT`].
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        let task = self.task.take().expect("running");
        tokio::time::timeout(WAIT, task)
            .await
            .expect("run returns after shutdown")
            .expect("run does not panic");
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The pid in the plugin's pid file, once there.
pub async fn recorded_pid(place: &Place) -> i32 {
    let file = place.plugin_dir().join("plugin.pid");
    let mut pid = 0;
    berth_testkit::assert_eventually!(
        WAIT,
        || {
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            pid = text.trim().parse().unwrap_or(0);
            let found = pid > 0;
            async move { found }
        },
        "the pid file {}",
        file.display()
    );
    pid
}
