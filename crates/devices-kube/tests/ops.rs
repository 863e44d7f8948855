//! The manager's calls through the ops of an attached plugin: Allocate, GetPreferredAllocation,
//! PreStartContainer, and how their failures come back.

mod common;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use berth_devices::{
    model::{DeviceMount, DeviceNode},
    plugin::PluginError,
};
use common::*;

fn ids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_string()).collect()
}

#[tokio::test]
async fn reserve_returns_the_container_edits() {
    let dirs = Dirs::new();
    let (agent, plugin, _) =
        agent_and_plugin(&dirs, &["--count", "3", "--device-node", "/dev/null"], 3).await;
    let (_, ops) = agent.sink.ops(&widget());
    let edits = ops
        .reserve(&ids(&["widget-0", "widget-2"]))
        .await
        .expect("Allocate");

    assert_eq!(edits.env["WIDGET_IDS"], "widget-0,widget-2");
    assert_eq!(edits.env["WIDGET_WIDGET_0"], "present");
    assert_eq!(edits.env["WIDGET_WIDGET_2"], "present");
    assert_eq!(edits.env.len(), 3);
    let mut mounts = edits.mounts.clone();
    mounts.sort_by(|a, b| a.task_path.cmp(&b.task_path));
    assert_eq!(
        mounts,
        ["widget-0", "widget-2"].map(|id| DeviceMount {
            host_path: plugin.state.join("widgets").join(id),
            task_path: PathBuf::from(format!("/widgets/{id}")),
            read_only: true,
        })
    );
    assert!(plugin.state.join("widgets/widget-0").is_dir());
    let mut nodes = edits.device_nodes.clone();
    nodes.sort_by(|a, b| a.task_path.cmp(&b.task_path));
    assert_eq!(
        nodes,
        ["widget-0", "widget-2"].map(|id| DeviceNode {
            host_path: PathBuf::from("/dev/null"),
            task_path: PathBuf::from(format!("/dev/{id}")),
            permissions: "rw".into(),
        })
    );
    assert!(edits.cdi_devices.is_empty());

    // One Allocate with one container request.
    let allocs = plugin.calls_named("Allocate");
    assert_eq!(allocs.len(), 1, "{allocs:?}");
    assert_eq!(
        allocs[0]["containers"],
        serde_json::json!([["widget-0", "widget-2"]])
    );
}

#[tokio::test]
async fn cdi_device_names_are_kept_for_the_manager() {
    let dirs = Dirs::new();
    let (agent, _plugin, _) =
        agent_and_plugin(&dirs, &["--count", "2", "--cdi", "example.com/widget"], 2).await;
    let (_, ops) = agent.sink.ops(&widget());
    let edits = ops.reserve(&ids(&["widget-1"])).await.expect("Allocate");
    assert_eq!(edits.cdi_devices, ["example.com/widget=widget-1"]);
    assert!(edits.device_nodes.is_empty());
    assert_eq!(edits.mounts.len(), 1);
}

#[tokio::test]
async fn the_plugin_refusing_a_call_is_reported_with_its_message() {
    let dirs = Dirs::new();
    let (agent, plugin, _) = agent_and_plugin(&dirs, &["--count", "2"], 2).await;
    let (_, ops) = agent.sink.ops(&widget());
    match ops.reserve(&ids(&["widget-9"])).await {
        Err(PluginError::Refused {
            plugin: p,
            call,
            message,
        }) => {
            assert_eq!(p, widget());
            assert_eq!(call, "Allocate");
            assert!(message.contains("\"widget-9\" is unknown"), "{message}");
        }
        other => panic!("expected Refused, got {other:?}"),
    }

    // An unhealthy device is refused too (the plugin is strict about the caller's duties).
    let since = agent.sink.len();
    plugin.set_faults("unhealthy");
    agent
        .sink
        .wait_devices(&widget(), since, "unhealthy", |g| {
            g.instances.iter().all(|i| !i.healthy)
        })
        .await;
    let err = ops
        .reserve(&ids(&["widget-0"]))
        .await
        .expect_err("unhealthy");
    assert!(err.to_string().contains("unhealthy"), "{err}");
}

#[tokio::test]
async fn answers_that_break_the_protocol_are_refused() {
    let dirs = Dirs::new();
    let (agent, plugin, _) = agent_and_plugin(&dirs, &["--count", "3", "--preferred"], 3).await;
    let (_, ops) = agent.sink.ops(&widget());
    plugin.set_faults("bad-answer");
    match ops.reserve(&ids(&["widget-0"])).await {
        Err(PluginError::BadAnswer { call, reason, .. }) => {
            assert_eq!(call, "Allocate");
            assert!(
                reason.contains("mount 0: task_path \"widgets/widget-0\" is not an absolute path"),
                "{reason}"
            );
        }
        other => panic!("expected BadAnswer, got {other:?}"),
    }
    let all = ids(&["widget-0", "widget-1", "widget-2"]);
    match ops.preferred(&all, &[], 1).await {
        Err(PluginError::BadAnswer { call, reason, .. }) => {
            assert_eq!(call, "GetPreferredAllocation");
            assert!(reason.contains("2 devices named, 1 asked for"), "{reason}");
        }
        other => panic!("expected BadAnswer, got {other:?}"),
    }
}

