//! The protocol without the supervisor: a raw client of the example plugin (which is strict
//! about what the host owes it), the one-shot probe, and launch failures.

mod common;

use std::time::Duration;

use berth_devices_nomad::{
    CallFailure, InspectError, InspectOptions, LaunchError, LaunchSpec, NomadClient, PluginKind,
    hclspec, inspect_with, launch, msgpack,
    proto::{
        base::{NomadConfig, SetConfigRequest},
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

    let info = client.plugin_info().await.unwrap();
    assert_eq!(info.kind, PluginKind::Device);
    assert_eq!(info.api_versions, ["v0.1.0"]);
    assert_eq!(info.name, "berth-nomad-device");
    info.check_device("raw").unwrap();

    // go-plugin's health service answers for "plugin".
    let mut health =
        HealthClient::new(berth_devices::grpc::unix_channel(match process.address() {
            berth_devices_nomad::PluginAddress::Unix(p) => p,
            other => panic!("{other}"),
        }));
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

    let mut stream = client.fingerprint().await.unwrap();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.device_group[0].devices[0].id, "a");
    let reserved = client.reserve(&["a".to_string()]).await.unwrap();
    assert!(reserved.container_res.is_some());

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

fn options() -> InspectOptions {
    InspectOptions {
        start_timeout: Duration::from_secs(10),
        ..InspectOptions::default()
    }
}

#[tokio::test]
async fn inspect_tells_what_a_binary_is_and_leaves_nothing() {
    let place = Place::new();
    let dir = place.plugin_dir();
    let info = inspect_with(&plugin_bin(), &[], &dir, &options())
        .await
        .unwrap();
    assert_eq!(info.kind, PluginKind::Device);
    assert_eq!(info.name, "berth-nomad-device");
    assert!(marked_processes(&dir).is_empty());

    let mut driver = options();
    driver
        .env
        .insert("BERTH_NOMAD_DEVICE_TYPE".into(), "driver".into());
    let info = inspect_with(&plugin_bin(), &[], &dir, &driver)
        .await
        .unwrap();
    assert_eq!(info.kind, PluginKind::Driver);
    assert_eq!(
        info.check_device("gpu").unwrap_err().to_string(),
        "plugin \"gpu\" is a driver plugin; berth runs device plugins only"
    );
    assert!(marked_processes(&dir).is_empty());
}

async fn inspect_sh(place: &Place, script: &str, options: &InspectOptions) -> LaunchError {
    let dir = place.plugin_dir();
    let err = inspect_with(
        std::path::Path::new("/bin/sh"),
        &["-c".to_string(), script.to_string()],
        &dir,
        options,
    )
    .await
    .unwrap_err();
    assert!(
        marked_processes(&dir).is_empty(),
        "nothing left after {script:?}"
    );
    match err {
        InspectError::Launch(e) => e,
        other => panic!("not a launch error: {other}"),
    }
}

#[tokio::test]
async fn launch_failures_quote_what_the_binary_printed() {
    let place = Place::new();
    let err = inspect_sh(&place, "echo 'hello world'; sleep 60", &options()).await;
    assert!(matches!(err, LaunchError::Handshake { .. }), "{err}");
    assert!(
        err.to_string().contains("not a go-plugin handshake line"),
        "{err}"
    );
    assert!(err.to_string().contains("hello world"), "{err}");

    let err = inspect_sh(&place, "echo '1|2|unix|/x|netrpc|'; sleep 60", &options()).await;
    assert!(err.to_string().contains("berth speaks grpc only"), "{err}");

    let err = inspect_sh(&place, "echo early >&2; exit 3", &options()).await;
    assert!(matches!(err, LaunchError::Exited { .. }), "{err}");
    assert!(err.to_string().contains("exit status: 3"), "{err}");
    assert!(err.to_string().contains("early"), "{err}");

    let err = inspect_sh(
        &place,
        "printf 'This binary is a plugin. These are not meant to be executed directly.\\n' >&2; exit 1",
        &options(),
    )
    .await;
    assert!(matches!(err, LaunchError::NotANomadPlugin { .. }), "{err}");
    assert!(err.to_string().contains("another magic cookie"), "{err}");

    let quick = InspectOptions {
        start_timeout: Duration::from_millis(500),
        ..options()
    };
    // A child that keeps the group alive: killed with it.
    let err = inspect_sh(&place, "sleep 60 & echo waiting >&2; sleep 60", &quick).await;
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
    assert!(marked_processes(&place.plugin_dir()).is_empty());
    assert!(slot.release(Duration::from_secs(2)).await.is_empty());
}
