//! Volumes end to end: a real `berth agent` running a real berth-hostpath (staging and
//! attaching), in a mount namespace that outlives the agent so a kill -9 leaves the mounts where
//! they are; volumes created from HCL, claimed and released through the API, checked in the
//! namespace's mount table and in the order of calls the plugin saw.

mod agent_support;

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    time::Duration,
};

use agent_support::AgentProcess;
use berth_api::{
    Client,
    stream::TopicFilter,
    volumes::{
        ClaimRequest, ClaimResponse, ClaimState, DetachRequest, FlagsInput, MountOptionsInput,
        ReleaseRequest, SpecFormat, VolumeSpecRequest, VolumeStatus,
    },
};
use berth_csi::model::{AccessMode, AttachmentMode};
use berth_hostpath::calllog::{self, Call};

const PLUGIN: &str = "hp";

/// berth-hostpath's arguments in these tests: staging and attaching, its calls logged.
const HOSTPATH_ARGS: &[&str] = &[
    "--enable-stage",
    "--enable-attach",
    "--call-log",
    "@TMP@/calls.log",
];

/// A monolith berth-hostpath the agent runs, staging and attaching, with a call log.
async fn start() -> AgentProcess {
    AgentProcess::start_with_hostpath(PLUGIN, HOSTPATH_ARGS).await
}

fn create_spec(id: &str, mode: &str) -> String {
    format!(
        r#"
id        = "{id}"
name      = "{id}"
type      = "csi"
plugin_id = "{PLUGIN}"
capacity_min = "10MiB"
capability {{
  access_mode     = "{mode}"
  attachment_mode = "file-system"
}}
mount_options {{
  mount_flags = ["noatime", "password=flag-secret-1234"]
}}
secrets {{
  token = "spec-secret-5678"
}}
"#
    )
}

async fn create(client: &Client, id: &str, mode: &str) -> VolumeStatus {
    client
        .create_volume(&VolumeSpecRequest {
            spec: create_spec(id, mode),
            format: SpecFormat::Hcl,
            file: Some(format!("{id}.hcl")),
        })
        .await
        .unwrap_or_else(|e| panic!("create {id}: {e}"))
}

fn claim_req(alloc: &str, mode: AccessMode, read_only: bool) -> ClaimRequest {
    ClaimRequest {
        alloc_id: alloc.into(),
        read_only,
        access_mode: mode,
        attachment_mode: AttachmentMode::FileSystem,
        mount_options: None,
    }
}

async fn claim(client: &Client, vol: &str, alloc: &str, mode: AccessMode) -> ClaimResponse {
    client
        .claim_volume(vol, &claim_req(alloc, mode, false))
        .await
        .unwrap_or_else(|e| panic!("claim {vol} for {alloc}: {e}"))
}

async fn release(client: &Client, vol: &str, alloc: &str) {
    let r = client
        .release_volume(
            vol,
            &ReleaseRequest {
                alloc_id: alloc.into(),
            },
        )
        .await
        .unwrap_or_else(|e| panic!("release {vol} for {alloc}: {e}"));
    assert!(r.released, "{r:?}");
}

fn calls(agent: &AgentProcess) -> Vec<Call> {
    calllog::read(agent.tmp.path().join("calls.log")).unwrap_or_default()
}

/// The volume RPCs the plugin saw (identity, capability and info calls left out).
fn volume_calls(agent: &AgentProcess) -> Vec<(String, String)> {
    calls(agent)
        .into_iter()
        .filter(|c| {
            matches!(
                c.rpc.as_str(),
                "NodeStageVolume"
                    | "NodeUnstageVolume"
                    | "NodePublishVolume"
                    | "NodeUnpublishVolume"
                    | "ControllerPublishVolume"
                    | "ControllerUnpublishVolume"
            )
        })
        .map(|c| (c.rpc, c.code))
        .collect()
}

/// Every mount in the namespace under the agent's data dir.
fn mounts_under(agent: &AgentProcess, dir: &Path) -> Vec<PathBuf> {
    agent
        .namespace()
        .mountinfo()
        .expect("mountinfo")
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(dir))
        .collect()
}

/// The volume's one staging path for a usage named `usage` (`rw-file-system-…`): shared by its
/// read-only and read-write usages, so named without the `ro-`/`rw-` prefix.
fn staging_path(agent: &AgentProcess, vol: &str, usage: &str) -> PathBuf {
    let name = usage
        .strip_prefix("rw-")
        .or_else(|| usage.strip_prefix("ro-"))
        .unwrap_or(usage);
    staging_dir(agent, vol).join(name)
}

fn staging_dir(agent: &AgentProcess, vol: &str) -> PathBuf {
    agent
        .data_dir
        .join("csi/monolith")
        .join(PLUGIN)
        .join("staging")
        .join(vol)
}

