//! The client's transport against an in-process Identity server on a real unix socket: calls
//! share one connection, a plugin restarted behind the same socket is reconnected to, answers
//! larger than HTTP/2's flow-control window arrive whole, and a dropped client closes its
//! connection.

use std::{
    io,
    path::{Path, PathBuf},
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use berth_csi::{CsiClient, Endpoint, pb};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{UnixListener, UnixStream},
    task::JoinHandle,
};
use tokio_stream::StreamExt as _;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, transport::server::Connected};

/// A manifest entry this long makes GetPluginInfo's answer several flow-control windows long.
const BIG: usize = 300 * 1024;

#[derive(Default)]
struct Counters {
    accepted: AtomicUsize,
    open: AtomicUsize,
    probes: AtomicUsize,
}

struct Identity {
    counters: Arc<Counters>,
    manifest_len: usize,
}

#[tonic::async_trait]
impl pb::identity_server::Identity for Identity {
    async fn get_plugin_info(
        &self,
        _: Request<pb::GetPluginInfoRequest>,
    ) -> Result<Response<pb::GetPluginInfoResponse>, Status> {
        let mut manifest = std::collections::HashMap::new();
        manifest.insert("big".to_string(), "x".repeat(self.manifest_len));
        Ok(Response::new(pb::GetPluginInfoResponse {
            name: "transport.test".into(),
            vendor_version: "1".into(),
            manifest,
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
        _: Request<pb::ProbeRequest>,
    ) -> Result<Response<pb::ProbeResponse>, Status> {
        self.counters.probes.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(pb::ProbeResponse { ready: Some(true) }))
    }
}

/// A served connection that counts itself open until the server drops it.
struct Counted {
    stream: UnixStream,
    counters: Arc<Counters>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.counters.open.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Connected for Counted {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// An Identity server on `sock`, until `stop` is cancelled.
struct Server {
    counters: Arc<Counters>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Server {
    fn start(sock: &Path, manifest_len: usize) -> Self {
        let listener = UnixListener::bind(sock).expect("bind");
        let counters = Arc::new(Counters::default());
        let stop = CancellationToken::new();
        let c = Arc::clone(&counters);
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener).map(move |s| {
            s.map(|stream| {
                c.accepted.fetch_add(1, Ordering::SeqCst);
                c.open.fetch_add(1, Ordering::SeqCst);
                Counted {
                    stream,
                    counters: Arc::clone(&c),
                }
            })
        });
        let service = pb::identity_server::IdentityServer::new(Identity {
            counters: Arc::clone(&counters),
            manifest_len,
        });
        let shutdown = stop.clone().cancelled_owned();
        let task = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await
                .expect("serve");
        });
        Self {
            counters,
            stop,
            task,
        }
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.expect("server task");
    }
}

/// A served socket in a fresh directory, and a client of it.
fn served(manifest_len: usize) -> (tempfile::TempDir, PathBuf, Server, CsiClient) {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("p.sock");
    let server = Server::start(&sock, manifest_len);
    let client = CsiClient::new(Endpoint::from_path(&sock).expect("endpoint"));
    (dir, sock, server, client)
}

/// Polls `cond` every few milliseconds for up to 5 s.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_calls_share_one_connection() {
    let (_dir, _sock, server, client) = served(0);
    assert_eq!(
        client.connections(),
        0,
        "creating a client connects nothing"
    );

    let calls: Vec<_> = (0..32)
        .map(|_| {
            let c = client.clone();
            tokio::spawn(async move { c.probe().await })
        })
        .collect();
    for call in calls {
        assert!(call.await.expect("join").expect("probe"));
    }
    assert_eq!(client.connections(), 1);
    assert_eq!(server.counters.accepted.load(Ordering::SeqCst), 1);
    assert_eq!(server.counters.probes.load(Ordering::SeqCst), 32);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_restarted_behind_the_same_socket_is_reconnected_to() {
    let (_dir, sock, first, client) = served(0);
    assert!(client.probe().await.expect("probe"));
    first.stop().await;
    std::fs::remove_file(&sock).expect("remove the old socket");

    let second = Server::start(&sock, 0);
    // The old connection's end reaches the client asynchronously; a call that raced it may
    // fail once, and the next one must go to the new plugin.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while client.probe().await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "never reconnected");
    }
    assert_eq!(client.connections(), 2);
    assert_eq!(second.counters.accepted.load(Ordering::SeqCst), 1);
    assert_eq!(second.counters.probes.load(Ordering::SeqCst), 1);
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_larger_than_the_flow_control_window_arrives_whole() {
    let (_dir, _sock, server, client) = served(BIG);
    // Several in a row: the window the first answer used up must have been given back.
    for _ in 0..4 {
        let info = client.plugin_info().await.expect("plugin info");
        assert_eq!(info.name, "transport.test");
        assert_eq!(info.manifest.get("big").map(String::len), Some(BIG));
    }
    assert_eq!(server.counters.accepted.load(Ordering::SeqCst), 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_client_closes_its_connection() {
    let (_dir, _sock, server, client) = served(0);
    let clone = client.clone();
    assert!(client.probe().await.expect("probe"));
    assert_eq!(server.counters.open.load(Ordering::SeqCst), 1);

    drop(client);
    assert!(clone.probe().await.expect("a clone keeps the connection"));
    assert_eq!(server.counters.open.load(Ordering::SeqCst), 1);
    drop(clone);
    eventually("the server sees the connection closed", || {
        server.counters.open.load(Ordering::SeqCst) == 0
    })
    .await;
    assert_eq!(server.counters.accepted.load(Ordering::SeqCst), 1);
    server.stop().await;
}
