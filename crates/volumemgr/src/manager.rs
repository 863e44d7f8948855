//! The volume manager itself.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    io,
    path::{Path, PathBuf},
    sync::Arc,
};

use berth_csi::{
    CapacityRange, CsiClient, CsiError, NodeExpand, NodePublish, NodeStage,
    model::{ExternalId, NodeCapabilities, NodeCapability, Secrets, VolumeStats},
};
use berth_state::{Batch, KeyedLocks, Store, Table};
use berth_sys::{MountEntry, Removal, top_mount_at};
use berth_volume::{PathError, PluginDir, PluginPaths, Usage, UsageKey};

use crate::{
    error::VolumeError,
    hook::{Phase, Step, StepHook, StepRpc},
    record::{PublishState, StageState, StoredMountOptions, UsageRecord, record_key},
};

/// Mode of the directories the CO creates for a plugin: the staging directory and the
/// target's parent (kubelet's mode for them).
pub const CO_DIR_MODE: u32 = 0o750;

/// The mount table the manager checks targets against: the one the plugin mounts into.
pub trait MountTable: Send + Sync {
    /// Every mount, as `/proc/<pid>/mountinfo` lists them.
    fn mounts(&self) -> io::Result<Vec<MountEntry>>;

    /// Whether this is the table of the manager's own mount namespace. There the kernel
    /// refuses to remove a mount point, so removing a path needs no read of the table first.
    fn is_own_namespace(&self) -> bool {
        false
    }
}

/// The mount table of a process: `/proc/self/mountinfo` by default.
#[derive(Debug, Clone)]
pub struct ProcMountTable {
    path: PathBuf,
    own: bool,
}

impl ProcMountTable {
    /// `/proc/self/mountinfo`: plugins that share the agent's mount namespace.
    pub fn current() -> Self {
        Self {
            path: "/proc/self/mountinfo".into(),
            own: true,
        }
    }

    /// Any mountinfo file, e.g. `/proc/<pid>/mountinfo` of a plugin in its own namespace.
    pub fn at(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            own: false,
        }
    }
}

impl MountTable for ProcMountTable {
    fn mounts(&self) -> io::Result<Vec<MountEntry>> {
        berth_sys::read_mountinfo(&self.path).map_err(io::Error::other)
    }

    fn is_own_namespace(&self) -> bool {
        self.own
    }
}

/// What [`VolumeManager::mount`] needs: which volume, for which alloc, used how.
#[derive(Debug, Clone)]
pub struct MountRequest {
    /// berth's volume id (a path segment).
    pub volume_id: String,
    /// The provider's id.
    pub external_id: ExternalId,
    /// The alloc (a path segment).
    pub alloc_id: String,
    /// How it is used, mount options already merged.
    pub usage: Usage,
    /// What ControllerPublishVolume returned (empty without a controller).
    pub publish_context: BTreeMap<String, String>,
    /// Volume context from CreateVolume.
    pub volume_context: BTreeMap<String, String>,
    /// Secrets for stage and publish; never persisted.
    pub secrets: Secrets,
}

/// One thing [`VolumeManager::reconcile`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReconcileAction {
    /// A published alloc whose target is still mounted: left alone, no RPC.
    Kept {
        /// Volume id.
        volume_id: String,
        /// Alloc id.
        alloc_id: String,
        /// Usage.
        usage: UsageKey,
    },
    /// NodeStageVolume sent again (interrupted stage, or staging no longer mounted).
    Staged {
        /// Volume id.
        volume_id: String,
        /// Usage.
        usage: UsageKey,
    },
    /// NodePublishVolume sent again (interrupted publish, or target no longer mounted).
    Published {
        /// Volume id.
        volume_id: String,
        /// Alloc id.
        alloc_id: String,
        /// Usage.
        usage: UsageKey,
    },
    /// An interrupted unpublish finished.
    Unpublished {
        /// Volume id.
        volume_id: String,
        /// Alloc id.
        alloc_id: String,
        /// Usage.
        usage: UsageKey,
    },
    /// An unused usage unstaged (if it was staged) and its record deleted.
    Released {
        /// Volume id.
        volume_id: String,
        /// Usage.
        usage: UsageKey,
    },
}

/// What [`VolumeManager::reconcile`] did, and what it could not do (those records stay in
/// their intent state for the next call or reconcile).
#[derive(Debug, Default)]
pub struct ReconcileReport {
    /// Everything done, in order.
    pub actions: Vec<ReconcileAction>,
    /// Every failure; one failed record does not stop the others.
    pub errors: Vec<VolumeError>,
}

/// Stages and publishes volumes of one node plugin for allocs; see the crate docs.
///
/// Changes of one volume's records, and its stage and unstage, are serialized; NodePublish and
/// NodeUnpublish of different allocs of a staged volume run in parallel (their intents and
/// results are written under the volume's lock, the calls made without it); different volumes
/// run in parallel.
pub struct VolumeManager {
    store: Arc<Store>,
    client: CsiClient,
    plugin_id: String,
    paths: PluginPaths,
    node_caps: NodeCapabilities,
    mounts: Arc<dyn MountTable>,
    locks: KeyedLocks,
    hook: Option<Arc<dyn StepHook>>,
    /// Where the plugin sees its root, when not where the agent does (a plugin run as a task
    /// in its own mount namespace).
    plugin_view: Option<PathBuf>,
}

impl std::fmt::Debug for VolumeManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeManager")
            .field("plugin_id", &self.plugin_id)
            .field("root", &self.paths.root())
            .field("hook", &self.hook.is_some())
            .finish_non_exhaustive()
    }
}

/// What a mount uses: an existing record, or a new one (after releasing the unused records of
/// the volume, when `clear`).
enum Plan {
    Use(Box<UsageRecord>),
    New {
        usage: UsageKey,
        staging: Option<StageState>,
        clear: bool,
    },
}

/// How a step writes its result.
///
/// A result may be deferred (see [`Batch::deferred`]) when a crash that loses it leaves the
/// intent before it, which recovery redoes: every node RPC is idempotent, and a record whose
/// alloc has no live claim is unpublished, never published again (see
/// [`VolumeManager::reconcile`]). Intents that come before a mount are durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Save {
    /// Durable before the call returns.
    Now,
    /// Written, durable with the next durable commit.
    Deferred,
    /// Deferred, or left to the release that follows when the record's last alloc left (the
    /// release writes or deletes the record next).
    WithNext,
}

