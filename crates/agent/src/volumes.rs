//! Volumes on this node: the embedded control plane, one volume manager per node plugin, and
//! the claim and release paths that join them.
//!
//! A claim: the control plane grants it (persisted `claiming`), runs ControllerPublishVolume
//! when the plugin needs it, then the node's volume manager stages (once per usage) and
//! publishes, and the claim becomes `claimed`. A failed claim is released again.
//!
//! A release: the claim is marked `releasing` (persisted), the node unpublishes (and unstages
//! when no alloc uses the usage any more), then the control plane runs ControllerUnpublishVolume
//! when no other claim from this node remains, then frees the claim. A failed step keeps the
//! claim `releasing` and is retried in the background with backoff; the controller step never
//! runs before the node steps have succeeded (rule 4).
//!
//! At start (and when a node plugin becomes usable) each plugin's records are reconciled with
//! the mount table, then every claim of this node is driven to its end: `claiming` → mounted,
//! `claimed` → left mounted, `releasing` → released; and allocs that the node still publishes
//! without a claim are unmounted.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use berth_api::{
    EventKind,
    server::{ApiError, SpecOp},
    volumes::{
        CapabilityView, ClaimRequest, ClaimResponse, ClaimState as ApiClaimState, ClaimView,
        DetachRequest, DetachResponse, ExpandRequest, ExpandResponse, MountOptionsView,
        PublishedView, ReleaseRequest, ReleaseResponse, SnapshotCreateRequest,
        SnapshotDeleteRequest, SnapshotList, SnapshotView, SpecFormat, UsageView, VolumeList,
        VolumeOrigin, VolumeSpecRequest, VolumeStatus, VolumeSummary,
    },
};
use berth_controlplane::{
    Claim, ClaimMode, ClaimRecord, ClaimState, ControlPlane, ControlPlaneError, ControllerAccess,
    ControllerHandle, Controllers, Embedded, NodeClaim, Origin, VolumeRecord,
};
use berth_csi::{
    CapacityRange, CsiClient, Endpoint,
    model::{MountFlags, MountOptions, NodeCapabilities, Secrets},
};
use berth_state::{KeyedLocks, Store, Table};
use berth_volume::{
    Operation, PluginDir, Usage, VolumeSpec, check_mount_flags, merge_mount_options,
};
use berth_volumemgr::{
    MountRequest, ProcMountTable, PublishState, StageState, Step, StepHook, VolumeError,
    VolumeManager,
};
use tokio::sync::OnceCell;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::{events::EventBus, manager::Manager, metrics::Metrics, registry::Registry};

/// How long a claim waits for the volume's node plugin to become healthy.
const PLUGIN_WAIT: Duration = Duration::from_secs(30);
/// Background retries of a failed release: first and longest wait.
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// The env var that names a step at which the agent kills itself (SIGKILL), for crash tests:
/// `NodeStageVolume:before`, `ControllerPublishVolume:after`, … (`<Rpc>:before|after`), or
/// `claim:persisted` / `release:persisted`.
pub const CRASH_ENV: &str = "BERTH_TEST_CRASH_AT";

/// Kills the process at the named step.
#[derive(Debug, Clone)]
pub struct CrashHook {
    at: String,
}

impl CrashHook {
    /// From [`CRASH_ENV`], if set.
    pub fn from_env() -> Option<Arc<Self>> {
        let at = std::env::var(CRASH_ENV).ok().filter(|s| !s.is_empty())?;
        tracing::warn!(step = %at, "crash hook armed: the agent will kill itself at this step");
        Some(Arc::new(Self { at }))
    }

    fn hit(&self, step: &str) {
        if step == self.at {
            tracing::error!(step, "crash hook: killing the agent");
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        }
    }
}

impl StepHook for CrashHook {
    fn at(&self, step: Step) {
        self.hit(&step.to_string());
    }
}

/// The controller side of plugins, from the registry and the health loops.
#[derive(Debug)]
pub struct AgentControllers {
    registry: Arc<Registry>,
    manager: Arc<Manager>,
    clients: Arc<ClientCache>,
}

/// One CSI client per socket, shared by every volume operation (so connections are reused).
#[derive(Debug)]
pub struct ClientCache {
    clients: Mutex<HashMap<PathBuf, CsiClient>>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
}

impl ClientCache {
    fn get(&self, plugin_id: &str, socket: &std::path::Path) -> Option<CsiClient> {
        let mut map = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = map.get(socket) {
            return Some(c.clone());
        }
        let endpoint = Endpoint::from_path(socket).ok()?;
        let client = CsiClient::builder(endpoint)
            .cancellation(self.cancel.clone())
            .observer(self.metrics.observer(plugin_id))
            .build();
        map.insert(socket.to_path_buf(), client.clone());
        Some(client)
    }
}

impl Controllers for AgentControllers {
    fn controller(&self, plugin_id: &str) -> ControllerAccess {
        let records = self.registry.instances(plugin_id);
        if records.is_empty() {
            return ControllerAccess::UnknownPlugin;
        }
        let mut why = None;
        for r in records.iter().filter(|r| r.plugin_type.is_controller()) {
            let state = self.manager.state(&r.id, &r.instance);
            match state {
                Some(s) if s.health.healthy => {
                    if let (Some(caps), Some(client)) = (
                        s.fingerprint.and_then(|f| f.controller_capabilities),
                        self.clients.get(plugin_id, &r.socket),
                    ) {
                        return ControllerAccess::Healthy(ControllerHandle {
                            client,
                            capabilities: caps,
                        });
                    }
                }
                Some(s) => {
                    why.get_or_insert(format!("instance {}: {}", r.instance, s.health.description));
                }
                None => {
                    why.get_or_insert(format!("instance {}: not checked yet", r.instance));
                }
            }
        }
        match why {
            None if !records.iter().any(|r| r.plugin_type.is_controller()) => {
                ControllerAccess::NodeOnly
            }
            None => ControllerAccess::Unhealthy("no fingerprint yet".into()),
            Some(w) => ControllerAccess::Unhealthy(w),
        }
    }
}

/// A node plugin's volume manager and what the claims need of it.
struct NodePlugin {
    manager: VolumeManager,
    csi_node_id: String,
    caps: NodeCapabilities,
    /// The instance's socket: a new active instance gets a new manager (and a recovery).
    socket: PathBuf,
}

