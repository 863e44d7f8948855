//! Probe semantics against an in-process Identity server on a real unix socket: an absent
//! `ready` means ready, `ready: false` means not ready, and Probe keeps its own short deadline.

use std::sync::{Arc, Mutex};

use berth_csi::{Code, CsiClient, CsiError, Endpoint, Rpc, pb};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// Answers Probe with whatever `ready` holds.
struct Identity {
    ready: Arc<Mutex<Option<bool>>>,
}

#[tonic::async_trait]
impl pb::identity_server::Identity for Identity {
    async fn get_plugin_info(
        &self,
        _: Request<pb::GetPluginInfoRequest>,
    ) -> Result<Response<pb::GetPluginInfoResponse>, Status> {
        Ok(Response::new(pb::GetPluginInfoResponse {
            name: "probe.test".into(),
            vendor_version: "1".into(),
            manifest: Default::default(),
        }))
    }
    async fn get_plugin_capabilities(
        &self,
        _: Request<pb::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<pb::GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(pb::GetPluginCapabilitiesResponse::default()))
    }
    async fn probe(
        &self,
        request: Request<pb::ProbeRequest>,
    ) -> Result<Response<pb::ProbeResponse>, Status> {
        // The client sends its attempt deadline along.
        if request.metadata().get("grpc-timeout").is_none() {
            return Err(Status::invalid_argument("no grpc-timeout sent"));
        }
        let ready = *self.ready.lock().expect("lock");
        Ok(Response::new(pb::ProbeResponse { ready }))
    }
}

#[tokio::test]
async fn absent_ready_means_ready_and_false_means_not_ready() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("identity.sock");
    let listener = tokio::net::UnixListener::bind(&sock).expect("bind");
    let ready = Arc::new(Mutex::new(None));
    let stop = CancellationToken::new();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(pb::identity_server::IdentityServer::new(Identity {
                ready: ready.clone(),
            }))
            .serve_with_incoming_shutdown(
                UnixListenerStream::new(listener),
                stop.clone().cancelled_owned(),
            ),
    );
    let c = CsiClient::new(Endpoint::from_path(&sock).expect("endpoint"));

    assert!(c.probe().await.expect("probe"), "absent ready = ready");
    *ready.lock().expect("lock") = Some(false);
    assert!(!c.probe().await.expect("probe"));
    *ready.lock().expect("lock") = Some(true);
    assert!(c.probe().await.expect("probe"));
    assert_eq!(c.plugin_info().await.expect("info").name, "probe.test");

    // Node and Controller are not served: UNIMPLEMENTED, not retried.
    let err = c.node_info().await.expect_err("no node service");
    assert!(
        matches!(
            err,
            CsiError::Rpc {
                code: Code::Unimplemented,
                attempts: 1,
                ..
            }
        ),
        "{err:?}"
    );

    stop.cancel();
    server.await.expect("join").expect("serve");
}

#[test]
fn probe_has_its_own_short_deadline() {
    let probe = Rpc::Probe.policy();
    for rpc in Rpc::ALL.into_iter().filter(|r| *r != Rpc::Probe) {
        let other = rpc.policy();
        assert!(probe.attempt_timeout < other.attempt_timeout, "{rpc}");
        assert!(probe.overall_timeout < other.overall_timeout, "{rpc}");
    }
    let unique: std::collections::BTreeSet<_> = Rpc::ALL.into_iter().collect();
    assert_eq!(unique.len(), Rpc::ALL.len(), "Rpc::ALL lists each RPC once");
}
