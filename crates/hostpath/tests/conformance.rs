//! CSI conformance of the real `berth-hostpath` process, over its unix socket, with the raw
//! generated clients. Every plugin runs in its own private mount namespace (see testkit); mounts
//! are checked in its mount table and used through `/proc/<pid>/root`.

mod common;

use std::{
    collections::HashMap, fs, io, os::unix::fs::PermissionsExt as _, path::Path, time::Duration,
};

use berth_csi::pb::{
    self, controller_service_capability, node_service_capability, plugin_capability,
    volume_capability::access_mode::Mode, volume_content_source, volume_usage::Unit,
};
use berth_testkit::HostpathPlugin;
use common::*;
use tonic::Code;

fn controller_rpcs(caps: &[pb::ControllerServiceCapability]) -> Vec<i32> {
    let mut types: Vec<i32> = caps
        .iter()
        .filter_map(|c| {
            c.r#type
                .map(|controller_service_capability::Type::Rpc(r)| r.r#type)
        })
        .collect();
    types.sort_unstable();
    types
}

fn node_rpcs(caps: &[pb::NodeServiceCapability]) -> Vec<i32> {
    let mut types: Vec<i32> = caps
        .iter()
        .filter_map(|c| {
            c.r#type
                .map(|node_service_capability::Type::Rpc(r)| r.r#type)
        })
        .collect();
    types.sort_unstable();
    types
}

fn sorted(types: &[i32]) -> Vec<i32> {
    let mut v = types.to_vec();
    v.sort_unstable();
    v
}

#[tokio::test]
async fn identity_reports_name_capabilities_and_readiness() {
    let plugin = HostpathPlugin::builder().spawn().await;
    let mut c = clients(&plugin).await;

    let info = ok(c
        .identity
        .get_plugin_info(pb::GetPluginInfoRequest {})
        .await);
    assert_eq!(info.name, "hostpath.csi.berth.dev");
    assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));

    let caps = ok(c
        .identity
        .get_plugin_capabilities(pb::GetPluginCapabilitiesRequest {})
        .await);
    use plugin_capability::{Type, service, volume_expansion};
    let mut services = Vec::new();
    let mut expansion = Vec::new();
    for cap in caps.capabilities {
        match cap.r#type {
            Some(Type::Service(s)) => services.push(s.r#type),
            Some(Type::VolumeExpansion(e)) => expansion.push(e.r#type),
            None => panic!("capability without a type"),
        }
    }
    assert_eq!(
        sorted(&services),
        vec![
            service::Type::ControllerService as i32,
            service::Type::VolumeAccessibilityConstraints as i32
        ]
    );
    assert_eq!(expansion, vec![volume_expansion::Type::Online as i32]);

    for _ in 0..2 {
        let probe = ok(c.identity.probe(pb::ProbeRequest {}).await);
        assert_eq!(probe.ready, Some(true));
    }

    let info = ok(c.node.node_get_info(pb::NodeGetInfoRequest {}).await);
    assert_eq!(info.node_id, plugin.nodeid());
    assert_eq!(info.max_volumes_per_node, 0);
    assert_eq!(info.accessible_topology, Some(topology(plugin.nodeid())));

    let mode = fs::metadata(plugin.socket())
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "socket permissions");
}

#[tokio::test]
async fn advertised_capabilities_match_what_is_implemented() {
    use controller_service_capability::rpc::Type as C;
    use node_service_capability::rpc::Type as N;
    let plugin = HostpathPlugin::builder().spawn().await;
    let mut c = clients(&plugin).await;

    let caps = ok(c
        .controller
        .controller_get_capabilities(pb::ControllerGetCapabilitiesRequest {})
        .await);
    let expected = [
        C::CreateDeleteVolume,
        C::PublishUnpublishVolume,
        C::ListVolumes,
        C::GetCapacity,
        C::CreateDeleteSnapshot,
        C::ListSnapshots,
        C::CloneVolume,
        C::ExpandVolume,
        C::ListVolumesPublishedNodes,
        C::GetVolume,
        C::SingleNodeMultiWriter,
    ]
    .map(|t| t as i32);
    assert_eq!(controller_rpcs(&caps.capabilities), sorted(&expected));

    let caps = ok(c
        .node
        .node_get_capabilities(pb::NodeGetCapabilitiesRequest {})
        .await);
    let expected = [
        N::StageUnstageVolume,
        N::GetVolumeStats,
        N::ExpandVolume,
        N::VolumeCondition,
        N::SingleNodeMultiWriter,
    ]
    .map(|t| t as i32);
    assert_eq!(node_rpcs(&caps.capabilities), sorted(&expected));

    // What is not advertised is not implemented.
    let r = c
        .controller
        .get_snapshot(pb::GetSnapshotRequest {
            snapshot_id: "s".into(),
            ..Default::default()
        })
        .await;
    fails(r, Code::Unimplemented);
    let r = c
        .controller
        .controller_modify_volume(pb::ControllerModifyVolumeRequest {
            volume_id: "v".into(),
            ..Default::default()
        })
        .await;
    fails(r, Code::Unimplemented);
}

#[tokio::test]
async fn create_volume_checks_its_arguments() {
    let plugin = HostpathPlugin::builder()
        .arg("--max-volume-size=100Mi")
        .spawn()
        .await;
    let mut c = clients(&plugin).await;
    let mut invalid = vec![
        (
            "no name",
            pb::CreateVolumeRequest {
                name: String::new(),
                ..create_req("x")
            },
        ),
        (
            "no capabilities",
            pb::CreateVolumeRequest {
                volume_capabilities: vec![],
                ..create_req("x")
            },
        ),
        (
            "block",
            pb::CreateVolumeRequest {
                volume_capabilities: vec![rw(), block_cap()],
                ..create_req("x")
            },
        ),
        ("name too long", create_req(&"n".repeat(129))),
        (
            "bad capacity",
            pb::CreateVolumeRequest {
                capacity_range: Some(pb::CapacityRange {
                    required_bytes: -1,
                    limit_bytes: 0,
                }),
                ..create_req("x")
            },
        ),
        (
            "empty source",
            pb::CreateVolumeRequest {
                volume_content_source: Some(pb::VolumeContentSource { r#type: None }),
                ..create_req("x")
            },
        ),
    ];
    let mut no_mode = rw();
    no_mode.access_mode = None;
    invalid.push((
        "no access mode",
        pb::CreateVolumeRequest {
            volume_capabilities: vec![no_mode],
            ..create_req("x")
        },
    ));
    let mut no_type = rw();
    no_type.access_type = None;
    invalid.push((
        "no access type",
        pb::CreateVolumeRequest {
            volume_capabilities: vec![no_type],
            ..create_req("x")
        },
    ));
    let state_before = fs::read(plugin.statedir().join("state.json")).ok();
    for (what, req) in invalid {
        let status = c.controller.create_volume(req).await.expect_err(what);
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{what}: {}",
            status.message()
        );
    }
    // Refused requests leave the plugin's state file as it was.
    assert_eq!(
        fs::read(plugin.statedir().join("state.json")).ok(),
        state_before
    );

    let range = |required_bytes, limit_bytes| pb::CreateVolumeRequest {
        capacity_range: Some(pb::CapacityRange {
            required_bytes,
            limit_bytes,
        }),
        ..create_req("x")
    };
    fails(
        c.controller.create_volume(range(20 * MIB, 10 * MIB)).await,
        Code::OutOfRange,
    );
    let msg = fails(
        c.controller.create_volume(range(200 * MIB, 0)).await,
        Code::OutOfRange,
    );
    assert!(msg.contains("maximum volume size"), "{msg}");

    let from = |source| pb::CreateVolumeRequest {
        volume_content_source: Some(pb::VolumeContentSource {
            r#type: Some(source),
        }),
        ..create_req("x")
    };
    use volume_content_source::{SnapshotSource, Type, VolumeSource};
    let r = c
        .controller
        .create_volume(from(Type::Snapshot(SnapshotSource {
            snapshot_id: "snap-none".into(),
        })))
        .await;
    fails(r, Code::NotFound);
    let r = c
        .controller
        .create_volume(from(Type::Volume(VolumeSource {
            volume_id: "vol-none".into(),
        })))
        .await;
    fails(r, Code::NotFound);

    let elsewhere = pb::CreateVolumeRequest {
        accessibility_requirements: Some(pb::TopologyRequirement {
            requisite: vec![topology("another-node")],
            preferred: vec![],
        }),
        ..create_req("x")
    };
    fails(
        c.controller.create_volume(elsewhere).await,
        Code::ResourceExhausted,
    );

    // Nothing was created by the failed calls.
    let list = ok(c
        .controller
        .list_volumes(pb::ListVolumesRequest::default())
        .await);
    assert!(list.entries.is_empty(), "{list:?}");
    let dirs = fs::read_dir(plugin.statedir().join("volumes"))
        .expect("volumes dir")
        .count();
    assert_eq!(dirs, 0);

    // With max-volume-size and no range, the default size is capped.
    let v = create(&mut c, "capped").await;
    assert_eq!(v.capacity_bytes, 100 * MIB);
}

#[tokio::test]
async fn create_volume_is_idempotent_by_name() {
    let plugin = HostpathPlugin::builder().spawn().await;
    let mut c = clients(&plugin).await;
    let req = pb::CreateVolumeRequest {
        capacity_range: Some(pb::CapacityRange {
            required_bytes: 10 * MIB,
            limit_bytes: 0,
        }),
        parameters: HashMap::from([("tier".into(), "fast".into())]),
        accessibility_requirements: Some(pb::TopologyRequirement {
            requisite: vec![topology(plugin.nodeid())],
            preferred: vec![topology(plugin.nodeid())],
        }),
        ..create_req("pvc-1")
    };
    let first = ok(c.controller.create_volume(req.clone()).await)
        .volume
        .expect("volume");
    assert_eq!(first.capacity_bytes, 10 * MIB);
    assert_eq!(first.accessible_topology, vec![topology(plugin.nodeid())]);
    let dir = plugin.statedir().join("volumes").join(&first.volume_id);
    assert!(dir.is_dir(), "{}", dir.display());
    fs::write(dir.join("data"), b"keep me").expect("write into the volume");

    let again = ok(c.controller.create_volume(req.clone()).await)
        .volume
        .expect("volume");
    assert_eq!(again, first);
    assert_eq!(
        fs::read(dir.join("data")).expect("data"),
        b"keep me",
        "not recreated"
    );
    let list = ok(c
        .controller
        .list_volumes(pb::ListVolumesRequest::default())
        .await);
    assert_eq!(list.entries.len(), 1);

    let bigger = pb::CreateVolumeRequest {
        capacity_range: Some(pb::CapacityRange {
            required_bytes: 20 * MIB,
            limit_bytes: 0,
        }),
        ..req.clone()
    };
    fails(
        c.controller.create_volume(bigger).await,
        Code::AlreadyExists,
    );
    let other_params = pb::CreateVolumeRequest {
        parameters: HashMap::new(),
        ..req.clone()
    };
    fails(
        c.controller.create_volume(other_params).await,
        Code::AlreadyExists,
    );
    let clone = pb::CreateVolumeRequest {
        volume_content_source: Some(pb::VolumeContentSource {
            r#type: Some(volume_content_source::Type::Volume(
                volume_content_source::VolumeSource {
                    volume_id: first.volume_id.clone(),
                },
            )),
        }),
        ..req.clone()
    };
    fails(c.controller.create_volume(clone).await, Code::AlreadyExists);

    // A range the existing volume fits in is compatible.
    let fitting = pb::CreateVolumeRequest {
        capacity_range: Some(pb::CapacityRange {
            required_bytes: MIB,
            limit_bytes: 10 * MIB,
        }),
        ..req
    };
    assert_eq!(
        ok(c.controller.create_volume(fitting).await).volume,
        Some(first)
    );
}

