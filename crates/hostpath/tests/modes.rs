//! The positional `MODE`: a `node` plugin serves Identity and Node only, a `controller` plugin
//! Identity and Controller only; the service left out answers UNIMPLEMENTED. Also the klog
//! flags Kubernetes CSI images take, on the real binary.

mod common;

use std::process::Command;

use berth_csi::pb::{self, plugin_capability};
use berth_testkit::{HostpathPlugin, bin_path};
use common::*;
use tonic::Code;

/// The service types GetPluginCapabilities lists.
async fn advertised_services(c: &mut Clients) -> Vec<plugin_capability::service::Type> {
    let caps = ok(c
        .identity
        .get_plugin_capabilities(pb::GetPluginCapabilitiesRequest {})
        .await);
    caps.capabilities
        .into_iter()
        .filter_map(|cap| match cap.r#type {
            Some(plugin_capability::Type::Service(s)) => Some(s.r#type()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn node_mode_serves_identity_and_node_only() {
    // As aws-ebs-csi-driver's node job passes them (the builder gives --endpoint).
    let plugin = HostpathPlugin::builder()
        .arg("node")
        .arg("--logtostderr")
        .arg("--v=5")
        .spawn()
        .await;
    let mut c = clients(&plugin).await;

    let services = advertised_services(&mut c).await;
    assert!(
        !services.contains(&plugin_capability::service::Type::ControllerService),
        "{services:?}"
    );
    assert!(
        services.contains(&plugin_capability::service::Type::VolumeAccessibilityConstraints),
        "{services:?}"
    );
    assert_eq!(
        ok(c.identity.probe(pb::ProbeRequest {}).await).ready,
        Some(true)
    );

    fails(
        c.controller
            .controller_get_capabilities(pb::ControllerGetCapabilitiesRequest {})
            .await,
        Code::Unimplemented,
    );
    fails(
        c.controller.create_volume(create_req("v")).await,
        Code::Unimplemented,
    );

    let info = ok(c.node.node_get_info(pb::NodeGetInfoRequest {}).await);
    assert_eq!(info.node_id, plugin.nodeid());
    ok(c.node
        .node_get_capabilities(pb::NodeGetCapabilitiesRequest {})
        .await);
}

#[tokio::test]
async fn controller_mode_serves_identity_and_controller_only() {
    let plugin = HostpathPlugin::builder().arg("controller").spawn().await;
    let mut c = clients(&plugin).await;

    let services = advertised_services(&mut c).await;
    assert!(
        services.contains(&plugin_capability::service::Type::ControllerService),
        "{services:?}"
    );
    assert_eq!(
        ok(c.identity.probe(pb::ProbeRequest {}).await).ready,
        Some(true)
    );

    ok(c.controller
        .controller_get_capabilities(pb::ControllerGetCapabilitiesRequest {})
        .await);
    let volume = create(&mut c, "v").await;

    fails(
        c.node.node_get_info(pb::NodeGetInfoRequest {}).await,
        Code::Unimplemented,
    );
    fails(
        c.node
            .node_get_capabilities(pb::NodeGetCapabilitiesRequest {})
            .await,
        Code::Unimplemented,
    );
    let staging = plugin.tmp().join("staging");
    fails(
        c.node
            .node_stage_volume(stage_req(&volume.volume_id, &staging, rw()))
            .await,
        Code::Unimplemented,
    );
    assert!(plugin.mountinfo().iter().all(|e| e.mount_point != staging));
}

#[tokio::test]
async fn kubernetes_csi_hostpath_flags_start_a_full_plugin() {
    // As the Kubernetes csi-hostpath job passes them, besides the builder's --endpoint and
    // --nodeid.
    let plugin = HostpathPlugin::builder()
        .arg("--drivername=csi-hostpath")
        .arg("--v=5")
        .spawn()
        .await;
    let mut c = clients(&plugin).await;
    let info = ok(c
        .identity
        .get_plugin_info(pb::GetPluginInfoRequest {})
        .await);
    assert_eq!(info.name, "csi-hostpath");
    assert!(
        advertised_services(&mut c)
            .await
            .contains(&plugin_capability::service::Type::ControllerService)
    );
    ok(c.controller
        .controller_get_capabilities(pb::ControllerGetCapabilitiesRequest {})
        .await);
    ok(c.node.node_get_info(pb::NodeGetInfoRequest {}).await);
}

#[test]
fn logtostderr_false_is_refused() {
    let out = Command::new(bin_path("berth-hostpath"))
        .args([
            "node",
            "--endpoint=unix:///nonexistent/csi.sock",
            "--logtostderr=false",
        ])
        .output()
        .expect("run berth-hostpath");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--logtostderr") && stderr.contains("always logs to stderr"),
        "{stderr}"
    );
}
