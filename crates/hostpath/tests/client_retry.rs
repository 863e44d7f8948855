//! Retries, deadlines, cancellation and reconnection, against the real berth-hostpath process
//! with its fault switch.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use berth_csi::{
    CallObserver, Code, CreateVolume, CsiClient, CsiError, Endpoint, EndpointError, RetryPolicy,
    Rpc,
    model::{AccessMode, ExternalId, MountOptions, VolumeCapability},
};
use berth_testkit::HostpathPlugin;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Records every attempt the client makes.
#[derive(Default)]
struct Attempts(Mutex<Vec<Attempt>>);

/// One attempt: which RPC, its number, how it ended.
type Attempt = (Rpc, u32, Result<(), Code>);

impl CallObserver for Attempts {
    fn on_attempt(&self, rpc: Rpc, attempt: u32, outcome: Result<(), Code>, _latency: Duration) {
        self.0.lock().expect("lock").push((rpc, attempt, outcome));
    }
}

impl Attempts {
    fn of(&self, rpc: Rpc) -> Vec<Result<(), Code>> {
        self.0
            .lock()
            .expect("lock")
            .iter()
            .filter(|(r, ..)| *r == rpc)
            .map(|(.., o)| *o)
            .collect()
    }
}

fn fast(attempt_ms: u64, overall_ms: u64) -> RetryPolicy {
    RetryPolicy {
        attempt_timeout: Duration::from_millis(attempt_ms),
        overall_timeout: Duration::from_millis(overall_ms),
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(100),
        ..Rpc::NodeStageVolume.policy()
    }
}

fn create(name: &str) -> CreateVolume {
    CreateVolume {
        name: name.into(),
        capabilities: vec![VolumeCapability::mount(
            AccessMode::SingleNodeWriter,
            MountOptions::default(),
        )],
        ..Default::default()
    }
}

fn endpoint(plugin: &HostpathPlugin) -> Endpoint {
    Endpoint::parse(&plugin.endpoint()).expect("endpoint")
}

#[tokio::test]
async fn unavailable_twice_then_success_succeeds_on_attempt_three() {
    let plugin = HostpathPlugin::builder()
        .fault("CreateVolume:UNAVAILABLE:2")
        .spawn()
        .await;
    let seen = Arc::new(Attempts::default());
    let c = CsiClient::builder(endpoint(&plugin))
        .observer(seen.clone())
        .build();
    let vol = c
        .create_volume(&create("retried"))
        .await
        .expect("third attempt succeeds");
    assert!(!vol.external_id.as_str().is_empty());
    assert_eq!(
        seen.of(Rpc::CreateVolume),
        vec![Err(Code::Unavailable), Err(Code::Unavailable), Ok(())]
    );
}

#[tokio::test]
async fn invalid_argument_fails_at_once_after_one_attempt() {
    let plugin = HostpathPlugin::builder()
        .fault("CreateVolume:INVALID_ARGUMENT")
        .spawn()
        .await;
    let seen = Arc::new(Attempts::default());
    let c = CsiClient::builder(endpoint(&plugin))
        .observer(seen.clone())
        .build();
    let err = c
        .create_volume(&create("refused"))
        .await
        .expect_err("not retried");
    match &err {
        CsiError::Rpc {
            rpc: Rpc::CreateVolume,
            code: Code::InvalidArgument,
            attempts: 1,
            already_done: false,
            ..
        } => {}
        other => panic!("unexpected {other:?}"),
    }
    assert!(!err.is_retryable());
    assert_eq!(seen.of(Rpc::CreateVolume), vec![Err(Code::InvalidArgument)]);
}

#[tokio::test]
async fn aborted_is_retried_where_an_operation_is_pending_but_not_for_list() {
    let plugin = HostpathPlugin::builder()
        .fault("CreateVolume:ABORTED:1")
        .fault("ListVolumes:ABORTED:1")
        .spawn()
        .await;
    let seen = Arc::new(Attempts::default());
    let c = CsiClient::builder(endpoint(&plugin))
        .observer(seen.clone())
        .build();
    c.create_volume(&create("pending"))
        .await
        .expect("retried past ABORTED");
    assert_eq!(seen.of(Rpc::CreateVolume), vec![Err(Code::Aborted), Ok(())]);
    let err = c
        .list_volumes(0, "")
        .await
        .expect_err("ABORTED means a bad token for list");
    assert_eq!(err.code(), Code::Aborted);
    assert_eq!(seen.of(Rpc::ListVolumes).len(), 1);
}

