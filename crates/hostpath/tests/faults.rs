//! The test-only fault switch, on the real `berth-hostpath` process.

mod common;

use std::{fs, time::Duration};

use berth_csi::pb;
use berth_testkit::{HostpathPlugin, SpawnError};
use common::*;
use tokio::time::Instant;
use tonic::Code;

async fn probe(c: &mut Clients) -> Result<tonic::Response<pb::ProbeResponse>, tonic::Status> {
    c.identity.probe(pb::ProbeRequest {}).await
}

async fn node_info(
    c: &mut Clients,
) -> Result<tonic::Response<pb::NodeGetInfoResponse>, tonic::Status> {
    c.node.node_get_info(pb::NodeGetInfoRequest {}).await
}

#[tokio::test]
async fn the_first_n_calls_fail_then_calls_succeed() {
    let plugin = HostpathPlugin::builder()
        .fault("Probe:UNAVAILABLE:2")
        .fault("CreateVolume:RESOURCE_EXHAUSTED:1")
        .spawn()
        .await;
    let mut c = clients(&plugin).await;
    for _ in 0..2 {
        let msg = fails(probe(&mut c).await, Code::Unavailable);
        assert!(msg.contains("injected fault Probe:UNAVAILABLE:2"), "{msg}");
    }
    for _ in 0..2 {
        ok(probe(&mut c).await);
    }
    // Other methods are not affected by a Probe fault.
    ok(node_info(&mut c).await);

    fails(
        c.controller.create_volume(create_req("v")).await,
        Code::ResourceExhausted,
    );
    assert!(
        fs::read_dir(plugin.statedir().join("volumes"))
            .expect("dir")
            .next()
            .is_none()
    );
    create(&mut c, "v").await;
}

#[tokio::test]
async fn star_matches_every_method_and_faults_apply_in_order() {
    let plugin = HostpathPlugin::builder()
        .fault("NodeGetInfo:NOT_FOUND:1")
        .fault("*:ABORTED:2")
        .spawn()
        .await;
    let mut c = clients(&plugin).await;
    fails(node_info(&mut c).await, Code::NotFound);
    fails(node_info(&mut c).await, Code::Aborted);
    fails(probe(&mut c).await, Code::Aborted);
    ok(probe(&mut c).await);
    ok(node_info(&mut c).await);
}

#[tokio::test]
async fn faults_from_the_environment() {
    let plugin = HostpathPlugin::builder()
        .env(
            "BERTH_HOSTPATH_FAULTS",
            "Probe:DEADLINE_EXCEEDED:1,NodeGetInfo:INTERNAL:1",
        )
        .spawn()
        .await;
    let mut c = clients(&plugin).await;
    fails(probe(&mut c).await, Code::DeadlineExceeded);
    fails(node_info(&mut c).await, Code::Internal);
    ok(probe(&mut c).await);
    ok(node_info(&mut c).await);
}