#[tokio::test]
async fn concurrent_creates_of_one_name_make_one_volume() {
    let plugin = HostpathPlugin::builder().spawn().await;
    let c = clients(&plugin).await;
    let calls = (0..8).map(|i| {
        let mut c = c.clone();
        async move {
            let name = if i % 2 == 0 { "shared" } else { "other" };
            ok(c.controller.create_volume(create_req(name)).await)
                .volume
                .expect("volume")
        }
    });
    let volumes = futures::future::join_all(calls).await;
    let mut ids: Vec<_> = volumes.iter().map(|v| v.volume_id.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert_eq!(
        fs::read_dir(plugin.statedir().join("volumes"))
            .expect("dir")
            .count(),
        2
    );
}

#[tokio::test]
async fn delete_volume_is_idempotent_and_refuses_volumes_in_use() {
    let plugin = HostpathPlugin::builder().spawn().await;
    let mut c = clients(&plugin).await;
    let del = |id: &str| pb::DeleteVolumeRequest {
        volume_id: id.into(),
        ..Default::default()
    };

    fails(
        c.controller.delete_volume(del("")).await,
        Code::InvalidArgument,
    );
    fails(
        c.controller.delete_volume(del("../etc")).await,
        Code::InvalidArgument,
    );
    ok(c.controller.delete_volume(del("vol-unknown")).await);

    let v = create(&mut c, "doomed").await;
    let id = v.volume_id.as_str();
    ok(c.controller
        .controller_publish_volume(publish_req(id, plugin.nodeid(), false))
        .await);
    let msg = fails(
        c.controller.delete_volume(del(id)).await,
        Code::FailedPrecondition,
    );
    assert!(msg.contains(plugin.nodeid()), "{msg}");
    ok(c.controller
        .controller_unpublish_volume(unpublish_req(id, plugin.nodeid()))
        .await);

    ok(c.controller.delete_volume(del(id)).await);
    assert!(!plugin.statedir().join("volumes").join(id).exists());
    let list = ok(c
        .controller
        .list_volumes(pb::ListVolumesRequest::default())
        .await);
    assert!(list.entries.is_empty());
    ok(c.controller.delete_volume(del(id)).await);
    let r = c
        .controller
        .controller_get_volume(pb::ControllerGetVolumeRequest {
            volume_id: id.into(),
        })
        .await;
    fails(r, Code::NotFound);
}

#[tokio::test]
async fn clones_and_snapshots_copy_the_data() {
    let plugin = HostpathPlugin::builder().spawn().await;
    let mut c = clients(&plugin).await;
    let vols = plugin.statedir().join("volumes");
    let src = create(&mut c, "source").await;
    fs::create_dir(vols.join(&src.volume_id).join("sub")).expect("mkdir");
    fs::write(vols.join(&src.volume_id).join("sub/file"), b"original").expect("write");

    use volume_content_source::{SnapshotSource, Type, VolumeSource};
    let from =
        |name: &str, source: Type, range: Option<pb::CapacityRange>| pb::CreateVolumeRequest {
            capacity_range: range,
            volume_content_source: Some(pb::VolumeContentSource {
                r#type: Some(source),
            }),
            ..create_req(name)
        };
    let by_volume = Type::Volume(VolumeSource {
        volume_id: src.volume_id.clone(),
    });
    let clone = ok(c
        .controller
        .create_volume(from("clone", by_volume.clone(), None))
        .await)
    .volume
    .expect("volume");
    assert_eq!(clone.capacity_bytes, src.capacity_bytes);
    assert_eq!(
        clone.content_source.as_ref().and_then(|s| s.r#type.clone()),
        Some(by_volume.clone())
    );
    assert_eq!(
        fs::read(vols.join(&clone.volume_id).join("sub/file")).expect("read"),
        b"original"
    );
    let small = Some(pb::CapacityRange {
        required_bytes: MIB,
        limit_bytes: MIB,
    });
    fails(
        c.controller
            .create_volume(from("too-small", by_volume, small))
            .await,
        Code::OutOfRange,
    );

    let snap = ok(c
        .controller
        .create_snapshot(pb::CreateSnapshotRequest {
            source_volume_id: src.volume_id.clone(),
            name: "snap-1".into(),
            ..Default::default()
        })
        .await)
    .snapshot
    .expect("snapshot");
    assert!(snap.ready_to_use);
    assert_eq!(snap.source_volume_id, src.volume_id);
    assert_eq!(snap.size_bytes, src.capacity_bytes);
    assert!(snap.creation_time.is_some());

    // The snapshot is a point-in-time copy.
    fs::write(vols.join(&src.volume_id).join("sub/file"), b"changed").expect("write");
    let by_snap = Type::Snapshot(SnapshotSource {
        snapshot_id: snap.snapshot_id.clone(),
    });
    let restored = ok(c
        .controller
        .create_volume(from("restored", by_snap, None))
        .await)
    .volume
    .expect("volume");
    assert_eq!(
        fs::read(vols.join(&restored.volume_id).join("sub/file")).expect("read"),
        b"original"
    );
    let mode = fs::metadata(vols.join(&restored.volume_id))
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o777,
        0o777,
        "volume roots are writable by workloads"
    );

    // Deleting the source keeps its snapshots usable.
    let del = pb::DeleteVolumeRequest {
        volume_id: src.volume_id.clone(),
        ..Default::default()
    };
    ok(c.controller.delete_volume(del).await);
    let by_snap = Type::Snapshot(SnapshotSource {
        snapshot_id: snap.snapshot_id.clone(),
    });
    ok(c.controller
        .create_volume(from("restored-2", by_snap, None))
        .await);
}

#[tokio::test]
async fn controller_publish_and_unpublish() {
    let plugin = HostpathPlugin::builder()
        .arg("--max-volumes-per-node=2")
        .spawn()
        .await;
    let mut c = clients(&plugin).await;
    let node = plugin.nodeid().to_owned();
    let v = create(&mut c, "attached").await;
    let id = v.volume_id.as_str();

    for (what, req) in [
        ("no volume id", publish_req("", &node, false)),
        ("no node id", publish_req(id, "", false)),
        (
            "no capability",
            pb::ControllerPublishVolumeRequest {
                volume_capability: None,
                ..publish_req(id, &node, false)
            },
        ),
        (
            "block",
            pb::ControllerPublishVolumeRequest {
                volume_capability: Some(block_cap()),
                ..publish_req(id, &node, false)
            },
        ),
    ] {
        let status = c
            .controller
            .controller_publish_volume(req)
            .await
            .expect_err(what);
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{what}: {}",
            status.message()
        );
    }
    fails(
        c.controller
            .controller_publish_volume(publish_req("vol-none", &node, false))
            .await,
        Code::NotFound,
    );
    fails(
        c.controller
            .controller_publish_volume(publish_req(id, "other-node", false))
            .await,
        Code::NotFound,
    );

    let first = ok(c
        .controller
        .controller_publish_volume(publish_req(id, &node, false))
        .await);
    assert_eq!(
        first.publish_context,
        HashMap::from([(
            berth_hostpath::PUBLISH_CONTEXT_NODE_KEY.to_owned(),
            node.clone()
        )])
    );
    let again = ok(c
        .controller
        .controller_publish_volume(publish_req(id, &node, false))
        .await);
    assert_eq!(again, first);
    fails(
        c.controller
            .controller_publish_volume(publish_req(id, &node, true))
            .await,
        Code::AlreadyExists,
    );
    let other_mode = pb::ControllerPublishVolumeRequest {
        volume_capability: Some(mount_cap(Mode::MultiNodeReaderOnly)),
        ..publish_req(id, &node, false)
    };
    fails(
        c.controller.controller_publish_volume(other_mode).await,
        Code::AlreadyExists,
    );

    let got = ok(c
        .controller
        .controller_get_volume(pb::ControllerGetVolumeRequest {
            volume_id: id.into(),
        })
        .await);
    assert_eq!(got.volume.as_ref().map(|v| v.volume_id.as_str()), Some(id));
    let status = got.status.expect("status");
    assert_eq!(status.published_node_ids, vec![node.clone()]);
    assert_eq!(status.volume_condition.map(|c| c.abnormal), Some(false));
    let list = ok(c
        .controller
        .list_volumes(pb::ListVolumesRequest::default())
        .await);
    assert_eq!(
        list.entries[0]
            .status
            .as_ref()
            .map(|s| s.published_node_ids.clone()),
        Some(vec![node.clone()])
    );

    // --max-volumes-per-node=2
    let v2 = create(&mut c, "attached-2").await;
    let v3 = create(&mut c, "attached-3").await;
    ok(c.controller
        .controller_publish_volume(publish_req(&v2.volume_id, &node, false))
        .await);
    fails(
        c.controller
            .controller_publish_volume(publish_req(&v3.volume_id, &node, false))
            .await,
        Code::ResourceExhausted,
    );

    fails(
        c.controller
            .controller_unpublish_volume(unpublish_req("", &node))
            .await,
        Code::InvalidArgument,
    );
    ok(c.controller
        .controller_unpublish_volume(unpublish_req(id, &node))
        .await);
    ok(c.controller
        .controller_unpublish_volume(unpublish_req(id, &node))
        .await);
    ok(c.controller
        .controller_unpublish_volume(unpublish_req("vol-none", &node))
        .await);
    ok(c.controller
        .controller_unpublish_volume(unpublish_req(id, "other-node"))
        .await);
    // No node id: unpublish from every node.
    ok(c.controller
        .controller_unpublish_volume(unpublish_req(&v2.volume_id, ""))
        .await);
    let list = ok(c
        .controller
        .list_volumes(pb::ListVolumesRequest::default())
        .await);
    for e in list.entries {
        assert_eq!(e.status.map(|s| s.published_node_ids), Some(vec![]));
    }
    ok(c.controller
        .controller_publish_volume(publish_req(&v3.volume_id, &node, false))
        .await);
}

