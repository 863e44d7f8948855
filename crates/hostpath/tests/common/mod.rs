//! Request builders and assertions shared by the integration tests.

#![allow(dead_code)]

use std::{collections::HashMap, path::Path};

use berth_csi::pb::{
    self,
    controller_client::ControllerClient,
    identity_client::IdentityClient,
    node_client::NodeClient,
    volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume, access_mode::Mode},
};
use berth_sys::MountEntry;
use berth_testkit::HostpathPlugin;
use tonic::{Code, Response, Status, transport::Channel};

pub const GIB: i64 = 1 << 30;
pub const MIB: i64 = 1 << 20;

/// The three raw CSI clients over one channel to the plugin's socket.
#[derive(Debug, Clone)]
pub struct Clients {
    pub identity: IdentityClient<Channel>,
    pub controller: ControllerClient<Channel>,
    pub node: NodeClient<Channel>,
}

pub async fn clients(plugin: &HostpathPlugin) -> Clients {
    let channel = plugin.channel();
    Clients {
        identity: IdentityClient::new(channel.clone()),
        controller: ControllerClient::new(channel.clone()),
        node: NodeClient::new(channel),
    }
}

/// The gRPC code of a call's result (`Code::Ok` on success).
pub fn code<T>(result: Result<Response<T>, Status>) -> Code {
    match result {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

/// Unwraps a call's result, with the status in the panic message.
#[track_caller]
pub fn ok<T>(result: Result<Response<T>, Status>) -> T {
    match result {
        Ok(r) => r.into_inner(),
        Err(s) => panic!("unexpected {:?}: {}", s.code(), s.message()),
    }
}

/// Asserts that a call failed with `expected`; returns its message.
#[track_caller]
pub fn fails<T: std::fmt::Debug>(result: Result<Response<T>, Status>, expected: Code) -> String {
    match result {
        Ok(r) => panic!("expected {expected:?}, got OK: {:?}", r.into_inner()),
        Err(s) => {
            assert_eq!(s.code(), expected, "message: {}", s.message());
            s.message().to_owned()
        }
    }
}

pub fn mount_cap(mode: Mode) -> pb::VolumeCapability {
    pb::VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

pub fn block_cap() -> pb::VolumeCapability {
    pb::VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    }
}

pub fn rw() -> pb::VolumeCapability {
    mount_cap(Mode::SingleNodeWriter)
}

pub fn create_req(name: &str) -> pb::CreateVolumeRequest {
    pb::CreateVolumeRequest {
        name: name.to_owned(),
        volume_capabilities: vec![rw()],
        ..Default::default()
    }
}

pub async fn create(c: &mut Clients, name: &str) -> pb::Volume {
    ok(c.controller.create_volume(create_req(name)).await)
        .volume
        .expect("CreateVolume returns a volume")
}

pub fn publish_req(id: &str, node: &str, readonly: bool) -> pb::ControllerPublishVolumeRequest {
    pb::ControllerPublishVolumeRequest {
        volume_id: id.to_owned(),
        node_id: node.to_owned(),
        volume_capability: Some(rw()),
        readonly,
        ..Default::default()
    }
}

pub fn unpublish_req(id: &str, node: &str) -> pb::ControllerUnpublishVolumeRequest {
    pb::ControllerUnpublishVolumeRequest {
        volume_id: id.to_owned(),
        node_id: node.to_owned(),
        ..Default::default()
    }
}

pub fn stage_req(id: &str, path: &Path, cap: pb::VolumeCapability) -> pb::NodeStageVolumeRequest {
    pb::NodeStageVolumeRequest {
        volume_id: id.to_owned(),
        staging_target_path: path.display().to_string(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

pub fn unstage_req(id: &str, path: &Path) -> pb::NodeUnstageVolumeRequest {
    pb::NodeUnstageVolumeRequest {
        volume_id: id.to_owned(),
        staging_target_path: path.display().to_string(),
    }
}

pub fn node_publish_req(
    id: &str,
    staging: Option<&Path>,
    target: &Path,
    cap: pb::VolumeCapability,
    readonly: bool,
) -> pb::NodePublishVolumeRequest {
    pb::NodePublishVolumeRequest {
        volume_id: id.to_owned(),
        staging_target_path: staging.map(|p| p.display().to_string()).unwrap_or_default(),
        target_path: target.display().to_string(),
        volume_capability: Some(cap),
        readonly,
        ..Default::default()
    }
}

/// Stages volume `id` at `staging` and publishes it at `target`, both read-write.
pub async fn stage_and_publish(c: &mut Clients, id: &str, staging: &Path, target: &Path) {
    ok(c.node.node_stage_volume(stage_req(id, staging, rw())).await);
    ok(c.node
        .node_publish_volume(node_publish_req(id, Some(staging), target, rw(), false))
        .await);
}

pub fn node_unpublish_req(id: &str, target: &Path) -> pb::NodeUnpublishVolumeRequest {
    pb::NodeUnpublishVolumeRequest {
        volume_id: id.to_owned(),
        target_path: target.display().to_string(),
    }
}

/// Whether `entry` is a bind mount of volume `id`'s directory.
pub fn is_volume_mount(entry: &MountEntry, id: &str) -> bool {
    entry.root.ends_with(Path::new("volumes").join(id))
}

/// The plugin's mounts at `path` (a stack, bottom first).
pub fn mounts_at(plugin: &HostpathPlugin, path: &Path) -> Vec<MountEntry> {
    plugin
        .mountinfo()
        .into_iter()
        .filter(|e| e.mount_point == path)
        .collect()
}

/// Asserts exactly one mount at `path`, of volume `id`, with the given read-only flag.
#[track_caller]
pub fn assert_mounted(plugin: &HostpathPlugin, path: &Path, id: &str, read_only: bool) {
    let at = mounts_at(plugin, path);
    assert_eq!(
        at.len(),
        1,
        "expected one mount at {}: {at:#?}",
        path.display()
    );
    assert!(is_volume_mount(&at[0], id), "not volume {id}: {:?}", at[0]);
    assert_eq!(at[0].read_only, read_only, "{:?}", at[0]);
}

#[track_caller]
pub fn assert_not_mounted(plugin: &HostpathPlugin, path: &Path) {
    let at = mounts_at(plugin, path);
    assert!(
        at.is_empty(),
        "expected no mount at {}: {at:#?}",
        path.display()
    );
}

/// This plugin's topology.
pub fn topology(node: &str) -> pb::Topology {
    pb::Topology {
        segments: HashMap::from([(berth_hostpath::TOPOLOGY_KEY.to_owned(), node.to_owned())]),
    }
}
