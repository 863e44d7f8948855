//! Benchmark: volume claims and releases through a real `berth agent`.
//!
//! Starts the agent in a private mount namespace with a supervised monolith `berth-hostpath`
//! (staging and attaching), then measures:
//!
//! 1. **Cycle**: one single-node-writer volume; each sample is claim → mounted → release through
//!    the agent's API (ControllerPublish, NodeStage, NodePublish, then NodeUnpublish,
//!    NodeUnstage, ControllerUnpublish, with the state persisted around each step). The
//!    baseline, interleaved sample by sample, makes the same six RPCs directly with
//!    `berth_csi::CsiClient` against a separate `berth-hostpath` with the same options. A
//!    second direct cycle, interleaved too, also does the directory work that falls to the CO
//!    (the agent creates each claim's staging directory and target parent and removes them
//!    after release): what that costs on the filesystem under the data dir, reported apart.
//! 2. **Parallel**: `--volumes` single-node-multi-writer volumes, `--allocs` allocs spread evenly
//!    over them, all claimed at once and then all released at once: per-call latency, wall time
//!    and the agent's CPU time (utime + stime from `/proc/<pid>/stat`). Every claim must succeed,
//!    every target must be mounted, and nothing may stay mounted under the data dir at the end.
//!
//! `cargo bench -p berth --bench volumes [-- --samples 200 --volumes 20 --allocs 200]`;
//! `-- --quick` is a smoke run (20 samples, 4 volumes, 20 allocs). It builds `berth-hostpath`
//! (with the bench's profile) when run by cargo. Needs root and util-linux (`unshare`,
//! `setpriv`).

mod common;

use std::{
    collections::BTreeSet,
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant},
};

use berth_csi::{
    CapacityRange, ControllerPublish, CreateVolume, CsiClient, Endpoint, NodePublish, NodeStage,
    model::{AccessMode, MountOptions, Secrets, VolumeCapability},
};
use berth_testkit::HostpathPlugin;
use common::{
    Agent, CpuMeter, Options, PLUGIN, Phase, agent_cycle, claim_req, hostpath_binary, mounts_under,
    ms, release_req, report_phase, row, stats, volume_spec,
};

const USAGE: &str = "\
usage: volumes [--samples N] [--warmup N] [--volumes V] [--allocs A] [--rounds R] [--quick]
  --samples N  cycle samples through the agent and directly, interleaved (default 200)
  --warmup N   cycles of each kind run first and not counted (default 10)
  --volumes V  volumes of the parallel run (default 20)
  --allocs A   allocs of the parallel run, spread evenly over the volumes (default 200)
  --rounds R   parallel rounds, each through the agent and directly (default 5)
  --quick      smoke run: 20 samples, 2 warm-up, 4 volumes, 20 allocs, 1 round (flags given
               still win)";

#[derive(Debug, Clone, Copy)]
struct Opts {
    samples: usize,
    warmup: usize,
    volumes: usize,
    allocs: usize,
    rounds: usize,
}

fn parse_args() -> Result<Opts, String> {
    let args = Options::parse(&["--samples", "--warmup", "--volumes", "--allocs", "--rounds"])?;
    let (samples, warmup, volumes, allocs, rounds) = if args.quick {
        (20, 2, 4, 20, 1)
    } else {
        (200, 10, 20, 200, 5)
    };
    let o = Opts {
        samples: args.count("--samples", samples)?,
        warmup: args.count("--warmup", warmup)?,
        volumes: args.count("--volumes", volumes)?,
        allocs: args.count("--allocs", allocs)?,
        rounds: args.count("--rounds", rounds)?,
    };
    if o.samples == 0 || o.volumes == 0 || o.allocs == 0 || o.rounds == 0 {
        return Err("--samples, --volumes, --allocs and --rounds must be at least 1".into());
    }
    Ok(o)
}

/// The direct baseline: a `berth-hostpath` of its own, spoken to with `CsiClient`.
struct Direct {
    plugin: HostpathPlugin,
    csi: CsiClient,
    id: berth_csi::model::ExternalId,
    context: std::collections::BTreeMap<String, String>,
    cap: VolumeCapability,
    staging: PathBuf,
    target: PathBuf,
}

/// Where one direct cycle stages and publishes. With `co_dirs`, the cycle also does the
/// directory work the agent does as the CO for each claim and release: it creates the staging
/// directory and the target's parent (two levels each, as under the agent's data dir) before
/// the RPCs that need them and removes them after the RPCs that end their use.
struct CyclePaths {
    staging: PathBuf,
    target: PathBuf,
    co_dirs: Option<CoDirs>,
}