#[tokio::test]
async fn validate_volume_capabilities() {
    let plugin = HostpathPlugin::builder().spawn().await;
    let mut c = clients(&plugin).await;
    let v = create(&mut c, "v").await;
    let req = |id: &str, caps: Vec<pb::VolumeCapability>| pb::ValidateVolumeCapabilitiesRequest {
        volume_id: id.into(),
        volume_capabilities: caps,
        ..Default::default()
    };
    fails(
        c.controller
            .validate_volume_capabilities(req("", vec![rw()]))
            .await,
        Code::InvalidArgument,
    );
    fails(
        c.controller
            .validate_volume_capabilities(req(&v.volume_id, vec![]))
            .await,
        Code::InvalidArgument,
    );
    let mut no_mode = rw();
    no_mode.access_mode = None;
    fails(
        c.controller
            .validate_volume_capabilities(req(&v.volume_id, vec![no_mode]))
            .await,
        Code::InvalidArgument,
    );
    fails(
        c.controller
            .validate_volume_capabilities(req("vol-none", vec![rw()]))
            .await,
        Code::NotFound,
    );

    let all = vec![
        rw(),
        mount_cap(Mode::MultiNodeMultiWriter),
        mount_cap(Mode::SingleNodeMultiWriter),
        mount_cap(Mode::SingleNodeReaderOnly),
    ];
    for _ in 0..2 {
        let r = ok(c
            .controller
            .validate_volume_capabilities(req(&v.volume_id, all.clone()))
            .await);
        let confirmed = r.confirmed.expect("confirmed");
        assert_eq!(confirmed.volume_capabilities, all);
    }
    let r = ok(c
        .controller
        .validate_volume_capabilities(req(&v.volume_id, vec![rw(), block_cap()]))
        .await);
    assert!(r.confirmed.is_none());
    assert!(r.message.contains("block"), "{}", r.message);
}

#[tokio::test]
async fn list_volumes_pages_and_rejects_bad_tokens() {
    let plugin = HostpathPlugin::builder().spawn().await;
    let mut c = clients(&plugin).await;
    let mut created = Vec::new();
    for i in 0..5 {
        created.push(create(&mut c, &format!("vol-{i}")).await.volume_id);
    }
    created.sort();

    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = ok(c
            .controller
            .list_volumes(pb::ListVolumesRequest {
                max_entries: 2,
                starting_token: token.clone(),
            })
            .await);
        assert!(page.entries.len() <= 2);
        seen.extend(
            page.entries
                .into_iter()
                .map(|e| e.volume.expect("volume").volume_id),
        );
        pages += 1;
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, created);

    let all = ok(c
        .controller
        .list_volumes(pb::ListVolumesRequest::default())
        .await);
    assert_eq!(all.entries.len(), 5);
    assert!(all.next_token.is_empty());

    let bad = pb::ListVolumesRequest {
        max_entries: 0,
        starting_token: "not-a-token".into(),
    };
    fails(c.controller.list_volumes(bad).await, Code::Aborted);
    let negative = pb::ListVolumesRequest {
        max_entries: -1,
        starting_token: String::new(),
    };
    fails(
        c.controller.list_volumes(negative).await,
        Code::InvalidArgument,
    );
}

#[tokio::test]
async fn get_capacity_accounts_for_volumes() {
    let plugin = HostpathPlugin::builder()
        .arg("--capacity=10Gi")
        .arg("--max-volume-size=4Gi")
        .spawn()
        .await;
    let mut c = clients(&plugin).await;
    let cap =
        |caps: Vec<pb::VolumeCapability>, topo: Option<pb::Topology>| pb::GetCapacityRequest {
            volume_capabilities: caps,
            parameters: HashMap::new(),
            accessible_topology: topo,
        };
    let r = ok(c.controller.get_capacity(cap(vec![], None)).await);
    assert_eq!(r.available_capacity, 10 * GIB);
    assert_eq!(r.maximum_volume_size, Some(4 * GIB));

    create(&mut c, "one-gib").await;
    let r = ok(c
        .controller
        .get_capacity(cap(vec![rw()], Some(topology(plugin.nodeid()))))
        .await);
    assert_eq!(r.available_capacity, 9 * GIB);
    let r = ok(c
        .controller
        .get_capacity(cap(vec![block_cap()], None))
        .await);
    assert_eq!(r.available_capacity, 0);
    let r = ok(c
        .controller
        .get_capacity(cap(vec![], Some(topology("elsewhere"))))
        .await);
    assert_eq!(r.available_capacity, 0);

    // The pool is enforced.
    for i in 0..2 {
        let req = pb::CreateVolumeRequest {
            capacity_range: Some(pb::CapacityRange {
                required_bytes: 4 * GIB,
                limit_bytes: 0,
            }),
            ..create_req(&format!("big-{i}"))
        };
        ok(c.controller.create_volume(req).await);
    }
    let req = pb::CreateVolumeRequest {
        capacity_range: Some(pb::CapacityRange {
            required_bytes: 2 * GIB,
            limit_bytes: 0,
        }),
        ..create_req("too-much")
    };
    fails(
        c.controller.create_volume(req).await,
        Code::ResourceExhausted,
    );
}

#[tokio::test]
async fn get_capacity_defaults_to_free_space() {
    let plugin = HostpathPlugin::builder().spawn().await;
    let mut c = clients(&plugin).await;
    let r = ok(c
        .controller
        .get_capacity(pb::GetCapacityRequest::default())
        .await);
    assert!(r.available_capacity > 0, "{r:?}");
    assert_eq!(r.maximum_volume_size, None);
}

