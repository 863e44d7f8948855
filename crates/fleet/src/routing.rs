//! Controller RPCs routed across the fleet: a node without a healthy controller instance of a
//! plugin asks a node that has one, through etcd.
//!
//! The asking node writes `<prefix>/controller/requests/<serving node>/<id>` (fenced by its
//! registration, never on a lease: a request outlives the death of either side). Every node
//! watches its own request directory, runs each request on its local controller, and in one
//! transaction writes `<prefix>/controller/results/<asking node>/<id>` and deletes the request.
//! The asking node watches its result directory. A node that dies while serving finds its
//! requests again when it comes back and runs them again (controller RPCs are idempotent by
//! spec); a request past its deadline is answered `DEADLINE_EXCEEDED` without being run, so a
//! publish the asker gave up on is never made late; an asker that gave up first withdraws its
//! request, which succeeds only if no node has answered it.

use std::{
    collections::{BTreeMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use berth_api::nodes::NodeState;
use berth_controlplane::{
    ControllerAccess, ControllerHandle, ControllerRpc, Controllers, StoredSecrets,
    backend::BoxFuture,
};
use berth_csi::{
    CapacityRange, Code, ContentSource, ControllerPublish, CreateVolume, CsiError, Page, Rpc,
    Validation,
    model::{AccessMode, AccessType, ExternalId, Secrets, Snapshot, Volume, VolumeCapability},
    pb,
};
use berth_sys::now_ms;
use berth_volume::StoredMountOptions;
use serde::{Deserialize, Serialize};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::{
    cache::WatchedDir,
    etcd::{Etcd, Outcome, Write},
    nodes::Membership,
};

/// How long an asker waits past the RPC's own overall deadline before it withdraws its request.
const MARGIN: Duration = Duration::from_secs(30);
/// How long a result nobody collected is kept (its asker died or gave up).
const RESULT_KEPT: Duration = Duration::from_secs(600);
/// How often a serving node looks at its directories again without a change (requests it could
/// not answer while its registration had lapsed; results nobody collected).
const SWEEP: Duration = Duration::from_secs(30);

/// A controller RPC with its arguments (secrets included: requests live in etcd only until
/// they are answered, as the volume records that hold the same secrets do).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "rpc", rename_all = "snake_case")]
pub enum Call {
    /// CreateVolume.
    CreateVolume {
        /// Name.
        name: String,
        /// Bytes required.
        required_bytes: i64,
        /// Bytes allowed.
        limit_bytes: i64,
        /// Capabilities.
        capabilities: Vec<WireCapability>,
        /// Parameters.
        parameters: BTreeMap<String, String>,
        /// Secrets.
        secrets: StoredSecrets,
        /// A snapshot to start from.
        #[serde(default)]
        from_snapshot: Option<String>,
        /// A volume to clone.
        #[serde(default)]
        from_volume: Option<ExternalId>,
        /// Topology: requisite segments.
        #[serde(default)]
        requisite: Option<Vec<BTreeMap<String, String>>>,
        /// Topology: preferred segments.
        #[serde(default)]
        preferred: Vec<BTreeMap<String, String>>,
    },
    /// ValidateVolumeCapabilities.
    Validate {
        /// The volume.
        external_id: ExternalId,
        /// Capabilities.
        capabilities: Vec<WireCapability>,
        /// Volume context.
        context: BTreeMap<String, String>,
        /// Parameters.
        parameters: BTreeMap<String, String>,
        /// Secrets.
        secrets: StoredSecrets,
    },
    /// DeleteVolume.
    DeleteVolume {
        /// The volume.
        external_id: ExternalId,
        /// Secrets.
        secrets: StoredSecrets,
    },
    /// ControllerExpandVolume.
    Expand {
        /// The volume.
        external_id: ExternalId,
        /// Bytes required.
        required_bytes: i64,
        /// Bytes allowed.
        limit_bytes: i64,
        /// How it is used.
        capability: Option<WireCapability>,
        /// Secrets.
        secrets: StoredSecrets,
    },
    /// CreateSnapshot.
    CreateSnapshot {
        /// The volume.
        source: ExternalId,
        /// Name.
        name: String,
        /// Parameters.
        parameters: BTreeMap<String, String>,
        /// Secrets.
        secrets: StoredSecrets,
    },
    /// DeleteSnapshot.
    DeleteSnapshot {
        /// The snapshot.
        snapshot_id: String,
        /// Secrets.
        secrets: StoredSecrets,
    },
    /// ListSnapshots (one page).
    ListSnapshots {
        /// Of this volume only.
        source: Option<ExternalId>,
        /// This snapshot only.
        snapshot_id: Option<String>,
        /// Page size.
        max_entries: i32,
        /// Page token.
        starting_token: String,
        /// Secrets.
        secrets: StoredSecrets,
    },
    /// ControllerPublishVolume.
    Publish {
        /// The volume.
        external_id: ExternalId,
        /// The plugin's id of the node to publish to.
        node_id: String,
        /// How it will be used.
        capability: WireCapability,
        /// Read-only.
        read_only: bool,
        /// Volume context.
        context: BTreeMap<String, String>,
        /// Secrets.
        secrets: StoredSecrets,
    },
    /// ControllerUnpublishVolume.
    Unpublish {
        /// The volume.
        external_id: ExternalId,
        /// The plugin's id of the node.
        node_id: String,
        /// Secrets.
        secrets: StoredSecrets,
    },
}

/// A volume capability as a request carries it (the mount flags in the clear, as the claims
/// that hold the same flags are stored; `Debug` never shows them).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireCapability {
    /// The access mode.
    pub access_mode: AccessMode,
    /// Block rather than mount.
    pub block: bool,
    /// The mount options (mount access only).
    #[serde(default)]
    pub mount: StoredMountOptions,
}

impl From<&VolumeCapability> for WireCapability {
    fn from(c: &VolumeCapability) -> Self {
        match &c.access_type {
            AccessType::Block => Self {
                access_mode: c.access_mode,
                block: true,
                mount: StoredMountOptions::default(),
            },
            AccessType::Mount(m) => Self {
                access_mode: c.access_mode,
                block: false,
                mount: m.into(),
            },
        }
    }
}

impl WireCapability {
    fn to_capability(&self) -> VolumeCapability {
        if self.block {
            VolumeCapability::block(self.access_mode)
        } else {
            VolumeCapability::mount(self.access_mode, (&self.mount).into())
        }
    }
}

fn caps(c: &[WireCapability]) -> Vec<VolumeCapability> {
    c.iter().map(WireCapability::to_capability).collect()
}

impl Call {
    /// The RPC.
    pub fn rpc(&self) -> Rpc {
        match self {
            Self::CreateVolume { .. } => Rpc::CreateVolume,
            Self::Validate { .. } => Rpc::ValidateVolumeCapabilities,
            Self::DeleteVolume { .. } => Rpc::DeleteVolume,
            Self::Expand { .. } => Rpc::ControllerExpandVolume,
            Self::CreateSnapshot { .. } => Rpc::CreateSnapshot,
            Self::DeleteSnapshot { .. } => Rpc::DeleteSnapshot,
            Self::ListSnapshots { .. } => Rpc::ListSnapshots,
            Self::Publish { .. } => Rpc::ControllerPublishVolume,
            Self::Unpublish { .. } => Rpc::ControllerUnpublishVolume,
        }
    }

    /// Runs the call on `ctl`.
    async fn run(self, ctl: &dyn ControllerRpc) -> Result<Reply, CsiError> {
        Ok(match self {
            Self::CreateVolume {
                name,
                required_bytes,
                limit_bytes,
                capabilities,
                parameters,
                secrets,
                from_snapshot,
                from_volume,
                requisite,
                preferred,
            } => {
                let topo = |segs: Vec<BTreeMap<String, String>>| -> Vec<pb::Topology> {
                    segs.into_iter()
                        .map(|s| pb::Topology {
                            segments: s.into_iter().collect(),
                        })
                        .collect()
                };
                let req = CreateVolume {
                    name,
                    capacity: CapacityRange {
                        required_bytes,
                        limit_bytes,
                    },
                    capabilities: caps(&capabilities),
                    parameters,
                    secrets: secrets.to_secrets(),
                    source: from_snapshot
                        .map(ContentSource::Snapshot)
                        .or(from_volume.map(ContentSource::Volume)),
                    accessibility_requirements: requisite.map(|r| pb::TopologyRequirement {
                        requisite: topo(r),
                        preferred: topo(preferred),
                    }),
                };
                Reply::Volume(ctl.create_volume(&req).await?)
            }
            Self::Validate {
                external_id,
                capabilities,
                context,
                parameters,
                secrets,
            } => match ctl
                .validate_capabilities(
                    &external_id,
                    &caps(&capabilities),
                    &context,
                    &parameters,
                    &secrets.to_secrets(),
                )
                .await?
            {
                Validation::Confirmed => Reply::Confirmed,
                Validation::NotConfirmed(m) => Reply::NotConfirmed(m),
            },
            Self::DeleteVolume {
                external_id,
                secrets,
            } => {
                ctl.delete_volume(&external_id, &secrets.to_secrets())
                    .await?;
                Reply::Done
            }
            Self::Expand {
                external_id,
                required_bytes,
                limit_bytes,
                capability,
                secrets,
            } => {
                let (bytes, node) = ctl
                    .controller_expand(
                        &external_id,
                        CapacityRange {
                            required_bytes,
                            limit_bytes,
                        },
                        capability
                            .as_ref()
                            .map(WireCapability::to_capability)
                            .as_ref(),
                        &secrets.to_secrets(),
                    )
                    .await?;
                Reply::Expanded { bytes, node }
            }
            Self::CreateSnapshot {
                source,
                name,
                parameters,
                secrets,
            } => Reply::Snapshot(
                ctl.create_snapshot(&source, &name, &parameters, &secrets.to_secrets())
                    .await?,
            ),
            Self::DeleteSnapshot {
                snapshot_id,
                secrets,
            } => {
                ctl.delete_snapshot(&snapshot_id, &secrets.to_secrets())
                    .await?;
                Reply::Done
            }
            Self::ListSnapshots {
                source,
                snapshot_id,
                max_entries,
                starting_token,
                secrets,
            } => {
                let page = ctl
                    .list_snapshots(
                        source.as_ref(),
                        snapshot_id.as_deref(),
                        max_entries,
                        &starting_token,
                        &secrets.to_secrets(),
                    )
                    .await?;
                Reply::Snapshots {
                    entries: page.entries,
                    next_token: page.next_token,
                }
            }
            Self::Publish {
                external_id,
                node_id,
                capability,
                read_only,
                context,
                secrets,
            } => Reply::Published(
                ctl.controller_publish(&ControllerPublish {
                    external_id,
                    node_id,
                    capability: capability.to_capability(),
                    read_only,
                    volume_context: context,
                    secrets: secrets.to_secrets(),
                })
                .await?,
            ),
            Self::Unpublish {
                external_id,
                node_id,
                secrets,
            } => {
                ctl.controller_unpublish(&external_id, &node_id, &secrets.to_secrets())
                    .await?;
                Reply::Done
            }
        })
    }
}

/// A successful answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    /// DeleteVolume, DeleteSnapshot, ControllerUnpublishVolume.
    Done,
    /// CreateVolume.
    Volume(Volume),
    /// ValidateVolumeCapabilities confirmed.
    Confirmed,
    /// ValidateVolumeCapabilities not confirmed, with the plugin's message.
    NotConfirmed(String),
    /// ControllerExpandVolume.
    Expanded {
        /// The new size.
        bytes: i64,
        /// Whether the node must expand too.
        node: bool,
    },
    /// CreateSnapshot.
    Snapshot(Snapshot),
    /// ListSnapshots.
    Snapshots {
        /// The page.
        entries: Vec<Snapshot>,
        /// The next page's token.
        next_token: String,
    },
    /// ControllerPublishVolume: the publish context.
    Published(BTreeMap<String, String>),
}