/// Volumes on this node; see the module docs.
pub struct Volumes {
    cp: Embedded<AgentControllers>,
    node_id: String,
    data_dir: PathBuf,
    store: Arc<Store>,
    registry: Arc<Registry>,
    manager: Arc<Manager>,
    events: Arc<EventBus>,
    clients: Arc<ClientCache>,
    nodes: Mutex<HashMap<String, Arc<OnceCell<Arc<NodePlugin>>>>>,
    /// Serializes the claim and the release of one (volume, alloc). Always taken after the
    /// node plugin is ready (never while waiting for it: its recovery takes these locks).
    alloc_locks: KeyedLocks,
    retrying: Mutex<HashSet<(String, String)>>,
    hook: Option<Arc<CrashHook>>,
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

impl std::fmt::Debug for Volumes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Volumes")
            .field("node_id", &self.node_id)
            .finish_non_exhaustive()
    }
}

fn cp_error(e: ControlPlaneError) -> ApiError {
    match e {
        ControlPlaneError::NoVolume(_) => ApiError::NotFound(e.to_string()),
        ControlPlaneError::Invalid(_) => ApiError::BadRequest(e.to_string()),
        ControlPlaneError::Refused { .. } | ControlPlaneError::Conflict(_) => {
            ApiError::Conflict(e.to_string())
        }
        ControlPlaneError::Unavailable { .. } => ApiError::Unavailable(e.to_string()),
        ControlPlaneError::Csi { .. } | ControlPlaneError::Store(_) => {
            ApiError::Internal(error_chain(&e))
        }
    }
}

fn vol_error(e: &VolumeError) -> ApiError {
    match e {
        VolumeError::InvalidPath { .. } => ApiError::BadRequest(error_chain(e)),
        VolumeError::Conflict { .. } => ApiError::Conflict(error_chain(e)),
        _ => ApiError::Internal(error_chain(e)),
    }
}

/// An error and its sources, `: `-joined. Every error in these chains is already free of
/// secrets and mount flags.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        src = s.source();
    }
    out
}

/// How long a volume status waits for one target's NodeGetVolumeStats.
const STATS_TIMEOUT: Duration = Duration::from_secs(2);

/// The next wait of a background retry: doubled, at most [`RETRY_MAX`].
fn next_wait(wait: Duration) -> Duration {
    (wait * 2).min(RETRY_MAX)
}

/// The key of an alloc's lock on a volume.
fn alloc_key(volume_id: &str, alloc_id: &str) -> String {
    format!("{volume_id}/{alloc_id}")
}

/// A failed step of a claim or release, for the background retry.
#[derive(Debug)]
enum StepError {
    Cp(ControlPlaneError),
    Node(VolumeError),
    Api(ApiError),
}

impl StepError {
    fn text(&self) -> String {
        match self {
            Self::Cp(e) => error_chain(e),
            Self::Node(e) => error_chain(e),
            Self::Api(e) => e.to_string(),
        }
    }

    /// Whether trying again may help.
    fn is_retryable(&self) -> bool {
        match self {
            Self::Cp(ControlPlaneError::Unavailable { .. } | ControlPlaneError::Store(_)) => true,
            Self::Cp(ControlPlaneError::Csi { source, .. }) => source.is_retryable(),
            Self::Cp(_) => false,
            Self::Node(VolumeError::Csi { source, .. }) => source.is_retryable(),
            Self::Node(
                VolumeError::Cancelled { .. }
                | VolumeError::Store { .. }
                | VolumeError::Dir { .. }
                | VolumeError::MountTable(_),
            ) => true,
            Self::Node(_) => false,
            Self::Api(e) => matches!(e, ApiError::Unavailable(_) | ApiError::Internal(_)),
        }
    }

    fn into_api(self) -> ApiError {
        match self {
            Self::Cp(e) => cp_error(e),
            Self::Node(e) => vol_error(&e),
            Self::Api(e) => e,
        }
    }
}

