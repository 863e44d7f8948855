//! The registration server itself: its directory, its socket, and what it does with each
//! `Register`.

mod common;

use std::{
    os::unix::fs::{FileTypeExt as _, PermissionsExt as _},
    path::Path,
};

use berth_devices_kube::{
    KubeDevices, KubeError,
    proto::v1beta1::{
        DevicePluginOptions, RegisterRequest, registration_client::RegistrationClient,
    },
};
use common::*;
use tonic::Code;

fn is_socket(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket())
}

#[tokio::test]
async fn start_removes_stale_sockets_and_keeps_other_files() {
    let dirs = Dirs::new();
    let dir = dirs.kubelet();
    std::fs::create_dir_all(dir.join("subdir")).expect("mkdir");
    std::fs::write(dir.join("kubelet_internal_checkpoint"), "{}").expect("write");
    // A socket left by a dead plugin, one by a dead kubelet, and a live plugin's.
    drop(std::os::unix::net::UnixListener::bind(dir.join("dead.sock")).expect("bind"));
    drop(std::os::unix::net::UnixListener::bind(dir.join("kubelet.sock")).expect("bind"));
    let _live = std::os::unix::net::UnixListener::bind(dir.join("live.sock")).expect("bind");

    let agent = Agent::start(&dir).await;
    assert!(!dir.join("dead.sock").exists());
    assert!(
        !dir.join("live.sock").exists(),
        "kubelet removes every socket"
    );
    assert!(dir.join("subdir").is_dir());
    assert_eq!(
        std::fs::read_to_string(dir.join("kubelet_internal_checkpoint")).expect("kept"),
        "{}"
    );
    assert!(is_socket(&dir.join("kubelet.sock")));
    agent.stop().await.expect("stop");
    assert!(!dir.join("kubelet.sock").exists());
    assert!(dir.join("kubelet_internal_checkpoint").exists());
}

#[tokio::test]
async fn the_directory_is_made_private_and_an_existing_one_keeps_its_mode() {
    let dirs = Dirs::new();
    let made = dirs.tmp.path().join("new/plugins");
    let agent = Agent::start(&made).await;
    let mode = std::fs::metadata(&made).expect("made").permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    agent.stop().await.expect("stop");

    let existing = dirs.state("existing");
    std::fs::create_dir(&existing).expect("mkdir");
    std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o750)).expect("chmod");
    let agent = Agent::start(&existing).await;
    let mode = std::fs::metadata(&existing)
        .expect("kept")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o750);
    agent.stop().await.expect("stop");

    // A file where the directory should be is refused.
    let file = dirs.state("file");
    std::fs::write(&file, "").expect("write");
    let err = KubeDevices::new(config(&file))
        .expect("valid config")
        .run(
            std::sync::Arc::new(RecordingSink::default()),
            tokio_util::sync::CancellationToken::new(),
        )
        .await
        .expect_err("not a directory");
    assert!(matches!(err, KubeError::Dir { .. }), "{err}");
}

#[tokio::test]
async fn invalid_registrations_are_refused_naming_the_field() {
    let dirs = Dirs::new();
    let dir = dirs.kubelet();
    let agent = Agent::start(&dir).await;
    let _sock = std::os::unix::net::UnixListener::bind(dir.join("p.sock")).expect("bind");
    std::fs::write(dir.join("plain"), "").expect("write");
    let mut client =
        RegistrationClient::new(berth_devices::grpc::unix_channel(&dir.join("kubelet.sock")));
    let good = RegisterRequest {
        version: "v1beta1".into(),
        endpoint: "p.sock".into(),
        resource_name: RESOURCE.into(),
        options: Some(DevicePluginOptions::default()),
    };
    let cases = [
        (
            RegisterRequest {
                version: "v1alpha1".into(),
                ..good.clone()
            },
            r#"version "v1alpha1": not supported"#,
        ),
        (
            RegisterRequest {
                version: String::new(),
                ..good.clone()
            },
            r#"version "": not supported"#,
        ),
        (
            RegisterRequest {
                resource_name: "widget".into(),
                ..good.clone()
            },
            r#"resource_name "widget": must be domain/name"#,
        ),
        (
            RegisterRequest {
                resource_name: "kubernetes.io/widget".into(),
                ..good.clone()
            },
            r#"resource_name "kubernetes.io/widget": the kubernetes.io domain is reserved"#,
        ),
        (
            RegisterRequest {
                resource_name: "Example.com/widget".into(),
                ..good.clone()
            },
            r#"resource_name "Example.com/widget": the domain "Example.com" is not a DNS-1123"#,
        ),
        (
            RegisterRequest {
                endpoint: "../p.sock".into(),
                ..good.clone()
            },
            r#"endpoint "../p.sock": must be a file name in"#,
        ),
        (
            RegisterRequest {
                endpoint: "sub/p.sock".into(),
                ..good.clone()
            },
            r#"endpoint "sub/p.sock": must be a file name in"#,
        ),
        (
            RegisterRequest {
                endpoint: "plain".into(),
                ..good.clone()
            },
            r#"endpoint "plain": "#,
        ),
        (
            RegisterRequest {
                endpoint: "kubelet.sock".into(),
                ..good.clone()
            },
            r#"endpoint "kubelet.sock": is the registration socket itself"#,
        ),
    ];
    for (req, want) in cases {
        let status = client.register(req).await.expect_err(want);
        assert_eq!(status.code(), Code::InvalidArgument, "{want}");
        assert!(
            status.message().starts_with(want),
            "{:?} does not start with {want:?}",
            status.message()
        );
    }
    // A socket that does not exist (yet) is worth another try: Unavailable, not bad input.
    let status = client
        .register(RegisterRequest {
            endpoint: "gone.sock".into(),
            ..good.clone()
        })
        .await
        .expect_err("no socket");
    assert_eq!(status.code(), Code::Unavailable);
    assert!(
        status
            .message()
            .starts_with(r#"endpoint "gone.sock": socket "#)
            && status.message().contains("does not exist"),
        "{:?}",
        status.message()
    );
    assert!(
        agent.sink.records().is_empty(),
        "nothing attached: {:?}",
        agent.sink.records()
    );
    assert!(is_socket(&dir.join("p.sock")), "nothing changed");
}

#[tokio::test]
async fn a_plugin_with_an_invalid_resource_name_is_told_why() {
    let dirs = Dirs::new();
    let agent = Agent::start(&dirs.kubelet()).await;
    let out = plugin_cmd(
        &dirs.kubelet(),
        &dirs.state("s"),
        &["--resource", "kubernetes.io/widget"],
    )
    .output();
    let out = tokio::time::timeout(WAIT, out)
        .await
        .expect("the plugin gives up in time")
        .expect("run the plugin");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            r#"error: the agent refused the registration: resource_name "kubernetes.io/widget""#
        ),
        "{stderr}"
    );
    assert!(agent.sink.records().is_empty());
}

