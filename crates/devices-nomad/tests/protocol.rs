//! The protocol without the supervisor: a raw client of the example plugin (which is strict
//! about what the host owes it), and launch failures.

mod common;

use std::time::Duration;

use berth_devices_nomad::{
    CallFailure, LaunchError, LaunchSpec, NomadClient, PluginAddress, PluginKind, hclspec, launch,
    msgpack,
    proto::{
        base::{NomadConfig, SetConfigRequest},
        device::{StatsRequest, device_plugin_client::DevicePluginClient},
        health::{self, health_client::HealthClient},
    },
};
use berth_sys::slot::PluginSlot;
use common::{Place, marked_processes, plugin_bin};
use tokio_util::sync::CancellationToken;

fn spec(place: &Place, command: &std::path::Path, args: &[&str]) -> LaunchSpec {
    LaunchSpec {
        name: "raw".into(),
        command: command.to_path_buf(),
        args: args.iter().map(|a| (*a).to_string()).collect(),
        env: Default::default(),
        socket_dir: place.plugin_dir().join("sock"),
        log: place.plugin_dir().join("plugin.log"),
        ports: (14000, 14512),
        start_timeout: Duration::from_secs(10),
    }
}

async fn claimed(place: &Place) -> PluginSlot {
    let mut slot = PluginSlot::new("raw", &place.plugin_dir().join("plugin.log"));
    slot.claim(Duration::from_secs(2)).await.expect("claimed");
    slot
}