#[tokio::test]
async fn preferred_allocation_is_asked_honoured_and_validated() {
    let dirs = Dirs::new();
    let (agent, plugin, _) =
        agent_and_plugin(&dirs, &["--count", "6", "--numa", "2", "--preferred"], 6).await;
    let (_, ops) = agent.sink.ops(&widget());
    let all = ids(&[
        "widget-0", "widget-1", "widget-2", "widget-3", "widget-4", "widget-5",
    ]);
    // Same NUMA node, lowest ids first.
    assert_eq!(
        ops.preferred(&all, &[], 2).await.expect("preferred"),
        Some(ids(&["widget-0", "widget-2"]))
    );
    // A required device on node 1 pulls node 1's devices.
    assert_eq!(
        ops.preferred(&all, &ids(&["widget-3"]), 3)
            .await
            .expect("preferred"),
        Some(ids(&["widget-3", "widget-1", "widget-5"]))
    );
    let asked = plugin.calls_named("GetPreferredAllocation");
    assert_eq!(asked.len(), 2);
    assert_eq!(
        asked[1]["requests"][0]["must_include"],
        serde_json::json!(["widget-3"])
    );
    assert_eq!(asked[1]["requests"][0]["size"], 3);

    // Requests that make no sense are refused by the plugin, naming the problem.
    let some = ids(&["widget-0", "widget-1"]);
    let err = ops
        .preferred(&some, &ids(&["widget-4"]), 1)
        .await
        .expect_err("must_include not available");
    assert!(
        err.to_string()
            .contains("must_include device \"widget-4\" is not among those available"),
        "{err}"
    );
    let err = ops.preferred(&some, &[], 3).await.expect_err("too many");
    assert!(
        err.to_string()
            .contains("allocation_size 3 is more than the 2"),
        "{err}"
    );
}

#[tokio::test]
async fn preferred_is_not_asked_of_a_plugin_that_does_not_offer_it() {
    let dirs = Dirs::new();
    let (agent, plugin, _) = agent_and_plugin(&dirs, &["--count", "2"], 2).await;
    let (_, ops) = agent.sink.ops(&widget());
    let all = ids(&["widget-0", "widget-1"]);
    assert_eq!(ops.preferred(&all, &[], 1).await.expect("no call"), None);
    assert!(plugin.calls_named("GetPreferredAllocation").is_empty());
}

#[tokio::test]
async fn pre_start_is_called_only_when_the_plugin_asks_for_it() {
    let dirs = Dirs::new();
    let (agent, plugin, _) = agent_and_plugin(&dirs, &["--count", "2", "--pre-start"], 2).await;
    let (_, ops) = agent.sink.ops(&widget());
    ops.pre_start(&ids(&["widget-1"])).await.expect("pre-start");
    let calls = plugin.calls_named("PreStartContainer");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["devices"], serde_json::json!(["widget-1"]));
    assert_eq!(calls[0]["ok"], true);
    drop(agent);

    let dirs = Dirs::new();
    let (agent, plugin, _) = agent_and_plugin(&dirs, &["--count", "2"], 2).await;
    let (_, ops) = agent.sink.ops(&widget());
    ops.pre_start(&ids(&["widget-1"]))
        .await
        .expect("nothing to do");
    assert!(plugin.calls_named("PreStartContainer").is_empty());
}

