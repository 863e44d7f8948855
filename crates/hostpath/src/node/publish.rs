//! NodePublishVolume and NodeUnpublishVolume.

use std::{fs, io, path::Path};

use berth_csi::pb;
use tonic::{Code, Status};

use super::{bind_failed, remove_empty_dir};
use crate::{
    caps,
    error::internal,
    files,
    locks::volume_key,
    plugin::{MountAt, Plugin},
    state::{Capability, NodePublication, VolumeRecord},
    strict,
};

impl Plugin {
    pub(super) async fn node_publish_volume(
        &self,
        req: &pb::NodePublishVolumeRequest,
    ) -> Result<pb::NodePublishVolumeResponse, Status> {
        let statedir = &self.settings.statedir;
        // The volume first: an unknown one is NOT_FOUND whatever the other fields hold.
        let id = caps::id(&req.volume_id, "volume_id")?;
        let _guard = self.locks.lock(&[volume_key(id)]).await;
        let v = self.node_volume(id).await?;
        let target = caps::mount_path(&req.target_path, "target_path", statedir)?;
        let capability = caps::required_capability(
            req.volume_capability.as_ref(),
            "volume_capability",
            Code::FailedPrecondition,
        )?;
        self.check_fs_type(&capability, "volume_capability")?;
        let staging = if self.settings.stage {
            if req.staging_target_path.is_empty() {
                return Err(Status::failed_precondition(
                    "staging_target_path is required: this plugin has STAGE_UNSTAGE_VOLUME",
                ));
            }
            let path = caps::mount_path(&req.staging_target_path, "staging_target_path", statedir)?;
            if path == target {
                return Err(Status::invalid_argument(
                    "target_path must differ from staging_target_path",
                ));
            }
            Some(path)
        } else {
            None
        };
        if self.settings.strict {
            strict::publish_context(
                &req.publish_context,
                self.settings.attach,
                &self.settings.node_id,
            )?;
            strict::volume_context(&req.volume_context)?;
        }
        let source = match &staging {
            Some(path) => match self.mount_at(path, id)? {
                MountAt::Volume(_) => path.clone(),
                _ => {
                    return Err(Status::failed_precondition(format!(
                        "volume {id} is not staged at {}; call NodeStageVolume first",
                        path.display()
                    )));
                }
            },
            None => {
                self.require_controller_published(&v)?;
                self.volume_path(id)
            }
        };
        let wanted = NodePublication {
            readonly: req.readonly,
            capability: capability.clone(),
            staging_path: staging.clone(),
        };
        let read_only = req.readonly || caps::reader_only(&capability);
        match self.mount_at(&target, id)? {
            MountAt::Volume(mount) => match v.published.get(&target) {
                Some(p) if *p == wanted => return Ok(pb::NodePublishVolumeResponse {}),
                Some(p) => {
                    return Err(Status::already_exists(format!(
                        "volume {id} is already published at {} with readonly={} and access \
                         mode {}",
                        target.display(),
                        p.readonly,
                        p.capability.access_mode
                    )));
                }
                None => {
                    // Mounted but not recorded (the record was lost): adopt the mount if it
                    // is what is asked for.
                    if self.adoptable(&target, "target_path", id, &mount, read_only)? {
                        self.record_publication(id, &target, wanted).await?;
                        return Ok(pb::NodePublishVolumeResponse {});
                    }
                }
            },
            MountAt::Other(e) => {
                return Err(Status::failed_precondition(format!(
                    "target_path {} already has another mount ({})",
                    target.display(),
                    e.fs_type
                )));
            }
            MountAt::Nothing => {}
        }
        self.check_other_targets(&v, &target, &capability)?;
        if self.settings.strict {
            self.require_same_capability(&v, &target, &capability)?;
            strict::target_parent(&target)?;
        }
        let created = self.make_target(&v, &target).await?;
        if let Err(e) = self.mounter.bind(&source, &target, read_only) {
            let status = bind_failed(&e, &target, created);
            if created && !target.exists() {
                self.forget_target(id, &target).await?;
            }
            return Err(status);
        }
        self.record_publication(id, &target, wanted).await?;
        tracing::info!(volume_id = %id, path = %target.display(), read_only, "published");
        Ok(pb::NodePublishVolumeResponse {})
    }