#[tokio::test]
async fn two_allocs_share_one_staging_and_release_in_order() {
    let agent = start().await;
    let client = agent.client();
    let vol = create(&client, "shared", "single-node-multi-writer").await;
    assert_eq!(vol.mount_options.mount_flags.as_deref(), Some("[REDACTED]"));
    assert_eq!(vol.secret_names, ["token"]);

    let a = claim(
        &client,
        "shared",
        "alloc-a",
        AccessMode::SingleNodeMultiWriter,
    )
    .await;
    let b = claim(
        &client,
        "shared",
        "alloc-b",
        AccessMode::SingleNodeMultiWriter,
    )
    .await;
    assert_eq!(a.usage, "rw-file-system-single-node-multi-writer");
    assert_eq!(a.usage, b.usage);
    assert_ne!(a.target, b.target);
    assert!(
        a.target
            .starts_with(agent.data_dir.join("csi/monolith/hp/per-alloc/alloc-a"))
    );

    // Staged once, published twice, one controller publish for the node.
    let ns = agent.namespace();
    let staging = staging_path(&agent, "shared", &a.usage);
    assert!(ns.mount_at(&staging).is_some(), "staging not mounted");
    assert!(ns.mount_at(&a.target).is_some(), "target a not mounted");
    assert!(ns.mount_at(&b.target).is_some(), "target b not mounted");
    let count = |rpc: &str| {
        volume_calls(&agent)
            .iter()
            .filter(|(r, c)| r == rpc && c == "OK")
            .count()
    };
    assert_eq!(count("NodeStageVolume"), 1);
    assert_eq!(count("NodePublishVolume"), 2);
    assert_eq!(count("ControllerPublishVolume"), 1);

    // Data written through one target is seen through the other.
    std::fs::write(ns.in_ns(&a.target).join("hello.txt"), "from a").expect("write via a");
    assert_eq!(
        std::fs::read_to_string(ns.in_ns(&b.target).join("hello.txt")).expect("read via b"),
        "from a"
    );

    // A repeated claim answers the same, with no RPC.
    let before = volume_calls(&agent).len();
    let again = claim(
        &client,
        "shared",
        "alloc-a",
        AccessMode::SingleNodeMultiWriter,
    )
    .await;
    assert_eq!(again.target, a.target);
    assert_eq!(volume_calls(&agent).len(), before);

    // Release one: still staged, the other still published.
    release(&client, "shared", "alloc-a").await;
    assert!(ns.mount_at(&a.target).is_none(), "target a still mounted");
    assert!(
        ns.mount_at(&staging).is_some(),
        "unstaged under a live user"
    );
    assert!(ns.mount_at(&b.target).is_some());
    let status = client.volume("shared").await.expect("status");
    assert_eq!(status.claims.len(), 1);
    assert_eq!(status.claims[0].alloc_id, "alloc-b");
    assert_eq!(status.usages.len(), 1);
    assert_eq!(status.usages[0].staging.as_deref(), Some("staged"));
    assert_eq!(status.usages[0].allocs.len(), 1);
    let stats = status.usages[0].allocs[0].stats.as_ref().expect("stats");
    assert!(!stats.usage.is_empty());
    assert_eq!(count("ControllerUnpublishVolume"), 0);

    // Release both: nothing mounted, nothing under per-alloc, and the order held.
    release(&client, "shared", "alloc-b").await;
    assert_eq!(mounts_under(&agent, &agent.data_dir), Vec::<PathBuf>::new());
    let per_alloc = agent.data_dir.join("csi/monolith/hp/per-alloc");
    let left: Vec<_> = std::fs::read_dir(ns.in_ns(&per_alloc))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left under per-alloc: {left:?}");
    let tail: Vec<String> = volume_calls(&agent)
        .into_iter()
        .rev()
        .take(4)
        .rev()
        .map(|(r, _)| r)
        .collect();
    assert_eq!(
        tail,
        [
            "NodeUnpublishVolume",
            "NodeUnpublishVolume",
            "NodeUnstageVolume",
            "ControllerUnpublishVolume"
        ]
    );
    let status = client.volume("shared").await.expect("status");
    assert!(status.claims.is_empty());
    assert!(status.usages.is_empty());

    // No secret or mount flag in the agent's log, the API answers or the events.
    let log = agent.log();
    for secret in ["flag-secret-1234", "spec-secret-5678"] {
        assert!(!log.contains(secret), "{secret} in the agent log");
        let text = serde_json::to_string(&status).unwrap();
        assert!(!text.contains(secret));
    }
}

