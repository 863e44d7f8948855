//! Jobs in a fleet: `berth job run` on any agent stores the job in etcd; the elected leader
//! places its allocs; each agent runs the allocs placed on its node with its own alloc
//! runners, stops those the leader stopped or moved away, and reports how each is doing.
//!
//! Order on this node: stopping comes before starting in every sync, and tasks recovered
//! after a restart wait (the servers-contacted gate) until the first sync has stopped the
//! allocs that were moved away while the node was gone.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use berth_allocrunner::{AllocSpec, UpstreamError, UpstreamWatcher};
use berth_api::{
    jobs::{
        AllocStatus, ClientStatus, DesiredState, JobList, JobRunRequest, JobStatus, JobSummary,
    },
    server::ApiError,
};
use berth_controlplane::placement::AllocPlan;
use berth_fleet::{AllocReport, Fleet, Membership, Outcome};
use berth_scheduler::{Desired, FleetAlloc, FleetJob, Reported};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::jobs::Jobs;

/// How long `job run` waits for the leader's first pass over the new version.
const PLACEMENT_WAIT: Duration = Duration::from_secs(10);
/// How long a burst of local changes settles before it is reported.
const REPORT_SETTLE: Duration = Duration::from_millis(50);
/// When a report could not be written (etcd out of reach, a member just died), how long
/// before it is written again.
const REPORT_RETRY: Duration = Duration::from_secs(1);

/// This node's side of the fleet's jobs.
pub struct FleetJobs {
    fleet: Arc<Fleet>,
    membership: Arc<Membership>,
    jobs: Arc<Jobs>,
    node_id: String,
    gate: watch::Sender<bool>,
    /// Reports as last written, by alloc.
    reported: Mutex<BTreeMap<String, AllocReport>>,
    /// Allocs this node refused to start (they are reported failed, not tried again).
    refused: Mutex<BTreeSet<String>>,
}

impl std::fmt::Debug for FleetJobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetJobs")
            .field("node_id", &self.node_id)
            .finish_non_exhaustive()
    }
}

/// Waits for the allocs a new alloc preempts: each must be finished (tasks dead, volumes
/// released) or gone before the new one claims anything.
#[derive(Debug)]
pub struct PreemptedWatcher {
    fleet: Arc<Fleet>,
}

impl PreemptedWatcher {
    /// A watcher over the fleet's mirrors.
    pub fn new(fleet: Arc<Fleet>) -> Self {
        Self { fleet }
    }

    fn pending(&self, ids: &[String]) -> Vec<String> {
        ids.iter()
            .filter(|id| {
                self.fleet.allocs.get(id).is_some()
                    && !self
                        .fleet
                        .reports
                        .get(id)
                        .is_some_and(|r| r.reported.is_terminal())
            })
            .cloned()
            .collect()
    }
}

impl UpstreamWatcher for PreemptedWatcher {
    fn upstream(&self, alloc: &AllocSpec) -> Vec<String> {
        self.fleet
            .allocs
            .get(&alloc.alloc_id)
            .map(|a| a.preempts)
            .unwrap_or_default()
    }

    fn wait<'a>(
        &'a self,
        alloc: &'a AllocSpec,
    ) -> berth_allocrunner::BoxFuture<'a, Result<(), UpstreamError>> {
        Box::pin(async move {
            let ids = self.upstream(alloc);
            let mut reports = self.fleet.reports.subscribe();
            let mut allocs = self.fleet.allocs.subscribe();
            loop {
                let left = self.pending(&ids);
                if left.is_empty() {
                    return Ok(());
                }
                tracing::debug!(alloc_id = %alloc.alloc_id, waiting_for = ?left, "waiting for preempted allocs");
                tokio::select! {
                    r = reports.changed() => if r.is_err() { break },
                    r = allocs.changed() => if r.is_err() { break },
                }
            }
            Err(UpstreamError {
                message: "the fleet's mirrors stopped".into(),
            })
        })
    }
}

fn reported(status: &AllocStatus, finished: bool) -> Reported {
    match status.client_status {
        ClientStatus::Complete if finished => Reported::Complete,
        ClientStatus::Failed if finished => Reported::Failed,
        ClientStatus::Pending => Reported::Pending,
        _ => Reported::Running,
    }
}

/// What the API shows of an alloc no node has reported yet.
fn unreported(a: &FleetAlloc) -> AllocStatus {
    AllocStatus {
        alloc_id: a.id.clone(),
        job_id: a.job_id.clone(),
        group: a.group.clone(),
        index: a.index,
        desired: match a.desired {
            Desired::Run => DesiredState::Run,
            Desired::Stop => DesiredState::Stop,
        },
        client_status: ClientStatus::Pending,
        failure: None,
        tasks: BTreeMap::new(),
        volumes: BTreeMap::new(),
        events: Vec::new(),
        events_dropped: 0,
    }
}