struct CoDirs {
    /// Created first and removed last, parent before child.
    staging: [PathBuf; 2],
    target_parent: [PathBuf; 2],
}

impl CoDirs {
    fn create(dirs: &[PathBuf; 2]) {
        for d in dirs {
            std::fs::create_dir(d).unwrap_or_else(|e| panic!("mkdir {}: {e}", d.display()));
        }
    }

    fn remove(dirs: &[PathBuf; 2]) {
        for d in dirs.iter().rev() {
            std::fs::remove_dir(d).unwrap_or_else(|e| panic!("rmdir {}: {e}", d.display()));
        }
    }
}

impl Direct {
    /// The fixed paths (made once, never removed) or, with `co_alloc`, that alloc's paths whose
    /// directories each cycle makes and removes.
    fn paths(&self, co_alloc: Option<&str>) -> CyclePaths {
        let Some(alloc) = co_alloc else {
            return CyclePaths {
                staging: self.staging.clone(),
                target: self.target.clone(),
                co_dirs: None,
            };
        };
        let root = self.plugin.tmp().join("co");
        let vol = root.join("staging/cycle");
        let alloc_dir = root.join("per-alloc").join(alloc);
        let parent = alloc_dir.join("cycle");
        CyclePaths {
            staging: vol.join("rw"),
            target: parent.join("rw"),
            co_dirs: Some(CoDirs {
                staging: [vol.clone(), vol.join("rw")],
                target_parent: [alloc_dir, parent],
            }),
        }
    }

    async fn start() -> Direct {
        let plugin = HostpathPlugin::builder()
            .stage(true)
            .attach(true)
            .log_level("warn")
            .spawn()
            .await;
        let csi = CsiClient::new(Endpoint::from_path(plugin.socket()).expect("endpoint"));
        let cap = VolumeCapability::mount(AccessMode::SingleNodeWriter, MountOptions::default());
        let vol = csi
            .create_volume(&CreateVolume {
                name: "cycle".into(),
                capacity: CapacityRange {
                    required_bytes: 1 << 20,
                    limit_bytes: 0,
                },
                capabilities: vec![cap.clone()],
                ..CreateVolume::default()
            })
            .await
            .expect("CreateVolume on the direct plugin");
        let staging = plugin.tmp().join("staging/cycle/rw");
        let target = plugin.tmp().join("per-alloc/a/cycle/rw");
        for dir in [&staging, &target] {
            std::fs::create_dir_all(dir.parent().expect("parent")).expect("mkdir");
        }
        std::fs::create_dir_all(plugin.tmp().join("co/per-alloc")).expect("mkdir");
        std::fs::create_dir_all(plugin.tmp().join("co/staging")).expect("mkdir");
        Direct {
            csi,
            id: vol.external_id,
            context: vol.context,
            cap,
            staging,
            target,
            plugin,
        }
    }

    /// ControllerPublish, NodeStage, NodePublish; the time taken.
    async fn publish(&self, p: &CyclePaths) -> Duration {
        let t = Instant::now();
        let publish_context = self
            .csi
            .controller_publish(&ControllerPublish {
                external_id: self.id.clone(),
                node_id: self.plugin.nodeid().into(),
                capability: self.cap.clone(),
                read_only: false,
                volume_context: self.context.clone(),
                secrets: Secrets::default(),
            })
            .await
            .expect("ControllerPublishVolume");
        if let Some(d) = &p.co_dirs {
            CoDirs::create(&d.staging);
        }
        self.csi
            .node_stage(&NodeStage {
                external_id: self.id.clone(),
                staging_path: p.staging.clone(),
                capability: self.cap.clone(),
                publish_context: publish_context.clone(),
                volume_context: self.context.clone(),
                secrets: Secrets::default(),
            })
            .await
            .expect("NodeStageVolume");
        if let Some(d) = &p.co_dirs {
            CoDirs::create(&d.target_parent);
        }
        self.csi
            .node_publish(&NodePublish {
                external_id: self.id.clone(),
                staging_path: Some(p.staging.clone()),
                target_path: p.target.clone(),
                capability: self.cap.clone(),
                read_only: false,
                publish_context,
                volume_context: self.context.clone(),
                secrets: Secrets::default(),
            })
            .await
            .expect("NodePublishVolume");
        t.elapsed()
    }

