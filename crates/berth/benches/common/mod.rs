#![allow(dead_code)] // Each bench uses part of it.
//! What the benches share: a real `berth agent` in its own mount namespace (with a supervised
//! `berth-hostpath`, or with any config), the workspace's binaries built for the bench, CPU
//! time from `/proc`, mount tables, percentiles, bounded polling, and option parsing.

use std::{
    collections::BTreeMap,
    future::Future,
    path::{Path, PathBuf},
    process::{Child, Command, ExitCode, Stdio},
    time::{Duration, Instant},
};

use berth_api::{
    Client,
    volumes::{ClaimRequest, ReleaseRequest, SpecFormat, VolumeSpecRequest},
};
use berth_csi::model::{AccessMode, AttachmentMode};

/// The name of the agent's plugin.
pub const PLUGIN: &str = "hp";

/// How often [`Agent::wait_until`] polls.
const AGENT_POLL: Duration = Duration::from_millis(10);

/// `berth-hostpath`, built first with the bench's own profile and target dir when cargo runs
/// the bench (a no-op when it is up to date), so the plugin measured is the current one.
pub fn hostpath_binary() -> PathBuf {
    workspace_binary("berth-hostpath", "berth-hostpath")
}

/// The binary `bin` of the workspace package `package`, built first with the bench's own
/// profile and target dir when cargo runs the bench (a no-op when it is up to date), so the
/// program measured is the current one. Panics, saying how to build it, when it cannot be had.
pub fn workspace_binary(package: &str, bin: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the bench's own path");
    // target/<profile>/deps/<bench>-<hash>
    let profile_dir = exe.parent().and_then(Path::parent);
    if let (Some(cargo), Some(profile_dir)) = (std::env::var_os("CARGO"), profile_dir) {
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => "dev",
            Some(p) => p,
            None => "release",
        };
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-q", "-p", package, "--bin", bin])
            .args(["--profile", profile, "--manifest-path"])
            .arg(&manifest);
        if let Some(target_dir) = profile_dir.parent() {
            cmd.arg("--target-dir").arg(target_dir);
        }
        match cmd.status() {
            Ok(s) if s.success() => {}
            other => panic!(
                "building {bin} failed ({other:?}); build it yourself with \
                 `cargo build --release -p {package} --bin {bin}` and run the bench again"
            ),
        }
    }
    let path = exe.parent().and_then(Path::parent).map(|d| d.join(bin));
    match path {
        Some(p) if p.is_file() => p,
        _ => panic!(
            "{bin} not found next to {}: build it with \
             `cargo build --release -p {package} --bin {bin}`, or run the bench through \
             `cargo bench`",
            exe.display()
        ),
    }
}

/// Clock ticks per second, for `/proc/<pid>/stat`.
pub fn clk_tck() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// utime + stime of `pid`, in clock ticks.
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/stat: {e}"));
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
}

/// Mount points under `dir` in the mount namespace of `pid`.
pub fn mounts_under(pid: u32, dir: &Path) -> Vec<PathBuf> {
    berth_sys::read_mountinfo(Path::new(&format!("/proc/{pid}/mountinfo")))
        .unwrap_or_else(|e| panic!("mount table of {pid}: {e}"))
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(dir))
        .collect()
}

/// The pid in `pid_file` if that process runs a binary whose name starts with `exe_prefix`.
fn pid_running(pid_file: &Path, exe_prefix: &str) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(pid_file)
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    exe.file_name()?
        .to_str()?
        .starts_with(exe_prefix)
        .then_some(pid)
}

/// A `berth agent` in its own private mount namespace, with its config and data dir in a
/// temporary directory. Dropping it (also while panicking) kills the agent, then the plugins
/// it supervises (which outlive a SIGKILLed agent on purpose) and its tasks, then removes the
/// directory.
pub struct Agent {
    child: Child,
    /// The agent's data dir.
    pub data_dir: PathBuf,
    log: PathBuf,
    /// The namespace the agent runs in when it must outlive the agent
    /// ([`Agent::launch_kept`]); else each start makes a private one of its own.
    ns: Option<berth_testkit::MountNamespace>,
    // Last: removed after `drop` has killed everything.
    _tmp: tempfile::TempDir,
}

