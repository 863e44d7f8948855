//! The CSI Controller service: volumes and snapshots as directories, controller publication as
//! a record.

use std::{
    collections::HashMap,
    fs, io,
    path::{Path, PathBuf},
    sync::Arc,
};

use rand::Rng as _;

use berth_csi::pb::{
    self, ControllerServiceCapability,
    controller_service_capability::{self, rpc},
};
use tonic::Status;

use crate::{
    Backing, caps, files, image,
    plugin::{Plugin, blocking},
    state::{ContentSource, State, VolumeRecord},
};

mod create;
mod delete;
mod expand;
mod list;
mod publish;
mod snapshot;
mod validate;

/// Mode of a snapshot directory (never mounted).
const SNAPSHOT_DIR_MODE: u32 = 0o700;

/// Prefix of the pagination tokens of ListVolumes and ListSnapshots.
const TOKEN_PREFIX: &str = "after:";

#[derive(Debug, Clone)]
pub(crate) struct ControllerService(pub Arc<Plugin>);

/// The controller capabilities this plugin advertises.
pub(crate) fn controller_capabilities(attach: bool) -> Vec<ControllerServiceCapability> {
    let mut types = vec![rpc::Type::CreateDeleteVolume];
    if attach {
        types.push(rpc::Type::PublishUnpublishVolume);
    }
    types.extend([
        rpc::Type::ListVolumes,
        rpc::Type::GetCapacity,
        rpc::Type::CreateDeleteSnapshot,
        rpc::Type::ListSnapshots,
        rpc::Type::CloneVolume,
        rpc::Type::ExpandVolume,
        rpc::Type::ListVolumesPublishedNodes,
        rpc::Type::GetVolume,
        rpc::Type::SingleNodeMultiWriter,
    ]);
    types
        .into_iter()
        .map(|t| ControllerServiceCapability {
            r#type: Some(controller_service_capability::Type::Rpc(
                controller_service_capability::Rpc { r#type: t as i32 },
            )),
        })
        .collect()
}

/// A fresh random id: `<prefix>-<16 hex digits>`, not one `taken` says is in use. Never derived
/// from the name, so a volume deleted and created again under the same name gets a new id, and
/// a late DeleteVolume of the old id cannot touch the new volume.
fn new_id(prefix: &str, taken: impl Fn(&str) -> bool) -> String {
    let mut rng = rand::rng();
    loop {
        let id = format!("{prefix}-{:016x}", rng.random::<u64>());
        if !taken(&id) {
            return id;
        }
    }
}

/// The key after which a page starts; `ABORTED` for a token this plugin did not issue.
fn parse_token(token: &str) -> Result<Option<&str>, Status> {
    if token.is_empty() {
        return Ok(None);
    }
    match token.strip_prefix(TOKEN_PREFIX) {
        Some(key) if !key.is_empty() => Ok(Some(key)),
        _ => Err(Status::aborted(format!(
            "invalid starting_token {token:?}; start again without a token"
        ))),
    }
}

