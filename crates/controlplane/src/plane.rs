//! The control plane's volume side: the catalog (in the agent's store, or in etcd for a fleet),
//! claims under the access-mode rules, and controller RPCs routed to a healthy controller
//! instance. One set of rules for both backends: every change is a read, a decision and a
//! conditional write, decided again on a fresh read when another writer got there first.

use std::{
    collections::{BTreeMap, HashMap},
    future::Future,
    sync::Arc,
};

use berth_csi::{
    CapacityRange, ControllerPublish, CsiError, Validation,
    model::{ControllerCapabilities, ControllerCapability, Secrets, Snapshot},
};
use berth_state::{KeyedLocks, StateError, Store};
use berth_volume::{SpecKind, StoredMountOptions, VolumeSpec};

use crate::{
    backend::{CatalogBackend, StoreCatalog, Version, Written},
    catalog::{ClaimRecord, ClaimState, Origin, Publication, PublicationState, VolumeRecord},
    claims::{Claim, ClaimError},
    rpc::ControllerRpc,
};

/// How many times in a row a change is decided again because another writer changed the
/// volume first, before the caller is told to try later.
const MAX_RACES: usize = 32;

/// A healthy controller instance of a plugin.
#[derive(Debug, Clone)]
pub struct ControllerHandle {
    /// The plugin instance that answers (its registry instance name).
    pub instance: String,
    /// Its controller service: a client for its socket, or another node of the fleet.
    pub client: Arc<dyn ControllerRpc>,
    /// ControllerGetCapabilities.
    pub capabilities: ControllerCapabilities,
}

/// What the control plane knows of a plugin's controller side.
#[derive(Debug, Clone)]
pub enum ControllerAccess {
    /// No plugin with this id is registered.
    UnknownPlugin,
    /// The plugin has no controller role: claims need no controller step.
    NodeOnly,
    /// A healthy controller instance.
    Healthy(ControllerHandle),
    /// Controller instances exist, none healthy; the text says why.
    Unhealthy(String),
}

/// Where the control plane finds controller plugins (the agent's registry and health loops).
pub trait Controllers: Send + Sync + 'static {
    /// The controller side of plugin `plugin_id`, as of now.
    fn controller(&self, plugin_id: &str) -> ControllerAccess;
}

/// Called with `<Rpc>:before` / `<Rpc>:after` around each controller RPC of a claim or release
/// (after the intent is persisted / before the result is). For crash tests.
pub type Hook = Arc<dyn Fn(&str) + Send + Sync>;

/// Why a control-plane operation failed. Texts name the volume, alloc or plugin; never a
/// secret or mount flag.
#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    /// No such volume.
    #[error("no volume {0:?}")]
    NoVolume(String),
    /// The request is invalid (names the field); nothing changed.
    #[error("{0}")]
    Invalid(String),
    /// The access-mode rules refuse the claim; nothing changed.
    #[error("volume {volume_id:?}: claim by alloc {alloc_id:?} refused: {source}")]
    Refused {
        /// The volume.
        volume_id: String,
        /// The alloc.
        alloc_id: String,
        /// The rule.
        #[source]
        source: Box<ClaimError>,
    },
    /// The request contradicts the current state; nothing changed.
    #[error("{0}")]
    Conflict(String),
    /// The plugin needed cannot serve now (unknown, unhealthy, or lacks the capability).
    #[error("plugin {plugin_id:?}: {reason}")]
    Unavailable {
        /// The plugin.
        plugin_id: String,
        /// Why.
        reason: String,
    },
    /// A CSI call failed. When the plugin refused it for a reason the caller must fix
    /// ([`CsiError::is_refusal`]), the text says so and gives the plugin's reason.
    #[error("{}", csi_failure_text(plugin_id, volume_id.as_deref(), source))]
    Csi {
        /// The plugin called.
        plugin_id: String,
        /// The volume, when the call was about one.
        volume_id: Option<String>,
        /// The alloc whose claim made the call (ControllerPublish/Unpublish).
        alloc_id: Option<String>,
        /// The client's error (already scrubbed of secrets).
        #[source]
        source: Box<CsiError>,
    },
    /// The store failed.
    #[error("state store: {0}")]
    Store(#[from] StateError),
    /// The fleet's store (etcd) cannot be reached or answered an error; nothing is known to
    /// have changed.
    #[error("control plane store: {0}")]
    Backend(String),
}

fn csi_failure_text(plugin_id: &str, volume_id: Option<&str>, source: &CsiError) -> String {
    let about = volume_id
        .map(|v| format!(" for volume {v:?}"))
        .unwrap_or_default();
    source
        .refusal_text(plugin_id, &about)
        .unwrap_or_else(|| format!("plugin {plugin_id:?}{about}: {source}"))
}

/// The error of a failed controller RPC, logged at warn with the ids it is about (the
/// client's error is already free of secrets and mount flags).
fn csi_failed(
    plugin_id: &str,
    volume_id: Option<&str>,
    alloc_id: Option<&str>,
    source: CsiError,
) -> ControlPlaneError {
    tracing::warn!(
        plugin = plugin_id,
        volume_id,
        alloc_id,
        rpc = %source.rpc(),
        code = %berth_csi::code_name(source.code()),
        error = %source,
        "controller RPC failed"
    );
    ControlPlaneError::Csi {
        plugin_id: plugin_id.to_string(),
        volume_id: volume_id.map(str::to_string),
        alloc_id: alloc_id.map(str::to_string),
        source: Box::new(source),
    }
}

