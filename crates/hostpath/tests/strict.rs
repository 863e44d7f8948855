//! `--strict`: the real plugin refuses requests in which the CO skipped a duty the CSI spec puts
//! on it, and without the flag it covers for such a CO as before. Each test runs both modes.

mod common;

use std::{collections::HashMap, fs, path::Path};

use berth_csi::pb::{self, volume_capability::access_mode::Mode};
use berth_testkit::HostpathPlugin;
use common::*;
use tonic::Code;

/// A plugin in the given mode, its clients, and a volume.
async fn setup(strict: bool, attach: bool) -> (HostpathPlugin, Clients, String) {
    let plugin = HostpathPlugin::builder()
        .strict(strict)
        .attach(attach)
        .spawn()
        .await;
    let mut c = clients(&plugin).await;
    let id = create(&mut c, "v").await.volume_id;
    (plugin, c, id)
}

/// In strict mode `r` failed with `code` and a message holding `what` (and never the private
/// context value the tests send); otherwise it succeeded.
#[track_caller]
fn refused_if<T: std::fmt::Debug>(
    strict: bool,
    r: Result<tonic::Response<T>, tonic::Status>,
    code: Code,
    what: &str,
) {
    if strict {
        let msg = fails(r, code);
        assert!(msg.contains(what), "{msg}");
        assert!(!msg.contains("private-value"), "{msg}");
    } else {
        ok(r);
    }
}

fn state_file(plugin: &HostpathPlugin) -> Vec<u8> {
    fs::read(plugin.statedir().join("state.json")).expect("state.json")
}

fn node_context(plugin: &HostpathPlugin) -> HashMap<String, String> {
    HashMap::from([(
        berth_hostpath::PUBLISH_CONTEXT_NODE_KEY.to_owned(),
        plugin.nodeid().to_owned(),
    )])
}

#[tokio::test]
async fn stage_needs_the_staging_directory_the_co_creates() {
    for strict in [false, true] {
        let (plugin, mut c, id) = setup(strict, false).await;
        let staging = plugin.tmp().join("staging");
        let before = state_file(&plugin);
        let r = c
            .node
            .node_stage_volume(stage_req(&id, &staging, rw()))
            .await;
        if strict {
            let msg = fails(r, Code::FailedPrecondition);
            assert!(
                msg.contains("staging_target_path")
                    && msg.contains(&staging.display().to_string())
                    && msg.contains("CO"),
                "{msg}"
            );
            assert!(!staging.exists(), "the plugin does not create it");
            assert_not_mounted(&plugin, &staging);
            assert_eq!(state_file(&plugin), before, "a refusal changes nothing");
            // A file where the directory should be is refused too.
            fs::write(&staging, b"").expect("write");
            let r = c
                .node
                .node_stage_volume(stage_req(&id, &staging, rw()))
                .await;
            let msg = fails(r, Code::FailedPrecondition);
            assert!(msg.contains("not a directory"), "{msg}");
            fs::remove_file(&staging).expect("rm");
            // Once the CO made it, staging works, and unstaging leaves it.
            fs::create_dir(&staging).expect("mkdir");
        }
        for _ in 0..2 {
            ok(c.node
                .node_stage_volume(stage_req(&id, &staging, rw()))
                .await);
            assert_mounted(&plugin, &staging, &id, false);
        }
        ok(c.node.node_unstage_volume(unstage_req(&id, &staging)).await);
        assert_not_mounted(&plugin, &staging);
        assert_eq!(
            staging.is_dir(),
            strict,
            "strict: the CO's directory stays; forgiving: the one the plugin made goes"
        );
    }
}

