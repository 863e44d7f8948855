//! `volume status` tells the truth at once: right after a restart (before the node plugin is
//! back) it lists what the node holds, as the mount table shows it, and it never waits behind
//! a plugin call in flight. A real agent and berth-hostpath in a mount namespace that outlives
//! the agent.

mod agent_support;

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    time::Duration,
};

use agent_support::AgentProcess;
use berth_api::{
    Client,
    volumes::{ClaimRequest, SpecFormat, VolumeSpecRequest, VolumeStatus},
};
use berth_csi::model::{AccessMode, AttachmentMode};

const PLUGIN: &str = "hp";

async fn start() -> AgentProcess {
    AgentProcess::start_with_hostpath(PLUGIN, &[]).await
}

async fn create(client: &Client, id: &str) {
    client
        .create_volume(&VolumeSpecRequest {
            spec: format!(
                r#"
id        = "{id}"
name      = "{id}"
type      = "csi"
plugin_id = "{PLUGIN}"
capacity_min = "1MiB"
capability {{
  access_mode     = "single-node-multi-writer"
  attachment_mode = "file-system"
}}
"#
            ),
            format: SpecFormat::Hcl,
            file: None,
        })
        .await
        .expect("create");
}

fn claim_req(alloc: &str) -> ClaimRequest {
    ClaimRequest {
        alloc_id: alloc.into(),
        read_only: false,
        access_mode: AccessMode::SingleNodeMultiWriter,
        attachment_mode: AttachmentMode::FileSystem,
        mount_options: None,
    }
}

/// The publish targets status lists as published.
fn published(status: &VolumeStatus) -> BTreeSet<PathBuf> {
    status
        .usages
        .iter()
        .flat_map(|u| &u.allocs)
        .filter(|a| a.state == "published")
        .map(|a| a.target.clone())
        .collect()
}

/// The publish targets mounted in the agent's namespace.
fn mounted_targets(agent: &AgentProcess) -> BTreeSet<PathBuf> {
    let per_alloc: &Path = &agent
        .data_dir
        .join("csi/monolith")
        .join(PLUGIN)
        .join("per-alloc");
    agent
        .namespace()
        .mountinfo()
        .expect("mountinfo")
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(per_alloc))
        .collect()
}

fn faults(agent: &AgentProcess, spec: &str) {
    std::fs::write(agent.tmp.path().join("hp/faults"), spec).expect("faults file");
}

#[tokio::test]
async fn status_right_after_a_restart_equals_the_mount_table() {
    let mut agent = start().await;
    let client = agent.client();
    create(&client, "six").await;
    for i in 0..6 {
        client
            .claim_volume("six", &claim_req(&format!("a{i}")))
            .await
            .expect("claim");
    }
    let before = mounted_targets(&agent);
    assert_eq!(before.len(), 6);
    assert_eq!(
        published(&client.volume("six").await.expect("status")),
        before
    );

    // The plugin will not come back healthy until told: the node side cannot be recovered,
    // and status must still answer from what the node holds.
    faults(&agent, "NodeGetInfo:hang\n");
    agent.kill9();
    agent.respawn();
    agent.wait_ready().await;
    let client = agent.client();
    let status = client.volume("six").await.expect("status after restart");
    assert_eq!(status.claims.len(), 6);
    assert_eq!(published(&status), mounted_targets(&agent));
    assert_eq!(published(&status), before);

    faults(&agent, "");
    agent
        .wait_plugin(PLUGIN, Duration::from_secs(30), |p| p.health.healthy)
        .await;
    let status = client.volume("six").await.expect("status");
    assert_eq!(published(&status), mounted_targets(&agent));
    assert_eq!(published(&status), before);
}

#[tokio::test]
async fn status_answers_within_a_second_while_a_publish_hangs() {
    let agent = start().await;
    let client = agent.client();
    create(&client, "slow").await;
    client
        .claim_volume("slow", &claim_req("first"))
        .await
        .expect("claim");
    faults(&agent, "NodePublishVolume:hang:1\n");
    let claimer = {
        let client = agent.client();
        tokio::spawn(async move { client.claim_volume("slow", &claim_req("second")).await })
    };
    // The second claim's publish is under way (persisted as publishing) and hangs.
    berth_testkit::assert_eventually!(Duration::from_secs(10), || async {
        client.volume("slow").await.is_ok_and(|s| {
            s.usages
                .iter()
                .flat_map(|u| &u.allocs)
                .any(|a| a.alloc_id == "second" && a.state == "publishing")
        })
    });
    for _ in 0..3 {
        let status = tokio::time::timeout(Duration::from_secs(1), client.volume("slow"))
            .await
            .expect("status answers within a second")
            .expect("status");
        let first = status
            .usages
            .iter()
            .flat_map(|u| &u.allocs)
            .find(|a| a.alloc_id == "first")
            .expect("first alloc");
        assert_eq!(first.state, "published");
    }
    claimer.abort();
}
