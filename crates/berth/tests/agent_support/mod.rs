#![allow(dead_code)] // Each test binary uses part of it.
//! Runs `berth agent` as a real process for tests, in its own private mount namespace, and
//! kills it (and reaps it) when the handle is dropped.

pub mod devices;
pub mod fleet;
pub mod jobs;

use std::{
    path::{Path, PathBuf},
    process::{Child, ExitStatus, Stdio},
    time::Duration,
};

use berth_api::{Client, PluginStatus};
use tempfile::TempDir;

/// A `berth agent` process with its own data dir.
pub struct AgentProcess {
    pub tmp: TempDir,
    pub data_dir: PathBuf,
    pub config: PathBuf,
    child: Option<Child>,
    extra: Vec<String>,
    env: Vec<(String, String)>,
    /// When set, the agent runs in this namespace, which outlives it: a kill -9 and a respawn
    /// see the same mounts.
    ns: Option<berth_testkit::MountNamespace>,
    /// The ACL token [`client`](Self::client) sends, when set.
    token: Option<berth_api::acl::SecretId>,
}

impl AgentProcess {
    /// Writes `config` (HCL; `@TMP@` stands for the test's temporary dir) and starts the agent;
    /// waits until its API answers.
    pub async fn start(config: &str) -> AgentProcess {
        Self::start_with(config, &[]).await
    }

    /// Like [`start`](Self::start) with extra `berth agent` arguments.
    pub async fn start_with(config: &str, extra: &[&str]) -> AgentProcess {
        Self::start_full(config, extra, None).await
    }

    /// Like [`start`](Self::start), in a mount namespace that outlives the agent (see
    /// [`AgentProcess::namespace`]).
    pub async fn start_in_namespace(config: &str) -> AgentProcess {
        Self::start_in_namespace_with(config, &[]).await
    }

    /// [`start_in_namespace`](Self::start_in_namespace) with a [`hostpath_config`] of plugin
    /// `plugin_id` (and `args`), once that plugin is healthy.
    pub async fn start_with_hostpath(plugin_id: &str, args: &[&str]) -> AgentProcess {
        let agent = Self::start_in_namespace(&hostpath_config(plugin_id, args)).await;
        agent
            .wait_plugin(plugin_id, Duration::from_secs(20), |p| p.health.healthy)
            .await;
        agent
    }

    /// [`start_in_namespace`](Self::start_in_namespace) with extra `berth agent` arguments.
    pub async fn start_in_namespace_with(config: &str, extra: &[&str]) -> AgentProcess {
        let ns = berth_testkit::MountNamespace::new().expect("mount namespace");
        Self::start_full(config, extra, Some(ns)).await
    }

    async fn start_full(
        config: &str,
        extra: &[&str],
        ns: Option<berth_testkit::MountNamespace>,
    ) -> AgentProcess {
        let mut a = Self::spawn_only(config, extra, ns);
        a.wait_ready().await;
        a
    }

    /// Like [`start_with`](Self::start_with), without waiting for the API (call
    /// [`wait_ready`](Self::wait_ready)).
    pub fn start_unready(config: &str, extra: &[&str]) -> AgentProcess {
        Self::spawn_only(config, extra, None)
    }

    fn spawn_only(
        config: &str,
        extra: &[&str],
        ns: Option<berth_testkit::MountNamespace>,
    ) -> AgentProcess {
        let tmp = tempfile::Builder::new()
            .prefix("ba")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let data_dir = tmp.path().join("data");
        let cfg = tmp.path().join("agent.hcl");
        let config = config.replace("@TMP@", &tmp.path().display().to_string());
        std::fs::write(&cfg, config).expect("write config");
        let mut a = AgentProcess {
            tmp,
            data_dir,
            config: cfg,
            child: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            ns,
            token: None,
        };
        a.spawn();
        a
    }

    fn log_path(&self) -> PathBuf {
        self.tmp.path().join("agent.log")
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("log file");
        let berth = Path::new(env!("CARGO_BIN_EXE_berth"));
        let mut cmd = match &self.ns {
            Some(ns) => ns.command(berth),
            None => berth_testkit::private_ns_command(berth),
        };
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let child = cmd
            .args(["--log-level", "debug", "agent", "--config"])
            .arg(&self.config)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start berth agent");
        self.child = Some(child);
    }

    /// The agent's pid (setpriv, unshare and nsenter exec it in place).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// The namespace the agent runs in, when started with
    /// [`start_in_namespace`](Self::start_in_namespace).
    pub fn namespace(&self) -> &berth_testkit::MountNamespace {
        self.ns.as_ref().expect("started in a namespace")
    }

    /// Sets (or, with `None`, removes) an environment variable for the next (re)spawn.
    pub fn set_env(&mut self, key: &str, value: Option<&str>) {
        self.env.retain(|(k, _)| k != key);
        if let Some(v) = value {
            self.env.push((key.to_string(), v.to_string()));
        }
    }

