//! `--backing=image`: every volume is a sparse ext4 image file, mounted onto the staging path
//! through an autoclear loop device, as block drivers do. Needs e2fsprogs. Loop devices are
//! machine-wide: every test checks that none of its own is left attached (and the testkit
//! handle detaches leftovers on drop, when a test fails half-way).

mod common;

use std::{
    fs, io, os::unix::fs::MetadataExt as _, os::unix::fs::PermissionsExt as _, path::Path,
    process::Command, time::Duration,
};

use berth_csi::pb::{
    self, volume_capability::access_mode::Mode, volume_content_source, volume_usage::Unit,
};
use berth_testkit::{HostpathPlugin, SpawnError};
use common::*;
use tonic::Code;

/// Size of the test volumes.
const SIZE: i64 = 64 * MIB;

/// How long the kernel may take to free a loop device after its last unmount.
const DETACH: Duration = Duration::from_secs(10);

async fn image_plugin() -> HostpathPlugin {
    HostpathPlugin::builder()
        .backing("image")
        .attach(false)
        .log_level("trace")
        .spawn()
        .await
}

fn sized(name: &str, bytes: i64) -> pb::CreateVolumeRequest {
    pb::CreateVolumeRequest {
        capacity_range: Some(pb::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        ..create_req(name)
    }
}

async fn create_sized(c: &mut Clients, name: &str, bytes: i64) -> String {
    ok(c.controller.create_volume(sized(name, bytes)).await)
        .volume
        .expect("volume")
        .volume_id
}

fn with_flags(mut cap: pb::VolumeCapability, flags: &[&str]) -> pb::VolumeCapability {
    if let Some(pb::volume_capability::AccessType::Mount(m)) = &mut cap.access_type {
        m.mount_flags = flags.iter().map(|f| (*f).to_owned()).collect();
    }
    cap
}

fn with_fs_type(mut cap: pb::VolumeCapability, fs_type: &str) -> pb::VolumeCapability {
    if let Some(pb::volume_capability::AccessType::Mount(m)) = &mut cap.access_type {
        m.fs_type = fs_type.to_owned();
    }
    cap
}

fn image_of(plugin: &HostpathPlugin, id: &str) -> std::path::PathBuf {
    plugin.statedir().join("volumes").join(format!("{id}.img"))
}

/// Asserts that the filesystem of volume `id`'s image is mounted at `path` in the plugin.
#[track_caller]
fn assert_image_mounted(plugin: &HostpathPlugin, path: &Path, id: &str, read_only: bool) {
    let at = mounts_at(plugin, path);
    assert_eq!(at.len(), 1, "one mount at {}: {at:#?}", path.display());
    let mount = &at[0];
    assert_eq!(mount.fs_type, "ext4", "{mount:?}");
    assert_eq!(mount.read_only, read_only, "{mount:?}");
    let loops = plugin.attached_loops();
    assert!(
        loops
            .iter()
            .any(|(dev, file)| dev.as_os_str() == mount.source.as_str()
                && *file == image_of(plugin, id)),
        "{} comes from a loop device on the image: {mount:?}, {loops:?}",
        path.display()
    );
}

/// The size of the filesystem mounted at `path` in the plugin (what `df` reports).
fn df_size(plugin: &HostpathPlugin, path: &Path) -> u64 {
    let st = nix::sys::statvfs::statvfs(&plugin.in_ns(path)).expect("statvfs");
    st.blocks() * st.fragment_size()
}

/// Ends a test: stops the plugin and checks that no loop device is left on its files.
async fn finish(mut plugin: HostpathPlugin) {
    plugin.kill();
    let left = plugin.wait_loops_detached(DETACH).await;
    assert!(left.is_empty(), "loop devices left attached: {left:?}");
}

fn has_cap_sys_resource() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << 24) != 0)
}

