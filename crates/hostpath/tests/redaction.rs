//! Secrets and mount flags given to every RPC that takes them appear nowhere: not in Debug or
//! Display output of requests, answers or errors, not in the client's trace-level log, not in
//! the plugin's trace-level log, and not in error text even when a plugin echoes them back.

use std::{
    collections::BTreeMap,
    io,
    sync::{Arc, Mutex},
};

use berth_csi::{
    CapacityRange, ContentSource, ControllerPublish, CreateVolume, CsiClient, Endpoint, NodeExpand,
    NodePublish, NodeStage, REDACTED, Rpc,
    model::{AccessMode, ExternalId, MountFlags, MountOptions, Secrets, VolumeCapability},
    pb,
};
use berth_testkit::HostpathPlugin;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

const SECRET: &str = "s3cr3t-Pa55word-7f1c";
const FLAG: &str = "flag-credential-9d2e";

fn secrets() -> Secrets {
    Secrets::new(BTreeMap::from([(
        "password".to_string(),
        SECRET.to_string(),
    )]))
}

fn cap() -> VolumeCapability {
    VolumeCapability::mount(
        AccessMode::SingleNodeWriter,
        MountOptions {
            fs_type: String::new(),
            mount_flags: MountFlags::new(vec![FLAG.to_string()]),
            volume_mount_group: String::new(),
        },
    )
}

/// A `MakeWriter` that appends to a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("lock")).into_owned()
    }
}

fn assert_clean(what: &str, text: &str) {
    assert!(!text.contains(SECRET), "{what} leaks the secret:\n{text}");
    assert!(!text.contains(FLAG), "{what} leaks the mount flag:\n{text}");
}