/// A claim a node asks for.
#[derive(Debug, Clone)]
pub struct NodeClaim {
    /// The volume.
    pub volume_id: String,
    /// The claim (alloc, berth node id, mode, access and attachment modes).
    pub claim: Claim,
    /// The node's id as the volume's plugin knows it (NodeGetInfo), for ControllerPublish.
    pub csi_node_id: String,
    /// The mount options the node will use (kept with the claim).
    pub mount_options: StoredMountOptions,
}

/// A granted claim: the volume as the node needs it, and the controller's publish context.
#[derive(Debug, Clone)]
pub struct Grant {
    /// The volume (with its secrets, for the node calls).
    pub volume: VolumeRecord,
    /// What ControllerPublishVolume returned (empty when there was no controller step).
    pub publish_context: BTreeMap<String, String>,
}

/// How the node side reaches the control plane (Nomad's RPCer): in-process now, over the
/// network later. Every method is idempotent.
pub trait ControlPlane: Send + Sync + 'static {
    /// Grants the claim (or finds it granted), persists it as `claiming`, and runs
    /// ControllerPublishVolume for the claim's node when the plugin needs it. Refused claims
    /// change nothing. A claim that is being released is refused.
    fn claim(
        &self,
        req: NodeClaim,
    ) -> impl Future<Output = Result<Grant, ControlPlaneError>> + Send;
    /// Marks a claim `claimed` (the node has mounted it), clearing its error.
    fn confirm(
        &self,
        volume_id: &str,
        alloc_id: &str,
    ) -> impl Future<Output = Result<(), ControlPlaneError>> + Send;
    /// Marks a claim `releasing` and returns it; `None` when the alloc holds no claim.
    fn begin_release(
        &self,
        volume_id: &str,
        alloc_id: &str,
    ) -> impl Future<Output = Result<Option<ClaimRecord>, ControlPlaneError>> + Send;
    /// Called once the node has unpublished (and unstaged when last): runs
    /// ControllerUnpublishVolume when no other claim from that node remains, then frees the
    /// claim. On error the claim stays `releasing`.
    fn finish_release(
        &self,
        volume_id: &str,
        alloc_id: &str,
    ) -> impl Future<Output = Result<(), ControlPlaneError>> + Send;
    /// Records (or clears) the failure of a step that is being retried.
    fn set_error(
        &self,
        volume_id: &str,
        alloc_id: &str,
        error: Option<String>,
    ) -> impl Future<Output = Result<(), ControlPlaneError>> + Send;
    /// The volume, if it is in the catalog.
    fn volume(&self, volume_id: &str) -> Result<Option<VolumeRecord>, ControlPlaneError>;
    /// Every volume with a claim from `node_id`, with those claims.
    fn node_claims(
        &self,
        node_id: &str,
    ) -> Result<Vec<(VolumeRecord, Vec<ClaimRecord>)>, ControlPlaneError>;
}

/// The control plane over a catalog backend.
pub struct Plane<C> {
    catalog: Arc<dyn CatalogBackend>,
    controllers: C,
    locks: KeyedLocks,
    hook: Option<Hook>,
    /// Deferred results not written yet, by volume, when the catalog has no deferred write of
    /// its own (etcd, where every write is a durable transaction): each is applied again to
    /// the record the volume's next write starts from, and that write carries it. A crash
    /// loses them, as it may lose any deferred result.
    carried: std::sync::Mutex<HashMap<String, Vec<Carried>>>,
}

/// A deferred change of a volume record (see [`Plane::modify_deferred`]).
type Carried = Arc<dyn Fn(&mut VolumeRecord) + Send + Sync>;

/// Applies the carried changes to `rec`, oldest first.
fn carry(carried: &[Carried], rec: &mut VolumeRecord) {
    for change in carried {
        change(rec);
    }
}

impl<C> std::fmt::Debug for Plane<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plane")
            .field("catalog", &self.catalog)
            .finish_non_exhaustive()
    }
}

/// Whether claims through this controller need ControllerPublishVolume.
fn publishes(access: &ControllerAccess) -> bool {
    matches!(access, ControllerAccess::Healthy(h) if h.capabilities.has(ControllerCapability::PublishUnpublishVolume))
}

use berth_sys::now_ms;

impl<C: Controllers> Plane<C> {
    /// The embedded control plane: the catalog in the agent's store.
    pub fn embedded(store: Arc<Store>, controllers: C) -> Self {
        Self::new(Arc::new(StoreCatalog::new(store)), controllers)
    }

    /// A control plane over `catalog`.
    pub fn new(catalog: Arc<dyn CatalogBackend>, controllers: C) -> Self {
        Self {
            catalog,
            controllers,
            locks: KeyedLocks::default(),
            hook: None,
            carried: std::sync::Mutex::default(),
        }
    }

    /// Installs a step hook (crash tests).
    pub fn with_hook(mut self, hook: Hook) -> Self {
        self.hook = Some(hook);
        self
    }

    fn step(&self, name: &str) {
        if let Some(h) = &self.hook {
            h(name);
        }
    }

    /// The volume as stored now, with its version.
    async fn load(&self, id: &str) -> Result<(VolumeRecord, Version), ControlPlaneError> {
        self.catalog
            .load(id)
            .await?
            .ok_or_else(|| ControlPlaneError::NoVolume(id.to_string()))
    }

