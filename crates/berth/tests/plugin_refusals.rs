//! A plugin's refusal that the caller must fix (the CSI spec's recovery column) is answered at
//! once, as a 4xx that names the plugin, the call and the plugin's reason: no retry loop, no
//! "agent failed" 500, nothing left behind. Real agent, real berth-hostpath; faults are
//! injected through the plugin's control file, and the plugin's call log counts the attempts.

mod agent_support;

use std::{path::PathBuf, time::Duration};

use agent_support::AgentProcess;
use berth_api::{
    Client, ClientError,
    volumes::{ClaimRequest, ReleaseRequest, SnapshotCreateRequest, SpecFormat, VolumeSpecRequest},
};
use berth_csi::model::{AccessMode, AttachmentMode};
use berth_hostpath::calllog;

const PLUGIN: &str = "hp";
const SIZE: &str = r#"capacity_min = "1MiB""#;

/// berth-hostpath staging and attaching, at most one volume published per node.
async fn start() -> AgentProcess {
    AgentProcess::start_with_hostpath(
        PLUGIN,
        &[
            "--max-volumes-per-node",
            "1",
            "--call-log",
            "@TMP@/calls.log",
        ],
    )
    .await
}

fn spec(id: &str, extra: &str) -> VolumeSpecRequest {
    VolumeSpecRequest {
        spec: format!(
            r#"
id        = "{id}"
name      = "{id}"
type      = "csi"
plugin_id = "{PLUGIN}"
capability {{
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}}
{extra}
"#
        ),
        format: SpecFormat::Hcl,
        file: Some(format!("{id}.hcl")),
    }
}

/// How many times the plugin answered `rpc`.
fn attempts(agent: &AgentProcess, rpc: &str) -> usize {
    calllog::read(agent.tmp.path().join("calls.log"))
        .unwrap_or_default()
        .iter()
        .filter(|c| c.rpc == rpc)
        .count()
}

/// Makes the plugin fail the next call of `rpc` with `code` (its control file is read on every
/// call; a new file starts its counts afresh).
fn inject(agent: &AgentProcess, rpc: &str, code: &str) -> PathBuf {
    let file = agent.tmp.path().join("hp/faults");
    std::fs::write(&file, format!("{rpc}:{code}:1\n")).expect("faults file");
    file
}

fn refused(err: ClientError, status: u16, rpc: &str, reason: &str) {
    let text = err.to_string();
    assert_eq!(err.status(), Some(status), "{text}");
    assert!(
        text.contains(&format!("plugin \"{PLUGIN}\" refused {rpc}")),
        "names the plugin and the call: {text}"
    );
    assert!(text.contains(reason), "gives the plugin's reason: {text}");
}

async fn volume_ids(client: &Client) -> Vec<String> {
    client
        .volumes()
        .await
        .expect("volumes")
        .volumes
        .into_iter()
        .map(|v| v.id)
        .collect()
}

#[tokio::test]
async fn create_in_a_topology_no_node_satisfies_fails_at_once_with_the_plugins_reason() {
    let agent = start().await;
    let client = agent.client();
    let err = client
        .create_volume(&spec(
            "far",
            r#"capacity_min = "1MiB"
topology_request {
  required {
    topology { segments = { "hostpath.csi.berth.dev/node" = "elsewhere" } }
  }
}"#,
        ))
        .await
        .expect_err("no node is there");
    refused(
        err,
        422,
        "CreateVolume",
        "no requisite topology includes this node",
    );
    assert_eq!(attempts(&agent, "CreateVolume"), 1, "not retried");
    assert!(volume_ids(&client).await.is_empty(), "nothing created");
    let log = agent.log();
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains("CreateVolume") && l.contains("far")),
        "the failed RPC is logged at warn with the volume"
    );
}

