//! NodeStageVolume and NodeUnstageVolume.

use std::path::Path;

use berth_csi::pb;
use tonic::{Code, Status};

use super::{bind_failed, ensure_dir, existing_dir, remove_empty_dir};
use crate::{
    Backing, caps,
    error::internal,
    image,
    locks::volume_key,
    nodestate::NodeRecords,
    plugin::{MountAt, MountView, Plugin, blocking},
    state::{Staging, VolumeRecord},
    strict,
};

impl Plugin {
    pub(super) async fn node_stage_volume(
        &self,
        req: &pb::NodeStageVolumeRequest,
    ) -> Result<pb::NodeStageVolumeResponse, Status> {
        if !self.settings.stage {
            return Err(Status::unimplemented(
                "NodeStageVolume is disabled (--enable-stage=false)",
            ));
        }
        // The volume first: an unknown one is NOT_FOUND whatever the other fields hold.
        let id = caps::id(&req.volume_id, "volume_id")?;
        let _guard = self.locks.lock(&[volume_key(id)]).await;
        let v = self.node_volume(id).await?;
        let staging = caps::mount_path(
            &req.staging_target_path,
            "staging_target_path",
            &self.settings.statedir,
        )?;
        let capability = caps::required_capability(
            req.volume_capability.as_ref(),
            "volume_capability",
            Code::FailedPrecondition,
        )?;
        self.check_fs_type(&capability, "volume_capability")?;
        self.require_controller_published(&v)?;
        if self.settings.strict {
            strict::publish_context(
                &req.publish_context,
                self.settings.attach,
                &self.settings.node_id,
            )?;
            strict::volume_context(&req.volume_context)?;
        }
        let records = self.node.get(id).await;
        let record = records.staged.get(&staging);
        let read_only = caps::reader_only(&capability);
        let mut view = self.view(id);
        match view.at(&staging)? {
            MountAt::Volume => match record {
                Some(s) if s.capability == capability => {
                    return Ok(pb::NodeStageVolumeResponse {});
                }
                Some(s) => {
                    return Err(Status::already_exists(format!(
                        "volume {id} is already staged at {} with access mode {}",
                        staging.display(),
                        s.capability.access_mode
                    )));
                }
                None => {
                    // Mounted but not recorded (the record was lost): adopt the mount if it
                    // is what is asked for.
                    if self.adoptable(&mut view, &staging, "staging_target_path", read_only)? {
                        self.record_staging(id, &staging, capability, false).await?;
                        return Ok(pb::NodeStageVolumeResponse {});
                    }
                }
            },
            MountAt::Other(e) => {
                return Err(Status::failed_precondition(format!(
                    "staging_target_path {} already has another mount ({})",
                    staging.display(),
                    e.fs_type
                )));
            }
            MountAt::Nothing => {}
        }
        let created = match self.settings.backing {
            Backing::Dir => {
                let created = if self.settings.strict {
                    strict::staging_dir(&staging)?;
                    self.require_one_staging_path(&mut view, &records, &staging)?;
                    false
                } else {
                    ensure_dir(&staging, "staging_target_path")?
                };
                if let Err(e) = self
                    .mounter
                    .bind(&self.volume_path(id), &staging, read_only)
                {
                    return Err(bind_failed(&e, &staging, created));
                }
                created
            }
            Backing::Image => {
                let flags = caps::mount_flags(req.volume_capability.as_ref());
                self.mount_image_at(&v, &records, &mut view, &staging, flags, read_only)
                    .await?;
                false
            }
        };
        let created = created || record.is_some_and(|s| s.created_dir);
        self.record_staging(id, &staging, capability, created)
            .await?;
        tracing::info!(volume_id = %id, path = %staging.display(), read_only, "staged");
        Ok(pb::NodeStageVolumeResponse {})
    }