    /// Applies `f` to the volume's newest record and writes the result back when it changed.
    /// When another writer changed the volume in between, `f` decides again on a fresh read;
    /// an error from `f` changes nothing. Returns `f`'s answer and the record as written.
    ///
    /// With a backend that keeps a versioned view (etcd), the first try decides on that view
    /// instead of a read: its write compares the version, so it lands only when the view was
    /// the stored record. Any other outcome (the write found it changed, `f` refused, or there
    /// was nothing to write) is decided again on a fresh read.
    ///
    /// The deferred results carried for the volume are applied first, and the write carries
    /// them.
    async fn modify<T>(
        &self,
        id: &str,
        mut f: impl FnMut(&mut VolumeRecord) -> Result<T, ControlPlaneError>,
    ) -> Result<(T, VolumeRecord), ControlPlaneError> {
        let carried = self.carried_of(id);
        if let Some((mut rec, version)) = self.catalog.cached_versioned(id) {
            let before = rec.clone();
            carry(&carried, &mut rec);
            if let Ok(out) = f(&mut rec)
                && rec != before
                && let Written::Done(_) = self.catalog.store(&rec, version).await?
            {
                self.carried_written(id, carried.len());
                return Ok((out, rec));
            }
            tracing::debug!(
                volume_id = id,
                "the cached view was stale or decided nothing; deciding on a fresh read"
            );
        }
        for _ in 0..MAX_RACES {
            let (mut rec, version) = self.load(id).await?;
            let before = rec.clone();
            carry(&carried, &mut rec);
            let out = f(&mut rec)?;
            if rec == before {
                // The carried changes, if any, are already what is stored.
                self.carried_written(id, carried.len());
                return Ok((out, rec));
            }
            match self.catalog.store(&rec, version).await? {
                Written::Done(_) => {
                    self.carried_written(id, carried.len());
                    return Ok((out, rec));
                }
                Written::Changed => {
                    tracing::debug!(
                        volume_id = id,
                        "volume changed by another writer; deciding again"
                    );
                }
            }
        }
        Err(raced(id))
    }

    /// Applies `change`, a result that a crash may lose because the intent before it is redone
    /// at recovery, and returns the record with it. A catalog with deferred writes writes it
    /// now (see [`CatalogBackend::store_deferred`]); otherwise nothing is written: it is
    /// carried to the volume's next write, which costs no round trip of its own.
    async fn modify_deferred(
        &self,
        id: &str,
        change: Carried,
    ) -> Result<VolumeRecord, ControlPlaneError> {
        if !self.catalog.defers_writes() {
            let mut rec = match self.catalog.cached_versioned(id) {
                Some((rec, _)) => rec,
                None => self.load(id).await?.0,
            };
            carry(&self.carried_of(id), &mut rec);
            change(&mut rec);
            self.lock_carried()
                .entry(id.to_string())
                .or_default()
                .push(change);
            return Ok(rec);
        }
        for _ in 0..MAX_RACES {
            let (mut rec, version) = match self.catalog.cached_versioned(id) {
                Some(seen) => seen,
                None => self.load(id).await?,
            };
            change(&mut rec);
            if let Written::Done(_) = self.catalog.store_deferred(&rec, version).await? {
                return Ok(rec);
            }
        }
        Err(raced(id))
    }