impl Agent {
    /// Starts the agent with a monolith `berth-hostpath` named [`PLUGIN`] (staging and
    /// attaching) and waits until that plugin is healthy.
    pub async fn start(hostpath: &Path) -> Agent {
        let hostpath = hostpath.to_path_buf();
        let mut agent = Agent::launch(move |tmp| {
            format!(
                "plugin \"{PLUGIN}\" {{\n  type = \"monolith\"\n  command = \"{}\"\n  \
                 args = [\"--statedir\", \"{}\", \"--nodeid\", \"n1\", \"--log-level\", \"warn\", \
                 \"--enable-stage\", \"--enable-attach\"]\n}}\n",
                hostpath.display(),
                tmp.join("hp").display()
            )
        })
        .await;
        agent.wait_plugin_healthy().await;
        agent
    }

    /// Waits (at most 30 s) until plugin [`PLUGIN`] is healthy.
    pub async fn wait_plugin_healthy(&mut self) {
        self.wait_until(
            &format!("plugin {PLUGIN} healthy"),
            Duration::from_secs(30),
            |client| async move { client.plugin(PLUGIN).await.is_ok_and(|p| p.health.healthy) },
        )
        .await;
    }

    /// Starts the agent with the config `config` returns for the agent's temporary directory
    /// (it may make files there first: the directory is private to this agent and removed
    /// with it), and waits until its API answers.
    pub async fn launch(config: impl FnOnce(&Path) -> String) -> Agent {
        Agent::launch_in(None, config).await
    }

    /// [`Agent::launch`], in a mount namespace that outlives the agent: after
    /// [`Agent::kill9`] its mounts stay, and [`Agent::respawn`] starts the agent there again.
    pub async fn launch_kept(config: impl FnOnce(&Path) -> String) -> Agent {
        let ns = berth_testkit::MountNamespace::new()
            .expect("a mount namespace (needs util-linux's unshare, nsenter and setpriv)");
        Agent::launch_in(Some(ns), config).await
    }

    async fn launch_in(
        ns: Option<berth_testkit::MountNamespace>,
        config: impl FnOnce(&Path) -> String,
    ) -> Agent {
        let tmp = tempfile::Builder::new()
            .prefix("bv")
            .tempdir_in("/tmp")
            .expect("tmp");
        let data_dir = tmp.path().join("data");
        let log = tmp.path().join("agent.log");
        std::fs::write(tmp.path().join("agent.hcl"), config(tmp.path())).expect("config");
        std::fs::File::create(&log).expect("agent log");
        let child = Agent::spawn(ns.as_ref(), tmp.path());
        let mut agent = Agent {
            child,
            data_dir,
            log,
            ns,
            _tmp: tmp,
        };
        agent
            .wait_until(
                "the API answering",
                Duration::from_secs(30),
                |client| async move { client.node().await.is_ok() },
            )
            .await;
        agent
    }

    /// Starts `berth agent` with the config and data dir in `tmp`, appending to its log.
    fn spawn(ns: Option<&berth_testkit::MountNamespace>, tmp: &Path) -> Child {
        let berth = Path::new(env!("CARGO_BIN_EXE_berth"));
        let mut cmd = match ns {
            Some(ns) => ns.command(berth),
            None => berth_testkit::private_ns_command(berth),
        };
        let out = std::fs::OpenOptions::new()
            .append(true)
            .open(tmp.join("agent.log"))
            .expect("agent log");
        // Spawned from the bench's main thread: `--pdeathsig` ties the agent to that thread.
        cmd.args(["--log-level", "warn", "agent", "--config"])
            .arg(tmp.join("agent.hcl"))
            .arg("--data-dir")
            .arg(tmp.join("data"))
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("agent log"))
            .stderr(out)
            .spawn()
            .expect("start berth agent (needs util-linux's setpriv, nsenter and unshare)")
    }

    /// Kills the agent with SIGKILL and reaps it. The plugins it runs live on, as do its
    /// mounts when it runs in a namespace that outlives it.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The namespace the agent runs in, when it outlives the agent ([`Agent::launch_kept`]).
    pub fn namespace(&self) -> Option<&berth_testkit::MountNamespace> {
        self.ns.as_ref()
    }

    /// Starts the agent again, with the same config and data dir (in the same namespace when
    /// it has one), without waiting for anything.
    pub fn respawn(&mut self) {
        self.child = Agent::spawn(self.ns.as_ref(), self._tmp.path());
    }

    /// Polls `check` with a client of the agent every 10 ms until it holds; panics with the
    /// agent's log if the agent exits or `timeout` passes first.
    pub async fn wait_until<F, Fut>(&mut self, what: &str, timeout: Duration, mut check: F)
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = bool>,
    {
        let client = self.client();
        let (child, log) = (&mut self.child, &self.log);
        let held = try_poll_until(AGENT_POLL, timeout, || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "berth agent exited ({status}) before {what}:\n{}",
                    tail(log)
                );
            }
            let holds = check(client.clone());
            async move { if holds.await { Ok(()) } else { Err(()) } }
        })
        .await;
        if held.is_err() {
            panic!("{what}: not within {timeout:?}:\n{}", self.log_tail());
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The agent's temporary directory (config, log, data dir, and whatever the config
    /// function made there).
    pub fn tmp(&self) -> &Path {
        self._tmp.path()
    }

    pub fn client(&self) -> Client {
        Client::new(&format!(
            "unix://{}",
            self.data_dir.join("berth.sock").display()
        ))
        .expect("client")
    }

    /// The supervised plugin's pid (and process group), if it still runs berth-hostpath.
    pub fn plugin_pid(&self) -> Option<u32> {
        pid_running(
            &self.data_dir.join(format!("logs/plugin-{PLUGIN}.pid")),
            "berth-hostpath",
        )
    }

    /// The pid of the Nomad device plugin `name` the agent runs, if its binary's name starts
    /// with `exe_prefix`.
    pub fn device_plugin_pid(&self, name: &str, exe_prefix: &str) -> Option<u32> {
        let file = self
            .data_dir
            .join("devices/nomad")
            .join(name)
            .join("plugin.pid");
        pid_running(&file, exe_prefix)
    }

    pub fn log_tail(&self) -> String {
        tail(&self.log)
    }
}