/// A failed answer: the gRPC code and the (already sanitized) text.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RemoteError {
    /// The gRPC code.
    pub code: i32,
    /// What went wrong (never a secret or mount flag: CSI errors are scrubbed when made).
    pub message: String,
    /// Attempts the serving node made.
    pub attempts: u32,
    /// `NOT_FOUND` that means "already done".
    pub already_done: bool,
}

impl From<CsiError> for RemoteError {
    fn from(e: CsiError) -> Self {
        let code = e.code() as i32;
        let already_done = e.is_already_done();
        let (message, attempts) = match e {
            CsiError::Rpc {
                message, attempts, ..
            } => (message, attempts),
            CsiError::Exhausted {
                message, attempts, ..
            } => (
                format!("gave up after the overall deadline: {message}"),
                attempts,
            ),
            other => (other.to_string(), 1),
        };
        Self {
            code,
            message,
            attempts,
            already_done,
        }
    }
}

impl RemoteError {
    fn new(code: Code, message: String) -> Self {
        Self {
            code: code as i32,
            message,
            attempts: 0,
            already_done: false,
        }
    }

    fn into_csi(self, rpc: Rpc, node: &str) -> CsiError {
        CsiError::Rpc {
            rpc,
            code: Code::from(self.code),
            message: format!("on node {node}: {}", self.message),
            attempts: self.attempts,
            already_done: self.already_done,
        }
    }
}

