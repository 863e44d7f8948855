//! The harness of the integration tests: a recording [`PluginSink`], the registration server
//! run in-process ([`Agent`]), and real `berth-kube-device` processes ([`Plugin`]).

#![allow(dead_code)]

use std::{
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use berth_devices::{
    model::DeviceGroup,
    plugin::{Generation, PluginEvent, PluginId, PluginOps, PluginSink},
};
use berth_devices_kube::{KubeConfig, KubeDevices, KubeError};
use berth_sys::slot::RestartPolicy;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long anything in these tests may take to happen.
pub const WAIT: Duration = Duration::from_secs(15);

pub const RESOURCE: &str = "example.com/widget";

pub fn widget() -> PluginId {
    PluginId::kubernetes(RESOURCE)
}

/// What the sink was told, in order.
#[derive(Debug, Clone)]
pub enum Record {
    Attach {
        plugin: PluginId,
        generation: Generation,
    },
    Event {
        plugin: PluginId,
        generation: Generation,
        event: PluginEvent,
    },
}

/// One attachment: the plugin, its generation and the ops it was given.
type Attached = (PluginId, Generation, Arc<dyn PluginOps>);

/// A [`PluginSink`] that records everything and hands out increasing generations.
#[derive(Debug, Default)]
pub struct RecordingSink {
    records: Mutex<Vec<Record>>,
    ops: Mutex<Vec<Attached>>,
    next: AtomicU64,
}

impl PluginSink for RecordingSink {
    fn attach(&self, plugin: &PluginId, ops: Arc<dyn PluginOps>) -> Generation {
        let generation = Generation(self.next.fetch_add(1, Ordering::SeqCst) + 1);
        self.ops
            .lock()
            .unwrap()
            .push((plugin.clone(), generation, ops));
        self.records.lock().unwrap().push(Record::Attach {
            plugin: plugin.clone(),
            generation,
        });
        generation
    }

    fn event(&self, plugin: &PluginId, generation: Generation, event: PluginEvent) {
        self.records.lock().unwrap().push(Record::Event {
            plugin: plugin.clone(),
            generation,
            event,
        });
    }
}

impl RecordingSink {
    pub fn records(&self) -> Vec<Record> {
        self.records.lock().unwrap().clone()
    }

    pub fn len(&self) -> usize {
        self.records.lock().unwrap().len()
    }

    /// The events of `plugin`, from record `since` on.
    pub fn events(&self, plugin: &PluginId, since: usize) -> Vec<(Generation, PluginEvent)> {
        self.records()
            .into_iter()
            .skip(since)
            .filter_map(|r| match r {
                Record::Event {
                    plugin: p,
                    generation,
                    event,
                } if &p == plugin => Some((generation, event)),
                _ => None,
            })
            .collect()
    }

    /// The generations `plugin` was attached with, in order.
    pub fn attaches(&self, plugin: &PluginId) -> Vec<Generation> {
        self.records()
            .into_iter()
            .filter_map(|r| match r {
                Record::Attach {
                    plugin: p,
                    generation,
                } if &p == plugin => Some(generation),
                _ => None,
            })
            .collect()
    }

    /// The ops of `plugin`'s latest attachment.
    pub fn ops(&self, plugin: &PluginId) -> (Generation, Arc<dyn PluginOps>) {
        self.ops
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|(p, _, _)| p == plugin)
            .map(|(_, g, o)| (*g, Arc::clone(o)))
            .unwrap_or_else(|| panic!("{plugin} was never attached"))
    }

    /// Polls until `find` returns something for the records; panics with the records after
    /// [`WAIT`].
    pub async fn wait_for<T>(&self, what: &str, mut find: impl FnMut(&[Record]) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(t) = find(&self.records()) {
                return t;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "not within {WAIT:?}: {what}; records:\n{:#?}",
                self.records()
            );
            tokio::time::sleep(berth_testkit::POLL_INTERVAL).await;
        }
    }

    /// Waits for a `Devices` event of `plugin` from record `since` on that satisfies `check`;
    /// returns its generation and group.
    pub async fn wait_devices(
        &self,
        plugin: &PluginId,
        since: usize,
        what: &str,
        check: impl Fn(&DeviceGroup) -> bool,
    ) -> (Generation, DeviceGroup) {
        self.wait_for(what, |records| {
            records.iter().skip(since).find_map(|r| match r {
                Record::Event {
                    plugin: p,
                    generation,
                    event: PluginEvent::Devices(groups),
                } if p == plugin && groups.len() == 1 && check(&groups[0]) => {
                    Some((*generation, groups[0].clone()))
                }
                _ => None,
            })
        })
        .await
    }

    /// Waits for a `Down` event of `plugin` from record `since` on; returns its generation,
    /// reason and retry.
    pub async fn wait_down(
        &self,
        plugin: &PluginId,
        since: usize,
        what: &str,
        check: impl Fn(&str, Option<Duration>) -> bool,
    ) -> (Generation, String, Option<Duration>) {
        self.wait_for(what, |records| {
            records.iter().skip(since).find_map(|r| match r {
                Record::Event {
                    plugin: p,
                    generation,
                    event: PluginEvent::Down { reason, retry_in },
                } if p == plugin && check(reason, *retry_in) => {
                    Some((*generation, reason.clone(), *retry_in))
                }
                _ => None,
            })
        })
        .await
    }
}