#[tokio::test]
async fn socket_paths_must_fit_in_107_bytes() {
    let dirs = Dirs::new();
    // `<tmp>/<d…>/kubelet.sock`: 108 bytes.
    let tmp_len = dirs.tmp.path().as_os_str().len();
    let long = dirs.tmp.path().join("d".repeat(108 - tmp_len - 14));
    match KubeDevices::new(config(&long)) {
        Err(e @ KubeError::SocketPathTooLong { len: 108, .. }) => {
            assert!(e.to_string().contains("must fit in 107 bytes"), "{e}");
        }
        other => panic!("expected SocketPathTooLong, got {other:?}"),
    }
    assert!(!long.exists(), "nothing was made");

    // A directory where kubelet.sock fits but a longer endpoint does not.
    let fits = dirs.tmp.path().join("d".repeat(107 - tmp_len - 14));
    let agent = Agent::start(&fits).await;
    let endpoint = "p".repeat(20);
    let mut client = RegistrationClient::new(berth_devices::grpc::unix_channel(
        &fits.join("kubelet.sock"),
    ));
    let status = client
        .register(RegisterRequest {
            version: "v1beta1".into(),
            endpoint: endpoint.clone(),
            resource_name: RESOURCE.into(),
            options: None,
        })
        .await
        .expect_err("too long");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status
            .message()
            .starts_with(&format!("endpoint \"{endpoint}\"")),
        "{}",
        status.message()
    );
    assert!(status.message().contains("must fit in 107 bytes"));
    drop(agent);

    // The plugin checks its own paths too.
    let out = plugin_cmd(&fits, &dirs.state("s"), &["--socket", &endpoint])
        .output()
        .await
        .expect("run the plugin");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--socket: socket path"), "{stderr}");
    assert!(stderr.contains("must fit in 107 bytes"), "{stderr}");
}

#[tokio::test]
async fn a_registration_socket_in_use_is_not_taken_over() {
    let dirs = Dirs::new();
    let agent = Agent::start(&dirs.kubelet()).await;
    let err = KubeDevices::new(config(&dirs.kubelet()))
        .expect("valid config")
        .run(
            std::sync::Arc::new(RecordingSink::default()),
            tokio_util::sync::CancellationToken::new(),
        )
        .await
        .expect_err("in use");
    assert!(matches!(err, KubeError::InUse { .. }), "{err}");
    assert!(err.to_string().contains("is in use"), "{err}");
    // The first one still serves.
    let _plugin = Plugin::spawn(&dirs.kubelet(), &dirs.state("s"), &["--count", "1"]);
    agent
        .sink
        .wait_devices(&widget(), 0, "devices", healthy(1))
        .await;
}

#[tokio::test]
async fn bad_config_is_refused_naming_the_field() {
    let mut c = config(Path::new("/tmp/x"));
    c.liveness_interval = std::time::Duration::ZERO;
    let err = KubeDevices::new(c).expect_err("zero interval");
    assert_eq!(
        err.to_string(),
        "device plugin config: liveness_interval: must be longer than zero"
    );
}

#[tokio::test]
async fn a_running_plugin_registers_again_when_the_registration_server_restarts() {
    let dirs = Dirs::new();
    let (agent, plugin, _) = agent_and_plugin(&dirs, &["--count", "2"], 2).await;
    agent.stop().await.expect("stop");
    assert!(!dirs.kubelet().join("kubelet.sock").exists());

    // A new agent on the same directory: it removes the plugin's socket as stale and creates
    // kubelet.sock; the plugin re-creates its socket and registers by itself.
    let agent = Agent::start(&dirs.kubelet()).await;
    agent
        .sink
        .wait_devices(&widget(), 0, "devices from the running plugin", healthy(2))
        .await;
    let registers: Vec<_> = plugin
        .calls_named("Register")
        .into_iter()
        .filter(|c| c["ok"] == true)
        .collect();
    assert!(registers.len() >= 2, "{registers:?}");
    assert!(is_socket(&dirs.kubelet().join("berth-widget.sock")));
}