/// `<prefix>/controller/requests/<serving node>/<id>`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ControllerRequest {
    /// The asking node.
    pub from: String,
    /// The plugin.
    pub plugin_id: String,
    /// The call.
    pub call: Call,
    /// Not run after this (ms since the epoch): the asker has given up by then.
    pub deadline_ms: u64,
}

/// `<prefix>/controller/results/<asking node>/<id>`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ControllerResult {
    /// The node that answered.
    pub node_id: String,
    /// The answer.
    pub outcome: Result<Reply, RemoteError>,
    /// When (ms since the epoch).
    pub finished_ms: u64,
}

/// Routing statistics (for tests and the closing figures).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouterStats {
    /// Requests this node sent to others.
    pub sent: u64,
    /// Requests this node answered for others.
    pub served: u64,
}

struct Inner {
    etcd: Etcd,
    node_id: String,
    membership: Arc<Membership>,
    requests: Arc<WatchedDir<ControllerRequest>>,
    results: Arc<WatchedDir<ControllerResult>>,
    in_flight: Mutex<HashSet<String>>,
    stats: Mutex<RouterStats>,
}

/// This node's end of controller routing: finds remote controllers (as [`Controllers`]) and
/// serves the requests of other nodes ([`Router::serve`]). Cheap to clone.
#[derive(Clone)]
pub struct Router {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("node_id", &self.inner.node_id)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Router {
    /// The router of `node_id`; its mirrors run with [`Router::mirrors`].
    pub fn new(etcd: Etcd, membership: Arc<Membership>, node_id: String) -> Self {
        let requests = WatchedDir::new(etcd.dir(&format!("controller/requests/{node_id}")));
        let results = WatchedDir::new(etcd.dir(&format!("controller/results/{node_id}")));
        Self {
            inner: Arc::new(Inner {
                etcd,
                node_id,
                membership,
                requests,
                results,
                in_flight: Mutex::new(HashSet::new()),
                stats: Mutex::new(RouterStats::default()),
            }),
        }
    }

