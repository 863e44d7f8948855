//! Benchmark: the leader placing 1000 allocs (10 service jobs of count 100) over 100
//! registered nodes (simulated node records and alive keys in a real etcd), from the jobs'
//! submission to the last alloc written; with etcd writes (transactions and revisions) per
//! alloc. Baseline, in the same process: the same decisions in memory, without etcd.
//!
//! `cargo bench -p berth-fleet --bench scheduling [-- --samples 5]`; `-- --quick`: 2 samples.
//! Needs `etcd` on PATH (the README's set-up installs it).

mod common;

use std::{
    collections::BTreeMap,
    path::Path,
    process::ExitCode,
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use berth_api::nodes::{DriverState, FleetNode, NodeResources, NodeState};
use berth_fleet::{
    Etcd, EtcdCatalog, EtcdSettings, Fence, Fleet, LeaderSettings, Membership, Outcome, WatchedDir,
    nodes::Alive,
};
use berth_scheduler::{Cluster, Context, FleetJob, schedule};
use berth_testkit::EtcdCluster;
use tokio_util::sync::CancellationToken;

const NODES: usize = 100;
const JOBS: usize = 10;
const COUNT: u32 = 100;

fn node(i: usize) -> FleetNode {
    FleetNode {
        id: format!("node-{i:03}"),
        name: format!("n{i}"),
        datacenter: "dc1".into(),
        node_class: if i.is_multiple_of(2) { "even" } else { "odd" }.into(),
        drivers: vec![DriverState {
            name: "raw_exec".into(),
            healthy: true,
            description: String::new(),
        }],
        resources: NodeResources {
            cpu_mhz: 8000,
            memory_mb: 16384,
        },
        status: NodeState::Ready,
        ..Default::default()
    }
}

fn job(i: usize) -> FleetJob {
    let text = format!(
        r#"job "job{i}" {{
  group "g" {{
    count = {COUNT}
    task "t" {{
      driver = "raw_exec"
      config {{ command = "/bin/true" }}
      resources {{
        cpu    = 100
        memory = 256
      }}
    }}
  }}
}}"#
    );
    FleetJob {
        spec: berth_job::JobSpec::parse_hcl(Path::new("job.hcl"), &text).expect("job"),
        version: 1,
        stopped: false,
        submitted_ms: 0,
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// The same 1000 decisions, in memory.
fn in_memory() -> Duration {
    let nodes: Vec<FleetNode> = (0..NODES).map(node).collect();
    let jobs: Vec<FleetJob> = (0..JOBS).map(job).collect();
    let start = Instant::now();
    let mut cluster = Cluster::new(nodes, std::iter::empty());
    let volume = |_: &str| None;
    let mut placed = 0;
    for j in &jobs {
        let mut new_id = |g: &str, i: u32| berth_fleet::scheduling::new_alloc_id(&j.spec.id, g, i);
        let mut cx = Context {
            volume: &volume,
            new_id: &mut new_id,
            now_ms: 0,
        };
        placed += schedule(j, &[], &mut cluster, &mut cx).place.len();
    }
    assert_eq!(placed, JOBS * COUNT as usize);
    start.elapsed()
}

struct Sample {
    took: Duration,
    txns: u64,
    revisions: i64,
}

async fn through_etcd(cluster: &EtcdCluster, prefix: &str) -> Sample {
    let shutdown = CancellationToken::new();
    let mut settings = EtcdSettings::new(cluster.endpoints()).expect("settings");
    settings.prefix = prefix.into();
    let etcd = Etcd::connect(&settings).await.expect("connect");
    let membership = Membership::new(etcd.clone(), "leader".into(), settings.lease_ttl);
    tokio::spawn(Arc::clone(membership.node_dir()).run(etcd.clone(), shutdown.clone()));
    tokio::spawn(Arc::clone(membership.alive_dir()).run(etcd.clone(), shutdown.clone()));
    let snapshot: berth_fleet::Snapshot = Arc::new(|| node(NODES));
    tokio::spawn(Arc::clone(&membership).run(snapshot, shutdown.clone()));
    let mut registered = membership.subscribe();
    let lease = registered
        .wait_for(Option::is_some)
        .await
        .expect("registered")
        .expect("lease");
    // The simulated nodes: records, and alive keys on the bench's lease.
    for i in 0..NODES {
        let n = node(i);
        etcd.put(&etcd.key(&["nodes", &n.id]), &n, None)
            .await
            .expect("node");
        let alive = Alive { lease, since_ms: 0 };
        etcd.put(&etcd.key(&["alive", &n.id]), &alive, Some(lease))
            .await
            .expect("alive");
    }
    etcd.put(&etcd.key(&["leader"]), &"leader", Some(lease))
        .await
        .expect("leader");
    let fence = Fence {
        key: etcd.key(&["leader"]),
        lease,
    };
    let volumes = WatchedDir::new(EtcdCatalog::dir(&etcd));
    let fleet = Fleet::new(
        etcd.clone(),
        Arc::clone(&membership),
        volumes,
        LeaderSettings {
            lost_after: Duration::from_secs(15),
            gc_after: berth_fleet::gc::DEFAULT_GC_AFTER,
        },
    );
    let tasks = tokio_util::task::TaskTracker::new();
    fleet.mirrors(&tasks, &shutdown);
    fleet.synced(&shutdown).await;
    let mut nodes_seen = membership.alive_dir().subscribe();
    while membership
        .nodes()
        .iter()
        .filter(|n| n.status == NodeState::Ready)
        .count()
        < NODES + 1
    {
        nodes_seen.changed().await.expect("mirror");
    }
    for i in 0..JOBS {
        let j = job(i);
        etcd.put(&etcd.key(&["jobs", &j.spec.id]), &j, None)
            .await
            .expect("job");
    }
    let before = etcd.revision().await.expect("revision");
    let start = Instant::now();
    loop {
        match fleet.pass(&fence).await.expect("pass") {
            Outcome::Done(0) => break,
            Outcome::Done(_) | Outcome::Changed => {}
            Outcome::Fenced => panic!("fenced"),
        }
    }
    let took = start.elapsed();
    let revisions = etcd.revision().await.expect("revision") - before;
    let (allocs, _) = etcd
        .list::<berth_scheduler::FleetAlloc>(&etcd.dir("allocs"))
        .await
        .expect("allocs");
    assert_eq!(allocs.len(), JOBS * COUNT as usize);
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for (_, a) in &allocs {
        *per_node.entry(a.value.node_id.clone()).or_default() += 1;
    }
    assert_eq!(per_node.len(), NODES, "every node got allocs");
    shutdown.cancel();
    tasks.close();
    tasks.wait().await;
    Sample {
        took,
        txns: fleet.stats.txns.load(Ordering::Relaxed),
        revisions,
    }
}

fn main() -> ExitCode {
    let samples = match common::samples("scheduling", 5, 2) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let cluster = EtcdCluster::single().expect("etcd");
    let rt = common::runtime();
    let mut etcd_runs = Vec::new();
    let mut memory = Vec::new();
    let mut txns = Vec::new();
    let mut revs = Vec::new();
    for i in 0..samples {
        memory.push(in_memory());
        let s = rt.block_on(through_etcd(&cluster, &format!("/bench{i}")));
        etcd_runs.push(s.took);
        txns.push(s.txns);
        revs.push(s.revisions);
    }
    let allocs = (JOBS * COUNT as usize) as f64;
    let e = median(etcd_runs);
    let m = median(memory);
    txns.sort_unstable();
    revs.sort_unstable();
    println!(
        "placing {} allocs ({JOBS} jobs × {COUNT}) over {NODES} nodes, {samples} samples",
        JOBS * COUNT as usize
    );
    println!(
        "  leader through etcd (single member, loopback): median {}",
        ms(e)
    );
    println!(
        "  same decisions in memory (baseline):           median {}",
        ms(m)
    );
    println!(
        "  ratio etcd / memory: {:.1}x; per alloc: {:.3} ms; etcd transactions per alloc: {:.3}; revisions per alloc: {:.3}",
        e.as_secs_f64() / m.as_secs_f64(),
        e.as_secs_f64() * 1e3 / allocs,
        txns[txns.len() / 2] as f64 / allocs,
        revs[revs.len() / 2] as f64 / allocs,
    );
    ExitCode::SUCCESS
}
