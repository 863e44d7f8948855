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
    nodestate::NodeRecords,
    plugin::{MountAt, MountView, Plugin},
    state::{Capability, NodePublication},
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
        let records = self.node.get(id).await;
        let mut view = self.view(id);
        let source = match &staging {
            Some(path) => match view.at(path)? {
                MountAt::Volume => path.clone(),
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
        match view.at(&target)? {
            MountAt::Volume => match records.published.get(&target) {
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
                    if self.adoptable(&mut view, &target, "target_path", read_only)? {
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
        self.check_other_targets(&mut view, &records, &target, &capability)?;
        if self.settings.strict {
            self.require_same_capability(&mut view, &records, &target, &capability)?;
            strict::target_parent(&target)?;
        }
        let created = self.make_target(id, &records, &target, &wanted).await?;
        if let Err(e) = self.mounter.bind(&source, &target, read_only) {
            let status = bind_failed(&e, &target, created);
            let removed = created && !target.exists();
            // Nothing of this call is left to record.
            self.node
                .update(id, false, |r| {
                    if created {
                        r.published.remove(&target);
                    }
                    if removed {
                        r.created_targets.remove(&target);
                    }
                    Ok::<_, Status>(())
                })
                .await?;
            return Err(status);
        }
        // Already recorded if this call made the directory.
        self.record_publication(id, &target, wanted).await?;
        tracing::info!(volume_id = %id, path = %target.display(), read_only, "published");
        Ok(pb::NodePublishVolumeResponse {})
    }

    /// Makes sure the directory `target` exists, creating it if missing: the spec gives that
    /// job to the plugin. A directory it creates is recorded first (so a retry after a crash
    /// knows whose it is; in strict mode, where a directory the plugin did not make is refused,
    /// that record is synced to disk, so that even a crash of the machine cannot make the
    /// plugin disown it), and NodeUnpublishVolume removes it. The `publication` about to be
    /// made is recorded with it, in the same write: a publication record is believed only
    /// where the volume is mounted, so one recorded ahead of its bind says nothing wrong.
    /// Returns whether this call created the directory.
    async fn make_target(
        &self,
        id: &str,
        records: &NodeRecords,
        target: &Path,
        publication: &NodePublication,
    ) -> Result<bool, Status> {
        let ours = records.created_targets.contains(target);
        match fs::symlink_metadata(target) {
            Ok(m) if !m.is_dir() => Err(Status::invalid_argument(format!(
                "target_path {} exists and is not a directory",
                target.display()
            ))),
            Ok(_) if ours || !self.settings.strict => Ok(false),
            Ok(_) => Err(strict::target_made_by_co(target)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let sync = self.settings.strict && !ours;
                self.node
                    .update(id, sync, |r| {
                        r.created_targets.insert(target.to_path_buf());
                        r.published
                            .insert(target.to_path_buf(), publication.clone());
                        Ok::<_, Status>(())
                    })
                    .await?;
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

    /// Strict mode: the spec asks the CO not to publish a volume a second time with another
    /// capability (and the plugin to answer `FAILED_PRECONDITION` if it does).
    fn require_same_capability(
        &self,
        view: &mut MountView<'_>,
        records: &NodeRecords,
        target: &Path,
        capability: &Capability,
    ) -> Result<(), Status> {
        let others = records
            .published
            .iter()
            .filter(|(t, p)| t.as_path() != target && p.capability != *capability);
        for (other, p) in others {
            if matches!(view.at(other)?, MountAt::Volume) {
                return Err(Status::failed_precondition(format!(
                    "volume {} is published at {} with access mode {} and fs_type {:?}: the CSI \
                     spec asks the CO not to publish it again with another volume_capability \
                     (refused in strict mode)",
                    view.id(),
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
        view: &mut MountView<'_>,
        records: &NodeRecords,
        target: &Path,
        capability: &Capability,
    ) -> Result<(), Status> {
        for (other, p) in records
            .published
            .iter()
            .filter(|(t, _)| t.as_path() != target)
        {
            if !caps::single_target(capability) && !caps::single_target(&p.capability) {
                continue;
            }
            if matches!(view.at(other)?, MountAt::Volume) {
                return Err(Status::failed_precondition(format!(
                    "volume {} is already published at {} and SINGLE_NODE_SINGLE_WRITER allows \
                     one target path per node",
                    view.id(),
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
        self.node
            .update(id, false, |r| {
                r.published.insert(target.to_path_buf(), publication);
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
        if !self.store.read(|s| s.volumes.contains_key(id)).await? {
            return Err(self.volume_gone(id, target).await);
        }
        let target = target?;
        let free = self.unmount_volume_at(&target, id)?;
        let records = self.node.get(id).await;
        // The spec: the plugin deletes what it created at target_path. Outside strict mode an
        // empty directory the CO made goes too.
        let ours = records.created_targets.contains(&target);
        let removed = if free && (ours || !self.settings.strict) {
            remove_empty_dir(&target)
        } else {
            Ok(false)
        };
        // One write: the publication goes (nothing of the volume is mounted there any more),
        // and so does the claim on a directory that is gone. A kill before it leaves records
        // that a retry finds true or harmless: nothing is mounted, the directory is gone.
        let gone = matches!(removed, Ok(true));
        self.node
            .update(id, false, |r| {
                r.published.remove(&target);
                if gone {
                    r.created_targets.remove(&target);
                }
                Ok::<_, Status>(())
            })
            .await?;
        removed?;
        tracing::info!(volume_id = %id, path = %target.display(), "unpublished");
        Ok(pb::NodeUnpublishVolumeResponse {})
    }
}