/// The last 50 lines of the log file `log`.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(50)..].join("\n")
}

impl Drop for Agent {
    fn drop(&mut self) {
        // The agent first, so it cannot restart a plugin or a task.
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Every plugin it ran (CSI and device plugins) carries its slot's directory, under the
        // data dir, in its environment; nothing is signalled by pid file.
        berth_testkit::kill_marked(berth_sys::slot::DIR_VAR, &self.data_dir);
        // Tasks outlive a killed agent on purpose.
        berth_testkit::kill_tasks_under(&self.data_dir.join("allocs"));
        if std::thread::panicking() {
            eprintln!(
                "--- berth agent log (tail) ---\n{}\n--- end ---",
                self.log_tail()
            );
        }
    }
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Nearest-rank percentile of sorted `v`, `p` in (0, 1].
pub fn pct(sorted: &[f64], p: f64) -> f64 {
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[derive(Debug, Clone, Copy)]
pub struct Stats {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

pub fn stats(v: &[f64]) -> Stats {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    Stats {
        p50: pct(&s, 0.5),
        p90: pct(&s, 0.9),
        p99: pct(&s, 0.99),
        max: s[s.len() - 1],
    }
}

pub fn row(name: &str, v: &[f64]) -> Stats {
    let s = stats(v);
    println!(
        "  {name:<40} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
        s.p50, s.p90, s.p99, s.max
    );
    s
}

/// Outcome of one parallel phase: latencies (ms) of the calls that succeeded, errors, wall time
/// and agent CPU seconds.
#[derive(Default)]
pub struct Phase {
    pub lat: Vec<f64>,
    pub errors: Vec<String>,
    pub wall: Duration,
    pub cpu: f64,
    pub plugin_cpu: Option<f64>,
}

pub fn report_phase(name: &str, n: usize, p: &Phase) {
    let wall = p.wall.as_secs_f64();
    println!("  {name}: {}/{n} ok", p.lat.len());
    if !p.lat.is_empty() {
        let s = stats(&p.lat);
        println!(
            "    latency per call: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            s.p50, s.p99, s.max
        );
    }
    println!(
        "    wall time for all: {:.1} ms ({:.0} calls/s)",
        wall * 1e3,
        n as f64 / wall
    );
    print_cpu(wall, p.cpu, p.plugin_cpu);
    for e in p.errors.iter().take(5) {
        println!("    error: {e}");
    }
}

/// CPU time (utime + stime) of the agent and of its plugin from the moment it was made.
pub struct CpuMeter {
    tck: f64,
    agent: (u32, u64),
    plugin: Option<(u32, u64)>,
}

impl CpuMeter {
    /// Starts counting for `agent` and the plugin it runs.
    pub fn start(agent: &Agent) -> CpuMeter {
        CpuMeter::of(agent.pid(), agent.plugin_pid())
    }

    /// Starts counting for the process `agent` and, when given, the process `plugin`.
    pub fn of(agent: u32, plugin: Option<u32>) -> CpuMeter {
        CpuMeter {
            tck: clk_tck(),
            agent: (agent, cpu_ticks(agent)),
            plugin: plugin.map(|p| (p, cpu_ticks(p))),
        }
    }

    /// Seconds of CPU used since the start: the agent's, and the plugin's when it runs.
    pub fn read(&self) -> (f64, Option<f64>) {
        let since = |(pid, t0): (u32, u64)| (cpu_ticks(pid) - t0) as f64 / self.tck;
        (since(self.agent), self.plugin.map(since))
    }
}

/// Nanoseconds on a CPU of every live thread of `pid` (the first field of
/// `/proc/<pid>/task/<tid>/schedstat`), by thread id.
pub fn thread_run_ns(pid: u32) -> BTreeMap<u32, u64> {
    let mut out = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let Some(tid) = t.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if let Some(ns) = std::fs::read_to_string(t.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
        {
            out.insert(tid, ns);
        }
    }
    out
}

/// CPU time of one process from the moment it was made, to the nanosecond, from its
/// threads' scheduler statistics (utime and stime only count whole clock ticks). Exact for
/// the threads alive when read; what threads that exited meanwhile ran in the window is
/// missing, and [`ThreadMeter::read`] says how many did.
#[derive(Debug)]
pub struct ThreadMeter {
    pid: u32,
    start: BTreeMap<u32, u64>,
}

impl ThreadMeter {
    pub fn start(pid: u32) -> ThreadMeter {
        ThreadMeter {
            pid,
            start: thread_run_ns(pid),
        }
    }

    /// Seconds on a CPU since the start, and how many threads exited meanwhile (their share
    /// is not counted: a lower bound then).
    pub fn read(&self) -> (f64, usize) {
        let now = thread_run_ns(self.pid);
        let ns: u64 = now
            .iter()
            .map(|(tid, t)| t.saturating_sub(self.start.get(tid).copied().unwrap_or(0)))
            .sum();
        let exited = self.start.keys().filter(|t| !now.contains_key(t)).count();
        (ns as f64 / 1e9, exited)
    }
}

/// Prints the agent's (and the plugin's) CPU seconds as shares of one core over `wall`
/// seconds.
pub fn print_cpu(wall: f64, cpu: f64, plugin_cpu: Option<f64>) {
    println!(
        "    agent CPU: {cpu:.3} s = {:.0}% of one core over the wall time",
        100.0 * cpu / wall
    );
    if let Some(c) = plugin_cpu {
        println!(
            "    (berth-hostpath CPU: {c:.3} s = {:.0}% of one core)",
            100.0 * c / wall
        );
    }
}

/// Polls `check` every `every` until it gives a value; panics with `what` (and the last
/// state it describes) after `timeout`.
pub async fn poll_until<T, F, Fut>(what: &str, every: Duration, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    try_poll_until(every, timeout, check)
        .await
        .unwrap_or_else(|state| panic!("{what}: not within {timeout:?}: {state}"))
}

/// Polls `check` every `every` until it gives a value (`Ok`), or until it fails once
/// `timeout` has passed (`Err` with what it said then). `check` runs at least once.
pub async fn try_poll_until<T, E, F, Fut>(
    every: Duration,
    timeout: Duration,
    mut check: F,
) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(v) => return Ok(v),
            Err(state) if Instant::now() >= deadline => return Err(state),
            Err(_) => {}
        }
        tokio::time::sleep(every).await;
    }
}

