//! The CO's side of the CSI contract, end to end: a real agent drives a berth-hostpath that is
//! strict about what the spec puts on the CO and that stages as block drivers do (each volume
//! an ext4 image, mounted straight onto the staging path through a loop device). The plugin
//! never makes the staging directory or a target's parent: berth does (kubelet's 0750), and
//! removes them when it is done, so claim → stage → publish → release only works if berth
//! keeps its side.

mod agent_support;

use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    time::Duration,
};

use agent_support::AgentProcess;
use berth_api::{
    Client,
    volumes::{ClaimRequest, ReleaseRequest, SpecFormat, VolumeSpecRequest},
};
use berth_csi::model::{AccessMode, AttachmentMode};

const PLUGIN: &str = "blk";

fn claim_req(alloc: &str, read_only: bool) -> ClaimRequest {
    ClaimRequest {
        alloc_id: alloc.into(),
        read_only,
        access_mode: AccessMode::SingleNodeMultiWriter,
        attachment_mode: AttachmentMode::FileSystem,
        mount_options: None,
    }
}

async fn release(client: &Client, alloc: &str) {
    let r = client
        .release_volume(
            "disk",
            &ReleaseRequest {
                alloc_id: alloc.into(),
            },
        )
        .await
        .expect("release");
    assert!(r.released, "{r:?}");
}

fn mode(agent: &AgentProcess, path: &Path) -> u32 {
    let path = agent.namespace().in_ns(path);
    std::fs::metadata(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

fn exists(agent: &AgentProcess, path: &Path) -> bool {
    agent.namespace().in_ns(path).exists()
}

#[tokio::test]
async fn a_strict_block_style_plugin_stages_publishes_and_releases_through_the_agent() {
    let agent = AgentProcess::start_with_hostpath(
        PLUGIN,
        &["--backing", "image", "--enable-stage", "--enable-attach"],
    )
    .await;
    let client = agent.client();
    client
        .create_volume(&VolumeSpecRequest {
            spec: format!(
                "id = \"disk\"\nname = \"disk\"\ntype = \"csi\"\nplugin_id = \"{PLUGIN}\"\n\
                 capacity_min = \"16MiB\"\n\
                 capability {{\n  access_mode = \"single-node-multi-writer\"\n  \
                 attachment_mode = \"file-system\"\n}}\n\
                 mount_options {{\n  mount_flags = [\"noexec\"]\n}}\n"
            ),
            format: SpecFormat::Hcl,
            file: None,
        })
        .await
        .expect("create");
    let w = client
        .claim_volume("disk", &claim_req("writer", false))
        .await
        .expect("claim writer");
    let r = client
        .claim_volume("disk", &claim_req("reader", true))
        .await
        .expect("claim reader");
    let ns = agent.namespace();

    // One staging per volume: a real ext4 filesystem on a loop device, with the volume's
    // mount flag applied, at the directory berth made with kubelet's mode.
    let root = agent.data_dir.join("csi/monolith").join(PLUGIN);
    let staging: Vec<_> = ns
        .mountinfo()
        .expect("mountinfo")
        .into_iter()
        .filter(|m| m.mount_point.starts_with(root.join("staging")))
        .collect();
    assert_eq!(staging.len(), 1, "{staging:?}");
    let staging_dir: PathBuf = staging[0].mount_point.clone();
    assert_eq!(staging[0].fs_type, "ext4");
    assert!(
        staging[0].source.starts_with("/dev/loop"),
        "{:?}",
        staging[0]
    );
    // (The staging directory itself now shows the mounted filesystem's root.)
    assert_eq!(mode(&agent, staging_dir.parent().unwrap()), 0o750);
    for t in [&w.target, &r.target] {
        assert_eq!(mode(&agent, t.parent().unwrap()), 0o750, "{}", t.display());
        assert!(ns.mount_at(t).is_some());
    }
    std::fs::write(ns.in_ns(&w.target).join("hello.txt"), "from the writer").expect("write");
    assert_eq!(
        std::fs::read_to_string(ns.in_ns(&r.target).join("hello.txt")).expect("read"),
        "from the writer"
    );
    assert!(
        std::fs::write(ns.in_ns(&r.target).join("nope"), "x").is_err(),
        "the reader's target is read-only"
    );

    // Release in CSI order: the staging and every directory berth made go with the last user.
    let alloc_dir = |a: &str| root.join("per-alloc").join(a);
    release(&client, "writer").await;
    assert!(
        !exists(&agent, &alloc_dir("writer")),
        "writer's directories left"
    );
    assert!(
        ns.mount_at(&staging_dir).is_some(),
        "the reader still uses the staging"
    );
    release(&client, "reader").await;
    assert!(!exists(&agent, &alloc_dir("reader")));
    assert!(!exists(&agent, &staging_dir), "staging dir left");
    assert!(!exists(&agent, staging_dir.parent().unwrap()));
    let hp = agent.tmp.path().join("hp");
    berth_testkit::assert_eventually!(Duration::from_secs(10), || async {
        berth_testkit::attached_loops_under(&[&hp]).is_empty()
    });

    // The data lives in the volume's image: a new claim sees it.
    let again = client
        .claim_volume("disk", &claim_req("again", false))
        .await
        .expect("claim again");
    assert_eq!(
        std::fs::read_to_string(ns.in_ns(&again.target).join("hello.txt")).expect("read"),
        "from the writer"
    );
    release(&client, "again").await;
    client.delete_volume("disk").await.expect("delete");
}