    /// NodeUnpublish, NodeUnstage, ControllerUnpublish; the time taken.
    async fn unpublish(&self, p: &CyclePaths) -> Duration {
        let t = Instant::now();
        self.csi
            .node_unpublish(&self.id, &p.target)
            .await
            .expect("NodeUnpublishVolume");
        if let Some(d) = &p.co_dirs {
            // The plugin removes the target it made; what is left of it is the CO's.
            match std::fs::remove_dir(&p.target) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => panic!("rmdir {}: {e}", p.target.display()),
            }
            CoDirs::remove(&d.target_parent);
        }
        self.csi
            .node_unstage(&self.id, &p.staging)
            .await
            .expect("NodeUnstageVolume");
        if let Some(d) = &p.co_dirs {
            CoDirs::remove(&d.staging);
        }
        self.csi
            .controller_unpublish(&self.id, self.plugin.nodeid(), &Secrets::default())
            .await
            .expect("ControllerUnpublishVolume");
        t.elapsed()
    }

    fn mounts(&self) -> Vec<PathBuf> {
        mounts_under(self.plugin.pid(), self.plugin.tmp())
    }
}

/// One direct cycle; with `co_alloc` (an alloc name), doing the CO's directory work too.
async fn direct_cycle(direct: &Direct, co_alloc: Option<&str>) -> (Duration, Duration) {
    let paths = direct.paths(co_alloc);
    let publish = direct.publish(&paths).await;
    assert!(
        direct.mounts().contains(&paths.target),
        "direct target not mounted"
    );
    let unpublish = direct.unpublish(&paths).await;
    let left = direct.mounts();
    assert!(left.is_empty(), "direct: mounted after unpublish: {left:?}");
    (publish, unpublish)
}

async fn bench_cycle(opts: Opts, agent: &Agent, direct: &Direct) {
    let client = agent.client();
    client
        .create_volume(&volume_spec("cycle", AccessMode::SingleNodeWriter))
        .await
        .unwrap_or_else(|e| panic!("create volume cycle: {e}"));
    for i in 0..opts.warmup {
        agent_cycle(agent, &client, "cycle", &format!("warm-{i}")).await;
        direct_cycle(direct, None).await;
        direct_cycle(direct, Some(&format!("warm-{i}"))).await;
    }
    let (mut a_claim, mut a_rel, mut a_cycle) = (Vec::new(), Vec::new(), Vec::new());
    let (mut d_pub, mut d_unpub, mut d_cycle) = (Vec::new(), Vec::new(), Vec::new());
    let mut c_cycle = Vec::new();
    for i in 0..opts.samples {
        // The three kinds in turn, each one first in a third of the samples.
        let alloc = format!("cycle-{i}");
        let (mut a, mut d, mut c) = (None, None, None);
        for k in 0..3 {
            match (i + k) % 3 {
                0 => a = Some(agent_cycle(agent, &client, "cycle", &alloc).await),
                1 => d = Some(direct_cycle(direct, None).await),
                _ => c = Some(direct_cycle(direct, Some(&alloc)).await),
            }
        }
        let (a, d, c) = (
            a.expect("agent ran"),
            d.expect("direct ran"),
            c.expect("direct with directories ran"),
        );
        a_claim.push(ms(a.0));
        a_rel.push(ms(a.1));
        a_cycle.push(ms(a.0 + a.1));
        d_pub.push(ms(d.0));
        d_unpub.push(ms(d.1));
        d_cycle.push(ms(d.0 + d.1));
        c_cycle.push(ms(c.0 + c.1));
    }
    println!(
        "\n1. Cycle, one single-node-writer volume: claim → mounted → release \
         (n={}, {} warm-up, interleaved)",
        opts.samples, opts.warmup
    );
    println!(
        "  {:<40} {:>8} {:>8} {:>8} {:>8}",
        "ms", "median", "p90", "p99", "max"
    );
    let ac = row("agent claim (CP+NS+NP)", &a_claim);
    let ar = row("agent release (NU+NUS+CU)", &a_rel);
    let ay = row("agent cycle", &a_cycle);
    let dp = row("direct publish (CP+NS+NP)", &d_pub);
    let du = row("direct unpublish (NU+NUS+CU)", &d_unpub);
    let dy = row("direct cycle", &d_cycle);
    let cy = row("direct cycle + the CO's directories", &c_cycle);
    println!(
        "  agent/direct: cycle median {:.2}x, p90 {:.2}x; claim median {:.2}x; \
         release median {:.2}x",
        ay.p50 / dy.p50,
        ay.p90 / dy.p90,
        ac.p50 / dp.p50,
        ar.p50 / du.p50
    );
    println!(
        "  agent overhead per cycle (median difference): {:.2} ms",
        ay.p50 - dy.p50
    );
    println!(
        "  the CO's directory work (mkdir and rmdir of 4 directories, as the agent does): \
         {:.2} ms per cycle on this filesystem; agent/(direct + directories) {:.2}x",
        cy.p50 - dy.p50,
        ay.p50 / cy.p50
    );
}