    fn lock_carried(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Carried>>> {
        self.carried.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The deferred results carried for volume `id`, oldest first.
    fn carried_of(&self, id: &str) -> Vec<Carried> {
        self.lock_carried().get(id).cloned().unwrap_or_default()
    }

    /// Drops the `n` oldest carried results of volume `id`: a write carried them (or the
    /// volume is gone). Results carried since stay for the next write.
    fn carried_written(&self, id: &str, n: usize) {
        if n == 0 {
            return;
        }
        let mut carried = self.lock_carried();
        if let Some(v) = carried.get_mut(id) {
            v.drain(..n.min(v.len()));
            if v.is_empty() {
                carried.remove(id);
            }
        }
    }

    /// Every volume, by id.
    pub fn list(&self) -> Result<Vec<VolumeRecord>, ControlPlaneError> {
        self.catalog.list()
    }

    fn healthy_controller(
        &self,
        plugin_id: &str,
        needs: ControllerCapability,
    ) -> Result<ControllerHandle, ControlPlaneError> {
        let unavailable = |reason: String| ControlPlaneError::Unavailable {
            plugin_id: plugin_id.to_string(),
            reason,
        };
        match self.controllers.controller(plugin_id) {
            ControllerAccess::UnknownPlugin => Err(unavailable("no such plugin".into())),
            ControllerAccess::NodeOnly => Err(unavailable("it has no controller".into())),
            ControllerAccess::Unhealthy(why) => Err(unavailable(why)),
            ControllerAccess::Healthy(h) if h.capabilities.has(needs) => Ok(h),
            ControllerAccess::Healthy(_) => Err(unavailable(format!(
                "its controller does not offer {needs}"
            ))),
        }
    }

    /// Registers (`volume register`) or creates (`volume create`, CreateVolume) a volume from a
    /// checked spec. Registering checks the capabilities with ValidateVolumeCapabilities when
    /// the plugin has a controller. The same spec again is a no-op; a changed spec replaces an
    /// unclaimed registered volume and is refused for a claimed one. Nothing is stored on error.
    pub async fn put(&self, spec: &VolumeSpec) -> Result<VolumeRecord, ControlPlaneError> {
        let _guard = self.locks.lock(&spec.id).await;
        let (existing, version) = match self.catalog.load(&spec.id).await? {
            Some((rec, version)) => (Some(rec), version),
            None => (None, 0),
        };
        let access = self.controllers.controller(&spec.plugin_id);
        if matches!(access, ControllerAccess::UnknownPlugin) {
            return Err(ControlPlaneError::Invalid(format!(
                "plugin_id: no plugin {:?} is registered",
                spec.plugin_id
            )));
        }
        let rec = match &spec.kind {
            SpecKind::Register {
                external_id,
                capacity_min,
                capacity_max,
            } => {
                // Nomad records a registered volume's capacity range; berth keeps the largest
                // size it allows as the volume's capacity.
                let capacity = capacity_max
                    .or(*capacity_min)
                    .map_or(0, |b| i64::try_from(b).unwrap_or(i64::MAX));
                let rec = VolumeRecord::from_spec(
                    spec,
                    Origin::Registered,
                    external_id.clone(),
                    capacity,
                    spec.context.clone(),
                    spec.topology_request
                        .as_ref()
                        .map(|t| t.required.clone())
                        .unwrap_or_default(),
                    now_ms(),
                );
                if let Some(old) = &existing {
                    if old.origin == Origin::Registered && old.same_definition(&rec) {
                        return Ok(old.clone());
                    }
                    if old.origin == Origin::Created {
                        return Err(ControlPlaneError::Conflict(format!(
                            "volume {:?} was created by berth; delete it, or register under another id",
                            spec.id
                        )));
                    }
                    if !old.claims.is_empty() {
                        return Err(ControlPlaneError::Conflict(format!(
                            "volume {:?} is claimed; it cannot be changed until every claim is released",
                            spec.id
                        )));
                    }
                }
                if let ControllerAccess::Healthy(h) = &access {
                    self.validate(&rec, h).await?;
                } else if let ControllerAccess::Unhealthy(why) = access {
                    return Err(ControlPlaneError::Unavailable {
                        plugin_id: spec.plugin_id.clone(),
                        reason: format!("cannot validate the capabilities: {why}"),
                    });
                }
                let mut rec = rec;
                if let Some(old) = existing {
                    rec.created_ms = old.created_ms;
                }
                rec.controller_publish = publishes(&access);
                rec
            }
            SpecKind::Create { .. } => {
                if let Some(old) = existing {
                    // CreateVolume is idempotent by name: the same create again is the same
                    // volume.
                    if old.origin == Origin::Created
                        && old.name == spec.name
                        && old.plugin_id == spec.plugin_id
                    {
                        return Ok(old);
                    }
                    return Err(ControlPlaneError::Conflict(format!(
                        "volume {:?} already exists",
                        spec.id
                    )));
                }
                let h = self.healthy_controller(
                    &spec.plugin_id,
                    ControllerCapability::CreateDeleteVolume,
                )?;
                let req = spec
                    .create_request()
                    .ok_or_else(|| ControlPlaneError::Invalid("not a create spec".to_string()))?;
                let vol =
                    h.client.create_volume(&req).await.map_err(|source| {
                        csi_failed(&spec.plugin_id, Some(&spec.id), None, source)
                    })?;
                // The volume context is what CreateVolume returned, and every node call must
                // send exactly that (CSI: it "MUST match the volume_context of the volume");
                // a create spec's own context is not the plugin's, as Nomad treats it.
                if !spec.context.is_empty() {
                    tracing::warn!(volume_id = %spec.id, "the create spec's context is ignored: \
                        the volume's context is what the plugin returns");
                }
                let context = vol.context.clone();
                let mut rec = VolumeRecord::from_spec(
                    spec,
                    Origin::Created,
                    vol.external_id,
                    vol.capacity_bytes,
                    context,
                    vol.accessible_topology,
                    now_ms(),
                );
                rec.created_by = Some(h.instance.clone());
                rec.controller_publish = h
                    .capabilities
                    .has(ControllerCapability::PublishUnpublishVolume);
                rec
            }
        };
        if self.catalog.store(&rec, version).await? == Written::Changed {
            // Another node registered or created this id at the same time.
            return match self.catalog.load(&spec.id).await? {
                Some((other, _)) if other.same_definition(&rec) => Ok(other),
                _ => Err(ControlPlaneError::Conflict(format!(
                    "volume {:?} was changed by another node at the same time; look at it and try again",
                    spec.id
                ))),
            };
        }
        tracing::info!(volume_id = %rec.id, plugin_id = %rec.plugin_id, origin = ?rec.origin, "volume in the catalog");
        Ok(rec)
    }

    async fn validate(
        &self,
        rec: &VolumeRecord,
        h: &ControllerHandle,
    ) -> Result<(), ControlPlaneError> {
        let verdict = h
            .client
            .validate_capabilities(
                &rec.external_id,
                &rec.all_capabilities(),
                &rec.context,
                &rec.parameters,
                &rec.secrets.to_secrets(),
            )
            .await
            .map_err(|source| csi_failed(&rec.plugin_id, Some(&rec.id), None, source))?;
        match verdict {
            Validation::Confirmed => Ok(()),
            Validation::NotConfirmed(message) => Err(ControlPlaneError::Invalid(format!(
                "capability: plugin {:?} does not confirm the capabilities of volume {:?}: {message}",
                rec.plugin_id, rec.id
            ))),
        }
    }

    /// Removes an unclaimed volume from the catalog (the provider keeps it). A volume with
    /// claims is refused; `Ok(false)` when there was no such volume.
    pub async fn deregister(&self, id: &str) -> Result<bool, ControlPlaneError> {
        let _guard = self.locks.lock(id).await;
        for _ in 0..MAX_RACES {
            let Some((rec, version)) = self.catalog.load(id).await? else {
                return Ok(false);
            };
            if !rec.claims.is_empty() {
                return Err(ControlPlaneError::Conflict(format!(
                    "volume {id:?} has {} claim(s) ({}); release them, detach, or deregister with force",
                    rec.claims.len(),
                    rec.claims.keys().cloned().collect::<Vec<_>>().join(", ")
                )));
            }
            if let Written::Done(_) = self.catalog.remove(id, version).await? {
                self.lock_carried().remove(id);
                tracing::info!(volume_id = id, "volume deregistered");
                return Ok(true);
            }
        }
        Err(raced(id))
    }

    /// Deletes an unclaimed volume at the provider (DeleteVolume; NOT_FOUND = already gone)
    /// and from the catalog.
    pub async fn delete(&self, id: &str) -> Result<(), ControlPlaneError> {
        let _guard = self.locks.lock(id).await;
        let (rec, version) = self.load(id).await?;
        if !rec.claims.is_empty() {
            return Err(ControlPlaneError::Conflict(format!(
                "volume {id:?} has {} claim(s); release them first",
                rec.claims.len()
            )));
        }
        let h =
            self.healthy_controller(&rec.plugin_id, ControllerCapability::CreateDeleteVolume)?;
        // DeleteVolume answers OK for a volume the plugin does not have (the spec makes it
        // idempotent), so an OK alone proves nothing: the serving instance must first say it
        // has the volume (ValidateVolumeCapabilities, which every controller implements, answers
        // NOT_FOUND otherwise). Another instance with its own backend would delete nothing
        // and the volume's data would be orphaned.
        match self.validate(&rec, &h).await {
            // The volume is there (whether or not its capabilities are confirmed).
            Ok(()) | Err(ControlPlaneError::Invalid(_)) => {}
            Err(ControlPlaneError::Csi { source, .. })
                if source.code() == berth_csi::Code::NotFound =>
            {
                let created = match &rec.created_by {
                    Some(owner) if *owner != h.instance => {
                        format!(
                            " It was created through instance {owner:?}; run that instance again."
                        )
                    }
                    _ => String::new(),
                };
                tracing::warn!(volume_id = id, plugin = %rec.plugin_id, instance = %h.instance,
                "DeleteVolume not sent: the serving instance has no such volume; volume kept");
                return Err(ControlPlaneError::Conflict(format!(
                    "volume {id:?}: instance {:?} of plugin {:?}, which serves now, has no volume \
                 {:?}, so deleting it would delete nothing.{created} If the volume is gone \
                 for good, forget it with `volume deregister`.",
                    h.instance,
                    rec.plugin_id,
                    rec.external_id.as_str()
                )));
            }
            Err(e) => return Err(e),
        }
        if let Err(source) = h
            .client
            .delete_volume(&rec.external_id, &rec.secrets.to_secrets())
            .await
            && !source.is_already_done()
        {
            return Err(csi_failed(&rec.plugin_id, Some(id), None, source));
        }
        let mut version = version;
        for _ in 0..MAX_RACES {
            if let Written::Done(_) = self.catalog.remove(id, version).await? {
                self.lock_carried().remove(id);
                tracing::info!(volume_id = id, "volume deleted");
                return Ok(());
            }
            // Another node changed the record while DeleteVolume ran (a claim, say): the
            // volume is gone at the provider, so the record goes all the same.
            match self.catalog.load(id).await? {
                Some((other, v)) => {
                    tracing::warn!(
                        volume_id = id,
                        claims = other.claims.len(),
                        "volume changed while it was deleted; removing its record"
                    );
                    version = v;
                }
                None => return Ok(()),
            }
        }
        Err(raced(id))
    }

    /// ControllerExpandVolume when the controller offers it; records the new size. Returns the
    /// size and whether the node must expand too (always true without a controller step).
    pub async fn expand(
        &self,
        id: &str,
        capacity: CapacityRange,
    ) -> Result<(i64, bool), ControlPlaneError> {
        let _guard = self.locks.lock(id).await;
        let (rec, _) = self.load(id).await?;
        let (bytes, node) = match self.controllers.controller(&rec.plugin_id) {
            ControllerAccess::Healthy(h)
                if h.capabilities.has(ControllerCapability::ExpandVolume) =>
            {
                let cap = rec
                    .capabilities
                    .first()
                    .map(|c| rec.capability(c.access_mode, c.attachment_mode));
                h.client
                    .controller_expand(
                        &rec.external_id,
                        capacity,
                        cap.as_ref(),
                        &rec.secrets.to_secrets(),
                    )
                    .await
                    .map_err(|source| csi_failed(&rec.plugin_id, Some(id), None, source))?
            }
            ControllerAccess::Unhealthy(reason) => {
                return Err(ControlPlaneError::Unavailable {
                    plugin_id: rec.plugin_id.clone(),
                    reason,
                });
            }
            _ => (capacity.required_bytes, true),
        };
        let (capacity, _) = self
            .modify(id, |r| {
                r.capacity_bytes = bytes.max(r.capacity_bytes);
                Ok(r.capacity_bytes)
            })
            .await?;
        Ok((capacity, node))
    }

    /// CreateSnapshot of the volume (idempotent by name).
    pub async fn create_snapshot(
        &self,
        id: &str,
        name: &str,
        parameters: &BTreeMap<String, String>,
        secrets: Option<&Secrets>,
    ) -> Result<(VolumeRecord, Snapshot), ControlPlaneError> {
        let (rec, _) = self.load(id).await?;
        let h =
            self.healthy_controller(&rec.plugin_id, ControllerCapability::CreateDeleteSnapshot)?;
        let secrets = secrets.cloned().unwrap_or_else(|| rec.secrets.to_secrets());
        let snap = h
            .client
            .create_snapshot(&rec.external_id, name, parameters, &secrets)
            .await
            .map_err(|source| csi_failed(&rec.plugin_id, Some(id), None, source))?;
        Ok((rec, snap))
    }

    /// DeleteSnapshot (NOT_FOUND = already gone).
    pub async fn delete_snapshot(
        &self,
        plugin_id: &str,
        snapshot_id: &str,
        secrets: &Secrets,
    ) -> Result<(), ControlPlaneError> {
        let h = self.healthy_controller(plugin_id, ControllerCapability::CreateDeleteSnapshot)?;
        match h.client.delete_snapshot(snapshot_id, secrets).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_already_done() => Ok(()),
            Err(source) => Err(csi_failed(plugin_id, None, None, source)),
        }
    }

    /// Every snapshot the plugin lists (all pages).
    pub async fn list_snapshots(
        &self,
        plugin_id: &str,
    ) -> Result<Vec<Snapshot>, ControlPlaneError> {
        let h = self.healthy_controller(plugin_id, ControllerCapability::ListSnapshots)?;
        let mut out = Vec::new();
        let mut token = String::new();
        loop {
            let page = h
                .client
                .list_snapshots(None, None, 0, &token, &Secrets::default())
                .await
                .map_err(|source| csi_failed(plugin_id, None, None, source))?;
            out.extend(page.entries);
            if page.next_token.is_empty() {
                return Ok(out);
            }
            token = page.next_token;
        }
    }

    /// ControllerUnpublishVolume of the volume for `node_id` when it is published there
    /// (marked `unpublishing` first; `NOT_FOUND` is done). Returns whether it ran. The caller
    /// holds the volume's lock and has made sure the node holds no mount of it any more.
    async fn unpublish_node(
        &self,
        rec: &VolumeRecord,
        node_id: &str,
        alloc_id: Option<&str>,
    ) -> Result<bool, ControlPlaneError> {
        let volume_id = rec.id.as_str();
        let Some(p) = rec.publications.get(node_id).cloned() else {
            return Ok(false);
        };
        let handle = match self.controllers.controller(&rec.plugin_id) {
            ControllerAccess::Healthy(h) => h,
            ControllerAccess::Unhealthy(reason) => {
                return Err(ControlPlaneError::Unavailable {
                    plugin_id: rec.plugin_id.clone(),
                    reason: format!(
                        "no healthy controller for ControllerUnpublishVolume: {reason}"
                    ),
                });
            }
            ControllerAccess::UnknownPlugin | ControllerAccess::NodeOnly => {
                return Err(ControlPlaneError::Unavailable {
                    plugin_id: rec.plugin_id.clone(),
                    reason: "its controller is gone; ControllerUnpublishVolume waits for it".into(),
                });
            }
        };
        // Durable: a claim on the node must not find the publication published once this call
        // may have detached the volume. With the embedded store it also makes the node's
        // deferred records of the release durable before the controller step. Already so
        // (marked when the release began, or by an earlier try), there is nothing to write.
        let rec = if p.state == PublicationState::Unpublishing {
            rec.clone()
        } else {
            self.modify(volume_id, |r| {
                if let Some(p) = r.publications.get_mut(node_id) {
                    p.state = PublicationState::Unpublishing;
                }
                Ok(())
            })
            .await?
            .1
        };
        self.step("ControllerUnpublishVolume:before");
        match handle
            .client
            .controller_unpublish(&rec.external_id, &p.csi_node_id, &rec.secrets.to_secrets())
            .await
        {
            Ok(()) => {}
            Err(e) if e.is_already_done() => {}
            Err(e) => {
                return Err(csi_failed(&rec.plugin_id, Some(volume_id), alloc_id, e));
            }
        }
        self.step("ControllerUnpublishVolume:after");
        tracing::info!(volume_id, node_id, "controller unpublished");
        Ok(true)
    }

    /// Frees every claim that node `node_id` holds on the volume, for a node that is down and
    /// cannot run its own steps (as Nomad does since 1.3.2): the claims are marked releasing,
    /// ControllerUnpublishVolume runs for the node when the volume is published there, then
    /// the claims go. Returns the allocs freed. The caller must know the node is down: a node
    /// that is only cut off may still hold the mount. On error the claims stay releasing.
    pub async fn free_node(
        &self,
        volume_id: &str,
        node_id: &str,
    ) -> Result<Vec<String>, ControlPlaneError> {
        let _guard = self.locks.lock(volume_id).await;
        let (allocs, rec) = self
            .modify(volume_id, |r| {
                let mut allocs = Vec::new();
                for c in r.claims.values_mut().filter(|c| c.claim.node_id == node_id) {
                    c.state = ClaimState::Releasing;
                    allocs.push(c.claim.alloc_id.clone());
                }
                Ok(allocs)
            })
            .await?;
        if allocs.is_empty() && !rec.publications.contains_key(node_id) {
            return Ok(allocs);
        }
        let unpublished = self.unpublish_node(&rec, node_id, None).await?;
        self.modify(volume_id, |r| {
            if unpublished {
                r.publications.remove(node_id);
            }
            for a in &allocs {
                if r.claims.get(a).is_some_and(|c| c.claim.node_id == node_id) {
                    r.claims.remove(a);
                }
            }
            Ok(())
        })
        .await?;
        tracing::info!(volume_id, node_id, allocs = ?allocs, "claims of a down node freed");
        Ok(allocs)
    }

    fn controller_err(
        &self,
        rec: &VolumeRecord,
        alloc_id: &str,
        source: CsiError,
    ) -> ControlPlaneError {
        csi_failed(&rec.plugin_id, Some(&rec.id), Some(alloc_id), source)
    }
}

/// The error of a change that kept losing races.
fn raced(id: &str) -> ControlPlaneError {
    ControlPlaneError::Conflict(format!(
        "volume {id:?} was changed by other nodes {MAX_RACES} times while this change was decided; try again"
    ))
}

/// The claim of `alloc_id`, or the error of a claim that vanished (a forced detach) while
/// its controller step ran.
fn held<'r>(
    rec: &'r mut VolumeRecord,
    alloc_id: &str,
) -> Result<&'r mut ClaimRecord, ControlPlaneError> {
    let id = rec.id.clone();
    rec.claims.get_mut(alloc_id).ok_or_else(|| {
        ControlPlaneError::Conflict(format!("volume {id:?}: alloc {alloc_id:?} holds no claim"))
    })
}

