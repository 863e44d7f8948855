//! Jobs on this node: a job spec is placed by the control plane (every alloc it asks for, or a
//! refusal with every reason, nothing placed), kept in the store, and each alloc is run by an
//! alloc runner over the node's task drivers and its volumes. At start, the allocs in the store
//! are recovered: running tasks are re-attached, not restarted.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{Arc, Mutex},
};

use berth_allocrunner::{
    AllocDeps, AllocRunner, AllocSpec, AllocStatus, AllocStore, NodeVars, RenderEnv,
    StateAllocStore, VolumeHost, VolumeHostError, VolumeUse, render_alloc,
};
use berth_api::{
    jobs::{AllocStats, JobList, JobRunRequest, JobStatus, JobSummary, TaskRunState, TaskUsage},
    server::ApiError,
    volumes::{ClaimRequest, FlagsInput, MountOptionsInput, ReleaseRequest, SpecFormat},
};
use berth_controlplane::placement::{self, DriverFact, NodeFacts, PluginFact};
use berth_devices::manager::{DeviceManager, TaskRequests};
use berth_drivers::{DriverManager, Health, TaskId};
use berth_input::Syntax;
use berth_job::{JobSpec, NodeKeys, ParseOptions, VarFile};
use berth_state::{Store, Table};
use serde::{Deserialize, Serialize};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

mod alloc_exec;
mod alloc_logs;
mod ops;

use crate::{
    events::EventBus,
    manager::Manager,
    plugin_tasks::{PluginPlan, PluginTaskHook, PluginTasks},
    registry::Registry,
    volumes::Volumes,
};

/// A new alloc's id: `<job>-<group>-<index>-<random>`, readable while it fits in a path
/// segment, else 32 random hex digits.
fn alloc_id(job_id: &str, group: &str, index: u32, tasks: &[&str]) -> String {
    let id = format!("{job_id}-{group}-{index}-{:08x}", rand::random::<u32>());
    // The tasks' ids (`<alloc>.<task>`, 128 bytes at most) must fit too.
    if berth_sys::validate_path_segment("alloc id", &id).is_ok()
        && tasks.iter().all(|t| TaskId::for_alloc(&id, t).is_ok())
    {
        id
    } else {
        format!("{:032x}", rand::random::<u128>())
    }
}

/// The alloc store, telling whoever listens that a record changed (a fleet node reports its
/// allocs' statuses from it).
#[derive(Debug)]
struct NotifyingStore {
    inner: StateAllocStore,
    changed: tokio::sync::watch::Sender<u64>,
    events: Arc<EventBus>,
    streamed: crate::alloc_events::AllocEvents,
}

impl NotifyingStore {
    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }
}

impl AllocStore for NotifyingStore {
    fn put(
        &self,
        record: &berth_allocrunner::AllocRecord,
    ) -> Result<(), berth_allocrunner::AllocStoreError> {
        let r = self.inner.put(record);
        if r.is_ok() {
            self.streamed.written(&self.events, record);
        }
        self.bump();
        r
    }
    fn put_all(
        &self,
        records: &[berth_allocrunner::AllocRecord],
    ) -> Result<(), berth_allocrunner::AllocStoreError> {
        let r = self.inner.put_all(records);
        if r.is_ok() {
            for record in records {
                self.streamed.written(&self.events, record);
            }
        }
        self.bump();
        r
    }
    fn get(
        &self,
        alloc_id: &str,
    ) -> Result<Option<berth_allocrunner::AllocRecord>, berth_allocrunner::AllocStoreError> {
        self.inner.get(alloc_id)
    }
    fn list(
        &self,
    ) -> Result<Vec<berth_allocrunner::AllocRecord>, berth_allocrunner::AllocStoreError> {
        self.inner.list()
    }
    fn delete(&self, alloc_id: &str) -> Result<bool, berth_allocrunner::AllocStoreError> {
        let r = self.inner.delete(alloc_id);
        if matches!(r, Ok(true)) {
            self.streamed.deleted(&self.events, alloc_id);
        }
        self.bump();
        r
    }
}

/// What a fleet gives the alloc runners: the gate recovered tasks wait at until the node has
/// synced with the fleet, and the watcher of the allocs a new one preempts.
#[derive(Debug, Clone)]
pub struct FleetHooks {
    /// Opened once the node has synced with the fleet.
    pub servers_contacted: tokio::sync::watch::Receiver<bool>,
    /// Waits for preempted allocs.
    pub upstream: Arc<dyn berth_allocrunner::UpstreamWatcher>,
}

/// A placed job, as stored (`Table::JOBS`).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct JobRecord {
    spec: JobSpec,
    stopped: bool,
    allocs: Vec<String>,
}