/// Debug and Display of a result, whichever way it went.
fn show<T: std::fmt::Debug>(r: &Result<T, berth_csi::CsiError>) -> String {
    match r {
        Ok(v) => format!("{v:?} {v:#?}"),
        Err(e) => format!("{e} {e:?} {e:#?}"),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn secrets_and_flags_never_show_against_the_real_plugin() {
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let plugin = HostpathPlugin::builder().log_level("trace").spawn().await;
    let c = CsiClient::new(Endpoint::parse(&plugin.endpoint()).expect("endpoint"));
    let mut seen = String::new();

    let create = CreateVolume {
        name: "secretive".into(),
        capacity: CapacityRange {
            required_bytes: 1 << 20,
            limit_bytes: 0,
        },
        capabilities: vec![cap()],
        parameters: BTreeMap::new(),
        secrets: secrets(),
        source: None,
        accessibility_requirements: None,
    };
    seen += &format!("{create:?} {create:#?}");
    let vol = c.create_volume(&create).await;
    seen += &show(&vol);
    let vol = vol.expect("create");
    let id = vol.external_id.clone();

    let r = c
        .validate_capabilities(&id, &[cap()], &vol.context, &BTreeMap::new(), &secrets())
        .await;
    seen += &show(&r);
    let r = c.get_capacity(&[cap()], &BTreeMap::new(), None).await;
    seen += &show(&r);

    let node_id = c.node_info().await.expect("node info").node_id;
    let publish = ControllerPublish {
        external_id: id.clone(),
        node_id: node_id.clone(),
        capability: cap(),
        read_only: false,
        volume_context: vol.context.clone(),
        secrets: secrets(),
    };
    seen += &format!("{publish:?}");
    let ctx = c.controller_publish(&publish).await;
    seen += &show(&ctx);
    let ctx = ctx.expect("controller publish");

    let staging = plugin.tmp().join("staging");
    let stage = NodeStage {
        external_id: id.clone(),
        staging_path: staging.clone(),
        capability: cap(),
        publish_context: ctx.clone(),
        volume_context: vol.context.clone(),
        secrets: secrets(),
    };
    seen += &format!("{stage:?} {stage:#?}");
    seen += &show(&c.node_stage(&stage).await);

    let target = plugin.tmp().join("target");
    let node_publish = NodePublish {
        external_id: id.clone(),
        staging_path: Some(staging.clone()),
        target_path: target.clone(),
        capability: cap(),
        read_only: false,
        publish_context: ctx,
        volume_context: vol.context.clone(),
        secrets: secrets(),
    };
    seen += &format!("{node_publish:?}");
    seen += &show(&c.node_publish(&node_publish).await);

    let r = c
        .controller_expand(
            &id,
            CapacityRange {
                required_bytes: 2 << 20,
                limit_bytes: 0,
            },
            Some(&cap()),
            &secrets(),
        )
        .await;
    seen += &show(&r);
    let expand = NodeExpand {
        external_id: id.clone(),
        volume_path: target.clone(),
        staging_path: Some(staging.clone()),
        capacity: CapacityRange {
            required_bytes: 2 << 20,
            limit_bytes: 0,
        },
        capability: Some(cap()),
        secrets: secrets(),
    };
    seen += &format!("{expand:?}");
    seen += &show(&c.node_expand(&expand).await);

    let snap = c
        .create_snapshot(&id, "snap", &BTreeMap::new(), &secrets())
        .await;
    seen += &show(&snap);
    let snap = snap.expect("snapshot");
    seen += &show(&c.list_snapshots(Some(&id), None, 0, "", &secrets()).await);
    let clone = CreateVolume {
        name: "from-snap".into(),
        source: Some(ContentSource::Snapshot(snap.snapshot_id.clone())),
        ..create.clone()
    };
    seen += &show(&c.create_volume(&clone).await);
    seen += &show(&c.delete_snapshot(&snap.snapshot_id, &secrets()).await);

    seen += &show(&c.node_unpublish(&id, &target).await);
    seen += &show(&c.node_unstage(&id, &staging).await);
    seen += &show(&c.controller_unpublish(&id, &node_id, &secrets()).await);
    seen += &show(&c.delete_volume(&id, &secrets()).await);

    // Failures too: calls the plugin refuses, with secrets attached.
    let missing = ExternalId::new("no-such-volume").expect("id");
    let bad_publish = ControllerPublish {
        external_id: missing.clone(),
        ..publish
    };
    let r = c.controller_publish(&bad_publish).await;
    assert!(r.is_err());
    seen += &show(&r);
    let bad_stage = NodeStage {
        external_id: missing,
        ..stage
    };
    let r = c.node_stage(&bad_stage).await;
    assert!(r.is_err());
    seen += &show(&r);

    assert!(
        seen.contains(REDACTED),
        "the redaction marker shows where values were"
    );
    assert_clean("Debug/Display output", &seen);
    let client_log = log.text();
    assert!(
        client_log.contains("TRACE") && client_log.contains("sending"),
        "trace log captured:\n{client_log}"
    );
    assert!(
        client_log.contains(REDACTED),
        "requests are logged, redacted:\n{client_log}"
    );
    assert_clean("the client's trace log", &client_log);
    let plugin_log = plugin.stderr_text();
    assert!(
        plugin_log.contains("NodeStageVolume"),
        "plugin trace log captured:\n{plugin_log}"
    );
    assert_clean("the plugin's trace log", &plugin_log);
}

/// A node plugin that echoes the secrets and mount flags it gets in its error messages.
struct Echo;

fn echo(
    secrets: &std::collections::HashMap<String, String>,
    cap: Option<&pb::VolumeCapability>,
) -> Status {
    let flags = match cap.and_then(|c| c.access_type.as_ref()) {
        Some(pb::volume_capability::AccessType::Mount(m)) => m.mount_flags.join(","),
        _ => String::new(),
    };
    let secrets: Vec<_> = secrets.values().cloned().collect();
    Status::permission_denied(format!(
        "login with {} and flags {flags} refused",
        secrets.join(",")
    ))
}

#[tonic::async_trait]
impl pb::node_server::Node for Echo {
    async fn node_stage_volume(
        &self,
        r: Request<pb::NodeStageVolumeRequest>,
    ) -> Result<Response<pb::NodeStageVolumeResponse>, Status> {
        let r = r.into_inner();
        Err(echo(&r.secrets, r.volume_capability.as_ref()))
    }
    async fn node_unstage_volume(
        &self,
        _: Request<pb::NodeUnstageVolumeRequest>,
    ) -> Result<Response<pb::NodeUnstageVolumeResponse>, Status> {
        Err(Status::unimplemented("unstage"))
    }
    async fn node_publish_volume(
        &self,
        r: Request<pb::NodePublishVolumeRequest>,
    ) -> Result<Response<pb::NodePublishVolumeResponse>, Status> {
        let r = r.into_inner();
        Err(echo(&r.secrets, r.volume_capability.as_ref()))
    }
    async fn node_unpublish_volume(
        &self,
        _: Request<pb::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<pb::NodeUnpublishVolumeResponse>, Status> {
        Err(Status::unimplemented("unpublish"))
    }
    async fn node_get_volume_stats(
        &self,
        _: Request<pb::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<pb::NodeGetVolumeStatsResponse>, Status> {
        Err(Status::unimplemented("stats"))
    }
    async fn node_expand_volume(
        &self,
        r: Request<pb::NodeExpandVolumeRequest>,
    ) -> Result<Response<pb::NodeExpandVolumeResponse>, Status> {
        let r = r.into_inner();
        Err(echo(&r.secrets, r.volume_capability.as_ref()))
    }
    async fn node_get_capabilities(
        &self,
        _: Request<pb::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<pb::NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(pb::NodeGetCapabilitiesResponse::default()))
    }
    async fn node_get_info(
        &self,
        _: Request<pb::NodeGetInfoRequest>,
    ) -> Result<Response<pb::NodeGetInfoResponse>, Status> {
        Ok(Response::new(pb::NodeGetInfoResponse {
            node_id: "echo".into(),
            ..Default::default()
        }))
    }
}

#[tokio::test(flavor = "current_thread")]
async fn plugin_error_text_is_scrubbed_of_what_the_call_sent() {
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("echo.sock");
    let listener = tokio::net::UnixListener::bind(&sock).expect("bind");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn({
        let shutdown = shutdown.clone();
        tonic::transport::Server::builder()
            .add_service(pb::node_server::NodeServer::new(Echo))
            .serve_with_incoming_shutdown(
                UnixListenerStream::new(listener),
                shutdown.cancelled_owned(),
            )
    });

    let c = CsiClient::new(Endpoint::from_path(&sock).expect("endpoint"));
    let id = ExternalId::new("v").expect("id");
    let stage = NodeStage {
        external_id: id.clone(),
        staging_path: dir.path().join("s"),
        capability: cap(),
        publish_context: BTreeMap::new(),
        volume_context: BTreeMap::new(),
        secrets: secrets(),
    };
    let publish = NodePublish {
        external_id: id.clone(),
        staging_path: None,
        target_path: dir.path().join("t"),
        capability: cap(),
        read_only: false,
        publish_context: BTreeMap::new(),
        volume_context: BTreeMap::new(),
        secrets: secrets(),
    };
    let expand = NodeExpand {
        external_id: id,
        volume_path: dir.path().join("t"),
        staging_path: None,
        capacity: CapacityRange::default(),
        capability: Some(cap()),
        secrets: secrets(),
    };
    let errors = [
        c.node_stage(&stage).await.expect_err("echo refuses"),
        c.node_publish(&publish).await.expect_err("echo refuses"),
        c.node_expand(&expand)
            .await
            .map(drop)
            .expect_err("echo refuses"),
    ];
    for (err, rpc) in errors.iter().zip([
        Rpc::NodeStageVolume,
        Rpc::NodePublishVolume,
        Rpc::NodeExpandVolume,
    ]) {
        assert_eq!(err.rpc(), rpc);
        assert_eq!(err.code(), berth_csi::Code::PermissionDenied);
        let text = format!("{err} {err:?}");
        assert!(
            text.contains("refused") && text.contains(REDACTED),
            "{text}"
        );
        assert_clean("a plugin's echoed error", &text);
    }
    assert_clean("the client's trace log", &log.text());
    shutdown.cancel();
    server.await.expect("join").expect("server");
}
