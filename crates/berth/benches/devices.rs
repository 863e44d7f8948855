//! Benchmark: devices, from a plugin's device list to a task, through real `berth agent`s and
//! in-process.
//!
//! It runs the workspace's example device plugins: `berth-nomad-device` (Nomad's protocol; the
//! agent launches it from its `plugin_dir`; its devices are the files of a directory) and
//! `berth-kube-device` (the Kubernetes device plugin API; it registers at the agent's
//! `kubelet.sock`; with `--dir`, its devices are the entries of a directory). Three parts:
//!
//! 1. **Fingerprint → schedulable**, per protocol, each in an agent of its own whose plugin
//!    lists its directory every 10 ms. A sample creates a new device file and measures from
//!    that moment to the first `POST /v1/jobs` that places a job asking for exactly that device
//!    (`${device.ids} set_contains <id>`), tried every 1 ms (the attempts before are refused
//!    with 400). Another sample, with a device of its own, measures until `GET /v1/node`
//!    (polled every 1 ms) first shows the device healthy. The baseline, interleaved sample by
//!    sample: the same poll loop for a job without devices. After each sample its job is
//!    stopped (its device released) and its device file removed, outside the timing.
//! 2. **Reserve**, in-process: one `DeviceManager` is the sink of a `NomadPlugin` running
//!    `berth-nomad-device` and of a `KubeDevices` where `berth-kube-device` registered. A
//!    sample places one device, times `DeviceManager::reserve` (Nomad's `Reserve`, Kubernetes'
//!    `Allocate`, through the protocol's `PluginOps`), then releases it. The baseline,
//!    interleaved: a no-op RPC to the same plugin process through a raw client in the same
//!    process (`PluginInfo` through `NomadClient`, `GetDevicePluginOptions`). Then end to end,
//!    in the agents of part 1: `job run` → the task's process started (its `started_at`) for an
//!    `exec` task holding one device, against the same job without it, interleaved.
//! 3. **Agent CPU with 100 device instances streaming stats every second**: an agent with the
//!    Nomad example plugin over 100 files (list period 1 s, `stats_interval = "1s"`), measured
//!    for `--cpu-seconds` once all 100 are healthy with statistics: the agent's and the
//!    plugin's utime+stime from `/proc/<pid>/stat`, and, because those count whole clock ticks,
//!    also their threads' run time from `/proc/<pid>/task/*/schedstat` (nanoseconds). Then
//!    `/v1/metrics` must have 100 `berth_device_stat{` lines and every instance's statistics
//!    must be newer than at the start. Baseline: the same agent and plugin over an empty
//!    directory, as long.
//!
//! What the figures mean:
//! - *new device → placed*: how soon after a device appears on the host a job can have it:
//!   the plugin's list period (up to 10 ms, half on average), its stream, the agent's
//!   validation and device view, plus the poll's resolution (a `POST` every ~1 ms and its round
//!   trip). The baseline is that round trip alone at the same poll rate; the difference is
//!   the plugin's and berth's share. *→ healthy* is the same seen through `GET /v1/node`.
//! - *reserve / no-op*: what the device manager and the protocol layer add to one RPC of the
//!   plugin; near 1x, a reservation costs what any call to the plugin costs. The end-to-end
//!   difference is what holding a device adds to a task start (placement, the reservation RPC,
//!   the answer persisted with the alloc, the device's mount in the task's root).
//! - *CPU*: the share of one core the agent (and, apart, the plugin) spends over the window;
//!   the difference to the empty baseline is what following 100 instances' statistics every
//!   second costs. The run time is the finer figure; it misses what threads that exited in
//!   the window ran (the line says when any did).
//!
//! `cargo bench -p berth --bench devices [-- --samples 100 --warmup 5 --cpu-seconds 60]`;
//! `-- --quick` is a smoke run (10 samples, 1 warm-up, 10 s of CPU). Needs root and
//! util-linux (`unshare`, `setpriv`). Every agent, plugin and task is killed and every
//! temporary directory removed at the end, also after a panic or Ctrl-C.

mod common;