/// Where one record's RPCs point, and what they send.
struct Ctx<'a> {
    volume_id: &'a str,
    usage: UsageKey,
}

impl VolumeManager {
    /// A manager for plugin `plugin_id` (of type `plugin_dir`), with its directories under the
    /// absolute `data_dir`. Nothing is touched until the first call.
    pub fn new(
        store: Arc<Store>,
        client: CsiClient,
        plugin_id: impl Into<String>,
        plugin_dir: PluginDir,
        data_dir: &Path,
        node_caps: NodeCapabilities,
        mounts: Arc<dyn MountTable>,
    ) -> Result<Self, VolumeError> {
        let plugin_id = plugin_id.into();
        let paths = PluginPaths::new(data_dir, plugin_dir, &plugin_id).map_err(|source| {
            VolumeError::InvalidPlugin {
                plugin_id: plugin_id.clone(),
                source,
            }
        })?;
        Ok(Self {
            store,
            client,
            plugin_id,
            paths,
            node_caps,
            mounts,
            locks: KeyedLocks::default(),
            hook: None,
            plugin_view: None,
        })
    }

    /// Calls `hook` at every [`Step`] (see [`StepHook`]); without it, nothing is called.
    pub fn with_hook(mut self, hook: Arc<dyn StepHook>) -> Self {
        self.hook = Some(hook);
        self
    }

    /// The plugin sees its root ([`PluginPaths::root`]) at `root` (a plugin run as a task,
    /// with its root bind-mounted there): every staging and target path sent to it is that
    /// path under `root`. Records, mount checks and directories stay in the agent's view.
    pub fn with_plugin_view(mut self, root: impl Into<PathBuf>) -> Self {
        self.plugin_view = Some(root.into());
        self
    }

    /// `path` (under the plugin's root, in the agent's view) as the plugin sees it.
    fn rpc_path(&self, path: &Path) -> PathBuf {
        match (&self.plugin_view, path.strip_prefix(self.paths.root())) {
            (Some(view), Ok(rest)) => view.join(rest),
            _ => path.to_path_buf(),
        }
    }

    /// The plugin's directory paths.
    pub fn paths(&self) -> &PluginPaths {
        &self.paths
    }

    /// Every record of this plugin, in key order.
    pub fn records(&self) -> Result<Vec<UsageRecord>, VolumeError> {
        self.list(&format!("{}/", self.plugin_id), "")
    }

    /// Every record of one volume (of this plugin), in key order: one per usage and variant.
    pub fn usages_of(&self, volume_id: &str) -> Result<Vec<UsageRecord>, VolumeError> {
        self.paths
            .volume_staging_dir(volume_id)
            .map_err(|source| invalid(volume_id, source))?;
        self.volume_records(volume_id)
    }

    /// The record of one usage (variant included), if any.
    pub fn record(
        &self,
        volume_id: &str,
        usage: UsageKey,
    ) -> Result<Option<UsageRecord>, VolumeError> {
        self.store
            .get(
                Table::USAGES,
                &record_key(&self.plugin_id, volume_id, usage),
            )
            .map_err(|source| VolumeError::Store {
                volume_id: volume_id.to_string(),
                source,
            })
    }

    /// Every alloc in any record of one volume (in any state): reads that volume's records
    /// only.
    pub fn allocs_of(&self, volume_id: &str) -> Result<BTreeSet<String>, VolumeError> {
        self.paths
            .volume_staging_dir(volume_id)
            .map_err(|source| invalid(volume_id, source))?;
        Ok(self
            .volume_records(volume_id)?
            .into_iter()
            .flat_map(|r| r.allocs.into_keys())
            .collect())
    }

    /// Every alloc in any record of this plugin (in any state), by volume id.
    pub fn allocs(&self) -> Result<BTreeMap<String, BTreeSet<String>>, VolumeError> {
        let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for rec in self.records()? {
            let allocs = out.entry(rec.volume_id).or_default();
            allocs.extend(rec.allocs.into_keys());
        }
        out.retain(|_, allocs| !allocs.is_empty());
        Ok(out)
    }

    /// The record that holds `alloc_id` (in any state; a published one first if the alloc is
    /// in several), and the alloc's publish target in it. `None` when no record of the volume
    /// holds the alloc.
    pub fn alloc_target(
        &self,
        volume_id: &str,
        alloc_id: &str,
    ) -> Result<Option<(UsageRecord, PathBuf)>, VolumeError> {
        self.check_ids(volume_id, alloc_id)?;
        let mut found: Option<UsageRecord> = None;
        for rec in self.volume_records(volume_id)? {
            match rec.allocs.get(alloc_id) {
                Some(PublishState::Published) => {
                    found = Some(rec);
                    break;
                }
                Some(_) if found.is_none() => found = Some(rec),
                _ => {}
            }
        }
        let Some(rec) = found else {
            return Ok(None);
        };
        let target = self
            .paths
            .publish(volume_id, alloc_id, rec.usage)
            .map_err(|source| invalid(volume_id, source))?;
        Ok(Some((rec, target)))
    }