impl Volumes {
    /// Volumes over the agent's store and plugins. Nothing runs until [`Volumes::start`].
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Arc<Store>,
        node_id: String,
        data_dir: PathBuf,
        registry: Arc<Registry>,
        manager: Arc<Manager>,
        events: Arc<EventBus>,
        metrics: Arc<Metrics>,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) -> Self {
        let clients = Arc::new(ClientCache {
            clients: Mutex::new(HashMap::new()),
            metrics,
            cancel: shutdown.clone(),
        });
        let hook = CrashHook::from_env();
        let mut cp = Embedded::new(
            Arc::clone(&store),
            AgentControllers {
                registry: Arc::clone(&registry),
                manager: Arc::clone(&manager),
                clients: Arc::clone(&clients),
            },
        );
        if let Some(h) = &hook {
            let h = Arc::clone(h);
            cp = cp.with_hook(Arc::new(move |step: &str| h.hit(step)));
        }
        Self {
            cp,
            node_id,
            data_dir,
            store,
            registry,
            manager,
            events,
            clients,
            nodes: Mutex::new(HashMap::new()),
            alloc_locks: KeyedLocks::default(),
            retrying: Mutex::new(HashSet::new()),
            hook,
            tasks,
            shutdown,
        }
    }

    /// Starts the recovery of every node plugin that has volume state on this node: each one
    /// is reconciled as soon as it is healthy (retried until it is, or until shutdown).
    pub fn start(self: &Arc<Self>) {
        let mut plugins: std::collections::BTreeSet<String> = self
            .store
            .list::<berth_volumemgr::UsageRecord>(berth_state::Table::USAGES)
            .map(|l| l.into_iter().map(|(_, r)| r.plugin_id).collect())
            .unwrap_or_default();
        if let Ok(claims) = self.cp.node_claims(&self.node_id) {
            plugins.extend(claims.into_iter().map(|(v, _)| v.plugin_id));
        }
        for plugin_id in plugins {
            let this = Arc::clone(self);
            self.tasks.spawn(async move {
                let mut wait = RETRY_FIRST;
                loop {
                    match this.node_plugin(&plugin_id).await {
                        Ok(_) => return,
                        Err(e) => {
                            tracing::warn!(plugin = %plugin_id, error = %e, "volume recovery waits for the plugin");
                        }
                    }
                    if !this.pause(wait).await {
                        return;
                    }
                    wait = next_wait(wait);
                }
            });
        }
    }

    /// Waits `delay`, or until the agent stops (then `false`): the pause of every background
    /// retry loop here.
    async fn pause(&self, delay: Duration) -> bool {
        tokio::select! {
            biased;
            () = self.shutdown.cancelled() => false,
            () = tokio::time::sleep(delay) => true,
        }
    }

    /// The node plugin's volume manager, created (and its state recovered) the first time: waits
    /// up to [`PLUGIN_WAIT`] for a healthy node instance.
    async fn node_plugin(self: &Arc<Self>, plugin_id: &str) -> Result<Arc<NodePlugin>, ApiError> {
        let active = self.active_node_socket(plugin_id);
        let cell = {
            let mut map = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
            let cell = map.entry(plugin_id.to_string()).or_default();
            // Another instance is active now (a restart behind a new socket, a rolling update):
            // a fresh manager for it, recovered again.
            if let (Some(p), Some(active)) = (cell.get(), &active)
                && &p.socket != active
            {
                tracing::info!(plugin = plugin_id, socket = %active.display(), "node plugin instance changed; recovering its volumes again");
                *cell = Arc::default();
            }
            Arc::clone(cell)
        };
        let plugin = cell
            .get_or_try_init(|| self.init_node_plugin(plugin_id))
            .await?;
        Ok(Arc::clone(plugin))
    }

    async fn init_node_plugin(
        self: &Arc<Self>,
        plugin_id: &str,
    ) -> Result<Arc<NodePlugin>, ApiError> {
        let (record, fp) = self.wait_healthy_node(plugin_id).await?;
        let caps = fp.node_capabilities.clone().unwrap_or_default();
        let csi_node_id = fp
            .node_info
            .as_ref()
            .map(|i| i.node_id.clone())
            .unwrap_or_default();
        let client = self
            .clients
            .get(plugin_id, &record.socket)
            .ok_or_else(|| ApiError::Internal(format!("plugin {plugin_id:?}: bad socket path")))?;
        let dir: PluginDir = record
            .plugin_type
            .as_str()
            .parse()
            .map_err(ApiError::Internal)?;
        let mut manager = VolumeManager::new(
            Arc::clone(&self.store),
            client,
            plugin_id,
            dir,
            &self.data_dir,
            caps.clone(),
            Arc::new(ProcMountTable::current()),
        )
        .map_err(|e| vol_error(&e))?;
        if let Some(h) = &self.hook {
            manager = manager.with_hook(Arc::clone(h) as Arc<dyn StepHook>);
        }
        if let Some(view) = &record.plugin_view {
            manager = manager.with_plugin_view(view);
        }
        let plugin = Arc::new(NodePlugin {
            manager,
            csi_node_id,
            caps,
            socket: record.socket.clone(),
        });
        self.recover(plugin_id, &plugin).await;
        Ok(plugin)
    }

    /// The socket of the plugin's healthy node instance, newest first.
    fn active_node_socket(&self, plugin_id: &str) -> Option<PathBuf> {
        self.registry
            .instances(plugin_id)
            .into_iter()
            .filter(|r| r.plugin_type.is_node())
            .find(|r| {
                self.manager
                    .state(&r.id, &r.instance)
                    .is_some_and(|s| s.health.healthy)
            })
            .map(|r| r.socket)
    }

    /// Whether this node has usage records of the volume under the plugin.
    fn node_has_records(&self, plugin_id: &str, volume_id: &str) -> bool {
        self.store
            .list_prefix::<berth_volumemgr::UsageRecord>(
                Table::USAGES,
                &format!("{plugin_id}/{volume_id}/"),
            )
            .is_ok_and(|l| !l.is_empty())
    }

    /// The node plugin when the node holds something of the volume (waiting for the plugin),
    /// else the one already running, if any.
    async fn node_plugin_for(
        self: &Arc<Self>,
        vol: &VolumeRecord,
    ) -> Result<Option<Arc<NodePlugin>>, ApiError> {
        if self.node_has_records(&vol.plugin_id, &vol.id) {
            return self.node_plugin(&vol.plugin_id).await.map(Some);
        }
        Ok(self.existing_node_plugin(&vol.plugin_id))
    }

    /// Every secret value and mount flag of the volume and its claims: what error text must
    /// not show.
    fn sensitive(&self, volume_id: &str) -> Vec<String> {
        let Ok(Some(v)) = self.cp.volume(volume_id) else {
            return Vec::new();
        };
        let mut out: Vec<String> = v
            .secrets
            .to_secrets()
            .values()
            .map(str::to_string)
            .collect();
        out.extend(v.mount_options.mount_flags.iter().cloned());
        for c in v.claims.values() {
            out.extend(c.mount_options.mount_flags.iter().cloned());
        }
        out
    }

    /// An error's text, scrubbed of the volume's secrets and mount flags.
    fn scrubbed(&self, volume_id: &str, e: &StepError) -> String {
        berth_csi::sanitize(&e.text(), &self.sensitive(volume_id))
    }

    /// The API error for a failed step, its text scrubbed.
    fn api_error(&self, volume_id: &str, e: StepError) -> ApiError {
        let text = self.scrubbed(volume_id, &e);
        match e.into_api() {
            ApiError::BadRequest(_) => ApiError::BadRequest(text),
            ApiError::NotFound(_) => ApiError::NotFound(text),
            ApiError::Conflict(_) => ApiError::Conflict(text),
            ApiError::Unprocessable(_) => ApiError::Unprocessable(text),
            ApiError::Internal(_) => ApiError::Internal(text),
            ApiError::Unavailable(_) => ApiError::Unavailable(text),
        }
    }

    /// Runs `f` as a task of the agent and waits for it: the operation goes on to its end (or to
    /// a persisted intent) even when the API caller goes away.
    pub async fn detached<T, F, Fut>(self: &Arc<Self>, f: F) -> Result<T, ApiError>
    where
        F: FnOnce(Arc<Self>) -> Fut,
        Fut: std::future::Future<Output = Result<T, ApiError>> + Send + 'static,
        T: Send + 'static,
    {
        let fut = f(Arc::clone(self));
        self.tasks
            .spawn(fut)
            .await
            .map_err(|e| ApiError::Internal(format!("volume operation failed: {e}")))?
    }

    /// The active healthy node instance of the plugin and its fingerprint.
    async fn wait_healthy_node(
        &self,
        plugin_id: &str,
    ) -> Result<(crate::registry::PluginRecord, berth_api::Fingerprint), ApiError> {
        let deadline = tokio::time::Instant::now() + PLUGIN_WAIT;
        loop {
            // Subscribe before looking, so a transition in between wakes us.
            let mut rx = self.events.subscribe();
            let mut why = format!("no plugin {plugin_id:?} is registered");
            for r in self
                .registry
                .instances(plugin_id)
                .into_iter()
                .filter(|r| r.plugin_type.is_node())
            {
                match self.manager.state(&r.id, &r.instance) {
                    Some(s) if s.health.healthy && s.fingerprint.is_some() => {
                        let fp = s.fingerprint.unwrap_or_else(|| unreachable!());
                        return Ok((r, fp));
                    }
                    Some(s) => {
                        why = format!(
                            "node plugin {plugin_id:?} is not healthy: {}",
                            s.health.description
                        )
                    }
                    None => why = format!("node plugin {plugin_id:?} is not checked yet"),
                }
            }
            tokio::select! {
                () = self.shutdown.cancelled() => {
                    return Err(ApiError::Unavailable("the agent is shutting down".into()));
                }
                () = tokio::time::sleep_until(deadline) => {
                    return Err(ApiError::Unavailable(why));
                }
                _ = rx.recv() => {}
            }
        }
    }

    /// Reconciles the plugin's records with the mount table, then drives every claim of this
    /// node on its volumes to its end (`claiming` and `claimed` → mounted, `releasing` →
    /// released), unmounts allocs published without a claim and releases unused usages.
    /// Runs inside the plugin's initialization: it uses `plugin` directly, never
    /// [`Volumes::node_plugin`].
    async fn recover(self: &Arc<Self>, plugin_id: &str, plugin: &Arc<NodePlugin>) {
        let cp = &self.cp;
        let secrets = |volume_id: &str| {
            cp.volume(volume_id)
                .ok()
                .flatten()
                .map(|v| v.secrets.to_secrets())
                .unwrap_or_default()
        };
        let report = plugin.manager.reconcile(&secrets).await;
        for a in &report.actions {
            tracing::info!(plugin = plugin_id, action = ?a, "reconciled");
        }
        for e in &report.errors {
            tracing::warn!(plugin = plugin_id, error = %error_chain(e), "reconcile failed for a record");
        }
        let claims = match self.cp.node_claims(&self.node_id) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the claims of this node");
                return;
            }
        };
        let mut claimed: HashSet<(String, String)> = HashSet::new();
        for (vol, recs) in claims.into_iter().filter(|(v, _)| v.plugin_id == plugin_id) {
            for c in recs {
                let alloc_id = c.claim.alloc_id.clone();
                claimed.insert((vol.id.clone(), alloc_id.clone()));
                match c.state {
                    ClaimState::Claiming | ClaimState::Claimed => {
                        let _lock = self.alloc_locks.lock(&alloc_key(&vol.id, &alloc_id)).await;
                        if let Err(e) = self.drive_claim(plugin, &vol.id, &c).await {
                            let text = self.scrubbed(&vol.id, &e);
                            tracing::warn!(volume_id = %vol.id, alloc_id, error = %text, "cannot finish an interrupted claim; retrying");
                            self.note_failure(&vol.id, &alloc_id, &text).await;
                            self.drive_in_background(vol.id.clone(), alloc_id);
                        }
                    }
                    ClaimState::Releasing => {
                        self.release_in_background(vol.id.clone(), alloc_id, Duration::ZERO);
                    }
                }
            }
        }
        let volumes: std::collections::BTreeSet<String> = plugin
            .manager
            .records()
            .map(|r| r.into_iter().map(|r| r.volume_id).collect())
            .unwrap_or_default();
        for volume_id in volumes {
            if let Err(e) = self.clean_node(plugin, &volume_id, &claimed).await {
                tracing::warn!(volume_id, error = %error_chain(&e), "cannot clean up the node's usages; retrying");
                self.clean_in_background(plugin_id.to_string(), volume_id);
            }
        }
    }

    /// Unmounts the allocs of the volume that the node publishes without a claim, and releases
    /// the usages no alloc uses.
    async fn clean_node(
        &self,
        plugin: &NodePlugin,
        volume_id: &str,
        claimed: &HashSet<(String, String)>,
    ) -> Result<(), VolumeError> {
        let allocs = plugin.manager.allocs()?;
        for alloc_id in allocs.get(volume_id).into_iter().flatten() {
            if !claimed.contains(&(volume_id.to_string(), alloc_id.clone())) {
                tracing::info!(volume_id, alloc_id, "unmounting an alloc without a claim");
                plugin.manager.unmount(volume_id, alloc_id).await?;
            }
        }
        plugin.manager.release_unused(volume_id).await.map(drop)
    }

    /// Retries [`Volumes::clean_node`] with backoff until it succeeds or the agent stops.
    fn clean_in_background(self: &Arc<Self>, plugin_id: String, volume_id: String) {
        let this = Arc::clone(self);
        self.tasks.spawn(async move {
            let mut wait = RETRY_FIRST;
            loop {
                if !this.pause(wait).await {
                    return;
                }
                wait = next_wait(wait);
                let Ok(plugin) = this.node_plugin(&plugin_id).await else {
                    continue;
                };
                let claimed: HashSet<(String, String)> = this
                    .cp
                    .volume(&volume_id)
                    .ok()
                    .flatten()
                    .map(|v| {
                        v.claims
                            .into_values()
                            .map(|c| (volume_id.clone(), c.claim.alloc_id))
                            .collect()
                    })
                    .unwrap_or_default();
                match this.clean_node(&plugin, &volume_id, &claimed).await {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::warn!(volume_id, error = %error_chain(&e), "node clean-up failed; retrying");
                    }
                }
            }
        });
    }

    /// The claim's controller and node steps (idempotent), with the mount options it was made
    /// with; returns the target and the publish context. The caller holds the alloc's lock.
    async fn drive_claim(
        &self,
        plugin: &NodePlugin,
        volume_id: &str,
        claim: &ClaimRecord,
    ) -> Result<(PathBuf, BTreeMap<String, String>), StepError> {
        let alloc_id = claim.claim.alloc_id.clone();
        let grant = self
            .cp
            .claim(NodeClaim {
                volume_id: volume_id.to_string(),
                claim: claim.claim.clone(),
                csi_node_id: plugin.csi_node_id.clone(),
                mount_options: claim.mount_options.clone(),
            })
            .await
            .map_err(StepError::Cp)?;
        if let Some(h) = &self.hook {
            h.hit("claim:persisted");
        }
        let usage = Usage {
            read_only: claim.claim.mode == ClaimMode::Read,
            attachment_mode: claim.claim.attachment_mode,
            access_mode: claim.claim.access_mode,
            mount_options: (&claim.mount_options).into(),
        };
        let target = plugin
            .manager
            .mount(MountRequest {
                volume_id: volume_id.to_string(),
                external_id: grant.volume.external_id.clone(),
                alloc_id: alloc_id.clone(),
                usage,
                publish_context: grant.publish_context.clone(),
                volume_context: grant.volume.context.clone(),
                secrets: grant.volume.secrets.to_secrets(),
            })
            .await
            .map_err(StepError::Node)?;
        self.cp
            .confirm(volume_id, &alloc_id)
            .await
            .map_err(StepError::Cp)?;
        Ok((target, grant.publish_context))
    }

    /// Retries an interrupted claim until it is mounted, the claim is gone or released, or the
    /// agent stops. A claim that was never mounted (`claiming`) and fails for good is released.
    fn drive_in_background(self: &Arc<Self>, volume_id: String, alloc_id: String) {
        let this = Arc::clone(self);
        self.tasks.spawn(async move {
            let mut wait = RETRY_FIRST;
            loop {
                if !this.pause(wait).await {
                    return;
                }
                wait = next_wait(wait);
                let Ok(Some(vol)) = this.cp.volume(&volume_id) else {
                    return;
                };
                let Ok(plugin) = this.node_plugin(&vol.plugin_id).await else {
                    continue;
                };
                let _lock = this.alloc_locks.lock(&alloc_key(&volume_id, &alloc_id)).await;
                let claim = match this.cp.volume(&volume_id) {
                    Ok(Some(v)) => v.claims.get(&alloc_id).cloned(),
                    _ => None,
                };
                let Some(claim) = claim.filter(|c| c.state != ClaimState::Releasing) else {
                    return;
                };
                match this.drive_claim(&plugin, &volume_id, &claim).await {
                    Ok(_) => {
                        tracing::info!(volume_id, alloc_id, "interrupted claim finished");
                        return;
                    }
                    Err(e) => {
                        let text = this.scrubbed(&volume_id, &e);
                        if claim.state == ClaimState::Claiming && !e.is_retryable() {
                            tracing::warn!(volume_id, alloc_id, error = %text, "interrupted claim failed for good; releasing it");
                            let _ = this.cp.begin_release(&volume_id, &alloc_id).await;
                            drop(_lock);
                            this.release_in_background(volume_id, alloc_id, Duration::ZERO);
                            return;
                        }
                        this.note_failure(&volume_id, &alloc_id, &text).await;
                    }
                }
            }
        });
    }

    /// The release steps once the claim is marked releasing: node unpublish (and unstage when
    /// last), unused usages released, then controller unpublish and the claim freed. The caller
    /// holds the alloc's lock.
    async fn release_steps(
        &self,
        plugin: &NodePlugin,
        vol: &VolumeRecord,
        alloc_id: &str,
    ) -> Result<(), StepError> {
        plugin
            .manager
            .unmount(&vol.id, alloc_id)
            .await
            .map_err(StepError::Node)?;
        plugin
            .manager
            .release_unused(&vol.id)
            .await
            .map_err(StepError::Node)?;
        self.cp
            .finish_release(&vol.id, alloc_id)
            .await
            .map_err(StepError::Cp)?;
        self.events.emit_volume(
            EventKind::VolumeReleased,
            &vol.plugin_id,
            &vol.id,
            Some(alloc_id),
            "unpublished and released",
        );
        Ok(())
    }

    /// Marks the claim releasing and runs the release; on failure the claim stays releasing and
    /// the release is retried in the background. No claim: whatever the node still publishes for
    /// the alloc is unmounted.
    async fn release(self: &Arc<Self>, vol: &VolumeRecord, alloc_id: &str) -> ReleaseResponse {
        let volume_id = vol.id.as_str();
        let mut resp = ReleaseResponse {
            volume_id: volume_id.to_string(),
            alloc_id: alloc_id.to_string(),
            released: false,
            error: None,
        };
        let has_claim = vol.claims.contains_key(alloc_id);
        let plugin = if has_claim {
            self.node_plugin(&vol.plugin_id).await.map(Some)
        } else {
            self.node_plugin_for(vol).await
        };
        let plugin = match plugin {
            Ok(p) => p,
            Err(e) if has_claim => {
                // The node plugin is not there: the claim is kept, releasing, and retried.
                let text = self.scrubbed(volume_id, &StepError::Api(e));
                if self.cp.begin_release(volume_id, alloc_id).await.is_ok() {
                    self.note_failure(volume_id, alloc_id, &text).await;
                    self.release_in_background(
                        volume_id.to_string(),
                        alloc_id.to_string(),
                        RETRY_FIRST,
                    );
                }
                resp.error = Some(text);
                return resp;
            }
            Err(e) => {
                resp.error = Some(self.scrubbed(volume_id, &StepError::Api(e)));
                return resp;
            }
        };
        let _lock = self.alloc_locks.lock(&alloc_key(volume_id, alloc_id)).await;
        match self.cp.begin_release(volume_id, alloc_id).await {
            Ok(Some(_)) => {}
            Ok(None) => {
                if let Some(plugin) = plugin
                    && let Err(e) = plugin.manager.unmount(volume_id, alloc_id).await
                {
                    resp.error = Some(self.scrubbed(volume_id, &StepError::Node(e)));
                    return resp;
                }
                resp.released = true;
                return resp;
            }
            Err(e) => {
                resp.error = Some(self.scrubbed(volume_id, &StepError::Cp(e)));
                return resp;
            }
        }
        if let Some(h) = &self.hook {
            h.hit("release:persisted");
        }
        let Some(plugin) = plugin else {
            resp.error = Some("internal: no node plugin for a claimed volume".into());
            return resp;
        };
        match self.release_steps(&plugin, vol, alloc_id).await {
            Ok(()) => resp.released = true,
            Err(e) => {
                let text = self.scrubbed(volume_id, &e);
                self.note_failure(volume_id, alloc_id, &text).await;
                resp.error = Some(text);
                drop(_lock);
                self.release_in_background(
                    volume_id.to_string(),
                    alloc_id.to_string(),
                    RETRY_FIRST,
                );
            }
        }
        resp
    }

    fn existing_node_plugin(&self, plugin_id: &str) -> Option<Arc<NodePlugin>> {
        let map = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        map.get(plugin_id).and_then(|c| c.get().cloned())
    }

    /// Records a failed step (already scrubbed) on the claim and as an event.
    async fn note_failure(&self, volume_id: &str, alloc_id: &str, text: &str) {
        let plugin_id = self
            .cp
            .volume(volume_id)
            .ok()
            .flatten()
            .map(|v| v.plugin_id)
            .unwrap_or_default();
        self.events.emit_volume(
            EventKind::VolumeStepFailed,
            &plugin_id,
            volume_id,
            Some(alloc_id),
            format!("failed, retrying: {text}"),
        );
        let _ = self
            .cp
            .set_error(volume_id, alloc_id, Some(text.to_string()))
            .await;
    }

    /// Retries the release of one claim that is marked releasing, first after `first_delay`,
    /// then with doubling waits, until it is freed, the claim is gone or no longer releasing
    /// (a newer claim by the alloc is never touched), or the agent stops. One task per claim.
    fn release_in_background(
        self: &Arc<Self>,
        volume_id: String,
        alloc_id: String,
        first_delay: Duration,
    ) {
        {
            let mut set = self.retrying.lock().unwrap_or_else(|p| p.into_inner());
            if !set.insert((volume_id.clone(), alloc_id.clone())) {
                return;
            }
        }
        let this = Arc::clone(self);
        self.tasks.spawn(async move {
            let mut delay = first_delay;
            let mut wait = RETRY_FIRST;
            loop {
                if !this.pause(delay).await {
                    break;
                }
                delay = wait;
                wait = next_wait(wait);
                let Ok(Some(vol)) = this.cp.volume(&volume_id) else {
                    break;
                };
                let plugin = match this.node_plugin(&vol.plugin_id).await {
                    Ok(p) => p,
                    Err(e) => {
                        let text = this.scrubbed(&volume_id, &StepError::Api(e));
                        this.note_failure(&volume_id, &alloc_id, &text).await;
                        continue;
                    }
                };
                let _lock = this.alloc_locks.lock(&alloc_key(&volume_id, &alloc_id)).await;
                let Ok(Some(vol)) = this.cp.volume(&volume_id) else {
                    break;
                };
                if vol.claims.get(&alloc_id).is_none_or(|c| c.state != ClaimState::Releasing) {
                    break;
                }
                match this.release_steps(&plugin, &vol, &alloc_id).await {
                    Ok(()) => {
                        tracing::info!(volume_id, alloc_id, "background release done");
                        break;
                    }
                    Err(e) => {
                        let text = this.scrubbed(&volume_id, &e);
                        tracing::warn!(volume_id, alloc_id, error = %text, retry_in = ?delay, "release failed; retrying");
                        this.note_failure(&volume_id, &alloc_id, &text).await;
                    }
                }
            }
            this.retrying
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&(volume_id, alloc_id));
        });
    }

    // ---- what the API calls ----

    /// The catalog's record of a volume (for placement).
    pub fn catalog_volume(&self, id: &str) -> Option<VolumeRecord> {
        self.cp.volume(id).ok().flatten()
    }

    /// `GET /v1/volumes`.
    pub fn list(&self) -> Result<VolumeList, ApiError> {
        let volumes = self
            .cp
            .list()
            .map_err(cp_error)?
            .into_iter()
            .map(|v| VolumeSummary {
                access_modes: v.capabilities.iter().map(|c| c.access_mode).collect(),
                read_claims: v
                    .claims
                    .values()
                    .filter(|c| c.claim.mode == ClaimMode::Read)
                    .count(),
                write_claims: v
                    .claims
                    .values()
                    .filter(|c| c.claim.mode == ClaimMode::Write)
                    .count(),
                id: v.id,
                name: v.name,
                plugin_id: v.plugin_id,
                external_id: v.external_id.as_str().to_string(),
                capacity_bytes: v.capacity_bytes,
            })
            .collect();
        Ok(VolumeList { volumes })
    }

    /// `GET /v1/volume/csi/{id}`.
    pub async fn status(self: &Arc<Self>, id: &str) -> Result<VolumeStatus, ApiError> {
        let vol = self
            .cp
            .volume(id)
            .map_err(cp_error)?
            .ok_or_else(|| ApiError::NotFound(format!("no volume {id:?}")))?;
        let mut usages = Vec::new();
        if let Some(plugin) = self.existing_node_plugin(&vol.plugin_id) {
            // Stats only from the instance that serves now, and never for long: a status
            // must not hang on a plugin that went away.
            let live = self.active_node_socket(&vol.plugin_id).as_ref() == Some(&plugin.socket);
            for rec in plugin.manager.usages_of(id).map_err(|e| vol_error(&e))? {
                let mut allocs = Vec::new();
                for (alloc_id, state) in &rec.allocs {
                    let target = plugin
                        .manager
                        .paths()
                        .publish(id, alloc_id, rec.usage)
                        .unwrap_or_default();
                    let stats = if live && *state == PublishState::Published {
                        tokio::time::timeout(STATS_TIMEOUT, plugin.manager.stats(id, alloc_id))
                            .await
                            .ok()
                            .and_then(|r| r.ok().flatten())
                    } else {
                        None
                    };
                    allocs.push(PublishedView {
                        alloc_id: alloc_id.clone(),
                        state: publish_state(*state).into(),
                        target,
                        stats,
                    });
                }
                usages.push(UsageView {
                    usage: rec.usage.dir_name(),
                    mount_options: options_view(&rec.full_usage().mount_options),
                    staging: rec.staging.map(|s| stage_state(s).to_string()),
                    allocs,
                });
            }
        }
        Ok(status_of(&vol, usages))
    }

    /// `POST /v1/volumes/register|create`.
    pub async fn put(&self, op: SpecOp, req: VolumeSpecRequest) -> Result<VolumeStatus, ApiError> {
        let file = PathBuf::from(req.file.clone().unwrap_or_else(|| "request body".into()));
        let operation = match op {
            SpecOp::Register => Operation::Register,
            SpecOp::Create => Operation::Create,
        };
        let spec = match req.format {
            SpecFormat::Hcl => VolumeSpec::parse_hcl(operation, &file, &req.spec),
            SpecFormat::Json => VolumeSpec::parse_json(operation, &file, &req.spec),
        }
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
        let rec = self.cp.put(&spec).await.map_err(cp_error)?;
        self.events.emit_volume(
            EventKind::VolumeRegistered,
            &rec.plugin_id,
            &rec.id,
            None,
            match rec.origin {
                Origin::Registered => "registered",
                Origin::Created => "created",
            },
        );
        Ok(status_of(&rec, Vec::new()))
    }

    /// `DELETE /v1/volume/csi/{id}`.
    pub async fn deregister(
        self: &Arc<Self>,
        id: &str,
        force: bool,
    ) -> Result<DetachResponse, ApiError> {
        let vol = self
            .cp
            .volume(id)
            .map_err(cp_error)?
            .ok_or_else(|| ApiError::NotFound(format!("no volume {id:?}")))?;
        let mut out = DetachResponse::default();
        if force && !vol.claims.is_empty() {
            if let Some(other) = vol
                .claims
                .values()
                .find(|c| c.claim.node_id != self.node_id)
            {
                return Err(ApiError::Conflict(format!(
                    "volume {id:?} is claimed by alloc {:?} on node {:?}; it can only be released there",
                    other.claim.alloc_id, other.claim.node_id
                )));
            }
            out = self.detach(id, DetachRequest::default()).await?;
            if let Some(pending) = out.releases.iter().find(|r| !r.released) {
                return Err(ApiError::Conflict(format!(
                    "volume {id:?}: the claim of alloc {:?} is still being released ({}); deregister again when it is gone",
                    pending.alloc_id,
                    pending.error.as_deref().unwrap_or("retrying")
                )));
            }
        }
        if !self.cp.deregister(id).await.map_err(cp_error)? {
            return Err(ApiError::NotFound(format!("no volume {id:?}")));
        }
        self.events.emit_volume(
            EventKind::VolumeDeregistered,
            &vol.plugin_id,
            id,
            None,
            "deregistered",
        );
        Ok(out)
    }

    /// `POST /v1/volume/csi/{id}/delete`.
    pub async fn delete(&self, id: &str) -> Result<(), ApiError> {
        let vol = self
            .cp
            .volume(id)
            .map_err(cp_error)?
            .ok_or_else(|| ApiError::NotFound(format!("no volume {id:?}")))?;
        self.cp.delete(id).await.map_err(cp_error)?;
        self.events.emit_volume(
            EventKind::VolumeDeregistered,
            &vol.plugin_id,
            id,
            None,
            "deleted",
        );
        Ok(())
    }

    /// `POST /v1/volume/csi/{id}/detach`: releases every claim of this node, in order.
    pub async fn detach(
        self: &Arc<Self>,
        id: &str,
        req: DetachRequest,
    ) -> Result<DetachResponse, ApiError> {
        let node = req.node_id.unwrap_or_else(|| self.node_id.clone());
        if node != self.node_id {
            return Err(ApiError::BadRequest(format!(
                "node_id: {node:?} is not this agent's node ({:?}); claims are released on their node",
                self.node_id
            )));
        }
        let vol = self
            .cp
            .volume(id)
            .map_err(cp_error)?
            .ok_or_else(|| ApiError::NotFound(format!("no volume {id:?}")))?;
        let mut out = DetachResponse::default();
        for c in vol.claims.values().filter(|c| c.claim.node_id == node) {
            out.releases
                .push(self.release(&vol, &c.claim.alloc_id).await);
        }
        Ok(out)
    }

    /// `POST /v1/volume/csi/{id}/expand`.
    pub async fn expand(
        self: &Arc<Self>,
        id: &str,
        req: ExpandRequest,
    ) -> Result<ExpandResponse, ApiError> {
        let capacity = CapacityRange {
            required_bytes: i64::try_from(req.capacity_min).unwrap_or(i64::MAX),
            limit_bytes: req
                .capacity_max
                .map_or(0, |m| i64::try_from(m).unwrap_or(i64::MAX)),
        };
        let vol = self
            .cp
            .volume(id)
            .map_err(cp_error)?
            .ok_or_else(|| ApiError::NotFound(format!("no volume {id:?}")))?;
        if capacity.required_bytes < vol.capacity_bytes {
            return Err(ApiError::BadRequest(format!(
                "capacity_min: {} bytes is below the volume's size ({} bytes); volumes only grow",
                capacity.required_bytes, vol.capacity_bytes
            )));
        }
        let (bytes, node_required) = self.cp.expand(id, capacity).await.map_err(cp_error)?;
        let mut node_expanded = false;
        if node_required
            && let Some(plugin) = self.node_plugin_for(&vol).await?
            && plugin
                .caps
                .has(berth_csi::model::NodeCapability::ExpandVolume)
        {
            let done = plugin
                .manager
                .expand(
                    id,
                    CapacityRange {
                        required_bytes: bytes,
                        limit_bytes: capacity.limit_bytes,
                    },
                    &vol.secrets.to_secrets(),
                )
                .await
                .map_err(|e| vol_error(&e))?;
            node_expanded = !done.is_empty();
        }
        Ok(ExpandResponse {
            volume_id: id.to_string(),
            capacity_bytes: bytes,
            node_expanded,
        })
    }

    /// `POST /v1/volume/csi/{id}/claim`: claims and mounts. Everything in the request is checked
    /// before anything changes. A claim that fails after it was granted is released again (in
    /// the background), unless the alloc held it, mounted, before this call.
    pub async fn claim(
        self: &Arc<Self>,
        id: &str,
        req: ClaimRequest,
    ) -> Result<ClaimResponse, ApiError> {
        let vol = self
            .cp
            .volume(id)
            .map_err(cp_error)?
            .ok_or_else(|| ApiError::NotFound(format!("no volume {id:?}")))?;
        let request_options = MountOptions {
            fs_type: req
                .mount_options
                .as_ref()
                .and_then(|o| o.fs_type.clone())
                .unwrap_or_default(),
            mount_flags: MountFlags::new(
                req.mount_options
                    .as_ref()
                    .and_then(|o| o.mount_flags.clone())
                    .map(|f| f.0)
                    .unwrap_or_default(),
            ),
            volume_mount_group: String::new(),
        };
        let merged = merge_mount_options(&(&vol.mount_options).into(), &request_options);
        check_mount_flags(&merged.mount_flags)
            .map_err(|e| ApiError::BadRequest(format!("mount_options.mount_flags: {e}")))?;
        let claim = ClaimRecord {
            claim: Claim {
                alloc_id: req.alloc_id.clone(),
                node_id: self.node_id.clone(),
                mode: if req.read_only {
                    ClaimMode::Read
                } else {
                    ClaimMode::Write
                },
                access_mode: req.access_mode,
                attachment_mode: req.attachment_mode,
            },
            state: ClaimState::Claiming,
            error: None,
            mount_options: (&merged).into(),
        };
        let mut set = vol
            .claim_set()
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        set.claim(&vol.capability_pairs(), claim.claim.clone())
            .map_err(|e| {
                ApiError::Conflict(format!(
                    "volume {id:?}: claim by alloc {:?} refused: {e}",
                    req.alloc_id
                ))
            })?;
        // The plugin first, then the alloc's lock (the plugin's recovery takes alloc locks).
        let plugin = self.node_plugin(&vol.plugin_id).await?;
        let lock = self.alloc_locks.lock(&alloc_key(id, &req.alloc_id)).await;
        let held_before = self
            .cp
            .volume(id)
            .ok()
            .flatten()
            .and_then(|v| v.claims.get(&req.alloc_id).map(|c| c.state))
            == Some(ClaimState::Claimed);
        match self.drive_claim(&plugin, id, &claim).await {
            Ok((target, publish_context)) => {
                let usage_name = plugin
                    .manager
                    .alloc_target(id, &req.alloc_id)
                    .ok()
                    .flatten()
                    .map_or_else(String::new, |(r, _)| r.usage.dir_name());
                self.events.emit_volume(
                    EventKind::VolumeClaimed,
                    &vol.plugin_id,
                    id,
                    Some(&req.alloc_id),
                    format!("claimed for {} as {usage_name}", claim.claim.mode),
                );
                Ok(ClaimResponse {
                    volume_id: id.to_string(),
                    alloc_id: req.alloc_id,
                    node_id: self.node_id.clone(),
                    usage: usage_name,
                    target,
                    publish_context,
                })
            }
            Err(e) => {
                // Refusals happen before anything is written.
                let refused = matches!(
                    e,
                    StepError::Cp(
                        ControlPlaneError::Refused { .. }
                            | ControlPlaneError::Conflict(_)
                            | ControlPlaneError::NoVolume(_)
                            | ControlPlaneError::Invalid(_)
                    )
                );
                let err = self.api_error(id, e);
                if !refused && !held_before {
                    tracing::warn!(volume_id = id, alloc_id = %req.alloc_id, error = %err, "claim failed; releasing it");
                    if self.cp.begin_release(id, &req.alloc_id).await.is_ok() {
                        drop(lock);
                        self.release_in_background(
                            id.to_string(),
                            req.alloc_id.clone(),
                            Duration::ZERO,
                        );
                    }
                }
                Err(err)
            }
        }
    }

    /// `POST /v1/volume/csi/{id}/release`.
    pub async fn release_api(
        self: &Arc<Self>,
        id: &str,
        req: ReleaseRequest,
    ) -> Result<ReleaseResponse, ApiError> {
        let vol = self
            .cp
            .volume(id)
            .map_err(cp_error)?
            .ok_or_else(|| ApiError::NotFound(format!("no volume {id:?}")))?;
        Ok(self.release(&vol, &req.alloc_id).await)
    }

    /// `POST /v1/volume/csi/{id}/snapshot`.
    pub async fn create_snapshot(
        &self,
        id: &str,
        req: SnapshotCreateRequest,
    ) -> Result<SnapshotView, ApiError> {
        let secrets = req.secrets.map(|s| Secrets::new(s.0));
        let (vol, snap) = self
            .cp
            .create_snapshot(id, &req.name, &req.parameters, secrets.as_ref())
            .await
            .map_err(cp_error)?;
        Ok(snapshot_view(&vol.plugin_id, snap, Some(vol.id)))
    }

    /// `POST /v1/volumes/snapshot/delete`.
    pub async fn delete_snapshot(&self, req: SnapshotDeleteRequest) -> Result<(), ApiError> {
        self.cp
            .delete_snapshot(
                &req.plugin_id,
                &req.snapshot_id,
                &Secrets::new(req.secrets.0),
            )
            .await
            .map_err(cp_error)
    }

    /// `GET /v1/volumes/snapshots`.
    pub async fn list_snapshots(&self, plugin_id: &str) -> Result<SnapshotList, ApiError> {
        let snaps = self.cp.list_snapshots(plugin_id).await.map_err(cp_error)?;
        let by_external: HashMap<String, String> = self
            .cp
            .list()
            .map_err(cp_error)?
            .into_iter()
            .filter(|v| v.plugin_id == plugin_id)
            .map(|v| (v.external_id.as_str().to_string(), v.id))
            .collect();
        Ok(SnapshotList {
            snapshots: snaps
                .into_iter()
                .map(|s| {
                    let vol = by_external.get(&s.source_external_id).cloned();
                    snapshot_view(plugin_id, s, vol)
                })
                .collect(),
        })
    }
}

