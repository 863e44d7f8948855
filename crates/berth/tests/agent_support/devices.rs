//! Device helpers for the tests that run device plugins with a real agent: the example
//! Kubernetes plugin as a process, waits on the node's devices, and jobs whose exec task
//! writes what it sees of its devices into a volume. Device nodes: `berth_testkit::mknod_char`.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use berth_api::{Client, NodeStatus};
use berth_devices::view::GroupView;

use super::AgentProcess;

/// The example Kubernetes device plugin (`berth-kube-device`), killed when dropped.
pub struct KubePlugin {
    child: Option<Child>,
    args: Vec<String>,
    /// Its state dir: call log, fault file, mount sources.
    pub state_dir: PathBuf,
    log: PathBuf,
}

impl KubePlugin {
    /// Starts it against `kubelet_dir` with `args` (besides `--kubelet-dir` and
    /// `--state-dir`).
    pub fn spawn(kubelet_dir: &Path, state_dir: &Path, args: &[&str]) -> Self {
        std::fs::create_dir_all(state_dir).expect("state dir");
        let mut all = vec![
            "--kubelet-dir".to_string(),
            kubelet_dir.display().to_string(),
            "--state-dir".into(),
            state_dir.display().to_string(),
        ];
        all.extend(args.iter().map(|s| s.to_string()));
        let mut p = Self {
            child: None,
            args: all,
            state_dir: state_dir.to_path_buf(),
            log: state_dir.join("plugin.log"),
        };
        p.start();
        p
    }

    fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log");
        let child = Command::new(berth_testkit::bin_path("berth-kube-device"))
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start berth-kube-device");
        self.child = Some(child);
    }

    /// Sets its fault switch (`crash`, `hang`, `unhealthy`, `invalid`; empty clears it).
    pub fn fault(&self, word: &str) {
        std::fs::write(self.state_dir.join("faults"), format!("{word}\n")).expect("fault file");
    }

    /// Waits (bounded) until it exited (after a `crash` fault).
    pub async fn wait_exit(&mut self) {
        let child = self.child.as_mut().expect("running");
        berth_testkit::assert_eventually!(
            Duration::from_secs(20),
            || {
                let exited = child.try_wait().expect("wait").is_some();
                async move { exited }
            },
            "the plugin did not exit"
        );
        self.child = None;
    }

    /// Starts it again with the same arguments (after it exited).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "still running");
        self.start();
    }

    /// Its call log (one JSON line per call).
    pub fn calls(&self) -> String {
        std::fs::read_to_string(self.state_dir.join("calls.jsonl")).unwrap_or_default()
    }

    /// What it logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for KubePlugin {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- berth-kube-device log ---\n{}--- end ---", self.log());
        }
    }
}

/// Polls the node until `pred` holds for it (at most 30 s); returns it.
pub async fn wait_node(
    agent: &AgentProcess,
    what: &str,
    pred: impl Fn(&NodeStatus) -> bool,
) -> NodeStatus {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    wait_node_before(agent, what, deadline, pred).await
}

/// Polls the node until `pred` holds for it; returns it. Panics (with the node and the
/// agent's log) when `deadline` passes first.
pub async fn wait_node_before(
    agent: &AgentProcess,
    what: &str,
    deadline: tokio::time::Instant,
    pred: impl Fn(&NodeStatus) -> bool,
) -> NodeStatus {
    let what = format!("the node to show {what}");
    let fetch = |c: Client| async move { c.node().await.expect("node status") };
    super::poll_api(agent, &what, deadline, fetch, pred).await
}

/// The group `vendor/type/name` of the node, if shown.
pub fn group<'a>(node: &'a NodeStatus, id: &str) -> Option<&'a GroupView> {
    node.devices
        .groups
        .iter()
        .find(|g| g.id().to_string() == id)
}

/// How many instances of group `id` are healthy.
pub fn healthy(node: &NodeStatus, id: &str) -> usize {
    group(node, id).map_or(0, |g| g.instances.iter().filter(|i| i.healthy).count())
}

/// A job of `job_type` with one exec task that mounts volume `source` at `/data` and holds
/// the devices of `devices` (HCL of `device` blocks), running `script` with `sh -c`.
pub fn device_job(id: &str, job_type: &str, source: &str, devices: &str, script: &str) -> String {
    format!(
        r#"
job "{id}" {{
  type = "{job_type}"
  group "g" {{
    volume "data" {{
      type        = "csi"
      source      = "{source}"
      access_mode = "single-node-writer"
    }}
    restart {{
      attempts = 3
      interval = "1h"
      delay    = "100ms"
      mode     = "fail"
    }}
    task "main" {{
      driver = "exec"
      user   = "root"
      config {{
        command = "/bin/sh"
        args    = ["-c", {script:?}]
      }}
      volume_mount {{
        volume      = "data"
        destination = "/data"
      }}
      resources {{
{devices}
      }}
      kill_timeout = "2s"
    }}
  }}
}}
"#
    )
}

/// A service job of `allocs` allocs, each with one exec task that holds the devices of
/// `devices` (HCL of `device` blocks) and sleeps.
pub fn sleeper_job(id: &str, allocs: u32, devices: &str) -> String {
    format!(
        r#"
job "{id}" {{
  group "g" {{
    count = {allocs}
    task "main" {{
      driver = "exec"
      config {{
        command = "/bin/sleep"
        args    = ["600"]
      }}
      resources {{
{devices}
      }}
      kill_timeout = "2s"
    }}
  }}
}}
"#
    )
}