    /// Stages (once per volume on this node, when the plugin stages) and publishes the volume
    /// for the alloc; returns the target path.
    ///
    /// The CSI spec allows one staging path per volume on a node (`staging_target_path`: "The
    /// CO SHALL ensure that there is only one staging_target_path per volume"), and
    /// NodeStageVolume knows nothing of read-only: the read-only and read-write usages of a
    /// volume share its one staging, and each alloc is published from it (read-only where
    /// asked). A usage that would need a second staging while the volume's is in use (other
    /// mount options, or another access or attachment mode) is a [`VolumeError::Conflict`];
    /// without staging (no `STAGE_UNSTAGE_VOLUME`), other mount options get their own record
    /// (the lowest free variant) and targets. Publishing an alloc that is already published
    /// there returns its target without any RPC. A volume id already used with another
    /// external id is a [`VolumeError::Conflict`]. On error the record stays in its intent
    /// state.
    pub async fn mount(&self, req: MountRequest) -> Result<PathBuf, VolumeError> {
        let volume_id = req.volume_id.as_str();
        let base = req.usage.key();
        self.check_ids(volume_id, &req.alloc_id)?;
        let _guard = self.locks.lock(volume_id).await;
        let options = StoredMountOptions::from(&req.usage.mount_options);
        let existing = self.volume_records(volume_id)?;
        let mut rec = match self.plan(volume_id, &existing, &req.external_id, base, &options)? {
            Plan::Use(rec) => *rec,
            Plan::New {
                usage,
                staging,
                clear,
            } => {
                if clear {
                    // Nothing uses the volume's staging: what is left of earlier usages goes
                    // first, so the new one is the volume's only staging.
                    for mut old in existing {
                        let ctx = Ctx {
                            volume_id,
                            usage: old.usage,
                        };
                        self.release(&ctx, &mut old).await?;
                    }
                }
                self.new_record(&req, usage, options, staging)
            }
        };
        let key = rec.usage;
        let ctx = Ctx {
            volume_id,
            usage: key,
        };
        let staging = self.staging_path(&rec)?;
        let target = self
            .paths
            .publish(volume_id, &req.alloc_id, key)
            .map_err(|source| invalid(volume_id, source))?;
        if rec.allocs.get(&req.alloc_id) == Some(&PublishState::Published) {
            return Ok(target);
        }
        rec.allocs
            .insert(req.alloc_id.clone(), PublishState::Publishing);
        if rec.staging.is_some_and(|s| s != StageState::Staged) {
            // The stage's intent carries the alloc "publishing": one durable intent for both
            // steps, which a crash finds and redoes (both idempotent). "Staged" may be lost
            // the same way.
            let staged = self
                .stage(&ctx, &mut rec, &staging, &req.secrets, Save::Deferred)
                .await;
            if let Err(e) = staged {
                // Failed: the alloc leaves the intent, which stays "staging" for the volume
                // (a crash first leaves both, and recovery redoes both).
                rec.allocs.remove(&req.alloc_id);
                if let Err(w) = self.save_as(&ctx, &rec, Save::Deferred).await {
                    tracing::warn!(volume_id, alloc_id = %req.alloc_id, error = %w,
                        "cannot take the alloc out of a failed stage's intent");
                }
                return Err(e);
            }
        } else {
            self.save(&ctx, &rec).await?;
        }
        // The volume is staged and the intent durable: NodePublishVolume of other allocs of the
        // volume (other targets) may run at the same time, so the lock is not held for it.
        drop(_guard);
        self.send_publish(
            &ctx,
            &rec,
            &req.alloc_id,
            &target,
            &staging,
            &req.publish_context,
            &req.volume_context,
            &req.secrets,
        )
        .await?;
        let _guard = self.locks.lock(volume_id).await;
        self.set_alloc_state(
            &ctx,
            &rec,
            &req.alloc_id,
            Some(PublishState::Published),
            Save::Deferred,
        )
        .await?;
        tracing::info!(volume_id, alloc_id = %req.alloc_id, usage = %key, "published");
        Ok(target)
    }

    /// Under the volume's lock: sets (or, with `None`, removes) the alloc's state in the record
    /// as stored now (other allocs of the volume may have changed it since `seen` was read),
    /// and writes it, unless the alloc was the record's last and `save` leaves that to the
    /// release that follows. A record that vanished meanwhile is taken from `seen`, so the
    /// mount stays known. Returns the record.
    async fn set_alloc_state(
        &self,
        ctx: &Ctx<'_>,
        seen: &UsageRecord,
        alloc_id: &str,
        state: Option<PublishState>,
        save: Save,
    ) -> Result<UsageRecord, VolumeError> {
        let mut now = match self.record(ctx.volume_id, ctx.usage)? {
            Some(r) => r,
            None => {
                tracing::warn!(volume_id = ctx.volume_id, usage = %ctx.usage,
                    "the usage record vanished during a node call; writing it again");
                seen.clone()
            }
        };
        match state {
            Some(s) => {
                now.allocs.insert(alloc_id.to_string(), s);
            }
            None => {
                now.allocs.remove(alloc_id);
            }
        }
        if save != Save::WithNext || !now.allocs.is_empty() {
            self.save_as(ctx, &now, save).await?;
        }
        Ok(now)
    }

    /// Whether [`VolumeManager::mount`] of this usage would be refused for what the node
    /// already holds of the volume (another external id, or a second staging of the volume while
    /// its one staging is in use), without changing anything: for callers that check a request
    /// before acting on it. `mount` checks again.
    pub fn check_mount(
        &self,
        volume_id: &str,
        external_id: &ExternalId,
        usage: &Usage,
    ) -> Result<(), VolumeError> {
        self.paths
            .volume_staging_dir(volume_id)
            .map_err(|source| invalid(volume_id, source))?;
        let existing = self.volume_records(volume_id)?;
        let options = StoredMountOptions::from(&usage.mount_options);
        self.plan(volume_id, &existing, external_id, usage.key(), &options)
            .map(drop)
    }