/// Whether every instance is healthy and there are `n`.
pub fn healthy(n: usize) -> impl Fn(&DeviceGroup) -> bool {
    move |g| g.instances.len() == n && g.instances.iter().all(|i| i.healthy)
}

/// Test timings: quick re-dials and liveness checks.
pub fn config(dir: &Path) -> KubeConfig {
    KubeConfig {
        restart: RestartPolicy {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(500),
            reset_after: Duration::from_secs(30),
            stop_grace: Duration::from_secs(1),
        },
        call_timeout: Duration::from_secs(2),
        liveness_interval: Duration::from_millis(300),
        liveness_timeout: Duration::from_millis(500),
        ..KubeConfig::new(dir)
    }
}

/// Logs of the code under test, shown with a failing test's output.
pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "berth_devices_kube=debug".into()),
        )
        .with_test_writer()
        .try_init();
}

/// The registration server, run in-process until [`Agent::stop`] (or drop).
#[derive(Debug)]
pub struct Agent {
    pub dir: PathBuf,
    pub sink: Arc<RecordingSink>,
    token: CancellationToken,
    task: Option<JoinHandle<Result<(), KubeError>>>,
}

impl Agent {
    /// Starts a server on `dir` with the test timings; returns once `kubelet.sock` accepts
    /// connections.
    pub async fn start(dir: &Path) -> Self {
        Self::start_with(config(dir)).await
    }

    pub async fn start_with(config: KubeConfig) -> Self {
        init_logs();
        let dir = config.dir.clone();
        let sink = Arc::new(RecordingSink::default());
        let token = CancellationToken::new();
        let server = KubeDevices::new(config).expect("valid config");
        let socket = server.socket_path().to_path_buf();
        let task =
            tokio::spawn(server.run(Arc::clone(&sink) as Arc<dyn PluginSink>, token.clone()));
        let agent = Self {
            dir,
            sink,
            token,
            task: Some(task),
        };
        berth_testkit::assert_eventually!(
            WAIT,
            || async { std::os::unix::net::UnixStream::connect(&socket).is_ok() },
            "kubelet.sock accepts connections"
        );
        agent
    }