/// One parallel round through the agent: every claim at once, then every release at once.
struct AgentRound {
    claims: Phase,
    releases: Phase,
    failures: Vec<String>,
}

async fn agent_round(agent: &Agent, vols: &[String], work: &[(String, String)]) -> AgentRound {
    let client = agent.client();
    let mode = AccessMode::SingleNodeMultiWriter;
    let pid = agent.pid();
    let cpu = CpuMeter::start(agent);
    let t = Instant::now();
    let tasks: Vec<_> = work
        .iter()
        .cloned()
        .map(|(vol, alloc)| {
            let client = client.clone();
            tokio::spawn(async move {
                let t = Instant::now();
                let r = client.claim_volume(&vol, &claim_req(&alloc, mode)).await;
                (
                    t.elapsed(),
                    r.map_err(|e| format!("claim {vol}/{alloc}: {e}")),
                )
            })
        })
        .collect();
    let mut claims = Phase::default();
    let mut targets = Vec::new();
    for task in tasks {
        let (d, r) = task.await.expect("claim task");
        match r {
            Ok(c) => {
                claims.lat.push(ms(d));
                targets.push(c.target);
            }
            Err(e) => claims.errors.push(e),
        }
    }
    claims.wall = t.elapsed();
    (claims.cpu, claims.plugin_cpu) = cpu.read();
    let mounted: BTreeSet<PathBuf> = mounts_under(pid, &agent.data_dir).into_iter().collect();
    let targets_mounted = targets.iter().filter(|t| mounted.contains(*t)).count();

    let cpu = CpuMeter::start(agent);
    let t = Instant::now();
    let tasks: Vec<_> = work
        .iter()
        .cloned()
        .map(|(vol, alloc)| {
            let client = client.clone();
            tokio::spawn(async move {
                let t = Instant::now();
                let r = client.release_volume(&vol, &release_req(&alloc)).await;
                let r = match r {
                    Ok(r) if r.released => Ok(()),
                    Ok(r) => Err(format!("release {vol}/{alloc} not done: {:?}", r.error)),
                    Err(e) => Err(format!("release {vol}/{alloc}: {e}")),
                };
                (t.elapsed(), r)
            })
        })
        .collect();
    let mut releases = Phase::default();
    for task in tasks {
        let (d, r) = task.await.expect("release task");
        match r {
            Ok(()) => releases.lat.push(ms(d)),
            Err(e) => releases.errors.push(e),
        }
    }
    releases.wall = t.elapsed();
    (releases.cpu, releases.plugin_cpu) = cpu.read();
    let left = mounts_under(pid, &agent.data_dir);
    let mut still_claimed = 0;
    for v in vols {
        let s = client
            .volume(v)
            .await
            .unwrap_or_else(|e| panic!("status of {v}: {e}"));
        still_claimed += s.claims.len() + s.usages.len();
    }
    let mut failures = Vec::new();
    if !claims.errors.is_empty() {
        failures.push(format!("{} claims failed", claims.errors.len()));
    }
    if targets_mounted != targets.len() {
        failures.push(format!(
            "{} claimed targets not mounted",
            targets.len() - targets_mounted
        ));
    }
    if !releases.errors.is_empty() {
        failures.push(format!("{} releases failed", releases.errors.len()));
    }
    if !left.is_empty() {
        failures.push(format!("left mounted under the data dir: {left:?}"));
    }
    if still_claimed != 0 {
        failures.push(format!("{still_claimed} claims or usages left"));
    }
    AgentRound {
        claims,
        releases,
        failures,
    }
}

/// The parallel baseline: the RPCs the agent sends for the same claims and releases, sent
/// straight to the agent's own plugin over its socket, as concurrently as the CSI spec allows:
/// per volume ControllerPublish then NodeStage, then every NodePublish of its allocs at once;
/// per volume every NodeUnpublish at once, then NodeUnstage and ControllerUnpublish.
struct DirectParallel {
    csi: CsiClient,
    cap: VolumeCapability,
    /// Per volume: its external id, context, staging path and its allocs' targets.
    vols: Vec<DirectVolume>,
    root: PathBuf,
}