use std::{
    collections::BTreeMap,
    ffi::OsStr,
    path::{Path, PathBuf},
    process::{Child, Command, ExitCode, Stdio},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use berth_api::{
    Client, NodeStatus,
    jobs::{ClientStatus, JobRunRequest, JobStatus},
    volumes::SpecFormat,
};
use berth_devices::{
    manager::{DeviceManager, ManagerConfig, NoObserver, NoRecords, TaskRequests},
    plugin::PluginSink,
    request::{DeviceRequest, RequestInput},
    view::{DevicesView, InstanceView, PluginState},
};
use berth_devices_kube::{
    KubeConfig, KubeDevices,
    proto::v1beta1::{Empty, device_plugin_client::DevicePluginClient},
};
use berth_devices_nomad::{NomadClient, NomadPlugin, NomadPluginConfig, PluginAddress};
use common::{Agent, CpuMeter, Options, ThreadMeter, ms, poll_until, row, stats, workspace_binary};
use tokio_util::sync::CancellationToken;

const USAGE: &str = "\
usage: devices [--samples N] [--warmup N] [--cpu-seconds S] [--quick]
  --samples N      samples of each kind in parts 1 and 2 end to end; part 2 in-process
                   takes ten times as many (default 100)
  --warmup N       samples of each kind run first and not counted (default 5)
  --cpu-seconds S  CPU window of part 3, for each of its two agents (default 60)
  --quick          smoke run: 10 samples, 1 warm-up, 10 s (flags given still win)";

/// How long any one wait of the bench may take before it fails.
const WAIT: Duration = Duration::from_secs(60);
/// How often the timed loops of part 1 and the end-to-end starts poll.
const POLL: Duration = Duration::from_millis(1);
/// How often the untimed waits poll.
const SETTLE_POLL: Duration = Duration::from_millis(5);
/// The list period of both plugins in part 1.
const FAST_LIST: &str = "10ms";
/// The Nomad example plugin's name in the agents' config (its binary's name in plugin_dir).
const NOMAD_PLUGIN: &str = "example-device";
/// The example Kubernetes plugin's resource, and its socket in the kubelet dir.
const KUBE_RESOURCE: &str = "example.com/widget";
const KUBE_SOCKET: &str = "berth-widget.sock";
/// The device file every part-1 agent holds for the end-to-end starts.
const E2E_DEVICE: &str = "e2e";
/// Devices per plugin in the in-process part.
const IN_PROCESS_DEVICES: usize = 4;
/// Device instances of part 3.
const CPU_DEVICES: usize = 100;

#[derive(Debug, Clone, Copy)]
struct Opts {
    samples: usize,
    warmup: usize,
    cpu_seconds: u64,
}

fn parse_args() -> Result<Opts, String> {
    let args = Options::parse(&["--samples", "--warmup", "--cpu-seconds"])?;
    let (samples, warmup, cpu_seconds) = if args.quick {
        (10, 1, 10)
    } else {
        (100, 5, 60)
    };
    let o = Opts {
        samples: args.count("--samples", samples)?,
        warmup: args.count("--warmup", warmup)?,
        cpu_seconds: args.value("--cpu-seconds", cpu_seconds),
    };
    if o.samples == 0 || o.cpu_seconds == 0 {
        return Err("--samples and --cpu-seconds must be at least 1".into());
    }
    Ok(o)
}

/// A device plugin protocol, with the example plugin that speaks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proto {
    Nomad,
    Kube,
}

impl Proto {
    const ALL: [Proto; 2] = [Proto::Nomad, Proto::Kube];

    fn name(self) -> &'static str {
        match self {
            Proto::Nomad => "nomad",
            Proto::Kube => "kubernetes",
        }
    }

    /// A short name for the tables.
    fn label(self) -> &'static str {
        match self {
            Proto::Nomad => "nomad",
            Proto::Kube => "kube",
        }
    }

    /// The example plugin's device group (`vendor/type/name`).
    fn group(self) -> &'static str {
        match self {
            Proto::Nomad => "berth/file/mock",
            Proto::Kube => "example.com/widget/widget",
        }
    }

    /// The `device` block label that asks for one of its devices.
    fn request(self) -> &'static str {
        match self {
            Proto::Nomad => "berth/file/mock",
            Proto::Kube => KUBE_RESOURCE,
        }
    }

    /// The reservation RPC, and the no-op RPC of the baseline.
    fn rpcs(self) -> (&'static str, &'static str) {
        match self {
            Proto::Nomad => ("Reserve", "PluginInfo"),
            Proto::Kube => ("Allocate", "GetDevicePluginOptions"),
        }
    }
}

/// The example plugins, built for this bench.
#[derive(Debug)]
struct Bins {
    nomad: PathBuf,
    kube: PathBuf,
}

impl Bins {
    fn build() -> Bins {
        Bins {
            nomad: workspace_binary("berth-devices-nomad", "berth-nomad-device"),
            kube: workspace_binary("berth-devices-kube", "berth-kube-device"),
        }
    }
}

/// A process this bench started itself (the example Kubernetes plugin), killed when dropped
/// (and when the bench's main thread dies: `setpriv --pdeathsig`).
struct Spawned {
    child: Child,
    log: PathBuf,
}

impl Spawned {
    /// `berth-kube-device` against `kubelet_dir`, its call log and mount sources in
    /// `state_dir`, with `extra` arguments.
    fn kube(bin: &Path, kubelet_dir: &Path, state_dir: &Path, extra: &[&OsStr]) -> Spawned {
        std::fs::create_dir_all(state_dir).expect("kube plugin state dir");
        let log = state_dir.join("plugin.log");
        let out = std::fs::File::create(&log).expect("kube plugin log");
        let child = Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--"])
            .arg(bin)
            .arg("--kubelet-dir")
            .arg(kubelet_dir)
            .arg("--state-dir")
            .arg(state_dir)
            .args(["--log-level", "warn"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("kube plugin log"))
            .stderr(out)
            .spawn()
            .expect("start berth-kube-device (needs util-linux's setpriv)");
        Spawned { child, log }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("--- berth-kube-device log ---\n{text}--- end ---");
        }
    }
}

/// Kills whatever is still marked as a plugin of a slot under a directory when dropped (a
/// last sweep behind the in-process plugins' own clean-up).
struct Sweep(PathBuf);

impl Drop for Sweep {
    fn drop(&mut self) {
        berth_testkit::kill_marked(berth_sys::slot::DIR_VAR, &self.0);
    }
}

/// Makes device `id` in `devs`: a plain 0644 file (the Nomad example plugin calls only
/// `-rwxrwxrwx` files unhealthy).
fn create_device(devs: &Path, id: &str) {
    std::fs::write(devs.join(id), b"device\n").unwrap_or_else(|e| panic!("device {id}: {e}"));
}