/// One page of `items` (in key order, after `after`), and the token of the next page.
fn page<'a, T: 'a>(
    items: impl Iterator<Item = (&'a String, T)>,
    after: Option<&str>,
    max_entries: i32,
) -> (Vec<T>, String) {
    let mut items = items
        .filter(|(k, _)| after.is_none_or(|a| k.as_str() > a))
        .peekable();
    let limit = usize::try_from(max_entries)
        .ok()
        .filter(|&m| m > 0)
        .unwrap_or(usize::MAX);
    let mut out = Vec::new();
    let mut last = None;
    while out.len() < limit {
        let Some((k, v)) = items.next() else { break };
        last = Some(k);
        out.push(v);
    }
    let next = match (items.peek(), last) {
        (Some(_), Some(k)) => format!("{TOKEN_PREFIX}{k}"),
        _ => String::new(),
    };
    (out, next)
}

/// Removes `dir/<name>`, made by a create whose record could not be written. A failure is only
/// logged: the caller reports the error that made the create fail, and the directory or image,
/// which no record points at, is replaced if the id is ever drawn again.
async fn discard_tree(dir: &Path, name: String) {
    let dir = dir.to_path_buf();
    if let Err(status) = blocking(move || files::delete_tree(&dir, &name)).await {
        tracing::warn!(
            error = status.message(),
            "could not remove an unrecorded volume or snapshot"
        );
    }
}

fn allocated(state: &State) -> i64 {
    state.volumes.values().map(|v| v.capacity_bytes).sum()
}

impl Plugin {
    /// Volume `v` as CSI shows it, accessible from `topologies` (see
    /// [`volume_topologies`](Plugin::volume_topologies)).
    fn volume_pb(&self, v: &VolumeRecord, topologies: &[HashMap<String, String>]) -> pb::Volume {
        pb::Volume {
            capacity_bytes: v.capacity_bytes,
            volume_id: v.id.clone(),
            volume_context: Default::default(),
            content_source: v.source.as_ref().map(ContentSource::to_pb),
            accessible_topology: Self::topologies_pb(topologies),
        }
    }

    pub(crate) fn condition(&self, id: &str) -> pb::VolumeCondition {
        let path = self.volume_path(id);
        let (present, what) = match self.settings.backing {
            Backing::Dir => (path.is_dir(), "volume directory"),
            Backing::Image => (path.is_file(), "volume image"),
        };
        if present {
            pb::VolumeCondition {
                abnormal: false,
                message: format!("{what} is present"),
            }
        } else {
            pb::VolumeCondition {
                abnormal: true,
                message: format!("{what} {} is missing", path.display()),
            }
        }
    }

    /// Makes volume or snapshot `id` in `dir` (its directory, or its image of `capacity` bytes),
    /// with the content of `source` (a volume's or snapshot's path), all or nothing. An image
    /// source that is mounted is flushed first, so the copy has what was written to it.
    async fn make_entry(
        &self,
        dir: &Path,
        id: &str,
        source: Option<(&str, PathBuf)>,
        capacity: i64,
        dir_mode: u32,
    ) -> Result<(), Status> {
        let (dir, name) = (dir.to_path_buf(), self.entry_name(id));
        if let Some((source_id, _)) = &source {
            self.flush_volume(source_id).await?;
        }
        let source = source.map(|(_, path)| path);
        match self.settings.backing {
            Backing::Dir => {
                blocking(move || files::create_tree(&dir, &name, source.as_deref(), dir_mode)).await
            }
            Backing::Image => {
                let capacity = u64::try_from(capacity).unwrap_or(0);
                blocking(move || image::create(&dir, &name, source.as_deref(), capacity)).await
            }
        }
    }

    /// Image backing: writes out what the mounted filesystem of volume `id` (if it is one, and
    /// mounted) holds in memory, to its image (syncfs through one of its mounts). A copy made
    /// while it is being written to is crash-consistent at best.
    async fn flush_volume(&self, id: &str) -> Result<(), Status> {
        if self.settings.backing != Backing::Image {
            return Ok(());
        }
        let Some(mount) = self.volume_mounts(id)?.into_iter().next() else {
            return Ok(());
        };
        let point = mount.mount_point;
        blocking(move || {
            fs::File::open(&point)
                .and_then(|f| nix::unistd::syncfs(&f).map_err(io::Error::from))
                .map_err(files::at("syncing the filesystem at", &point))
        })
        .await
    }

    async fn volume(&self, id: &str) -> Result<VolumeRecord, Status> {
        self.store
            .read(|s| s.volumes.get(id).cloned())
            .await?
            .ok_or_else(|| Status::not_found(format!("volume {id} does not exist")))
    }

    /// Fails with `RESOURCE_EXHAUSTED` if `extra` more bytes would exceed `--capacity`.
    fn check_pool(&self, state: &State, extra: i64) -> Result<(), Status> {
        let Some(total) = self.settings.capacity else {
            return Ok(());
        };
        let total = i64::try_from(total).unwrap_or(i64::MAX);
        let used = allocated(state);
        if used.saturating_add(extra) > total {
            return Err(Status::resource_exhausted(format!(
                "not enough capacity: {used} of {total} bytes are allocated, {extra} more requested"
            )));
        }
        Ok(())
    }

    pub(super) async fn controller_get_volume(
        &self,
        req: &pb::ControllerGetVolumeRequest,
    ) -> Result<pb::ControllerGetVolumeResponse, Status> {
        let id = caps::id(&req.volume_id, "volume_id")?;
        let (v, topologies) = self
            .store
            .read(|s| (s.volumes.get(id).cloned(), self.volume_topologies(s)))
            .await?;
        let v = v.ok_or_else(|| Status::not_found(format!("volume {id} does not exist")))?;
        Ok(pb::ControllerGetVolumeResponse {
            volume: Some(self.volume_pb(&v, &topologies)),
            status: Some(pb::controller_get_volume_response::VolumeStatus {
                published_node_ids: v.published_nodes.keys().cloned().collect(),
                volume_condition: Some(self.condition(id)),
            }),
        })
    }
}

csi_service!(ControllerService: pb::controller_server::Controller {
    create_volume(pb::CreateVolumeRequest)
        -> pb::CreateVolumeResponse = CreateVolume
        |p, req| p.create_volume(&req).await;
    delete_volume(pb::DeleteVolumeRequest)
        -> pb::DeleteVolumeResponse = DeleteVolume [volume_id]
        |p, req| p.delete_volume(&req).await;
    controller_publish_volume(pb::ControllerPublishVolumeRequest)
        -> pb::ControllerPublishVolumeResponse = ControllerPublishVolume [volume_id]
        |p, req| p.controller_publish_volume(&req).await;
    controller_unpublish_volume(pb::ControllerUnpublishVolumeRequest)
        -> pb::ControllerUnpublishVolumeResponse = ControllerUnpublishVolume [volume_id]
        |p, req| p.controller_unpublish_volume(&req).await;
    validate_volume_capabilities(pb::ValidateVolumeCapabilitiesRequest)
        -> pb::ValidateVolumeCapabilitiesResponse = ValidateVolumeCapabilities [volume_id]
        |p, req| p.validate_volume_capabilities(&req).await;
    list_volumes(pb::ListVolumesRequest)
        -> pb::ListVolumesResponse = ListVolumes
        |p, req| p.list_volumes(&req).await;
    get_capacity(pb::GetCapacityRequest)
        -> pb::GetCapacityResponse = GetCapacity
        |p, req| p.get_capacity(&req).await;
    controller_get_capabilities(pb::ControllerGetCapabilitiesRequest)
        -> pb::ControllerGetCapabilitiesResponse = ControllerGetCapabilities
        |p, _| Ok(pb::ControllerGetCapabilitiesResponse {
            capabilities: controller_capabilities(p.settings.attach),
        });
    create_snapshot(pb::CreateSnapshotRequest)
        -> pb::CreateSnapshotResponse = CreateSnapshot [source_volume_id]
        |p, req| p.create_snapshot(&req).await;
    delete_snapshot(pb::DeleteSnapshotRequest)
        -> pb::DeleteSnapshotResponse = DeleteSnapshot
        |p, req| p.delete_snapshot(&req).await;
    list_snapshots(pb::ListSnapshotsRequest)
        -> pb::ListSnapshotsResponse = ListSnapshots [source_volume_id]
        |p, req| p.list_snapshots(&req).await;
    get_snapshot(pb::GetSnapshotRequest)
        -> pb::GetSnapshotResponse = GetSnapshot
        |_, _| Err(Status::unimplemented(
            "GetSnapshot is not supported (no GET_SNAPSHOT)",
        ));
    controller_expand_volume(pb::ControllerExpandVolumeRequest)
        -> pb::ControllerExpandVolumeResponse = ControllerExpandVolume [volume_id]
        |p, req| p.controller_expand_volume(&req).await;
    controller_get_volume(pb::ControllerGetVolumeRequest)
        -> pb::ControllerGetVolumeResponse = ControllerGetVolume [volume_id]
        |p, req| p.controller_get_volume(&req).await;
    controller_modify_volume(pb::ControllerModifyVolumeRequest)
        -> pb::ControllerModifyVolumeResponse = ControllerModifyVolume [volume_id]
        |_, _| Err(Status::unimplemented(
            "ControllerModifyVolume is not supported (no MODIFY_VOLUME)",
        ));
});

#[cfg(test)]
mod tests {
    use berth_sys::RecordingMounter;

    use tonic::Code;

    use super::*;
    use crate::plugin::test_plugin;

    #[test]
    fn ids_are_random_and_avoid_taken_ones() {
        let a = new_id("vol", |_| false);
        assert!(a.starts_with("vol-") && a.len() == 20, "{a}");
        assert!(a[4..].bytes().all(|b| b.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, new_id("vol", |_| false));
        let tries = std::cell::Cell::new(0);
        let b = new_id("snap", |_| {
            tries.set(tries.get() + 1);
            tries.get() < 3
        });
        assert!(b.starts_with("snap-"), "{b}");
        assert_eq!(tries.get(), 3, "drew again until an id was free");
    }

    fn cap() -> pb::VolumeCapability {
        use pb::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
        pb::VolumeCapability {
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(AccessType::Mount(MountVolume::default())),
        }
    }

    async fn create(p: &Plugin, name: &str) -> Result<String, Status> {
        let created = p
            .create_volume(&pb::CreateVolumeRequest {
                name: name.into(),
                volume_capabilities: vec![cap()],
                ..Default::default()
            })
            .await?;
        Ok(created.volume.expect("volume").volume_id)
    }

    async fn delete(p: &Plugin, id: &str) {
        p.delete_volume(&pb::DeleteVolumeRequest {
            volume_id: id.into(),
            ..Default::default()
        })
        .await
        .expect("delete");
    }

    /// Makes every later state write fail: the state file becomes a non-empty directory, which
    /// nothing can be renamed over.
    fn break_state_file(p: &Plugin) {
        let path = p.settings.statedir.join("state.json");
        std::fs::remove_file(&path).expect("remove state.json");
        std::fs::create_dir_all(path.join("in-the-way")).expect("mkdir");
    }

    fn entries(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect()
    }

    #[tokio::test]
    async fn a_late_delete_of_an_old_id_spares_the_volume_created_again_under_its_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = test_plugin(dir.path(), Arc::new(RecordingMounter::new()), true, false);
        let old = create(&p, "pvc-1").await.expect("create");
        assert_eq!(create(&p, "pvc-1").await.expect("again"), old, "idempotent");
        delete(&p, &old).await;

        let new = create(&p, "pvc-1").await.expect("create again");
        assert_ne!(new, old, "a new volume gets a new id");
        // A retried DeleteVolume of the old volume arrives late.
        delete(&p, &old).await;
        assert!(
            p.store
                .read(|s| s.volumes.contains_key(&new))
                .await
                .expect("read")
        );
        assert!(
            p.volume_path(&new).is_dir(),
            "the new volume's directory is kept"
        );
    }

    #[tokio::test]
    async fn creates_whose_record_cannot_be_saved_leave_no_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = test_plugin(dir.path(), Arc::new(RecordingMounter::new()), true, false);
        let source = create(&p, "source").await.expect("create");
        break_state_file(&p);

        let status = p
            .create_snapshot(&pb::CreateSnapshotRequest {
                source_volume_id: source.clone(),
                name: "snap".into(),
                ..Default::default()
            })
            .await
            .expect_err("the record cannot be saved");
        assert_eq!(status.code(), Code::Internal, "{}", status.message());
        assert_eq!(entries(&p.snapshots_dir), Vec::<String>::new());
        assert!(
            p.store
                .read(|s| s.snapshots.is_empty())
                .await
                .expect("read")
        );

        let status = create(&p, "other").await.expect_err("not saved either");
        assert_eq!(status.code(), Code::Internal, "{}", status.message());
        assert_eq!(entries(&p.volumes_dir), [source]);
    }

    #[tokio::test]
    async fn shared_copies_publish_to_every_recorded_node_and_to_no_other() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mounter = || Arc::new(RecordingMounter::new());
        let a = crate::plugin::shared_test_plugin(dir.path(), "node-a", mounter()).await;
        let b = crate::plugin::shared_test_plugin(dir.path(), "node-b", mounter()).await;
        let id = create(&a, "shared").await.expect("create through a");

        // Every copy sees the volume, accessible from both nodes.
        let got = b
            .controller_get_volume(&pb::ControllerGetVolumeRequest {
                volume_id: id.clone(),
            })
            .await
            .expect("get through b");
        let mut nodes: Vec<String> = got
            .volume
            .expect("volume")
            .accessible_topology
            .iter()
            .map(|t| t.segments[crate::TOPOLOGY_KEY].clone())
            .collect();
        nodes.sort();
        assert_eq!(nodes, ["node-a", "node-b"]);

        let publish = |node: &str| pb::ControllerPublishVolumeRequest {
            volume_id: id.clone(),
            node_id: node.into(),
            volume_capability: Some(cap()),
            ..Default::default()
        };
        let context = a
            .controller_publish_volume(&publish("node-b"))
            .await
            .expect("publish to b through a");
        assert_eq!(
            context.publish_context[crate::PUBLISH_CONTEXT_NODE_KEY],
            "node-b"
        );
        let status = a
            .controller_publish_volume(&publish("node-c"))
            .await
            .expect_err("unknown node");
        assert_eq!(status.code(), Code::NotFound, "{}", status.message());
        assert!(
            status.message().contains("node-c") && status.message().contains("node-a, node-b"),
            "{}",
            status.message()
        );
        // b's record is what a wrote; a refuses to delete it while published.
        assert!(
            b.store
                .read(|s| s.volumes[&id].published_nodes.contains_key("node-b"))
                .await
                .expect("read")
        );
        let status = b
            .delete_volume(&pb::DeleteVolumeRequest {
                volume_id: id.clone(),
                ..Default::default()
            })
            .await
            .expect_err("published");
        assert_eq!(status.code(), Code::FailedPrecondition);

        // A requisite topology of either node is satisfied; of another, not.
        let topo = |node: &str| pb::TopologyRequirement {
            requisite: vec![pb::Topology {
                segments: crate::plugin::node_topology(node),
            }],
            preferred: Vec::new(),
        };
        for (node, ok) in [("node-b", true), ("node-z", false)] {
            let result = a
                .create_volume(&pb::CreateVolumeRequest {
                    name: format!("on-{node}"),
                    volume_capabilities: vec![cap()],
                    accessibility_requirements: Some(topo(node)),
                    ..Default::default()
                })
                .await;
            assert_eq!(result.is_ok(), ok, "{node}: {result:?}");
        }

        b.controller_unpublish_volume(&pb::ControllerUnpublishVolumeRequest {
            volume_id: id.clone(),
            node_id: "node-b".into(),
            ..Default::default()
        })
        .await
        .expect("unpublish through b");
        // An unknown node has nothing published: done.
        a.controller_unpublish_volume(&pb::ControllerUnpublishVolumeRequest {
            volume_id: id.clone(),
            node_id: "node-c".into(),
            ..Default::default()
        })
        .await
        .expect("unpublish from an unknown node");
        delete(&a, &id).await;
        assert!(
            !b.store
                .read(|s| s.volumes.contains_key(&id))
                .await
                .expect("read")
        );
    }

    #[tokio::test]
    async fn without_shared_only_the_own_node_is_known() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = test_plugin(dir.path(), Arc::new(RecordingMounter::new()), true, true);
        let id = create(&p, "v").await.expect("create");
        let status = p
            .controller_publish_volume(&pb::ControllerPublishVolumeRequest {
                volume_id: id,
                node_id: "node-2".into(),
                volume_capability: Some(cap()),
                ..Default::default()
            })
            .await
            .expect_err("another node");
        assert_eq!(status.code(), Code::NotFound);
        assert!(
            status.message().contains("serves node node-1"),
            "{}",
            status.message()
        );
    }

    #[test]
    fn pages_and_tokens() {
        let keys: Vec<String> = (1..=5).map(|i| format!("k{i}")).collect();
        let items = || keys.iter().map(|k| (k, k.clone()));
        let (first, token) = page(items(), None, 2);
        assert_eq!(first, ["k1", "k2"]);
        assert_eq!(token, "after:k2");
        let after = parse_token(&token).expect("valid");
        let (second, token) = page(items(), after, 3);
        assert_eq!(second, ["k3", "k4", "k5"]);
        assert_eq!(token, "");
        let (all, token) = page(items(), None, 0);
        assert_eq!((all.len(), token.as_str()), (5, ""));
        assert_eq!(parse_token("garbage").unwrap_err().code(), Code::Aborted);
        assert_eq!(parse_token("after:").unwrap_err().code(), Code::Aborted);
        assert_eq!(parse_token("").ok(), Some(None));
    }
}