#[tokio::test]
async fn stage_publish_write_unstage_and_restage_keep_the_data() {
    let mut plugin = image_plugin().await;
    let mut c = clients(&plugin).await;
    let id = create_sized(&mut c, "v", SIZE).await;
    let image = image_of(&plugin, &id);
    let meta = fs::metadata(&image).expect("image file");
    assert_eq!(
        meta.len(),
        SIZE as u64,
        "the image has the volume's capacity"
    );
    assert!(meta.blocks() * 512 < (SIZE as u64) / 4, "and is sparse");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);

    // The staging path is the CO's to create: never made, and missing fails as mount(2) would.
    let staging = plugin.tmp().join("staging");
    let msg = fails(
        c.node
            .node_stage_volume(stage_req(&id, &staging, rw()))
            .await,
        Code::FailedPrecondition,
    );
    assert!(
        msg.contains("staging_target_path") && msg.contains("does not exist"),
        "{msg}"
    );
    assert!(!staging.exists());
    assert!(plugin.attached_loops().is_empty());
    fs::create_dir(&staging).expect("mkdir");
    for _ in 0..2 {
        ok(c.node
            .node_stage_volume(stage_req(&id, &staging, rw()))
            .await);
        assert_image_mounted(&plugin, &staging, &id, false);
    }
    // One image is mounted from one place at a time.
    let other = plugin.tmp().join("other");
    fs::create_dir(&other).expect("mkdir");
    fails(
        c.node.node_stage_volume(stage_req(&id, &other, rw())).await,
        Code::FailedPrecondition,
    );
    assert_not_mounted(&plugin, &other);

    // Publish: binds of the staged filesystem, read-only when asked.
    let target = plugin.tmp().join("target");
    let target_ro = plugin.tmp().join("target-ro");
    ok(c.node
        .node_publish_volume(node_publish_req(&id, Some(&staging), &target, rw(), false))
        .await);
    ok(c.node
        .node_publish_volume(node_publish_req(
            &id,
            Some(&staging),
            &target_ro,
            rw(),
            true,
        ))
        .await);
    assert_image_mounted(&plugin, &target, &id, false);
    assert_image_mounted(&plugin, &target_ro, &id, true);
    fs::write(plugin.in_ns(&target).join("data"), b"written by a workload").expect("write");
    assert_eq!(
        fs::read(plugin.in_ns(&target_ro).join("data")).expect("read"),
        b"written by a workload"
    );
    let err = fs::write(plugin.in_ns(&target_ro).join("x"), b"x").expect_err("read-only");
    assert_eq!(err.kind(), io::ErrorKind::ReadOnlyFilesystem);
    assert!(
        !image.parent().expect("dir").join("data").exists(),
        "the data is inside the image"
    );

    let stats = ok(c
        .node
        .node_get_volume_stats(pb::NodeGetVolumeStatsRequest {
            volume_id: id.clone(),
            volume_path: target.display().to_string(),
            staging_target_path: staging.display().to_string(),
        })
        .await);
    let bytes = stats
        .usage
        .iter()
        .find(|u| u.unit == Unit::Bytes as i32)
        .expect("bytes");
    assert_eq!(bytes.total as u64, df_size(&plugin, &target), "{bytes:?}");
    assert!(bytes.total > SIZE / 2 && bytes.total <= SIZE, "{bytes:?}");
    assert!(
        bytes.used > 0 && bytes.used + bytes.available == bytes.total,
        "{bytes:?}"
    );

    for t in [&target, &target_ro] {
        ok(c.node
            .node_unpublish_volume(node_unpublish_req(&id, t))
            .await);
        assert_not_mounted(&plugin, t);
    }
    ok(c.node.node_unstage_volume(unstage_req(&id, &staging)).await);
    assert_not_mounted(&plugin, &staging);
    assert!(staging.is_dir(), "the CO's directory stays");
    let left = plugin.wait_loops_detached(DETACH).await;
    assert!(left.is_empty(), "unstaging frees the loop device: {left:?}");

    // Staged again, at another path: the data is there.
    ok(c.node.node_stage_volume(stage_req(&id, &other, rw())).await);
    assert_eq!(
        fs::read(plugin.in_ns(&other).join("data")).expect("read"),
        b"written by a workload"
    );
    // A plugin killed with the volume staged frees its loop device with its namespace, and
    // finds the data after a restart.
    plugin.restart().await;
    let left = plugin.wait_loops_detached(DETACH).await;
    assert!(left.is_empty(), "{left:?}");
    let mut c = clients(&plugin).await;
    ok(c.node
        .node_stage_volume(stage_req(&id, &staging, rw()))
        .await);
    assert_eq!(
        fs::read(plugin.in_ns(&staging).join("data")).expect("read"),
        b"written by a workload"
    );
    ok(c.node.node_unstage_volume(unstage_req(&id, &staging)).await);
    assert!(plugin.wait_loops_detached(DETACH).await.is_empty());

    ok(c.controller
        .delete_volume(pb::DeleteVolumeRequest {
            volume_id: id.clone(),
            ..Default::default()
        })
        .await);
    assert!(!image.exists(), "DeleteVolume removes the image");
    finish(plugin).await;
}