#[tokio::test]
async fn publish_needs_the_parent_the_co_creates_and_makes_the_target_itself() {
    for strict in [false, true] {
        let (plugin, mut c, id) = setup(strict, false).await;
        let staging = plugin.tmp().join("staging");
        fs::create_dir(&staging).expect("mkdir");
        ok(c.node
            .node_stage_volume(stage_req(&id, &staging, rw()))
            .await);
        let parent = plugin.tmp().join("pods/a");
        let target = parent.join("target");
        let publish = || node_publish_req(&id, Some(&staging), &target, rw(), false);
        if strict {
            let before = state_file(&plugin);
            let msg = fails(
                c.node.node_publish_volume(publish()).await,
                Code::FailedPrecondition,
            );
            assert!(
                msg.contains("target_path") && msg.contains(&parent.display().to_string()),
                "{msg}"
            );
            assert!(!parent.exists(), "nothing is created");
            assert_eq!(state_file(&plugin), before, "a refusal changes nothing");
            fs::create_dir_all(&parent).expect("the CO makes the parent");
        }
        for _ in 0..2 {
            ok(c.node.node_publish_volume(publish()).await);
            assert_mounted(&plugin, &target, &id, false);
        }
        ok(c.node
            .node_unpublish_volume(node_unpublish_req(&id, &target))
            .await);
        assert!(!target.exists(), "the plugin removes the target it made");
        assert!(parent.is_dir(), "the parent is the CO's");

        // A target_path the CO made itself.
        fs::create_dir(&target).expect("mkdir");
        let r = c.node.node_publish_volume(publish()).await;
        if strict {
            let msg = fails(r, Code::FailedPrecondition);
            assert!(msg.contains("did not create it"), "{msg}");
            assert_not_mounted(&plugin, &target);
            assert!(target.is_dir(), "left as it was");
        } else {
            ok(r);
            ok(c.node
                .node_unpublish_volume(node_unpublish_req(&id, &target))
                .await);
            assert!(!target.exists(), "forgiving: an empty target goes");
        }
    }
}

#[tokio::test]
async fn contexts_must_be_the_ones_the_co_was_given() {
    for strict in [false, true] {
        let (plugin, mut c, id) = setup(strict, true).await;
        let node = plugin.nodeid().to_owned();
        let context = HashMap::from([("k".to_owned(), "private-value".to_owned())]);

        // ControllerPublishVolume: no PUBLISH_READONLY, and the volume has no context.
        let ro = c
            .controller
            .controller_publish_volume(publish_req(&id, &node, true))
            .await;
        refused_if(strict, ro, Code::InvalidArgument, "readonly");
        ok(c.controller
            .controller_unpublish_volume(unpublish_req(&id, &node))
            .await);
        let with_context = pb::ControllerPublishVolumeRequest {
            volume_context: context.clone(),
            ..publish_req(&id, &node, false)
        };
        refused_if(
            strict,
            c.controller.controller_publish_volume(with_context).await,
            Code::InvalidArgument,
            "",
        );
        let validate = pb::ValidateVolumeCapabilitiesRequest {
            volume_id: id.clone(),
            volume_capabilities: vec![rw()],
            volume_context: context.clone(),
            ..Default::default()
        };
        refused_if(
            strict,
            c.controller.validate_volume_capabilities(validate).await,
            Code::InvalidArgument,
            "",
        );
        ok(c.controller
            .controller_publish_volume(publish_req(&id, &node, false))
            .await);

        // Node calls: publish_context as returned, volume_context as the volume's.
        let staging = plugin.tmp().join("staging");
        fs::create_dir(&staging).expect("mkdir");
        let stage = |publish_context, volume_context| pb::NodeStageVolumeRequest {
            publish_context,
            volume_context,
            ..stage_req(&id, &staging, rw())
        };
        let mut wrong_node = node_context(&plugin);
        wrong_node.insert(
            berth_hostpath::PUBLISH_CONTEXT_NODE_KEY.to_owned(),
            "elsewhere".to_owned(),
        );
        for bad in [
            stage(HashMap::new(), HashMap::new()),
            stage(wrong_node, HashMap::new()),
            stage(node_context(&plugin), context.clone()),
        ] {
            refused_if(
                strict,
                c.node.node_stage_volume(bad).await,
                Code::InvalidArgument,
                "",
            );
            if !strict {
                ok(c.node.node_unstage_volume(unstage_req(&id, &staging)).await);
            }
        }
        ok(c.node
            .node_stage_volume(stage(node_context(&plugin), HashMap::new()))
            .await);
        let target = plugin.tmp().join("target");
        let publish = |publish_context, volume_context| pb::NodePublishVolumeRequest {
            publish_context,
            volume_context,
            ..node_publish_req(&id, Some(&staging), &target, rw(), false)
        };
        for bad in [
            publish(HashMap::new(), HashMap::new()),
            publish(node_context(&plugin), context.clone()),
        ] {
            refused_if(
                strict,
                c.node.node_publish_volume(bad).await,
                Code::InvalidArgument,
                "",
            );
            if !strict {
                ok(c.node
                    .node_unpublish_volume(node_unpublish_req(&id, &target))
                    .await);
            }
        }
        assert_not_mounted(&plugin, &target);
        ok(c.node
            .node_publish_volume(publish(node_context(&plugin), HashMap::new()))
            .await);
        assert_mounted(&plugin, &target, &id, false);
    }
}