#[tokio::test]
async fn a_hung_rpc_hits_the_attempt_deadline_and_the_overall_deadline_bounds_the_call() {
    let plugin = HostpathPlugin::builder()
        .fault("NodeGetInfo:hang")
        .spawn()
        .await;
    let seen = Arc::new(Attempts::default());
    let c = CsiClient::builder(endpoint(&plugin))
        .policy(Rpc::NodeGetInfo, fast(200, 1_000))
        .observer(seen.clone())
        .build();
    let start = Instant::now();
    let err = c.node_info().await.expect_err("hangs");
    let elapsed = start.elapsed();
    match &err {
        CsiError::Exhausted {
            rpc: Rpc::NodeGetInfo,
            code: Code::DeadlineExceeded,
            attempts,
            ..
        } => {
            assert!(
                *attempts >= 2,
                "the per-attempt deadline fired and it retried: {attempts}"
            );
        }
        other => panic!("unexpected {other:?}"),
    }
    let outcomes = seen.of(Rpc::NodeGetInfo);
    assert!(
        outcomes.iter().all(|o| *o == Err(Code::DeadlineExceeded)),
        "{outcomes:?}"
    );
    // The overall deadline bounds the call (generous slack for a loaded machine).
    assert!(elapsed >= Duration::from_millis(400), "{elapsed:?}");
    assert!(elapsed < Duration::from_millis(2_500), "{elapsed:?}");
    // The plugin is otherwise fine.
    assert!(c.probe().await.expect("probe"));
}

#[tokio::test]
async fn the_plugin_restarted_behind_the_same_socket_answers_the_next_call() {
    let mut plugin = HostpathPlugin::builder().spawn().await;
    let c = CsiClient::new(endpoint(&plugin));
    let before = c.plugin_info().await.expect("info");
    let first_pid = plugin.pid();
    plugin.restart().await;
    assert_ne!(plugin.pid(), first_pid);
    let after = c.plugin_info().await.expect("the same client reconnects");
    assert_eq!(before, after);
    assert!(c.probe().await.expect("probe"));
}

#[tokio::test]
async fn not_found_on_teardown_is_already_done_and_elsewhere_is_not() {
    let plugin = HostpathPlugin::builder()
        .fault("NodeUnpublishVolume:NOT_FOUND:1")
        .fault("NodePublishVolume:NOT_FOUND:1")
        .spawn()
        .await;
    let c = CsiClient::new(endpoint(&plugin));
    let id = ExternalId::new("whatever").expect("id");
    let err = c
        .node_unpublish(&id, &plugin.tmp().join("t"))
        .await
        .expect_err("injected");
    assert!(err.is_already_done(), "{err}");
    let publish = berth_csi::NodePublish {
        external_id: id,
        staging_path: None,
        target_path: plugin.tmp().join("t"),
        capability: VolumeCapability::mount(AccessMode::SingleNodeWriter, MountOptions::default()),
        read_only: false,
        publish_context: Default::default(),
        volume_context: Default::default(),
        secrets: Default::default(),
    };
    let err = c.node_publish(&publish).await.expect_err("injected");
    assert!(
        !err.is_already_done() && err.code() == Code::NotFound,
        "{err}"
    );
}

#[tokio::test]
async fn cancellation_is_reported_as_cancellation() {
    let plugin = HostpathPlugin::builder()
        .fault("NodeGetInfo:hang")
        .log_level("debug")
        .spawn()
        .await;
    let token = CancellationToken::new();
    let c = CsiClient::builder(endpoint(&plugin))
        .cancellation(token.clone())
        .build();
    let call = tokio::spawn(async move { c.node_info().await });
    // Cancel once the hung call is in flight at the plugin.
    berth_testkit::assert_eventually!(Duration::from_secs(5), || async {
        plugin.stderr_text().contains("NodeGetInfo")
    });
    token.cancel();
    let err = call.await.expect("join").expect_err("cancelled");
    assert!(err.is_cancelled(), "{err:?}");
    assert_eq!(err.code(), Code::Cancelled);
}

#[tokio::test]
async fn missing_socket_and_non_socket_get_clear_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Missing: transient (a plugin may be starting), so retried until the deadline, then named.
    let missing = Endpoint::from_path(dir.path().join("gone.sock")).expect("endpoint");
    let c = CsiClient::builder(missing)
        .policy(Rpc::Probe, fast(100, 300))
        .build();
    let err = c.probe().await.expect_err("missing");
    assert!(
        matches!(
            &err,
            CsiError::Endpoint {
                source: EndpointError::Missing { .. },
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("does not exist"), "{err}");
    assert!(
        !dir.path().join("gone.sock").exists(),
        "nothing was created"
    );

    // Not a socket: permanent, so it fails at the first attempt.
    let file = dir.path().join("file.sock");
    std::fs::write(&file, b"not a socket").expect("write");
    let seen = Arc::new(Attempts::default());
    let c = CsiClient::builder(Endpoint::from_path(&file).expect("endpoint"))
        .observer(seen.clone())
        .build();
    let err = c.probe().await.expect_err("not a socket");
    assert!(
        matches!(
            &err,
            CsiError::Endpoint {
                source: EndpointError::NotSocket { .. },
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("not a unix socket"), "{err}");
    assert_eq!(seen.of(Rpc::Probe).len(), 1);
    assert_eq!(
        std::fs::read(&file).expect("read"),
        b"not a socket",
        "left untouched"
    );

    // Too long: refused before anything happens.
    let long = dir.path().join("x".repeat(120));
    let err = Endpoint::from_path(&long).expect_err("too long");
    assert!(err.to_string().contains("107 bytes"), "{err}");
}
