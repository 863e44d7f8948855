//! The leader's work: after every change of the fleet's jobs, allocs, alloc reports or
//! nodes (and at least every second, for the grace of down nodes), one pass places and stops
//! allocs ([`berth_scheduler::schedule`]), stops the allocs of nodes down longer than the
//! grace, and records why groups could not be placed. Passes read etcd afresh (a leader that
//! just took over sees everything its predecessor wrote) and write in fenced transactions
//! that compare every key's revision: a pass that raced anything writes nothing and runs
//! again.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use berth_api::{jobs::AllocStatus, nodes::NodeState};
use berth_controlplane::catalog::VolumeRecord;
use berth_scheduler::{
    Cluster, Context, Desired, FleetAlloc, FleetJob, GroupFailure, Reported, Stop, schedule,
};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::{
    cache::WatchedDir,
    etcd::{Etcd, Fence, FleetError, Outcome, Versioned, Write},
    gc::{Collector, History},
    nodes::Membership,
};

/// What a node reports of an alloc it runs (`<prefix>/reports/<alloc id>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocReport {
    /// The node that runs it.
    pub node_id: String,
    /// Where it stands.
    pub reported: Reported,
    /// Its status document.
    pub status: AllocStatus,
}

/// Why a job's groups were not placed, as of its last pass (`<prefix>/placements/<job id>`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementReport {
    /// The job version the pass looked at.
    pub version: u64,
    /// Groups not wholly placed.
    pub failures: Vec<GroupFailure>,
}

/// The leader's settings.
#[derive(Debug, Clone, Copy)]
pub struct LeaderSettings {
    /// How long a node may be down before its allocs are lost and replaced.
    pub lost_after: Duration,
    /// How long finished allocs and stopped jobs are kept ([`crate::gc`]).
    pub gc_after: Duration,
}

/// Counters of the leader's work, for the bench and the metrics.
#[derive(Debug, Default)]
pub struct LeaderStats {
    /// Passes run.
    pub passes: AtomicU64,
    /// Transactions written.
    pub txns: AtomicU64,
    /// Allocs placed.
    pub placed: AtomicU64,
    /// Allocs stopped.
    pub stopped: AtomicU64,
    /// Keys deleted by garbage collection (allocs, reports, jobs, placements).
    pub collected: AtomicU64,
}

/// The fleet's jobs, allocs and reports as every agent mirrors them, and the leader's work.
pub struct Fleet {
    etcd: Etcd,
    membership: Arc<Membership>,
    /// `<prefix>/jobs/`.
    pub jobs: Arc<WatchedDir<FleetJob>>,
    /// `<prefix>/allocs/`.
    pub allocs: Arc<WatchedDir<FleetAlloc>>,
    /// `<prefix>/reports/`.
    pub reports: Arc<WatchedDir<AllocReport>>,
    /// `<prefix>/placements/`.
    pub placements: Arc<WatchedDir<PlacementReport>>,
    volumes: Arc<WatchedDir<VolumeRecord>>,
    settings: LeaderSettings,
    /// Counters.
    pub stats: LeaderStats,
    down_since: Mutex<BTreeMap<String, Instant>>,
    collector: Collector,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet").finish_non_exhaustive()
    }
}

/// The shortest time between two passes (changes that come together are taken together).
const SETTLE: Duration = Duration::from_millis(20);

impl Fleet {
    /// The mirrors (run them with [`Fleet::mirrors`]) and the leader's work.
    pub fn new(
        etcd: Etcd,
        membership: Arc<Membership>,
        volumes: Arc<WatchedDir<VolumeRecord>>,
        settings: LeaderSettings,
    ) -> Arc<Self> {
        Arc::new(Self {
            jobs: WatchedDir::new(etcd.dir("jobs")),
            allocs: WatchedDir::new(etcd.dir("allocs")),
            reports: WatchedDir::new(etcd.dir("reports")),
            placements: WatchedDir::new(etcd.dir("placements")),
            etcd,
            membership,
            volumes,
            settings,
            stats: LeaderStats::default(),
            down_since: Mutex::new(BTreeMap::new()),
            collector: Collector::new(settings.gc_after),
        })
    }

