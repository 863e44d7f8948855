//! The CSI Node service: staging and publishing are bind mounts, decided from the real mount
//! table (so the plugin's view stays right across its own restarts).

use std::{
    fs, io,
    path::{Path, PathBuf},
    sync::Arc,
};

use berth_csi::pb::{
    self, NodeServiceCapability,
    node_service_capability::{self, rpc},
};
use berth_sys::MountError;
use tonic::Status;

use crate::{
    caps,
    error::internal,
    files,
    plugin::{MountAt, MountView, Plugin},
    state::VolumeRecord,
    strict,
};

mod expand;
mod publish;
mod stage;
mod stats;

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

/// `FAILED_PRECONDITION` unless `path` is an existing directory: for image backing, whose
/// filesystem is mounted onto it as mount(2) would, never creating it.
fn existing_dir(path: &Path, field: &str) -> Result<(), Status> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(Status::failed_precondition(format!(
            "{field} {} is not a directory: a volume's filesystem is mounted onto an existing \
             directory",
            path.display()
        ))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(Status::failed_precondition(format!(
            "{field} {} does not exist: a volume's filesystem is mounted onto an existing \
             directory, which the CO creates (this plugin does not, as mount(2) would not)",
            path.display()
        ))),
        Err(source) => Err(internal(&files::FsError {
            action: "inspecting",
            path: path.to_path_buf(),
            source,
        })),
    }
}

