//! `--shared`: copies of `berth-hostpath`, one per node, each in its own mount namespace, share
//! one state directory. A volume created through one copy is published to another copy's node
//! and staged and published there; copies never serve one node twice, and never mix with a copy
//! without `--shared`.

mod common;

use std::{collections::HashMap, fs, path::Path, process::Command};

use berth_csi::pb;
use berth_hostpath::statelock::EXIT_STATEDIR_IN_USE;
use berth_testkit::{HostpathPlugin, HostpathPluginBuilder, SpawnError, bin_path};
use common::*;
use tonic::Code;

/// A copy with `--shared` serving `node`, on `statedir` (or a fresh one of its own).
fn shared(node: &str, statedir: Option<&Path>) -> HostpathPluginBuilder {
    let builder = HostpathPlugin::builder().nodeid(node).arg("--shared");
    match statedir {
        Some(dir) => builder.statedir(dir),
        None => builder,
    }
}

/// The exit status and stderr of a copy that must not start.
async fn refused(builder: HostpathPluginBuilder) -> (Option<i32>, String) {
    match builder.try_spawn().await {
        Ok(plugin) => panic!("the copy started (pid {})", plugin.pid()),
        Err(SpawnError::Exited { status, stderr }) => (status.code(), stderr),
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn a_volume_created_through_one_copy_is_published_and_mounted_through_another() {
    let a = shared("node-a", None).spawn().await;
    let statedir = a.statedir().to_path_buf();
    // b checks what the CO owes, including the controller's publish context.
    let b = shared("node-b", Some(&statedir)).strict(true).spawn().await;
    let (mut ca, mut cb) = (clients(&a).await, clients(&b).await);

    let info = ok(cb.node.node_get_info(pb::NodeGetInfoRequest {}).await);
    assert_eq!(info.node_id, "node-b");
    assert_eq!(info.accessible_topology, Some(topology("node-b")));

    let volume = create(&mut ca, "shared-vol").await;
    let id = volume.volume_id.clone();
    let mut nodes: Vec<pb::Topology> = volume.accessible_topology;
    nodes.sort_by_key(|t| t.segments.values().cloned().collect::<Vec<_>>());
    assert_eq!(nodes, [topology("node-a"), topology("node-b")]);

    // b sees the volume a created, and that it is not published to b yet.
    let listed = ok(cb
        .controller
        .list_volumes(pb::ListVolumesRequest::default())
        .await);
    assert_eq!(listed.entries.len(), 1);
    let staging = b.tmp().join("staging");
    fs::create_dir(&staging).expect("the CO makes the staging directory");
    let no_context = stage_req(&id, &staging, rw());
    let msg = fails(
        cb.node.node_stage_volume(no_context).await,
        Code::FailedPrecondition,
    );
    assert!(msg.contains("not controller-published"), "{msg}");

    // Published to b through a.
    let published = ok(ca
        .controller
        .controller_publish_volume(publish_req(&id, "node-b", false))
        .await);
    let context: HashMap<String, String> = published.publish_context;
    assert_eq!(
        context.get(berth_hostpath::PUBLISH_CONTEXT_NODE_KEY),
        Some(&"node-b".to_owned())
    );
    let listed = ok(cb
        .controller
        .list_volumes(pb::ListVolumesRequest::default())
        .await);
    let status = listed.entries[0].status.clone().expect("status");
    assert_eq!(status.published_node_ids, ["node-b"]);

    // Staged and published on b, in b's mount namespace only.
    let mut stage = stage_req(&id, &staging, rw());
    stage.publish_context = context.clone();
    ok(cb.node.node_stage_volume(stage).await);
    let target = b.tmp().join("target");
    let mut publish = node_publish_req(&id, Some(&staging), &target, rw(), false);
    publish.publish_context = context;
    ok(cb.node.node_publish_volume(publish).await);
    assert_mounted(&b, &staging, &id, false);
    assert_mounted(&b, &target, &id, false);
    assert_not_mounted(&a, &staging);
    assert_not_mounted(&a, &target);

    // What b's workload writes is in the one volume directory both copies serve.
    fs::write(b.in_ns(target.join("hello")), b"from node-b").expect("write through b");
    assert_eq!(
        fs::read(statedir.join("volumes").join(&id).join("hello")).expect("read"),
        b"from node-b"
    );

    // Unknown nodes are NOT_FOUND, through either copy.
    for c in [&mut ca, &mut cb] {
        let msg = fails(
            c.controller
                .controller_publish_volume(publish_req(&id, "node-c", false))
                .await,
            Code::NotFound,
        );
        assert!(msg.contains("node-c"), "{msg}");
    }
    // a will not delete what b has published.
    let delete = pb::DeleteVolumeRequest {
        volume_id: id.clone(),
        ..Default::default()
    };
    fails(
        ca.controller.delete_volume(delete.clone()).await,
        Code::FailedPrecondition,
    );

    // Torn down in CSI order, across the copies.
    ok(cb
        .node
        .node_unpublish_volume(node_unpublish_req(&id, &target))
        .await);
    ok(cb
        .node
        .node_unstage_volume(unstage_req(&id, &staging))
        .await);
    assert_not_mounted(&b, &target);
    assert_not_mounted(&b, &staging);
    ok(ca
        .controller
        .controller_unpublish_volume(unpublish_req(&id, "node-b"))
        .await);
    ok(ca.controller.delete_volume(delete).await);
    let listed = ok(cb
        .controller
        .list_volumes(pb::ListVolumesRequest::default())
        .await);
    assert!(listed.entries.is_empty(), "{listed:?}");
}

#[tokio::test]
async fn each_copy_has_its_own_fault_switch() {
    let a = shared("node-a", None).spawn().await;
    let b = shared("node-b", Some(a.statedir())).spawn().await;
    let node_b_dir = a.statedir().join("nodes/node-b");
    assert!(node_b_dir.is_dir());
    berth_sys::write_atomic(&node_b_dir.join("faults"), b"NodeGetInfo:UNAVAILABLE\n")
        .expect("write b's control file");
    let (mut ca, mut cb) = (clients(&a).await, clients(&b).await);
    let msg = fails(
        cb.node.node_get_info(pb::NodeGetInfoRequest {}).await,
        Code::Unavailable,
    );
    assert!(msg.contains("injected"), "{msg}");
    ok(ca.node.node_get_info(pb::NodeGetInfoRequest {}).await);
}

#[tokio::test]
async fn one_copy_per_node_and_no_copy_without_shared_alongside() {
    let a = shared("node-a", None).spawn().await;
    let statedir = a.statedir().to_path_buf();
    let lock = statedir.join("lock.node-a");
    assert_eq!(
        fs::read_to_string(&lock).expect("node lock"),
        format!("{}\n", a.pid())
    );

    // A second copy for node-a.
    let (code, stderr) = refused(shared("node-a", Some(&statedir))).await;
    assert_eq!(code, Some(i32::from(EXIT_STATEDIR_IN_USE)), "{stderr}");
    assert!(
        stderr.contains("node-a")
            && stderr.contains(&format!("pid {}", a.pid()))
            && stderr.contains("--nodeid"),
        "names the node and its holder: {stderr}"
    );

    // A copy without --shared, even with another node id.
    let (code, stderr) = refused(
        HostpathPlugin::builder()
            .nodeid("node-x")
            .statedir(&statedir),
    )
    .await;
    assert_eq!(code, Some(i32::from(EXIT_STATEDIR_IN_USE)), "{stderr}");
    assert!(stderr.contains("--shared"), "{stderr}");

    // The running copy is unaffected, and its node is still its own.
    let mut c = clients(&a).await;
    ok(c.identity.probe(pb::ProbeRequest {}).await);
    assert_eq!(
        fs::read_to_string(&lock).expect("node lock"),
        format!("{}\n", a.pid())
    );
}

#[tokio::test]
async fn no_shared_copy_alongside_a_copy_without_shared() {
    let alone = HostpathPlugin::builder().spawn().await;
    let statedir = alone.statedir().to_path_buf();
    let state_before = fs::read(statedir.join("state.json")).ok();
    let (code, stderr) = refused(shared("node-a", Some(&statedir))).await;
    assert_eq!(code, Some(i32::from(EXIT_STATEDIR_IN_USE)), "{stderr}");
    assert!(
        stderr.contains("without --shared") && stderr.contains(&format!("pid {}", alone.pid())),
        "{stderr}"
    );
    assert_eq!(fs::read(statedir.join("state.json")).ok(), state_before);
    assert_eq!(
        fs::read_to_string(statedir.join("lock")).expect("lock"),
        format!("{}\n", alone.pid()),
        "the holder's pid stays"
    );
}

#[test]
fn shared_needs_a_usable_node_id_and_directory_volumes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let statedir = dir.path().join("statedir");
    let run = |extra: &[&str]| {
        let out = Command::new(bin_path("berth-hostpath"))
            .arg(format!(
                "--endpoint=unix://{}",
                dir.path().join("csi.sock").display()
            ))
            .arg("--statedir")
            .arg(&statedir)
            .args(extra)
            .output()
            .expect("run berth-hostpath");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };

    let (code, stderr) = run(&["--shared"]);
    assert_eq!(code, Some(2), "a usage error: {stderr}");
    assert!(stderr.contains("--nodeid"), "{stderr}");

    for bad in ["a/b", "..", "."] {
        let (code, stderr) = run(&["--shared", "--nodeid", bad]);
        assert_eq!(code, Some(1), "{bad}: {stderr}");
        assert!(stderr.contains("--nodeid"), "{bad}: {stderr}");
    }
    let (code, stderr) = run(&["--shared", "--nodeid", "n1", "--backing=image"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("--backing"), "{stderr}");
    assert!(!statedir.exists(), "nothing was touched");
    assert!(!dir.path().join("csi.sock").exists());
}
