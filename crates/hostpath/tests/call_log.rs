//! The call log (`--call-log`), on the real `berth-hostpath` process.

mod common;

use berth_csi::pb;
use berth_hostpath::calllog::{self, Call};
use std::time::Duration;

use berth_testkit::{HostpathPlugin, assert_eventually};
use common::*;
use tonic::Code;

/// Identity and capability calls that clients make on their own.
const HOUSEKEEPING: &[&str] = &[
    "Probe",
    "GetPluginInfo",
    "GetPluginCapabilities",
    "NodeGetCapabilities",
    "ControllerGetCapabilities",
    "NodeGetInfo",
];

fn calls(plugin: &HostpathPlugin) -> Vec<Call> {
    let path = plugin.call_log().expect("the plugin has a call log");
    calllog::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The calls except [`HOUSEKEEPING`], as `(rpc, volume_id, code)`.
fn volume_calls(plugin: &HostpathPlugin) -> Vec<(String, Option<String>, String)> {
    calls(plugin)
        .into_iter()
        .filter(|c| !HOUSEKEEPING.contains(&c.rpc.as_str()))
        .map(|c| (c.rpc, c.volume_id, c.code))
        .collect()
}

fn line(rpc: &str, id: Option<&str>, code: &str) -> (String, Option<String>, String) {
    (rpc.to_owned(), id.map(str::to_owned), code.to_owned())
}

#[tokio::test]
async fn a_volume_cycle_is_logged_in_order() {
    let plugin = HostpathPlugin::builder()
        .call_log("calls.log")
        .spawn()
        .await;
    let mut c = clients(&plugin).await;
    ok(c.identity.probe(pb::ProbeRequest {}).await);
    ok(c.node.node_get_info(pb::NodeGetInfoRequest {}).await);
    let id = create(&mut c, "cycle").await.volume_id;
    let node = plugin.nodeid().to_owned();
    ok(c.controller
        .controller_publish_volume(publish_req(&id, &node, false))
        .await);
    let staging = plugin.tmp().join("staging");
    let target = plugin.tmp().join("target");
    stage_and_publish(&mut c, &id, &staging, &target).await;
    ok(c.node
        .node_unpublish_volume(node_unpublish_req(&id, &target))
        .await);
    ok(c.node.node_unstage_volume(unstage_req(&id, &staging)).await);
    ok(c.controller
        .controller_unpublish_volume(unpublish_req(&id, &node))
        .await);

    let all = calls(&plugin);
    assert_eq!(
        &all[..2],
        [
            Call {
                rpc: "Probe".into(),
                volume_id: None,
                code: "OK".into()
            },
            Call {
                rpc: "NodeGetInfo".into(),
                volume_id: None,
                code: "OK".into()
            },
        ]
    );
    let id = Some(id.as_str());
    assert_eq!(
        volume_calls(&plugin),
        [
            line("CreateVolume", None, "OK"),
            line("ControllerPublishVolume", id, "OK"),
            line("NodeStageVolume", id, "OK"),
            line("NodePublishVolume", id, "OK"),
            line("NodeUnpublishVolume", id, "OK"),
            line("NodeUnstageVolume", id, "OK"),
            line("ControllerUnpublishVolume", id, "OK"),
        ]
    );
    // Only names, ids and codes: no paths.
    let text = std::fs::read_to_string(plugin.call_log().expect("path")).expect("read");
    assert!(
        !text.contains(plugin.tmp().to_str().expect("utf-8")),
        "{text}"
    );
}

#[tokio::test]
async fn injected_failures_show_their_code_then_ok() {
    let plugin = HostpathPlugin::builder()
        .fault("NodeUnpublishVolume:UNAVAILABLE:2")
        .call_log("calls.log")
        .stage(false)
        .attach(false)
        .spawn()
        .await;
    let mut c = clients(&plugin).await;
    let id = create(&mut c, "retried").await.volume_id;
    let target = plugin.tmp().join("target");
    ok(c.node
        .node_publish_volume(node_publish_req(&id, None, &target, rw(), false))
        .await);
    for _ in 0..2 {
        fails(
            c.node
                .node_unpublish_volume(node_unpublish_req(&id, &target))
                .await,
            Code::Unavailable,
        );
    }
    ok(c.node
        .node_unpublish_volume(node_unpublish_req(&id, &target))
        .await);
    let id = Some(id.as_str());
    assert_eq!(
        volume_calls(&plugin),
        [
            line("CreateVolume", None, "OK"),
            line("NodePublishVolume", id, "OK"),
            line("NodeUnpublishVolume", id, "UNAVAILABLE"),
            line("NodeUnpublishVolume", id, "UNAVAILABLE"),
            line("NodeUnpublishVolume", id, "OK"),
        ]
    );
    let last = calls(&plugin).pop().expect("a call");
    assert!(last.is_ok());
    assert_eq!(last.grpc_code(), Some(Code::Ok));
}

#[tokio::test]
async fn the_environment_sets_the_call_log_and_every_service_is_logged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("calls");
    let plugin = HostpathPlugin::builder()
        .env("BERTH_HOSTPATH_CALL_LOG", &path)
        .spawn()
        .await;
    let mut c = clients(&plugin).await;
    ok(c.identity
        .get_plugin_info(pb::GetPluginInfoRequest {})
        .await);
    ok(c.identity
        .get_plugin_capabilities(pb::GetPluginCapabilitiesRequest {})
        .await);
    ok(c.node
        .node_get_capabilities(pb::NodeGetCapabilitiesRequest {})
        .await);
    ok(c.controller
        .controller_get_capabilities(pb::ControllerGetCapabilitiesRequest {})
        .await);
    fails(
        c.controller
            .delete_volume(pb::DeleteVolumeRequest {
                volume_id: String::new(),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
    );
    let logged: Vec<String> = calllog::read(&path)
        .expect("read")
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        logged,
        [
            "GetPluginInfo - OK",
            "GetPluginCapabilities - OK",
            "NodeGetCapabilities - OK",
            "ControllerGetCapabilities - OK",
            "DeleteVolume - INVALID_ARGUMENT",
        ]
    );
}

#[tokio::test]
async fn a_call_whose_caller_goes_away_is_logged_as_cancelled() {
    let plugin = HostpathPlugin::builder()
        .fault("NodeStageVolume:hang:1")
        .call_log("calls.log")
        .spawn()
        .await;
    let c = clients(&plugin).await;
    let staging = plugin.tmp().join("s");
    let mut node = c.node.clone();
    let call = tokio::spawn(async move {
        node.node_stage_volume(stage_req("v1", &staging, rw()))
            .await
    });
    let hanging = "injecting hang";
    assert_eventually!(
        Duration::from_secs(5),
        || async { plugin.stderr_text().contains(hanging) },
        "the plugin logs {hanging:?}"
    );
    call.abort();
    assert_eventually!(
        Duration::from_secs(5),
        || async { !volume_calls(&plugin).is_empty() },
        "a line for the abandoned call"
    );
    assert_eq!(
        volume_calls(&plugin),
        [line("NodeStageVolume", Some("v1"), "CANCELLED")]
    );
}