    /// Shuts the server down and returns what `run` returned.
    pub async fn stop(mut self) -> Result<(), KubeError> {
        self.token.cancel();
        let task = self.task.take().expect("running");
        tokio::time::timeout(WAIT, task)
            .await
            .expect("the server stops in time")
            .expect("the server task does not panic")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

/// A running `berth-kube-device`, killed on drop. Its stderr goes to `<state>/plugin.log`,
/// printed when a test fails.
#[derive(Debug)]
pub struct Plugin {
    child: tokio::process::Child,
    pub state: PathBuf,
    pub kubelet_dir: PathBuf,
}

pub fn plugin_bin() -> &'static str {
    env!("CARGO_BIN_EXE_berth-kube-device")
}

/// The command line of a plugin in `kubelet_dir` keeping its state in `state`.
pub fn plugin_cmd(kubelet_dir: &Path, state: &Path, args: &[&str]) -> tokio::process::Command {
    std::fs::create_dir_all(state).expect("state dir");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(state.join("plugin.log"))
        .expect("plugin log");
    let mut cmd = tokio::process::Command::new(plugin_bin());
    cmd.arg("--kubelet-dir")
        .arg(kubelet_dir)
        .arg("--state-dir")
        .arg(state)
        .args(args)
        .env("RUST_LOG", "debug")
        .env_remove("BERTH_KUBE_DEVICE_FAULT")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true);
    cmd
}

impl Plugin {
    pub fn spawn(kubelet_dir: &Path, state: &Path, args: &[&str]) -> Self {
        let child = plugin_cmd(kubelet_dir, state, args)
            .spawn()
            .expect("starting berth-kube-device");
        Self {
            child,
            state: state.to_path_buf(),
            kubelet_dir: kubelet_dir.to_path_buf(),
        }
    }

    /// The calls in its call log, in order.
    pub fn calls(&self) -> Vec<serde_json::Value> {
        calls(&self.state)
    }

    /// Calls named `name` in its call log.
    pub fn calls_named(&self, name: &str) -> Vec<serde_json::Value> {
        self.calls()
            .into_iter()
            .filter(|c| c["call"] == name)
            .collect()
    }

    /// Replaces the fault file.
    pub fn set_faults(&self, words: &str) {
        let tmp = self.state.join("faults.tmp");
        std::fs::write(&tmp, words).expect("write faults");
        std::fs::rename(&tmp, self.state.join("faults")).expect("rename faults");
    }

    /// Waits for the process to exit.
    pub async fn wait(&mut self) -> ExitStatus {
        tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("the plugin exits in time")
            .expect("wait")
    }

    /// SIGTERM, then waits for it to exit.
    pub async fn stop(&mut self) -> ExitStatus {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid")),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        self.wait().await
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.state.join("plugin.log")).unwrap_or_default()
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        if std::thread::panicking() {
            eprintln!(
                "--- berth-kube-device log ({}) ---\n{}",
                self.state.display(),
                self.log()
            );
        }
    }
}

/// The calls in the call log of the plugin whose state dir is `state`.
pub fn calls(state: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(state.join("calls.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// A temp dir with `k/` (the device plugin dir) and `s/` (plugin state) paths.
pub struct Dirs {
    pub tmp: tempfile::TempDir,
}

impl Dirs {
    pub fn new() -> Self {
        Self {
            tmp: tempfile::tempdir().expect("tempdir"),
        }
    }

    pub fn kubelet(&self) -> PathBuf {
        self.tmp.path().join("k")
    }

    pub fn state(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }
}

/// Starts an agent and one plugin with `args`, and waits for its first healthy device list of
/// `n` devices. Returns the generation it was attached with.
pub async fn agent_and_plugin(dirs: &Dirs, args: &[&str], n: usize) -> (Agent, Plugin, Generation) {
    let agent = Agent::start(&dirs.kubelet()).await;
    let plugin = Plugin::spawn(&dirs.kubelet(), &dirs.state("s"), args);
    let (generation, _) = agent
        .sink
        .wait_devices(&widget(), 0, "the plugin's first device list", healthy(n))
        .await;
    (agent, plugin, generation)
}