    /// Starts the mirrors of this node's request and result directories.
    pub fn mirrors(&self, tasks: &TaskTracker, shutdown: &CancellationToken) {
        let i = &self.inner;
        tasks.spawn(Arc::clone(&i.requests).run(i.etcd.clone(), shutdown.clone()));
        tasks.spawn(Arc::clone(&i.results).run(i.etcd.clone(), shutdown.clone()));
    }

    /// What was routed so far.
    pub fn stats(&self) -> RouterStats {
        *lock(&self.inner.stats)
    }

    fn request_key(&self, node: &str, id: &str) -> String {
        self.inner.etcd.key(&["controller", "requests", node, id])
    }

    fn result_key(&self, node: &str, id: &str) -> String {
        self.inner.etcd.key(&["controller", "results", node, id])
    }

    /// Sends `call` to `node` and waits for its answer (at most the RPC's overall deadline
    /// plus a margin; then the request is withdrawn unless it was answered).
    async fn call(
        &self,
        node: &str,
        node_name: &str,
        plugin_id: &str,
        call: Call,
    ) -> Result<Reply, CsiError> {
        let i = &self.inner;
        let rpc = call.rpc();
        let fail = |code: Code, text: String| RemoteError::new(code, text).into_csi(rpc, node_name);
        let Some(fence) = i.membership.fence() else {
            return Err(fail(
                Code::Unavailable,
                "this node is not registered with the fleet now; nothing was sent".into(),
            ));
        };
        let wait = rpc.policy().overall_timeout + MARGIN;
        let id = format!("{:032x}", rand::random::<u128>());
        let req = ControllerRequest {
            from: i.node_id.clone(),
            plugin_id: plugin_id.to_string(),
            call,
            deadline_ms: now_ms() + u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        };
        let key = self.request_key(node, &id);
        let mut changes = i.results.subscribe();
        let revision = match i.etcd.put_if(&key, &req, 0, Some(&fence)).await {
            Ok(Outcome::Done(r)) => r,
            Ok(Outcome::Fenced) => {
                i.membership.lapsed(&fence);
                return Err(fail(
                    Code::Unavailable,
                    "this node's fleet registration lapsed; nothing was sent".into(),
                ));
            }
            Ok(Outcome::Changed) => {
                return Err(fail(Code::Aborted, "request id already in use".into()));
            }
            Err(e) => return Err(fail(Code::Unavailable, e.to_string())),
        };
        lock(&i.stats).sent += 1;
        tracing::debug!(%rpc, plugin = plugin_id, node = node_name, "controller RPC sent to another node");
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(res) = i.results.get_versioned(&id) {
                return self
                    .collect(&id, res.value, res.mod_revision, rpc, node_name)
                    .await;
            }
            tokio::select! {
                r = changes.changed() => if r.is_err() { break },
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
        // No answer in time: withdraw the request, unless it was answered meanwhile.
        match i.etcd.delete_if(&key, revision, None).await {
            Ok(Outcome::Done(_)) => Err(fail(
                Code::DeadlineExceeded,
                format!(
                    "no answer within {}; the request was withdrawn",
                    berth_sys::short_duration(wait)
                ),
            )),
            _ => match i
                .etcd
                .get::<ControllerResult>(&self.result_key(&i.node_id, &id))
                .await
            {
                Ok(Some(res)) => {
                    self.collect(&id, res.value, res.mod_revision, rpc, node_name)
                        .await
                }
                Ok(None) => Err(fail(
                    Code::DeadlineExceeded,
                    format!(
                        "no answer within {}, and the request could not be withdrawn",
                        berth_sys::short_duration(wait)
                    ),
                )),
                Err(e) => Err(fail(Code::Unavailable, e.to_string())),
            },
        }
    }

    /// Takes an answer: deletes it from etcd and returns it.
    async fn collect(
        &self,
        id: &str,
        res: ControllerResult,
        revision: i64,
        rpc: Rpc,
        node_name: &str,
    ) -> Result<Reply, CsiError> {
        let i = &self.inner;
        if let Err(e) = i
            .etcd
            .delete_if(&self.result_key(&i.node_id, id), revision, None)
            .await
        {
            tracing::debug!(error = %e, "a collected controller result stays until the sweep");
        }
        res.outcome.map_err(|e| e.into_csi(rpc, node_name))
    }

    /// Serves the requests other nodes send this node, on its `local` controllers, until
    /// `shutdown`. Also deletes results nobody collected.
    pub async fn serve(
        self,
        local: Arc<dyn Controllers>,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) {
        let i = &self.inner;
        let mut changes = i.requests.subscribe();
        let mut lease = i.membership.subscribe();
        i.requests.wait_synced(&shutdown).await;
        i.results.wait_synced(&shutdown).await;
        loop {
            if i.membership.fence().is_some() {
                for (id, v) in i.requests.all_versioned() {
                    if !lock(&i.in_flight).insert(id.clone()) {
                        continue;
                    }
                    let me = self.clone();
                    let local = Arc::clone(&local);
                    tasks.spawn(async move {
                        me.answer(&id, v.value, v.mod_revision, &*local).await;
                        lock(&me.inner.in_flight).remove(&id);
                    });
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                r = changes.changed() => if r.is_err() { return },
                // Registered again: what waited while the registration had lapsed is served.
                r = lease.changed() => if r.is_err() { return },
                () = tokio::time::sleep(SWEEP) => self.sweep().await,
            }
        }
    }

    /// Runs one request and writes its answer (and deletes it) in one transaction.
    async fn answer(
        &self,
        id: &str,
        req: ControllerRequest,
        revision: i64,
        local: &dyn Controllers,
    ) {
        let i = &self.inner;
        let rpc = req.call.rpc();
        let outcome = if now_ms() > req.deadline_ms {
            Err(RemoteError::new(
                Code::DeadlineExceeded,
                "the request expired before this node took it; it was not run".into(),
            ))
        } else {
            match local.controller(&req.plugin_id) {
                ControllerAccess::Healthy(h) => {
                    tracing::info!(%rpc, plugin = %req.plugin_id, from = %req.from, "serving a controller RPC for another node");
                    req.call.run(&*h.client).await.map_err(RemoteError::from)
                }
                ControllerAccess::Unhealthy(why) => Err(RemoteError::new(
                    Code::Unavailable,
                    format!(
                        "its controller of plugin {:?} is unhealthy: {why}",
                        req.plugin_id
                    ),
                )),
                ControllerAccess::NodeOnly | ControllerAccess::UnknownPlugin => {
                    Err(RemoteError::new(
                        Code::Unavailable,
                        format!("it runs no controller of plugin {:?} now", req.plugin_id),
                    ))
                }
            }
        };
        let Some(fence) = i.membership.fence() else {
            tracing::warn!(%rpc, "registration lapsed while serving a controller RPC; it is answered again once registered");
            return;
        };
        let result = ControllerResult {
            node_id: i.node_id.clone(),
            outcome,
            finished_ms: now_ms(),
        };
        let writes = match Write::put(self.result_key(&req.from, id), 0, &result) {
            Ok(w) => vec![
                w,
                Write {
                    key: self.request_key(&i.node_id, id),
                    expected: revision,
                    value: None,
                },
            ],
            Err(e) => {
                tracing::warn!(error = %e, "cannot encode a controller result");
                return;
            }
        };
        match i.etcd.write_all(writes, &fence).await {
            Ok((Outcome::Done(r), _)) => {
                i.requests.note(id, None, r);
                lock(&i.stats).served += 1;
            }
            Ok((Outcome::Changed, _)) => {
                tracing::info!(%rpc, from = %req.from, "the asking node withdrew its controller request before the answer");
            }
            Ok((Outcome::Fenced, _)) => i.membership.lapsed(&fence),
            Err(e) => {
                tracing::warn!(%rpc, error = %e, "cannot write a controller result; the request is answered again")
            }
        }
    }

    /// Deletes this node's results that nobody collected for [`RESULT_KEPT`].
    async fn sweep(&self) {
        let i = &self.inner;
        let old = now_ms().saturating_sub(u64::try_from(RESULT_KEPT.as_millis()).unwrap_or(0));
        for (id, v) in i.results.all_versioned() {
            if v.value.finished_ms < old
                && let Ok(Outcome::Done(r)) = i
                    .etcd
                    .delete_if(&self.result_key(&i.node_id, &id), v.mod_revision, None)
                    .await
            {
                i.results.note(&id, None, r);
            }
        }
    }
}

impl Controllers for Router {
    /// A healthy controller of `plugin_id` on another live node (never this one: the agent
    /// asks its own registry first).
    fn controller(&self, plugin_id: &str) -> ControllerAccess {
        let i = &self.inner;
        let mut node_only = false;
        for n in i.membership.nodes() {
            if n.id == i.node_id || n.status == NodeState::Down {
                continue;
            }
            if let Some(c) = n.csi_controllers.iter().find(|c| c.plugin_id == plugin_id) {
                return ControllerAccess::Healthy(ControllerHandle {
                    instance: format!("{}@{}", c.instance, n.name),
                    client: Arc::new(Remote {
                        router: self.clone(),
                        node: n.id.clone(),
                        node_name: n.name.clone(),
                        plugin_id: plugin_id.to_string(),
                    }),
                    capabilities: c.capabilities.clone(),
                });
            }
            node_only |= n.csi_plugins.iter().any(|p| p.plugin_id == plugin_id);
        }
        if node_only {
            ControllerAccess::NodeOnly
        } else {
            ControllerAccess::UnknownPlugin
        }
    }
}

/// A controller instance on another node, reached through etcd.
#[derive(Debug)]
struct Remote {
    router: Router,
    node: String,
    node_name: String,
    plugin_id: String,
}

impl Remote {
    fn send(&self, call: Call) -> BoxFuture<'_, Result<Reply, CsiError>> {
        Box::pin(
            self.router
                .call(&self.node, &self.node_name, &self.plugin_id, call),
        )
    }

    fn unexpected(&self, rpc: Rpc, reply: &Reply) -> CsiError {
        RemoteError::new(Code::Internal, format!("unexpected answer {reply:?}"))
            .into_csi(rpc, &self.node_name)
    }
}

fn stored(s: &Secrets) -> StoredSecrets {
    StoredSecrets::from(s)
}

fn segments(t: &[pb::Topology]) -> Vec<BTreeMap<String, String>> {
    t.iter()
        .map(|t| {
            t.segments
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .collect()
}

impl ControllerRpc for Remote {
    fn create_volume<'a>(
        &'a self,
        req: &'a CreateVolume,
    ) -> BoxFuture<'a, Result<Volume, CsiError>> {
        let (from_snapshot, from_volume) = match &req.source {
            Some(ContentSource::Snapshot(s)) => (Some(s.clone()), None),
            Some(ContentSource::Volume(v)) => (None, Some(v.clone())),
            None => (None, None),
        };
        let call = Call::CreateVolume {
            name: req.name.clone(),
            required_bytes: req.capacity.required_bytes,
            limit_bytes: req.capacity.limit_bytes,
            capabilities: req.capabilities.iter().map(WireCapability::from).collect(),
            parameters: req.parameters.clone(),
            secrets: stored(&req.secrets),
            from_snapshot,
            from_volume,
            requisite: req
                .accessibility_requirements
                .as_ref()
                .map(|t| segments(&t.requisite)),
            preferred: req
                .accessibility_requirements
                .as_ref()
                .map(|t| segments(&t.preferred))
                .unwrap_or_default(),
        };
        Box::pin(async move {
            match self.send(call).await? {
                Reply::Volume(v) => Ok(v),
                other => Err(self.unexpected(Rpc::CreateVolume, &other)),
            }
        })
    }

    fn validate_capabilities<'a>(
        &'a self,
        id: &'a ExternalId,
        capabilities: &'a [VolumeCapability],
        volume_context: &'a BTreeMap<String, String>,
        parameters: &'a BTreeMap<String, String>,
        secrets: &'a Secrets,
    ) -> BoxFuture<'a, Result<Validation, CsiError>> {
        let call = Call::Validate {
            external_id: id.clone(),
            capabilities: capabilities.iter().map(WireCapability::from).collect(),
            context: volume_context.clone(),
            parameters: parameters.clone(),
            secrets: stored(secrets),
        };
        Box::pin(async move {
            match self.send(call).await? {
                Reply::Confirmed => Ok(Validation::Confirmed),
                Reply::NotConfirmed(m) => Ok(Validation::NotConfirmed(m)),
                other => Err(self.unexpected(Rpc::ValidateVolumeCapabilities, &other)),
            }
        })
    }