struct DirectVolume {
    id: berth_csi::model::ExternalId,
    context: std::collections::BTreeMap<String, String>,
    staging: PathBuf,
    targets: Vec<PathBuf>,
}

impl DirectParallel {
    async fn new(agent: &Agent, opts: Opts) -> DirectParallel {
        let socket = agent
            .data_dir
            .join(format!("csi/plugins/{PLUGIN}/csi.sock"));
        let csi = CsiClient::new(Endpoint::from_path(&socket).expect("endpoint"));
        let cap =
            VolumeCapability::mount(AccessMode::SingleNodeMultiWriter, MountOptions::default());
        let root = agent.tmp().join("direct");
        let mut vols = Vec::new();
        for i in 0..opts.volumes {
            let vol = csi
                .create_volume(&CreateVolume {
                    name: format!("direct-par-{i}"),
                    capacity: CapacityRange {
                        required_bytes: 1 << 20,
                        limit_bytes: 0,
                    },
                    capabilities: vec![cap.clone()],
                    ..CreateVolume::default()
                })
                .await
                .expect("CreateVolume on the agent's plugin");
            let staging = root.join(format!("staging/{i}/rw"));
            std::fs::create_dir_all(&staging).expect("mkdir staging");
            vols.push(DirectVolume {
                id: vol.external_id,
                context: vol.context,
                staging,
                targets: Vec::new(),
            });
        }
        for j in 0..opts.allocs {
            let target = root.join(format!("targets/alloc-{j}/rw"));
            std::fs::create_dir_all(target.parent().expect("parent")).expect("mkdir target");
            vols[j % opts.volumes].targets.push(target);
        }
        DirectParallel {
            csi,
            cap,
            vols,
            root,
        }
    }

    async fn claim_all(&self) -> Duration {
        let t = Instant::now();
        let per_volume = self.vols.iter().map(|v| async move {
            let publish_context = self
                .csi
                .controller_publish(&ControllerPublish {
                    external_id: v.id.clone(),
                    node_id: "n1".into(),
                    capability: self.cap.clone(),
                    read_only: false,
                    volume_context: v.context.clone(),
                    secrets: Secrets::default(),
                })
                .await
                .expect("ControllerPublishVolume");
            self.csi
                .node_stage(&NodeStage {
                    external_id: v.id.clone(),
                    staging_path: v.staging.clone(),
                    capability: self.cap.clone(),
                    publish_context: publish_context.clone(),
                    volume_context: v.context.clone(),
                    secrets: Secrets::default(),
                })
                .await
                .expect("NodeStageVolume");
            futures::future::join_all(v.targets.iter().map(|target| {
                let req = NodePublish {
                    external_id: v.id.clone(),
                    staging_path: Some(v.staging.clone()),
                    target_path: target.clone(),
                    capability: self.cap.clone(),
                    read_only: false,
                    publish_context: publish_context.clone(),
                    volume_context: v.context.clone(),
                    secrets: Secrets::default(),
                };
                async move { self.csi.node_publish(&req).await }
            }))
            .await
            .into_iter()
            .for_each(|r| r.expect("NodePublishVolume"));
        });
        futures::future::join_all(per_volume).await;
        t.elapsed()
    }

    async fn release_all(&self) -> Duration {
        let t = Instant::now();
        let per_volume = self.vols.iter().map(|v| async move {
            futures::future::join_all(
                v.targets
                    .iter()
                    .map(|target| self.csi.node_unpublish(&v.id, target)),
            )
            .await
            .into_iter()
            .for_each(|r| r.expect("NodeUnpublishVolume"));
            self.csi
                .node_unstage(&v.id, &v.staging)
                .await
                .expect("NodeUnstageVolume");
            self.csi
                .controller_unpublish(&v.id, "n1", &Secrets::default())
                .await
                .expect("ControllerUnpublishVolume");
        });
        futures::future::join_all(per_volume).await;
        t.elapsed()
    }

    /// One round; the failures found.
    async fn round(&self, agent: &Agent) -> (Duration, Duration, Vec<String>) {
        let claims = self.claim_all().await;
        let mounted: BTreeSet<PathBuf> =
            mounts_under(agent.pid(), &self.root).into_iter().collect();
        let want = self.vols.iter().map(|v| v.targets.len()).sum::<usize>();
        let found = self
            .vols
            .iter()
            .flat_map(|v| &v.targets)
            .filter(|t| mounted.contains(*t))
            .count();
        let releases = self.release_all().await;
        let left = mounts_under(agent.pid(), &self.root);
        let mut failures = Vec::new();
        if found != want {
            failures.push(format!("direct: {} of {want} targets mounted", found));
        }
        if !left.is_empty() {
            failures.push(format!("direct: left mounted: {left:?}"));
        }
        (claims, releases, failures)
    }
}

