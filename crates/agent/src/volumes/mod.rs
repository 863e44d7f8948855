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

mod catalog;
mod claim;
mod controllers;
mod crash;
mod errors;
mod lost;
mod recovery;
mod release;
mod snapshots;
mod status;

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
    ControllerHandle, Controllers, NodeClaim, Origin, Plane, VolumeRecord, backend::CatalogBackend,
};
use berth_csi::{
    CapacityRange, CsiClient, Endpoint,
    model::{MountFlags, MountOptions, NodeCapabilities, Secrets},
};
use berth_state::{KeyedLocks, Store, Table};
use berth_volume::{
    Operation, PluginDir, PluginPaths, Usage, VolumeSpec, check_mount_flags, merge_mount_options,
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

pub use controllers::{AgentControllers, ClientCache};
pub use crash::{CRASH_ENV, CrashHook};
use errors::*;
use status::*;

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
    cp: Plane<AgentControllers>,
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
    /// The catalog is not in this node's store (a fleet's etcd), so its writes make none of
    /// the node's deferred records durable: the node syncs its store itself before a claim
    /// is confirmed and before a release's controller step.
    catalog_elsewhere: bool,
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

/// The next wait of a background retry: doubled, at most [`RETRY_MAX`].
fn next_wait(wait: Duration) -> Duration {
    (wait * 2).min(RETRY_MAX)
}

/// The key of an alloc's lock on a volume.
fn alloc_key(volume_id: &str, alloc_id: &str) -> String {
    format!("{volume_id}/{alloc_id}")
}

impl Volumes {
    /// Volumes over the agent's store and plugins, with the catalog in `catalog` (the store's
    /// own, or a fleet's). Nothing runs until [`Volumes::start`].
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Arc<Store>,
        catalog: Arc<dyn CatalogBackend>,
        node_id: String,
        data_dir: PathBuf,
        registry: Arc<Registry>,
        manager: Arc<Manager>,
        events: Arc<EventBus>,
        metrics: Arc<Metrics>,
        remote: Option<Arc<dyn Controllers>>,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) -> Self {
        let clients = Arc::new(ClientCache {
            clients: Mutex::new(HashMap::new()),
            metrics,
            cancel: shutdown.clone(),
        });
        let hook = CrashHook::from_env();
        // The embedded catalog is the only one with deferred writes, and it is in this store.
        let catalog_elsewhere = !catalog.defers_writes();
        let mut cp = Plane::new(
            catalog,
            AgentControllers {
                registry: Arc::clone(&registry),
                manager: Arc::clone(&manager),
                clients: Arc::clone(&clients),
                remote,
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
            catalog_elsewhere,
            tasks,
            shutdown,
        }
    }

    /// Makes the node's deferred records durable when the catalog's writes do not (see
    /// [`Volumes::catalog_elsewhere`]).
    async fn sync_node_records(&self, volume_id: &str) -> Result<(), StepError> {
        if !self.catalog_elsewhere {
            return Ok(());
        }
        self.store.sync().await.map_err(|source| {
            StepError::Node(berth_volumemgr::VolumeError::Store {
                volume_id: volume_id.to_string(),
                source,
            })
        })
    }

    /// This node's own controllers (never another node's): what it serves to the fleet.
    pub fn local_controllers(&self) -> AgentControllers {
        AgentControllers {
            registry: Arc::clone(&self.registry),
            manager: Arc::clone(&self.manager),
            clients: Arc::clone(&self.clients),
            remote: None,
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

    fn existing_node_plugin(&self, plugin_id: &str) -> Option<Arc<NodePlugin>> {
        let map = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        map.get(plugin_id).and_then(|c| c.get().cloned())
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

    /// The catalog's record of a volume (for placement).
    pub fn catalog_volume(&self, id: &str) -> Option<VolumeRecord> {
        self.cp.volume(id).ok().flatten()
    }
}