impl<C: Controllers> ControlPlane for Plane<C> {
    async fn claim(&self, req: NodeClaim) -> Result<Grant, ControlPlaneError> {
        let _guard = self.locks.lock(&req.volume_id).await;
        let alloc_id = req.claim.alloc_id.clone();
        let node_id = req.claim.node_id.clone();
        // The spec: "CO MUST set this field to false if SP does not have the PUBLISH_READONLY
        // controller capability" (the node side still mounts read-only).
        let read_only_for = |h: &ControllerHandle| {
            req.claim.access_mode.is_read_only()
                && h.capabilities.has(ControllerCapability::PublishReadonly)
        };
        // The controller as seen when the claim was written; with a healthy one, the claim and
        // the node's publication intent are one write.
        let mut access = ControllerAccess::UnknownPlugin;
        let ((), rec) = self
            .modify(&req.volume_id, |rec| {
                match rec.claims.get(&alloc_id) {
                    Some(c) if c.state == ClaimState::Releasing => {
                        Err(ControlPlaneError::Conflict(format!(
                            "volume {:?}: the claim of alloc {alloc_id:?} is being released; try again when it is gone",
                            rec.id
                        )))
                    }
                    Some(c) if c.claim == req.claim && c.mount_options == req.mount_options => {
                        Ok(())
                    }
                    Some(c) => Err(ControlPlaneError::Conflict(format!(
                        "volume {:?}: alloc {alloc_id:?} already holds a {} claim as {}/{} (or with other mount options); release it first",
                        rec.id, c.claim.mode, c.claim.access_mode, c.claim.attachment_mode
                    ))),
                    None => {
                        let mut set = rec
                            .claim_set()
                            .map_err(|e| ControlPlaneError::Conflict(e.to_string()))?;
                        set.claim(&rec.capability_pairs(), req.claim.clone())
                            .map_err(|source| ControlPlaneError::Refused {
                                volume_id: req.volume_id.clone(),
                                alloc_id: alloc_id.clone(),
                                source: Box::new(source),
                            })?;
                        rec.claims.insert(
                            alloc_id.clone(),
                            ClaimRecord {
                                claim: req.claim.clone(),
                                state: ClaimState::Claiming,
                                error: None,
                                mount_options: req.mount_options.clone(),
                            },
                        );
                        Ok(())
                    }
                }?;
                access = self.controllers.controller(&rec.plugin_id);
                let published = rec
                    .publications
                    .get(&node_id)
                    .is_some_and(|p| p.state == PublicationState::Published);
                if let ControllerAccess::Healthy(h) = &access
                    && h.capabilities
                        .has(ControllerCapability::PublishUnpublishVolume)
                    && !published
                {
                    rec.controller_publish = true;
                    rec.publications.insert(
                        node_id.clone(),
                        Publication {
                            csi_node_id: req.csi_node_id.clone(),
                            state: PublicationState::Publishing,
                            publish_context: BTreeMap::new(),
                            read_only: read_only_for(h),
                        },
                    );
                }
                Ok(())
            })
            .await?;

        // The controller step, once per node.
        if let Some(p) = rec.publications.get(&node_id)
            && p.state == PublicationState::Published
        {
            let publish_context = p.publish_context.clone();
            return Ok(Grant {
                volume: rec,
                publish_context,
            });
        }
        let handle = match access {
            ControllerAccess::Healthy(h)
                if h.capabilities
                    .has(ControllerCapability::PublishUnpublishVolume) =>
            {
                h
            }
            ControllerAccess::Unhealthy(reason) => {
                return Err(ControlPlaneError::Unavailable {
                    plugin_id: rec.plugin_id.clone(),
                    reason: format!("no healthy controller for ControllerPublishVolume: {reason}"),
                });
            }
            ControllerAccess::UnknownPlugin | ControllerAccess::NodeOnly
                if rec.controller_publish =>
            {
                return Err(ControlPlaneError::Unavailable {
                    plugin_id: rec.plugin_id.clone(),
                    reason: "the volume needs ControllerPublishVolume and no controller of the plugin is registered".into(),
                });
            }
            _ => {
                return Ok(Grant {
                    volume: rec,
                    publish_context: BTreeMap::new(),
                });
            }
        };

        let read_only = read_only_for(&handle);
        self.step("ControllerPublishVolume:before");
        let publish = ControllerPublish {
            external_id: rec.external_id.clone(),
            node_id: req.csi_node_id.clone(),
            capability: rec.capability(req.claim.access_mode, req.claim.attachment_mode),
            read_only,
            volume_context: rec.context.clone(),
            secrets: rec.secrets.to_secrets(),
        };
        let context = handle
            .client
            .controller_publish(&publish)
            .await
            .map_err(|e| self.controller_err(&rec, &req.claim.alloc_id, e))?;
        self.step("ControllerPublishVolume:after");
        // A crash may lose this result: the publication's intent is durable, and recovery
        // sends ControllerPublishVolume again (idempotent) before any node step.
        let published: Carried = {
            let (node_id, context) = (node_id.clone(), context.clone());
            Arc::new(move |r: &mut VolumeRecord| {
                if let Some(p) = r.publications.get_mut(&node_id) {
                    p.state = PublicationState::Published;
                    p.publish_context = context.clone();
                }
            })
        };
        let rec = self.modify_deferred(&req.volume_id, published).await?;
        tracing::info!(volume_id = %rec.id, node_id, "controller published");
        Ok(Grant {
            volume: rec,
            publish_context: context,
        })
    }