/// Removes the directory `path` if it is empty; leaves anything else alone. Whether nothing is
/// left at `path`.
fn remove_empty_dir(path: &Path) -> Result<bool, Status> {
    match fs::remove_dir(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(true),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::DirectoryNotEmpty | io::ErrorKind::NotADirectory
            ) =>
        {
            tracing::warn!(path = %path.display(), error = %e, "leaving a non-empty path in place");
            Ok(false)
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
    pub(super) async fn node_volume(&self, id: &str) -> Result<VolumeRecord, Status> {
        self.store
            .read(|s| s.volumes.get(id).cloned())
            .await?
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

    /// Whether the unrecorded mount of the view's volume at `field` = `path` may be adopted
    /// for a request that wants a mount with `read_only`. A writable mount where a read-only
    /// one is wanted (left, for one, by a bind whose read-only remount could not be undone) is
    /// never adopted: it is unmounted, and `false` tells the caller to mount afresh.
    fn adoptable(
        &self,
        view: &mut MountView<'_>,
        path: &Path,
        field: &str,
        read_only: bool,
    ) -> Result<bool, Status> {
        if !read_only {
            return Ok(true);
        }
        let id = view.id();
        if berth_sys::top_mount_at(view.table()?, path).is_some_and(|m| m.read_only) {
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
    /// What is at `path` is looked up afresh before each unmount.
    fn unmount_volume_at(&self, path: &Path, id: &str) -> Result<bool, Status> {
        let mut view = self.view(id);
        for _ in 0..MAX_STACKED_MOUNTS {
            view.forget_table();
            match view.at(path)? {
                MountAt::Nothing => return Ok(true),
                MountAt::Other(_) => return Ok(false),
                MountAt::Volume => {}
            }
            match self.mounter.unmount(path) {
                Ok(()) => tracing::debug!(path = %path.display(), "unmounted"),
                // Gone in the meantime: the next look says what is left.
                Err(e) if e.is_not_mounted() => {}
                Err(e) => return Err(internal(&e)),
            }
        }
        Err(Status::internal(format!(
            "more than {MAX_STACKED_MOUNTS} mounts of volume {id} are stacked at {}",
            path.display()
        )))
    }

    /// The answer to NodeUnstageVolume or NodeUnpublishVolume of volume `id` when it has no
    /// record: `NOT_FOUND`, which callers take as "already done", so it must be true: whatever
    /// of the volume is still mounted at `path` (the request's path, if valid; nothing is ever
    /// mounted at a path this plugin refuses) is unmounted first. Without a record nothing says
    /// who made the directory: it stays.
    /// Records the node still has of the volume (another copy deleted it, with `--shared`) go.
    async fn volume_gone(&self, id: &str, path: Result<PathBuf, Status>) -> Status {
        if let Ok(path) = path
            && let Err(status) = self.unmount_volume_at(&path, id)
        {
            return status;
        }
        if let Err(e) = self.node.forget(id).await {
            return e.into();
        }
        Status::not_found(format!("volume {id} does not exist"))
    }

    /// Strict mode, NodeGetVolumeStats and NodeExpandVolume: `staging_target_path` is given
    /// exactly when the plugin stages, and the volume is staged there (`FAILED_PRECONDITION`
    /// if not: the CO must stage before it asks).
    fn check_staging_hint(&self, id: &str, value: &str) -> Result<(), Status> {
        strict::staging_hint(value, self.settings.stage)?;
        if value.is_empty() {
            return Ok(());
        }
        let path = caps::node_path(value, "staging_target_path")?;
        match self.view(id).at(&path)? {
            MountAt::Volume => Ok(()),
            _ => Err(Status::failed_precondition(format!(
                "volume {id} is not staged at staging_target_path {}: the CO must stage it \
                 there first (refused in strict mode)",
                path.display()
            ))),
        }
    }

    /// The volume's mount at `field` = `path`, or `NOT_FOUND`.
    fn require_mounted(&self, id: &str, path: &Path, field: &str) -> Result<(), Status> {
        match self.view(id).at(path)? {
            MountAt::Volume => Ok(()),
            _ => Err(Status::not_found(format!(
                "volume {id} is not staged or published at {field} {}",
                path.display()
            ))),
        }
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
    use tonic::Code;

    use super::*;
    use crate::plugin::{image_test_plugin, strict_test_plugin, test_plugin};

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
                    source: p.volume_path(&id),
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
            .bind(&p.volume_path(&id), &staging, false)
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
                    source: p.volume_path(&id),
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
            .bind(&p.volume_path(&id), &staging, false)
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
        assert!(p.node.get(&id).await.staged.is_empty());
    }

    #[tokio::test]
    async fn strict_mode_creates_no_staging_dir_and_adopts_a_target_it_recorded_making() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mounter = Arc::new(RecordingMounter::new());
        let p = strict_test_plugin(dir.path(), mounter.clone(), true, false);
        let id = create(&p, Mode::SingleNodeWriter).await;
        let staging = dir.path().join("staging");
        let stage = pb::NodeStageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(cap(Mode::SingleNodeWriter)),
            ..Default::default()
        };
        let status = p.node_stage_volume(&stage).await.unwrap_err();
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert!(!staging.exists());
        assert_eq!(mounter.take_calls(), vec![], "no mount was tried");
        std::fs::create_dir(&staging).expect("the CO makes it");
        p.node_stage_volume(&stage).await.expect("stage");

        // A crash after the plugin made the target but before it recorded the publication
        // leaves the directory and the record that the plugin made it: a retry adopts it.
        let target = dir.path().join("target");
        std::fs::create_dir(&target).expect("mkdir");
        p.node
            .update(&id, true, |r| {
                r.created_targets.insert(target.clone());
                Ok::<_, Status>(())
            })
            .await
            .expect("record");
        let publish = pb::NodePublishVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(cap(Mode::SingleNodeWriter)),
            ..Default::default()
        };
        p.node_publish_volume(&publish).await.expect("publish");
        p.node_unpublish_volume(&pb::NodeUnpublishVolumeRequest {
            volume_id: id.clone(),
            target_path: target.display().to_string(),
        })
        .await
        .expect("unpublish");
        assert!(!target.exists(), "the plugin's own target goes");
        assert!(p.node.get(&id).await.created_targets.is_empty());
        p.node_unstage_volume(&pb::NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
        })
        .await
        .expect("unstage");
        assert!(staging.is_dir(), "the CO's staging directory stays");
    }

    #[tokio::test]
    async fn image_volumes_are_mounted_from_their_image_and_published_by_binds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mounter = Arc::new(RecordingMounter::new());
        let p = image_test_plugin(dir.path(), mounter.clone());
        let id = create(&p, Mode::SingleNodeWriter).await;
        let image = p.volume_path(&id);
        assert!(image.ends_with(format!("volumes/{id}.img")), "{image:?}");
        assert!(image.is_file());
        let staging = dir.path().join("staging");
        let target = dir.path().join("target");
        std::fs::create_dir(&staging).expect("the CO makes it");
        let mut capability = cap(Mode::SingleNodeWriter);
        if let Some(AccessType::Mount(m)) = &mut capability.access_type {
            m.mount_flags = vec!["noatime".to_owned()];
        }
        let stage = pb::NodeStageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(capability.clone()),
            ..Default::default()
        };
        let publish = pb::NodePublishVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(capability),
            readonly: true,
            ..Default::default()
        };
        for _ in 0..2 {
            p.node_stage_volume(&stage).await.expect("stage");
            p.node_publish_volume(&publish).await.expect("publish");
        }
        let at_target = mounter.mount_at(&target).expect("table").expect("mounted");
        assert!(p.is_volume_mount(&at_target, &id), "{at_target:?}");
        assert!(!p.is_volume_mount(&at_target, "vol-other"));
        p.node_unpublish_volume(&pb::NodeUnpublishVolumeRequest {
            volume_id: id.clone(),
            target_path: target.display().to_string(),
        })
        .await
        .expect("unpublish");
        p.node_unstage_volume(&pb::NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
        })
        .await
        .expect("unstage");
        assert_eq!(
            mounter.take_calls(),
            vec![
                MountCall::MountImage {
                    image: image.clone(),
                    target: staging.clone(),
                    fs_type: "ext4".to_owned(),
                    options: vec!["noatime".to_owned()],
                    read_only: false,
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
        assert!(staging.is_dir() && !target.exists());
        assert_eq!(
            mounter.loop_backing_file(&at_target.source).expect("loops"),
            None,
            "the loop device went with the last mount"
        );
    }
}
