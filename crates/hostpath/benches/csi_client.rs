//! Benchmark: berth-hostpath's node cycle and berth's CSI client, against the real
//! berth-hostpath process over its unix socket. Every series is sampled once per round, in a
//! random order, so drift (and work one step leaves to the next, such as the kernel's clean-up
//! after an unmount) hits them all alike; the report gives medians and ratios:
//!
//! - (a) NodeStageVolume → NodePublishVolume → NodeUnpublishVolume → NodeUnstageVolume through
//!   berth's `CsiClient`;
//! - (b) its floor: four Probes through the same client, plus the mount calls the plugin makes
//!   for that cycle (bind the volume directory onto a staging path, bind that onto a target,
//!   unmount both), made by the bench itself with the plugin's own `LinuxMounter`; (a)/(b) is
//!   what the plugin adds to the RPCs and the mounts;
//! - (c) Probe through the client; through a bare generated stub over tonic's own `Channel`,
//!   without and with the `grpc-timeout` the client always sends (that deadline costs a timer
//!   in each process); and through a bare stub over the client's own transport with that
//!   deadline (the difference to it is the client's own overhead);
//! - (d) the cycle of (a) through bare generated stubs over tonic's `Channel`;
//! - (e) the directory work CSI gives the plugin in a cycle, made by the bench: creating and
//!   removing the target directory;
//! - (f) four reads of the mount table, made by the bench: what the plugin once read per RPC
//!   to learn what is mounted, before it asked `statx` about each path instead (kept to show
//!   what that saves; the plugin reads the table now only where `statx` cannot tell).
//!   (a) − (b) − (e) is what is left to the plugin itself.
//!
//! The bench plays a CO that keeps to the CSI spec: it makes each staging directory once, as
//! the CO must before NodeStageVolume; the target directory is the plugin's to make and remove.
//! It runs in a private mount namespace of its own (it runs itself again under
//! `unshare -m --propagation private`; it needs root), and the plugin in one of its own.
//!
//! `cargo bench -p berth-hostpath --bench csi_client [-- --samples N]`

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    time::{Duration, Instant},
};

use berth_csi::{
    CreateVolume, CsiClient, Endpoint, NodePublish, NodeStage, Rpc,
    model::{AccessMode, ExternalId, MountOptions, Secrets, VolumeCapability},
    pb::{self, identity_client::IdentityClient, node_client::NodeClient},
};
use berth_sys::{LinuxMounter, Mounter as _};
use berth_testkit::HostpathPlugin;
use rand::seq::SliceRandom as _;
use tonic::transport::Channel;

/// Set in the copy of the bench that runs in its own mount namespace.
const IN_OWN_NS: &str = "BERTH_BENCH_IN_OWN_MOUNT_NS";

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort_unstable();
    let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[i]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// One measured series.
struct Series {
    name: &'static str,
    samples: Vec<Duration>,
}

impl Series {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            samples: Vec::new(),
        }
    }

    fn report(&mut self) -> Duration {
        let m = median(&mut self.samples);
        println!(
            "{:<44} median {:>8.1} µs   p90 {:>8.1} µs",
            self.name,
            micros(m),
            micros(percentile(&mut self.samples, 0.9)),
        );
        m
    }
}

/// Where one series stages and publishes.
struct Paths {
    staging: PathBuf,
    target: PathBuf,
}

impl Paths {
    /// Paths under `dir` named after `tag`; the staging directory is made, as a CO does.
    fn new(dir: &Path, tag: &str) -> Self {
        let paths = Self {
            staging: dir.join(format!("{tag}-staging")),
            target: dir.join(format!("{tag}-target")),
        };
        std::fs::create_dir(&paths.staging).expect("staging directory");
        paths
    }

    fn staging_str(&self) -> String {
        self.staging.display().to_string()
    }

    fn target_str(&self) -> String {
        self.target.display().to_string()
    }
}

