//! Benchmark: the control plane's side of a claim and its release, through etcd and through
//! the embedded store, interleaved sample by sample in one process.
//!
//! Each sample is one cycle of claim → confirm → begin_release → finish_release of a
//! single-node-writer volume whose plugin has no controller (so the figure is the control
//! plane's own cost: reads, decisions and durable writes; the node's mount steps are the same
//! in both modes and are measured by `cargo bench -p berth --bench volumes`). The etcd run also
//! counts etcd writes per cycle (revisions).
//!
//! `cargo bench -p berth-fleet --bench claims [-- --samples 300]`; `-- --quick`: 30 samples.
//! Needs `etcd` on PATH (the README's set-up installs it).

mod common;

use std::{
    path::Path,
    process::ExitCode,
    sync::Arc,
    time::{Duration, Instant},
};

use berth_controlplane::{
    Claim, ClaimMode, ControlPlane, ControllerAccess, Controllers, NodeClaim, Origin, Plane,
    VolumeRecord,
};
use berth_csi::model::{AccessMode, AttachmentMode};
use berth_fleet::{Etcd, EtcdCatalog, EtcdSettings, Membership, WatchedDir};
use berth_state::{Store, Table};
use berth_testkit::EtcdCluster;
use berth_volume::{Operation, StoredMountOptions, VolumeSpec};
use tokio_util::sync::CancellationToken;

struct NodeOnly;

impl Controllers for NodeOnly {
    fn controller(&self, _plugin_id: &str) -> ControllerAccess {
        ControllerAccess::NodeOnly
    }
}

fn record() -> VolumeRecord {
    let spec = VolumeSpec::parse_hcl(
        Operation::Register,
        Path::new("v.hcl"),
        "id = \"v\"\nname = \"v\"\ntype = \"csi\"\nplugin_id = \"hp\"\nexternal_id = \"e\"\n\
         capability {\n  access_mode = \"single-node-writer\"\n  attachment_mode = \"file-system\"\n}\n",
    )
    .expect("spec");
    VolumeRecord::from_spec(
        &spec,
        Origin::Registered,
        "e".to_string().try_into().expect("id"),
        0,
        Default::default(),
        Vec::new(),
        0,
    )
}

async fn cycle(plane: &Plane<NodeOnly>, alloc: &str) -> Duration {
    let start = Instant::now();
    let claim = NodeClaim {
        volume_id: "v".into(),
        claim: Claim {
            alloc_id: alloc.into(),
            node_id: "n1".into(),
            mode: ClaimMode::Write,
            access_mode: AccessMode::SingleNodeWriter,
            attachment_mode: AttachmentMode::FileSystem,
        },
        csi_node_id: "n1".into(),
        mount_options: StoredMountOptions::default(),
    };
    plane.claim(claim).await.expect("claim");
    plane.confirm("v", alloc).await.expect("confirm");
    plane.begin_release("v", alloc).await.expect("begin");
    plane.finish_release("v", alloc).await.expect("finish");
    start.elapsed()
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn main() -> ExitCode {
    let samples = match common::samples("claims", 300, 30) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    // etcd dies with the thread that started it: this one, which outlives the runtime.
    let cluster = EtcdCluster::single().expect("etcd");
    let rt = common::runtime();
    rt.block_on(run(&cluster, samples));
    ExitCode::SUCCESS
}

async fn run(cluster: &EtcdCluster, samples: usize) {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = Arc::new(Store::open(tmp.path().join("state.redb")).expect("store"));
    store.put(Table::VOLUMES, "v", &record()).expect("put");
    let embedded = Plane::embedded(Arc::clone(&store), NodeOnly);

    let shutdown = CancellationToken::new();
    let settings = EtcdSettings::new(cluster.endpoints()).expect("settings");
    let etcd = Etcd::connect(&settings).await.expect("connect");
    let membership = Membership::new(etcd.clone(), "n1".into(), settings.lease_ttl);
    let volumes = WatchedDir::new(EtcdCatalog::dir(&etcd));
    tokio::spawn(Arc::clone(&volumes).run(etcd.clone(), shutdown.clone()));
    volumes.wait_synced(&shutdown).await;
    let snapshot: berth_fleet::Snapshot = Arc::new(berth_api::nodes::FleetNode::default);
    tokio::spawn(Arc::clone(&membership).run(snapshot, shutdown.clone()));
    let mut registered = membership.subscribe();
    registered
        .wait_for(Option::is_some)
        .await
        .expect("registered");
    let fence = membership.fence().expect("fence");
    etcd.put_if(&etcd.key(&["volumes", "v"]), &record(), 0, Some(&fence))
        .await
        .expect("put");
    let fleet = Plane::new(
        Arc::new(EtcdCatalog::new(
            etcd.clone(),
            volumes,
            Arc::clone(&membership),
        )),
        NodeOnly,
    );

    for i in 0..10 {
        cycle(&embedded, &format!("w{i}")).await;
        cycle(&fleet, &format!("w{i}")).await;
    }
    let mut local = Vec::with_capacity(samples);
    let mut remote = Vec::with_capacity(samples);
    let before = etcd.revision().await.expect("revision");
    for i in 0..samples {
        local.push(cycle(&embedded, &format!("a{i}")).await);
        remote.push(cycle(&fleet, &format!("a{i}")).await);
    }
    let writes = etcd.revision().await.expect("revision") - before;
    local.sort();
    remote.sort();
    let (l50, r50) = (pct(&local, 0.5), pct(&remote, 0.5));
    println!(
        "claim → confirm → release → freed, control plane only, {samples} samples each, interleaved"
    );
    println!(
        "  embedded (redb, fsync per write): p50 {}  p90 {}",
        ms(l50),
        ms(pct(&local, 0.9))
    );
    println!(
        "  etcd (single member, loopback):   p50 {}  p90 {}",
        ms(r50),
        ms(pct(&remote, 0.9))
    );
    println!(
        "  ratio etcd / embedded (p50): {:.2}x; etcd writes per cycle: {:.2}",
        r50.as_secs_f64() / l50.as_secs_f64(),
        writes as f64 / samples as f64
    );
    shutdown.cancel();
}