#[tokio::test]
async fn expansion_grows_the_filesystem() {
    let plugin = image_plugin().await;
    let mut c = clients(&plugin).await;
    let id = create_sized(&mut c, "v", SIZE).await;
    let staging = plugin.tmp().join("staging");
    fs::create_dir(&staging).expect("mkdir");
    ok(c.node
        .node_stage_volume(stage_req(&id, &staging, rw()))
        .await);
    let before = df_size(&plugin, &staging);
    assert!(before > (SIZE as u64) / 2, "{before}");

    let expanded = ok(c
        .controller
        .controller_expand_volume(pb::ControllerExpandVolumeRequest {
            volume_id: id.clone(),
            capacity_range: Some(pb::CapacityRange {
                required_bytes: 2 * SIZE,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await);
    assert_eq!(expanded.capacity_bytes, 2 * SIZE);
    assert!(expanded.node_expansion_required);
    assert_eq!(
        fs::metadata(image_of(&plugin, &id)).expect("image").len(),
        2 * SIZE as u64
    );
    assert_eq!(df_size(&plugin, &staging), before, "not grown yet");

    let node_expand = pb::NodeExpandVolumeRequest {
        volume_id: id.clone(),
        volume_path: staging.display().to_string(),
        staging_target_path: staging.display().to_string(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: 2 * SIZE,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    let grown = c.node.node_expand_volume(node_expand.clone()).await;
    if has_cap_sys_resource() {
        assert_eq!(ok(grown).capacity_bytes, 2 * SIZE);
        assert!(
            df_size(&plugin, &staging) > before + (SIZE as u64) / 2,
            "grown while mounted"
        );
    } else {
        // The kernel grows a mounted ext4 filesystem only for CAP_SYS_RESOURCE.
        let msg = fails(grown, Code::FailedPrecondition);
        assert!(msg.contains("CAP_SYS_RESOURCE"), "{msg}");
        assert_eq!(df_size(&plugin, &staging), before);
        // Staging grows it first.
        ok(c.node.node_unstage_volume(unstage_req(&id, &staging)).await);
        ok(c.node
            .node_stage_volume(stage_req(&id, &staging, rw()))
            .await);
        assert!(
            df_size(&plugin, &staging) > before + (SIZE as u64) / 2,
            "grown when staged again"
        );
    }
    // Grown already: nothing to do, in either case.
    assert_eq!(
        ok(c.node.node_expand_volume(node_expand).await).capacity_bytes,
        2 * SIZE
    );
    ok(c.node.node_unstage_volume(unstage_req(&id, &staging)).await);
    finish(plugin).await;
}

#[tokio::test]
async fn snapshots_and_clones_copy_the_image_and_its_data() {
    use volume_content_source::{SnapshotSource, Type, VolumeSource};
    let plugin = image_plugin().await;
    let mut c = clients(&plugin).await;
    let id = create_sized(&mut c, "source", SIZE).await;
    let staging = plugin.tmp().join("staging");
    fs::create_dir(&staging).expect("mkdir");
    ok(c.node
        .node_stage_volume(stage_req(&id, &staging, rw()))
        .await);
    let data = plugin.in_ns(&staging).join("data");
    fs::write(&data, b"original").expect("write");

    // Taken while the source is staged and just written to.
    let snap = ok(c
        .controller
        .create_snapshot(pb::CreateSnapshotRequest {
            source_volume_id: id.clone(),
            name: "snap".into(),
            ..Default::default()
        })
        .await)
    .snapshot
    .expect("snapshot");
    let snap_image = plugin
        .statedir()
        .join("snapshots")
        .join(format!("{}.img", snap.snapshot_id));
    let meta = fs::metadata(&snap_image).expect("snapshot image");
    assert_eq!(meta.len(), SIZE as u64);
    assert!(meta.blocks() * 512 < (SIZE as u64) / 4, "copied sparsely");
    fs::write(&data, b"changed").expect("write");

    let from = |name: &str, source: Type, bytes: i64| pb::CreateVolumeRequest {
        volume_content_source: Some(pb::VolumeContentSource {
            r#type: Some(source),
        }),
        ..sized(name, bytes)
    };
    let restored = ok(c
        .controller
        .create_volume(from(
            "restored",
            Type::Snapshot(SnapshotSource {
                snapshot_id: snap.snapshot_id.clone(),
            }),
            2 * SIZE,
        ))
        .await)
    .volume
    .expect("volume")
    .volume_id;
    let clone = ok(c
        .controller
        .create_volume(from(
            "clone",
            Type::Volume(VolumeSource {
                volume_id: id.clone(),
            }),
            SIZE,
        ))
        .await)
    .volume
    .expect("volume")
    .volume_id;
    ok(c.node.node_unstage_volume(unstage_req(&id, &staging)).await);

    for (volume, expected) in [(&restored, &b"original"[..]), (&clone, &b"changed"[..])] {
        ok(c.node
            .node_stage_volume(stage_req(volume, &staging, rw()))
            .await);
        assert_eq!(
            fs::read(plugin.in_ns(&staging).join("data")).expect("read"),
            expected
        );
        if volume == &restored {
            assert!(
                df_size(&plugin, &staging) > SIZE as u64,
                "the restored filesystem fills its bigger image"
            );
        }
        ok(c.node
            .node_unstage_volume(unstage_req(volume, &staging))
            .await);
    }

    ok(c.controller
        .delete_snapshot(pb::DeleteSnapshotRequest {
            snapshot_id: snap.snapshot_id.clone(),
            ..Default::default()
        })
        .await);
    assert!(!snap_image.exists());
    finish(plugin).await;
}

#[tokio::test]
async fn mount_flags_apply_and_never_show() {
    const SECRET: &str = "secret-flag-0453";
    let plugin = image_plugin().await;
    let mut c = clients(&plugin).await;
    let id = create_sized(&mut c, "v", SIZE).await;
    let staging = plugin.tmp().join("staging");
    fs::create_dir(&staging).expect("mkdir");
    let script = plugin.in_ns(&staging).join("run.sh");
    let stage = |flags: &[&str]| stage_req(&id, &staging, with_flags(rw(), flags));

    // Without flags, a program in the volume runs.
    ok(c.node.node_stage_volume(stage(&[])).await);
    fs::write(&script, b"#!/bin/sh\nexit 0\n").expect("write");
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).expect("chmod");
    assert!(Command::new(&script).status().expect("runs").success());
    ok(c.node.node_unstage_volume(unstage_req(&id, &staging)).await);

    // noexec: it cannot.
    ok(c.node.node_stage_volume(stage(&["noexec"])).await);
    let err = Command::new(&script).status().expect_err("noexec");
    assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
    ok(c.node.node_unstage_volume(unstage_req(&id, &staging)).await);

    // ro: nothing can be written.
    ok(c.node.node_stage_volume(stage(&["ro"])).await);
    let err = fs::write(plugin.in_ns(&staging).join("f"), b"x").expect_err("ro");
    assert_eq!(err.kind(), io::ErrorKind::ReadOnlyFilesystem);
    ok(c.node.node_unstage_volume(unstage_req(&id, &staging)).await);

    // A flag the filesystem refuses: the mount fails, and the flag is in no answer or log.
    let msg = fails(
        c.node
            .node_stage_volume(stage(&[&format!("{SECRET}=value-0454")]))
            .await,
        Code::Internal,
    );
    assert!(
        !msg.contains(SECRET) && !msg.contains("value-0454"),
        "{msg}"
    );
    assert!(msg.contains("mount"), "{msg}");
    assert_not_mounted(&plugin, &staging);
    assert!(plugin.wait_loops_detached(DETACH).await.is_empty());
    let logs = plugin.stderr_text();
    assert!(logs.contains("NodeStageVolume"), "trace logs:\n{logs}");
    assert!(
        !logs.contains(SECRET) && !logs.contains("value-0454"),
        "a mount flag leaked into the logs:\n{logs}"
    );
    let state = fs::read_to_string(plugin.statedir().join("state.json")).expect("state");
    assert!(
        !state.contains(SECRET) && !state.contains("noexec"),
        "{state}"
    );
    finish(plugin).await;
}

#[tokio::test]
async fn image_volumes_are_ext4_only() {
    let plugin = image_plugin().await;
    let mut c = clients(&plugin).await;
    let xfs = with_fs_type(rw(), "xfs");
    let msg = fails(
        c.controller
            .create_volume(pb::CreateVolumeRequest {
                volume_capabilities: vec![xfs.clone()],
                ..sized("x", SIZE)
            })
            .await,
        Code::InvalidArgument,
    );
    assert!(msg.contains("fs_type") && msg.contains("ext4"), "{msg}");
    let id = ok(c
        .controller
        .create_volume(pb::CreateVolumeRequest {
            volume_capabilities: vec![with_fs_type(rw(), "ext4")],
            ..sized("v", SIZE)
        })
        .await)
    .volume
    .expect("volume")
    .volume_id;
    let validated = ok(c
        .controller
        .validate_volume_capabilities(pb::ValidateVolumeCapabilitiesRequest {
            volume_id: id.clone(),
            volume_capabilities: vec![xfs.clone()],
            ..Default::default()
        })
        .await);
    assert!(validated.confirmed.is_none(), "{validated:?}");
    let staging = plugin.tmp().join("staging");
    fs::create_dir(&staging).expect("mkdir");
    fails(
        c.node
            .node_stage_volume(stage_req(&id, &staging, xfs))
            .await,
        Code::InvalidArgument,
    );
    assert_not_mounted(&plugin, &staging);
    let ext4 = with_fs_type(mount_cap(Mode::SingleNodeWriter), "ext4");
    ok(c.node
        .node_stage_volume(stage_req(&id, &staging, ext4))
        .await);
    assert_image_mounted(&plugin, &staging, &id, false);
    ok(c.node.node_unstage_volume(unstage_req(&id, &staging)).await);
    finish(plugin).await;
}

#[tokio::test]
async fn image_backing_needs_staging() {
    let refused = HostpathPlugin::builder()
        .backing("image")
        .stage(false)
        .try_spawn()
        .await
        .expect_err("image backing without staging");
    let SpawnError::Exited { status, stderr } = refused else {
        panic!("{refused}");
    };
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--backing") && stderr.contains("--enable-stage"),
        "{stderr}"
    );
}