    async fn confirm(&self, volume_id: &str, alloc_id: &str) -> Result<(), ControlPlaneError> {
        let _guard = self.locks.lock(volume_id).await;
        self.modify(volume_id, |rec| {
            let c = held(rec, alloc_id)?;
            if c.state == ClaimState::Releasing {
                return Err(ControlPlaneError::Conflict(format!(
                    "volume {volume_id:?}: the claim of alloc {alloc_id:?} is being released"
                )));
            }
            c.state = ClaimState::Claimed;
            c.error = None;
            Ok(())
        })
        .await
        .map(drop)
    }

    async fn begin_release(
        &self,
        volume_id: &str,
        alloc_id: &str,
    ) -> Result<Option<ClaimRecord>, ControlPlaneError> {
        let _guard = self.locks.lock(volume_id).await;
        // Over a catalog whose every write is a transaction (etcd), the last claim on a node
        // marks the node's publication as being unpublished in the same write, instead of one
        // more before ControllerUnpublishVolume. Earlier is only more careful: a claim on the
        // node in between publishes it again (idempotent). The embedded store keeps that
        // write where it is: it also makes the node's deferred release records durable
        // before the controller step.
        let early = !self.catalog.defers_writes();
        let (out, _) = self
            .modify(volume_id, |rec| {
                let Some(c) = rec.claims.get_mut(alloc_id) else {
                    return Ok(None);
                };
                c.state = ClaimState::Releasing;
                let c = c.clone();
                let node_id = &c.claim.node_id;
                if early
                    && !rec
                        .claims
                        .values()
                        .any(|o| o.claim.alloc_id != alloc_id && o.claim.node_id == *node_id)
                    && let Some(p) = rec.publications.get_mut(node_id)
                {
                    p.state = PublicationState::Unpublishing;
                }
                Ok(Some(c))
            })
            .await?;
        Ok(out)
    }