#[tokio::test]
async fn controller_expand_volume() {
    let plugin = HostpathPlugin::builder()
        .arg("--max-volume-size=4Gi")
        .spawn()
        .await;
    let mut c = clients(&plugin).await;
    let v = create(&mut c, "growing").await;
    let id = v.volume_id.clone();
    let expand = |id: &str, required: Option<i64>| pb::ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: required.map(|r| pb::CapacityRange {
            required_bytes: r,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    fails(
        c.controller
            .controller_expand_volume(expand("", Some(GIB)))
            .await,
        Code::InvalidArgument,
    );
    fails(
        c.controller
            .controller_expand_volume(expand(&id, None))
            .await,
        Code::InvalidArgument,
    );
    let block = pb::ControllerExpandVolumeRequest {
        volume_capability: Some(block_cap()),
        ..expand(&id, Some(2 * GIB))
    };
    fails(
        c.controller.controller_expand_volume(block).await,
        Code::InvalidArgument,
    );
    fails(
        c.controller
            .controller_expand_volume(expand("vol-none", Some(GIB)))
            .await,
        Code::NotFound,
    );
    fails(
        c.controller
            .controller_expand_volume(expand(&id, Some(8 * GIB)))
            .await,
        Code::OutOfRange,
    );

    for _ in 0..2 {
        let r = ok(c
            .controller
            .controller_expand_volume(expand(&id, Some(2 * GIB)))
            .await);
        assert_eq!(r.capacity_bytes, 2 * GIB);
        assert!(r.node_expansion_required);
    }
    // Already larger: OK, unchanged.
    let r = ok(c
        .controller
        .controller_expand_volume(expand(&id, Some(GIB)))
        .await);
    assert_eq!(r.capacity_bytes, 2 * GIB);
    let got = ok(c
        .controller
        .controller_get_volume(pb::ControllerGetVolumeRequest { volume_id: id })
        .await);
    assert_eq!(got.volume.map(|v| v.capacity_bytes), Some(2 * GIB));
}

#[tokio::test]
async fn snapshots_lifecycle() {
    let plugin = HostpathPlugin::builder().spawn().await;
    let mut c = clients(&plugin).await;
    let a = create(&mut c, "a").await.volume_id;
    let b = create(&mut c, "b").await.volume_id;
    let snap = |source: &str, name: &str| pb::CreateSnapshotRequest {
        source_volume_id: source.into(),
        name: name.into(),
        ..Default::default()
    };
    fails(
        c.controller.create_snapshot(snap("", "s")).await,
        Code::InvalidArgument,
    );
    fails(
        c.controller.create_snapshot(snap(&a, "")).await,
        Code::InvalidArgument,
    );
    fails(
        c.controller.create_snapshot(snap("vol-none", "s")).await,
        Code::NotFound,
    );

    let s1 = ok(c.controller.create_snapshot(snap(&a, "s1")).await)
        .snapshot
        .expect("snapshot");
    let again = ok(c.controller.create_snapshot(snap(&a, "s1")).await)
        .snapshot
        .expect("snapshot");
    assert_eq!(again, s1);
    fails(
        c.controller.create_snapshot(snap(&b, "s1")).await,
        Code::AlreadyExists,
    );
    let s2 = ok(c.controller.create_snapshot(snap(&a, "s2")).await)
        .snapshot
        .expect("snapshot");
    let s3 = ok(c.controller.create_snapshot(snap(&b, "s3")).await)
        .snapshot
        .expect("snapshot");
    assert_eq!(
        fs::read_dir(plugin.statedir().join("snapshots"))
            .expect("dir")
            .count(),
        3
    );

    let lister = c.clone();
    let list = |req: pb::ListSnapshotsRequest| {
        let mut c = lister.clone();
        async move { c.controller.list_snapshots(req).await }
    };
    let ids = |r: pb::ListSnapshotsResponse| -> Vec<String> {
        let mut v: Vec<String> = r
            .entries
            .into_iter()
            .map(|e| e.snapshot.expect("snapshot").snapshot_id)
            .collect();
        v.sort();
        v
    };
    let mut all = vec![
        s1.snapshot_id.clone(),
        s2.snapshot_id.clone(),
        s3.snapshot_id.clone(),
    ];
    all.sort();
    assert_eq!(
        ids(ok(list(pb::ListSnapshotsRequest::default()).await)),
        all
    );
    let by_id = pb::ListSnapshotsRequest {
        snapshot_id: s2.snapshot_id.clone(),
        ..Default::default()
    };
    assert_eq!(ids(ok(list(by_id).await)), vec![s2.snapshot_id.clone()]);
    let unknown = pb::ListSnapshotsRequest {
        snapshot_id: "snap-none".into(),
        ..Default::default()
    };
    assert!(ids(ok(list(unknown).await)).is_empty());
    let by_source = pb::ListSnapshotsRequest {
        source_volume_id: b.clone(),
        ..Default::default()
    };
    assert_eq!(ids(ok(list(by_source).await)), vec![s3.snapshot_id.clone()]);

    let mut paged = Vec::new();
    let mut token = String::new();
    loop {
        let req = pb::ListSnapshotsRequest {
            max_entries: 2,
            starting_token: token.clone(),
            ..Default::default()
        };
        let page = ok(list(req).await);
        assert!(page.entries.len() <= 2);
        token = page.next_token.clone();
        paged.extend(ids(page));
        if token.is_empty() {
            break;
        }
    }
    paged.sort();
    assert_eq!(paged, all);
    let bad = pb::ListSnapshotsRequest {
        starting_token: "bogus".into(),
        ..Default::default()
    };
    fails(list(bad).await, Code::Aborted);
    let negative = pb::ListSnapshotsRequest {
        max_entries: -5,
        ..Default::default()
    };
    fails(list(negative).await, Code::InvalidArgument);

    let del = |id: &str| pb::DeleteSnapshotRequest {
        snapshot_id: id.into(),
        ..Default::default()
    };
    fails(
        c.controller.delete_snapshot(del("")).await,
        Code::InvalidArgument,
    );
    ok(c.controller.delete_snapshot(del("snap-none")).await);
    ok(c.controller.delete_snapshot(del(&s1.snapshot_id)).await);
    ok(c.controller.delete_snapshot(del(&s1.snapshot_id)).await);
    assert!(
        !plugin
            .statedir()
            .join("snapshots")
            .join(&s1.snapshot_id)
            .exists()
    );
    assert_eq!(
        ids(ok(list(pb::ListSnapshotsRequest::default()).await)).len(),
        2
    );
}

#[tokio::test]
async fn node_stage_publish_unpublish_unstage() {
    let plugin = HostpathPlugin::builder().spawn().await;
    let mut c = clients(&plugin).await;
    let node = plugin.nodeid().to_owned();
    let cap = mount_cap(Mode::SingleNodeMultiWriter);
    let id = create(&mut c, "workload").await.volume_id;
    let staging = plugin.tmp().join("staging");
    let target = plugin.tmp().join("pods/a/target");
    let target_ro = plugin.tmp().join("pods/b/target");
    fs::create_dir_all(target.parent().expect("parent")).expect("mkdir");
    fs::create_dir_all(target_ro.parent().expect("parent")).expect("mkdir");

    // Required arguments.
    for (what, req) in [
        ("no volume id", stage_req("", &staging, cap.clone())),
        (
            "no staging path",
            stage_req(&id, Path::new(""), cap.clone()),
        ),
        (
            "relative staging path",
            stage_req(&id, Path::new("rel/path"), cap.clone()),
        ),
        (
            "no capability",
            pb::NodeStageVolumeRequest {
                volume_capability: None,
                ..stage_req(&id, &staging, cap.clone())
            },
        ),
    ] {
        let status = c.node.node_stage_volume(req).await.expect_err(what);
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{what}: {}",
            status.message()
        );
    }
    fails(
        c.node
            .node_stage_volume(stage_req("vol-none", &staging, cap.clone()))
            .await,
        Code::NotFound,
    );
    // Not controller-published yet.
    fails(
        c.node
            .node_stage_volume(stage_req(&id, &staging, cap.clone()))
            .await,
        Code::FailedPrecondition,
    );
    ok(c.controller
        .controller_publish_volume(pb::ControllerPublishVolumeRequest {
            volume_capability: Some(cap.clone()),
            ..publish_req(&id, &node, false)
        })
        .await);
    fails(
        c.node
            .node_stage_volume(stage_req(&id, &staging, block_cap()))
            .await,
        Code::FailedPrecondition,
    );

    // Stage: a bind mount of the volume directory, created by the plugin.
    for _ in 0..2 {
        ok(c.node
            .node_stage_volume(stage_req(&id, &staging, cap.clone()))
            .await);
        assert_mounted(&plugin, &staging, &id, false);
    }
    fails(
        c.node
            .node_stage_volume(stage_req(
                &id,
                &staging,
                mount_cap(Mode::SingleNodeReaderOnly),
            ))
            .await,
        Code::AlreadyExists,
    );

    // Publish: required arguments and preconditions.
    for (what, req) in [
        (
            "no volume id",
            node_publish_req("", Some(&staging), &target, cap.clone(), false),
        ),
        (
            "no target",
            node_publish_req(&id, Some(&staging), Path::new(""), cap.clone(), false),
        ),
        (
            "no capability",
            pb::NodePublishVolumeRequest {
                volume_capability: None,
                ..node_publish_req(&id, Some(&staging), &target, cap.clone(), false)
            },
        ),
        (
            "target in statedir",
            node_publish_req(
                &id,
                Some(&staging),
                &plugin.statedir().join("x"),
                cap.clone(),
                false,
            ),
        ),
    ] {
        let status = c.node.node_publish_volume(req).await.expect_err(what);
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{what}: {}",
            status.message()
        );
    }
    fails(
        c.node
            .node_publish_volume(node_publish_req(
                "vol-none",
                Some(&staging),
                &target,
                cap.clone(),
                false,
            ))
            .await,
        Code::NotFound,
    );
    fails(
        c.node
            .node_publish_volume(node_publish_req(&id, None, &target, cap.clone(), false))
            .await,
        Code::FailedPrecondition,
    );
    let elsewhere = plugin.tmp().join("not-staged");
    fails(
        c.node
            .node_publish_volume(node_publish_req(
                &id,
                Some(&elsewhere),
                &target,
                cap.clone(),
                false,
            ))
            .await,
        Code::FailedPrecondition,
    );

    // Publish read-write, twice.
    for _ in 0..2 {
        ok(c.node
            .node_publish_volume(node_publish_req(
                &id,
                Some(&staging),
                &target,
                cap.clone(),
                false,
            ))
            .await);
        assert_mounted(&plugin, &target, &id, false);
    }
    fs::write(plugin.in_ns(&target).join("hello"), b"from the workload")
        .expect("write through the mount");
    let in_volume = plugin.statedir().join("volumes").join(&id).join("hello");
    assert_eq!(
        fs::read(&in_volume).expect("in the volume"),
        b"from the workload"
    );
    fails(
        c.node
            .node_publish_volume(node_publish_req(
                &id,
                Some(&staging),
                &target,
                cap.clone(),
                true,
            ))
            .await,
        Code::AlreadyExists,
    );

    // Publish read-only at a second target (SINGLE_NODE_MULTI_WRITER allows it).
    ok(c.node
        .node_publish_volume(node_publish_req(
            &id,
            Some(&staging),
            &target_ro,
            cap.clone(),
            true,
        ))
        .await);
    assert_mounted(&plugin, &target_ro, &id, true);
    assert_eq!(
        fs::read(plugin.in_ns(&target_ro).join("hello")).expect("read"),
        b"from the workload"
    );
    let err = fs::write(plugin.in_ns(&target_ro).join("nope"), b"x").expect_err("read-only");
    assert_eq!(err.kind(), io::ErrorKind::ReadOnlyFilesystem, "{err}");
    assert!(
        !plugin
            .statedir()
            .join("volumes")
            .join(&id)
            .join("nope")
            .exists()
    );

    // Stats.
    let stats_req = |id: &str, path: &Path| pb::NodeGetVolumeStatsRequest {
        volume_id: id.into(),
        volume_path: path.display().to_string(),
        staging_target_path: staging.display().to_string(),
    };
    let stats = ok(c.node.node_get_volume_stats(stats_req(&id, &target)).await);
    let bytes = stats
        .usage
        .iter()
        .find(|u| u.unit == Unit::Bytes as i32)
        .expect("bytes");
    assert_eq!(bytes.total, GIB);
    assert_eq!(bytes.used, "from the workload".len() as i64);
    assert!(bytes.available > 0 && bytes.available <= GIB - bytes.used);
    assert!(
        stats
            .usage
            .iter()
            .any(|u| u.unit == Unit::Inodes as i32 && u.total > 0)
    );
    assert_eq!(stats.volume_condition.map(|c| c.abnormal), Some(false));
    ok(c.node.node_get_volume_stats(stats_req(&id, &staging)).await);
    fails(
        c.node.node_get_volume_stats(stats_req("", &target)).await,
        Code::InvalidArgument,
    );
    fails(
        c.node
            .node_get_volume_stats(stats_req(&id, Path::new("")))
            .await,
        Code::InvalidArgument,
    );
    fails(
        c.node
            .node_get_volume_stats(stats_req("vol-none", &target))
            .await,
        Code::NotFound,
    );
    fails(
        c.node
            .node_get_volume_stats(stats_req(&id, plugin.tmp()))
            .await,
        Code::NotFound,
    );

    // Expand on the node: the published path works, anything else is not the volume.
    let expand = |path: &Path| pb::NodeExpandVolumeRequest {
        volume_id: id.clone(),
        volume_path: path.display().to_string(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: GIB,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    assert_eq!(
        ok(c.node.node_expand_volume(expand(&target)).await).capacity_bytes,
        GIB
    );
    fails(
        c.node.node_expand_volume(expand(plugin.tmp())).await,
        Code::NotFound,
    );
    fails(
        c.node
            .node_expand_volume(pb::NodeExpandVolumeRequest {
                volume_id: String::new(),
                ..expand(&target)
            })
            .await,
        Code::InvalidArgument,
    );

    // A volume in use cannot be deleted.
    ok(c.controller
        .controller_unpublish_volume(unpublish_req(&id, &node))
        .await);
    let del = pb::DeleteVolumeRequest {
        volume_id: id.clone(),
        ..Default::default()
    };
    fails(
        c.controller.delete_volume(del.clone()).await,
        Code::FailedPrecondition,
    );

    // Unpublish: required arguments, then twice; the target directory goes away.
    fails(
        c.node
            .node_unpublish_volume(node_unpublish_req("", &target))
            .await,
        Code::InvalidArgument,
    );
    fails(
        c.node
            .node_unpublish_volume(node_unpublish_req(&id, Path::new("")))
            .await,
        Code::InvalidArgument,
    );
    fails(
        c.node
            .node_unpublish_volume(node_unpublish_req("vol-none", &target))
            .await,
        Code::NotFound,
    );
    for path in [&target, &target_ro] {
        for _ in 0..2 {
            ok(c.node
                .node_unpublish_volume(node_unpublish_req(&id, path))
                .await);
            assert_not_mounted(&plugin, path);
            assert!(!path.exists(), "{} removed", path.display());
        }
    }
    assert_mounted(&plugin, &staging, &id, false);

    // Unstage: required arguments, then twice; the staging directory it created goes away.
    fails(
        c.node.node_unstage_volume(unstage_req("", &staging)).await,
        Code::InvalidArgument,
    );
    fails(
        c.node
            .node_unstage_volume(unstage_req(&id, Path::new("")))
            .await,
        Code::InvalidArgument,
    );
    fails(
        c.node
            .node_unstage_volume(unstage_req("vol-none", &staging))
            .await,
        Code::NotFound,
    );
    for _ in 0..2 {
        ok(c.node.node_unstage_volume(unstage_req(&id, &staging)).await);
        assert_not_mounted(&plugin, &staging);
        assert!(!staging.exists());
    }
    assert!(plugin.mountinfo().iter().all(|e| !is_volume_mount(e, &id)));
    assert_eq!(
        fs::read(&in_volume).expect("data survives"),
        b"from the workload"
    );
    ok(c.controller.delete_volume(del).await);
}

#[tokio::test]
async fn unstage_keeps_a_staging_dir_it_did_not_create() {
    let plugin = HostpathPlugin::builder().attach(false).spawn().await;
    let mut c = clients(&plugin).await;
    let id = create(&mut c, "v").await.volume_id;
    let staging = plugin.tmp().join("precreated");
    fs::create_dir(&staging).expect("mkdir");
    ok(c.node
        .node_stage_volume(stage_req(&id, &staging, rw()))
        .await);
    assert_mounted(&plugin, &staging, &id, false);
    ok(c.node.node_unstage_volume(unstage_req(&id, &staging)).await);
    assert_not_mounted(&plugin, &staging);
    assert!(staging.is_dir(), "the CO's directory stays");
}

/// Runs `mount <args>` in the plugin's mount namespace.
fn mount_in_plugin_ns(plugin: &HostpathPlugin, args: &[&std::ffi::OsStr]) {
    let out = plugin
        .command_in_ns("mount")
        .args(args)
        .output()
        .expect("running nsenter (util-linux)");
    assert!(
        out.status.success(),
        "mount {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn unpublish_takes_every_stacked_mount_of_the_volume_and_publish_refuses_a_foreign_one() {
    let plugin = HostpathPlugin::builder().attach(false).spawn().await;
    let mut c = clients(&plugin).await;
    let id = create(&mut c, "v").await.volume_id;
    let staging = plugin.tmp().join("staging");
    let target = plugin.tmp().join("target");
    stage_and_publish(&mut c, &id, &staging, &target).await;
    // Two more binds of the volume stacked on the plugin's own.
    for _ in 0..2 {
        mount_in_plugin_ns(
            &plugin,
            &["--bind".as_ref(), staging.as_ref(), target.as_ref()],
        );
    }
    assert_eq!(mounts_at(&plugin, &target).len(), 3);
    ok(c.node
        .node_unpublish_volume(node_unpublish_req(&id, &target))
        .await);
    assert_not_mounted(&plugin, &target);
    assert!(!target.exists(), "the plugin's target directory goes");

    // Something else mounted at the target: publish refuses it and leaves it.
    fs::create_dir(&target).expect("mkdir");
    mount_in_plugin_ns(
        &plugin,
        &[
            "-t".as_ref(),
            "tmpfs".as_ref(),
            "x".as_ref(),
            target.as_ref(),
        ],
    );
    let message = fails(
        c.node
            .node_publish_volume(node_publish_req(&id, Some(&staging), &target, rw(), false))
            .await,
        Code::FailedPrecondition,
    );
    assert!(message.contains("another mount (tmpfs)"), "{message}");
    let at = mounts_at(&plugin, &target);
    assert_eq!(at.len(), 1, "{at:#?}");
    assert_eq!(at[0].fs_type, "tmpfs");
    assert_mounted(&plugin, &staging, &id, false);
}

#[tokio::test]
async fn reader_only_access_modes_mount_read_only() {
    let plugin = HostpathPlugin::builder().attach(false).spawn().await;
    let mut c = clients(&plugin).await;
    let id = create(&mut c, "v").await.volume_id;
    let staging = plugin.tmp().join("staging");
    let target = plugin.tmp().join("target");
    let cap = mount_cap(Mode::MultiNodeReaderOnly);
    ok(c.node
        .node_stage_volume(stage_req(&id, &staging, cap.clone()))
        .await);
    assert_mounted(&plugin, &staging, &id, true);
    ok(c.node
        .node_publish_volume(node_publish_req(&id, Some(&staging), &target, cap, false))
        .await);
    assert_mounted(&plugin, &target, &id, true);
    let err = fs::write(plugin.in_ns(&target).join("f"), b"x").expect_err("read-only");
    assert_eq!(err.kind(), io::ErrorKind::ReadOnlyFilesystem);
}

#[tokio::test]
async fn single_node_single_writer_allows_one_target_per_node() {
    let plugin = HostpathPlugin::builder().attach(false).spawn().await;
    let mut c = clients(&plugin).await;
    let id = create(&mut c, "v").await.volume_id;
    let staging = plugin.tmp().join("staging");
    let (t1, t2) = (plugin.tmp().join("t1"), plugin.tmp().join("t2"));

    let single = mount_cap(Mode::SingleNodeSingleWriter);
    ok(c.node
        .node_stage_volume(stage_req(&id, &staging, single.clone()))
        .await);
    ok(c.node
        .node_publish_volume(node_publish_req(
            &id,
            Some(&staging),
            &t1,
            single.clone(),
            false,
        ))
        .await);
    for other in [single.clone(), rw()] {
        let r = c
            .node
            .node_publish_volume(node_publish_req(&id, Some(&staging), &t2, other, false))
            .await;
        fails(r, Code::FailedPrecondition);
        assert!(mounts_at(&plugin, &t2).is_empty());
    }
    ok(c.node
        .node_unpublish_volume(node_unpublish_req(&id, &t1))
        .await);
    // Once the first target is gone, another one is fine.
    ok(c.node
        .node_publish_volume(node_publish_req(&id, Some(&staging), &t2, single, false))
        .await);
    ok(c.node
        .node_unpublish_volume(node_unpublish_req(&id, &t2))
        .await);
    ok(c.node.node_unstage_volume(unstage_req(&id, &staging)).await);

    // The other modes allow one target per workload.
    for mode in [
        Mode::SingleNodeWriter,
        Mode::SingleNodeReaderOnly,
        Mode::SingleNodeMultiWriter,
        Mode::MultiNodeMultiWriter,
    ] {
        let cap = mount_cap(mode);
        ok(c.node
            .node_stage_volume(stage_req(&id, &staging, cap.clone()))
            .await);
        for t in [&t1, &t2] {
            ok(c.node
                .node_publish_volume(node_publish_req(&id, Some(&staging), t, cap.clone(), false))
                .await);
            assert_mounted(&plugin, t, &id, caps_read_only(mode));
        }
        for t in [&t1, &t2] {
            ok(c.node
                .node_unpublish_volume(node_unpublish_req(&id, t))
                .await);
        }
        ok(c.node.node_unstage_volume(unstage_req(&id, &staging)).await);
    }
}

fn caps_read_only(mode: Mode) -> bool {
    matches!(mode, Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly)
}

#[tokio::test]
async fn stage_disabled_publishes_the_volume_directory() {
    use node_service_capability::rpc::Type as N;
    let plugin = HostpathPlugin::builder().stage(false).spawn().await;
    let mut c = clients(&plugin).await;
    let node = plugin.nodeid().to_owned();
    let caps = ok(c
        .node
        .node_get_capabilities(pb::NodeGetCapabilitiesRequest {})
        .await);
    assert!(!node_rpcs(&caps.capabilities).contains(&(N::StageUnstageVolume as i32)));

    let id = create(&mut c, "v").await.volume_id;
    let staging = plugin.tmp().join("staging");
    let target = plugin.tmp().join("target");
    fails(
        c.node
            .node_stage_volume(stage_req(&id, &staging, rw()))
            .await,
        Code::Unimplemented,
    );
    fails(
        c.node.node_unstage_volume(unstage_req(&id, &staging)).await,
        Code::Unimplemented,
    );

    // Attach is on: the volume must be controller-published first.
    fails(
        c.node
            .node_publish_volume(node_publish_req(&id, None, &target, rw(), false))
            .await,
        Code::FailedPrecondition,
    );
    ok(c.controller
        .controller_publish_volume(publish_req(&id, &node, false))
        .await);
    for _ in 0..2 {
        ok(c.node
            .node_publish_volume(node_publish_req(&id, None, &target, rw(), false))
            .await);
        assert_mounted(&plugin, &target, &id, false);
    }
    ok(c.node
        .node_unpublish_volume(node_unpublish_req(&id, &target))
        .await);
    assert_not_mounted(&plugin, &target);
    assert!(!target.exists());
}

#[tokio::test]
async fn attach_disabled_needs_no_controller_publish() {
    use controller_service_capability::rpc::Type as C;
    let plugin = HostpathPlugin::builder().attach(false).spawn().await;
    let mut c = clients(&plugin).await;
    let node = plugin.nodeid().to_owned();
    let caps = ok(c
        .controller
        .controller_get_capabilities(pb::ControllerGetCapabilitiesRequest {})
        .await);
    assert!(!controller_rpcs(&caps.capabilities).contains(&(C::PublishUnpublishVolume as i32)));

    let id = create(&mut c, "v").await.volume_id;
    fails(
        c.controller
            .controller_publish_volume(publish_req(&id, &node, false))
            .await,
        Code::Unimplemented,
    );
    fails(
        c.controller
            .controller_unpublish_volume(unpublish_req(&id, &node))
            .await,
        Code::Unimplemented,
    );

    let staging = plugin.tmp().join("staging");
    let target = plugin.tmp().join("target");
    stage_and_publish(&mut c, &id, &staging, &target).await;
    assert_mounted(&plugin, &target, &id, false);
}

#[tokio::test]
async fn state_survives_a_restart_and_mounts_are_read_from_the_mount_table() {
    let mut plugin = HostpathPlugin::builder().spawn().await;
    let mut c = clients(&plugin).await;
    let node = plugin.nodeid().to_owned();
    let a = create(&mut c, "a").await;
    let b = create(&mut c, "b").await;
    let snap = ok(c
        .controller
        .create_snapshot(pb::CreateSnapshotRequest {
            source_volume_id: a.volume_id.clone(),
            name: "snap".into(),
            ..Default::default()
        })
        .await)
    .snapshot
    .expect("snapshot");
    ok(c.controller
        .controller_publish_volume(publish_req(&a.volume_id, &node, false))
        .await);
    let staging = plugin.tmp().join("staging");
    let target = plugin.tmp().join("target");
    ok(c.node
        .node_stage_volume(stage_req(&a.volume_id, &staging, rw()))
        .await);

    plugin.restart().await;
    let mut c = clients(&plugin).await;

    let list = ok(c
        .controller
        .list_volumes(pb::ListVolumesRequest::default())
        .await);
    let mut ids: Vec<_> = list
        .entries
        .iter()
        .map(|e| e.volume.clone().expect("volume"))
        .collect();
    ids.sort_by(|x, y| x.volume_id.cmp(&y.volume_id));
    let mut expected = vec![a.clone(), b.clone()];
    expected.sort_by(|x, y| x.volume_id.cmp(&y.volume_id));
    assert_eq!(ids, expected);
    let snaps = ok(c
        .controller
        .list_snapshots(pb::ListSnapshotsRequest::default())
        .await);
    assert_eq!(snaps.entries.len(), 1);
    assert_eq!(snaps.entries[0].snapshot.as_ref(), Some(&snap));
    let got = ok(c
        .controller
        .controller_get_volume(pb::ControllerGetVolumeRequest {
            volume_id: a.volume_id.clone(),
        })
        .await);
    assert_eq!(
        got.status.map(|s| s.published_node_ids),
        Some(vec![node.clone()])
    );
    // Same name after the restart: the same volume.
    assert_eq!(create(&mut c, "a").await, a);

    // The new process has a fresh mount namespace: the staging mount is gone, and the plugin
    // knows it, whatever its state file says.
    assert_not_mounted(&plugin, &staging);
    let r = c
        .node
        .node_publish_volume(node_publish_req(
            &a.volume_id,
            Some(&staging),
            &target,
            rw(),
            false,
        ))
        .await;
    fails(r, Code::FailedPrecondition);
    ok(c.node
        .node_stage_volume(stage_req(&a.volume_id, &staging, rw()))
        .await);
    assert_mounted(&plugin, &staging, &a.volume_id, false);
    ok(c.node
        .node_publish_volume(node_publish_req(
            &a.volume_id,
            Some(&staging),
            &target,
            rw(),
            false,
        ))
        .await);
    assert_mounted(&plugin, &target, &a.volume_id, false);
}

#[tokio::test]
async fn a_removed_volume_directory_is_reported_abnormal() {
    let plugin = HostpathPlugin::builder().attach(false).spawn().await;
    let mut c = clients(&plugin).await;
    let id = create(&mut c, "fragile").await.volume_id;
    let staging = plugin.tmp().join("staging");
    ok(c.node
        .node_stage_volume(stage_req(&id, &staging, rw()))
        .await);

    // Removed behind the plugin's back (the host sees no mount there).
    fs::remove_dir_all(plugin.statedir().join("volumes").join(&id)).expect("remove");
    let stats = ok(c
        .node
        .node_get_volume_stats(pb::NodeGetVolumeStatsRequest {
            volume_id: id.clone(),
            volume_path: staging.display().to_string(),
            staging_target_path: String::new(),
        })
        .await);
    let condition = stats.volume_condition.expect("condition");
    assert!(condition.abnormal, "{condition:?}");
    assert!(
        condition.message.contains("missing"),
        "{}",
        condition.message
    );
    let got = ok(c
        .controller
        .controller_get_volume(pb::ControllerGetVolumeRequest {
            volume_id: id.clone(),
        })
        .await);
    assert_eq!(
        got.status
            .and_then(|s| s.volume_condition)
            .map(|c| c.abnormal),
        Some(true)
    );

    // It can still be unstaged.
    ok(c.node.node_unstage_volume(unstage_req(&id, &staging)).await);
    assert_not_mounted(&plugin, &staging);
}

#[tokio::test]
async fn secrets_and_mount_flags_never_reach_the_logs() {
    const SECRET: &str = "s3cr3t-value-0451";
    const FLAG: &str = "flag-0452-private";
    let plugin = HostpathPlugin::builder()
        .attach(false)
        .log_level("trace")
        .spawn()
        .await;
    let mut c = clients(&plugin).await;
    let secrets = HashMap::from([("password".to_owned(), SECRET.to_owned())]);
    let mut cap = rw();
    if let Some(pb::volume_capability::AccessType::Mount(m)) = &mut cap.access_type {
        m.mount_flags = vec![FLAG.to_owned()];
    }
    let v = ok(c
        .controller
        .create_volume(pb::CreateVolumeRequest {
            secrets: secrets.clone(),
            volume_capabilities: vec![cap.clone()],
            ..create_req("secretive")
        })
        .await)
    .volume
    .expect("volume");
    let staging = plugin.tmp().join("staging");
    let target = plugin.tmp().join("target");
    let stage = pb::NodeStageVolumeRequest {
        secrets: secrets.clone(),
        ..stage_req(&v.volume_id, &staging, cap.clone())
    };
    ok(c.node.node_stage_volume(stage).await);
    // An error path, too.
    let stage_ro = pb::NodeStageVolumeRequest {
        secrets: secrets.clone(),
        ..stage_req(
            &v.volume_id,
            &staging,
            mount_cap(Mode::SingleNodeReaderOnly),
        )
    };
    let msg = fails(
        c.node.node_stage_volume(stage_ro).await,
        Code::AlreadyExists,
    );
    assert!(!msg.contains(SECRET) && !msg.contains(FLAG), "{msg}");
    let publish = pb::NodePublishVolumeRequest {
        secrets,
        ..node_publish_req(&v.volume_id, Some(&staging), &target, cap, false)
    };
    ok(c.node.node_publish_volume(publish).await);

    let logs = plugin.stderr_text();
    assert!(
        logs.contains("NodeStageVolume") && logs.contains("[REDACTED]"),
        "trace logs:\n{logs}"
    );
    assert!(
        !logs.contains(SECRET),
        "a secret leaked into the logs:\n{logs}"
    );
    assert!(
        !logs.contains(FLAG),
        "a mount flag leaked into the logs:\n{logs}"
    );
    let state = fs::read_to_string(plugin.statedir().join("state.json")).expect("state");
    assert!(
        !state.contains(SECRET) && !state.contains(FLAG),
        "state file: {state}"
    );
}

#[tokio::test]
async fn sigterm_stops_the_plugin_and_removes_its_socket() {
    let mut plugin = HostpathPlugin::builder().spawn().await;
    let mut c = clients(&plugin).await;
    ok(c.identity.probe(pb::ProbeRequest {}).await);
    let pid = nix::unistd::Pid::from_raw(i32::try_from(plugin.pid()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let status = plugin
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("exits");
    assert_eq!(status.code(), Some(0), "{}", plugin.stderr_text());
    assert!(!plugin.socket().exists(), "socket removed");

    // A restart over the same state directory works.
    plugin.restart().await;
    let mut c = clients(&plugin).await;
    ok(c.identity.probe(pb::ProbeRequest {}).await);
}

/// An id no volume or snapshot has.
const UNKNOWN_ID: &str = "vol-0123456789abcdef";

/// One broken variant of a request: what is wrong with it, how to break it, and the code the
/// spec's tables give for it when the volume (or snapshot) exists.
struct Breakage<R> {
    what: &'static str,
    breaks: Box<dyn Fn(&mut R)>,
    known: Code,
}

/// The check order of one RPC: its request for an id (`base`), how to send it, and broken
/// variants of it. [`check`](Self::check) sends each variant with an unknown id (which must get
/// `unknown`: NOT_FOUND, or OK where the spec makes the call succeed for an unknown id), with no
/// id (INVALID_ARGUMENT), and with the `known` id (the variant's code), in that order.
struct Order<'a, R, B, S> {
    rpc: &'a str,
    known: &'a str,
    unknown: Code,
    base: B,
    send: S,
    cases: Vec<Breakage<R>>,
}

impl<'a, R, B, S> Order<'a, R, B, S>
where
    B: Fn(&str) -> R,
    S: AsyncFn(R) -> Code,
{
    fn new(rpc: &'a str, known: &'a str, unknown: Code, base: B, send: S) -> Self {
        Self {
            rpc,
            known,
            unknown,
            base,
            send,
            cases: Vec::new(),
        }
    }

    /// A variant with `what` broken by `breaks`; `known` is the code for the known id.
    fn broken(
        mut self,
        what: &'static str,
        known: Code,
        breaks: impl Fn(&mut R) + 'static,
    ) -> Self {
        self.cases.push(Breakage {
            what,
            breaks: Box::new(breaks),
            known,
        });
        self
    }

    /// The request as it is; `known` is the code for the known id.
    fn unbroken(self, known: Code) -> Self {
        self.broken("nothing", known, |_| {})
    }

    fn with(self, cases: impl FnOnce(Self) -> Self) -> Self {
        cases(self)
    }

    async fn check(self) {
        for case in &self.cases {
            for (id, expected) in [
                (UNKNOWN_ID, self.unknown),
                ("", Code::InvalidArgument),
                (self.known, case.known),
            ] {
                let mut req = (self.base)(id);
                (case.breaks)(&mut req);
                let got = (self.send)(req).await;
                assert_eq!(
                    got, expected,
                    "{} with id {id:?} and {} wrong: {got:?}, the spec wants {expected:?}",
                    self.rpc, case.what
                );
            }
        }
    }
}

fn range(required_bytes: i64, limit_bytes: i64) -> Option<pb::CapacityRange> {
    Some(pb::CapacityRange {
        required_bytes,
        limit_bytes,
    })
}

/// The broken variants of a CreateVolume from a content source.
fn create_volume_cases<'a, B, S>(
    o: Order<'a, pb::CreateVolumeRequest, B, S>,
) -> Order<'a, pb::CreateVolumeRequest, B, S>
where
    B: Fn(&str) -> pb::CreateVolumeRequest,
    S: AsyncFn(pb::CreateVolumeRequest) -> Code,
{
    o.broken("name (missing)", Code::InvalidArgument, |r| r.name.clear())
        .broken("volume_capabilities (none)", Code::InvalidArgument, |r| {
            r.volume_capabilities.clear()
        })
        .broken("access type (block)", Code::InvalidArgument, |r| {
            r.volume_capabilities = vec![block_cap()]
        })
        .broken("capacity_range (negative)", Code::InvalidArgument, |r| {
            r.capacity_range = range(-1, 0)
        })
        .broken("capacity_range (below the source)", Code::OutOfRange, |r| {
            r.capacity_range = range(MIB, MIB)
        })
        .broken(
            "accessibility_requirements (elsewhere)",
            Code::ResourceExhausted,
            |r| {
                r.accessibility_requirements = Some(pb::TopologyRequirement {
                    requisite: vec![topology("another-node")],
                    preferred: vec![],
                })
            },
        )
        .unbroken(Code::Ok)
}

fn no_mode() -> pb::VolumeCapability {
    pb::VolumeCapability {
        access_mode: None,
        ..rw()
    }
}

fn no_type() -> pb::VolumeCapability {
    pb::VolumeCapability {
        access_type: None,
        ..rw()
    }
}

#[tokio::test]
async fn every_rpc_looks_up_the_volume_before_it_checks_the_other_fields() {
    use volume_content_source::{SnapshotSource, Type, VolumeSource};
    let plugin = HostpathPlugin::builder()
        .arg("--max-volume-size=4Gi")
        .spawn()
        .await;
    let c = clients(&plugin).await;
    let node = plugin.nodeid().to_owned();
    let v = create(&mut c.clone(), "v").await.volume_id;
    let w = create(&mut c.clone(), "w").await.volume_id;
    ok(c.controller
        .clone()
        .create_snapshot(pb::CreateSnapshotRequest {
            source_volume_id: w.clone(),
            name: "taken".into(),
            ..Default::default()
        })
        .await);
    let in_statedir = plugin.statedir().join("x").display().to_string();
    let staging = plugin.tmp().join("staging");
    let target = plugin.tmp().join("target");
    let elsewhere = plugin.tmp().join("elsewhere");
    fs::create_dir(&elsewhere).expect("mkdir");
    let (staging_s, target_s) = (staging.display().to_string(), target.display().to_string());

    // Controller side.
    let ctl = c.controller.clone();
    let sd = in_statedir.clone();
    Order::new(
        "ControllerPublishVolume",
        &v,
        Code::NotFound,
        |id| publish_req(id, &node, false),
        async |r| code(ctl.clone().controller_publish_volume(r).await),
    )
    .broken("node_id (missing)", Code::InvalidArgument, |r| {
        r.node_id.clear()
    })
    .broken("node_id (unknown)", Code::NotFound, |r| {
        r.node_id = "no-such-node".into()
    })
    .broken("volume_capability (missing)", Code::InvalidArgument, |r| {
        r.volume_capability = None
    })
    .broken("access mode", Code::InvalidArgument, |r| {
        r.volume_capability = Some(no_mode())
    })
    .broken("access type (block)", Code::InvalidArgument, |r| {
        r.volume_capability = Some(block_cap())
    })
    .unbroken(Code::Ok)
    .check()
    .await;
    Order::new(
        "ValidateVolumeCapabilities",
        &v,
        Code::NotFound,
        |id| pb::ValidateVolumeCapabilitiesRequest {
            volume_id: id.into(),
            volume_capabilities: vec![rw()],
            ..Default::default()
        },
        async |r| code(ctl.clone().validate_volume_capabilities(r).await),
    )
    .broken("volume_capabilities (none)", Code::InvalidArgument, |r| {
        r.volume_capabilities.clear()
    })
    .broken("access mode", Code::InvalidArgument, |r| {
        r.volume_capabilities = vec![no_mode()]
    })
    .broken("access type", Code::InvalidArgument, |r| {
        r.volume_capabilities = vec![no_type()]
    })
    .unbroken(Code::Ok)
    .check()
    .await;
    Order::new(
        "ControllerExpandVolume",
        &v,
        Code::NotFound,
        |id| pb::ControllerExpandVolumeRequest {
            volume_id: id.into(),
            capacity_range: range(2 * GIB, 0),
            ..Default::default()
        },
        async |r| code(ctl.clone().controller_expand_volume(r).await),
    )
    .broken("capacity_range (missing)", Code::InvalidArgument, |r| {
        r.capacity_range = None
    })
    .broken(
        "capacity_range (negative)",
        Code::InvalidArgument,
        move |r| r.capacity_range = range(-1, 0),
    )
    .broken("capacity_range (empty)", Code::InvalidArgument, move |r| {
        r.capacity_range = range(0, 0)
    })
    .broken(
        "capacity_range (limit below required)",
        Code::OutOfRange,
        move |r| r.capacity_range = range(2 * GIB, GIB),
    )
    .broken(
        "capacity_range (over the maximum)",
        Code::OutOfRange,
        move |r| r.capacity_range = range(8 * GIB, 0),
    )
    .broken("volume_capability (block)", Code::InvalidArgument, |r| {
        r.volume_capability = Some(block_cap())
    })
    .unbroken(Code::Ok)
    .check()
    .await;
    Order::new(
        "ControllerGetVolume",
        &v,
        Code::NotFound,
        |id| pb::ControllerGetVolumeRequest {
            volume_id: id.into(),
        },
        async |r| code(ctl.clone().controller_get_volume(r).await),
    )
    .unbroken(Code::Ok)
    .check()
    .await;
    Order::new(
        "CreateSnapshot",
        &v,
        Code::NotFound,
        |id| pb::CreateSnapshotRequest {
            source_volume_id: id.into(),
            name: "snap-v".into(),
            ..Default::default()
        },
        async |r| code(ctl.clone().create_snapshot(r).await),
    )
    .broken("name (missing)", Code::InvalidArgument, |r| r.name.clear())
    .broken("name (control character)", Code::InvalidArgument, |r| {
        r.name = "bad\u{1}name".into()
    })
    .broken("name (too long)", Code::InvalidArgument, |r| {
        r.name = "n".repeat(129)
    })
    .broken(
        "name (a snapshot of another volume's)",
        Code::AlreadyExists,
        |r| r.name = "taken".into(),
    )
    .unbroken(Code::Ok)
    .check()
    .await;
    let snap = ok(ctl
        .clone()
        .list_snapshots(pb::ListSnapshotsRequest {
            source_volume_id: v.clone(),
            ..Default::default()
        })
        .await)
    .entries[0]
        .snapshot
        .clone()
        .expect("snapshot")
        .snapshot_id;
    let from = |name: &str, source: Type| pb::CreateVolumeRequest {
        volume_content_source: Some(pb::VolumeContentSource {
            r#type: Some(source),
        }),
        ..create_req(name)
    };
    Order::new(
        "CreateVolume (from a snapshot)",
        &snap,
        Code::NotFound,
        |id| {
            from(
                "from-snapshot",
                Type::Snapshot(SnapshotSource {
                    snapshot_id: id.into(),
                }),
            )
        },
        async |r| code(ctl.clone().create_volume(r).await),
    )
    .with(create_volume_cases)
    .check()
    .await;
    Order::new(
        "CreateVolume (from a volume)",
        &v,
        Code::NotFound,
        |id| {
            from(
                "from-volume",
                Type::Volume(VolumeSource {
                    volume_id: id.into(),
                }),
            )
        },
        async |r| code(ctl.clone().create_volume(r).await),
    )
    .with(create_volume_cases)
    .check()
    .await;

    // Node side, in lifecycle order.
    let nd = c.node.clone();
    let (sd1, sd2, sd3) = (sd.clone(), sd.clone(), sd.clone());
    Order::new(
        "NodeStageVolume",
        &v,
        Code::NotFound,
        |id| stage_req(id, &staging, rw()),
        async |r| code(nd.clone().node_stage_volume(r).await),
    )
    .broken(
        "staging_target_path (missing)",
        Code::InvalidArgument,
        |r| r.staging_target_path.clear(),
    )
    .broken(
        "staging_target_path (relative)",
        Code::InvalidArgument,
        |r| r.staging_target_path = "rel/staging".into(),
    )
    .broken(
        "staging_target_path (in the state dir)",
        Code::InvalidArgument,
        move |r| r.staging_target_path = sd1.clone(),
    )
    .broken("volume_capability (missing)", Code::InvalidArgument, |r| {
        r.volume_capability = None
    })
    .broken("access mode", Code::InvalidArgument, |r| {
        r.volume_capability = Some(no_mode())
    })
    .broken("access type (missing)", Code::InvalidArgument, |r| {
        r.volume_capability = Some(no_type())
    })
    .broken("access type (block)", Code::FailedPrecondition, |r| {
        r.volume_capability = Some(block_cap())
    })
    .unbroken(Code::Ok)
    .check()
    .await;
    let (st1, el1) = (staging_s.clone(), elsewhere.display().to_string());
    Order::new(
        "NodePublishVolume",
        &v,
        Code::NotFound,
        |id| node_publish_req(id, Some(&staging), &target, rw(), false),
        async |r| code(nd.clone().node_publish_volume(r).await),
    )
    .broken("target_path (missing)", Code::InvalidArgument, |r| {
        r.target_path.clear()
    })
    .broken("target_path (relative)", Code::InvalidArgument, |r| {
        r.target_path = "rel/target".into()
    })
    .broken(
        "target_path (in the state dir)",
        Code::InvalidArgument,
        move |r| r.target_path = sd2.clone(),
    )
    .broken(
        "target_path (the staging path)",
        Code::InvalidArgument,
        move |r| r.target_path = st1.clone(),
    )
    .broken(
        "staging_target_path (missing)",
        Code::FailedPrecondition,
        |r| r.staging_target_path.clear(),
    )
    .broken(
        "staging_target_path (relative)",
        Code::InvalidArgument,
        |r| r.staging_target_path = "rel/staging".into(),
    )
    .broken(
        "staging_target_path (not staged there)",
        Code::FailedPrecondition,
        move |r| r.staging_target_path = el1.clone(),
    )
    .broken("volume_capability (missing)", Code::InvalidArgument, |r| {
        r.volume_capability = None
    })
    .broken("access mode", Code::InvalidArgument, |r| {
        r.volume_capability = Some(no_mode())
    })
    .broken("access type (block)", Code::FailedPrecondition, |r| {
        r.volume_capability = Some(block_cap())
    })
    .unbroken(Code::Ok)
    .check()
    .await;
    let (el2, el3) = (
        elsewhere.display().to_string(),
        elsewhere.display().to_string(),
    );
    Order::new(
        "NodeGetVolumeStats",
        &v,
        Code::NotFound,
        |id| pb::NodeGetVolumeStatsRequest {
            volume_id: id.into(),
            volume_path: target_s.clone(),
            staging_target_path: staging_s.clone(),
        },
        async |r| code(nd.clone().node_get_volume_stats(r).await),
    )
    .broken("volume_path (missing)", Code::InvalidArgument, |r| {
        r.volume_path.clear()
    })
    .broken("volume_path (relative)", Code::InvalidArgument, |r| {
        r.volume_path = "rel/target".into()
    })
    .broken(
        "volume_path (not published there)",
        Code::NotFound,
        move |r| r.volume_path = el2.clone(),
    )
    .broken(
        "staging_target_path (relative)",
        Code::InvalidArgument,
        |r| r.staging_target_path = "rel/staging".into(),
    )
    .unbroken(Code::Ok)
    .check()
    .await;
    Order::new(
        "NodeExpandVolume",
        &v,
        Code::NotFound,
        |id| pb::NodeExpandVolumeRequest {
            volume_id: id.into(),
            volume_path: target_s.clone(),
            staging_target_path: staging_s.clone(),
            capacity_range: range(GIB, 0),
            ..Default::default()
        },
        async |r| code(nd.clone().node_expand_volume(r).await),
    )
    .broken("volume_path (missing)", Code::InvalidArgument, |r| {
        r.volume_path.clear()
    })
    .broken("volume_path (relative)", Code::InvalidArgument, |r| {
        r.volume_path = "rel/target".into()
    })
    .broken(
        "volume_path (not published there)",
        Code::NotFound,
        move |r| r.volume_path = el3.clone(),
    )
    .broken(
        "staging_target_path (relative)",
        Code::InvalidArgument,
        |r| r.staging_target_path = "rel/staging".into(),
    )
    .broken("volume_capability (block)", Code::InvalidArgument, |r| {
        r.volume_capability = Some(block_cap())
    })
    .broken("access mode", Code::InvalidArgument, |r| {
        r.volume_capability = Some(no_mode())
    })
    .broken(
        "capacity_range (negative)",
        Code::InvalidArgument,
        move |r| r.capacity_range = range(-1, 0),
    )
    .broken(
        "capacity_range (limit below required)",
        Code::OutOfRange,
        move |r| r.capacity_range = range(2 * GIB, GIB),
    )
    .broken(
        "capacity_range (more than the volume has)",
        Code::OutOfRange,
        move |r| r.capacity_range = range(3 * GIB, 0),
    )
    .unbroken(Code::Ok)
    .check()
    .await;
    Order::new(
        "NodeUnpublishVolume",
        &v,
        Code::NotFound,
        |id| node_unpublish_req(id, &target),
        async |r| code(nd.clone().node_unpublish_volume(r).await),
    )
    .broken("target_path (missing)", Code::InvalidArgument, |r| {
        r.target_path.clear()
    })
    .broken("target_path (relative)", Code::InvalidArgument, |r| {
        r.target_path = "rel/target".into()
    })
    .broken(
        "target_path (in the state dir)",
        Code::InvalidArgument,
        move |r| r.target_path = sd3.clone(),
    )
    .unbroken(Code::Ok)
    .check()
    .await;
    assert_not_mounted(&plugin, &target);
    Order::new(
        "NodeUnstageVolume",
        &v,
        Code::NotFound,
        |id| unstage_req(id, &staging),
        async |r| code(nd.clone().node_unstage_volume(r).await),
    )
    .broken(
        "staging_target_path (missing)",
        Code::InvalidArgument,
        |r| r.staging_target_path.clear(),
    )
    .broken(
        "staging_target_path (relative)",
        Code::InvalidArgument,
        |r| r.staging_target_path = "rel/staging".into(),
    )
    .broken(
        "staging_target_path (in the state dir)",
        Code::InvalidArgument,
        move |r| r.staging_target_path = sd.clone(),
    )
    .unbroken(Code::Ok)
    .check()
    .await;
    assert_not_mounted(&plugin, &staging);

    // Calls the spec makes succeed for an unknown id.
    Order::new(
        "ControllerUnpublishVolume",
        &v,
        Code::Ok,
        |id| unpublish_req(id, &node),
        async |r| code(ctl.clone().controller_unpublish_volume(r).await),
    )
    .broken("node_id (unknown)", Code::Ok, |r| {
        r.node_id = "no-such-node".into()
    })
    .unbroken(Code::Ok)
    .check()
    .await;
    Order::new(
        "DeleteSnapshot",
        &snap,
        Code::Ok,
        |id| pb::DeleteSnapshotRequest {
            snapshot_id: id.into(),
            ..Default::default()
        },
        async |r| code(ctl.clone().delete_snapshot(r).await),
    )
    .unbroken(Code::Ok)
    .check()
    .await;
    Order::new(
        "DeleteVolume",
        &v,
        Code::Ok,
        |id| pb::DeleteVolumeRequest {
            volume_id: id.into(),
            ..Default::default()
        },
        async |r| code(ctl.clone().delete_volume(r).await),
    )
    .unbroken(Code::Ok)
    .check()
    .await;
}