#[tokio::test]
async fn the_plugin_refuses_a_config_without_the_schemas_defaults() {
    let place = Place::new();
    place.add_device("a", b"");
    let slot = claimed(&place).await;
    let process = launch::launch(
        &spec(&place, &plugin_bin(), &[]),
        &slot,
        &CancellationToken::new(),
    )
    .await
    .expect("launched");
    let client = NomadClient::new("raw", process.address(), Duration::from_secs(5));
    // It listens where it was told: in PLUGIN_UNIX_SOCKET_DIR.
    let PluginAddress::Unix(socket) = process.address() else {
        panic!("not a unix socket: {}", process.address())
    };
    assert_eq!(
        socket.parent(),
        Some(place.plugin_dir().join("sock").as_path())
    );
    assert!(
        socket
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("plugin")),
        "{}",
        socket.display()
    );

    let info = client.plugin_info().await.unwrap();
    assert_eq!(info.kind, PluginKind::Device);
    assert_eq!(info.api_versions, ["v0.1.0"]);
    assert_eq!(info.name, "berth-nomad-device");
    info.check_device("raw").unwrap();

    // go-plugin's health service answers for "plugin".
    let mut health = HealthClient::new(berth_devices::grpc::unix_channel(socket));
    let status = health
        .check(health::HealthCheckRequest {
            service: "plugin".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(
        status,
        health::health_check_response::ServingStatus::Serving as i32
    );

    // Device calls before SetConfig are refused.
    let err = client.reserve(&["a".to_string()]).await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::FailedPrecondition), "{err}");
    let err = client.fingerprint().await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::FailedPrecondition), "{err}");
    let err = client.stats(Duration::from_secs(1)).await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::FailedPrecondition), "{err}");

    // A host that does not apply the schema's defaults is refused, naming a missing key.
    let only_dir = hclspec::ConfigValue::from_json(&serde_json::json!({"dir": place.dev()}));
    let err = client
        .set_config(msgpack::encode(&only_dir))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::InvalidArgument), "{err}");
    let CallFailure::Status { message, .. } = &err.failure else {
        unreachable!()
    };
    assert!(
        message.contains("is missing (the host must apply the schema's defaults)"),
        "{message}"
    );
    let err = client.set_config(Vec::new()).await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::InvalidArgument), "{err}");

    // With the schema applied it takes it; but not for an API version it does not speak.
    let schema = client.config_schema().await.unwrap().expect("a schema");
    let decoded = hclspec::apply(
        "raw",
        Some(&schema),
        &serde_json::json!({"dir": place.dev()}),
    )
    .unwrap()
    .unwrap();
    let json = decoded.to_json();
    assert_eq!(json["list_period"], "5s");
    assert_eq!(json["unhealthy_perm"], "-rwxrwxrwx");
    assert_eq!(json["attributes"], serde_json::json!({}));
    assert_eq!(json["fault_file"], "");
    let err = client
        .set_config_raw(SetConfigRequest {
            msgpack_config: msgpack::encode(&decoded),
            nomad_config: Some(NomadConfig::default()),
            plugin_api_version: "v0.2.0".into(),
        })
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("plugin_api_version \"v0.2.0\" is not supported"),
        "{err}"
    );
    client
        .set_config(msgpack::encode(&decoded))
        .await
        .expect("configured");

    // Stats only with a positive collection interval: the host owes it.
    let mut raw = DevicePluginClient::new(berth_devices::grpc::unix_channel(socket));
    for (interval, want) in [
        (None, "collection_interval is missing"),
        (
            Some(prost_types::Duration::default()),
            "collection_interval 0s must be positive",
        ),
        (
            Some(prost_types::Duration {
                seconds: -1,
                nanos: 0,
            }),
            "collection_interval -1s must be positive",
        ),
    ] {
        let status = raw
            .stats(StatsRequest {
                collection_interval: interval,
            })
            .await
            .expect_err(want);
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().starts_with(want), "{status:?}");
    }
    let err = client.stats(Duration::ZERO).await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::InvalidArgument), "{err}");
    let mut stats = client.stats(Duration::from_millis(100)).await.unwrap();
    assert!(stats.message().await.unwrap().is_some());

    // Reserve names only what Fingerprint sent: nothing before the first list.
    let err = client.reserve(&["a".to_string()]).await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::FailedPrecondition), "{err}");
    assert!(
        err.to_string()
            .contains("no device list was sent on Fingerprint"),
        "{err}"
    );
    let mut stream = client.fingerprint().await.unwrap();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.device_group[0].devices[0].id, "a");
    let reserved = client.reserve(&["a".to_string()]).await.unwrap();
    assert!(reserved.container_res.is_some());
    let err = client
        .reserve(&["a".to_string(), "a".to_string()])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::InvalidArgument), "{err}");
    assert!(err.to_string().contains("named twice"), "{err}");
    // A device that appeared since the last list is not known to the host yet.
    place.add_device("b", b"");
    let err = client.reserve(&["b".to_string()]).await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::NotFound), "{err}");
    assert!(
        err.to_string()
            .contains("unknown device \"b\" (not in the list last sent on Fingerprint)"),
        "{err}"
    );

    let pid = i32::try_from(process.pid()).unwrap();
    let stopped = process
        .stop(
            Some(&client),
            Duration::from_secs(2),
            Duration::from_secs(5),
        )
        .await;
    assert!(stopped.answered_shutdown, "{stopped:?}");
    assert!(!stopped.killed, "{stopped:?}");
    assert!(stopped.status.is_some_and(|s| s.success()), "{stopped:?}");
    assert!(!berth_sys::procs::is_alive(pid));
    assert!(slot.release(Duration::from_secs(2)).await.is_empty());
}

/// Launches `/bin/sh -c script` as a plugin and returns why it failed; checks nothing it
/// started is left.
async fn launch_sh(place: &Place, script: &str, start_timeout: Duration) -> LaunchError {
    let slot = claimed(place).await;
    let mut s = spec(place, std::path::Path::new("/bin/sh"), &["-c", script]);
    s.start_timeout = start_timeout;
    let err = launch::launch(&s, &slot, &CancellationToken::new())
        .await
        .expect_err(script);
    // The group got SIGKILL and its leader is reaped; a child of the shell may take a moment
    // more to die.
    berth_testkit::assert_eventually!(
        common::WAIT,
        || async { marked_processes(&place.plugin_dir()).is_empty() },
        "nothing left after {script:?}"
    );
    assert!(slot.release(Duration::from_secs(2)).await.is_empty());
    err
}

