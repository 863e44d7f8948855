//! Benchmark: volumes in a fleet on a real etcd, against the embedded control plane.
//!
//! 1. **Cycle**: claim → mounted → release of one single-node-writer volume through the API of
//!    an agent whose control plane is etcd, against the same cycle through an agent with the
//!    embedded control plane, interleaved sample by sample (each agent with its own
//!    monolith `berth-hostpath`, staging and attaching).
//! 2. **Lease expiry → claims freed**: a second fleet agent (node plugin only) claims a volume
//!    (its ControllerPublishVolume runs on the first agent, asked through etcd) and is killed
//!    with SIGKILL; measured from the moment its lease expires (its alive key is gone from
//!    etcd) to the moment the leader has run ControllerUnpublishVolume for it and freed its
//!    claim (`lost_claims { after = "1ms" }`), as seen by a watch of the volume's key.
//!
//! `cargo bench -p berth --bench fleet [-- --samples 100 --losses 5]`; `-- --quick` is a smoke
//! run (10 samples, 2 losses). Needs root, util-linux and etcd (the README's set-up).

mod common;

use std::{
    path::Path,
    process::ExitCode,
    sync::Arc,
    time::{Duration, Instant},
};

use berth_api::volumes::{SpecFormat, VolumeSpecRequest};
use berth_controlplane::VolumeRecord;
use berth_csi::model::AccessMode;
use berth_fleet::{Etcd, EtcdSettings, WatchedDir, nodes::Alive};
use berth_testkit::EtcdCluster;
use common::{Agent, Options, PLUGIN, agent_cycle, claim_req, hostpath_binary, ms, row};
use tokio_util::sync::CancellationToken;

const USAGE: &str = "\
usage: fleet [--samples N] [--warmup N] [--losses N] [--quick]
  --samples N  cycle samples through each agent, interleaved (default 100)
  --warmup N   cycles of each kind run first and not counted (default 5)
  --losses N   node losses measured (default 5; each takes the lease TTL, 3 s)
  --quick      smoke run: 10 samples, 2 warm-up, 2 losses (flags given still win)";

const PREFIX: &str = "/bench";

#[derive(Debug, Clone, Copy)]
struct Opts {
    samples: usize,
    warmup: usize,
    losses: usize,
}

fn parse_args() -> Result<Opts, String> {
    let args = Options::parse(&["--samples", "--warmup", "--losses"])?;
    let (samples, warmup, losses) = if args.quick { (10, 2, 2) } else { (100, 5, 5) };
    let o = Opts {
        samples: args.count("--samples", samples)?,
        warmup: args.count("--warmup", warmup)?,
        losses: args.count("--losses", losses)?,
    };
    if o.samples == 0 || o.losses == 0 {
        return Err("--samples and --losses must be at least 1".into());
    }
    Ok(o)
}

/// A fleet agent's config: berth-hostpath as `role` on the shared state dir, node id `node`.
fn fleet_config(cluster: &EtcdCluster, shared: &Path, node: &str, role: &str) -> String {
    format!(
        "name = \"{node}\"\n\
         plugin \"{PLUGIN}\" {{\n  type = \"{role}\"\n  command = \"{}\"\n  \
         args = [\"--statedir\", \"{}\", \"--shared\", \"--nodeid\", \"{node}\", \"--log-level\", \"warn\"]\n}}\n\
         control_plane {{\n  etcd {{\n    endpoints = {:?}\n    prefix = \"{PREFIX}\"\n    \
         lease_ttl = \"3s\"\n    lost_claims {{\n      after = \"1ms\"\n    }}\n  }}\n}}\n",
        hostpath_binary().display(),
        shared.display(),
        cluster.endpoints(),
    )
}

fn volume_spec(id: &str) -> VolumeSpecRequest {
    VolumeSpecRequest {
        spec: format!(
            "id = \"{id}\"\nname = \"{id}\"\ntype = \"csi\"\nplugin_id = \"{PLUGIN}\"\n\
             capacity_min = \"1MiB\"\ncapability {{\n  access_mode = \"single-node-writer\"\n  \
             attachment_mode = \"file-system\"\n}}\n"
        ),
        format: SpecFormat::Hcl,
        file: Some(format!("{id}.hcl")),
    }
}