fn instance<'a>(view: &'a DevicesView, group: &str, id: &str) -> Option<&'a InstanceView> {
    view.groups
        .iter()
        .filter(|g| g.id().to_string() == group)
        .flat_map(|g| &g.instances)
        .find(|i| i.id == id)
}

fn instances<'a>(view: &'a DevicesView, group: &str) -> Vec<&'a InstanceView> {
    view.groups
        .iter()
        .filter(|g| g.id().to_string() == group)
        .flat_map(|g| &g.instances)
        .collect()
}

/// Whether `plugin` (`protocol:name`) is ready and has reported its devices.
fn plugin_ready(view: &DevicesView, plugin: &str) -> bool {
    view.plugins
        .iter()
        .any(|p| p.id.to_string() == plugin && p.state == PluginState::Ready && p.fingerprinted)
}

/// One line per plugin and group, for a wait that failed.
fn summary(view: &DevicesView) -> String {
    let mut out: Vec<String> = view
        .plugins
        .iter()
        .map(|p| {
            format!(
                "plugin {} {} fingerprinted={} {}",
                p.id,
                p.state.as_str(),
                p.fingerprinted,
                p.reason.as_deref().unwrap_or("")
            )
        })
        .collect();
    for g in &view.groups {
        let healthy = g.instances.iter().filter(|i| i.healthy).count();
        let held = g
            .instances
            .iter()
            .filter(|i| i.reserved_by.is_some())
            .count();
        let ids: Vec<&str> = g.instances.iter().take(8).map(|i| i.id.as_str()).collect();
        out.push(format!(
            "group {}: {} instances, {healthy} healthy, {held} held ({}…)",
            g.id(),
            g.instances.len(),
            ids.join(",")
        ));
    }
    out.join("\n")
}

/// Polls `GET /v1/node` every `every` until `pred` holds (at most [`WAIT`]); returns it.
async fn wait_node(
    client: &Client,
    what: &str,
    every: Duration,
    pred: impl Fn(&DevicesView) -> bool,
) -> NodeStatus {
    poll_until(what, every, WAIT, || async {
        let node = client
            .node()
            .await
            .unwrap_or_else(|e| panic!("node status: {e}"));
        if pred(&node.devices) {
            Ok(node)
        } else {
            Err(summary(&node.devices))
        }
    })
    .await
}

/// A service job `id` with one `exec` task running `sleep`; with `device`, the task asks for
/// one instance of that label, and with an id too, for exactly that instance.
fn job_spec(id: &str, device: Option<(&str, Option<&str>)>) -> String {
    let resources = match device {
        None => String::new(),
        Some((label, only)) => {
            let constraint = only.map_or(String::new(), |dev| {
                format!(
                    "          constraint {{\n            attribute = \"${{device.ids}}\"\n            \
                     operator  = \"set_contains\"\n            value     = \"{dev}\"\n          }}\n"
                )
            });
            format!(
                "      resources {{\n        device \"{label}\" {{\n          count = 1\n\
                 {constraint}        }}\n      }}\n"
            )
        }
    };
    format!(
        "job \"{id}\" {{\n  type = \"service\"\n  group \"g\" {{\n    task \"main\" {{\n      \
         driver = \"exec\"\n      config {{\n        command = \"/bin/sleep\"\n        \
         args    = [\"3600\"]\n      }}\n{resources}      kill_timeout = \"2s\"\n    }}\n  }}\n}}\n"
    )
}

fn run_request(id: &str, spec: String) -> JobRunRequest {
    JobRunRequest {
        spec,
        format: SpecFormat::Hcl,
        file: Some(format!("{id}.hcl")),
        ..Default::default()
    }
}

/// Stops job `id` and waits until its allocs completed and, with `device` (group, id), until
/// that device is free again.
async fn stop_job(client: &Client, id: &str, device: Option<(&str, &str)>) {
    client
        .stop_job(id)
        .await
        .unwrap_or_else(|e| panic!("stop job {id}: {e}"));
    poll_until(&format!("stop of job {id}"), SETTLE_POLL, WAIT, || async {
        let s = client
            .job(id)
            .await
            .unwrap_or_else(|e| panic!("status of job {id}: {e}"));
        if s.allocs
            .iter()
            .all(|a| a.client_status == ClientStatus::Complete)
        {
            Ok(())
        } else {
            Err(format!("{s:#?}"))
        }
    })
    .await;
    if let Some((group, dev)) = device {
        wait_node(
            client,
            &format!("{group}/{dev} released"),
            SETTLE_POLL,
            |v| instance(v, group, dev).is_some_and(|i| i.reserved_by.is_none()),
        )
        .await;
    }
}

/// An agent with one example device plugin over the device directory `devs`.
struct DeviceAgent {
    proto: Proto,
    // Fields drop in order: the plugin this bench started goes before the agent.
    _kube: Option<Spawned>,
    agent: Agent,
    devs: PathBuf,
}