/// The median, in ms.
fn median_ms(v: &[Duration]) -> f64 {
    stats(&v.iter().map(|d| ms(*d)).collect::<Vec<_>>()).p50
}

async fn bench_parallel(opts: Opts, agent: &Agent) -> Vec<String> {
    let client = agent.client();
    let mode = AccessMode::SingleNodeMultiWriter;
    let vols: Vec<String> = (0..opts.volumes).map(|i| format!("par-{i}")).collect();
    let t = Instant::now();
    for v in &vols {
        client
            .create_volume(&volume_spec(v, mode))
            .await
            .unwrap_or_else(|e| panic!("create volume {v}: {e}"));
    }
    let created = t.elapsed();
    // Alloc j uses volume j mod V: A/V allocs per volume (the rest on the first ones).
    let work: Vec<(String, String)> = (0..opts.allocs)
        .map(|j| (vols[j % vols.len()].clone(), format!("alloc-{j}")))
        .collect();
    let direct = DirectParallel::new(agent, opts).await;

    let mut failures = Vec::new();
    let (mut a_claims, mut a_releases, mut d_claims, mut d_releases) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut rounds: Vec<AgentRound> = Vec::new();
    for r in 0..opts.rounds {
        // Alternate which goes first, so neither always follows the other.
        let direct_first = r % 2 == 1;
        let mut d = None;
        if direct_first {
            d = Some(direct.round(agent).await);
        }
        let a = agent_round(agent, &vols, &work).await;
        if !direct_first {
            d = Some(direct.round(agent).await);
        }
        let (dc, dr, df) = d.expect("the direct round ran");
        a_claims.push(a.claims.wall);
        a_releases.push(a.releases.wall);
        d_claims.push(dc);
        d_releases.push(dr);
        failures.extend(a.failures.iter().map(|f| format!("round {r}: {f}")));
        failures.extend(df.into_iter().map(|f| format!("round {r}: {f}")));
        rounds.push(a);
    }

    let per = opts.allocs as f64 / opts.volumes as f64;
    println!(
        "\n2. Parallel: {} allocs over {} single-node-multi-writer volumes ({per:.1} per volume), \
         all at once; {} rounds, each through the agent and directly (alternating first)",
        opts.allocs, opts.volumes, opts.rounds
    );
    println!(
        "  created {} volumes one by one in {:.0} ms",
        opts.volumes,
        ms(created)
    );
    let (ac, ar, dc, dr) = (
        median_ms(&a_claims),
        median_ms(&a_releases),
        median_ms(&d_claims),
        median_ms(&d_releases),
    );
    println!(
        "  wall, median of rounds: claims agent {ac:.1} ms, direct {dc:.1} ms: {:.2}x; \
         releases agent {ar:.1} ms, direct {dr:.1} ms: {:.2}x",
        ac / dc,
        ar / dr
    );
    // The agent round whose claim wall is the median, in detail.
    rounds.sort_by_key(|a| a.claims.wall);
    let mid = &rounds[rounds.len() / 2];
    report_phase("claims (median round)", opts.allocs, &mid.claims);
    report_phase("releases (same round)", opts.allocs, &mid.releases);
    failures
}

async fn run(opts: Opts) -> Vec<String> {
    let hostpath = hostpath_binary();
    let agent = Agent::start(&hostpath).await;
    let direct = Direct::start().await;
    println!(
        "berth volumes bench: {} cores; samples {}, warm-up {}, volumes {}, allocs {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        opts.samples,
        opts.warmup,
        opts.volumes,
        opts.allocs
    );
    println!(
        "agent pid {} (data dir {}), its berth-hostpath pid {}, direct berth-hostpath pid {}",
        agent.pid(),
        agent.data_dir.display(),
        agent
            .plugin_pid()
            .map_or("?".into(), |p: u32| p.to_string()),
        direct.plugin.pid()
    );
    bench_cycle(opts, &agent, &direct).await;
    drop(direct);
    bench_parallel(opts, &agent).await
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    common::bench_main(
        "volumes",
        USAGE,
        parse_args(),
        run,
        "every claim and release succeeded, nothing left mounted",
    )
    .await
}