    async fn finish_release(
        &self,
        volume_id: &str,
        alloc_id: &str,
    ) -> Result<(), ControlPlaneError> {
        let _guard = self.locks.lock(volume_id).await;
        // The versioned view saves a read when it shows the claim being released: this
        // agent's own writes are in it, and the writes below compare the version. Anything
        // else is decided on a fresh read.
        let seen = self
            .catalog
            .cached_versioned(volume_id)
            .map(|(rec, _)| rec)
            .filter(|rec| {
                rec.claims
                    .get(alloc_id)
                    .is_some_and(|c| c.state == ClaimState::Releasing)
            });
        let rec = match seen {
            Some(rec) => rec,
            None => self.load(volume_id).await?.0,
        };
        let Some(c) = rec.claims.get(alloc_id) else {
            return Ok(());
        };
        if c.state != ClaimState::Releasing {
            return Err(ControlPlaneError::Conflict(format!(
                "volume {volume_id:?}: the claim of alloc {alloc_id:?} is not being released"
            )));
        }
        let node_id = c.claim.node_id.clone();
        // Claims from this node are all made by this agent, which holds the volume's lock:
        // none can appear until the release is done.
        let last_on_node = !rec
            .claims
            .values()
            .any(|o| o.claim.alloc_id != alloc_id && o.claim.node_id == node_id);
        let unpublished =
            last_on_node && self.unpublish_node(&rec, &node_id, Some(alloc_id)).await?;
        self.modify(volume_id, |r| {
            if unpublished {
                r.publications.remove(&node_id);
            }
            r.claims.remove(alloc_id);
            Ok(())
        })
        .await?;
        tracing::info!(volume_id, alloc_id, "claim freed");
        Ok(())
    }

    async fn set_error(
        &self,
        volume_id: &str,
        alloc_id: &str,
        error: Option<String>,
    ) -> Result<(), ControlPlaneError> {
        let _guard = self.locks.lock(volume_id).await;
        self.modify(volume_id, |rec| {
            if let Some(c) = rec.claims.get_mut(alloc_id) {
                c.error = error.clone();
            }
            Ok(())
        })
        .await
        .map(drop)
    }

    fn volume(&self, volume_id: &str) -> Result<Option<VolumeRecord>, ControlPlaneError> {
        self.catalog.cached(volume_id)
    }

    fn node_claims(
        &self,
        node_id: &str,
    ) -> Result<Vec<(VolumeRecord, Vec<ClaimRecord>)>, ControlPlaneError> {
        Ok(self
            .list()?
            .into_iter()
            .filter_map(|v| {
                let mine: Vec<ClaimRecord> = v
                    .claims
                    .values()
                    .filter(|c| c.claim.node_id == node_id)
                    .cloned()
                    .collect();
                (!mine.is_empty()).then_some((v, mine))
            })
            .collect())
    }
}