#[tokio::test]
async fn the_cos_ordering_duties() {
    for strict in [false, true] {
        let (plugin, mut c, id) = setup(strict, true).await;
        let node = plugin.nodeid().to_owned();
        let (s1, s2) = (plugin.tmp().join("s1"), plugin.tmp().join("s2"));
        let target = plugin.tmp().join("target");
        for dir in [&s1, &s2] {
            fs::create_dir(dir).expect("mkdir");
        }
        ok(c.controller
            .controller_publish_volume(publish_req(&id, &node, false))
            .await);
        let stage = |path: &Path| pb::NodeStageVolumeRequest {
            publish_context: node_context(&plugin),
            ..stage_req(&id, path, rw())
        };
        ok(c.node.node_stage_volume(stage(&s1)).await);

        // One staging path per volume.
        let r = c.node.node_stage_volume(stage(&s2)).await;
        refused_if(
            strict,
            r,
            Code::FailedPrecondition,
            &s1.display().to_string(),
        );
        ok(c.node.node_unstage_volume(unstage_req(&id, &s2)).await);
        assert_not_mounted(&plugin, &s2);

        // Every NodeUnpublishVolume before NodeUnstageVolume.
        let publish = pb::NodePublishVolumeRequest {
            publish_context: node_context(&plugin),
            ..node_publish_req(&id, Some(&s1), &target, rw(), false)
        };
        ok(c.node.node_publish_volume(publish.clone()).await);
        let r = c.node.node_unstage_volume(unstage_req(&id, &s1)).await;
        refused_if(
            strict,
            r,
            Code::FailedPrecondition,
            &target.display().to_string(),
        );
        if strict {
            assert_mounted(&plugin, &s1, &id, false);
        } else {
            ok(c.node.node_stage_volume(stage(&s1)).await);
        }

        // NodeUnpublishVolume and NodeUnstageVolume before ControllerUnpublishVolume.
        let r = c
            .controller
            .controller_unpublish_volume(unpublish_req(&id, &node))
            .await;
        refused_if(strict, r, Code::FailedPrecondition, "still mounted");
        let r = c
            .controller
            .controller_unpublish_volume(unpublish_req(&id, ""))
            .await;
        refused_if(strict, r, Code::FailedPrecondition, "still mounted");
        if strict {
            // Still controller-published: the refusals changed nothing.
            let got = ok(c
                .controller
                .controller_get_volume(pb::ControllerGetVolumeRequest {
                    volume_id: id.clone(),
                })
                .await);
            assert_eq!(
                got.status.map(|s| s.published_node_ids),
                Some(vec![node.clone()])
            );
        } else {
            // The controller step was undone under the node's mounts; a publish comes next.
            ok(c.node
                .node_unpublish_volume(node_unpublish_req(&id, &target))
                .await);
            ok(c.node.node_publish_volume(publish.clone()).await);
        }
        ok(c.node
            .node_unpublish_volume(node_unpublish_req(&id, &target))
            .await);
        ok(c.node.node_unstage_volume(unstage_req(&id, &s1)).await);
        ok(c.controller
            .controller_unpublish_volume(unpublish_req(&id, &node))
            .await);
    }
}