    /// Which record a mount of `base` with `options` uses, given the volume's records on the
    /// node: see [`VolumeManager::mount`].
    fn plan(
        &self,
        volume_id: &str,
        existing: &[UsageRecord],
        external_id: &ExternalId,
        base: UsageKey,
        options: &StoredMountOptions,
    ) -> Result<Plan, VolumeError> {
        if existing.iter().any(|r| r.external_id != *external_id) {
            return Err(conflict(volume_id, base, "external id"));
        }
        let found = existing
            .iter()
            .find(|r| r.usage.base() == base && r.mount_options == *options);
        if !self.node_caps.has(NodeCapability::StageUnstageVolume) {
            if let Some(rec) = found {
                return Ok(Plan::Use(Box::new(rec.clone())));
            }
            let used: BTreeSet<u16> = existing
                .iter()
                .filter(|r| r.usage.base() == base)
                .map(|r| r.usage.variant)
                .collect();
            let variant = (0..=u16::MAX)
                .find(|n| !used.contains(n))
                .ok_or_else(|| conflict(volume_id, base, "mount options (no variant free)"))?;
            return Ok(Plan::New {
                usage: base.with_variant(variant),
                staging: None,
                clear: false,
            });
        }
        let in_use: Vec<&UsageRecord> = existing.iter().filter(|r| !r.allocs.is_empty()).collect();
        if in_use.is_empty() {
            return Ok(match found {
                // The volume's only record: reused, unless it says staged where nothing is
                // mounted any more (its twin unstaged it): then it starts afresh.
                Some(rec) if existing.len() == 1 && !self.staged_but_unmounted(rec)? => {
                    Plan::Use(Box::new(rec.clone()))
                }
                _ => Plan::New {
                    usage: base,
                    staging: Some(StageState::Staging),
                    clear: !existing.is_empty(),
                },
            });
        }
        if let Some(rec) = found.filter(|r| !r.allocs.is_empty()) {
            return Ok(Plan::Use(Box::new(rec.clone())));
        }
        // Its read-only or read-write twin: same modes and options, same staging.
        let twin = in_use
            .iter()
            .find(|r| {
                r.shared_staging
                    && r.staging.is_some()
                    && r.usage.attachment_mode == base.attachment_mode
                    && r.usage.access_mode == base.access_mode
                    && r.mount_options == *options
            })
            .ok_or_else(|| {
                conflict(
                    volume_id,
                    base,
                    "modes or mount options (the CSI spec allows one staging path per volume \
                     on a node)",
                )
            })?;
        let usage = base.with_variant(twin.usage.variant);
        if let Some(rec) = found.filter(|r| r.usage == usage && r.shared_staging) {
            // Its own record, unused since its last alloc left, on the same staging.
            return Ok(Plan::Use(Box::new(rec.clone())));
        }
        if existing.iter().any(|r| r.usage == usage) {
            return Err(conflict(volume_id, base, "mount options (no variant free)"));
        }
        Ok(Plan::New {
            usage,
            staging: Some(match twin.staging {
                Some(StageState::Staged) => StageState::Staged,
                _ => StageState::Staging,
            }),
            clear: false,
        })
    }