    fn delete_volume<'a>(
        &'a self,
        id: &'a ExternalId,
        secrets: &'a Secrets,
    ) -> BoxFuture<'a, Result<(), CsiError>> {
        let call = Call::DeleteVolume {
            external_id: id.clone(),
            secrets: stored(secrets),
        };
        Box::pin(async move { self.done(Rpc::DeleteVolume, call).await })
    }

    fn controller_expand<'a>(
        &'a self,
        id: &'a ExternalId,
        capacity: CapacityRange,
        capability: Option<&'a VolumeCapability>,
        secrets: &'a Secrets,
    ) -> BoxFuture<'a, Result<(i64, bool), CsiError>> {
        let call = Call::Expand {
            external_id: id.clone(),
            required_bytes: capacity.required_bytes,
            limit_bytes: capacity.limit_bytes,
            capability: capability.map(WireCapability::from),
            secrets: stored(secrets),
        };
        Box::pin(async move {
            match self.send(call).await? {
                Reply::Expanded { bytes, node } => Ok((bytes, node)),
                other => Err(self.unexpected(Rpc::ControllerExpandVolume, &other)),
            }
        })
    }

    fn create_snapshot<'a>(
        &'a self,
        source: &'a ExternalId,
        name: &'a str,
        parameters: &'a BTreeMap<String, String>,
        secrets: &'a Secrets,
    ) -> BoxFuture<'a, Result<Snapshot, CsiError>> {
        let call = Call::CreateSnapshot {
            source: source.clone(),
            name: name.to_string(),
            parameters: parameters.clone(),
            secrets: stored(secrets),
        };
        Box::pin(async move {
            match self.send(call).await? {
                Reply::Snapshot(s) => Ok(s),
                other => Err(self.unexpected(Rpc::CreateSnapshot, &other)),
            }
        })
    }

    fn delete_snapshot<'a>(
        &'a self,
        snapshot_id: &'a str,
        secrets: &'a Secrets,
    ) -> BoxFuture<'a, Result<(), CsiError>> {
        let call = Call::DeleteSnapshot {
            snapshot_id: snapshot_id.to_string(),
            secrets: stored(secrets),
        };
        Box::pin(async move { self.done(Rpc::DeleteSnapshot, call).await })
    }

    fn list_snapshots<'a>(
        &'a self,
        source: Option<&'a ExternalId>,
        snapshot_id: Option<&'a str>,
        max_entries: i32,
        starting_token: &'a str,
        secrets: &'a Secrets,
    ) -> BoxFuture<'a, Result<Page<Snapshot>, CsiError>> {
        let call = Call::ListSnapshots {
            source: source.cloned(),
            snapshot_id: snapshot_id.map(str::to_string),
            max_entries,
            starting_token: starting_token.to_string(),
            secrets: stored(secrets),
        };
        Box::pin(async move {
            match self.send(call).await? {
                Reply::Snapshots {
                    entries,
                    next_token,
                } => Ok(Page {
                    entries,
                    next_token,
                }),
                other => Err(self.unexpected(Rpc::ListSnapshots, &other)),
            }
        })
    }

    fn controller_publish<'a>(
        &'a self,
        req: &'a ControllerPublish,
    ) -> BoxFuture<'a, Result<BTreeMap<String, String>, CsiError>> {
        let call = Call::Publish {
            external_id: req.external_id.clone(),
            node_id: req.node_id.clone(),
            capability: WireCapability::from(&req.capability),
            read_only: req.read_only,
            context: req.volume_context.clone(),
            secrets: stored(&req.secrets),
        };
        Box::pin(async move {
            match self.send(call).await? {
                Reply::Published(c) => Ok(c),
                other => Err(self.unexpected(Rpc::ControllerPublishVolume, &other)),
            }
        })
    }

    fn controller_unpublish<'a>(
        &'a self,
        id: &'a ExternalId,
        node_id: &'a str,
        secrets: &'a Secrets,
    ) -> BoxFuture<'a, Result<(), CsiError>> {
        let call = Call::Unpublish {
            external_id: id.clone(),
            node_id: node_id.to_string(),
            secrets: stored(secrets),
        };
        Box::pin(async move { self.done(Rpc::ControllerUnpublishVolume, call).await })
    }
}

impl Remote {
    async fn done(&self, rpc: Rpc, call: Call) -> Result<(), CsiError> {
        match self.send(call).await? {
            Reply::Done => Ok(()),
            other => Err(self.unexpected(rpc, &other)),
        }
    }
}
