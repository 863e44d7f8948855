//! A volume's whole life, driven through berth's typed client against the real berth-hostpath
//! process over its real unix socket. Every mount lives in the plugin's private mount namespace
//! and is checked in its mountinfo; every step is repeated once and must change nothing.

use std::{
    io::{ErrorKind, Write as _},
    path::Path,
};

use berth_csi::{
    CapacityRange, ControllerPublish, CreateVolume, CsiClient, Endpoint, NodePublish, NodeStage,
    model::{AccessMode, MountOptions, Secrets, VolumeCapability},
};
use berth_testkit::HostpathPlugin;

fn client(plugin: &HostpathPlugin) -> CsiClient {
    CsiClient::new(Endpoint::parse(&plugin.endpoint()).expect("endpoint"))
}

/// How many mounts sit exactly at `path` in the plugin's namespace.
fn mounts_at(plugin: &HostpathPlugin, path: &Path) -> usize {
    plugin
        .mountinfo()
        .iter()
        .filter(|m| m.mount_point == path)
        .count()
}

fn write_file(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    f.write_all(data)?;
    f.sync_all()
}

#[tokio::test]
async fn volume_lifecycle_with_real_mounts_and_idempotent_steps() {
    let plugin = HostpathPlugin::builder().spawn().await;
    let c = client(&plugin);
    let cap = VolumeCapability::mount(AccessMode::SingleNodeWriter, MountOptions::default());
    let create = CreateVolume {
        name: "lifecycle".into(),
        capacity: CapacityRange {
            required_bytes: 1 << 20,
            limit_bytes: 0,
        },
        capabilities: vec![cap.clone()],
        ..Default::default()
    };

    // create, twice: same volume
    let vol = c.create_volume(&create).await.expect("create");
    let again = c.create_volume(&create).await.expect("create again");
    assert_eq!(vol, again);
    let id = vol.external_id.clone();
    let vol_dir = plugin.statedir().join("volumes").join(id.as_str());
    assert!(vol_dir.is_dir(), "volume dir {}", vol_dir.display());
    assert_eq!(c.list_volumes(0, "").await.expect("list").entries.len(), 1);

    // controller publish, twice: same context
    let node_id = c.node_info().await.expect("node info").node_id;
    let publish = ControllerPublish {
        external_id: id.clone(),
        node_id: node_id.clone(),
        capability: cap.clone(),
        read_only: false,
        volume_context: vol.context.clone(),
        secrets: Secrets::default(),
    };
    let ctx = c
        .controller_publish(&publish)
        .await
        .expect("controller publish");
    assert_eq!(c.controller_publish(&publish).await.expect("again"), ctx);

    // stage, twice: one bind mount of the volume dir
    let staging = plugin.tmp().join("staging");
    let stage = NodeStage {
        external_id: id.clone(),
        staging_path: staging.clone(),
        capability: cap.clone(),
        publish_context: ctx.clone(),
        volume_context: vol.context.clone(),
        secrets: Secrets::default(),
    };
    c.node_stage(&stage).await.expect("stage");
    let m = plugin.mount_at(&staging).expect("staging is a mount");
    assert!(
        m.root.ends_with(id.as_str()),
        "staged the volume dir, got root {}",
        m.root.display()
    );
    assert!(!m.read_only);
    c.node_stage(&stage).await.expect("stage again");
    assert_eq!(
        mounts_at(&plugin, &staging),
        1,
        "a repeated stage must not mount twice"
    );

    // publish read-write, twice
    let target = plugin.tmp().join("target");
    let publish_rw = NodePublish {
        external_id: id.clone(),
        staging_path: Some(staging.clone()),
        target_path: target.clone(),
        capability: cap.clone(),
        read_only: false,
        publish_context: ctx.clone(),
        volume_context: vol.context.clone(),
        secrets: Secrets::default(),
    };
    c.node_publish(&publish_rw).await.expect("publish");
    c.node_publish(&publish_rw).await.expect("publish again");
    assert_eq!(
        mounts_at(&plugin, &target),
        1,
        "a repeated publish must not mount twice"
    );
    assert!(!plugin.mount_at(&target).expect("target mount").read_only);

    // data written through the target shows in the volume
    write_file(
        &plugin.in_ns(target.join("hello.txt")),
        b"through the target",
    )
    .expect("write");
    assert_eq!(
        std::fs::read(vol_dir.join("hello.txt")).expect("read back"),
        b"through the target"
    );
    // ...and nothing was written to the host's view of the target path
    assert!(
        !target.join("hello.txt").exists(),
        "the mount must stay in the plugin's namespace"
    );

    // a read-only publish refuses writes
    let target_ro = plugin.tmp().join("target-ro");
    let publish_ro = NodePublish {
        target_path: target_ro.clone(),
        read_only: true,
        ..publish_rw.clone()
    };
    c.node_publish(&publish_ro).await.expect("publish ro");
    assert!(plugin.mount_at(&target_ro).expect("ro mount").read_only);
    assert_eq!(
        std::fs::read(plugin.in_ns(target_ro.join("hello.txt"))).expect("readable"),
        b"through the target"
    );
    let err = write_file(&plugin.in_ns(target_ro.join("nope.txt")), b"x").expect_err("read-only");
    assert_eq!(err.kind(), ErrorKind::ReadOnlyFilesystem, "{err}");

    // unpublish both, twice
    for t in [&target_ro, &target] {
        c.node_unpublish(&id, t).await.expect("unpublish");
        assert_eq!(mounts_at(&plugin, t), 0);
        c.node_unpublish(&id, t).await.expect("unpublish again");
    }

    // unstage, twice
    c.node_unstage(&id, &staging).await.expect("unstage");
    assert_eq!(mounts_at(&plugin, &staging), 0);
    c.node_unstage(&id, &staging).await.expect("unstage again");

    // controller unpublish, twice
    c.controller_unpublish(&id, &node_id, &Secrets::default())
        .await
        .expect("controller unpublish");
    c.controller_unpublish(&id, &node_id, &Secrets::default())
        .await
        .expect("again");

    // delete, twice
    c.delete_volume(&id, &Secrets::default())
        .await
        .expect("delete");
    c.delete_volume(&id, &Secrets::default())
        .await
        .expect("delete again");
    assert!(!vol_dir.exists(), "volume dir removed");
    assert!(
        c.list_volumes(0, "")
            .await
            .expect("list")
            .entries
            .is_empty()
    );
    assert!(
        plugin
            .mountinfo()
            .iter()
            .all(|m| !m.mount_point.starts_with(plugin.tmp())),
        "no mount left under the test dir"
    );
}