impl DeviceAgent {
    /// Starts an agent with the example plugin of `proto` listing its device directory (made
    /// with `devices` in it) every `list_period`, statistics every `stats_interval`; returns
    /// once the plugin is ready and every device is healthy.
    async fn start(
        proto: Proto,
        bins: &Bins,
        list_period: &str,
        stats_interval: &str,
        devices: &[String],
    ) -> DeviceAgent {
        let nomad_bin = bins.nomad.clone();
        let made: Vec<String> = devices.to_vec();
        let stats_interval = stats_interval.to_string();
        let nomad_list = list_period.to_string();
        let agent = Agent::launch(move |tmp| {
            let devs = tmp.join("devs");
            std::fs::create_dir(&devs).expect("device dir");
            for id in &made {
                create_device(&devs, id);
            }
            match proto {
                Proto::Nomad => {
                    let plugins = tmp.join("plugins");
                    std::fs::create_dir(&plugins).expect("plugin_dir");
                    std::os::unix::fs::symlink(&nomad_bin, plugins.join(NOMAD_PLUGIN))
                        .expect("plugin link");
                    format!(
                        "plugin_dir = \"{}\"\n\nplugin \"{NOMAD_PLUGIN}\" {{\n  config {{\n    \
                         dir         = \"{}\"\n    list_period = \"{nomad_list}\"\n  }}\n}}\n\n\
                         devices {{\n  stats_interval = \"{stats_interval}\"\n  \
                         kubernetes     = false\n  cdi_spec_dirs  = []\n}}\n",
                        plugins.display(),
                        devs.display()
                    )
                }
                Proto::Kube => format!(
                    "devices {{\n  kubelet_dir    = \"{}\"\n  stats_interval = \"{stats_interval}\"\n  \
                     cdi_spec_dirs  = []\n}}\n",
                    tmp.join("dp").display()
                ),
            }
        })
        .await;
        let tmp = agent.tmp().to_path_buf();
        let devs = tmp.join("devs");
        let kube = (proto == Proto::Kube).then(|| {
            Spawned::kube(
                &bins.kube,
                &tmp.join("dp"),
                &tmp.join("kstate"),
                &[
                    OsStr::new("--dir"),
                    devs.as_os_str(),
                    OsStr::new("--list-period"),
                    OsStr::new(list_period),
                ],
            )
        });
        let mut da = DeviceAgent {
            proto,
            _kube: kube,
            agent,
            devs,
        };
        let plugin = da.plugin_id();
        let n = devices.len();
        da.agent
            .wait_until(
                &format!("{plugin} ready with {n} healthy devices"),
                WAIT,
                |client| {
                    let plugin = plugin.clone();
                    async move {
                        client.node().await.is_ok_and(|node| {
                            plugin_ready(&node.devices, &plugin)
                                && instances(&node.devices, proto.group())
                                    .iter()
                                    .filter(|i| i.healthy)
                                    .count()
                                    == n
                        })
                    }
                },
            )
            .await;
        da
    }

    fn plugin_id(&self) -> String {
        match self.proto {
            Proto::Nomad => format!("nomad:{NOMAD_PLUGIN}"),
            Proto::Kube => format!("kubernetes:{KUBE_RESOURCE}"),
        }
    }

    /// Removes device `id` and waits until the node no longer shows it.
    async fn remove_device(&self, id: &str) {
        std::fs::remove_file(self.devs.join(id)).unwrap_or_else(|e| panic!("remove {id}: {e}"));
        let group = self.proto.group();
        wait_node(
            &self.agent.client(),
            &format!("{group}/{id} gone"),
            SETTLE_POLL,
            |v| instance(v, group, id).is_none(),
        )
        .await;
    }
}

/// Part 1's figures of one protocol (ms), and the refused `POST`s per placed sample.
#[derive(Default)]
struct Fingerprint {
    placed: Vec<f64>,
    healthy: Vec<f64>,
    baseline: Vec<f64>,
    refused: Vec<f64>,
}

