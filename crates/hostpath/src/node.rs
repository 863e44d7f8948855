//! The CSI Node service: staging and publishing are bind mounts, decided from the real mount
//! table (so the plugin's view stays right across its own restarts).

use std::{fs, io, path::Path, sync::Arc};

use berth_csi::pb::{
    self, NodeServiceCapability,
    node_service_capability::{self, rpc},
    volume_usage::Unit,
};
use berth_sys::{MountEntry, MountError};
use tonic::{Code, Status};

use crate::{
    caps,
    error::internal,
    files,
    locks::volume_key,
    plugin::{MountAt, Plugin, blocking},
    state::{NodePublication, Staging, VolumeRecord},
};

/// Most mounts of one volume stacked at one path that an unmount call removes.
const MAX_STACKED_MOUNTS: usize = 16;

#[derive(Debug, Clone)]
pub(crate) struct NodeService(pub Arc<Plugin>);

/// The node capabilities this plugin advertises.
pub(crate) fn node_capabilities(stage: bool) -> Vec<NodeServiceCapability> {
    let mut types = Vec::new();
    if stage {
        types.push(rpc::Type::StageUnstageVolume);
    }
    types.extend([
        rpc::Type::GetVolumeStats,
        rpc::Type::ExpandVolume,
        rpc::Type::VolumeCondition,
        rpc::Type::SingleNodeMultiWriter,
    ]);
    types
        .into_iter()
        .map(|t| NodeServiceCapability {
            r#type: Some(node_service_capability::Type::Rpc(
                node_service_capability::Rpc { r#type: t as i32 },
            )),
        })
        .collect()
}

/// Creates the directory `path` if it is missing; whether it did. `INVALID_ARGUMENT` if
/// something that is not a directory is there.
fn ensure_dir(path: &Path, field: &str) -> Result<bool, Status> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Ok(false),
        Ok(_) => Err(Status::invalid_argument(format!(
            "{field} {} exists and is not a directory",
            path.display()
        ))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::create_dir_all(path).map_err(|source| {
                internal(&files::FsError {
                    action: "creating",
                    path: path.to_path_buf(),
                    source,
                })
            })?;
            Ok(true)
        }
        Err(source) => Err(internal(&files::FsError {
            action: "inspecting",
            path: path.to_path_buf(),
            source,
        })),
    }
}

/// Removes the directory `path` if it is empty; leaves anything else alone.
fn remove_empty_dir(path: &Path) -> Result<(), Status> {
    match fs::remove_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::DirectoryNotEmpty | io::ErrorKind::NotADirectory
            ) =>
        {
            tracing::warn!(path = %path.display(), error = %e, "leaving a non-empty path in place");
            Ok(())
        }
        Err(source) => Err(internal(&files::FsError {
            action: "removing",
            path: path.to_path_buf(),
            source,
        })),
    }
}

/// The status of a failed bind onto `path`. Removes `path` if the request `created` it and the
/// bind left nothing mounted there.
fn bind_failed(err: &MountError, path: &Path, created: bool) -> Status {
    if created
        && !err.left_a_mount()
        && let Err(status) = remove_empty_dir(path)
    {
        tracing::warn!(path = %path.display(), error = status.message(),
            "could not remove the directory made for the mount");
    }
    internal(err)
}

impl Plugin {
    async fn node_volume(&self, id: &str) -> Result<VolumeRecord, Status> {
        self.store
            .read(|s| s.volumes.get(id).cloned())
            .await
            .ok_or_else(|| Status::not_found(format!("volume {id} does not exist")))
    }

    fn require_controller_published(&self, v: &VolumeRecord) -> Result<(), Status> {
        if self.settings.attach && !v.published_nodes.contains_key(&self.settings.node_id) {
            return Err(Status::failed_precondition(format!(
                "volume {} is not controller-published to node {}; call ControllerPublishVolume \
                 first",
                v.id, self.settings.node_id
            )));
        }
        Ok(())
    }

    /// Whether `mount`, an unrecorded mount of volume `id` at `field` = `path`, may be adopted
    /// for a request that wants a mount with `read_only`. A writable mount where a read-only
    /// one is wanted (left, for one, by a bind whose read-only remount could not be undone) is
    /// never adopted: it is unmounted, and `false` tells the caller to mount afresh.
    fn adoptable(
        &self,
        path: &Path,
        field: &str,
        id: &str,
        mount: &MountEntry,
        read_only: bool,
    ) -> Result<bool, Status> {
        if mount.read_only || !read_only {
            return Ok(true);
        }
        tracing::warn!(
            volume_id = %id,
            path = %path.display(),
            "replacing an unrecorded writable mount of the volume by a read-only one"
        );
        if self.unmount_volume_at(path, id)? {
            Ok(false)
        } else {
            Err(Status::failed_precondition(format!(
                "{field} {} has another mount under the volume's",
                path.display()
            )))
        }
    }