    /// Makes sure the directory `target` exists, creating it if missing: the spec gives that
    /// job to the plugin. A directory it creates is recorded first (so a retry after a crash
    /// knows whose it is), and NodeUnpublishVolume removes it. Returns whether this call
    /// created it. In strict mode a directory that this plugin did not create is refused.
    async fn make_target(&self, v: &VolumeRecord, target: &Path) -> Result<bool, Status> {
        let ours = v.created_targets.contains(target);
        match fs::symlink_metadata(target) {
            Ok(m) if !m.is_dir() => Err(Status::invalid_argument(format!(
                "target_path {} exists and is not a directory",
                target.display()
            ))),
            Ok(_) if ours || !self.settings.strict => Ok(false),
            Ok(_) => Err(strict::target_made_by_co(target)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if !ours {
                    self.store
                        .update(|s| {
                            if let Some(v) = s.volumes.get_mut(&v.id) {
                                v.created_targets.insert(target.to_path_buf());
                            }
                            Ok::<_, Status>(())
                        })
                        .await?;
                }
                let made = if self.settings.strict {
                    fs::create_dir(target)
                } else {
                    fs::create_dir_all(target)
                };
                made.map_err(|source| {
                    internal(&files::FsError {
                        action: "creating",
                        path: target.to_path_buf(),
                        source,
                    })
                })?;
                Ok(true)
            }
            Err(source) => Err(internal(&files::FsError {
                action: "inspecting",
                path: target.to_path_buf(),
                source,
            })),
        }
    }

    /// Drops `target` from the volume's created targets (it has been removed).
    async fn forget_target(&self, id: &str, target: &Path) -> Result<(), Status> {
        self.store
            .update(|s| {
                if let Some(v) = s.volumes.get_mut(id) {
                    v.created_targets.remove(target);
                }
                Ok::<_, Status>(())
            })
            .await
    }

    /// Strict mode: the spec asks the CO not to publish a volume a second time with another
    /// capability (and the plugin to answer `FAILED_PRECONDITION` if it does).
    fn require_same_capability(
        &self,
        v: &VolumeRecord,
        target: &Path,
        capability: &Capability,
    ) -> Result<(), Status> {
        let others = v
            .published
            .iter()
            .filter(|(t, p)| t.as_path() != target && p.capability != *capability);
        for (other, p) in others {
            if matches!(self.mount_at(other, &v.id)?, MountAt::Volume(_)) {
                return Err(Status::failed_precondition(format!(
                    "volume {} is published at {} with access mode {} and fs_type {:?}: the CSI \
                     spec asks the CO not to publish it again with another volume_capability \
                     (refused in strict mode)",
                    v.id,
                    other.display(),
                    p.capability.access_mode,
                    p.capability.fs_type
                )));
            }
        }
        Ok(())
    }

    /// A second target path on this node is refused (`FAILED_PRECONDITION`) when this or the
    /// existing publication is SINGLE_NODE_SINGLE_WRITER.
    pub(super) fn check_other_targets(
        &self,
        v: &VolumeRecord,
        target: &Path,
        capability: &Capability,
    ) -> Result<(), Status> {
        for (other, p) in v.published.iter().filter(|(t, _)| t.as_path() != target) {
            if !caps::single_target(capability) && !caps::single_target(&p.capability) {
                continue;
            }
            if matches!(self.mount_at(other, &v.id)?, MountAt::Volume(_)) {
                return Err(Status::failed_precondition(format!(
                    "volume {} is already published at {} and SINGLE_NODE_SINGLE_WRITER allows \
                     one target path per node",
                    v.id,
                    other.display(),
                )));
            }
        }
        Ok(())
    }

    pub(super) async fn record_publication(
        &self,
        id: &str,
        target: &Path,
        publication: NodePublication,
    ) -> Result<(), Status> {
        self.store
            .update(|s| {
                if let Some(v) = s.volumes.get_mut(id) {
                    v.published.insert(target.to_path_buf(), publication);
                }
                Ok::<_, Status>(())
            })
            .await
    }

    pub(super) async fn node_unpublish_volume(
        &self,
        req: &pb::NodeUnpublishVolumeRequest,
    ) -> Result<pb::NodeUnpublishVolumeResponse, Status> {
        let id = caps::id(&req.volume_id, "volume_id")?;
        let _guard = self.locks.lock(&[volume_key(id)]).await;
        let target = caps::mount_path(&req.target_path, "target_path", &self.settings.statedir);
        let Some(v) = self.store.read(|s| s.volumes.get(id).cloned()).await? else {
            return Err(self.volume_gone(id, target));
        };
        let target = target?;
        let free = self.unmount_volume_at(&target, id)?;
        if v.published.contains_key(&target) {
            self.store
                .update(|s| {
                    if let Some(v) = s.volumes.get_mut(id) {
                        v.published.remove(&target);
                    }
                    Ok::<_, Status>(())
                })
                .await?;
        }
        // The spec: the plugin deletes what it created at target_path. Outside strict mode an
        // empty directory the CO made goes too.
        let ours = v.created_targets.contains(&target);
        if free && (ours || !self.settings.strict) {
            let gone = remove_empty_dir(&target)?;
            if gone && ours {
                self.forget_target(id, &target).await?;
            }
        }
        tracing::info!(volume_id = %id, path = %target.display(), "unpublished");
        Ok(pb::NodeUnpublishVolumeResponse {})
    }
}