/// Tries `POST /v1/jobs` with `spec` every [`POLL`] until it is accepted: the time since `t0`
/// and how many attempts were refused (each a 400; anything else fails the bench).
async fn post_until_placed(client: &Client, id: &str, spec: String, t0: Instant) -> (f64, u32) {
    let req = run_request(id, spec);
    let mut refused = 0;
    loop {
        match client.run_job(&req).await {
            Ok(_) => return (ms(t0.elapsed()), refused),
            Err(e) if e.status() == Some(400) => {
                refused += 1;
                assert!(
                    t0.elapsed() < WAIT,
                    "job {id} not placed within {WAIT:?}; last refusal: {e}"
                );
            }
            Err(e) => panic!("run job {id}: {e}"),
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn bench_fingerprint(opts: Opts, da: &DeviceAgent) -> Fingerprint {
    let client = da.agent.client();
    let proto = da.proto;
    let group = proto.group();
    let mut fp = Fingerprint::default();
    for i in 0..opts.warmup + opts.samples {
        let counted = i >= opts.warmup;
        // Rotate the order, so no kind always follows another.
        for k in 0..3 {
            match (i + k) % 3 {
                0 => {
                    let dev = format!("p{i}");
                    let id = format!("fp-{}-{i}", proto.name());
                    let spec = job_spec(&id, Some((proto.request(), Some(&dev))));
                    create_device(&da.devs, &dev);
                    let t0 = Instant::now();
                    let (t, refused) = post_until_placed(&client, &id, spec, t0).await;
                    stop_job(&client, &id, Some((group, &dev))).await;
                    da.remove_device(&dev).await;
                    if counted {
                        fp.placed.push(t);
                        fp.refused.push(f64::from(refused));
                    }
                }
                1 => {
                    let dev = format!("h{i}");
                    create_device(&da.devs, &dev);
                    let t0 = Instant::now();
                    poll_until(&format!("{group}/{dev} healthy"), POLL, WAIT, || async {
                        let node = client
                            .node()
                            .await
                            .unwrap_or_else(|e| panic!("node status: {e}"));
                        match instance(&node.devices, group, &dev) {
                            Some(d) if d.healthy => Ok(()),
                            _ => Err(summary(&node.devices)),
                        }
                    })
                    .await;
                    let t = ms(t0.elapsed());
                    da.remove_device(&dev).await;
                    if counted {
                        fp.healthy.push(t);
                    }
                }
                _ => {
                    let id = format!("fp-base-{}-{i}", proto.name());
                    let spec = job_spec(&id, None);
                    let t0 = Instant::now();
                    let (t, refused) = post_until_placed(&client, &id, spec, t0).await;
                    assert_eq!(refused, 0, "a job without devices was refused");
                    stop_job(&client, &id, None).await;
                    if counted {
                        fp.baseline.push(t);
                    }
                }
            }
        }
    }
    fp
}

fn report_fingerprint(opts: Opts, results: &[(Proto, Fingerprint)]) {
    println!(
        "\n1. Fingerprint → schedulable, through the agent (plugins list every {FAST_LIST}; \
         polls every {} ms; n={} per kind, {} warm-up, interleaved)",
        POLL.as_millis(),
        opts.samples,
        opts.warmup
    );
    println!(
        "  {:<40} {:>8} {:>8} {:>8} {:>8}",
        "ms", "median", "p90", "p99", "max"
    );
    for (proto, fp) in results {
        let p = proto.label();
        let placed = row(&format!("{p}: new device → job placed"), &fp.placed);
        let healthy = row(&format!("{p}: new device → healthy (node)"), &fp.healthy);
        let base = row(&format!("{p}: baseline, job without devices"), &fp.baseline);
        let refused = stats(&fp.refused);
        println!(
            "  {p}: placed/baseline median {:.2}x (p90 {:.2}x), healthy/baseline median {:.2}x; \
             the device adds {:.2} ms to placement (median difference); refused POSTs per \
             sample: median {:.0}, max {:.0}",
            placed.p50 / base.p50,
            placed.p90 / base.p90,
            healthy.p50 / base.p50,
            placed.p50 - base.p50,
            refused.p50,
            refused.max
        );
    }
}

/// When the task of each alloc of `s` started, measured from `t0`, in ms.
fn started_after(s: &JobStatus, t0: SystemTime) -> Vec<f64> {
    s.allocs
        .iter()
        .flat_map(|a| a.tasks.values())
        .map(|t| {
            let started = t.started_at.expect("a running task has started_at");
            ms(started.duration_since(t0).unwrap_or(Duration::ZERO))
        })
        .collect()
}

/// `job run` → task started, with a device and without, interleaved: (with, without) in ms,
/// and failures.
async fn bench_e2e(opts: Opts, da: &DeviceAgent) -> (Vec<f64>, Vec<f64>, Vec<String>) {
    let client = da.agent.client();
    let proto = da.proto;
    let (mut with, mut without, mut failures) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..opts.warmup + opts.samples {
        let counted = i >= opts.warmup;
        for device in [i % 2 == 0, i % 2 != 0] {
            let id = format!(
                "e2e-{}-{}-{i}",
                proto.name(),
                if device { "dev" } else { "plain" }
            );
            let spec = job_spec(&id, device.then_some((proto.request(), None)));
            let t0 = SystemTime::now();
            client
                .run_job(&run_request(&id, spec))
                .await
                .unwrap_or_else(|e| panic!("run job {id}: {e}"));
            let status = poll_until(&format!("job {id} running"), POLL, WAIT, || async {
                let s = client
                    .job(&id)
                    .await
                    .unwrap_or_else(|e| panic!("status of job {id}: {e}"));
                if let Some(a) = s.allocs.iter().find(|a| a.client_status.is_terminal()) {
                    panic!(
                        "job {id}: alloc {} ended ({:?}): {:?}",
                        a.alloc_id, a.client_status, a.failure
                    );
                }
                let running = s.allocs.len() == 1
                    && s.allocs.iter().all(|a| {
                        a.client_status == ClientStatus::Running
                            && a.tasks.values().all(|t| t.pid.is_some())
                    });
                if running {
                    Ok(s)
                } else {
                    Err(format!("{s:#?}"))
                }
            })
            .await;
            let held: Vec<String> = status
                .allocs
                .iter()
                .flat_map(|a| a.tasks.values())
                .flat_map(|t| &t.devices)
                .flat_map(|d| d.devices.clone())
                .collect();
            let expected = format!("{}/{E2E_DEVICE}", proto.group());
            if device && held != [expected.clone()] {
                failures.push(format!("job {id}: the task holds {held:?}, not {expected}"));
            }
            if !device && !held.is_empty() {
                failures.push(format!("job {id}: a task without devices holds {held:?}"));
            }
            stop_job(&client, &id, device.then_some((proto.group(), E2E_DEVICE))).await;
            if counted {
                let v = if device { &mut with } else { &mut without };
                v.extend(started_after(&status, t0));
            }
        }
    }
    (with, without, failures)
}

/// Part 2 in-process figures of one protocol, in ms.
#[derive(Default)]
struct Reserve {
    reserve: Vec<f64>,
    noop: Vec<f64>,
}

/// Part 2 in-process: a device manager over both example plugins, run in this process.
async fn bench_reserve(samples: usize, warmup: usize, bins: &Bins) -> [Reserve; 2] {
    let tmp = tempfile::Builder::new()
        .prefix("bd")
        .tempdir_in("/tmp")
        .expect("tmp");
    // Dropped before `tmp`: whatever plugin is left goes before its directory.
    let _sweep = Sweep(std::fs::canonicalize(tmp.path()).expect("tmp path"));
    let devs = tmp.path().join("devs");
    std::fs::create_dir(&devs).expect("device dir");
    for i in 0..IN_PROCESS_DEVICES {
        create_device(&devs, &format!("d{i}"));
    }
    let manager = Arc::new(DeviceManager::new(
        ManagerConfig::default(),
        Arc::new(NoObserver),
        Arc::new(NoRecords),
    ));
    let sink: Arc<dyn PluginSink> = manager.clone();
    let mut cfg = NomadPluginConfig::new("bench-device", &bins.nomad, tmp.path().join("n"));
    cfg.config = serde_json::json!({
        "dir": devs.display().to_string(),
        "list_period": "1s",
    });
    let nomad = NomadPlugin::new(cfg).expect("the Nomad plugin's config");
    let kubelet_dir = tmp.path().join("k");
    let kube = KubeDevices::new(KubeConfig::new(&kubelet_dir)).expect("the kubelet dir");
    let shutdown = CancellationToken::new();
    // A panic in `work` drops the plugins' futures too, which kills their processes.
    let work = async {
        let r = reserve_samples(&manager, tmp.path(), bins, samples, warmup).await;
        shutdown.cancel();
        r
    };
    let (r, (), served) = tokio::join!(
        work,
        nomad.run(Arc::clone(&sink), shutdown.clone()),
        kube.run(sink, shutdown.clone()),
    );
    served.expect("the kubelet registration service");
    r
}

async fn reserve_samples(
    manager: &DeviceManager,
    tmp: &Path,
    bins: &Bins,
    samples: usize,
    warmup: usize,
) -> [Reserve; 2] {
    let kubelet_dir = tmp.join("k");
    let registration = kubelet_dir.join("kubelet.sock");
    poll_until("kubelet.sock served", SETTLE_POLL, WAIT, || async {
        if registration.exists() {
            Ok(())
        } else {
            Err(format!("no {}", registration.display()))
        }
    })
    .await;
    let count = IN_PROCESS_DEVICES.to_string();
    let _kube = Spawned::kube(
        &bins.kube,
        &kubelet_dir,
        &tmp.join("ks"),
        &[
            OsStr::new("--count"),
            OsStr::new(&count),
            OsStr::new("--list-period"),
            OsStr::new("1s"),
        ],
    );
    let plugins = [
        ("nomad:bench-device", Proto::Nomad),
        ("kubernetes:example.com/widget", Proto::Kube),
    ];
    poll_until("both plugins ready", SETTLE_POLL, WAIT, || async {
        let view = manager.view();
        let ready = plugins.iter().all(|(id, proto)| {
            plugin_ready(&view, id)
                && instances(&view, proto.group())
                    .iter()
                    .filter(|i| i.healthy)
                    .count()
                    == IN_PROCESS_DEVICES
        });
        if ready { Ok(()) } else { Err(summary(&view)) }
    })
    .await;

    // Raw clients of the same plugin processes.
    let sock_dir = tmp.join("n/sock");
    let nomad_socket = std::fs::read_dir(&sock_dir)
        .unwrap_or_else(|e| panic!("{}: {e}", sock_dir.display()))
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("plugin"))
        })
        .unwrap_or_else(|| panic!("no plugin socket in {}", sock_dir.display()));
    let nomad = NomadClient::new(
        "bench-device",
        &PluginAddress::Unix(nomad_socket),
        Duration::from_secs(10),
    );
    let mut kube = DevicePluginClient::new(berth_devices::grpc::unix_channel(
        &kubelet_dir.join(KUBE_SOCKET),
    ));

    let requests = Proto::ALL.map(|p| {
        DeviceRequest::build(&RequestInput {
            name: p.request().into(),
            count: Some(1),
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("request {}: {e:?}", p.request()))
    });
    let mut out = [Reserve::default(), Reserve::default()];
    for i in 0..warmup + samples {
        let counted = i >= warmup;
        for (p, proto) in Proto::ALL.into_iter().enumerate() {
            for reserve in [i % 2 == 0, i % 2 != 0] {
                let t = if reserve {
                    let alloc = format!("a{i}");
                    let task = TaskRequests {
                        alloc_id: &alloc,
                        task: "main",
                        at: "bench",
                        requests: std::slice::from_ref(&requests[p]),
                    };
                    let chosen = manager
                        .place(&[task])
                        .await
                        .unwrap_or_else(|r| panic!("{} placement: {r:?}", proto.name()));
                    let assignments = chosen.into_values().next().expect("the task's devices");
                    let t0 = Instant::now();
                    let edits = manager
                        .reserve(&alloc, &assignments)
                        .await
                        .unwrap_or_else(|e| panic!("{} reserve: {e}", proto.name()));
                    let t = t0.elapsed();
                    assert!(
                        !edits.env.is_empty() && !edits.mounts.is_empty(),
                        "{} reserve gave nothing: {edits:?}",
                        proto.name()
                    );
                    assert_eq!(manager.release(&alloc), 1, "one device released");
                    t
                } else {
                    let t0 = Instant::now();
                    match proto {
                        Proto::Nomad => {
                            nomad.plugin_info().await.expect("PluginInfo");
                        }
                        Proto::Kube => {
                            tokio::time::timeout(
                                Duration::from_secs(10),
                                kube.get_device_plugin_options(Empty {}),
                            )
                            .await
                            .expect("GetDevicePluginOptions in time")
                            .expect("GetDevicePluginOptions");
                        }
                    }
                    t0.elapsed()
                };
                if counted {
                    let r = &mut out[p];
                    let v = if reserve { &mut r.reserve } else { &mut r.noop };
                    v.push(ms(t));
                }
            }
        }
    }
    out
}

fn report_reserve(opts: Opts, in_process: &[Reserve; 2], e2e: &[(Proto, Vec<f64>, Vec<f64>)]) {
    println!(
        "\n2. Reserve, in-process: one DeviceManager over both example plugins ({IN_PROCESS_DEVICES} \
         devices each; no-op RPCs through raw clients; n={}, {} warm-up, interleaved)",
        opts.samples * 10,
        opts.warmup * 10
    );
    println!(
        "  {:<40} {:>8} {:>8} {:>8} {:>8}",
        "ms", "median", "p90", "p99", "max"
    );
    for (proto, r) in Proto::ALL.iter().zip(in_process) {
        let p = proto.label();
        let (rpc, noop) = proto.rpcs();
        let a = row(&format!("{p}: reserve ({rpc} RPC)"), &r.reserve);
        let b = row(&format!("{p}: no-op RPC {noop}"), &r.noop);
        println!(
            "  {p}: reserve/no-op median {:.2}x (p90 {:.2}x, p99 {:.2}x); the manager and the \
             protocol layer add {:.3} ms (median difference)",
            a.p50 / b.p50,
            a.p90 / b.p90,
            a.p99 / b.p99,
            a.p50 - b.p50
        );
    }
    println!(
        "  End to end through the agent: `job run` → exec task's process started \
         (n={}, {} warm-up, interleaved)",
        opts.samples, opts.warmup
    );
    for (proto, with, without) in e2e {
        let p = proto.label();
        let a = row(&format!("{p}: holding one device"), with);
        let b = row(&format!("{p}: same job without a device"), without);
        println!(
            "  {p}: with/without device median {:.2}x (p90 {:.2}x); the device adds {:.2} ms \
             (median difference)",
            a.p50 / b.p50,
            a.p90 / b.p90,
            a.p50 - b.p50
        );
    }
}

/// CPU of one process over a window of part 3: utime+stime (whole clock ticks), and its
/// threads' run time (nanoseconds; threads that exited in the window are missing from it).
#[derive(Debug, Clone, Copy)]
struct Cpu {
    ticks: f64,
    run: f64,
    exited: usize,
}

/// One CPU window of part 3.
struct CpuRun {
    devices: usize,
    wall: f64,
    agent: Cpu,
    plugin: Cpu,
    stat_lines: usize,
    newer: usize,
}

/// Each instance's statistics timestamp in the node's view.
fn stat_times(view: &DevicesView) -> BTreeMap<String, u64> {
    instances(view, Proto::Nomad.group())
        .into_iter()
        .filter_map(|i| i.stats.as_ref().map(|s| (i.id.clone(), s.timestamp_ms)))
        .collect()
}

/// An agent with the Nomad example plugin over `n` devices (list period 1 s, stats every
/// second), measured for `secs` once every device is healthy with statistics.
async fn cpu_run(bins: &Bins, n: usize, secs: u64) -> CpuRun {
    let devices: Vec<String> = (0..n).map(|i| format!("dev{i:03}")).collect();
    let da = DeviceAgent::start(Proto::Nomad, bins, "1s", "1s", &devices).await;
    let client = da.agent.client();
    let group = Proto::Nomad.group();
    let warm = wait_node(
        &client,
        &format!("{n} devices healthy with statistics"),
        Duration::from_millis(50),
        |v| {
            let all = instances(v, group);
            all.len() == n
                && all.iter().all(|i| {
                    i.healthy
                        && i.stats
                            .as_ref()
                            .is_some_and(|s| s.summary.is_some() && s.timestamp_ms > 0)
                })
        },
    )
    .await;
    let before = stat_times(&warm.devices);
    let plugin_pid = da
        .agent
        .device_plugin_pid(NOMAD_PLUGIN, "berth-nomad-device")
        .unwrap_or_else(|| panic!("the agent's {NOMAD_PLUGIN} is not running"));
    let meter = CpuMeter::of(da.agent.pid(), Some(plugin_pid));
    let threads = [
        ThreadMeter::start(da.agent.pid()),
        ThreadMeter::start(plugin_pid),
    ];
    let start = Instant::now();
    // The measurement window itself: nothing polls the agent meanwhile.
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let (agent, plugin) = meter.read();
    let [(agent_run, agent_exited), (plugin_run, plugin_exited)] = threads.map(|t| t.read());
    let wall = start.elapsed().as_secs_f64();
    let metrics = client
        .metrics()
        .await
        .unwrap_or_else(|e| panic!("metrics: {e}"));
    let stat_lines = metrics
        .lines()
        .filter(|l| l.starts_with("berth_device_stat{"))
        .count();
    let after = client
        .node()
        .await
        .unwrap_or_else(|e| panic!("node status: {e}"));
    let after = stat_times(&after.devices);
    let newer = before
        .iter()
        .filter(|(id, t)| after.get(*id).is_some_and(|a| a > t))
        .count();
    CpuRun {
        devices: n,
        wall,
        agent: Cpu {
            ticks: agent,
            run: agent_run,
            exited: agent_exited,
        },
        plugin: Cpu {
            ticks: plugin.unwrap_or(0.0),
            run: plugin_run,
            exited: plugin_exited,
        },
        stat_lines,
        newer,
    }
}

async fn bench_cpu(opts: Opts, bins: &Bins) -> Vec<String> {
    let base = cpu_run(bins, 0, opts.cpu_seconds).await;
    let full = cpu_run(bins, CPU_DEVICES, opts.cpu_seconds).await;
    let tick = 1.0 / common::clk_tck();
    println!(
        "\n3. Agent CPU, Nomad example plugin (list period 1 s, stats_interval 1s), {} s window \
         after warm-up, each run (utime+stime count in ticks of {:.0} ms: ±{:.3} points)",
        opts.cpu_seconds,
        tick * 1e3,
        100.0 * tick / opts.cpu_seconds as f64
    );
    let pct = |cpu: f64, wall: f64| 100.0 * cpu / wall;
    let show = |what: &str, c: Cpu, wall: f64| {
        let exited = if c.exited > 0 {
            format!(
                " ({} thread(s) exited in the window: a lower bound)",
                c.exited
            )
        } else {
            String::new()
        };
        println!(
            "    {what:<7} utime+stime {:.2} s = {:.3}% of one core; threads' run time \
             {:.4} s = {:.4}%{exited}",
            c.ticks,
            pct(c.ticks, wall),
            c.run,
            pct(c.run, wall)
        );
    };
    for (name, r) in [
        ("empty device dir (baseline)", &base),
        ("100 devices", &full),
    ] {
        println!(
            "  {name}: {:.1} s; {} berth_device_stat lines in /v1/metrics; statistics newer \
             at the end than at the start: {}/{}",
            r.wall, r.stat_lines, r.newer, r.devices
        );
        show("agent:", r.agent, r.wall);
        show("plugin:", r.plugin, r.wall);
    }
    let diff = |f: fn(&Cpu) -> f64, a: &Cpu, b: &Cpu| pct(f(a), full.wall) - pct(f(b), base.wall);
    println!(
        "  difference (100 devices − empty), points of one core: agent {:+.3} (utime+stime), \
         {:+.4} (run time); plugin {:+.3} (utime+stime), {:+.4} (run time)",
        diff(|c| c.ticks, &full.agent, &base.agent),
        diff(|c| c.run, &full.agent, &base.agent),
        diff(|c| c.ticks, &full.plugin, &base.plugin),
        diff(|c| c.run, &full.plugin, &base.plugin),
    );
    let mut failures = Vec::new();
    if full.stat_lines != CPU_DEVICES {
        failures.push(format!(
            "/v1/metrics had {} berth_device_stat lines, not {CPU_DEVICES}",
            full.stat_lines
        ));
    }
    if full.newer != CPU_DEVICES {
        failures.push(format!(
            "statistics of {} of {CPU_DEVICES} devices did not advance in {} s",
            CPU_DEVICES - full.newer,
            opts.cpu_seconds
        ));
    }
    if base.stat_lines != 0 {
        failures.push(format!(
            "the empty baseline had {} berth_device_stat lines",
            base.stat_lines
        ));
    }
    failures
}

async fn run(opts: Opts) -> Vec<String> {
    let start = Instant::now();
    let bins = Bins::build();
    println!(
        "berth devices bench: {} cores; samples {}, warm-up {} (in-process: {} and {}); \
         CPU window {} s",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        opts.samples,
        opts.warmup,
        opts.samples * 10,
        opts.warmup * 10,
        opts.cpu_seconds
    );
    println!(
        "plugins: {} and {}",
        bins.nomad.display(),
        bins.kube.display()
    );
    let mut failures = Vec::new();
    let mut fingerprints = Vec::new();
    let mut e2e = Vec::new();
    for proto in Proto::ALL {
        let da = DeviceAgent::start(proto, &bins, FAST_LIST, "1s", &[E2E_DEVICE.to_string()]).await;
        fingerprints.push((proto, bench_fingerprint(opts, &da).await));
        let (with, without, f) = bench_e2e(opts, &da).await;
        failures.extend(f);
        e2e.push((proto, with, without));
    }
    report_fingerprint(opts, &fingerprints);
    let in_process = bench_reserve(opts.samples * 10, opts.warmup * 10, &bins).await;
    report_reserve(opts, &in_process, &e2e);
    failures.extend(bench_cpu(opts, &bins).await);
    println!("\nbench wall time: {:.0} s", start.elapsed().as_secs_f64());
    failures
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    common::bench_main(
        "devices",
        USAGE,
        parse_args(),
        run,
        "every device was placed, reserved and released; 100 instances' statistics followed",
    )
    .await
}