    /// Unmounts every mount of volume `id` stacked at `path`. Returns whether `path` is free of
    /// mounts afterwards (false when something else is mounted there, which is left alone).
    fn unmount_volume_at(&self, path: &Path, id: &str) -> Result<bool, Status> {
        for _ in 0..MAX_STACKED_MOUNTS {
            match self.mount_at(path, id)? {
                MountAt::Nothing => return Ok(true),
                MountAt::Other(_) => return Ok(false),
                MountAt::Volume(_) => match self.mounter.unmount(path) {
                    Ok(()) => tracing::debug!(path = %path.display(), "unmounted"),
                    Err(e) if e.is_not_mounted() => {}
                    Err(e) => return Err(internal(&e)),
                },
            }
        }
        Err(Status::internal(format!(
            "more than {MAX_STACKED_MOUNTS} mounts of volume {id} are stacked at {}",
            path.display()
        )))
    }

    async fn node_stage_volume(
        &self,
        req: &pb::NodeStageVolumeRequest,
    ) -> Result<pb::NodeStageVolumeResponse, Status> {
        if !self.settings.stage {
            return Err(Status::unimplemented(
                "NodeStageVolume is disabled (--enable-stage=false)",
            ));
        }
        let id = caps::id(&req.volume_id, "volume_id")?;
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
        let _guard = self.locks.lock(&[volume_key(id)]).await;
        let v = self.node_volume(id).await?;
        self.require_controller_published(&v)?;
        let record = v.staged.get(&staging);
        let read_only = caps::reader_only(&capability);
        match self.mount_at(&staging, id)? {
            MountAt::Volume(mount) => match record {
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
                    if self.adoptable(&staging, "staging_target_path", id, &mount, read_only)? {
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
        let created = ensure_dir(&staging, "staging_target_path")?;
        if let Err(e) = self.mounter.bind(&self.volume_dir(id), &staging, read_only) {
            return Err(bind_failed(&e, &staging, created));
        }
        let created = created || record.is_some_and(|s| s.created_dir);
        self.record_staging(id, &staging, capability, created)
            .await?;
        tracing::info!(volume_id = %id, path = %staging.display(), read_only, "staged");
        Ok(pb::NodeStageVolumeResponse {})
    }

    async fn record_staging(
        &self,
        id: &str,
        path: &Path,
        capability: crate::state::Capability,
        created_dir: bool,
    ) -> Result<(), Status> {
        self.store
            .update(|s| {
                if let Some(v) = s.volumes.get_mut(id) {
                    let staging = Staging {
                        capability,
                        created_dir,
                    };
                    v.staged.insert(path.to_path_buf(), staging);
                }
                Ok::<_, Status>(())
            })
            .await
    }

    async fn node_unstage_volume(
        &self,
        req: &pb::NodeUnstageVolumeRequest,
    ) -> Result<pb::NodeUnstageVolumeResponse, Status> {
        if !self.settings.stage {
            return Err(Status::unimplemented(
                "NodeUnstageVolume is disabled (--enable-stage=false)",
            ));
        }
        let id = caps::id(&req.volume_id, "volume_id")?;
        let staging = caps::mount_path(
            &req.staging_target_path,
            "staging_target_path",
            &self.settings.statedir,
        )?;
        let _guard = self.locks.lock(&[volume_key(id)]).await;
        // Unmount first: whatever the answer, the volume is not staged here afterwards (callers
        // take NOT_FOUND as "already unstaged", so it must be true). Without a record, nothing
        // says who made the directory: it stays.
        let free = self.unmount_volume_at(&staging, id)?;
        let v = self.node_volume(id).await?;
        let record = v.staged.get(&staging).cloned();
        if record.is_some() {
            self.store
                .update(|s| {
                    if let Some(v) = s.volumes.get_mut(id) {
                        v.staged.remove(&staging);
                    }
                    Ok::<_, Status>(())
                })
                .await?;
        }
        if free && record.is_some_and(|r| r.created_dir) {
            remove_empty_dir(&staging)?;
        }
        tracing::info!(volume_id = %id, path = %staging.display(), "unstaged");
        Ok(pb::NodeUnstageVolumeResponse {})
    }

    async fn node_publish_volume(
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
    fn check_other_targets(
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

    async fn record_publication(
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

    async fn node_unpublish_volume(
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

    /// The volume's mount at `field` = `path`, or `NOT_FOUND`.
    fn require_mounted(&self, id: &str, path: &Path, field: &str) -> Result<(), Status> {
        match self.mount_at(path, id)? {
            MountAt::Volume(_) => Ok(()),
            _ => Err(Status::not_found(format!(
                "volume {id} is not staged or published at {field} {}",
                path.display()
            ))),
        }
    }

    async fn node_get_volume_stats(
        &self,
        req: &pb::NodeGetVolumeStatsRequest,
    ) -> Result<pb::NodeGetVolumeStatsResponse, Status> {
        let id = caps::id(&req.volume_id, "volume_id")?;
        let path = caps::node_path(&req.volume_path, "volume_path")?;
        let v = self.node_volume(id).await?;
        self.require_mounted(id, &path, "volume_path")?;
        let condition = self.condition(id);
        let walk_path = path.clone();
        let (used, _) = blocking(move || files::tree_usage(&walk_path)).await?;
        let fs = blocking(move || berth_sys::fs_stats(&path)).await?;
        let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let used = clamp(used);
        let available = (v.capacity_bytes - used)
            .min(clamp(fs.available_bytes))
            .max(0);
        Ok(pb::NodeGetVolumeStatsResponse {
            usage: vec![
                pb::VolumeUsage {
                    available,
                    total: v.capacity_bytes,
                    used,
                    unit: Unit::Bytes as i32,
                },
                pb::VolumeUsage {
                    available: clamp(fs.available_inodes),
                    total: clamp(fs.total_inodes),
                    used: clamp(fs.total_inodes.saturating_sub(fs.free_inodes)),
                    unit: Unit::Inodes as i32,
                },
            ],
            volume_condition: Some(condition),
        })
    }

    async fn node_expand_volume(
        &self,
        req: &pb::NodeExpandVolumeRequest,
    ) -> Result<pb::NodeExpandVolumeResponse, Status> {
        let id = caps::id(&req.volume_id, "volume_id")?;
        let path = caps::node_path(&req.volume_path, "volume_path")?;
        if let Some(cap) = &req.volume_capability {
            caps::capability(cap, "volume_capability", Code::InvalidArgument)?;
        }
        let required = req.capacity_range.map_or(0, |r| r.required_bytes);
        if required < 0 || req.capacity_range.is_some_and(|r| r.limit_bytes < 0) {
            return Err(Status::invalid_argument(
                "capacity_range.required_bytes and limit_bytes must not be negative",
            ));
        }
        let _guard = self.locks.lock(&[volume_key(id)]).await;
        let v = self.node_volume(id).await?;
        self.require_mounted(id, &path, "volume_path")?;
        if required > v.capacity_bytes {
            return Err(Status::out_of_range(format!(
                "volume {id} has {} bytes, less than the {required} required; expand it with \
                 ControllerExpandVolume first",
                v.capacity_bytes
            )));
        }
        // A directory has no filesystem to grow: the new capacity is already in effect.
        Ok(pb::NodeExpandVolumeResponse {
            capacity_bytes: v.capacity_bytes,
        })
    }

    fn node_info(&self) -> pb::NodeGetInfoResponse {
        pb::NodeGetInfoResponse {
            node_id: self.settings.node_id.clone(),
            max_volumes_per_node: i64::from(self.settings.max_volumes_per_node),
            accessible_topology: Some(pb::Topology {
                segments: self.topology(),
            }),
        }
    }
}

csi_service!(NodeService: pb::node_server::Node {
    node_stage_volume(pb::NodeStageVolumeRequest)
        -> pb::NodeStageVolumeResponse = NodeStageVolume [volume_id]
        |p, req| p.node_stage_volume(&req).await;
    node_unstage_volume(pb::NodeUnstageVolumeRequest)
        -> pb::NodeUnstageVolumeResponse = NodeUnstageVolume [volume_id]
        |p, req| p.node_unstage_volume(&req).await;
    node_publish_volume(pb::NodePublishVolumeRequest)
        -> pb::NodePublishVolumeResponse = NodePublishVolume [volume_id]
        |p, req| p.node_publish_volume(&req).await;
    node_unpublish_volume(pb::NodeUnpublishVolumeRequest)
        -> pb::NodeUnpublishVolumeResponse = NodeUnpublishVolume [volume_id]
        |p, req| p.node_unpublish_volume(&req).await;
    node_get_volume_stats(pb::NodeGetVolumeStatsRequest)
        -> pb::NodeGetVolumeStatsResponse = NodeGetVolumeStats [volume_id]
        |p, req| p.node_get_volume_stats(&req).await;
    node_expand_volume(pb::NodeExpandVolumeRequest)
        -> pb::NodeExpandVolumeResponse = NodeExpandVolume [volume_id]
        |p, req| p.node_expand_volume(&req).await;
    node_get_capabilities(pb::NodeGetCapabilitiesRequest)
        -> pb::NodeGetCapabilitiesResponse = NodeGetCapabilities
        |p, _| Ok(pb::NodeGetCapabilitiesResponse {
            capabilities: node_capabilities(p.settings.stage),
        });
    node_get_info(pb::NodeGetInfoRequest)
        -> pb::NodeGetInfoResponse = NodeGetInfo
        |p, _| Ok(p.node_info());
});

#[cfg(test)]
mod tests {
    use berth_csi::pb::volume_capability::{
        AccessMode, AccessType, MountVolume, access_mode::Mode,
    };
    use berth_sys::{MountCall, Mounter as _, RecordingMounter};

    use super::*;
    use crate::plugin::test_plugin;

    fn cap(mode: Mode) -> pb::VolumeCapability {
        pb::VolumeCapability {
            access_mode: Some(AccessMode { mode: mode as i32 }),
            access_type: Some(AccessType::Mount(MountVolume::default())),
        }
    }

    #[tokio::test]
    async fn stage_publish_and_back_make_exactly_these_mount_calls() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mounter = Arc::new(RecordingMounter::new());
        let p = test_plugin(dir.path(), mounter.clone(), true, false);
        let created = p
            .create_volume(&pb::CreateVolumeRequest {
                name: "v".into(),
                volume_capabilities: vec![cap(Mode::SingleNodeWriter)],
                ..Default::default()
            })
            .await
            .expect("create");
        let id = created.volume.expect("volume").volume_id;
        let staging = dir.path().join("staging");
        let target = dir.path().join("target");
        let stage = pb::NodeStageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(cap(Mode::SingleNodeWriter)),
            ..Default::default()
        };
        let publish = pb::NodePublishVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(cap(Mode::SingleNodeWriter)),
            readonly: true,
            ..Default::default()
        };
        let unpublish = pb::NodeUnpublishVolumeRequest {
            volume_id: id.clone(),
            target_path: target.display().to_string(),
        };
        let unstage = pb::NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
        };
        for _ in 0..2 {
            p.node_stage_volume(&stage).await.expect("stage");
            p.node_publish_volume(&publish).await.expect("publish");
        }
        for _ in 0..2 {
            p.node_unpublish_volume(&unpublish)
                .await
                .expect("unpublish");
            p.node_unstage_volume(&unstage).await.expect("unstage");
        }
        assert_eq!(
            mounter.take_calls(),
            vec![
                MountCall::Bind {
                    source: p.volume_dir(&id),
                    target: staging.clone(),
                    read_only: false
                },
                MountCall::Bind {
                    source: staging.clone(),
                    target: target.clone(),
                    read_only: true
                },
                MountCall::Unmount {
                    target: target.clone()
                },
                MountCall::Unmount {
                    target: staging.clone()
                },
            ]
        );
        assert!(
            !staging.exists() && !target.exists(),
            "directories the plugin made are gone"
        );
    }

    async fn create(p: &Plugin, mode: Mode) -> String {
        p.create_volume(&pb::CreateVolumeRequest {
            name: "v".into(),
            volume_capabilities: vec![cap(mode)],
            ..Default::default()
        })
        .await
        .expect("create")
        .volume
        .expect("volume")
        .volume_id
    }

    #[tokio::test]
    async fn unstage_and_unpublish_unmount_before_saying_the_volume_does_not_exist() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mounter = Arc::new(RecordingMounter::new());
        let p = test_plugin(dir.path(), mounter.clone(), true, false);
        let id = create(&p, Mode::SingleNodeWriter).await;
        let staging = dir.path().join("staging");
        let target = dir.path().join("target");
        p.node_stage_volume(&pb::NodeStageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(cap(Mode::SingleNodeWriter)),
            ..Default::default()
        })
        .await
        .expect("stage");
        p.node_publish_volume(&pb::NodePublishVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(cap(Mode::SingleNodeWriter)),
            ..Default::default()
        })
        .await
        .expect("publish");
        // The volume's record is gone (lost state, or deleted behind the node's back) while
        // its mounts are still there.
        p.store
            .update(|s| {
                s.volumes.remove(&id);
                Ok::<_, Status>(())
            })
            .await
            .expect("forget the volume");
        mounter.take_calls();

        let unpublish = pb::NodeUnpublishVolumeRequest {
            volume_id: id.clone(),
            target_path: target.display().to_string(),
        };
        let unstage = pb::NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
        };
        for _ in 0..2 {
            let status = p.node_unpublish_volume(&unpublish).await.unwrap_err();
            assert_eq!(status.code(), Code::NotFound, "{}", status.message());
            let status = p.node_unstage_volume(&unstage).await.unwrap_err();
            assert_eq!(status.code(), Code::NotFound, "{}", status.message());
        }
        assert_eq!(
            mounter.take_calls(),
            vec![
                MountCall::Unmount {
                    target: target.clone()
                },
                MountCall::Unmount {
                    target: staging.clone()
                },
            ],
            "NOT_FOUND comes once nothing of the volume is mounted there"
        );
        assert_eq!(mounter.mount_at(&target).expect("table"), None);
        assert_eq!(mounter.mount_at(&staging).expect("table"), None);
    }

    #[tokio::test]
    async fn an_unrecorded_writable_mount_is_not_adopted_for_a_read_only_stage() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mounter = Arc::new(RecordingMounter::new());
        let p = test_plugin(dir.path(), mounter.clone(), true, false);
        let id = create(&p, Mode::MultiNodeReaderOnly).await;
        let staging = dir.path().join("staging");
        std::fs::create_dir(&staging).expect("mkdir");
        // What a bind whose read-only remount could not be undone leaves behind.
        mounter
            .bind(&p.volume_dir(&id), &staging, false)
            .expect("writable bind");
        mounter.take_calls();

        let stage = |mode| pb::NodeStageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(cap(mode)),
            ..Default::default()
        };
        p.node_stage_volume(&stage(Mode::MultiNodeReaderOnly))
            .await
            .expect("stage");
        assert_eq!(
            mounter.take_calls(),
            vec![
                MountCall::Unmount {
                    target: staging.clone()
                },
                MountCall::Bind {
                    source: p.volume_dir(&id),
                    target: staging.clone(),
                    read_only: true
                },
            ]
        );
        let top = mounter.mount_at(&staging).expect("table").expect("mounted");
        assert!(top.read_only, "{top:?}");
        assert_eq!(
            mounter.mounts().expect("table").len(),
            2,
            "root and staging"
        );

        // A writable unrecorded mount is adopted as it is for a writable stage.
        p.node_unstage_volume(&pb::NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
        })
        .await
        .expect("unstage");
        std::fs::create_dir_all(&staging).expect("mkdir");
        mounter
            .bind(&p.volume_dir(&id), &staging, false)
            .expect("writable bind");
        mounter.take_calls();
        p.node_stage_volume(&stage(Mode::SingleNodeWriter))
            .await
            .expect("stage");
        assert_eq!(mounter.take_calls(), vec![]);
    }

    #[tokio::test]
    async fn a_failed_bind_leaves_no_directory_and_no_record() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mounter = Arc::new(RecordingMounter::new());
        let p = test_plugin(dir.path(), mounter.clone(), true, false);
        let id = p
            .create_volume(&pb::CreateVolumeRequest {
                name: "v".into(),
                volume_capabilities: vec![cap(Mode::SingleNodeWriter)],
                ..Default::default()
            })
            .await
            .expect("create")
            .volume
            .expect("volume")
            .volume_id;
        let staging = dir.path().join("staging");
        mounter.fail_next(berth_sys::Errno::EPERM);
        let status = p
            .node_stage_volume(&pb::NodeStageVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: staging.display().to_string(),
                volume_capability: Some(cap(Mode::SingleNodeWriter)),
                ..Default::default()
            })
            .await
            .expect_err("bind fails");
        assert_eq!(status.code(), Code::Internal);
        assert!(
            status.message().contains("bind-mounting"),
            "{}",
            status.message()
        );
        assert!(!staging.exists());
        assert!(p.store.read(|s| s.volumes[&id].staged.is_empty()).await);
    }
}