#[tokio::test]
async fn stats_and_expand_want_the_staging_path_where_the_volume_is_staged() {
    for strict in [false, true] {
        let (plugin, mut c, id) = setup(strict, false).await;
        let staging = plugin.tmp().join("staging");
        let elsewhere = plugin.tmp().join("elsewhere");
        for dir in [&staging, &elsewhere] {
            fs::create_dir(dir).expect("mkdir");
        }
        ok(c.node
            .node_stage_volume(stage_req(&id, &staging, rw()))
            .await);
        let stats = |hint: &Path| pb::NodeGetVolumeStatsRequest {
            volume_id: id.clone(),
            volume_path: staging.display().to_string(),
            staging_target_path: hint.display().to_string(),
        };
        let expand = |hint: &Path| pb::NodeExpandVolumeRequest {
            volume_id: id.clone(),
            volume_path: staging.display().to_string(),
            staging_target_path: hint.display().to_string(),
            ..Default::default()
        };
        ok(c.node.node_get_volume_stats(stats(&staging)).await);
        ok(c.node.node_expand_volume(expand(&staging)).await);
        for (hint, code) in [
            (Path::new(""), Code::InvalidArgument),
            (elsewhere.as_path(), Code::FailedPrecondition),
        ] {
            let r = c.node.node_get_volume_stats(stats(hint)).await;
            let e = c.node.node_expand_volume(expand(hint)).await;
            if strict {
                let msg = fails(r, code);
                assert!(msg.contains("staging_target_path"), "{msg}");
                fails(e, code);
            } else {
                ok(r);
                ok(e);
            }
        }
    }
    // Without staging, the CO leaves it empty.
    for strict in [false, true] {
        let plugin = HostpathPlugin::builder()
            .strict(strict)
            .stage(false)
            .attach(false)
            .spawn()
            .await;
        let mut c = clients(&plugin).await;
        let id = create(&mut c, "v").await.volume_id;
        let target = plugin.tmp().join("target");
        ok(c.node
            .node_publish_volume(node_publish_req(&id, None, &target, rw(), false))
            .await);
        let stats = |hint: &str| pb::NodeGetVolumeStatsRequest {
            volume_id: id.clone(),
            volume_path: target.display().to_string(),
            staging_target_path: hint.to_owned(),
        };
        ok(c.node.node_get_volume_stats(stats("")).await);
        let r = c.node.node_get_volume_stats(stats("/some/staging")).await;
        if strict {
            fails(r, Code::InvalidArgument);
        } else {
            ok(r);
        }
    }
}

#[tokio::test]
async fn a_second_publication_with_another_capability() {
    for strict in [false, true] {
        let (plugin, mut c, id) = setup(strict, false).await;
        let staging = plugin.tmp().join("staging");
        fs::create_dir(&staging).expect("mkdir");
        let multi = mount_cap(Mode::MultiNodeMultiWriter);
        ok(c.node
            .node_stage_volume(stage_req(&id, &staging, multi.clone()))
            .await);
        let (t1, t2) = (plugin.tmp().join("t1"), plugin.tmp().join("t2"));
        ok(c.node
            .node_publish_volume(node_publish_req(
                &id,
                Some(&staging),
                &t1,
                multi.clone(),
                false,
            ))
            .await);
        // Same capability elsewhere: fine in both modes.
        ok(c.node
            .node_publish_volume(node_publish_req(&id, Some(&staging), &t2, multi, true))
            .await);
        ok(c.node
            .node_unpublish_volume(node_unpublish_req(&id, &t2))
            .await);
        let other = mount_cap(Mode::SingleNodeMultiWriter);
        let r = c
            .node
            .node_publish_volume(node_publish_req(&id, Some(&staging), &t2, other, false))
            .await;
        if strict {
            let msg = fails(r, Code::FailedPrecondition);
            assert!(msg.contains(&t1.display().to_string()), "{msg}");
            assert_not_mounted(&plugin, &t2);
            assert!(!t2.exists(), "nothing is left behind");
        } else {
            ok(r);
        }
    }
}
