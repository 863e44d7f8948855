//! The volume manager itself.

use std::{
    collections::BTreeMap,
    io,
    path::{Path, PathBuf},
    sync::Arc,
};

use berth_csi::{
    CsiClient, CsiError, NodePublish, NodeStage,
    model::{ExternalId, NodeCapabilities, NodeCapability, Secrets},
};
use berth_state::{KeyedLocks, Store, Table};
use berth_sys::{MountEntry, top_mount_at};
use berth_volume::{PluginDir, PluginPaths, Usage, UsageKey};

use crate::{
    error::VolumeError,
    record::{PublishState, StageState, StoredMountOptions, UsageRecord, record_key},
};

/// The mount table the manager checks targets against: the one the plugin mounts into.
pub trait MountTable: Send + Sync {
    /// Every mount, as `/proc/<pid>/mountinfo` lists them.
    fn mounts(&self) -> io::Result<Vec<MountEntry>>;
}

/// The mount table of a process: `/proc/self/mountinfo` by default.
#[derive(Debug, Clone)]
pub struct ProcMountTable {
    path: PathBuf,
}

impl ProcMountTable {
    /// `/proc/self/mountinfo`: plugins that share the agent's mount namespace.
    pub fn current() -> Self {
        Self::at("/proc/self/mountinfo")
    }

    /// Any mountinfo file, e.g. `/proc/<pid>/mountinfo` of a plugin in its own namespace.
    pub fn at(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }
}