impl FleetJobs {
    /// This node's side; nothing runs until [`FleetJobs::run`]. `gate` is the
    /// servers-contacted gate the alloc runners wait at.
    pub fn new(
        fleet: Arc<Fleet>,
        membership: Arc<Membership>,
        jobs: Arc<Jobs>,
        node_id: String,
        gate: watch::Sender<bool>,
    ) -> Arc<Self> {
        Arc::new(Self {
            fleet,
            membership,
            jobs,
            node_id,
            gate,
            reported: Mutex::new(BTreeMap::new()),
            refused: Mutex::new(BTreeSet::new()),
        })
    }

    /// Syncs after every change of the fleet's allocs or jobs, of this node's registration
    /// or of its allocs, until `shutdown`.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut allocs = self.fleet.allocs.subscribe();
        let mut jobs = self.fleet.jobs.subscribe();
        let mut lease = self.membership.subscribe();
        let mut local = self.jobs.subscribe();
        loop {
            self.sync().await;
            let unreported = !self.report().await;
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(REPORT_RETRY), if unreported => {}
                _ = allocs.changed() => {}
                _ = jobs.changed() => {}
                _ = lease.changed() => {}
                _ = local.changed() => {
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(REPORT_SETTLE) => {}
                    }
                }
            }
        }
    }

    /// Stops the allocs the fleet no longer wants here, then (while registered) starts those
    /// placed here; opens the servers-contacted gate after the first sync.
    pub async fn sync(&self) {
        for (status, _) in self.jobs.local_allocs() {
            if status.desired == DesiredState::Stop {
                continue;
            }
            let why = match self.fleet.allocs.get(&status.alloc_id) {
                None => Some("the fleet no longer has it".to_string()),
                Some(a) if a.node_id != self.node_id => {
                    Some(format!("it was moved to node {}", a.node_id))
                }
                Some(a) if a.desired == Desired::Stop => Some(
                    a.stop_reason
                        .map_or_else(|| "stopped".into(), |r| r.to_string()),
                ),
                Some(_) => None,
            };
            if let Some(why) = why {
                tracing::info!(alloc_id = %status.alloc_id, reason = %why, "stopping the alloc as the fleet asks");
                self.jobs.stop_alloc(&status.alloc_id);
            }
        }
        if self.membership.fence().is_none() {
            return;
        }
        let mut placed: Vec<FleetAlloc> = self
            .fleet
            .allocs
            .all()
            .into_iter()
            .map(|(_, a)| a)
            .filter(|a| a.node_id == self.node_id && a.wants_run())
            .collect();
        placed.sort_by_key(|a| a.created_ms);
        for a in placed {
            if self.jobs.knows(&a.id)
                || self
                    .refused
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains(&a.id)
            {
                continue;
            }
            let Some(job) = self.fleet.jobs.get(&a.job_id) else {
                continue;
            };
            if job.version != a.job_version {
                // The leader stops it soon.
                continue;
            }
            let plan = AllocPlan {
                alloc_id: a.id.clone(),
                job_id: a.job_id.clone(),
                group: a.group.clone(),
                index: a.index,
                volumes: a.volumes.clone(),
            };
            match self.jobs.start_placed(&job.spec, plan).await {
                Ok(()) => tracing::info!(alloc_id = %a.id, job_id = %a.job_id, "alloc started"),
                Err(e) => {
                    tracing::warn!(alloc_id = %a.id, error = %e, "cannot start the alloc placed here");
                    self.refused
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(a.id.clone());
                    let mut status = unreported(&a);
                    status.client_status = ClientStatus::Failed;
                    status.failure = Some(e.to_string());
                    self.write_report(&a.id, Reported::Failed, status).await;
                }
            }
        }
        if !*self.gate.borrow() {
            tracing::info!("synced with the fleet: recovered tasks may run again");
            self.gate.send_replace(true);
        }
    }

    /// Writes the status of every local alloc whose status changed; false when one could not
    /// be written (it is tried again).
    async fn report(&self) -> bool {
        let mut all = true;
        self.reported
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|id, _| self.fleet.allocs.get(id).is_some());
        for (status, finished) in self.jobs.local_allocs() {
            if self.fleet.allocs.get(&status.alloc_id).is_none() {
                // The leader collected it (its report with it): nothing to report.
                continue;
            }
            let r = reported(&status, finished);
            let changed = self
                .reported
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&status.alloc_id)
                .is_none_or(|old| old.reported != r || old.status != status);
            if changed {
                let id = status.alloc_id.clone();
                all &= self.write_report(&id, r, status).await;
            }
        }
        all
    }

    /// Writes one report; false when it is not written (the caller tries again later).
    async fn write_report(&self, alloc_id: &str, r: Reported, status: AllocStatus) -> bool {
        let Some(fence) = self.membership.fence() else {
            return false;
        };
        let report = AllocReport {
            node_id: self.node_id.clone(),
            reported: r,
            status,
        };
        let key = self.fleet.etcd().key(&["reports", alloc_id]);
        for _ in 0..4 {
            let expected = self
                .fleet
                .reports
                .get_versioned(alloc_id)
                .map_or(0, |v| v.mod_revision);
            match self
                .fleet
                .etcd()
                .put_if(&key, &report, expected, Some(&fence))
                .await
            {
                Ok(Outcome::Done(rev)) => {
                    self.fleet.reports.note(alloc_id, Some(report.clone()), rev);
                    self.reported
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(alloc_id.to_string(), report);
                    return true;
                }
                Ok(Outcome::Changed) => {
                    // The mirror is behind: read the key's revision and go again.
                    if let Ok(Some(v)) = self.fleet.etcd().get::<AllocReport>(&key).await {
                        self.fleet
                            .reports
                            .note(alloc_id, Some(v.value), v.mod_revision);
                    }
                }
                Ok(Outcome::Fenced) => {
                    self.membership.lapsed(&fence);
                    return false;
                }
                Err(e) => {
                    tracing::warn!(alloc_id, error = %e, retry_in = ?REPORT_RETRY, "cannot report the alloc's status");
                    return false;
                }
            }
        }
        false
    }

    /// `POST /v1/jobs` in a fleet: checks the spec, stores it (a new version when it
    /// changed), and waits a bounded time for the leader's first pass over it.
    pub async fn submit(&self, req: JobRunRequest) -> Result<JobStatus, ApiError> {
        let spec = self.jobs.parse(&req, false).await?;
        let fence = self.membership.fence().ok_or_else(|| {
            ApiError::Unavailable("this agent is not registered with the fleet yet".into())
        })?;
        let key = self.fleet.etcd().key(&["jobs", &spec.id]);
        let version = loop {
            let current = self
                .fleet
                .etcd()
                .get::<FleetJob>(&key)
                .await
                .map_err(unavailable)?;
            let (expected, version) = match &current {
                Some(c) if !c.value.stopped && c.value.spec == spec => {
                    break c.value.version;
                }
                Some(c) => (c.mod_revision, c.value.version + 1),
                None => (0, 1),
            };
            let job = FleetJob {
                spec: spec.clone(),
                version,
                stopped: false,
                submitted_ms: berth_sys::now_ms(),
            };
            match self
                .fleet
                .etcd()
                .put_if(&key, &job, expected, Some(&fence))
                .await
                .map_err(unavailable)?
            {
                Outcome::Done(rev) => {
                    self.fleet.jobs.note(&spec.id, Some(job), rev);
                    break version;
                }
                Outcome::Changed => continue,
                Outcome::Fenced => {
                    self.membership.lapsed(&fence);
                    return Err(ApiError::Unavailable(
                        "this agent's fleet registration lapsed; try again".into(),
                    ));
                }
            }
        };
        tracing::info!(job_id = %spec.id, version, "job submitted to the fleet");
        let mut placements = self.fleet.placements.subscribe();
        let _ = tokio::time::timeout(PLACEMENT_WAIT, async {
            while self
                .fleet
                .placements
                .get(&spec.id)
                .is_none_or(|p| p.version < version)
            {
                if placements.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
        // The allocs written with the report may not have reached this node's mirror yet.
        if let Ok((allocs, _)) = self
            .fleet
            .etcd()
            .list::<FleetAlloc>(&self.fleet.etcd().dir("allocs"))
            .await
        {
            for (_, a) in allocs
                .into_iter()
                .filter(|(_, a)| a.value.job_id == spec.id)
            {
                self.fleet
                    .allocs
                    .note(&a.value.id.clone(), Some(a.value), a.mod_revision);
            }
        }
        self.status(&spec.id)
    }

    /// `DELETE /v1/job/{id}` in a fleet: marks the job stopped; the leader stops its allocs.
    pub async fn stop(&self, id: &str) -> Result<JobStatus, ApiError> {
        let fence = self.membership.fence().ok_or_else(|| {
            ApiError::Unavailable("this agent is not registered with the fleet yet".into())
        })?;
        let key = self.fleet.etcd().key(&["jobs", id]);
        loop {
            let Some(current) = self
                .fleet
                .etcd()
                .get::<FleetJob>(&key)
                .await
                .map_err(unavailable)?
            else {
                return Err(ApiError::NotFound(format!("no job {id:?}")));
            };
            if current.value.stopped {
                break;
            }
            let mut job = current.value;
            job.stopped = true;
            match self
                .fleet
                .etcd()
                .put_if(&key, &job, current.mod_revision, Some(&fence))
                .await
                .map_err(unavailable)?
            {
                Outcome::Done(rev) => {
                    self.fleet.jobs.note(id, Some(job), rev);
                    break;
                }
                Outcome::Changed => continue,
                Outcome::Fenced => {
                    self.membership.lapsed(&fence);
                    return Err(ApiError::Unavailable(
                        "this agent's fleet registration lapsed; try again".into(),
                    ));
                }
            }
        }
        self.status(id)
    }

    /// An alloc's status: this node's runner's when it runs here, else its node's report.
    fn alloc_status(&self, a: &FleetAlloc) -> AllocStatus {
        if a.node_id == self.node_id
            && let Some(s) = self.jobs.alloc_status(&a.id)
        {
            return s;
        }
        self.fleet
            .reports
            .get(&a.id)
            .map_or_else(|| unreported(a), |r| r.status)
    }

    fn allocs_of(&self, job_id: &str) -> Vec<FleetAlloc> {
        let mut allocs: Vec<FleetAlloc> = self
            .fleet
            .allocs
            .all()
            .into_iter()
            .map(|(_, a)| a)
            .filter(|a| a.job_id == job_id)
            .collect();
        allocs.sort_by(|a, b| {
            (a.group.as_str(), a.index, a.created_ms).cmp(&(
                b.group.as_str(),
                b.index,
                b.created_ms,
            ))
        });
        allocs
    }

    /// `GET /v1/job/{id}` in a fleet: every alloc with its node, and why groups were not
    /// placed.
    pub fn status(&self, id: &str) -> Result<JobStatus, ApiError> {
        let job = self
            .fleet
            .jobs
            .get(id)
            .ok_or_else(|| ApiError::NotFound(format!("no job {id:?}")))?;
        let allocs = self.allocs_of(id);
        let nodes: BTreeMap<String, String> = self
            .membership
            .nodes()
            .into_iter()
            .map(|n| (n.id, n.name))
            .collect();
        let placements = allocs
            .iter()
            .map(|a| berth_api::jobs::AllocPlacement {
                alloc_id: a.id.clone(),
                node_id: a.node_id.clone(),
                node_name: nodes.get(&a.node_id).cloned().unwrap_or_default(),
                desired: match a.desired {
                    Desired::Run => "run".into(),
                    Desired::Stop => "stop".into(),
                },
                stop_reason: a.stop_reason.as_ref().map(ToString::to_string),
                preempts: a.preempts.clone(),
            })
            .collect();
        let failures = self
            .fleet
            .placements
            .get(id)
            .filter(|p| p.version == job.version && !job.stopped)
            .map(|p| p.failures.iter().map(ToString::to_string).collect())
            .unwrap_or_default();
        Ok(JobStatus {
            id: job.spec.id.clone(),
            job_type: job.spec.job_type.as_str().to_string(),
            stopped: job.stopped,
            allocs: allocs.iter().map(|a| self.alloc_status(a)).collect(),
            version: Some(job.version),
            placements,
            failures,
            event_index: None,
        })
    }

    /// `GET /v1/jobs` in a fleet.
    pub fn list(&self) -> JobList {
        let jobs = self
            .fleet
            .jobs
            .all()
            .into_iter()
            .map(|(id, job)| {
                let mut counts: BTreeMap<String, usize> = BTreeMap::new();
                for a in self.allocs_of(&id) {
                    let s = self.alloc_status(&a);
                    *counts
                        .entry(s.client_status.as_str().to_string())
                        .or_default() += 1;
                }
                JobSummary {
                    id: job.spec.id.clone(),
                    job_type: job.spec.job_type.as_str().to_string(),
                    stopped: job.stopped,
                    allocs: counts,
                }
            })
            .collect();
        JobList { jobs }
    }

    /// `GET /v1/alloc/{id}` in a fleet.
    pub fn alloc(&self, id: &str) -> Result<AllocStatus, ApiError> {
        if let Ok(s) = self.jobs.alloc(id) {
            return Ok(s);
        }
        let a = self
            .fleet
            .allocs
            .get(id)
            .ok_or_else(|| ApiError::NotFound(format!("no alloc {id:?}")))?;
        Ok(self.alloc_status(&a))
    }
}

fn unavailable(e: berth_fleet::FleetError) -> ApiError {
    ApiError::Unavailable(e.to_string())
}