/// The node's volume side as alloc runners see it: claims and releases through [`Volumes`].
#[derive(Debug)]
pub struct AgentVolumeHost {
    volumes: Arc<Volumes>,
}

fn host_error(e: ApiError) -> VolumeHostError {
    match e {
        ApiError::Unavailable(m) | ApiError::Internal(m) => VolumeHostError::retryable(m),
        // A failed claim being rolled back: it is gone soon, and the claim can be tried again.
        ApiError::Conflict(m) if m.contains("is being released") => VolumeHostError::retryable(m),
        ApiError::BadRequest(m)
        | ApiError::NotFound(m)
        | ApiError::Conflict(m)
        | ApiError::Unprocessable(m) => VolumeHostError::fatal(m),
    }
}

impl VolumeHost for AgentVolumeHost {
    fn claim<'a>(
        &'a self,
        volume_id: &'a str,
        alloc_id: &'a str,
        usage: VolumeUse,
    ) -> berth_allocrunner::BoxFuture<'a, Result<PathBuf, VolumeHostError>> {
        Box::pin(async move {
            let o = &usage.mount_options;
            let req = ClaimRequest {
                alloc_id: alloc_id.to_string(),
                read_only: usage.read_only,
                access_mode: usage.access_mode,
                attachment_mode: usage.attachment_mode,
                mount_options: Some(MountOptionsInput {
                    fs_type: (!o.fs_type.is_empty()).then(|| o.fs_type.clone()),
                    mount_flags: (!o.mount_flags.is_empty())
                        .then(|| FlagsInput(o.mount_flags.expose().to_vec())),
                }),
            };
            self.volumes
                .claim(volume_id, req)
                .await
                .map(|r| r.target)
                .map_err(host_error)
        })
    }

    fn release<'a>(
        &'a self,
        volume_id: &'a str,
        alloc_id: &'a str,
    ) -> berth_allocrunner::BoxFuture<'a, Result<(), VolumeHostError>> {
        Box::pin(async move {
            let req = ReleaseRequest {
                alloc_id: alloc_id.to_string(),
            };
            match self.volumes.release_api(volume_id, req).await {
                Ok(r) if r.released => Ok(()),
                // The volume side keeps retrying it; the alloc's release is done asking.
                Ok(r) => Err(VolumeHostError::retryable(
                    r.error.unwrap_or_else(|| "release pending".into()),
                )),
                Err(ApiError::NotFound(_)) => Ok(()),
                Err(e) => Err(host_error(e)),
            }
        })
    }
}

/// Jobs and their allocs on this node.
pub struct Jobs {
    store: Arc<Store>,
    allocs: Arc<dyn AllocStore>,
    drivers: DriverManager,
    devices: Arc<DeviceManager>,
    registry: Arc<Registry>,
    manager: Arc<Manager>,
    volumes: Arc<Volumes>,
    node_id: String,
    /// The node as jobs see it, without driver attributes (added at placement).
    node: NodeVars,
    deps: AllocDeps,
    plugins: PluginTasks,
    /// Consul tokens of services with a workload identity.
    consul: Arc<crate::consul::ConsulTokens>,
    runners: Mutex<BTreeMap<String, AllocRunner>>,
    tasks: TaskTracker,
    shutdown: CancellationToken,
    /// Serializes run and stop (placement reads claims it is about to add).
    placing: tokio::sync::Mutex<()>,
    /// Bumped whenever an alloc record is written.
    changed: tokio::sync::watch::Sender<u64>,
    /// Where job events go.
    events: Arc<EventBus>,
}

impl std::fmt::Debug for Jobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jobs").finish_non_exhaustive()
    }
}