    /// Unpublishes the volume for the alloc in every record of the volume that holds the alloc
    /// (normally one), and releases (unstages if staged, then deletes) every record of the
    /// volume that no alloc uses any more (by the persisted records), including ones left
    /// unused by a failed mount. `NOT_FOUND` from the plugin counts as done; nothing to do is
    /// success. Every record is tried; the first error is returned, and its record stays in
    /// its intent state.
    pub async fn unmount(&self, volume_id: &str, alloc_id: &str) -> Result<(), VolumeError> {
        self.check_ids(volume_id, alloc_id)?;
        // The intents, under the volume's lock.
        let leaving: Vec<UsageRecord> = {
            let _guard = self.locks.lock(volume_id).await;
            let mut leaving = Vec::new();
            for mut rec in self.volume_records(volume_id)? {
                match rec.allocs.get(alloc_id) {
                    None => continue,
                    Some(PublishState::Unpublishing) => {}
                    Some(_) => {
                        rec.allocs
                            .insert(alloc_id.to_string(), PublishState::Unpublishing);
                        let ctx = Ctx {
                            volume_id,
                            usage: rec.usage,
                        };
                        // Deferred: the caller's durable release (or the absence of a claim)
                        // is what recovery unpublishes by.
                        self.save_as(&ctx, &rec, Save::Deferred).await?;
                    }
                }
                leaving.push(rec);
            }
            leaving
        };
        let mut first_err = None;
        for rec in leaving {
            if let Err(e) = self.unpublish_unlocked(volume_id, &rec, alloc_id).await {
                first_err.get_or_insert(e);
            }
        }
        // Every record of the volume that no alloc uses any more goes (the ones this alloc
        // left, and ones a failed mount left unused).
        {
            let _guard = self.locks.lock(volume_id).await;
            for mut rec in self.volume_records(volume_id)? {
                if rec.allocs.is_empty() {
                    let usage = rec.usage;
                    if let Err(e) = self.release(&Ctx { volume_id, usage }, &mut rec).await {
                        first_err.get_or_insert(e);
                    }
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// NodeUnpublishVolume of an alloc whose intent `rec` holds, without the volume's lock
    /// (other targets of the volume may be published or unpublished meanwhile), then, under
    /// it, the alloc leaves the record as stored now. When it was the record's last alloc, the
    /// release that follows writes the record next (unstaging) or deletes it: one commit
    /// less; a crash in between finds "unpublishing", which is unpublished again (`NOT_FOUND`
    /// counts as done), as before.
    async fn unpublish_unlocked(
        &self,
        volume_id: &str,
        rec: &UsageRecord,
        alloc_id: &str,
    ) -> Result<(), VolumeError> {
        let usage = rec.usage;
        let ctx = Ctx { volume_id, usage };
        let target = self
            .paths
            .publish(volume_id, alloc_id, usage)
            .map_err(|source| invalid(volume_id, source))?;
        self.send_unpublish(&ctx, rec, alloc_id, &target).await?;
        let _guard = self.locks.lock(volume_id).await;
        let mut now = self
            .set_alloc_state(&ctx, rec, alloc_id, None, Save::WithNext)
            .await?;
        self.remove_co_path(&ctx, &target, 2);
        tracing::info!(volume_id, alloc_id, usage = %usage, "unpublished");
        if now.allocs.is_empty() {
            self.release(&ctx, &mut now).await?;
        }
        Ok(())
    }

    /// Unstages (when staged) and deletes every record of the volume that no alloc uses: what a
    /// crash between an unpublish and the unstage, or between a stage and its publish, leaves
    /// behind. Under the volume's lock no such record is in use, so this is safe at any time.
    /// Returns how many records it released; stops at the first error.
    pub async fn release_unused(&self, volume_id: &str) -> Result<usize, VolumeError> {
        self.paths
            .volume_staging_dir(volume_id)
            .map_err(|source| invalid(volume_id, source))?;
        let _guard = self.locks.lock(volume_id).await;
        let mut released = 0;
        for mut rec in self.volume_records(volume_id)? {
            if rec.allocs.is_empty() {
                let usage = rec.usage;
                self.release(&Ctx { volume_id, usage }, &mut rec).await?;
                released += 1;
            }
        }
        Ok(released)
    }

    /// NodeGetVolumeStats on the alloc's published target of the volume (with its staging path
    /// when the plugin stages). `None` when the plugin lacks `GET_VOLUME_STATS` or the alloc
    /// has no published target of the volume. Never waits for an operation on the volume (it
    /// reads the persisted record: a publish in flight is not published yet); callers bound
    /// the plugin call itself with a timeout.
    pub async fn stats(
        &self,
        volume_id: &str,
        alloc_id: &str,
    ) -> Result<Option<VolumeStats>, VolumeError> {
        self.check_ids(volume_id, alloc_id)?;
        if !self.node_caps.has(NodeCapability::GetVolumeStats) {
            return Ok(None);
        }
        let Some((rec, target)) = self.alloc_target(volume_id, alloc_id)? else {
            return Ok(None);
        };
        if rec.allocs.get(alloc_id) != Some(&PublishState::Published) {
            return Ok(None);
        }
        let ctx = Ctx {
            volume_id,
            usage: rec.usage,
        };
        let staging = self.staging_of(&rec)?;
        self.client
            .node_volume_stats(
                &rec.external_id,
                &self.rpc_path(&target),
                staging.as_deref().map(|p| self.rpc_path(p)).as_deref(),
            )
            .await
            .map(Some)
            .map_err(|e| self.csi_err(&ctx, Some(alloc_id), e))
    }

    /// NodeExpandVolume for every published target of the volume (every alloc of every usage,
    /// with the usage's staging path when the plugin stages), in record order; the capacities
    /// the plugin reports, one per target. Empty when the plugin lacks `EXPAND_VOLUME` or
    /// nothing of the volume is published. Stops at the first error (the call is idempotent:
    /// call it again).
    pub async fn expand(
        &self,
        volume_id: &str,
        capacity: CapacityRange,
        secrets: &Secrets,
    ) -> Result<Vec<i64>, VolumeError> {
        self.paths
            .volume_staging_dir(volume_id)
            .map_err(|source| invalid(volume_id, source))?;
        if !self.node_caps.has(NodeCapability::ExpandVolume) {
            return Ok(Vec::new());
        }
        let _guard = self.locks.lock(volume_id).await;
        let mut sizes = Vec::new();
        for rec in self.volume_records(volume_id)? {
            let ctx = Ctx {
                volume_id,
                usage: rec.usage,
            };
            let staging = self.staging_of(&rec)?;
            let capability = Some(rec.full_usage().capability());
            for (alloc_id, state) in &rec.allocs {
                if *state != PublishState::Published {
                    continue;
                }
                let target = self
                    .paths
                    .publish(volume_id, alloc_id, rec.usage)
                    .map_err(|source| invalid(volume_id, source))?;
                let req = NodeExpand {
                    external_id: rec.external_id.clone(),
                    volume_path: self.rpc_path(&target),
                    staging_path: staging.as_deref().map(|p| self.rpc_path(p)),
                    capacity,
                    capability: capability.clone(),
                    secrets: secrets.clone(),
                };
                let size = self
                    .client
                    .node_expand(&req)
                    .await
                    .map_err(|e| self.csi_err(&ctx, Some(alloc_id), e))?;
                tracing::info!(volume_id, alloc_id, usage = %rec.usage, size, "expanded");
                sizes.push(size);
            }
        }
        Ok(sizes)
    }

    /// Drives every record of this plugin to a resting state, at start (before any mount or
    /// unmount): published allocs whose target is still mounted are kept without an RPC;
    /// interrupted publishes, stages, unpublishes and unstages are sent again (stages and
    /// publishes with `secrets(volume_id)`, asked at most once per record and only for records
    /// that send one: the agent's catalog holds them); published
    /// targets or staging dirs that are no longer mounted are mounted again, except for allocs
    /// that are `leaving(volume_id, alloc_id)` (their claim is being released, or gone): those
    /// are unpublished instead, since a release's records are written deferred and a crash may
    /// have lost them after its unmounts. Unused usages are released.
    pub async fn reconcile(
        &self,
        secrets: &(dyn Fn(&str) -> Secrets + Send + Sync),
        leaving: &(dyn Fn(&str, &str) -> bool + Send + Sync),
    ) -> ReconcileReport {
        let mut report = ReconcileReport::default();
        let records = match self.records() {
            Ok(r) => r,
            Err(e) => {
                report.errors.push(e);
                return report;
            }
        };
        // The mount table is read once for the records that are left alone (not once per
        // record: a thousand published volumes at start), and again after a record's steps
        // may have changed it. It is looked up by mount point, in a set: scanning it for each
        // of a thousand records' paths would cost more than the rest of the reconcile.
        let mut table = None;
        for rec in records {
            let t = match table.take() {
                Some(t) => t,
                None => match self.mounts.mounts() {
                    Ok(t) => t.into_iter().map(|e| e.mount_point).collect(),
                    Err(e) => {
                        report.errors.push(VolumeError::MountTable(e));
                        return report;
                    }
                },
            };
            let before = report.actions.len();
            if let Err(e) = self
                .reconcile_one(rec, secrets, leaving, &t, &mut report.actions)
                .await
            {
                report.errors.push(e);
                continue;
            }
            let only_kept = report.actions[before..]
                .iter()
                .all(|a| matches!(a, ReconcileAction::Kept { .. }));
            if only_kept {
                table = Some(t);
            }
        }
        report
    }

    async fn reconcile_one(
        &self,
        rec: UsageRecord,
        secrets_of: &(dyn Fn(&str) -> Secrets + Send + Sync),
        leaving: &(dyn Fn(&str, &str) -> bool + Send + Sync),
        mount_points: &HashSet<PathBuf>,
        actions: &mut Vec<ReconcileAction>,
    ) -> Result<(), VolumeError> {
        let volume_id = rec.volume_id.clone();
        let usage = rec.usage;
        let _guard = self.locks.lock(&volume_id).await;
        // Read again under the lock.
        let Some(mut rec) = self.record(&volume_id, usage)? else {
            return Ok(());
        };
        let ctx = Ctx {
            volume_id: &volume_id,
            usage,
        };
        let bad_path = |source| invalid(&volume_id, source);
        let staging = self.staging_path(&rec)?;
        // Asked once, and only when a stage or publish is sent.
        let mut secrets: Option<Secrets> = None;
        let mut secrets = || {
            secrets
                .get_or_insert_with(|| secrets_of(&volume_id))
                .clone()
        };

        let mounted = |p: &Path| mount_points.contains(p);
        let target_of = |alloc_id: &str| {
            self.paths
                .publish(&volume_id, alloc_id, usage)
                .map_err(bad_path)
        };
        // Interrupted unpublishes first, and allocs that leave (not published and mounted as
        // recorded: those are left to their release).
        let mut unpublished = false;
        let mut going: Vec<String> = Vec::new();
        for (alloc_id, state) in &rec.allocs {
            let goes = match state {
                PublishState::Unpublishing => true,
                PublishState::Published if mounted(&target_of(alloc_id)?) => false,
                _ => leaving(&volume_id, alloc_id),
            };
            if goes {
                going.push(alloc_id.clone());
            }
        }
        for alloc_id in going {
            let target = target_of(&alloc_id)?;
            self.unpublish(&ctx, &mut rec, &alloc_id, &target).await?;
            unpublished = true;
            actions.push(ReconcileAction::Unpublished {
                volume_id: volume_id.clone(),
                alloc_id,
                usage,
            });
        }

        if rec.allocs.is_empty() {
            match rec.staging {
                // A stage was interrupted: finish it (a mount call was under way).
                Some(StageState::Staging) => {
                    self.stage(&ctx, &mut rec, &staging, &secrets(), Save::Now)
                        .await?;
                    actions.push(ReconcileAction::Staged {
                        volume_id: volume_id.clone(),
                        usage,
                    });
                }
                // Staged and unused since a finished unpublish or an interrupted unstage, or
                // never staged and unused: release.
                Some(StageState::Staged) if !unpublished => {}
                _ => {
                    self.release(&ctx, &mut rec).await?;
                    actions.push(ReconcileAction::Released {
                        volume_id: volume_id.clone(),
                        usage,
                    });
                }
            }
            return Ok(());
        }

        let restage = match rec.staging {
            None => false,
            Some(StageState::Staged) => !mounted(&staging),
            Some(StageState::Staging | StageState::Unstaging) => true,
        };
        if restage {
            self.stage(&ctx, &mut rec, &staging, &secrets(), Save::Now)
                .await?;
            actions.push(ReconcileAction::Staged {
                volume_id: volume_id.clone(),
                usage,
            });
        }
        let allocs: Vec<(String, PublishState)> =
            rec.allocs.iter().map(|(a, s)| (a.clone(), *s)).collect();
        let (publish_context, volume_context) =
            (rec.publish_context.clone(), rec.volume_context.clone());
        for (alloc_id, state) in allocs {
            let target = target_of(&alloc_id)?;
            if state == PublishState::Published && mounted(&target) {
                actions.push(ReconcileAction::Kept {
                    volume_id: volume_id.clone(),
                    alloc_id,
                    usage,
                });
                continue;
            }
            self.publish(
                &ctx,
                &mut rec,
                &alloc_id,
                &target,
                &staging,
                &publish_context,
                &volume_context,
                &secrets(),
            )
            .await?;
            actions.push(ReconcileAction::Published {
                volume_id: volume_id.clone(),
                alloc_id,
                usage,
            });
        }
        Ok(())
    }

    // ---- steps: each persists its intent, sends one RPC, persists the result ----

    async fn stage(
        &self,
        ctx: &Ctx<'_>,
        rec: &mut UsageRecord,
        staging: &Path,
        secrets: &Secrets,
        save: Save,
    ) -> Result<(), VolumeError> {
        rec.staging = Some(StageState::Staging);
        self.save(ctx, rec).await?;
        // The CO's duty (CSI, NodeStageVolume): the staging directory exists before the call.
        self.co_dir(ctx, staging)?;
        let usage = rec.full_usage();
        let req = NodeStage {
            external_id: rec.external_id.clone(),
            staging_path: self.rpc_path(staging),
            capability: usage.capability(),
            publish_context: rec.publish_context.clone(),
            volume_context: rec.volume_context.clone(),
            secrets: secrets.clone(),
        };
        self.step(StepRpc::NodeStageVolume, Phase::Before);
        self.client
            .node_stage(&req)
            .await
            .map_err(|e| self.csi_err(ctx, None, e))?;
        self.step(StepRpc::NodeStageVolume, Phase::After);
        rec.staging = Some(StageState::Staged);
        self.save_as(ctx, rec, save).await?;
        tracing::info!(volume_id = ctx.volume_id, usage = %ctx.usage, "staged");
        Ok(())
    }

    /// Publish under the caller's lock (reconcile): intent, NodePublishVolume, result.
    #[allow(clippy::too_many_arguments)]
    async fn publish(
        &self,
        ctx: &Ctx<'_>,
        rec: &mut UsageRecord,
        alloc_id: &str,
        target: &Path,
        staging: &Path,
        publish_context: &BTreeMap<String, String>,
        volume_context: &BTreeMap<String, String>,
        secrets: &Secrets,
    ) -> Result<(), VolumeError> {
        rec.allocs
            .insert(alloc_id.to_string(), PublishState::Publishing);
        self.save(ctx, rec).await?;
        self.send_publish(
            ctx,
            rec,
            alloc_id,
            target,
            staging,
            publish_context,
            volume_context,
            secrets,
        )
        .await?;
        rec.allocs
            .insert(alloc_id.to_string(), PublishState::Published);
        self.save(ctx, rec).await?;
        tracing::info!(volume_id = ctx.volume_id, alloc_id, usage = %ctx.usage, "published");
        Ok(())
    }

    /// NodePublishVolume of `rec`'s volume at `target` (the target's parent made first); no
    /// record is written.
    #[allow(clippy::too_many_arguments)]
    async fn send_publish(
        &self,
        ctx: &Ctx<'_>,
        rec: &UsageRecord,
        alloc_id: &str,
        target: &Path,
        staging: &Path,
        publish_context: &BTreeMap<String, String>,
        volume_context: &BTreeMap<String, String>,
        secrets: &Secrets,
    ) -> Result<(), VolumeError> {
        // The CO's duty (CSI, NodePublishVolume): the target's parent exists; the target itself
        // is the plugin's to create (a directory, or a file for a block volume).
        if let Some(parent) = target.parent() {
            self.co_dir(ctx, parent)?;
        }
        let usage = rec.full_usage();
        let req = NodePublish {
            external_id: rec.external_id.clone(),
            staging_path: rec.staging.is_some().then(|| self.rpc_path(staging)),
            target_path: self.rpc_path(target),
            capability: usage.capability(),
            read_only: usage.read_only,
            publish_context: publish_context.clone(),
            volume_context: volume_context.clone(),
            secrets: secrets.clone(),
        };
        self.step(StepRpc::NodePublishVolume, Phase::Before);
        self.client
            .node_publish(&req)
            .await
            .map_err(|e| self.csi_err(ctx, Some(alloc_id), e))?;
        self.step(StepRpc::NodePublishVolume, Phase::After);
        Ok(())
    }

    /// Unpublish under the caller's lock (reconcile): intent, NodeUnpublishVolume, result.
    async fn unpublish(
        &self,
        ctx: &Ctx<'_>,
        rec: &mut UsageRecord,
        alloc_id: &str,
        target: &Path,
    ) -> Result<(), VolumeError> {
        rec.allocs
            .insert(alloc_id.to_string(), PublishState::Unpublishing);
        self.save(ctx, rec).await?;
        self.send_unpublish(ctx, rec, alloc_id, target).await?;
        rec.allocs.remove(alloc_id);
        self.save(ctx, rec).await?;
        self.remove_co_path(ctx, target, 2);
        tracing::info!(volume_id = ctx.volume_id, alloc_id, usage = %ctx.usage, "unpublished");
        Ok(())
    }

    /// NodeUnpublishVolume of `rec`'s volume at `target` (`NOT_FOUND` is done); no record is
    /// written.
    async fn send_unpublish(
        &self,
        ctx: &Ctx<'_>,
        rec: &UsageRecord,
        alloc_id: &str,
        target: &Path,
    ) -> Result<(), VolumeError> {
        self.step(StepRpc::NodeUnpublishVolume, Phase::Before);
        match self
            .client
            .node_unpublish(&rec.external_id, &self.rpc_path(target))
            .await
        {
            Ok(()) => {}
            Err(e) if e.is_already_done() => {}
            Err(e) => return Err(self.csi_err(ctx, Some(alloc_id), e)),
        }
        self.step(StepRpc::NodeUnpublishVolume, Phase::After);
        Ok(())
    }

    /// Unstages an unused usage (if staged) and deletes its record.
    async fn release(&self, ctx: &Ctx<'_>, rec: &mut UsageRecord) -> Result<(), VolumeError> {
        debug_assert!(rec.allocs.is_empty());
        // Its read-only or read-write twin still publishes from the same staging: only the
        // record goes.
        let shared_in_use = rec.staging.is_some()
            && self.volume_records(ctx.volume_id)?.iter().any(|o| {
                o.usage != rec.usage
                    && o.staging.is_some()
                    && !o.allocs.is_empty()
                    && o.staging_dir_name() == rec.staging_dir_name()
            });
        if rec.staging.is_some() && !shared_in_use {
            let staging = self.staging_path(rec)?;
            rec.staging = Some(StageState::Unstaging);
            self.save_as(ctx, rec, Save::Deferred).await?;
            self.step(StepRpc::NodeUnstageVolume, Phase::Before);
            match self
                .client
                .node_unstage(&rec.external_id, &self.rpc_path(&staging))
                .await
            {
                Ok(()) => {}
                Err(e) if e.is_already_done() => {}
                Err(e) => return Err(self.csi_err(ctx, None, e)),
            }
            self.step(StepRpc::NodeUnstageVolume, Phase::After);
            // The staging directory is the CO's: removed (with the volume's directory, when
            // empty) once nothing is mounted there.
            self.remove_co_path(ctx, &staging, 1);
            tracing::info!(volume_id = ctx.volume_id, usage = %ctx.usage, "unstaged");
        }
        // Deferred: a crash that loses it finds the record unused (or its alloc without a
        // claim), which recovery unpublishes and unstages again (`NOT_FOUND` is done). The
        // controller step that follows a release writes durably first.
        let mut b = Batch::new();
        b.delete(Table::USAGES, &rec.key()).deferred();
        self.store
            .commit(b)
            .await
            .map_err(|source| self.store_err(ctx, source))?;
        Ok(())
    }

    // ---- helpers ----

    fn step(&self, rpc: StepRpc, phase: Phase) {
        if let Some(hook) = &self.hook {
            hook.at(Step::new(rpc, phase));
        }
    }

    /// Checks both ids as path segments before anything is touched.
    fn check_ids(&self, volume_id: &str, alloc_id: &str) -> Result<(), VolumeError> {
        self.paths
            .volume_staging_dir(volume_id)
            .and_then(|_| self.paths.alloc_dir(alloc_id))
            .map(drop)
            .map_err(|source| invalid(volume_id, source))
    }

    /// The records of one (already checked) volume id.
    fn volume_records(&self, volume_id: &str) -> Result<Vec<UsageRecord>, VolumeError> {
        volume_records(&self.store, &self.plugin_id, volume_id)
    }

    fn list(&self, prefix: &str, volume_id: &str) -> Result<Vec<UsageRecord>, VolumeError> {
        let rows = self
            .store
            .list_prefix::<UsageRecord>(Table::USAGES, prefix)
            .map_err(|source| VolumeError::Store {
                volume_id: volume_id.to_string(),
                source,
            })?;
        Ok(rows.into_iter().map(|(_, r)| r).collect())
    }

    /// The staging path of a record, when its plugin stages.
    fn staging_of(&self, rec: &UsageRecord) -> Result<Option<PathBuf>, VolumeError> {
        rec.staging.map(|_| self.staging_path(rec)).transpose()
    }

    /// Whether the record says staged while nothing is mounted at its staging path.
    fn staged_but_unmounted(&self, rec: &UsageRecord) -> Result<bool, VolumeError> {
        if rec.staging != Some(StageState::Staged) {
            return Ok(false);
        }
        let table = self.mounts.mounts().map_err(VolumeError::MountTable)?;
        Ok(top_mount_at(&table, &self.staging_path(rec)?).is_none())
    }

    /// The record's staging path: the volume's one staging directory (shared by its read-only
    /// and read-write usages; see [`UsageRecord::staging_dir_name`]).
    fn staging_path(&self, rec: &UsageRecord) -> Result<PathBuf, VolumeError> {
        self.paths
            .volume_staging_dir(&rec.volume_id)
            .map(|dir| dir.join(rec.staging_dir_name()))
            .map_err(|source| invalid(&rec.volume_id, source))
    }

    /// A record for a new usage of the volume, not yet saved.
    fn new_record(
        &self,
        req: &MountRequest,
        usage: UsageKey,
        mount_options: StoredMountOptions,
        staging: Option<StageState>,
    ) -> UsageRecord {
        UsageRecord {
            plugin_id: self.plugin_id.clone(),
            volume_id: req.volume_id.clone(),
            external_id: req.external_id.clone(),
            usage,
            mount_options,
            staging,
            allocs: BTreeMap::new(),
            publish_context: req.publish_context.clone(),
            volume_context: req.volume_context.clone(),
            shared_staging: staging.is_some(),
        }
    }

    /// Writes the record; durable when it returns (the commit may be shared with other
    /// volumes' writes, and the caller's runtime thread is not held while it waits).
    async fn save(&self, ctx: &Ctx<'_>, rec: &UsageRecord) -> Result<(), VolumeError> {
        self.save_as(ctx, rec, Save::Now).await
    }

    /// Writes the record, durable when it returns only with [`Save::Now`].
    async fn save_as(
        &self,
        ctx: &Ctx<'_>,
        rec: &UsageRecord,
        save: Save,
    ) -> Result<(), VolumeError> {
        let mut b = Batch::new();
        b.put(Table::USAGES, &rec.key(), rec);
        if save != Save::Now {
            b.deferred();
        }
        self.store
            .commit(b)
            .await
            .map(drop)
            .map_err(|source| self.store_err(ctx, source))
    }

    /// Creates `dir` and every missing parent with kubelet's mode for the directories it
    /// hands to plugins (0750), as the CO's side of the CSI contract requires.
    fn co_dir(&self, ctx: &Ctx<'_>, dir: &Path) -> Result<(), VolumeError> {
        berth_sys::create_dir_with_mode(dir, CO_DIR_MODE).map_err(|source| VolumeError::Dir {
            volume_id: ctx.volume_id.to_string(),
            path: dir.to_path_buf(),
            source,
        })
    }

    /// After a successful unstage or unpublish: removes `path` (the staging directory, or a
    /// target the plugin should have removed: an empty directory, or the empty file of a block
    /// volume) unless something is still mounted there or it holds data, then up to `parents`
    /// of its now empty parent directories. Never fails the operation: what stays is logged.
    /// In the manager's own mount namespace the kernel refuses to remove a mount point, so
    /// the table is read only when it is another namespace's.
    fn remove_co_path(&self, ctx: &Ctx<'_>, path: &Path, parents: usize) {
        let left_mounted = || {
            tracing::warn!(volume_id = ctx.volume_id, usage = %ctx.usage, path = %path.display(),
                "the plugin answered OK but left a mount there; leaving it in place");
        };
        if !self.mounts.is_own_namespace() {
            match self.mounts.mounts() {
                Ok(table) if top_mount_at(&table, path).is_some() => return left_mounted(),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(volume_id = ctx.volume_id, path = %path.display(), error = %e,
                        "cannot read the mount table; leaving the path in place");
                    return;
                }
            }
        }
        match berth_sys::remove_empty_unmounted(path) {
            Removal::Gone => {}
            Removal::Mounted => return left_mounted(),
            Removal::Kept(e) => {
                tracing::warn!(volume_id = ctx.volume_id, usage = %ctx.usage, path = %path.display(),
                    error = %e, "leaving a path the plugin did not clean up");
                return;
            }
        }
        let mut dir = path.parent();
        for _ in 0..parents {
            let Some(d) = dir else { break };
            if std::fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
    }

    fn store_err(&self, ctx: &Ctx<'_>, source: berth_state::StateError) -> VolumeError {
        VolumeError::Store {
            volume_id: ctx.volume_id.to_string(),
            source,
        }
    }

    fn csi_err(&self, ctx: &Ctx<'_>, alloc_id: Option<&str>, e: CsiError) -> VolumeError {
        let volume_id = ctx.volume_id.to_string();
        let alloc_id = alloc_id.map(str::to_string);
        if e.is_cancelled() {
            tracing::warn!(volume_id, alloc_id, usage = %ctx.usage, rpc = %e.rpc(), "cancelled");
            return VolumeError::Cancelled {
                volume_id,
                alloc_id,
                usage: ctx.usage,
            };
        }
        tracing::warn!(plugin = %self.plugin_id, volume_id, alloc_id, usage = %ctx.usage,
            rpc = %e.rpc(), code = %berth_csi::code_name(e.code()), error = %e, "node RPC failed");
        VolumeError::Csi {
            plugin_id: self.plugin_id.clone(),
            volume_id,
            alloc_id,
            usage: ctx.usage,
            source: Box::new(e),
        }
    }
}

/// Every persisted record of one volume of `plugin_id` on this node, in key order, read
/// straight from the store: what the node holds of the volume even before a manager for the
/// plugin exists (after a restart, while its plugin is not back yet). Never waits for an
/// operation in flight; a record in an intent state (`staging`, `publishing`…) says one is.
pub fn volume_records(
    store: &Store,
    plugin_id: &str,
    volume_id: &str,
) -> Result<Vec<UsageRecord>, VolumeError> {
    let rows = store
        .list_prefix::<UsageRecord>(Table::USAGES, &format!("{plugin_id}/{volume_id}/"))
        .map_err(|source| VolumeError::Store {
            volume_id: volume_id.to_string(),
            source,
        })?;
    Ok(rows.into_iter().map(|(_, r)| r).collect())
}

fn invalid(volume_id: &str, source: PathError) -> VolumeError {
    VolumeError::InvalidPath {
        volume_id: volume_id.to_string(),
        source,
    }
}

fn conflict(volume_id: &str, usage: UsageKey, what: &'static str) -> VolumeError {
    VolumeError::Conflict {
        volume_id: volume_id.to_string(),
        usage,
        what,
    }
}