    /// The connection.
    pub fn etcd(&self) -> &Etcd {
        &self.etcd
    }

    /// Runs the mirrors until `shutdown`.
    pub fn mirrors(
        self: &Arc<Self>,
        tasks: &tokio_util::task::TaskTracker,
        shutdown: &CancellationToken,
    ) {
        tasks.spawn(Arc::clone(&self.jobs).run(self.etcd.clone(), shutdown.clone()));
        tasks.spawn(Arc::clone(&self.allocs).run(self.etcd.clone(), shutdown.clone()));
        tasks.spawn(Arc::clone(&self.reports).run(self.etcd.clone(), shutdown.clone()));
        tasks.spawn(Arc::clone(&self.placements).run(self.etcd.clone(), shutdown.clone()));
    }

    /// Waits until every mirror has its first listing.
    pub async fn synced(&self, shutdown: &CancellationToken) {
        self.jobs.wait_synced(shutdown).await;
        self.allocs.wait_synced(shutdown).await;
        self.reports.wait_synced(shutdown).await;
        self.placements.wait_synced(shutdown).await;
    }

    /// Leads until `term`: a pass after every change, and every second; after each pass that
    /// changed nothing, what is due is collected ([`crate::gc`]).
    pub async fn lead(self: Arc<Self>, fence: Fence, term: CancellationToken) {
        let mut changes = [
            self.jobs.subscribe(),
            self.allocs.subscribe(),
            self.reports.subscribe(),
            self.membership.node_dir().subscribe(),
            self.membership.alive_dir().subscribe(),
        ];
        self.down_since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.collector.reset();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            match self.pass(&fence).await {
                Ok(Outcome::Fenced) => {
                    tracing::warn!("the leader's writes are fenced: stepping down");
                    return;
                }
                Ok(Outcome::Changed) => continue,
                Ok(Outcome::Done(_)) => match self.collect(&fence).await {
                    Ok(Outcome::Fenced) => {
                        tracing::warn!("the leader's writes are fenced: stepping down");
                        return;
                    }
                    // A mirror behind a write: its change wakes the next pass.
                    Ok(Outcome::Changed | Outcome::Done(_)) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "collecting old allocs failed; trying again")
                    }
                },
                Err(e) => tracing::warn!(error = %e, "scheduling pass failed; trying again"),
            }
            let [a, b, c, d, e] = &mut changes;
            tokio::select! {
                () = term.cancelled() => return,
                _ = tick.tick() => {}
                _ = a.changed() => {}
                _ = b.changed() => {}
                _ = c.changed() => {}
                _ = d.changed() => {}
                _ = e.changed() => {}
            }
            tokio::select! {
                () = term.cancelled() => return,
                () = tokio::time::sleep(SETTLE) => {}
            }
        }
    }

    /// Deletes the allocs, reports and stopped jobs that have been done for `gc_after`, as
    /// the mirrors show them; `Done(0)` when nothing is due.
    pub async fn collect(&self, fence: &Fence) -> Result<Outcome, FleetError> {
        let jobs: BTreeMap<_, _> = self.jobs.all_versioned().into_iter().collect();
        let allocs: BTreeMap<_, _> = self.allocs.all_versioned().into_iter().collect();
        let reports: BTreeMap<_, _> = self.reports.all_versioned().into_iter().collect();
        let placements: BTreeMap<String, i64> = self
            .placements
            .all_versioned()
            .into_iter()
            .map(|(k, v)| (k, v.mod_revision))
            .collect();
        let nodes: BTreeMap<String, NodeState> = self
            .membership
            .nodes()
            .into_iter()
            .map(|n| (n.id, n.status))
            .collect();
        let history = History {
            jobs: &jobs,
            allocs: &allocs,
            reports: &reports,
            placements: &placements,
            nodes: &nodes,
        };
        let due = self.collector.due(history.collectable(), Instant::now());
        let mut writes = Vec::new();
        for item in &due {
            writes.extend(history.deletes(item, |dir, id| self.etcd.key(&[dir, id])));
        }
        if writes.is_empty() {
            return Ok(Outcome::Done(0));
        }
        let n = writes.len() as u64;
        let (outcome, txns) = self.etcd.write_all(writes, fence).await?;
        self.stats.txns.fetch_add(txns as u64, Ordering::Relaxed);
        if let Outcome::Done(_) = outcome {
            self.stats.collected.fetch_add(n, Ordering::Relaxed);
            for item in &due {
                tracing::info!(?item, "collected");
            }
        }
        Ok(outcome)
    }

    /// When each down node went down, as this leader saw it; nodes back up are forgotten.
    fn down_since(&self, nodes: &[berth_api::nodes::FleetNode]) -> BTreeMap<String, Instant> {
        let mut down = self.down_since.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        down.retain(|id, _| {
            nodes
                .iter()
                .any(|n| &n.id == id && n.status == NodeState::Down)
        });
        for n in nodes.iter().filter(|n| n.status == NodeState::Down) {
            down.entry(n.id.clone()).or_insert(now);
        }
        down.clone()
    }

    /// One pass: reads jobs, allocs and reports, decides, writes.
    pub async fn pass(&self, fence: &Fence) -> Result<Outcome, FleetError> {
        self.stats.passes.fetch_add(1, Ordering::Relaxed);
        let (jobs, _) = self.etcd.list::<FleetJob>(&self.etcd.dir("jobs")).await?;
        let (allocs, _) = self
            .etcd
            .list::<FleetAlloc>(&self.etcd.dir("allocs"))
            .await?;
        let (reports, _) = self
            .etcd
            .list::<AllocReport>(&self.etcd.dir("reports"))
            .await?;
        let name = |key: &str, dir: &str| {
            key.strip_prefix(&self.etcd.dir(dir))
                .unwrap_or(key)
                .to_string()
        };
        let reports: BTreeMap<String, Reported> = reports
            .into_iter()
            .map(|(k, v)| (name(&k, "reports"), v.value.reported))
            .collect();
        let allocs: BTreeMap<String, Versioned<FleetAlloc>> = allocs
            .into_iter()
            .map(|(k, v)| (name(&k, "allocs"), v))
            .collect();
        let nodes = self.membership.nodes();
        let down = self.down_since(&nodes);
        let mut writes = Vec::new();
        let mut stopped = 0u64;
        // Allocs of nodes down longer than the grace are lost.
        let grace_start = Instant::now().checked_sub(self.settings.lost_after);
        let lost_nodes: BTreeMap<String, u64> = down
            .iter()
            .filter(|(_, since)| grace_start.is_some_and(|g| **since <= g))
            .map(|(id, _)| (id.clone(), 0))
            .collect();
        let mut current: BTreeMap<String, FleetAlloc> = allocs
            .iter()
            .map(|(k, v)| (k.clone(), v.value.clone()))
            .collect();
        let lost = berth_scheduler::lost(
            current
                .values()
                .filter(|a| !reports.get(&a.id).is_some_and(|r| r.is_terminal())),
            &lost_nodes,
            0,
        );
        for s in &lost {
            tracing::info!(alloc_id = %s.alloc_id, node_id = %s.node_id, "alloc lost with its node");
        }
        let lost_ids: Vec<String> = lost.iter().map(|s| s.alloc_id.clone()).collect();
        for s in lost {
            if let Some(a) = current.get_mut(&s.alloc_id) {
                a.desired = Desired::Stop;
                a.stop_reason = Some(s.reason);
            }
        }
        let with_reports: Vec<(&FleetAlloc, Option<Reported>)> = current
            .values()
            .map(|a| (a, reports.get(&a.id).copied()))
            .collect();
        let mut cluster = Cluster::new(nodes.iter().cloned(), with_reports.iter().copied());
        let mut by_job: BTreeMap<&str, Vec<(&FleetAlloc, Option<Reported>)>> = BTreeMap::new();
        for (a, r) in &with_reports {
            by_job.entry(a.job_id.as_str()).or_default().push((a, *r));
        }
        let mut jobs: Vec<(String, Versioned<FleetJob>)> = jobs
            .into_iter()
            .map(|(k, v)| (name(&k, "jobs"), v))
            .collect();
        // Higher priorities first: they get the room (and may preempt).
        jobs.sort_by(|a, b| {
            b.1.value
                .spec
                .priority
                .cmp(&a.1.value.spec.priority)
                .then(a.0.cmp(&b.0))
        });
        let volumes = Arc::clone(&self.volumes);
        let volume = move |id: &str| volumes.get(id);
        let mut stops: Vec<Stop> = Vec::new();
        let mut placed: Vec<FleetAlloc> = Vec::new();
        for (job_id, job) in &jobs {
            let job = &job.value;
            let mine = by_job.get(job_id.as_str()).cloned().unwrap_or_default();
            let job_name = job.spec.id.clone();
            let mut new_id = |group: &str, index: u32| new_alloc_id(&job_name, group, index);
            let mut cx = Context {
                volume: &volume,
                new_id: &mut new_id,
                now_ms: berth_sys::now_ms(),
            };
            let plan = schedule(job, &mine, &mut cluster, &mut cx);
            let report = PlacementReport {
                version: job.version,
                failures: plan.failures.clone(),
            };
            let old = self.placements.get_versioned(job_id);
            if old.as_ref().map(|o| &o.value) != Some(&report) {
                writes.push(Write::put(
                    self.etcd.key(&["placements", job_id]),
                    old.map_or(0, |o| o.mod_revision),
                    &report,
                )?);
            }
            stops.extend(plan.stop);
            placed.extend(plan.place);
        }
        // Allocs of jobs that are gone are stopped too.
        for a in current.values() {
            if a.wants_run() && !jobs.iter().any(|(id, _)| *id == a.job_id) {
                stops.push(Stop {
                    alloc_id: a.id.clone(),
                    node_id: a.node_id.clone(),
                    reason: berth_scheduler::StopReason::JobStopped,
                });
            }
        }
        let mut stopping: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        for id in lost_ids {
            if let (Some(a), Some(v)) = (current.get(&id), allocs.get(&id)) {
                stopping.insert(id.clone());
                writes.push(Write::put(
                    self.etcd.key(&["allocs", &id]),
                    v.mod_revision,
                    a,
                )?);
                stopped += 1;
            }
        }
        for s in stops {
            let (Some(a), Some(v)) = (current.get(&s.alloc_id), allocs.get(&s.alloc_id)) else {
                continue;
            };
            if !stopping.insert(s.alloc_id.clone()) {
                continue;
            }
            let mut a = a.clone();
            a.desired = Desired::Stop;
            a.stop_reason = Some(s.reason);
            writes.push(Write::put(
                self.etcd.key(&["allocs", &s.alloc_id]),
                v.mod_revision,
                &a,
            )?);
            stopped += 1;
        }
        let n_placed = placed.len() as u64;
        for a in &placed {
            writes.push(Write::put(self.etcd.key(&["allocs", &a.id]), 0, a)?);
        }
        if writes.is_empty() {
            return Ok(Outcome::Done(0));
        }
        let (outcome, txns) = self.etcd.write_all(writes, fence).await?;
        self.stats.txns.fetch_add(txns as u64, Ordering::Relaxed);
        if let Outcome::Done(_) = outcome {
            self.stats.placed.fetch_add(n_placed, Ordering::Relaxed);
            self.stats.stopped.fetch_add(stopped, Ordering::Relaxed);
            for a in &placed {
                tracing::info!(alloc_id = %a.id, job_id = %a.job_id, node_id = %a.node_id, "alloc placed");
            }
        }
        Ok(outcome)
    }
}

/// A new alloc's id: `<job>-<group>-<index>-<random>` while it fits in a path segment (with
/// room for `.<task>` after it), else 32 random hex digits.
pub fn new_alloc_id(job: &str, group: &str, index: u32) -> String {
    let id = format!("{job}-{group}-{index}-{:08x}", rand::random::<u32>());
    if id.len() <= 64 && berth_sys::validate_path_segment("alloc id", &id).is_ok() {
        id
    } else {
        format!("{:032x}", rand::random::<u128>())
    }
}