async fn bench_cycle(opts: Opts, embedded: &Agent, fleet: &Agent) {
    let (ce, cf) = (embedded.client(), fleet.client());
    ce.create_volume(&volume_spec("cycle"))
        .await
        .expect("create");
    cf.create_volume(&volume_spec("cycle"))
        .await
        .expect("create");
    let (mut e, mut f) = (Vec::new(), Vec::new());
    for i in 0..opts.warmup + opts.samples {
        let alloc = format!("a{i}");
        let (c, r) = agent_cycle(embedded, &ce, "cycle", &alloc).await;
        let te = c + r;
        let (c, r) = agent_cycle(fleet, &cf, "cycle", &alloc).await;
        let tf = c + r;
        if i >= opts.warmup {
            e.push(ms(te));
            f.push(ms(tf));
        }
    }
    println!(
        "\nclaim → mounted → released, {} samples (ms)   {:>8} {:>8} {:>8} {:>8}",
        opts.samples, "p50", "p90", "p99", "max"
    );
    let se = row("embedded control plane (redb)", &e);
    let sf = row("fleet control plane (etcd)", &f);
    println!(
        "  ratio of medians, etcd / embedded: {:.2}",
        sf.p50 / se.p50
    );
}

/// Polls `check` every millisecond (a mirror fed by an etcd watch) until it holds, at most
/// `timeout`; the moment it first held.
async fn first_seen(what: &str, timeout: Duration, check: impl Fn() -> bool) -> Instant {
    let deadline = Instant::now() + timeout;
    loop {
        if check() {
            return Instant::now();
        }
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

async fn bench_losses(opts: Opts, cluster: &EtcdCluster, shared: &Path, leader: &Agent) {
    let mut settings = EtcdSettings::new(cluster.endpoints()).expect("settings");
    settings.prefix = PREFIX.into();
    let etcd = Etcd::connect(&settings).await.expect("etcd");
    let stop = CancellationToken::new();
    let alive = WatchedDir::<Alive>::new(etcd.dir("alive"));
    let volumes = WatchedDir::<VolumeRecord>::new(etcd.dir("volumes"));
    tokio::spawn(Arc::clone(&alive).run(etcd.clone(), stop.clone()));
    tokio::spawn(Arc::clone(&volumes).run(etcd.clone(), stop.clone()));
    alive.wait_synced(&stop).await;
    volumes.wait_synced(&stop).await;
    leader
        .client()
        .create_volume(&volume_spec("lost"))
        .await
        .expect("create");
    let mut freed = Vec::new();
    for i in 0..opts.losses {
        let name = format!("lost{i}");
        let mut node = Agent::launch(|_| fleet_config(cluster, shared, &name, "node")).await;
        node.wait_plugin_healthy().await;
        node.wait_until(
            "the controller's node in the fleet",
            Duration::from_secs(30),
            |client| async move {
                client
                    .nodes()
                    .await
                    .is_ok_and(|l| l.nodes.iter().any(|n| !n.csi_controllers.is_empty()))
            },
        )
        .await;
        let id = node.client().node().await.expect("node").id;
        let alloc = format!("l{i}");
        node.client()
            .claim_volume("lost", &claim_req(&alloc, AccessMode::SingleNodeWriter))
            .await
            .unwrap_or_else(|e| panic!("claim on the node to lose: {e}\n{}", node.log_tail()));
        drop(node); // SIGKILL: the lease is not revoked; it expires.
        let expired = first_seen("lease expiry", Duration::from_secs(30), || {
            alive.get(&id).is_none()
        })
        .await;
        let done = first_seen("claim freed", Duration::from_secs(30), || {
            volumes.get("lost").is_some_and(|v| {
                !v.claims.contains_key(&alloc) && !v.publications.contains_key(&id)
            })
        })
        .await;
        freed.push(ms(done - expired));
    }
    stop.cancel();
    println!(
        "\nnode lease expiry → ControllerUnpublish for it and its claim freed, {} losses (ms)",
        opts.losses
    );
    row("expiry → freed", &freed);
}

async fn run(opts: Opts) -> Vec<String> {
    let cluster = EtcdCluster::single().expect("etcd (the README's set-up installs it)");
    let shared = tempfile::Builder::new()
        .prefix("bfs")
        .tempdir_in("/tmp")
        .expect("tmp");
    let embedded = Agent::start(&hostpath_binary()).await;
    let mut fleet =
        Agent::launch(|_| fleet_config(&cluster, shared.path(), "lead", "monolith")).await;
    fleet.wait_plugin_healthy().await;
    println!(
        "berth fleet bench: {} cores; samples {}, warm-up {}, losses {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        opts.samples,
        opts.warmup,
        opts.losses
    );
    bench_cycle(opts, &embedded, &fleet).await;
    drop(embedded);
    bench_losses(opts, &cluster, shared.path(), &fleet).await;
    Vec::new()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    common::bench_main(
        "fleet",
        USAGE,
        parse_args(),
        run,
        "every claim and release succeeded; every lost node's claim was freed",
    )
    .await
}
