//! NodePublishVolume and NodeUnpublishVolume.

use std::path::Path;

use berth_csi::pb;
use tonic::{Code, Status};

use super::{bind_failed, ensure_dir, remove_empty_dir};
use crate::{
    caps,
    locks::volume_key,
    plugin::{MountAt, Plugin},
    state::{NodePublication, VolumeRecord},
};

impl Plugin {
    pub(super) async fn node_publish_volume(
        &self,
        req: &pb::NodePublishVolumeRequest,
    ) -> Result<pb::NodePublishVolumeResponse, Status> {
        let statedir = &self.settings.statedir;
        let id = caps::id(&req.volume_id, "volume_id")?;
        let target = caps::mount_path(&req.target_path, "target_path", statedir)?;
        let capability = caps::required_capability(
            req.volume_capability.as_ref(),
            "volume_capability",
            Code::FailedPrecondition,
        )?;
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
        let _guard = self.locks.lock(&[volume_key(id)]).await;
        let v = self.node_volume(id).await?;
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
                self.volume_dir(id)
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

        let created = ensure_dir(&target, "target_path")?;
        if let Err(e) = self.mounter.bind(&source, &target, read_only) {
            return Err(bind_failed(&e, &target, created));
        }
        self.record_publication(id, &target, wanted).await?;
        tracing::info!(volume_id = %id, path = %target.display(), read_only, "published");
        Ok(pb::NodePublishVolumeResponse {})
    }

    /// A second target path on this node is refused (`FAILED_PRECONDITION`) when this or the
    /// existing publication is SINGLE_NODE_SINGLE_WRITER.
    pub(super) fn check_other_targets(
        &self,
        v: &VolumeRecord,
        target: &Path,
        capability: &crate::state::Capability,
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
        let target = caps::mount_path(&req.target_path, "target_path", &self.settings.statedir)?;
        let _guard = self.locks.lock(&[volume_key(id)]).await;
        // Unmount first: whatever the answer, the volume is not published here afterwards
        // (callers take NOT_FOUND as "already unpublished", so it must be true).
        // Without a record, nothing says who made the directory: it stays.
        let free = self.unmount_volume_at(&target, id)?;
        let v = self.node_volume(id).await?;
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
        if free {
            remove_empty_dir(&target)?;
        }
        tracing::info!(volume_id = %id, path = %target.display(), "unpublished");
        Ok(pb::NodeUnpublishVolumeResponse {})
    }
}