    /// Mounts the filesystem in volume `v`'s image onto `staging` (image backing). The directory
    /// must exist (the plugin never makes it, as mount(2) would not), and nothing of the volume
    /// may be mounted elsewhere (one image mounted twice, from two loop devices, would be
    /// corrupted). The filesystem is first grown to fill its image, if it is smaller.
    async fn mount_image_at(
        &self,
        v: &VolumeRecord,
        records: &NodeRecords,
        view: &mut MountView<'_>,
        staging: &Path,
        flags: &[String],
        read_only: bool,
    ) -> Result<(), Status> {
        if self.settings.strict {
            strict::staging_dir(staging)?;
            self.require_one_staging_path(view, records, staging)?;
        } else {
            existing_dir(staging, "staging_target_path")?;
        }
        if let Some(m) = view
            .table()?
            .iter()
            .find(|e| self.is_volume_mount(e, &v.id))
        {
            return Err(Status::failed_precondition(format!(
                "volume {} is still mounted at {}: its image is mounted from one place at a \
                 time; unpublish and unstage it there first",
                v.id,
                m.mount_point.display()
            )));
        }
        let image = self.volume_path(&v.id);
        let file = image.clone();
        if blocking(move || image::fill_offline(&file)).await? {
            tracing::info!(volume_id = %v.id, "grew the filesystem to fill its image");
        }
        self.mounter
            .mount_image(&image, staging, image::FS_TYPE, flags, read_only)
            .map_err(|e| internal(&e))
    }

    /// Strict mode: the spec makes the CO keep one staging path per volume, so staging a volume
    /// that is still staged at another path is refused (`FAILED_PRECONDITION`).
    fn require_one_staging_path(
        &self,
        view: &mut MountView<'_>,
        records: &NodeRecords,
        staging: &Path,
    ) -> Result<(), Status> {
        let id = view.id();
        for other in records.staged.keys().filter(|p| p.as_path() != staging) {
            if matches!(view.at(other)?, MountAt::Volume) {
                return Err(Status::failed_precondition(format!(
                    "volume {id} is still staged at {}: the CSI spec makes the CO keep one \
                     staging_target_path per volume; unstage it there first (refused in strict \
                     mode)",
                    other.display()
                )));
            }
        }
        Ok(())
    }

    /// Strict mode: the spec makes the CO unpublish every target before unstaging, so unstaging
    /// a volume still published from `staging` is refused (`FAILED_PRECONDITION`).
    fn require_unpublished(
        &self,
        id: &str,
        records: &NodeRecords,
        staging: &Path,
    ) -> Result<(), Status> {
        let mut from_here = records
            .published
            .iter()
            .filter(|(_, p)| p.staging_path.as_deref() == Some(staging))
            .peekable();
        if from_here.peek().is_none() {
            return Ok(());
        }
        let mut view = self.view(id);
        for (target, _) in from_here {
            if matches!(view.at(target)?, MountAt::Volume) {
                return Err(Status::failed_precondition(format!(
                    "volume {id} is still published at {}: the CSI spec makes the CO call \
                     NodeUnpublishVolume for every target before NodeUnstageVolume (refused in \
                     strict mode)",
                    target.display()
                )));
            }
        }
        Ok(())
    }

    pub(super) async fn record_staging(
        &self,
        id: &str,
        path: &Path,
        capability: crate::state::Capability,
        created_dir: bool,
    ) -> Result<(), Status> {
        let staging = Staging {
            capability,
            created_dir,
        };
        self.node
            .update(id, false, |r| {
                r.staged.insert(path.to_path_buf(), staging);
                Ok::<_, Status>(())
            })
            .await
    }

    pub(super) async fn node_unstage_volume(
        &self,
        req: &pb::NodeUnstageVolumeRequest,
    ) -> Result<pb::NodeUnstageVolumeResponse, Status> {
        if !self.settings.stage {
            return Err(Status::unimplemented(
                "NodeUnstageVolume is disabled (--enable-stage=false)",
            ));
        }
        let id = caps::id(&req.volume_id, "volume_id")?;
        let _guard = self.locks.lock(&[volume_key(id)]).await;
        let staging = caps::mount_path(
            &req.staging_target_path,
            "staging_target_path",
            &self.settings.statedir,
        );
        if !self.store.read(|s| s.volumes.contains_key(id)).await? {
            return Err(self.volume_gone(id, staging).await);
        }
        let staging = staging?;
        let records = self.node.get(id).await;
        if self.settings.strict {
            self.require_unpublished(id, &records, &staging)?;
        }
        let free = self.unmount_volume_at(&staging, id)?;
        let record = records.staged.get(&staging).cloned();
        if record.is_some() {
            self.node
                .update(id, false, |r| {
                    r.staged.remove(&staging);
                    Ok::<_, Status>(())
                })
                .await?;
        }
        // Only a directory this plugin made goes (never one in strict mode).
        if free && record.is_some_and(|r| r.created_dir) {
            remove_empty_dir(&staging)?;
        }
        tracing::info!(volume_id = %id, path = %staging.display(), "unstaged");
        Ok(pb::NodeUnstageVolumeResponse {})
    }
}