#[tokio::test]
async fn launch_failures_quote_what_the_binary_printed() {
    let place = Place::new();
    let normal = Duration::from_secs(10);
    let err = launch_sh(&place, "echo 'hello world'; sleep 60", normal).await;
    assert!(matches!(err, LaunchError::Handshake { .. }), "{err}");
    assert!(
        err.to_string().contains("not a go-plugin handshake line"),
        "{err}"
    );
    assert!(err.to_string().contains("hello world"), "{err}");

    let err = launch_sh(&place, "printf '%5000s' | tr ' ' x; sleep 60", normal).await;
    assert!(
        err.to_string().contains(
            "no go-plugin handshake line: no newline in the first 4096 bytes, which begin \"xxx"
        ),
        "{err}"
    );

    let err = launch_sh(&place, "echo '1|2|unix|/x|netrpc|'; sleep 60", normal).await;
    assert!(err.to_string().contains("berth speaks grpc only"), "{err}");

    let err = launch_sh(&place, "echo early >&2; exit 3", normal).await;
    assert!(matches!(err, LaunchError::Exited { .. }), "{err}");
    assert!(err.to_string().contains("exit status: 3"), "{err}");
    assert!(err.to_string().contains("early"), "{err}");

    let err = launch_sh(
        &place,
        "printf 'This binary is a plugin. These are not meant to be executed directly.\\n' >&2; exit 1",
        normal,
    )
    .await;
    assert!(matches!(err, LaunchError::NotANomadPlugin { .. }), "{err}");
    assert!(err.to_string().contains("another magic cookie"), "{err}");

    // A child that keeps the group alive: killed with it.
    let err = launch_sh(
        &place,
        "sleep 60 & echo waiting >&2; sleep 60",
        Duration::from_millis(500),
    )
    .await;
    assert!(matches!(err, LaunchError::Timeout { .. }), "{err}");
    assert!(err.to_string().contains("waiting"), "{err}");

    // The configured environment cannot break the handshake: the cookie and the protocol
    // version are set after it.
    let slot = claimed(&place).await;
    let mut bad = spec(&place, &plugin_bin(), &[]);
    bad.env
        .insert("NOMAD_PLUGIN_MAGIC_COOKIE".into(), "wrong".into());
    bad.env
        .insert("PLUGIN_PROTOCOL_VERSIONS".into(), "1".into());
    let process = launch::launch(&bad, &slot, &CancellationToken::new())
        .await
        .expect("launched");
    drop(process);
    assert!(slot.release(Duration::from_secs(2)).await.is_empty());
}

#[test]
fn the_example_plugin_checks_the_cookie_and_the_protocol_version() {
    let out = std::process::Command::new(plugin_bin())
        .env_remove("NOMAD_PLUGIN_MAGIC_COOKIE")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("This binary is a plugin"), "{stderr}");
    assert!(out.stdout.is_empty());

    let out = std::process::Command::new(plugin_bin())
        .env(
            "NOMAD_PLUGIN_MAGIC_COOKIE",
            berth_devices_nomad::handshake::MAGIC_COOKIE_VALUE,
        )
        .env("PLUGIN_PROTOCOL_VERSIONS", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("speaks version 2 only"), "{stderr}");
    assert!(out.stdout.is_empty());
}

#[tokio::test]
async fn launch_is_cancelled_cleanly() {
    let place = Place::new();
    let slot = claimed(&place).await;
    let cancel = CancellationToken::new();
    let s = spec(&place, std::path::Path::new("/bin/sh"), &["-c", "sleep 60"]);
    let launching = launch::launch(&s, &slot, &cancel);
    let canceller = async {
        // Once the process runs (it carries the slot's marks), mid-handshake.
        berth_testkit::assert_eventually!(common::WAIT, || async {
            !marked_processes(&place.plugin_dir()).is_empty()
        });
        cancel.cancel();
    };
    let (result, ()) = tokio::join!(launching, canceller);
    assert!(matches!(result, Err(LaunchError::Cancelled { .. })));
    // The group got SIGKILL and its leader is reaped; a child of the shell (`sleep`) may take
    // a moment more to die.
    berth_testkit::assert_eventually!(
        common::WAIT,
        || async { marked_processes(&place.plugin_dir()).is_empty() },
        "nothing of the cancelled plugin runs"
    );
    assert!(slot.release(Duration::from_secs(2)).await.is_empty());
}