fn snapshot_view(
    plugin_id: &str,
    s: berth_csi::model::Snapshot,
    source_volume_id: Option<String>,
) -> SnapshotView {
    SnapshotView {
        snapshot_id: s.snapshot_id,
        plugin_id: plugin_id.to_string(),
        source_external_id: s.source_external_id,
        source_volume_id,
        size_bytes: s.size_bytes,
        creation_time: s.creation_time,
        ready_to_use: s.ready_to_use,
    }
}

fn publish_state(s: PublishState) -> &'static str {
    match s {
        PublishState::Publishing => "publishing",
        PublishState::Published => "published",
        PublishState::Unpublishing => "unpublishing",
    }
}

fn stage_state(s: StageState) -> &'static str {
    match s {
        StageState::Staging => "staging",
        StageState::Staged => "staged",
        StageState::Unstaging => "unstaging",
    }
}

fn options_view(o: &MountOptions) -> MountOptionsView {
    MountOptionsView {
        fs_type: o.fs_type.clone(),
        mount_flags: (!o.mount_flags.is_empty()).then(|| berth_api::volumes::REDACTED.to_string()),
    }
}

fn claim_view(c: &ClaimRecord) -> ClaimView {
    ClaimView {
        alloc_id: c.claim.alloc_id.clone(),
        node_id: c.claim.node_id.clone(),
        mode: c.claim.mode.to_string(),
        access_mode: c.claim.access_mode,
        attachment_mode: c.claim.attachment_mode,
        state: match c.state {
            ClaimState::Claiming => ApiClaimState::Claiming,
            ClaimState::Claimed => ApiClaimState::Claimed,
            ClaimState::Releasing => ApiClaimState::Releasing,
        },
        error: c.error.clone(),
    }
}

fn status_of(v: &VolumeRecord, usages: Vec<UsageView>) -> VolumeStatus {
    VolumeStatus {
        id: v.id.clone(),
        name: v.name.clone(),
        plugin_id: v.plugin_id.clone(),
        external_id: v.external_id.as_str().to_string(),
        origin: match v.origin {
            Origin::Registered => VolumeOrigin::Registered,
            Origin::Created => VolumeOrigin::Created,
        },
        capabilities: v
            .capabilities
            .iter()
            .map(|c| CapabilityView {
                access_mode: c.access_mode,
                attachment_mode: c.attachment_mode,
            })
            .collect(),
        mount_options: options_view(&(&v.mount_options).into()),
        capacity_bytes: v.capacity_bytes,
        parameters: v.parameters.clone(),
        context: v.context.clone(),
        secret_names: v.secrets.names(),
        topology: v.topology.clone(),
        controller_required: v.controller_publish,
        claims: v.claims.values().map(claim_view).collect(),
        usages,
        created_ms: v.created_ms,
    }
}