/// A bench's command line: whether `--quick` (a smoke run) was given, and the whole-number
/// values of the `--name N` options given.
#[derive(Debug, Default)]
pub struct Options {
    /// `--quick` was given.
    pub quick: bool,
    given: BTreeMap<String, u64>,
}

impl Options {
    /// Parses this process's arguments (see [`Options::parse_from`]).
    pub fn parse(names: &[&str]) -> Result<Options, String> {
        Options::parse_from(std::env::args().skip(1), names)
    }

    /// Parses `args`: `--quick`, `--bench` (which `cargo bench` passes to every bench; ignored),
    /// and `--name N` for each of `names`, N a whole number (the last one given wins).
    /// `-h`/`--help` is an `Err` with an empty message (show the usage); any other argument, a
    /// missing value or one that is not a whole number, an `Err` that names it.
    pub fn parse_from(
        args: impl IntoIterator<Item = String>,
        names: &[&str],
    ) -> Result<Options, String> {
        let mut o = Options::default();
        let mut it = args.into_iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--quick" => o.quick = true,
                "--bench" => {}
                "-h" | "--help" => return Err(String::new()),
                name if names.contains(&name) => {
                    let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
                    let n = v
                        .parse()
                        .map_err(|_| format!("{a}: {v:?} is not a whole number"))?;
                    o.given.insert(a, n);
                }
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(o)
    }

