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
use berth_state::Store;
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
                    tokio::select! {
                        () = this.shutdown.cancelled() => return,
                        () = tokio::time::sleep(wait) => {}
                    }
                    wait = (wait * 2).min(RETRY_MAX);
                }
            });
        }
    }

    /// The node plugin's volume manager, created (and its state recovered) the first time: waits
    /// up to [`PLUGIN_WAIT`] for a healthy node instance.
    async fn node_plugin(self: &Arc<Self>, plugin_id: &str) -> Result<Arc<NodePlugin>, ApiError> {
        let cell = {
            let mut map = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(map.entry(plugin_id.to_string()).or_default())
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
        let plugin = Arc::new(NodePlugin {
            manager,
            csi_node_id,
            caps,
        });
        self.recover(plugin_id, &plugin).await;
        Ok(plugin)
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
    /// node on its volumes to its end, and unmounts allocs published without a claim.
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
                claimed.insert((vol.id.clone(), c.claim.alloc_id.clone()));
                match c.state {
                    ClaimState::Claiming | ClaimState::Claimed => {
                        let r = self.drive_claim(plugin, &vol.id, c.claim.clone()).await;
                        if let Err(e) = r {
                            tracing::warn!(volume_id = %vol.id, alloc_id = %c.claim.alloc_id, error = %e.text(), "interrupted claim failed; releasing it");
                            self.release_in_background(
                                vol.id.clone(),
                                c.claim.alloc_id.clone(),
                                Duration::ZERO,
                            );
                        }
                    }
                    ClaimState::Releasing => {
                        self.release_in_background(
                            vol.id.clone(),
                            c.claim.alloc_id.clone(),
                            Duration::ZERO,
                        );
                    }
                }
            }
        }
        if let Ok(published) = plugin.manager.allocs() {
            for (volume_id, allocs) in published {
                for alloc_id in allocs {
                    if claimed.contains(&(volume_id.clone(), alloc_id.clone())) {
                        continue;
                    }
                    tracing::info!(volume_id, alloc_id, "unmounting an alloc without a claim");
                    if let Err(e) = plugin.manager.unmount(&volume_id, &alloc_id).await {
                        tracing::warn!(volume_id, alloc_id, error = %error_chain(&e), "cannot unmount an alloc without a claim");
                    }
                }
            }
        }
    }

    /// The claim's controller and node steps (idempotent): returns the target and usage.
    async fn drive_claim(
        self: &Arc<Self>,
        plugin: &Arc<NodePlugin>,
        volume_id: &str,
        claim: Claim,
    ) -> Result<(PathBuf, Usage, BTreeMap<String, String>), StepError> {
        let alloc_id = claim.alloc_id.clone();
        let grant = self
            .cp
            .claim(NodeClaim {
                volume_id: volume_id.to_string(),
                claim: claim.clone(),
                csi_node_id: plugin.csi_node_id.clone(),
            })
            .await
            .map_err(StepError::Cp)?;
        // The mount options are those of the usage the alloc is already in, if any (an
        // interrupted claim), else the volume's.
        let usage = match plugin.manager.alloc_target(volume_id, &alloc_id) {
            Ok(Some((rec, _))) => rec.full_usage(),
            _ => Usage {
                read_only: claim.mode == ClaimMode::Read,
                attachment_mode: claim.attachment_mode,
                access_mode: claim.access_mode,
                mount_options: (&grant.volume.mount_options).into(),
            },
        };
        let target = self
            .mount(
                plugin,
                &grant.volume,
                &alloc_id,
                usage.clone(),
                grant.publish_context.clone(),
            )
            .await?;
        self.cp
            .confirm(volume_id, &alloc_id)
            .await
            .map_err(StepError::Cp)?;
        Ok((target, usage, grant.publish_context))
    }

    async fn mount(
        &self,
        plugin: &NodePlugin,
        vol: &VolumeRecord,
        alloc_id: &str,
        usage: Usage,
        publish_context: BTreeMap<String, String>,
    ) -> Result<PathBuf, StepError> {
        plugin
            .manager
            .mount(MountRequest {
                volume_id: vol.id.clone(),
                external_id: vol.external_id.clone(),
                alloc_id: alloc_id.to_string(),
                usage,
                publish_context,
                volume_context: vol.context.clone(),
                secrets: vol.secrets.to_secrets(),
            })
            .await
            .map_err(StepError::Node)
    }

    /// The release steps after the claim is marked releasing: node, then controller and free.
    async fn release_steps(
        self: &Arc<Self>,
        volume_id: &str,
        alloc_id: &str,
    ) -> Result<(), StepError> {
        let vol = self
            .cp
            .volume(volume_id)
            .map_err(StepError::Cp)?
            .ok_or_else(|| {
                StepError::Api(ApiError::NotFound(format!("no volume {volume_id:?}")))
            })?;
        let plugin = self
            .node_plugin(&vol.plugin_id)
            .await
            .map_err(StepError::Api)?;
        plugin
            .manager
            .unmount(volume_id, alloc_id)
            .await
            .map_err(StepError::Node)?;
        self.cp
            .finish_release(volume_id, alloc_id)
            .await
            .map_err(StepError::Cp)?;
        self.events.emit_volume(
            EventKind::VolumeReleased,
            &vol.plugin_id,
            volume_id,
            Some(alloc_id),
            "unpublished and released",
        );
        Ok(())
    }

    /// Marks the claim releasing and runs the release; on failure the claim stays releasing and
    /// the release is retried in the background.
    async fn release(self: &Arc<Self>, volume_id: &str, alloc_id: &str) -> ReleaseResponse {
        let mut resp = ReleaseResponse {
            volume_id: volume_id.to_string(),
            alloc_id: alloc_id.to_string(),
            released: false,
            error: None,
        };
        match self.cp.begin_release(volume_id, alloc_id).await {
            Ok(Some(_)) => {}
            Ok(None) => {
                // No claim: still unmount anything the node holds for the alloc.
                if let Ok(Some(vol)) = self.cp.volume(volume_id)
                    && let Some(plugin) = self.existing_node_plugin(&vol.plugin_id)
                    && let Err(e) = plugin.manager.unmount(volume_id, alloc_id).await
                {
                    resp.error = Some(error_chain(&e));
                    return resp;
                }
                resp.released = true;
                return resp;
            }
            Err(e) => {
                resp.error = Some(error_chain(&e));
                return resp;
            }
        }
        if let Some(h) = &self.hook {
            h.hit("release:persisted");
        }
        if self.is_retrying(volume_id, alloc_id) {
            resp.error = Some("a background release is under way".into());
            return resp;
        }
        match self.release_steps(volume_id, alloc_id).await {
            Ok(()) => resp.released = true,
            Err(e) => {
                let text = e.text();
                self.note_failure(volume_id, alloc_id, &text).await;
                resp.error = Some(text);
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

    fn is_retrying(&self, volume_id: &str, alloc_id: &str) -> bool {
        self.retrying
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&(volume_id.to_string(), alloc_id.to_string()))
    }

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
            format!("release failed, retrying: {text}"),
        );
        let _ = self
            .cp
            .set_error(volume_id, alloc_id, Some(text.to_string()))
            .await;
    }

    /// Retries the release of one claim until it succeeds or the agent stops, first after
    /// `first_delay`, then with doubling waits; one task per claim. Each attempt marks the
    /// claim releasing (idempotent) and runs the steps.
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
                tokio::select! {
                    biased;
                    () = this.shutdown.cancelled() => break,
                    () = tokio::time::sleep(delay) => {}
                }
                let r = async {
                    this.cp
                        .begin_release(&volume_id, &alloc_id)
                        .await
                        .map_err(StepError::Cp)?;
                    this.release_steps(&volume_id, &alloc_id).await
                }
                .await;
                match r {
                    Ok(()) => {
                        tracing::info!(volume_id, alloc_id, "background release done");
                        break;
                    }
                    Err(StepError::Cp(ControlPlaneError::NoVolume(_))) => break,
                    Err(e) => {
                        let text = e.text();
                        tracing::warn!(volume_id, alloc_id, error = %text, retry_in = ?wait, "release failed; retrying");
                        this.note_failure(&volume_id, &alloc_id, &text).await;
                    }
                }
                delay = wait;
                wait = (wait * 2).min(RETRY_MAX);
            }
            this.retrying
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&(volume_id, alloc_id));
        });
    }

    // ---- what the API calls ----

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
            for rec in plugin.manager.usages_of(id).map_err(|e| vol_error(&e))? {
                let mut allocs = Vec::new();
                for (alloc_id, state) in &rec.allocs {
                    let target = plugin
                        .manager
                        .paths()
                        .publish(id, alloc_id, rec.usage)
                        .unwrap_or_default();
                    let stats = if *state == PublishState::Published {
                        plugin.manager.stats(id, alloc_id).await.ok().flatten()
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
            out.releases.push(self.release(id, &c.claim.alloc_id).await);
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
            && let Some(plugin) = self.existing_node_plugin(&vol.plugin_id)
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

    /// `POST /v1/volume/csi/{id}/claim`: claims and mounts; a failed mount releases the claim.
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
        // Everything about the request is checked before anything changes.
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
        let claim = Claim {
            alloc_id: req.alloc_id.clone(),
            node_id: self.node_id.clone(),
            mode: if req.read_only {
                ClaimMode::Read
            } else {
                ClaimMode::Write
            },
            access_mode: req.access_mode,
            attachment_mode: req.attachment_mode,
        };
        let mut set = vol
            .claim_set()
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        set.claim(&vol.capability_pairs(), claim.clone())
            .map_err(|e| {
                ApiError::Conflict(format!(
                    "volume {id:?}: claim by alloc {:?} refused: {e}",
                    req.alloc_id
                ))
            })?;
        let plugin = self.node_plugin(&vol.plugin_id).await?;
        let usage = Usage {
            read_only: req.read_only,
            attachment_mode: req.attachment_mode,
            access_mode: req.access_mode,
            mount_options: merged,
        };
        let result = async {
            let grant = self
                .cp
                .claim(NodeClaim {
                    volume_id: id.to_string(),
                    claim: claim.clone(),
                    csi_node_id: plugin.csi_node_id.clone(),
                })
                .await
                .map_err(StepError::Cp)?;
            if let Some(h) = &self.hook {
                h.hit("claim:persisted");
            }
            let target = self
                .mount(
                    &plugin,
                    &grant.volume,
                    &req.alloc_id,
                    usage.clone(),
                    grant.publish_context.clone(),
                )
                .await?;
            self.cp
                .confirm(id, &req.alloc_id)
                .await
                .map_err(StepError::Cp)?;
            Ok::<_, StepError>((target, grant.publish_context))
        }
        .await;
        match result {
            Ok((target, publish_context)) => {
                let usage_name = plugin
                    .manager
                    .alloc_target(id, &req.alloc_id)
                    .ok()
                    .flatten()
                    .map_or_else(|| usage.dir_name(), |(r, _)| r.usage.dir_name());
                self.events.emit_volume(
                    EventKind::VolumeClaimed,
                    &vol.plugin_id,
                    id,
                    Some(&req.alloc_id),
                    format!("claimed for {} as {usage_name}", claim.mode),
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
                // A refusal changed nothing; anything else may have left a claim: release it.
                let refused = matches!(
                    e,
                    StepError::Cp(
                        ControlPlaneError::Refused { .. } | ControlPlaneError::Conflict(_)
                    )
                );
                if !refused {
                    tracing::warn!(volume_id = id, alloc_id = %req.alloc_id, error = %e.text(), "claim failed; releasing it");
                    self.release_in_background(
                        id.to_string(),
                        req.alloc_id.clone(),
                        Duration::ZERO,
                    );
                }
                Err(e.into_api())
            }
        }
    }

    /// `POST /v1/volume/csi/{id}/release`.
    pub async fn release_api(
        self: &Arc<Self>,
        id: &str,
        req: ReleaseRequest,
    ) -> Result<ReleaseResponse, ApiError> {
        if self.cp.volume(id).map_err(cp_error)?.is_none() {
            return Err(ApiError::NotFound(format!("no volume {id:?}")));
        }
        Ok(self.release(id, &req.alloc_id).await)
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
        controller_required: !v.publications.is_empty(),
        claims: v.claims.values().map(claim_view).collect(),
        usages,
        created_ms: v.created_ms,
    }
}