#[tokio::test]
async fn every_caller_must_fix_code_from_create_volume_fails_fast_as_a_4xx() {
    let agent = start().await;
    let client = agent.client();
    for (i, (code, status)) in [
        ("INVALID_ARGUMENT", 400),
        ("OUT_OF_RANGE", 400),
        ("ALREADY_EXISTS", 409),
        ("FAILED_PRECONDITION", 409),
        ("NOT_FOUND", 422),
        ("RESOURCE_EXHAUSTED", 422),
        ("UNIMPLEMENTED", 422),
    ]
    .into_iter()
    .enumerate()
    {
        inject(&agent, "CreateVolume", code);
        let before = attempts(&agent, "CreateVolume");
        let err = client
            .create_volume(&spec(&format!("v{i}"), SIZE))
            .await
            .expect_err(code);
        refused(err, status, "CreateVolume", code);
        assert_eq!(
            attempts(&agent, "CreateVolume"),
            before + 1,
            "{code}: one attempt"
        );
    }
    assert!(volume_ids(&client).await.is_empty(), "nothing created");
}

#[tokio::test]
async fn register_of_an_unknown_external_id_is_a_4xx_naming_the_plugin() {
    let agent = start().await;
    let client = agent.client();
    let err = client
        .register_volume(&spec("ghost", r#"external_id = "no-such-volume""#))
        .await
        .expect_err("unknown external id");
    refused(err, 422, "ValidateVolumeCapabilities", "NOT_FOUND");
    assert!(volume_ids(&client).await.is_empty(), "nothing registered");
}

#[tokio::test]
async fn refused_snapshot_and_controller_publish_fail_fast_and_leave_no_claim() {
    let agent = start().await;
    let client = agent.client();
    client
        .create_volume(&spec("a", SIZE))
        .await
        .expect("create a");
    client
        .create_volume(&spec("b", SIZE))
        .await
        .expect("create b");

    inject(&agent, "CreateSnapshot", "INVALID_ARGUMENT");
    let err = client
        .create_snapshot(
            "a",
            &SnapshotCreateRequest {
                name: "nightly".into(),
                ..Default::default()
            },
        )
        .await
        .expect_err("refused name");
    refused(err, 400, "CreateSnapshot", "INVALID_ARGUMENT");
    assert_eq!(attempts(&agent, "CreateSnapshot"), 1);

    let claim = |alloc: &str| ClaimRequest {
        alloc_id: alloc.into(),
        read_only: false,
        access_mode: AccessMode::SingleNodeWriter,
        attachment_mode: AttachmentMode::FileSystem,
        mount_options: None,
    };
    client
        .claim_volume("a", &claim("a1"))
        .await
        .expect("claim a");
    // The plugin takes one volume per node: the second ControllerPublishVolume is refused
    // with RESOURCE_EXHAUSTED, which the caller must act on (release a volume) first.
    let before = attempts(&agent, "ControllerPublishVolume");
    let err = client
        .claim_volume("b", &claim("b1"))
        .await
        .expect_err("node is full");
    refused(err, 422, "ControllerPublishVolume", "RESOURCE_EXHAUSTED");
    assert_eq!(attempts(&agent, "ControllerPublishVolume"), before + 1);
    berth_testkit::assert_eventually!(Duration::from_secs(10), || async {
        client.volume("b").await.is_ok_and(|v| v.claims.is_empty())
    });

    // A node step the plugin refuses: the claim fails at once (409), and is rolled back.
    client
        .release_volume(
            "a",
            &ReleaseRequest {
                alloc_id: "a1".into(),
            },
        )
        .await
        .expect("release a");
    inject(&agent, "NodeStageVolume", "FAILED_PRECONDITION");
    let before = attempts(&agent, "NodeStageVolume");
    let err = client
        .claim_volume("b", &claim("b2"))
        .await
        .expect_err("stage refused");
    refused(err, 409, "NodeStageVolume", "FAILED_PRECONDITION");
    assert_eq!(attempts(&agent, "NodeStageVolume"), before + 1);
    let log = agent.log();
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("NodeStageVolume")
            && l.contains("volume_id")
            && l.contains("b2")),
        "the failed node RPC is logged at warn with volume and alloc"
    );
    berth_testkit::assert_eventually!(Duration::from_secs(10), || async {
        client.volume("b").await.is_ok_and(|v| v.claims.is_empty())
    });
}