#[tokio::test]
async fn publish_without_staging_when_the_plugin_does_not_stage() {
    let plugin = HostpathPlugin::builder()
        .stage(false)
        .attach(false)
        .spawn()
        .await;
    let c = client(&plugin);
    let caps = c.node_capabilities().await.expect("node caps");
    assert!(!caps.has(berth_csi::model::NodeCapability::StageUnstageVolume));
    let cap = VolumeCapability::mount(AccessMode::SingleNodeMultiWriter, MountOptions::default());
    let vol = c
        .create_volume(&CreateVolume {
            name: "nostage".into(),
            capabilities: vec![cap.clone()],
            ..Default::default()
        })
        .await
        .expect("create");
    let target = plugin.tmp().join("target");
    let publish = NodePublish {
        external_id: vol.external_id.clone(),
        staging_path: None,
        target_path: target.clone(),
        capability: cap,
        read_only: false,
        publish_context: Default::default(),
        volume_context: vol.context.clone(),
        secrets: Secrets::default(),
    };
    c.node_publish(&publish).await.expect("publish");
    let m = plugin.mount_at(&target).expect("published");
    assert!(m.root.ends_with(vol.external_id.as_str()));
    c.node_unpublish(&vol.external_id, &target)
        .await
        .expect("unpublish");
    assert!(plugin.mount_at(&target).is_none());
}