async fn client_cycle(c: &CsiClient, id: &ExternalId, cap: &VolumeCapability, p: &Paths) {
    c.node_stage(&NodeStage {
        external_id: id.clone(),
        staging_path: p.staging.clone(),
        capability: cap.clone(),
        publish_context: Default::default(),
        volume_context: Default::default(),
        secrets: Secrets::default(),
    })
    .await
    .expect("stage");
    c.node_publish(&NodePublish {
        external_id: id.clone(),
        staging_path: Some(p.staging.clone()),
        target_path: p.target.clone(),
        capability: cap.clone(),
        read_only: false,
        publish_context: Default::default(),
        volume_context: Default::default(),
        secrets: Secrets::default(),
    })
    .await
    .expect("publish");
    c.node_unpublish(id, &p.target).await.expect("unpublish");
    c.node_unstage(id, &p.staging).await.expect("unstage");
}

async fn bare_cycle(n: &mut NodeClient<Channel>, id: &str, cap: &pb::VolumeCapability, p: &Paths) {
    n.node_stage_volume(pb::NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: p.staging_str(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    })
    .await
    .expect("stage");
    n.node_publish_volume(pb::NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: p.staging_str(),
        target_path: p.target_str(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    })
    .await
    .expect("publish");
    n.node_unpublish_volume(pb::NodeUnpublishVolumeRequest {
        volume_id: id.into(),
        target_path: p.target_str(),
    })
    .await
    .expect("unpublish");
    n.node_unstage_volume(pb::NodeUnstageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: p.staging_str(),
    })
    .await
    .expect("unstage");
}

/// The floor of a cycle: four no-op RPCs through the client, and the cycle's mount calls
/// (the plugin's: a bind of the volume directory onto the staging path, a bind of the staging
/// path onto the target, and their unmounts, target first).
async fn floor(c: &CsiClient, m: &LinuxMounter, volume_dir: &Path, p: &Paths) {
    c.probe().await.expect("probe");
    m.bind(volume_dir, &p.staging, false).expect("bind staging");
    c.probe().await.expect("probe");
    m.bind(&p.staging, &p.target, false).expect("bind target");
    c.probe().await.expect("probe");
    m.unmount(&p.target).expect("unmount target");
    c.probe().await.expect("probe");
    m.unmount(&p.staging).expect("unmount staging");
}

fn samples_arg() -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--samples")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

/// Runs this bench again in a private mount namespace of its own, so the floor's mounts stay
/// out of the host's; its exit status.
fn rerun_in_own_namespace() -> ExitCode {
    let exe = std::env::current_exe().expect("current_exe");
    let status = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "--"])
        .arg(exe)
        .args(std::env::args_os().skip(1))
        .env(IN_OWN_NS, "1")
        .status()
        .expect("running unshare (util-linux) as root");
    if status.success() {
        ExitCode::SUCCESS
    } else {
        eprintln!("the bench failed in its mount namespace: {status}");
        ExitCode::FAILURE
    }
}