    /// Waits (bounded) until the agent process exits by itself; returns its status.
    pub async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let c = self.child.as_mut().expect("running");
            if let Some(s) = c.try_wait().expect("wait") {
                self.child = None;
                return s;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "agent did not exit in {timeout:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The API socket.
    pub fn socket(&self) -> PathBuf {
        self.data_dir.join("berth.sock")
    }

    /// A client of its API, with the token of [`set_token`](Self::set_token) if any.
    pub fn client(&self) -> Client {
        let client = Client::new(&format!("unix://{}", self.socket().display())).expect("client");
        match &self.token {
            Some(token) => client.with_token(token.clone()),
            None => client,
        }
    }

    /// The ACL token [`client`](Self::client) sends from now on (`None`: none).
    pub fn set_token(&mut self, token: Option<berth_api::acl::SecretId>) {
        self.token = token;
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Waits until the API answers (bounded); with ACLs on, a refusal is an answer.
    pub async fn wait_ready(&mut self) {
        let client = self.client();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(_) | Err(berth_api::ClientError::Api { .. }) = client.plugins().await {
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "berth agent exited ({status}) before its API answered:\n{}",
                    self.log()
                );
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "API did not answer in time:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// SIGKILL, and reap.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again with the same config and data dir (after [`kill9`](Self::kill9)).
    pub fn respawn(&mut self) {
        assert!(self.child.is_none(), "still running");
        self.spawn();
    }

    /// SIGTERM, then waits (bounded) for it to exit.
    pub async fn terminate(&mut self) -> ExitStatus {
        let mut c = self.child.take().expect("running");
        let pid = nix::unistd::Pid::from_raw(i32::try_from(c.id()).expect("pid"));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = c.try_wait().expect("wait") {
                return s;
            }
            if tokio::time::Instant::now() >= deadline {
                let _ = c.kill();
                panic!("agent did not stop after SIGTERM:\n{}", self.log());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Polls plugin `id` until `pred` holds (bounded); returns that status.
    pub async fn wait_plugin(
        &self,
        id: &str,
        timeout: Duration,
        pred: impl Fn(&PluginStatus) -> bool,
    ) -> PluginStatus {
        let client = self.client();
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = None;
        loop {
            if let Ok(p) = client.plugin(id).await {
                if pred(&p) {
                    return p;
                }
                last = Some(p);
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "plugin {id} did not reach the state in {timeout:?}; last: {last:#?}\nagent log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.kill9();
        // The plugins it ran (CSI plugins from its config, Nomad device plugins) outlive a
        // kill -9 on purpose (the next agent stops them): stop them by the slot directory each
        // carries in its environment, under the data dir (never by pid file: a pid may have
        // been reused).
        berth_testkit::kill_marked(berth_sys::slot::DIR_VAR, &self.data_dir);
        // Job tasks outlive the agent on purpose too: kill every process that runs in one of
        // this agent's allocs.
        berth_testkit::kill_tasks_under(&self.data_dir.join("allocs"));
        if std::thread::panicking() {
            eprintln!("--- berth agent log ---\n{}--- end ---", self.log());
        }
    }
}

/// Polls what `fetch` gets from the agent's API until `pred` holds for it; returns it. Panics
/// (with `what`, the last answer and the agent's log) when `deadline` passes first.
pub async fn poll_api<T, Fut>(
    agent: &AgentProcess,
    what: &str,
    deadline: tokio::time::Instant,
    fetch: impl Fn(Client) -> Fut,
    pred: impl Fn(&T) -> bool,
) -> T
where
    T: std::fmt::Debug,
    Fut: std::future::Future<Output = T>,
{
    let client = agent.client();
    loop {
        let got = fetch(client.clone()).await;
        if pred(&got) {
            return got;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {got:#?}\nagent log:\n{}",
            agent.log()
        );
        tokio::time::sleep(berth_testkit::POLL_INTERVAL).await;
    }
}

/// Runs `berth --address <agent> <args>` (bounded: 60 s) and returns what it printed.
pub async fn berth(agent: &AgentProcess, args: &[&str]) -> std::process::Output {
    let address = format!("unix://{}", agent.socket().display());
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["--address", &address])
        .args(args)
        .env_remove("BERTH_ADDR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run berth");
    tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("berth finishes within 60s")
        .expect("berth output")
}

/// Whether a process is alive.
pub fn alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
}

/// An agent config that runs berth-hostpath as plugin `plugin_id` (a monolith, state in
/// `@TMP@/hp`, node id `n1`, strict about the CO's duties unless `args` say otherwise), with a
/// fast health loop; `args` are added to the plugin's arguments.
pub fn hostpath_config(plugin_id: &str, args: &[&str]) -> String {
    let hostpath = berth_testkit::bin_path("berth-hostpath");
    let mut all = vec!["--statedir", "@TMP@/hp", "--nodeid", "n1", "--strict"];
    all.extend_from_slice(args);
    format!(
        "health {{\n  interval = \"200ms\"\n  failures = 2\n}}\n\
         plugin \"{plugin_id}\" {{\n  type = \"monolith\"\n  command = \"{}\"\n  args = {all:?}\n}}\n",
        hostpath.display()
    )
}

/// A `client` block whose `chroot_env` is Nomad's default plus the directory of the test
/// binaries (so `exec` tasks can run berth-hostpath by its path), with `extra` inside it.
pub fn client_config(extra: &str) -> String {
    let bins = berth_testkit::bin_path("berth-hostpath");
    let bins = bins.parent().expect("a directory").display().to_string();
    let mut env = String::new();
    for dir in [
        "/bin",
        "/etc",
        "/lib",
        "/lib32",
        "/lib64",
        "/run/resolvconf",
        "/sbin",
        "/usr",
        bins.as_str(),
    ] {
        env.push_str(&format!("    \"{dir}\" = \"{dir}\"\n"));
    }
    format!("client {{\n  chroot_env = {{\n{env}  }}\n{extra}}}\n")
}

/// `HostpathPlugin` on a given socket path.
pub async fn hostpath_at(socket: &Path) -> berth_testkit::HostpathPlugin {
    berth_testkit::HostpathPlugin::builder()
        .socket(socket)
        .strict(true)
        .spawn()
        .await
}