impl MountTable for ProcMountTable {
    fn mounts(&self) -> io::Result<Vec<MountEntry>> {
        berth_sys::read_mountinfo(&self.path).map_err(io::Error::other)
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
/// Operations on one volume are serialized; different volumes run in parallel.
pub struct VolumeManager {
    store: Arc<Store>,
    client: CsiClient,
    plugin_id: String,
    paths: PluginPaths,
    node_caps: NodeCapabilities,
    mounts: Arc<dyn MountTable>,
    locks: KeyedLocks,
}

impl std::fmt::Debug for VolumeManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeManager")
            .field("plugin_id", &self.plugin_id)
            .field("root", &self.paths.root())
            .finish_non_exhaustive()
    }
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
        })
    }

    /// The plugin's directory paths.
    pub fn paths(&self) -> &PluginPaths {
        &self.paths
    }

    /// Every record of this plugin, in key order.
    pub fn records(&self) -> Result<Vec<UsageRecord>, VolumeError> {
        let prefix = format!("{}/", self.plugin_id);
        let all = self
            .store
            .list::<UsageRecord>(Table::USAGES)
            .map_err(|source| VolumeError::Store {
                volume_id: String::new(),
                source,
            })?;
        Ok(all
            .into_iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(_, r)| r)
            .collect())
    }

    /// The record of one usage, if any.
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

    /// Stages (once per usage, when the plugin stages) and publishes the volume for the alloc;
    /// returns the target path. Publishing an (alloc, usage) that is already published returns
    /// its target without any RPC. On error the record stays in its intent state.
    pub async fn mount(&self, req: MountRequest) -> Result<PathBuf, VolumeError> {
        let volume_id = req.volume_id.as_str();
        let key = req.usage.key();
        let invalid = |source| VolumeError::InvalidPath {
            volume_id: volume_id.to_string(),
            source,
        };
        let staging = self.paths.staging(volume_id, key).map_err(invalid)?;
        let target = self
            .paths
            .publish(volume_id, &req.alloc_id, key)
            .map_err(invalid)?;
        let _guard = self.locks.lock(volume_id).await;
        let ctx = Ctx {
            volume_id,
            usage: key,
        };
        let options = StoredMountOptions::from(&req.usage.mount_options);
        let mut rec = match self.record(volume_id, key)? {
            Some(rec) => {
                if rec.external_id != req.external_id {
                    return Err(self.conflict(&ctx, "external id"));
                }
                if rec.mount_options != options {
                    return Err(self.conflict(&ctx, "mount options"));
                }
                rec
            }
            None => UsageRecord {
                plugin_id: self.plugin_id.clone(),
                volume_id: volume_id.to_string(),
                external_id: req.external_id.clone(),
                usage: key,
                mount_options: options,
                staging: self
                    .node_caps
                    .has(NodeCapability::StageUnstageVolume)
                    .then_some(StageState::Staging),
                allocs: BTreeMap::new(),
                publish_context: req.publish_context.clone(),
                volume_context: req.volume_context.clone(),
            },
        };
        if rec.allocs.get(&req.alloc_id) == Some(&PublishState::Published) {
            return Ok(target);
        }
        if rec.staging.is_some_and(|s| s != StageState::Staged) {
            self.stage(&ctx, &mut rec, &staging, &req.secrets).await?;
        }
        self.publish(
            &ctx,
            &mut rec,
            &req.alloc_id,
            &target,
            &staging,
            &req.publish_context,
            &req.volume_context,
            &req.secrets,
        )
        .await?;
        Ok(target)
    }

    /// Unpublishes the volume for the alloc and, when no alloc uses the usage any more (by the
    /// persisted record), unstages it and deletes its record. `NOT_FOUND` from the plugin counts
    /// as done; nothing to do is success. On error the record stays in its intent state.
    pub async fn unmount(
        &self,
        volume_id: &str,
        alloc_id: &str,
        usage: UsageKey,
    ) -> Result<(), VolumeError> {
        let invalid = |source| VolumeError::InvalidPath {
            volume_id: volume_id.to_string(),
            source,
        };
        let staging = self.paths.staging(volume_id, usage).map_err(invalid)?;
        let target = self
            .paths
            .publish(volume_id, alloc_id, usage)
            .map_err(invalid)?;
        let _guard = self.locks.lock(volume_id).await;
        let ctx = Ctx { volume_id, usage };
        let Some(mut rec) = self.record(volume_id, usage)? else {
            return Ok(());
        };
        if rec.allocs.contains_key(alloc_id) {
            self.unpublish(&ctx, &mut rec, alloc_id, &target).await?;
        }
        if rec.allocs.is_empty() {
            self.release(&ctx, &mut rec, &staging).await?;
        }
        Ok(())
    }

    /// Drives every record of this plugin to a resting state, at start (before any mount or
    /// unmount): published allocs whose target is still mounted are kept without an RPC;
    /// interrupted publishes, stages, unpublishes and unstages are sent again (stages and
    /// publishes with empty secrets: a later [`mount`](Self::mount) re-drives with its own if
    /// that fails); published targets or staging dirs that are no longer mounted are mounted
    /// again. Unused usages are released.
    pub async fn reconcile(&self) -> ReconcileReport {
        let mut report = ReconcileReport::default();
        let records = match self.records() {
            Ok(r) => r,
            Err(e) => {
                report.errors.push(e);
                return report;
            }
        };
        for rec in records {
            if let Err(e) = self.reconcile_one(rec, &mut report.actions).await {
                report.errors.push(e);
            }
        }
        report
    }

    async fn reconcile_one(
        &self,
        rec: UsageRecord,
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
        let invalid = |source| VolumeError::InvalidPath {
            volume_id: volume_id.clone(),
            source,
        };
        let staging = self.paths.staging(&volume_id, usage).map_err(invalid)?;
        let secrets = Secrets::default();

        // Interrupted unpublishes first.
        let mut unpublished = false;
        let leaving: Vec<String> = rec
            .allocs
            .iter()
            .filter(|(_, s)| **s == PublishState::Unpublishing)
            .map(|(a, _)| a.clone())
            .collect();
        for alloc_id in leaving {
            let target = self
                .paths
                .publish(&volume_id, &alloc_id, usage)
                .map_err(invalid)?;
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
                    self.stage(&ctx, &mut rec, &staging, &secrets).await?;
                    actions.push(ReconcileAction::Staged { volume_id, usage });
                }
                // Staged and unused since a finished unpublish or an interrupted unstage, or
                // never staged and unused: release.
                Some(StageState::Staged) if !unpublished => {}
                _ => {
                    self.release(&ctx, &mut rec, &staging).await?;
                    actions.push(ReconcileAction::Released { volume_id, usage });
                }
            }
            return Ok(());
        }

        let table = self.mounts.mounts().map_err(VolumeError::MountTable)?;
        let mounted = |p: &Path| top_mount_at(&table, p).is_some();
        let restage = match rec.staging {
            None => false,
            Some(StageState::Staged) => !mounted(&staging),
            Some(StageState::Staging | StageState::Unstaging) => true,
        };
        if restage {
            self.stage(&ctx, &mut rec, &staging, &secrets).await?;
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
            let target = self
                .paths
                .publish(&volume_id, &alloc_id, usage)
                .map_err(invalid)?;
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
                &secrets,
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
    ) -> Result<(), VolumeError> {
        rec.staging = Some(StageState::Staging);
        self.save(ctx, rec)?;
        if let Some(parent) = staging.parent() {
            self.private_dir(ctx, parent)?;
        }
        let usage = rec.full_usage();
        let req = NodeStage {
            external_id: rec.external_id.clone(),
            staging_path: staging.to_path_buf(),
            capability: usage.capability(),
            publish_context: rec.publish_context.clone(),
            volume_context: rec.volume_context.clone(),
            secrets: secrets.clone(),
        };
        self.client
            .node_stage(&req)
            .await
            .map_err(|e| self.csi_err(ctx, None, e))?;
        rec.staging = Some(StageState::Staged);
        self.save(ctx, rec)?;
        tracing::info!(volume_id = ctx.volume_id, usage = %ctx.usage, "staged");
        Ok(())
    }

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
        self.save(ctx, rec)?;
        if let Some(parent) = target.parent() {
            self.private_dir(ctx, parent)?;
        }
        let usage = rec.full_usage();
        let req = NodePublish {
            external_id: rec.external_id.clone(),
            staging_path: rec.staging.is_some().then(|| staging.to_path_buf()),
            target_path: target.to_path_buf(),
            capability: usage.capability(),
            read_only: usage.read_only,
            publish_context: publish_context.clone(),
            volume_context: volume_context.clone(),
            secrets: secrets.clone(),
        };
        self.client
            .node_publish(&req)
            .await
            .map_err(|e| self.csi_err(ctx, Some(alloc_id), e))?;
        rec.allocs
            .insert(alloc_id.to_string(), PublishState::Published);
        self.save(ctx, rec)?;
        tracing::info!(volume_id = ctx.volume_id, alloc_id, usage = %ctx.usage, "published");
        Ok(())
    }

    async fn unpublish(
        &self,
        ctx: &Ctx<'_>,
        rec: &mut UsageRecord,
        alloc_id: &str,
        target: &Path,
    ) -> Result<(), VolumeError> {
        rec.allocs
            .insert(alloc_id.to_string(), PublishState::Unpublishing);
        self.save(ctx, rec)?;
        match self.client.node_unpublish(&rec.external_id, target).await {
            Ok(()) => {}
            Err(e) if e.is_already_done() => {}
            Err(e) => return Err(self.csi_err(ctx, Some(alloc_id), e)),
        }
        rec.allocs.remove(alloc_id);
        self.save(ctx, rec)?;
        // Best effort: the alloc's now empty directories (the plugin removes the target).
        if let Some(vol_dir) = target.parent() {
            let _ = std::fs::remove_dir(vol_dir);
            if let Some(alloc_dir) = vol_dir.parent() {
                let _ = std::fs::remove_dir(alloc_dir);
            }
        }
        tracing::info!(volume_id = ctx.volume_id, alloc_id, usage = %ctx.usage, "unpublished");
        Ok(())
    }

    /// Unstages an unused usage (if staged) and deletes its record.
    async fn release(
        &self,
        ctx: &Ctx<'_>,
        rec: &mut UsageRecord,
        staging: &Path,
    ) -> Result<(), VolumeError> {
        debug_assert!(rec.allocs.is_empty());
        if rec.staging.is_some() {
            rec.staging = Some(StageState::Unstaging);
            self.save(ctx, rec)?;
            match self.client.node_unstage(&rec.external_id, staging).await {
                Ok(()) => {}
                Err(e) if e.is_already_done() => {}
                Err(e) => return Err(self.csi_err(ctx, None, e)),
            }
            if let Some(parent) = staging.parent() {
                let _ = std::fs::remove_dir(parent);
            }
            tracing::info!(volume_id = ctx.volume_id, usage = %ctx.usage, "unstaged");
        }
        self.store
            .delete(Table::USAGES, &rec.key())
            .map_err(|source| self.store_err(ctx, source))?;
        Ok(())
    }

    // ---- helpers ----

    fn save(&self, ctx: &Ctx<'_>, rec: &UsageRecord) -> Result<(), VolumeError> {
        self.store
            .put(Table::USAGES, &rec.key(), rec)
            .map_err(|source| self.store_err(ctx, source))
    }

    fn private_dir(&self, ctx: &Ctx<'_>, dir: &Path) -> Result<(), VolumeError> {
        berth_sys::create_private_dir(dir).map_err(|source| VolumeError::Dir {
            volume_id: ctx.volume_id.to_string(),
            path: dir.to_path_buf(),
            source,
        })
    }

    fn store_err(&self, ctx: &Ctx<'_>, source: berth_state::StateError) -> VolumeError {
        VolumeError::Store {
            volume_id: ctx.volume_id.to_string(),
            source,
        }
    }

    fn conflict(&self, ctx: &Ctx<'_>, what: &'static str) -> VolumeError {
        VolumeError::Conflict {
            volume_id: ctx.volume_id.to_string(),
            usage: ctx.usage,
            what,
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
        tracing::warn!(volume_id, alloc_id, usage = %ctx.usage, error = %e, "CSI call failed");
        VolumeError::Csi {
            volume_id,
            alloc_id,
            usage: ctx.usage,
            source: e,
        }
    }
}