fn main() -> ExitCode {
    if std::env::var_os(IN_OWN_NS).is_none() {
        return rerun_in_own_namespace();
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(bench(samples_arg()));
    ExitCode::SUCCESS
}

async fn bench(samples: usize) {
    // attach off: no ControllerPublish needed before staging.
    let plugin = HostpathPlugin::builder()
        .attach(false)
        .log_level("warn")
        .spawn()
        .await;
    let endpoint = Endpoint::parse(&plugin.endpoint()).expect("endpoint");
    let client = CsiClient::new(endpoint.clone());
    let mut identity = IdentityClient::new(berth_csi::channel(&endpoint));
    let mut node = NodeClient::new(berth_csi::channel(&endpoint));
    let mut own_identity = IdentityClient::new(client.channel());
    let probe_timeout = client.policy(Rpc::Probe).attempt_timeout;
    let mounter = LinuxMounter;

    let cap = VolumeCapability::mount(AccessMode::SingleNodeWriter, MountOptions::default());
    let vol = client
        .create_volume(&CreateVolume {
            name: "bench".into(),
            capabilities: vec![cap.clone()],
            ..Default::default()
        })
        .await
        .expect("create");
    let id = vol.external_id;
    let volume_dir = plugin.statedir().join("volumes").join(id.as_str());
    assert!(volume_dir.is_dir(), "{}", volume_dir.display());
    let pb_cap = cap.to_pb();
    let client_paths = Paths::new(plugin.tmp(), "c");
    let bare_paths = Paths::new(plugin.tmp(), "b");
    let floor_paths = Paths::new(plugin.tmp(), "f");
    std::fs::create_dir(&floor_paths.target).expect("floor target");
    let dir_work = plugin.tmp().join("e-target");

    let mut series = [
        Series::new("(a) node cycle, berth client"),
        Series::new("(b) floor: 4 Probes + the cycle's mount calls"),
        Series::new("(c) Probe, berth client"),
        Series::new("(c) Probe, bare tonic stub"),
        Series::new("(c) Probe, bare stub + grpc-timeout"),
        Series::new("(c) Probe, stub on client transport + grpc-timeout"),
        Series::new("(d) node cycle, bare tonic stubs"),
        Series::new("(e) mkdir + rmdir of a target"),
        Series::new("(f) 4 mount table reads"),
    ];
    // Warm up every path (connection, page cache, allocator), then measure.
    let warmup = 20;
    let mut order: Vec<usize> = (0..series.len()).collect();
    for round in 0..warmup + samples {
        order.shuffle(&mut rand::rng());
        for &which in &order {
            let t = Instant::now();
            // `which` indexes `series`.
            match which {
                0 => client_cycle(&client, &id, &cap, &client_paths).await,
                1 => floor(&client, &mounter, &volume_dir, &floor_paths).await,
                2 => drop(client.probe().await.expect("probe")),
                3 => drop(identity.probe(pb::ProbeRequest {}).await.expect("probe")),
                4 => {
                    let mut request = tonic::Request::new(pb::ProbeRequest {});
                    request.set_timeout(probe_timeout);
                    drop(identity.probe(request).await.expect("probe"));
                }
                5 => {
                    let mut request = tonic::Request::new(pb::ProbeRequest {});
                    request.set_timeout(probe_timeout);
                    drop(own_identity.probe(request).await.expect("probe"));
                }
                6 => bare_cycle(&mut node, id.as_str(), &pb_cap, &bare_paths).await,
                7 => {
                    std::fs::create_dir(&dir_work).expect("mkdir");
                    std::fs::remove_dir(&dir_work).expect("rmdir");
                }
                _ => {
                    for _ in 0..4 {
                        drop(mounter.mounts().expect("mount table"));
                    }
                }
            }
            let elapsed = t.elapsed();
            if round >= warmup {
                series[which].samples.push(elapsed);
            }
        }
    }

    println!(
        "berth-hostpath over a unix socket, {samples} rounds (each series once per round, in \
         random order)"
    );
    let [
        cycle,
        floor,
        probe_c,
        probe_b,
        probe_t,
        probe_o,
        cycle_b,
        dirs,
        reads,
    ] = series.each_mut().map(Series::report);
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "ratio (a)/(b)        node cycle / floor:                 {:.3}",
        ratio(cycle, floor)
    );
    println!(
        "ratio (a)/(b+e+f)    node cycle / floor with (e), (f):   {:.3}",
        ratio(cycle, floor + dirs + reads)
    );
    println!(
        "ratio (c)            Probe, client / bare stub:          {:.3}",
        ratio(probe_c, probe_b)
    );
    println!(
        "ratio (c)            Probe, client / stub + grpc-timeout: {:.3}",
        ratio(probe_c, probe_t)
    );
    println!(
        "ratio (c)            Probe, client / stub on its transport: {:.3}",
        ratio(probe_c, probe_o)
    );
    println!(
        "ratio (a)/(d)        node cycle, client / bare stubs:    {:.3}",
        ratio(cycle, cycle_b)
    );
}