#[tokio::test]
async fn delay_waits_then_answers() {
    let plugin = HostpathPlugin::builder()
        .fault("NodeGetInfo:delay=300ms:1")
        .spawn()
        .await;
    let mut c = clients(&plugin).await;
    let start = Instant::now();
    ok(node_info(&mut c).await);
    assert!(
        start.elapsed() >= Duration::from_millis(300),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn hang_never_answers_and_ends_when_the_client_goes_away() {
    let plugin = HostpathPlugin::builder()
        .fault("Probe:hang:2")
        .spawn()
        .await;
    let mut c = clients(&plugin).await;

    // A client-side deadline: the call is abandoned, the plugin drops it.
    let abandoned = tokio::time::timeout(Duration::from_millis(200), probe(&mut c)).await;
    assert!(abandoned.is_err(), "a hanging call must not answer");
    berth_testkit::assert_eventually!(
        Duration::from_secs(5),
        || {
            let plugin = &plugin;
            async move { plugin.stderr_text().contains("hung call ended") }
        },
        "the plugin drops the call its client abandoned"
    );

    // While another call hangs, the plugin keeps serving.
    let mut hanging_client = c.clone();
    let hanging = tokio::spawn(async move { probe(&mut hanging_client).await });
    berth_testkit::assert_eventually!(
        Duration::from_secs(5),
        || {
            let plugin = &plugin;
            async move { plugin.stderr_text().matches("injecting hang").count() == 2 }
        },
        "the second Probe reaches the plugin"
    );
    ok(node_info(&mut c).await);
    assert!(!hanging.is_finished());
    hanging.abort();

    // Both hangs are used up.
    ok(probe(&mut c).await);
}

#[tokio::test]
async fn exit_kills_the_process_once_and_the_count_survives_a_restart() {
    let mut plugin = HostpathPlugin::builder()
        .fault("NodeGetInfo:exit:1")
        .spawn()
        .await;
    let mut c = clients(&plugin).await;
    let status = node_info(&mut c)
        .await
        .expect_err("no answer from a process that exited");
    assert!(
        matches!(
            status.code(),
            Code::Unavailable | Code::Unknown | Code::Internal
        ),
        "{status:?}"
    );
    let exit = plugin
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("the plugin exits");
    assert_eq!(exit.code(), Some(75));
    let counters = fs::read_to_string(plugin.statedir().join("faults.state.json")).expect("counts");
    assert!(counters.contains("NodeGetInfo:exit:1"), "{counters}");

    // Same flags, same state directory: the fault is used up.
    plugin.restart().await;
    let mut c = clients(&plugin).await;
    ok(node_info(&mut c).await);
    assert!(plugin.is_running());
}

#[tokio::test]
async fn the_control_file_changes_faults_at_runtime() {
    let plugin = HostpathPlugin::builder().spawn().await;
    let mut c = clients(&plugin).await;
    ok(node_info(&mut c).await);

    plugin.set_faults(&["# one failure", "NodeGetInfo:NOT_FOUND:1"]);
    fails(node_info(&mut c).await, Code::NotFound);
    ok(node_info(&mut c).await);

    plugin.set_faults(&["Probe:PERMISSION_DENIED"]);
    for _ in 0..3 {
        fails(probe(&mut c).await, Code::PermissionDenied);
    }
    ok(node_info(&mut c).await);

    plugin.set_faults(&[]);
    ok(probe(&mut c).await);

    // A malformed control file is loud: every call fails and names it.
    plugin.set_faults(&["Probe:SOMETIMES"]);
    let msg = fails(node_info(&mut c).await, Code::Internal);
    assert!(
        msg.contains("faults") && msg.contains("Probe:SOMETIMES"),
        "{msg}"
    );
    plugin.set_faults(&["NodeGetInfo:delay=1ms"]);
    ok(node_info(&mut c).await);
}

#[tokio::test]
async fn flags_apply_before_the_control_file() {
    let plugin = HostpathPlugin::builder()
        .fault("Probe:ABORTED:1")
        .spawn()
        .await;
    let mut c = clients(&plugin).await;
    plugin.set_faults(&["Probe:UNAUTHENTICATED:1"]);
    fails(probe(&mut c).await, Code::Aborted);
    fails(probe(&mut c).await, Code::Unauthenticated);
    ok(probe(&mut c).await);
}

#[track_caller]
fn assert_refused(result: Result<HostpathPlugin, SpawnError>, spec: &str) {
    match result {
        Err(SpawnError::Exited { status, stderr }) => {
            assert!(!status.success(), "{status}");
            assert!(
                stderr.contains(spec),
                "stderr does not name {spec:?}:\n{stderr}"
            );
        }
        Err(e) => panic!("expected the plugin to exit, got: {e}"),
        Ok(_) => panic!("the plugin started with the malformed spec {spec:?}"),
    }
}

#[tokio::test]
async fn a_malformed_spec_prevents_start() {
    for spec in [
        "Probe:SOMETIMES",
        "NoSuchRpc:UNAVAILABLE",
        "Probe:hang:0",
        "Probe",
    ] {
        let result = HostpathPlugin::builder().fault(spec).try_spawn().await;
        assert_refused(result, spec);
    }
    let result = HostpathPlugin::builder()
        .env(
            "BERTH_HOSTPATH_FAULTS",
            "Probe:UNAVAILABLE:1,Probe:delay=soon",
        )
        .try_spawn()
        .await;
    assert_refused(result, "Probe:delay=soon");
}

#[tokio::test]
async fn a_malformed_control_file_prevents_restart() {
    let mut plugin = HostpathPlugin::builder().spawn().await;
    plugin.set_faults(&["Probe:UNAVAILABLE", "Probe:NOPE"]);
    let err = plugin.try_restart().await.expect_err("refuses to start");
    let SpawnError::Exited { stderr, .. } = &err else {
        panic!("expected an exit: {err}");
    };
    assert!(
        stderr.contains("Probe:NOPE") && stderr.contains("faults"),
        "{stderr}"
    );

    plugin.set_faults(&[]);
    plugin.restart().await;
    let mut c = clients(&plugin).await;
    ok(probe(&mut c).await);
}

#[tokio::test]
async fn a_hanging_call_does_not_hold_up_shutdown() {
    let mut plugin = HostpathPlugin::builder().fault("Probe:hang").spawn().await;
    let c = clients(&plugin).await;
    let mut hanging_client = c.clone();
    let hanging = tokio::spawn(async move { probe(&mut hanging_client).await });
    berth_testkit::assert_eventually!(
        Duration::from_secs(5),
        || {
            let plugin = &plugin;
            async move { plugin.stderr_text().contains("injecting hang") }
        },
        "the Probe reaches the plugin"
    );
    let pid = nix::unistd::Pid::from_raw(i32::try_from(plugin.pid()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let status = plugin
        .wait_exit(Duration::from_secs(4))
        .await
        .expect("exits before the grace period ends");
    assert_eq!(status.code(), Some(0), "{}", plugin.stderr_text());
    let answer = hanging.await.expect("task");
    fails(answer, Code::Unavailable);
    assert!(!plugin.socket().exists(), "socket removed");
}