impl Jobs {
    /// Jobs over the agent's store, drivers and volumes; allocs live under
    /// `<data_dir>/allocs/<alloc id>`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Arc<Store>,
        drivers: DriverManager,
        devices: Arc<DeviceManager>,
        registry: Arc<Registry>,
        manager: Arc<Manager>,
        volumes: Arc<Volumes>,
        events: Arc<EventBus>,
        node: NodeVars,
        data_dir: &std::path::Path,
        tasks: TaskTracker,
        shutdown: CancellationToken,
        fleet: Option<FleetHooks>,
        consul: Arc<crate::consul::ConsulTokens>,
    ) -> Self {
        let node_id = node.id.clone();
        let changed = tokio::sync::watch::channel(0).0;
        let inner = StateAllocStore::new(Arc::clone(&store));
        let streamed = crate::alloc_events::AllocEvents::new(&inner.list().unwrap_or_default());
        let allocs: Arc<dyn AllocStore> = Arc::new(NotifyingStore {
            inner,
            changed: changed.clone(),
            events: Arc::clone(&events),
            streamed,
        });
        let mut deps = AllocDeps::new(
            Arc::new(drivers.clone()),
            Arc::new(AgentVolumeHost {
                volumes: Arc::clone(&volumes),
            }),
            Arc::clone(&allocs),
            data_dir.join("allocs"),
        );
        deps.devices = Arc::new(crate::devices::AgentDeviceHost::new(Arc::clone(&devices)));
        deps.log_collector = Some(berth_drivers::LogCollector::berth_subcommand());
        if let Some(f) = fleet {
            deps.servers_contacted = f.servers_contacted;
            deps.upstream = f.upstream;
        }
        let plugins = PluginTasks {
            registry: Arc::clone(&registry),
            events: Arc::clone(&events),
            drivers: drivers.clone(),
            data_dir: data_dir.to_path_buf(),
            tasks: tasks.clone(),
            shutdown: shutdown.clone(),
        };
        Self {
            store,
            allocs,
            drivers,
            devices,
            plugins,
            registry,
            manager,
            volumes,
            node_id,
            node,
            deps,
            consul,
            runners: Mutex::new(BTreeMap::new()),
            tasks,
            shutdown,
            placing: tokio::sync::Mutex::new(()),
            changed,
            events,
        }
    }

    /// Changes whenever an alloc record is written.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Every runner now (cloned: the lock is not held while they are used).
    fn all_runners(&self) -> Vec<AllocRunner> {
        self.runners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// The runner of `alloc_id`, if it has one.
    fn runner(&self, alloc_id: &str) -> Option<AllocRunner> {
        self.runners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(alloc_id)
            .cloned()
    }

    /// The allocs with a runner on this node: their status, and whether they are finished
    /// (tasks dead, volumes released).
    pub fn local_allocs(&self) -> Vec<(AllocStatus, bool)> {
        self.all_runners()
            .iter()
            .map(|r| (r.status(), r.record().is_finished()))
            .collect()
    }

    /// Whether this node knows the alloc (a runner, or a record of one).
    pub fn knows(&self, alloc_id: &str) -> bool {
        self.runner(alloc_id).is_some() || self.allocs.get(alloc_id).ok().flatten().is_some()
    }

    /// Asks the alloc's runner to stop (tasks, then volumes in CSI order); false when the
    /// node runs no such alloc.
    pub fn stop_alloc(&self, alloc_id: &str) -> bool {
        self.runner(alloc_id).map(|r| r.stop()).is_some()
    }

    /// Starts an alloc the fleet placed on this node: its spec rendered for this node, its
    /// devices chosen here, then its runner. Refused (nothing started) with every reason.
    pub async fn start_placed(
        self: &Arc<Self>,
        spec: &JobSpec,
        plan: placement::AllocPlan,
    ) -> Result<(), ApiError> {
        let file = PathBuf::from(format!("job {}", spec.id));
        let mut specs = self.render(spec, std::slice::from_ref(&plan), &file)?;
        self.place_devices(&spec.id, &mut specs).await?;
        let runners = match AllocRunner::new_all(specs, self.deps.clone()) {
            Ok(r) => r,
            Err(e) => {
                self.devices.release(&plan.alloc_id);
                return Err(ApiError::Internal(e.to_string()));
            }
        };
        for runner in runners {
            self.add_hooks(&runner);
            self.spawn_runner(runner);
        }
        Ok(())
    }

    /// Recovers every alloc in the store that is not finished: running tasks are re-attached
    /// (not restarted), and each alloc's runner goes on from where its record stands.
    pub async fn recover(self: &Arc<Self>) {
        let records = match self.allocs.list() {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the allocs to recover");
                return;
            }
        };
        let mut live_plugins = std::collections::BTreeSet::new();
        for record in records.into_iter().filter(|r| !r.is_finished()) {
            let alloc_id = record.alloc_id.clone();
            // Its devices stay taken even if it cannot be recovered: its tasks may still run.
            let devices = record.devices.clone();
            match AllocRunner::recover(record, self.deps.clone()).await {
                Ok(runner) => {
                    live_plugins.extend(self.add_hooks(&runner));
                    tracing::info!(alloc_id, "alloc recovered");
                    self.spawn_runner(runner);
                }
                Err(e) => {
                    for (task, assignments) in &devices {
                        self.deps.devices.restore(&alloc_id, task, assignments);
                    }
                    tracing::error!(alloc_id, error = %e, devices_kept = !devices.is_empty(), "cannot recover the alloc; its devices stay taken");
                }
            }
        }
        // Plugin tasks whose alloc ended while the agent was down are not plugins any more.
        for r in self.registry.list() {
            if r.source == berth_api::Source::Task
                && !live_plugins.contains(&(r.id.clone(), r.instance.clone()))
                && let Err(e) = self
                    .registry
                    .deregister(
                        &r.id,
                        &r.instance,
                        "its task ended while the agent was down",
                    )
                    .await
            {
                tracing::warn!(plugin = %r.id, instance = %r.instance, error = %e, "cannot deregister");
            }
        }
    }

    /// Adds the agent's hooks to a runner: the Consul token hooks, and the plugin supervisor
    /// of every task with a `csi_plugin` block; returns the plugins' (plugin id, instance).
    fn add_hooks(&self, runner: &AllocRunner) -> Vec<(String, String)> {
        if let Some(hooks) = self.consul.hooks(runner.group()) {
            let added = runner.add_alloc_hook(hooks.alloc).and_then(|()| {
                hooks
                    .tasks
                    .into_iter()
                    .try_for_each(|(task, hook)| runner.add_task_hook(&task, hook))
            });
            if let Err(e) = added {
                tracing::error!(alloc_id = runner.alloc_id(), error = %e, "cannot add the Consul token hooks");
            }
        }
        let mut added = Vec::new();
        for task in &runner.group().tasks {
            let Some(spec) = &task.csi_plugin else {
                continue;
            };
            let hook = Arc::new(PluginTaskHook::new(self.plugins.clone(), spec.clone()));
            if let Err(e) = runner.add_task_hook(&task.name, hook) {
                tracing::error!(alloc_id = runner.alloc_id(), task = %task.name, error = %e, "cannot supervise the plugin task");
                continue;
            }
            if let Ok(plan) =
                PluginPlan::new(&self.plugins.data_dir, runner.alloc_id(), &task.name, spec)
            {
                added.push((spec.id.clone(), plan.instance));
            }
        }
        added
    }

    fn spawn_runner(self: &Arc<Self>, runner: AllocRunner) {
        self.runners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(runner.alloc_id().to_string(), runner.clone());
        let cancel = self.shutdown.child_token();
        self.tasks.spawn(async move {
            match runner.run(cancel).await {
                Ok(status) => {
                    tracing::info!(
                        alloc_id = runner.alloc_id(),
                        status = status.as_str(),
                        "alloc done"
                    );
                }
                Err(e) => {
                    tracing::warn!(alloc_id = runner.alloc_id(), error = %e, "alloc runner ended")
                }
            }
        });
    }

    fn node_facts(&self) -> NodeFacts {
        let drivers = self
            .drivers
            .driver_names()
            .into_iter()
            .map(|name| {
                let fp = self.drivers.fingerprint(&name);
                let healthy = fp.as_ref().is_some_and(|f| f.health == Health::Healthy);
                let reason = fp.map_or_else(|| "not fingerprinted yet".into(), |f| f.description);
                (name, DriverFact { healthy, reason })
            })
            .collect();
        let mut plugins: BTreeMap<String, PluginFact> = BTreeMap::new();
        for r in self.registry.list() {
            if !r.plugin_type.is_node() {
                continue;
            }
            let healthy = self
                .manager
                .state(&r.id, &r.instance)
                .is_some_and(|s| s.health.healthy);
            let fact = plugins.entry(r.id.clone()).or_insert(PluginFact {
                node: true,
                healthy: false,
            });
            fact.healthy |= healthy;
        }
        NodeFacts {
            node_id: self.node_id.clone(),
            drivers,
            plugins,
        }
    }

    fn load(&self, id: &str) -> Result<Option<JobRecord>, ApiError> {
        self.store
            .get(Table::JOBS, id)
            .map_err(|e| ApiError::Internal(e.to_string()))
    }

    fn save(&self, id: &str, rec: &JobRecord) -> Result<(), ApiError> {
        self.store
            .put(Table::JOBS, id, rec)
            .map_err(|e| ApiError::Internal(e.to_string()))
    }

    /// The alloc's status: its runner's, or its record's.
    pub fn alloc_status(&self, alloc_id: &str) -> Option<AllocStatus> {
        match self.runner(alloc_id) {
            Some(r) => Some(r.status()),
            None => Some(AllocStatus::from_record(
                &self.allocs.get(alloc_id).ok().flatten()?,
            )),
        }
    }

    /// Fills in the latest statistic of every device the allocs' tasks hold (the device
    /// view is read once, and only when one of them holds devices).
    fn add_device_stats(&self, statuses: &mut [AllocStatus]) {
        if statuses
            .iter()
            .all(|s| s.tasks.values().all(|t| t.devices.is_empty()))
        {
            return;
        }
        let view = self.devices.view();
        let mut latest = BTreeMap::new();
        for g in &view.groups {
            for i in &g.instances {
                if let Some(summary) = i.stats.as_ref().and_then(|s| s.summary.as_ref()) {
                    latest.insert(format!("{}/{}", g.id(), i.id), summary.to_string());
                }
            }
        }
        for task in statuses.iter_mut().flat_map(|s| s.tasks.values_mut()) {
            for d in &mut task.devices {
                for name in &d.devices {
                    if let Some(s) = latest.get(name) {
                        d.stats.insert(name.clone(), s.clone());
                    }
                }
            }
        }
    }

    fn status_of(&self, rec: &JobRecord) -> JobStatus {
        let mut allocs: Vec<AllocStatus> = rec
            .allocs
            .iter()
            .filter_map(|a| self.alloc_status(a))
            .collect();
        self.add_device_stats(&mut allocs);
        JobStatus {
            id: rec.spec.id.clone(),
            job_type: rec.spec.job_type.as_str().to_string(),
            stopped: rec.stopped,
            allocs,
            version: None,
            placements: Vec::new(),
            failures: Vec::new(),
            event_index: None,
        }
    }

    /// The node as jobs see it now: its attributes with the drivers' (`driver.<name>` is `1`
    /// for a healthy driver, plus what its fingerprint reports).
    pub fn node_vars(&self) -> NodeVars {
        let mut node = self.node.clone();
        for name in self.drivers.driver_names() {
            let Some(fp) = self.drivers.fingerprint(&name) else {
                continue;
            };
            if fp.health == Health::Healthy {
                node.attrs.insert(format!("driver.{name}"), "1".into());
            }
            for (k, v) in &fp.attributes {
                node.attrs.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        node
    }

    /// Each driver with its health, by name.
    pub fn driver_states(&self) -> Vec<berth_api::nodes::DriverState> {
        self.drivers
            .driver_names()
            .into_iter()
            .map(|name| {
                let fp = self.drivers.fingerprint(&name);
                berth_api::nodes::DriverState {
                    healthy: fp.as_ref().is_some_and(|f| f.health == Health::Healthy),
                    description: fp.map(|f| f.description).unwrap_or_default(),
                    name,
                }
            })
            .collect()
    }

    /// Waits until every driver has fingerprinted once (each fingerprint is bounded by the
    /// drivers' timeout) or the agent shuts down.
    pub async fn drivers_ready(&self) {
        self.drivers.ready().await;
    }

    /// Parses a job request. With `node_checks`, the spec is checked against this node (its
    /// drivers, attributes and meta); a fleet's job is checked when placed, per node.
    pub async fn parse(&self, req: &JobRunRequest, node_checks: bool) -> Result<JobSpec, ApiError> {
        let file = PathBuf::from(req.file.clone().unwrap_or_else(|| "request body".into()));
        // Drivers are known once fingerprinted.
        tokio::select! {
            () = self.drivers.ready() => {}
            () = self.shutdown.cancelled() => {
                return Err(ApiError::Unavailable("the agent is shutting down".into()));
            }
        }
        let node = self.node_vars();
        let opts = ParseOptions {
            vars: req
                .vars
                .iter()
                .map(|v| (v.name.clone(), v.value.clone()))
                .collect(),
            var_files: req
                .var_files
                .iter()
                .map(|f| VarFile {
                    name: PathBuf::from(&f.name),
                    text: f.text.clone(),
                })
                .collect(),
            drivers: node_checks.then(|| self.drivers.driver_names().into_iter().collect()),
            node: node_checks.then(|| NodeKeys {
                attrs: node.attrs.keys().cloned().collect(),
                meta: node.meta.keys().cloned().collect(),
            }),
        };
        let syntax = match req.format {
            SpecFormat::Hcl => Syntax::Hcl,
            SpecFormat::Json => Syntax::Json,
        };
        JobSpec::parse_with(&file, &req.spec, syntax, &opts)
            .map_err(|e| ApiError::BadRequest(e.to_string()))
    }

    /// `POST /v1/jobs`: parses, places (all or nothing) and starts the job's allocs. The
    /// spec is checked against this node (its drivers, attributes and meta), and its `${…}`
    /// references are filled for each alloc, before anything is written: every problem is
    /// answered at once, with its line.
    pub async fn run(self: &Arc<Self>, req: JobRunRequest) -> Result<JobStatus, ApiError> {
        let file = PathBuf::from(req.file.clone().unwrap_or_else(|| "request body".into()));
        let spec = self.parse(&req, true).await?;
        let _placing = self.placing.lock().await;
        // A job whose allocs all ended (or were never written: a crash right after the job
        // record) may run again; one with a live alloc must be stopped first.
        if let Some(old) = self.load(&spec.id)?
            && !old.stopped
            && old.allocs.iter().any(|a| {
                self.alloc_status(a)
                    .is_some_and(|st| !st.client_status.is_terminal())
            })
        {
            return Err(ApiError::Conflict(format!(
                "job {:?} is already running; stop it first",
                spec.id
            )));
        }
        let facts = self.node_facts();
        let job_id = spec.id.clone();
        let plans = placement::place(
            &spec,
            &facts,
            |id| self.volumes.catalog_volume(id),
            |group, index| {
                let tasks: Vec<&str> = spec
                    .groups
                    .iter()
                    .filter(|g| g.name == group)
                    .flat_map(|g| g.tasks.iter().map(|t| t.name.as_str()))
                    .collect();
                alloc_id(&job_id, group, index, &tasks)
            },
        );
        let plans = match plans {
            Ok(p) => p,
            Err(e) => {
                // Every reason at once: the devices' too.
                let mut reasons: Vec<String> = e.refusals.iter().map(ToString::to_string).collect();
                reasons.extend(self.device_reasons(&spec).await);
                return Err(ApiError::BadRequest(format!(
                    "job {:?} cannot be placed: {}",
                    spec.id,
                    reasons.join("; ")
                )));
            }
        };
        let mut specs = self.render(&spec, &plans, &file)?;
        self.place_devices(&spec.id, &mut specs).await?;
        let placed: Vec<String> = specs.iter().map(|s| s.alloc_id.clone()).collect();
        let release = |devices: &DeviceManager| {
            for a in &placed {
                devices.release(a);
            }
        };
        let rec = JobRecord {
            spec,
            stopped: false,
            allocs: plans.iter().map(|p| p.alloc_id.clone()).collect(),
        };
        if let Err(e) = self.save(&job_id, &rec) {
            release(&self.devices);
            return Err(e);
        }
        // The devices chosen are persisted with the allocs, before any task starts.
        let runners = match AllocRunner::new_all(specs, self.deps.clone()) {
            Ok(r) => r,
            Err(e) => {
                release(&self.devices);
                return Err(ApiError::Internal(e.to_string()));
            }
        };
        for runner in runners {
            self.add_hooks(&runner);
            self.spawn_runner(runner);
        }
        tracing::info!(job_id, allocs = rec.allocs.len(), "job placed");
        self.publish_job("JobRegistered", &rec);
        Ok(self.status_of(&rec))
    }

    /// The alloc specs of `plans` for this node: `${…}` references filled, and checked as
    /// the runner will (ids short enough to be paths). Every problem at once, with its line.
    fn render(
        &self,
        spec: &JobSpec,
        plans: &[placement::AllocPlan],
        file: &std::path::Path,
    ) -> Result<Vec<AllocSpec>, ApiError> {
        let node = self.node_vars();
        let mut specs = Vec::new();
        let mut problems = Vec::new();
        // The rendering helpers hold non-Sync closures: dropped before the next await.
        {
            let plugins_dir = self.plugins.data_dir.clone();
            let drivers = self.drivers.clone();
            let chroot = move |driver: &str| {
                drivers.driver(driver).is_some_and(|d| {
                    d.capabilities().fs_isolation == berth_drivers::FsIsolation::Chroot
                })
            };
            let binds = {
                let drivers = self.drivers.clone();
                move |driver: &str| {
                    drivers
                        .driver(driver)
                        .is_some_and(|d| d.capabilities().bind_mounts)
                }
            };
            let csi_endpoint =
                |alloc_id: &str, task: &berth_job::TaskSpec, mount_dir: &std::path::Path| {
                    if binds(&task.driver) {
                        format!("unix://{}", mount_dir.join("csi.sock").display())
                    } else {
                        let plan = task.csi_plugin.as_ref().and_then(|p| {
                            PluginPlan::new(&plugins_dir, alloc_id, &task.name, p).ok()
                        });
                        plan.map(|p| format!("unix://{}", p.socket.display()))
                            .unwrap_or_default()
                    }
                };
            let env = RenderEnv {
                node: &node,
                allocs_dir: &self.deps.allocs_dir,
                chroot: &chroot,
                csi_endpoint: &csi_endpoint,
            };
            for p in plans {
                let alloc = AllocSpec::from_job(spec, &p.group, p.alloc_id.clone(), p.index)
                    .map_err(|e| ApiError::Internal(e.to_string()))?;
                let alloc = match render_alloc(spec, &alloc, &env) {
                    Ok(a) => a,
                    Err(errors) => {
                        // Every alloc of a group renders alike but for its index: one report.
                        for e in errors {
                            let line = e.line.map(|l| format!(":{l}")).unwrap_or_default();
                            let text = format!(
                                "{}{line}: {e}",
                                berth_input::Shown(&file.to_string_lossy())
                            );
                            if !problems.contains(&text) {
                                problems.push(text);
                            }
                        }
                        continue;
                    }
                };
                // What would make the runner refuse it (ids too long to be paths) is refused
                // here, before anything is written.
                AllocRunner::check(&alloc).map_err(|e| {
                    ApiError::BadRequest(format!(
                        "group {:?}: {e} (a task's id is `<alloc id>.<task name>`; shorten the names)",
                        p.group
                    ))
                })?;
                specs.push(alloc);
            }
        }
        if !problems.is_empty() {
            return Err(ApiError::BadRequest(problems.join("\n")));
        }
        Ok(specs)
    }

    /// Why the devices `spec` asks for could not be placed now (nothing is taken): for a job
    /// refused for other reasons.
    async fn device_reasons(&self, spec: &JobSpec) -> Vec<String> {
        let allocs: Vec<(String, &berth_job::GroupSpec, u32)> = spec
            .groups
            .iter()
            .flat_map(|g| (0..g.count).map(move |i| (format!("{}[{i}]", g.name), g, i)))
            .collect();
        let places = device_places(allocs.iter().map(|(id, g, i)| (id.as_str(), *g, *i)));
        self.devices.check(&task_requests(&places)).await
    }

    /// Chooses and takes the devices of every task of every alloc in `specs` (all or
    /// nothing), and writes them into the specs. A request that cannot be met refuses the job
    /// with every reason; nothing is taken then.
    async fn place_devices(&self, job_id: &str, specs: &mut [AllocSpec]) -> Result<(), ApiError> {
        let chosen = {
            let places = device_places(
                specs
                    .iter()
                    .map(|s| (s.alloc_id.as_str(), &s.group, s.index)),
            );
            if places.is_empty() {
                return Ok(());
            }
            self.devices
                .place(&task_requests(&places))
                .await
                .map_err(|reasons| {
                    ApiError::BadRequest(format!(
                        "job {job_id:?} cannot be placed: {}",
                        reasons.join("; ")
                    ))
                })?
        };
        for ((alloc_id, task), assignments) in chosen {
            if let Some(spec) = specs.iter_mut().find(|s| s.alloc_id == alloc_id) {
                spec.devices.insert(task, assignments);
            }
        }
        Ok(())
    }

    /// `DELETE /v1/job/{id}`: stops every alloc of the job (tasks stop, then volumes are
    /// released in order); answers at once with the allocs stopping.
    pub async fn stop(&self, id: &str) -> Result<JobStatus, ApiError> {
        let _placing = self.placing.lock().await;
        let mut rec = self
            .load(id)?
            .ok_or_else(|| ApiError::NotFound(format!("no job {id:?}")))?;
        rec.stopped = true;
        self.save(id, &rec)?;
        let runners = self
            .runners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for a in &rec.allocs {
            if let Some(r) = runners.get(a) {
                r.stop();
            }
        }
        self.publish_job("JobDeregistered", &rec);
        Ok(self.status_of(&rec))
    }

    /// Stops every job and waits, up to `timeout`, until every alloc is finished (tasks dead,
    /// volumes released). Returns whether they all finished in time. For `--dev`, whose data
    /// dir goes away with the agent: nothing could recover those tasks afterwards.
    pub async fn stop_all(&self, timeout: std::time::Duration) -> bool {
        let ids: Vec<String> = match self.store.list::<JobRecord>(Table::JOBS) {
            Ok(list) => list.into_iter().map(|(id, _)| id).collect(),
            Err(e) => {
                tracing::error!(error = %e, "cannot list the jobs to stop");
                return false;
            }
        };
        for id in &ids {
            if let Err(e) = self.stop(id).await {
                tracing::warn!(job_id = %id, error = %e, "cannot stop the job");
            }
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let runners = self.all_runners();
            if runners
                .iter()
                .all(|r| r.status().client_status.is_terminal())
            {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// Publishes a `Job` event about `rec` (its id, type and allocs; never its spec).
    fn publish_job(&self, kind: &str, rec: &JobRecord) {
        self.events.publish(
            berth_api::stream::Topic::Job,
            kind,
            &rec.spec.id,
            Vec::new(),
            serde_json::json!({ "Job": {
                "ID": rec.spec.id,
                "Type": rec.spec.job_type.as_str(),
                "Stopped": rec.stopped,
                "Allocs": rec.allocs,
            }}),
        );
    }

    /// `GET /v1/job/{id}`.
    pub fn status(&self, id: &str) -> Result<JobStatus, ApiError> {
        let rec = self
            .load(id)?
            .ok_or_else(|| ApiError::NotFound(format!("no job {id:?}")))?;
        Ok(self.status_of(&rec))
    }

    /// `GET /v1/jobs`.
    pub fn list(&self) -> Result<JobList, ApiError> {
        let jobs = self
            .store
            .list::<JobRecord>(Table::JOBS)
            .map_err(|e| ApiError::Internal(e.to_string()))?
            .into_iter()
            .map(|(_, rec)| {
                let mut allocs: BTreeMap<String, usize> = BTreeMap::new();
                for a in rec.allocs.iter().filter_map(|a| self.alloc_status(a)) {
                    *allocs
                        .entry(a.client_status.as_str().to_string())
                        .or_default() += 1;
                }
                JobSummary {
                    id: rec.spec.id.clone(),
                    job_type: rec.spec.job_type.as_str().to_string(),
                    stopped: rec.stopped,
                    allocs,
                }
            })
            .collect();
        Ok(JobList { jobs })
    }

    /// `GET /v1/alloc/{id}`: with the latest statistic of every device its tasks hold.
    pub fn alloc(&self, id: &str) -> Result<AllocStatus, ApiError> {
        let mut status = self
            .alloc_status(id)
            .ok_or_else(|| ApiError::NotFound(format!("no alloc {id:?}")))?;
        self.add_device_stats(std::slice::from_mut(&mut status));
        Ok(status)
    }

    /// `GET /v1/alloc/{id}/stats`: each running task's use, as its driver reads it now. A task
    /// that is not running, or whose driver cannot read it (it exited meanwhile), is left out.
    pub async fn alloc_stats(&self, id: &str) -> Result<AllocStats, ApiError> {
        let status = self
            .alloc_status(id)
            .ok_or_else(|| ApiError::NotFound(format!("no alloc {id:?}")))?;
        let mut tasks = BTreeMap::new();
        for (name, task) in &status.tasks {
            if task.state != TaskRunState::Running {
                continue;
            }
            let (Some(driver), Ok(task_id)) = (
                self.drivers.driver(&task.driver),
                TaskId::for_alloc(&status.alloc_id, name),
            ) else {
                continue;
            };
            match driver.stats(&task_id).await {
                Ok(s) => {
                    tasks.insert(
                        name.clone(),
                        TaskUsage {
                            cpu_seconds: s.cpu_time().as_secs_f64(),
                            rss_bytes: s.rss_bytes,
                            pids: s.pids.len(),
                        },
                    );
                }
                Err(e) => {
                    tracing::debug!(alloc = %status.alloc_id, task = %name, "no stats: {e}");
                }
            }
        }
        Ok(AllocStats {
            alloc_id: status.alloc_id,
            tasks,
        })
    }
}

/// Where each task with `device` blocks stands, for placement reasons: `(alloc id, task,
/// "group g (alloc i of n), task t")`, for allocs given as `(alloc id, group, index)`.
fn device_places<'a>(
    allocs: impl Iterator<Item = (&'a str, &'a berth_job::GroupSpec, u32)>,
) -> Vec<(&'a str, &'a berth_job::TaskSpec, String)> {
    let mut out = Vec::new();
    for (alloc_id, group, index) in allocs {
        for task in group.tasks.iter().filter(|t| !t.devices.is_empty()) {
            let mut place = format!("group {}", group.name);
            if group.count > 1 {
                place.push_str(&format!(" (alloc {index} of {})", group.count));
            }
            place.push_str(&format!(", task {}", task.name));
            out.push((alloc_id, task, place));
        }
    }
    out
}

/// The device manager's view of [`device_places`].
fn task_requests<'a>(
    places: &'a [(&'a str, &'a berth_job::TaskSpec, String)],
) -> Vec<TaskRequests<'a>> {
    places
        .iter()
        .map(|(alloc_id, task, place)| TaskRequests {
            alloc_id,
            task: &task.name,
            at: place,
            requests: &task.devices,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_ids_are_path_segments_even_for_long_names() {
        let id = alloc_id("web", "app", 3, &["server"]);
        assert!(id.starts_with("web-app-3-"), "{id}");
        let long = "j".repeat(120);
        let id = alloc_id(&long, "g", 0, &["t"]);
        assert_eq!(id.len(), 32);
        berth_sys::validate_path_segment("alloc id", &id).unwrap();
        // Room for the longest task's id too.
        let job = "j".repeat(60);
        let task = "t".repeat(60);
        let id = alloc_id(&job, "g", 0, &["a", &task]);
        assert_eq!(id.len(), 32);
        TaskId::for_alloc(&id, &task).unwrap();
    }
}