#[tokio::test]
async fn unavailable_twice_on_node_unpublish_still_ends_in_order() {
    let agent = start().await;
    let client = agent.client();
    create(&client, "flaky", "single-node-writer").await;
    let a = claim(&client, "flaky", "alloc-1", AccessMode::SingleNodeWriter).await;
    // The plugin's fault switch: the next two NodeUnpublishVolume answer UNAVAILABLE.
    berth_sys::write_atomic(
        &agent.tmp.path().join("hp/faults"),
        b"NodeUnpublishVolume:UNAVAILABLE:2\n",
    )
    .expect("faults");
    release(&client, "flaky", "alloc-1").await;
    assert!(agent.namespace().mount_at(&a.target).is_none());
    let seq: Vec<(String, String)> = volume_calls(&agent)
        .into_iter()
        .skip_while(|(r, _)| r != "NodeUnpublishVolume")
        .collect();
    let expect: Vec<(String, String)> = [
        ("NodeUnpublishVolume", "UNAVAILABLE"),
        ("NodeUnpublishVolume", "UNAVAILABLE"),
        ("NodeUnpublishVolume", "OK"),
        ("NodeUnstageVolume", "OK"),
        ("ControllerUnpublishVolume", "OK"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(seq, expect);
}

#[tokio::test]
async fn a_failing_node_step_keeps_the_claim_and_is_retried_in_the_background() {
    let agent = start().await;
    let client = agent.client();
    create(&client, "stuck", "single-node-writer").await;
    let a = claim(&client, "stuck", "alloc-1", AccessMode::SingleNodeWriter).await;
    let faults = agent.tmp.path().join("hp/faults");
    berth_sys::write_atomic(&faults, b"NodeUnpublishVolume:INTERNAL\n").expect("faults");
    let r = client
        .release_volume(
            "stuck",
            &ReleaseRequest {
                alloc_id: "alloc-1".into(),
            },
        )
        .await
        .expect("release answers");
    assert!(!r.released);
    assert!(
        r.error.as_deref().unwrap_or("").contains("INTERNAL"),
        "{r:?}"
    );
    let status = client.volume("stuck").await.expect("status");
    assert_eq!(status.claims[0].state, ClaimState::Releasing);
    assert!(agent.namespace().mount_at(&a.target).is_some());
    assert!(
        !volume_calls(&agent)
            .iter()
            .any(|(r, _)| r == "ControllerUnpublishVolume"),
        "controller unpublish while the node holds the mount"
    );
    // The fault goes away; the background retry finishes the release.
    berth_sys::write_atomic(&faults, b"\n").expect("faults");
    berth_testkit::assert_eventually!(Duration::from_secs(20), || async {
        client
            .volume("stuck")
            .await
            .is_ok_and(|s| s.claims.is_empty())
    });
    assert!(agent.namespace().mount_at(&a.target).is_none());
    assert_eq!(
        volume_calls(&agent)
            .last()
            .map(|(r, c)| (r.as_str(), c.as_str())),
        Some(("ControllerUnpublishVolume", "OK"))
    );
}

#[tokio::test]
async fn access_modes_are_enforced() {
    let agent = start().await;
    let client = agent.client();
    create(&client, "snw", "single-node-writer").await;
    claim(&client, "snw", "w1", AccessMode::SingleNodeWriter).await;
    let e = client
        .claim_volume("snw", &claim_req("w2", AccessMode::SingleNodeWriter, false))
        .await
        .expect_err("second writer");
    assert_eq!(e.status(), Some(409));
    assert!(e.to_string().contains("already writes"), "{e}");
    // A reader may join on the same node.
    client
        .claim_volume("snw", &claim_req("r1", AccessMode::SingleNodeWriter, true))
        .await
        .expect("reader");
    // An alloc that holds a claim cannot swap it for another one; its mount stays.
    let w1 = claim(&client, "snw", "w1", AccessMode::SingleNodeWriter).await;
    let e = client
        .claim_volume("snw", &claim_req("w1", AccessMode::SingleNodeWriter, true))
        .await
        .expect_err("a different claim by the same alloc");
    assert_eq!(e.status(), Some(409));
    assert!(e.to_string().contains("release it first"), "{e}");
    assert!(agent.namespace().mount_at(&w1.target).is_some());
    let status = client.volume("snw").await.expect("status");
    assert_eq!(status.claims.len(), 2);
    assert!(status.claims.iter().all(|c| c.state == ClaimState::Claimed));

    // Reader-only: readers work, a writer is refused.
    client
        .create_volume(&VolumeSpecRequest {
            spec: create_spec("ro", "multi-node-reader-only"),
            format: SpecFormat::Hcl,
            file: None,
        })
        .await
        .expect("create ro");
    let r = client
        .claim_volume(
            "ro",
            &claim_req("r1", AccessMode::MultiNodeReaderOnly, true),
        )
        .await
        .expect("reader on reader-only");
    assert!(r.usage.starts_with("ro-"));
    // A read-only claim publishes read-only.
    let ro_target = agent.namespace().in_ns(&r.target);
    assert!(std::fs::write(ro_target.join("x"), "no").is_err());
    let e = client
        .claim_volume(
            "ro",
            &claim_req("w1", AccessMode::MultiNodeReaderOnly, false),
        )
        .await
        .expect_err("writer on reader-only");
    assert_eq!(e.status(), Some(409));
    assert!(e.to_string().contains("refuses writers"), "{e}");
    // An access mode the volume does not offer.
    let e = client
        .claim_volume("ro", &claim_req("w9", AccessMode::SingleNodeWriter, false))
        .await
        .expect_err("mode not offered");
    assert_eq!(e.status(), Some(409));
    assert!(e.to_string().contains("no capability"), "{e}");
}

#[tokio::test]
async fn a_second_staging_of_a_volume_is_refused_while_the_first_is_in_use() {
    let agent = start().await;
    let client = agent.client();
    create(&client, "opts", "single-node-multi-writer").await;
    let a = claim(&client, "opts", "a1", AccessMode::SingleNodeMultiWriter).await;
    let mut req = claim_req("a2", AccessMode::SingleNodeMultiWriter, false);
    req.mount_options = Some(MountOptionsInput {
        fs_type: None,
        mount_flags: Some(FlagsInput(vec!["nodev".into()])),
    });
    // Other options would need a second staging path of the volume: the CSI spec allows one.
    let before = snapshot_of_state(&client).await;
    let calls = volume_calls(&agent);
    let e = client
        .claim_volume("opts", &req)
        .await
        .expect_err("refused");
    assert_eq!(e.status(), Some(409), "{e}");
    assert!(e.to_string().contains("one staging path per volume"), "{e}");
    assert_eq!(snapshot_of_state(&client).await, before, "nothing changed");
    assert_eq!(volume_calls(&agent), calls, "no RPC");
    // A read-only claim shares the staging; the other options work once it is free.
    let ro = client
        .claim_volume(
            "opts",
            &claim_req("r1", AccessMode::SingleNodeMultiWriter, true),
        )
        .await
        .expect("reader shares the staging");
    let ns = agent.namespace();
    assert!(ns.mount_at(&a.target).is_some() && ns.mount_at(&ro.target).is_some());
    assert_eq!(
        mounts_under(&agent, &staging_dir(&agent, "opts")).len(),
        1,
        "one staging"
    );
    release(&client, "opts", "a1").await;
    release(&client, "opts", "r1").await;
    let b = client.claim_volume("opts", &req).await.expect("claim a2");
    assert!(ns.mount_at(&b.target).is_some());
    release(&client, "opts", "a2").await;
    assert_eq!(mounts_under(&agent, &agent.data_dir), Vec::<PathBuf>::new());
}

/// The store, as the agent would show it: every volume's status.
async fn snapshot_of_state(client: &Client) -> String {
    let list = client.volumes().await.expect("volumes");
    let mut out = serde_json::to_string(&list).unwrap();
    for v in &list.volumes {
        let mut s = client.volume(&v.id).await.expect("status");
        // Stats are live figures (and best effort), not state.
        for a in s.usages.iter_mut().flat_map(|u| u.allocs.iter_mut()) {
            a.stats = None;
        }
        out.push_str(&serde_json::to_string(&s).unwrap());
    }
    out
}

#[tokio::test]
async fn bad_input_is_refused_and_changes_nothing() {
    let agent = start().await;
    let client = agent.client();
    create(&client, "good", "single-node-writer").await;
    let before = snapshot_of_state(&client).await;
    let state_file = agent.data_dir.join("state.redb");
    let bytes_before = std::fs::read(agent.namespace().in_ns(&state_file)).ok();

    let long = "v".repeat(129);
    let big_flags: Vec<String> = (0..600).map(|i| format!("flag{i:04}")).collect();
    let big_flags = format!("{big_flags:?}");
    let specs: Vec<(String, &str)> = vec![
        (create_spec("a/b", "single-node-writer"), "id"),
        (create_spec("..", "single-node-writer"), "id"),
        (create_spec("nul\\u0000x", "single-node-writer"), "id"),
        (create_spec(&long, "single-node-writer"), "id"),
        (
            create_spec("bad-mode", "single-node-sometimes"),
            "access_mode",
        ),
        (
            format!("id = \"nocap\"\ntype = \"csi\"\nplugin_id = \"{PLUGIN}\"\n"),
            "capability",
        ),
        (
            create_spec("bigflags", "single-node-writer")
                .replace("[\"noatime\", \"password=flag-secret-1234\"]", &big_flags),
            "mount_flags",
        ),
    ];
    for (spec, field) in specs {
        let e = client
            .create_volume(&VolumeSpecRequest {
                spec,
                format: SpecFormat::Hcl,
                file: Some("bad.hcl".into()),
            })
            .await
            .expect_err("bad spec accepted");
        assert_eq!(e.status(), Some(400), "{e}");
        let text = e.to_string();
        assert!(text.contains("bad.hcl"), "{text}");
        assert!(text.contains(field), "{field} not named: {text}");
        assert!(!text.contains("flag-secret-1234") && !text.contains("spec-secret-5678"));
    }
    // Claims: unknown volume, bad alloc ids, bad volume ids in the path.
    let e = client
        .claim_volume("nope", &claim_req("a", AccessMode::SingleNodeWriter, false))
        .await
        .expect_err("unknown volume");
    assert_eq!(e.status(), Some(404), "{e}");
    for alloc in ["..", "a/b", &"x".repeat(129), "nul\0"] {
        let e = client
            .claim_volume(
                "good",
                &claim_req(alloc, AccessMode::SingleNodeWriter, false),
            )
            .await
            .expect_err("bad alloc id");
        assert_eq!(e.status(), Some(400), "{alloc:?}: {e}");
        assert!(e.to_string().contains("alloc_id"), "{e}");
    }
    for id in ["..", &"v".repeat(129)] {
        let e = client
            .claim_volume(id, &claim_req("a", AccessMode::SingleNodeWriter, false))
            .await
            .expect_err("bad volume id");
        assert_eq!(e.status(), Some(400), "{e}");
    }
    // Mount flags over 4 KiB on a claim.
    let mut req = claim_req("a", AccessMode::SingleNodeWriter, false);
    req.mount_options = Some(MountOptionsInput {
        fs_type: None,
        mount_flags: Some(FlagsInput(vec!["x".repeat(5000)])),
    });
    let e = client
        .claim_volume("good", &req)
        .await
        .expect_err("big flags");
    assert_eq!(e.status(), Some(400), "{e}");
    assert!(e.to_string().contains("mount_flags"), "{e}");

    assert_eq!(snapshot_of_state(&client).await, before);
    assert_eq!(
        std::fs::read(agent.namespace().in_ns(&state_file)).ok(),
        bytes_before,
        "the store file changed"
    );
    assert_eq!(volume_calls(&agent), Vec::<(String, String)>::new());
}

#[tokio::test]
async fn deregister_refuses_a_claimed_volume_unless_forced() {
    let agent = start().await;
    let client = agent.client();
    create(&client, "dv", "single-node-writer").await;
    let a = claim(&client, "dv", "a1", AccessMode::SingleNodeWriter).await;
    let e = client
        .deregister_volume("dv", false)
        .await
        .expect_err("claimed");
    assert_eq!(e.status(), Some(409), "{e}");
    let e = client.delete_volume("dv").await.expect_err("claimed");
    assert_eq!(e.status(), Some(409), "{e}");
    let out = client.deregister_volume("dv", true).await.expect("forced");
    assert_eq!(out.releases.len(), 1);
    assert!(out.releases[0].released);
    assert!(agent.namespace().mount_at(&a.target).is_none());
    assert!(client.volume("dv").await.unwrap_err().is_not_found());
    let seq: Vec<String> = volume_calls(&agent).into_iter().map(|(r, _)| r).collect();
    assert_eq!(
        seq[seq.len() - 3..],
        [
            "NodeUnpublishVolume",
            "NodeUnstageVolume",
            "ControllerUnpublishVolume"
        ]
    );

    // Detach releases this node's claims in the same order; delete removes it at the plugin.
    create(&client, "dt", "single-node-writer").await;
    claim(&client, "dt", "a2", AccessMode::SingleNodeWriter).await;
    let out = client
        .detach_volume("dt", &DetachRequest::default())
        .await
        .expect("detach");
    assert!(out.releases.iter().all(|r| r.released));
    client.delete_volume("dt").await.expect("delete");
    assert!(
        calls(&agent)
            .iter()
            .any(|c| c.rpc == "DeleteVolume" && c.code == "OK")
    );
}

// ---- crash safety ----

/// Kills the agent (SIGKILL, from its crash hook) at `step` during `action`, starts it again
/// and returns it; the caller checks the end state.
async fn crash_at(agent: &mut AgentProcess, step: &str, action: impl AsyncFnOnce(&Client)) {
    agent.kill9();
    agent.set_env("BERTH_TEST_CRASH_AT", Some(step));
    agent.respawn();
    agent.wait_ready().await;
    let client = agent.client();
    agent
        .wait_plugin(PLUGIN, Duration::from_secs(20), |p| p.health.healthy)
        .await;
    action(&client).await;
    let status = agent.wait_exit(Duration::from_secs(20)).await;
    assert!(!status.success(), "agent did not crash at {step}");
    agent.set_env("BERTH_TEST_CRASH_AT", None);
    agent.respawn();
    agent.wait_ready().await;
}

/// The message of the plugin's `PluginVolumesRecovered` event stamped at `since_ms` or later,
/// read from the event stream (waits at most 30 s).
async fn recovered(client: &Client, since_ms: u64) -> String {
    let filter = TopicFilter::parse([format!("CSIPlugin:{PLUGIN}").as_str()]).expect("filter");
    let mut stream = client
        .event_stream(&filter, Some(0), None)
        .await
        .expect("event stream");
    let read = stream.first_event(|e| e.kind == "PluginVolumesRecovered" && e.time_ms >= since_ms);
    let event = tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("no PluginVolumesRecovered event within 30 s")
        .expect("event stream")
        .expect("the event stream ended");
    event.payload["Message"].as_str().unwrap_or_default().into()
}

/// Kills the agent with SIGKILL and starts it again; a client of the new agent and the message
/// of its `PluginVolumesRecovered` event.
async fn restart_and_recover(agent: &mut AgentProcess) -> (Client, String) {
    agent.kill9();
    let since = berth_sys::now_ms();
    agent.respawn();
    agent.wait_ready().await;
    let client = agent.client();
    let said = recovered(&client, since).await;
    (client, said)
}

/// Usage sets as the status shows them: (usage, alloc) pairs.
fn published(status: &VolumeStatus) -> BTreeSet<(String, String)> {
    status
        .usages
        .iter()
        .flat_map(|u| {
            u.allocs
                .iter()
                .map(move |a| (u.usage.clone(), a.alloc_id.clone()))
        })
        .collect()
}

async fn wait_settled(client: &Client, vol: &str) -> VolumeStatus {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let status = client.volume(vol).await;
        if let Ok(s) = &status {
            // Every claim claimed and published, and nothing of the volume half done.
            let settled = s.claims.iter().all(|c| {
                c.state == ClaimState::Claimed
                    && s.usages
                        .iter()
                        .flat_map(|u| &u.allocs)
                        .any(|a| a.alloc_id == c.alloc_id)
            }) && s.usages.iter().all(|u| {
                u.staging.as_deref().is_none_or(|st| st == "staged")
                    && u.allocs.iter().all(|a| a.state == "published")
            });
            if settled {
                return s.clone();
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "volume {vol} did not settle: {status:#?}"
        );
        tokio::time::sleep(berth_testkit::POLL_INTERVAL).await;
    }
}

/// A write claim that asks for its own fs_type.
fn xfs_claim(alloc: &str) -> ClaimRequest {
    let mut req = claim_req(alloc, AccessMode::SingleNodeWriter, false);
    req.mount_options = Some(MountOptionsInput {
        fs_type: Some("xfs".into()),
        mount_flags: None,
    });
    req
}

const MOUNT_STEPS: &[&str] = &[
    "claim:persisted",
    "ControllerPublishVolume:before",
    "ControllerPublishVolume:after",
    "NodeStageVolume:before",
    "NodeStageVolume:after",
    "NodePublishVolume:before",
    "NodePublishVolume:after",
];

const UNMOUNT_STEPS: &[&str] = &[
    "release:persisted",
    "NodeUnpublishVolume:before",
    "NodeUnpublishVolume:after",
    "NodeUnstageVolume:before",
    "NodeUnstageVolume:after",
    "ControllerUnpublishVolume:before",
    "ControllerUnpublishVolume:after",
];

#[tokio::test]
async fn kill_9_at_every_step_of_mount_ends_mounted_with_the_claim() {
    let mut agent = start().await;
    kill_9_at_every_step_of_mount(&mut agent).await;
}

#[tokio::test]
async fn kill_9_at_every_step_of_mount_in_a_fleet_ends_mounted_with_the_claim() {
    let (_etcd, mut agent) = start_in_fleet().await;
    kill_9_at_every_step_of_mount(&mut agent).await;
}

/// [`start`], with the control plane on an etcd of its own (a fleet of one node, whose claims
/// are never freed for it while it is down); the etcd lives as long as what is returned.
async fn start_in_fleet() -> (berth_testkit::EtcdCluster, AgentProcess) {
    let cluster = berth_testkit::EtcdCluster::single().expect("etcd");
    let config = format!(
        "{}control_plane {{\n  etcd {{\n    prefix = \"/crash\"\n    lease_ttl = \"3s\"\n    \
         lost_after = \"1h\"\n    lost_claims {{\n      after = \"1h\"\n    }}\n  }}\n}}\n",
        agent_support::hostpath_config(PLUGIN, HOSTPATH_ARGS)
    );
    let agent =
        AgentProcess::start_in_namespace_with(&config, &["--etcd", &cluster.endpoints_csv()]).await;
    agent
        .wait_plugin(PLUGIN, Duration::from_secs(20), |p| p.health.healthy)
        .await;
    (cluster, agent)
}

/// Kills the agent at each step of a claim (a volume per step); the next agent ends each
/// claim mounted, once, with nothing leaked.
async fn kill_9_at_every_step_of_mount(agent: &mut AgentProcess) {
    for (i, step) in MOUNT_STEPS.iter().enumerate() {
        let vol = format!("m{i}");
        create(&agent.client(), &vol, "single-node-writer").await;
        let v = vol.clone();
        crash_at(agent, step, async move |c: &Client| {
            // The call dies with the agent.
            let _ = c.claim_volume(&v, &xfs_claim("a1")).await;
        })
        .await;
        let client = agent.client();
        // The interrupted claim is driven to its end at start: claimed and mounted once.
        let status = wait_settled(&client, &vol).await;
        assert_eq!(status.claims.len(), 1, "{step}: {status:#?}");
        assert_eq!(
            published(&status),
            BTreeSet::from([(
                "rw-file-system-single-node-writer".to_string(),
                "a1".to_string()
            )]),
            "{step}"
        );
        // Finished with the options it was asked for.
        assert_eq!(status.usages[0].mount_options.fs_type, "xfs", "{step}");
        // The caller's retry answers the same target, and the target is mounted.
        let r = client
            .claim_volume(&vol, &xfs_claim("a1"))
            .await
            .unwrap_or_else(|e| panic!("{step}: retry: {e}"));
        assert!(
            agent.namespace().mount_at(&r.target).is_some(),
            "{step}: not mounted"
        );
        // No leaked mount: releasing leaves nothing.
        release(&client, &vol, "a1").await;
        let left: Vec<PathBuf> = mounts_under(agent, &agent.data_dir)
            .into_iter()
            .filter(|p| p.to_string_lossy().contains(&format!("/{vol}/")))
            .collect();
        assert!(left.is_empty(), "{step}: leaked {left:?}");
    }
}

#[tokio::test]
async fn kill_9_at_every_step_of_unmount_ends_released() {
    let mut agent = start().await;
    kill_9_at_every_step_of_unmount(&mut agent).await;
}

#[tokio::test]
async fn kill_9_at_every_step_of_unmount_in_a_fleet_ends_released() {
    let (_etcd, mut agent) = start_in_fleet().await;
    kill_9_at_every_step_of_unmount(&mut agent).await;
}

/// Kills the agent at each step of a release (a volume per step); the next agent ends each
/// release with nothing claimed or mounted, the controller step after the node steps, and
/// nothing mounted again.
async fn kill_9_at_every_step_of_unmount(agent: &mut AgentProcess) {
    for (i, step) in UNMOUNT_STEPS.iter().enumerate() {
        let vol = format!("u{i}");
        let client = agent.client();
        create(&client, &vol, "single-node-writer").await;
        let a = claim(&client, &vol, "a1", AccessMode::SingleNodeWriter).await;
        let before = volume_calls(agent).len();
        let v = vol.clone();
        crash_at(agent, step, async move |c: &Client| {
            let _ = c
                .release_volume(
                    &v,
                    &ReleaseRequest {
                        alloc_id: "a1".into(),
                    },
                )
                .await;
        })
        .await;
        let client = agent.client();
        // The interrupted release finishes at start: no claim, no usage, nothing mounted.
        berth_testkit::assert_eventually!(Duration::from_secs(30), || async {
            client
                .volume(&vol)
                .await
                .is_ok_and(|s| s.claims.is_empty() && s.usages.is_empty())
        });
        assert!(agent.namespace().mount_at(&a.target).is_none(), "{step}");
        let left: Vec<PathBuf> = mounts_under(agent, &agent.data_dir)
            .into_iter()
            .filter(|p| p.to_string_lossy().contains(&format!("/{vol}/")))
            .collect();
        assert!(left.is_empty(), "{step}: leaked {left:?}");
        // The controller step came after the node steps.
        let seq: Vec<String> = volume_calls(agent)
            .into_iter()
            .filter(|(_, c)| c == "OK")
            .map(|(r, _)| r)
            .collect();
        let last_cu = seq.iter().rposition(|r| r == "ControllerUnpublishVolume");
        let last_nu = seq.iter().rposition(|r| r == "NodeUnstageVolume");
        assert!(last_cu > last_nu, "{step}: {seq:?}");
        // A release's node records are deferred, so a kill -9 after its unmounts may lose them
        // and the alloc looks published again: its claim is releasing, so recovery unmounts,
        // never mounts the volume again.
        let after: Vec<(String, String)> = volume_calls(agent).split_off(before);
        assert!(
            after.iter().all(|(rpc, _)| !matches!(
                rpc.as_str(),
                "NodeStageVolume" | "NodePublishVolume" | "ControllerPublishVolume"
            )),
            "{step}: mounted again: {after:?}"
        );
    }
}

#[tokio::test]
async fn a_shared_staging_survives_an_agent_restart_and_one_release() {
    let mut agent = start().await;
    let client = agent.client();
    create(&client, "keep", "single-node-multi-writer").await;
    let a = claim(&client, "keep", "a1", AccessMode::SingleNodeMultiWriter).await;
    let b = claim(&client, "keep", "a2", AccessMode::SingleNodeMultiWriter).await;
    let before = volume_calls(&agent).len();
    // Recovery says it checked both allocs and left them as they were.
    let (client, said) = restart_and_recover(&mut agent).await;
    assert!(
        said.starts_with("2 allocs kept mounted, 0 steps done again, 0 records failed"),
        "{said}"
    );
    let status = wait_settled(&client, "keep").await;
    assert_eq!(status.claims.len(), 2);
    // Kept without any volume call.
    let after: Vec<(String, String)> = volume_calls(&agent).into_iter().skip(before).collect();
    assert!(after.is_empty(), "volume calls at restart: {after:?}");
    release(&client, "keep", "a1").await;
    let ns = agent.namespace();
    let staging = staging_path(&agent, "keep", &a.usage);
    assert!(
        ns.mount_at(&staging).is_some(),
        "unstaged under a live user"
    );
    assert!(ns.mount_at(&b.target).is_some());
    assert!(ns.mount_at(&a.target).is_none());
    release(&client, "keep", "a2").await;
    assert!(ns.mount_at(&staging).is_none());
}

/// The calls of the plugin's health check that fingerprint it.
const FINGERPRINT_RPCS: [&str; 5] = [
    "GetPluginInfo",
    "GetPluginCapabilities",
    "NodeGetInfo",
    "NodeGetCapabilities",
    "ControllerGetCapabilities",
];

/// The plugin's calls after the first `skip`, once at least one Probe is among them.
async fn calls_until_a_probe(agent: &AgentProcess, skip: usize) -> Vec<String> {
    let new = || -> Vec<String> { calls(agent).into_iter().skip(skip).map(|c| c.rpc).collect() };
    berth_testkit::assert_eventually!(Duration::from_secs(20), || async {
        new().iter().any(|rpc| rpc == "Probe")
    });
    new()
}

/// A berth-hostpath the test runs itself, in the agent's mount namespace, so that it lives on
/// when the agent is killed: killed and reaped on drop.
struct OwnPlugin(std::process::Child);

impl Drop for OwnPlugin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The fingerprint the agent shows for the plugin.
async fn fingerprint_of(client: &Client) -> berth_api::Fingerprint {
    client
        .plugin(PLUGIN)
        .await
        .expect("plugin")
        .fingerprint
        .expect("fingerprinted")
}

#[tokio::test]
async fn a_restarted_agent_asks_a_plugin_that_lived_on_nothing_until_its_regular_probe() {
    let mut agent = AgentProcess::start_in_namespace(&format!(
        "health {{\n  interval = \"200ms\"\n  failures = 2\n}}\n\
         plugin \"{PLUGIN}\" {{\n  type = \"monolith\"\n  socket = \"@TMP@/hp.sock\"\n}}\n"
    ))
    .await;
    let tmp = agent.tmp.path().to_path_buf();
    let plugin = OwnPlugin(
        agent
            .namespace()
            .command(berth_testkit::bin_path("berth-hostpath"))
            .arg(format!(
                "--endpoint=unix://{}",
                tmp.join("hp.sock").display()
            ))
            .args([
                "--nodeid",
                "n1",
                "--enable-stage",
                "--enable-attach",
                "--statedir",
            ])
            .arg(tmp.join("hp"))
            .arg("--call-log")
            .arg(tmp.join("calls.log"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("berth-hostpath"),
    );
    agent
        .wait_plugin(PLUGIN, Duration::from_secs(20), |p| p.health.healthy)
        .await;
    let client = agent.client();
    create(&client, "fp", "single-node-writer").await;
    claim(&client, "fp", "a1", AccessMode::SingleNodeWriter).await;
    let taken = fingerprint_of(&client).await;

    let before = calls(&agent).len();
    let (client, said) = restart_and_recover(&mut agent).await;
    assert!(
        said.starts_with("1 allocs kept mounted, 0 steps done again"),
        "{said}"
    );
    // The kept fingerprint, as it was taken before the restart.
    assert_eq!(fingerprint_of(&client).await, taken);
    // Nothing but the loop's regular probe reaches the plugin.
    let after = calls_until_a_probe(&agent, before).await;
    assert!(after.iter().all(|rpc| rpc == "Probe"), "{after:?}");
    wait_settled(&client, "fp").await;

    // The plugin dies while the agent is down, leaving its socket file: the health carried
    // over is not this agent's to keep, so the first failed probe turns it unhealthy (it is
    // never shown healthy with a failed check).
    agent.kill9();
    drop(plugin);
    assert!(
        tmp.join("hp.sock").exists(),
        "a SIGKILLed plugin leaves its socket"
    );
    let refused = || std::os::unix::net::UnixStream::connect(tmp.join("hp.sock")).is_err();
    assert!(refused(), "nothing listens behind the socket any more");
    let dead_at = calls(&agent).len();
    agent.respawn();
    agent.wait_ready().await;
    let status = agent
        .wait_plugin(PLUGIN, Duration::from_secs(20), |p| {
            !p.health.description.contains("before the agent restarted")
        })
        .await;
    assert!(
        !status.health.healthy,
        "{:?}; socket refusing: {}; calls the dead plugin logged: {:?}",
        status.health,
        refused(),
        calls(&agent)
            .get(dead_at..)
            .map(|c| c.iter().map(|c| c.rpc.clone()).collect::<Vec<_>>())
    );
}

#[tokio::test]
async fn a_plugin_the_agent_runs_is_fingerprinted_afresh_after_the_agent_restarts() {
    let mut agent = start().await;
    let client = agent.client();
    create(&client, "fp", "single-node-writer").await;
    claim(&client, "fp", "a1", AccessMode::SingleNodeWriter).await;
    let taken = fingerprint_of(&client).await;

    // The restarted agent stops the copy left running and starts its own: nothing kept of
    // the old copy counts, and the new one is fingerprinted before it is probed.
    let before = calls(&agent).len();
    agent.kill9();
    agent.respawn();
    agent.wait_ready().await;
    let after = calls_until_a_probe(&agent, before).await;
    let first_probe = after
        .iter()
        .position(|rpc| rpc == "Probe")
        .expect("a probe");
    for rpc in FINGERPRINT_RPCS {
        assert!(
            after[..first_probe].iter().any(|c| c == rpc),
            "{rpc}: {after:?}"
        );
    }
    let status = agent
        .wait_plugin(PLUGIN, Duration::from_secs(20), |p| p.health.healthy)
        .await;
    assert!(
        status
            .fingerprint
            .as_ref()
            .is_some_and(|f| f.taken_ms > taken.taken_ms),
        "{status:#?}"
    );
    // Its health event (in the log, with every event) never said it carried over.
    assert!(
        !agent.log().contains("healthy before the agent restarted"),
        "health carried over to a plugin the agent restarted:\n{}",
        agent.log()
    );
}

#[tokio::test]
async fn expand_and_snapshots_go_through_the_controller_and_node() {
    use berth_api::volumes::{ExpandRequest, SnapshotCreateRequest, SnapshotDeleteRequest};
    let agent = start().await;
    let client = agent.client();
    let vol = create(&client, "grow", "single-node-writer").await;
    assert_eq!(vol.capacity_bytes, 10 << 20);
    claim(&client, "grow", "a1", AccessMode::SingleNodeWriter).await;
    let e = client
        .expand_volume(
            "grow",
            &ExpandRequest {
                capacity_min: 1 << 20,
                capacity_max: None,
            },
        )
        .await
        .expect_err("shrinking");
    assert_eq!(e.status(), Some(400), "{e}");
    let r = client
        .expand_volume(
            "grow",
            &ExpandRequest {
                capacity_min: 20 << 20,
                capacity_max: None,
            },
        )
        .await
        .expect("expand");
    assert_eq!(r.capacity_bytes, 20 << 20);
    assert!(r.node_expanded);
    let seq: Vec<String> = volume_calls_all(&agent);
    let ce = seq.iter().position(|r| r == "ControllerExpandVolume");
    let ne = seq.iter().position(|r| r == "NodeExpandVolume");
    assert!(ce.is_some() && ne > ce, "{seq:?}");
    assert_eq!(
        client.volume("grow").await.unwrap().capacity_bytes,
        20 << 20
    );

    let snap = client
        .create_snapshot(
            "grow",
            &SnapshotCreateRequest {
                name: "first".into(),
                ..Default::default()
            },
        )
        .await
        .expect("snapshot");
    assert_eq!(snap.source_volume_id.as_deref(), Some("grow"));
    let list = client.list_snapshots(PLUGIN).await.expect("list");
    assert!(
        list.snapshots
            .iter()
            .any(|s| s.snapshot_id == snap.snapshot_id)
    );
    client
        .delete_snapshot(&SnapshotDeleteRequest {
            plugin_id: PLUGIN.into(),
            snapshot_id: snap.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .expect("delete snapshot");
    let list = client.list_snapshots(PLUGIN).await.expect("list");
    assert!(
        !list
            .snapshots
            .iter()
            .any(|s| s.snapshot_id == snap.snapshot_id)
    );
}

fn volume_calls_all(agent: &AgentProcess) -> Vec<String> {
    calls(agent)
        .into_iter()
        .filter(|c| c.code == "OK")
        .map(|c| c.rpc)
        .collect()
}

/// The README's walk, with the real CLI: `berth agent --dev`, `berth volume create
/// examples/volume.hcl`, two claims, shared data, releases.
#[tokio::test]
async fn the_readme_walk_with_berth_agent_dev_and_the_cli() {
    let agent = AgentProcess::start_in_namespace_with("", &["--dev"]).await;
    agent
        .wait_plugin("hostpath", Duration::from_secs(20), |p| p.health.healthy)
        .await;
    let addr = format!("unix://{}", agent.socket().display());
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/volume.hcl");
    let berth = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
            .env("BERTH_ADDR", &addr)
            .args(args)
            .output()
            .expect("run berth");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "berth {args:?}: {}\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    let created = berth(&["volume", "create", example.to_str().unwrap()]);
    assert!(created.contains("\"demo\" created"), "{created}");
    let claim = |alloc: &str| {
        PathBuf::from(
            berth(&[
                "volume",
                "claim",
                "demo",
                "--alloc",
                alloc,
                "--access-mode",
                "single-node-multi-writer",
            ])
            .trim(),
        )
    };
    let t1 = claim("web-1");
    let t2 = claim("web-2");
    let ns = agent.namespace();
    std::fs::write(ns.in_ns(&t1).join("hello.txt"), "hi").expect("write");
    assert_eq!(
        std::fs::read_to_string(ns.in_ns(&t2).join("hello.txt")).expect("read"),
        "hi"
    );
    let status = berth(&["volume", "status", "demo"]);
    assert!(
        status.contains("[REDACTED]") && !status.contains("noatime"),
        "{status}"
    );
    assert!(!status.contains("not-a-real-token"), "{status}");
    let staging = agent
        .data_dir
        .join("csi/monolith/hostpath/staging/demo/file-system-single-node-multi-writer");
    berth(&["volume", "release", "demo", "--alloc", "web-1"]);
    assert!(ns.mount_at(&staging).is_some() && ns.mount_at(&t2).is_some());
    berth(&["volume", "release", "demo", "--alloc", "web-2"]);
    assert_eq!(mounts_under(&agent, &agent.data_dir), Vec::<PathBuf>::new());
    berth(&["volume", "delete", "demo"]);
}

#[tokio::test]
async fn a_claim_and_a_release_of_one_alloc_racing_end_consistent() {
    let agent = start().await;
    let client = agent.client();
    create(&client, "race", "single-node-writer").await;
    for round in 0..10 {
        let (c1, c2) = (client.clone(), client.clone());
        let claiming = tokio::spawn(async move {
            c1.claim_volume(
                "race",
                &claim_req("a1", AccessMode::SingleNodeWriter, false),
            )
            .await
        });
        let releasing = tokio::spawn(async move {
            c2.release_volume(
                "race",
                &ReleaseRequest {
                    alloc_id: "a1".into(),
                },
            )
            .await
        });
        let claimed = claiming.await.expect("join");
        releasing.await.expect("join").expect("release answers");
        let status = client.volume("race").await.expect("status");
        let target = agent
            .data_dir
            .join("csi/monolith/hp/per-alloc/a1/race/rw-file-system-single-node-writer");
        let mounted = agent.namespace().mount_at(&target).is_some();
        match status.claims.first() {
            // The claim won after the release: it is claimed and mounted.
            Some(c) => {
                assert_eq!(c.state, ClaimState::Claimed, "round {round}: {status:#?}");
                assert!(claimed.is_ok(), "round {round}");
                assert!(mounted, "round {round}: claimed but not mounted");
            }
            // The release came last: nothing is left.
            None => {
                assert!(!mounted, "round {round}: released but mounted");
                assert!(status.usages.is_empty(), "round {round}: {status:#?}");
            }
        }
        release(&client, "race", "a1").await;
    }
    assert_eq!(mounts_under(&agent, &agent.data_dir), Vec::<PathBuf>::new());
    // The controller never unpublished while the node held the volume: every
    // ControllerUnpublish follows a NodeUnstage.
    let seq: Vec<String> = volume_calls(&agent)
        .into_iter()
        .filter(|(_, c)| c == "OK")
        .map(|(r, _)| r)
        .collect();
    for (i, r) in seq.iter().enumerate() {
        if r == "ControllerUnpublishVolume" {
            assert_eq!(seq[i - 1], "NodeUnstageVolume", "{seq:?}");
        }
    }
}

/// Concurrent claims and releases share the store's transactions; the agent is killed inside
/// one that carries several of them, before it commits (none durable) and, in a second run,
/// after (all durable, none answered). Each time the next agent ends every volume claimed and
/// mounted once or not claimed at all, and releasing what is left leaves nothing mounted.
#[tokio::test]
async fn kill_9_inside_a_coalesced_commit_loses_no_mount_and_leaks_none() {
    let mut agent = start().await;
    for (n, step) in ["commit:coalesced:before", "commit:coalesced:after"]
        .iter()
        .enumerate()
    {
        let vols: Vec<String> = (0..8).map(|i| format!("gc{n}-{i}")).collect();
        // The agent was respawned by the previous round: its plugin comes up after it is ready.
        agent
            .wait_plugin(PLUGIN, Duration::from_secs(20), |p| p.health.healthy)
            .await;
        for v in &vols {
            create(&agent.client(), v, "single-node-writer").await;
        }
        let vs = vols.clone();
        crash_at(&mut agent, step, async move |c: &Client| {
            // Rounds of claims, then releases, of every volume at once, until one of them finds
            // the agent gone (the hook killed it in a shared commit). Bounded: an agent that
            // never shares a commit is not killed, and `crash_at` fails.
            for round in 0..40 {
                let alloc = format!("a{round}");
                let claims = vs.iter().map(|v| {
                    let req = claim_req(&alloc, AccessMode::SingleNodeWriter, false);
                    async move { c.claim_volume(v, &req).await.map(drop) }
                });
                if futures::future::join_all(claims)
                    .await
                    .iter()
                    .any(Result::is_err)
                {
                    return;
                }
                let releases = vs.iter().map(|v| {
                    let req = ReleaseRequest {
                        alloc_id: alloc.clone(),
                    };
                    async move { c.release_volume(v, &req).await.map(drop) }
                });
                if futures::future::join_all(releases)
                    .await
                    .iter()
                    .any(Result::is_err)
                {
                    return;
                }
            }
        })
        .await;
        // It died in the commit hook, inside a shared commit (the log is appended across runs).
        assert_eq!(
            agent
                .log()
                .matches("crash hook: inside a coalesced commit")
                .count(),
            n + 1,
            "{step}"
        );
        let client = agent.client();
        for v in &vols {
            // The interrupted claims and releases are driven to their ends at start.
            let status = wait_settled(&client, v).await;
            assert!(status.claims.len() <= 1, "{step}: {v}: {status:#?}");
            for c in &status.claims {
                assert_eq!(
                    published(&status),
                    BTreeSet::from([(
                        "rw-file-system-single-node-writer".to_string(),
                        c.alloc_id.clone()
                    )]),
                    "{step}: {v}"
                );
                // The caller's retry answers a mounted target.
                let r = client
                    .claim_volume(
                        v,
                        &claim_req(&c.alloc_id, AccessMode::SingleNodeWriter, false),
                    )
                    .await
                    .unwrap_or_else(|e| panic!("{step}: {v}: retry: {e}"));
                assert!(
                    agent.namespace().mount_at(&r.target).is_some(),
                    "{step}: {v}: not mounted"
                );
                release(&client, v, &c.alloc_id).await;
            }
            let left: Vec<PathBuf> = mounts_under(&agent, &agent.data_dir)
                .into_iter()
                .filter(|p| p.to_string_lossy().contains(&format!("/{v}/")))
                .collect();
            assert!(left.is_empty(), "{step}: {v}: leaked {left:?}");
        }
    }
}