    /// The value of option `name` if given, else `default`.
    pub fn value(&self, name: &str, default: u64) -> u64 {
        self.given.get(name).copied().unwrap_or(default)
    }

    /// The value of option `name` if given, else `default`, as a count; an error names the
    /// option when it does not fit.
    pub fn count(&self, name: &str, default: usize) -> Result<usize, String> {
        match self.given.get(name) {
            None => Ok(default),
            Some(&n) => usize::try_from(n).map_err(|_| format!("{name}: {n} is too large")),
        }
    }
}

/// A bench binary's `main`: parses its options (usage and exit 2 on a bad one), runs it until
/// done or Ctrl-C (dropping the run kills the agent, its plugin and its tasks), and says
/// `ok` or the failures it returned.
pub async fn bench_main<O, F>(
    name: &str,
    usage: &str,
    opts: Result<O, String>,
    run: impl FnOnce(O) -> F,
    ok: &str,
) -> ExitCode
where
    F: Future<Output = Vec<String>>,
{
    let opts = match opts {
        Ok(o) => o,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("{name}: {e}");
            }
            eprintln!("{usage}");
            return ExitCode::from(2);
        }
    };
    let failures = tokio::select! {
        f = run(opts) => f,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("interrupted");
            return ExitCode::from(130);
        }
    };
    if failures.is_empty() {
        println!("\nresult: OK ({ok})");
        ExitCode::SUCCESS
    } else {
        println!("\nresult: FAILED: {}", failures.join("; "));
        ExitCode::FAILURE
    }
}

/// The spec of a 1 MiB file-system volume `id` of [`PLUGIN`] with the one capability `mode`.
pub fn volume_spec(id: &str, mode: AccessMode) -> VolumeSpecRequest {
    VolumeSpecRequest {
        spec: format!(
            "id = \"{id}\"\nname = \"{id}\"\ntype = \"csi\"\nplugin_id = \"{PLUGIN}\"\n\
             capacity_min = \"1MiB\"\ncapability {{\n  access_mode = \"{mode}\"\n  \
             attachment_mode = \"file-system\"\n}}\n"
        ),
        format: SpecFormat::Hcl,
        file: Some(format!("{id}.hcl")),
    }
}

/// A file-system claim of `alloc` in `mode`.
pub fn claim_req(alloc: &str, mode: AccessMode) -> ClaimRequest {
    ClaimRequest {
        alloc_id: alloc.into(),
        read_only: false,
        access_mode: mode,
        attachment_mode: AttachmentMode::FileSystem,
        mount_options: None,
    }
}

/// The release of `alloc`'s claim.
pub fn release_req(alloc: &str) -> ReleaseRequest {
    ReleaseRequest {
        alloc_id: alloc.into(),
    }
}

/// One claim → mounted → release of volume `vol` by `alloc` through the agent's API: (claim,
/// release) times. Checks the mount outside the timing.
pub async fn agent_cycle(
    agent: &Agent,
    client: &Client,
    vol: &str,
    alloc: &str,
) -> (Duration, Duration) {
    let t = Instant::now();
    let claim = client
        .claim_volume(vol, &claim_req(alloc, AccessMode::SingleNodeWriter))
        .await
        .unwrap_or_else(|e| panic!("claim for {alloc}: {e}"));
    let claim_time = t.elapsed();
    assert!(
        mounts_under(agent.pid(), &agent.data_dir).contains(&claim.target),
        "{} not mounted after the claim",
        claim.target.display()
    );
    let t = Instant::now();
    let r = client
        .release_volume(vol, &release_req(alloc))
        .await
        .unwrap_or_else(|e| panic!("release for {alloc}: {e}"));
    let release_time = t.elapsed();
    assert!(r.released, "release for {alloc} not done: {:?}", r.error);
    let left = mounts_under(agent.pid(), &agent.data_dir);
    assert!(left.is_empty(), "mounted after the release: {left:?}");
    (claim_time, release_time)
}