#[tokio::test]
async fn calls_fail_unavailable_once_the_connection_is_gone() {
    let dirs = Dirs::new();
    let (agent, mut plugin, _) = agent_and_plugin(&dirs, &["--count", "2"], 2).await;
    let (_, ops) = agent.sink.ops(&widget());
    let since = agent.sink.len();
    assert!(plugin.stop().await.success());
    agent
        .sink
        .wait_down(&widget(), since, "Down after the plugin stopped", |_, _| {
            true
        })
        .await;
    match ops.reserve(&ids(&["widget-0"])).await {
        Err(PluginError::Unavailable { plugin: p, .. }) => assert_eq!(p, widget()),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(!Path::new(&dirs.kubelet().join("berth-widget.sock")).exists());
}

#[tokio::test]
async fn a_call_without_an_answer_times_out() {
    let dirs = Dirs::new();
    let mut cfg = config(&dirs.kubelet());
    // No liveness check gets in the way here.
    cfg.liveness_interval = Duration::from_secs(600);
    cfg.call_timeout = Duration::from_millis(300);
    cfg.pre_start_timeout = Duration::from_millis(400);
    let agent = Agent::start_with(cfg).await;
    let plugin = Plugin::spawn(
        &dirs.kubelet(),
        &dirs.state("s"),
        &["--count", "1", "--pre-start"],
    );
    agent
        .sink
        .wait_devices(&widget(), 0, "devices", healthy(1))
        .await;
    let (_, ops) = agent.sink.ops(&widget());
    plugin.set_faults("hang");
    match ops.reserve(&ids(&["widget-0"])).await {
        Err(PluginError::Timeout { call, after, .. }) => {
            assert_eq!(call, "Allocate");
            assert_eq!(after, Duration::from_millis(300));
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    match ops.pre_start(&ids(&["widget-0"])).await {
        Err(e @ PluginError::Timeout { .. }) => {
            assert_eq!(
                e.to_string(),
                "device plugin kubernetes:example.com/widget did not answer PreStartContainer \
                 within 400ms"
            );
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
}

#[tokio::test]
async fn the_options_the_plugin_answers_are_the_ones_used() {
    use berth_devices_kube::proto::v1beta1::{
        DevicePluginOptions, RegisterRequest, registration_client::RegistrationClient,
    };
    let dirs = Dirs::new();
    let agent = Agent::start(&dirs.kubelet()).await;
    // A plugin that offers neither optional call, registered by hand claiming both.
    let plugin = Plugin::spawn(
        &dirs.kubelet(),
        &dirs.state("s"),
        &["--count", "2", "--no-register", "--socket", "quiet.sock"],
    );
    let socket = dirs.kubelet().join("quiet.sock");
    berth_testkit::assert_eventually!(WAIT, || async { socket.exists() }, "the plugin serves");
    let mut client = RegistrationClient::new(berth_devices::grpc::unix_channel(
        &dirs.kubelet().join("kubelet.sock"),
    ));
    client
        .register(RegisterRequest {
            version: "v1beta1".into(),
            endpoint: "quiet.sock".into(),
            resource_name: RESOURCE.into(),
            options: Some(DevicePluginOptions {
                pre_start_required: true,
                get_preferred_allocation_available: true,
            }),
        })
        .await
        .expect("registered");
    agent
        .sink
        .wait_devices(&widget(), 0, "devices", healthy(2))
        .await;
    let (_, ops) = agent.sink.ops(&widget());
    let all = ids(&["widget-0", "widget-1"]);
    assert_eq!(ops.preferred(&all, &[], 1).await.expect("not asked"), None);
    ops.pre_start(&all).await.expect("not asked");
    assert!(plugin.calls_named("GetPreferredAllocation").is_empty());
    assert!(plugin.calls_named("PreStartContainer").is_empty());
}

#[tokio::test]
async fn the_plugin_checks_ids_against_the_list_it_last_sent() {
    use berth_devices_kube::proto::v1beta1::{
        AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Empty,
        PreferredAllocationRequest, device_plugin_client::DevicePluginClient,
    };
    let dirs = Dirs::new();
    // Served, not registered: a raw client is the caller.
    let plugin = Plugin::spawn(
        &dirs.kubelet(),
        &dirs.state("s"),
        &["--count", "2", "--preferred", "--no-register"],
    );
    let socket = dirs.kubelet().join("berth-widget.sock");
    berth_testkit::assert_eventually!(WAIT, || async { socket.exists() }, "the plugin serves");
    let mut client = DevicePluginClient::new(berth_devices::grpc::unix_channel(&socket));
    let allocate = |ids: &[&str]| AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_ids: self::ids(ids),
        }],
    };
    let preferred = PreferredAllocationRequest {
        container_requests: vec![ContainerPreferredAllocationRequest {
            available_device_i_ds: ids(&["widget-0", "widget-1"]),
            must_include_device_i_ds: Vec::new(),
            allocation_size: 1,
        }],
    };

    // Nothing sent yet: no id can be known to the caller.
    for status in [
        client
            .allocate(allocate(&["widget-0"]))
            .await
            .expect_err("nothing sent"),
        client
            .get_preferred_allocation(preferred.clone())
            .await
            .expect_err("nothing sent"),
    ] {
        assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
        assert!(
            status
                .message()
                .contains("no device list was sent on ListAndWatch"),
            "{status:?}"
        );
    }

    let mut stream = client
        .list_and_watch(Empty {})
        .await
        .expect("ListAndWatch")
        .into_inner();
    let first = stream.message().await.expect("a list").expect("a list");
    assert_eq!(first.devices.len(), 2);
    client
        .allocate(allocate(&["widget-1"]))
        .await
        .expect("listed and healthy");
    client
        .get_preferred_allocation(preferred)
        .await
        .expect("listed and healthy");
    let status = client
        .allocate(allocate(&["widget-1", "widget-1"]))
        .await
        .expect_err("twice");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("named twice"), "{status:?}");

    // Unhealthy in the list the caller was sent: refused, though nothing else changed.
    plugin.set_faults("unhealthy");
    let next = stream.message().await.expect("a list").expect("a list");
    assert!(next.devices.iter().all(|d| d.health == "Unhealthy"));
    let status = client
        .allocate(allocate(&["widget-0"]))
        .await
        .expect_err("unhealthy");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status
            .message()
            .contains("\"widget-0\" is unhealthy in the list last sent on ListAndWatch"),
        "{status:?}"
    );
}
