//! The registration directory against real unix sockets: in-process fake registrars, a
//! recording sink, bounded polling.

use std::{
    collections::HashMap,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use std::sync::atomic::{AtomicUsize, Ordering};

use berth_regdir::{
    DiscoveredPlugin, RegDirError, RegistrationDir, Sink,
    testing::{FakeRegistrar, PluginInfoSpec},
};
use berth_testkit::{assert_eventually, eventually};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Bound of every wait for something that should happen.
const WAIT: Duration = Duration::from_secs(10);
/// How long something that should not happen is watched for.
const QUIET: Duration = Duration::from_millis(300);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Register(DiscoveredPlugin),
    Deregister(DiscoveredPlugin),
}

/// Records every call; refuses the names in `refuse` with the given reason.
#[derive(Debug, Default)]
struct RecordingSink {
    calls: Mutex<Vec<Call>>,
    refuse: Mutex<HashMap<String, String>>,
}

impl RecordingSink {
    fn calls(&self) -> Vec<Call> {
        self.calls.lock().expect("lock").clone()
    }
    fn registered(&self, name: &str) -> Vec<DiscoveredPlugin> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Register(p) if p.name == name => Some(p),
                _ => None,
            })
            .collect()
    }
    fn deregistered(&self, name: &str) -> Vec<DiscoveredPlugin> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Deregister(p) if p.name == name => Some(p),
                _ => None,
            })
            .collect()
    }
}

impl Sink for RecordingSink {
    async fn register(&self, plugin: &DiscoveredPlugin) -> Result<(), String> {
        self.calls
            .lock()
            .expect("lock")
            .push(Call::Register(plugin.clone()));
        match self.refuse.lock().expect("lock").get(&plugin.name) {
            Some(reason) => Err(reason.clone()),
            None => Ok(()),
        }
    }
    async fn deregister(&self, plugin: &DiscoveredPlugin) {
        self.calls
            .lock()
            .expect("lock")
            .push(Call::Deregister(plugin.clone()));
    }
}

/// A running watcher on a fresh directory.
struct Watcher {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    sink: Arc<RecordingSink>,
    shutdown: CancellationToken,
    run: Option<JoinHandle<Result<(), RegDirError>>>,
}

impl Watcher {
    /// A directory to fill before the watcher starts.
    fn dir() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("plugins_registry");
        std::fs::create_dir(&dir).expect("mkdir");
        (tmp, dir)
    }

    fn start(
        tmp: tempfile::TempDir,
        dir: PathBuf,
        config: impl FnOnce(RegistrationDir) -> RegistrationDir,
    ) -> Self {
        let sink = Arc::new(RecordingSink::default());
        let shutdown = CancellationToken::new();
        let regdir = config(
            RegistrationDir::new(dir.clone(), Duration::from_secs(60))
                .rpc_timeout(Duration::from_secs(2)),
        );
        let run = tokio::spawn(regdir.run(Arc::clone(&sink), shutdown.clone()));
        Self {
            _tmp: tmp,
            dir,
            sink,
            shutdown,
            run: Some(run),
        }
    }

    fn new() -> Self {
        let (tmp, dir) = Self::dir();
        Self::start(tmp, dir, |r| r)
    }

    fn csi_endpoint(&self, name: &str) -> String {
        format!("/run/berth-test/{name}/csi.sock")
    }

    fn registrar(&self, file: &str, name: &str) -> FakeRegistrar {
        FakeRegistrar::serve(
            &self.dir,
            file,
            PluginInfoSpec::csi(name, self.csi_endpoint(name)),
        )
    }

    async fn wait_registered(&self, name: &str) -> DiscoveredPlugin {
        let sink = &self.sink;
        assert_eventually!(
            WAIT,
            || async { !sink.registered(name).is_empty() },
            "{name} registered"
        );
        sink.registered(name).remove(0)
    }

    async fn stop(mut self) {
        self.shutdown.cancel();
        let run = self.run.take().expect("running");
        tokio::time::timeout(Duration::from_secs(5), run)
            .await
            .expect("run stops promptly after shutdown")
            .expect("join")
            .expect("run ends with Ok");
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn wait_status(fake: &FakeRegistrar, n: usize) -> Vec<(bool, String)> {
    assert_eventually!(
        WAIT,
        || async { fake.statuses().len() >= n },
        "{} gets {n} status(es), has {:?}",
        fake.socket().display(),
        fake.statuses()
    );
    fake.statuses()
}

/// Captures this test's logs (tests run on a current-thread runtime, so every task logs here).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = Self::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || writer.clone())
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("lock")).into_owned()
    }
    fn lines_with(&self, needle: &str) -> Vec<String> {
        self.text()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// True if `check` holds during all of [`QUIET`] (for things that must not happen).
async fn stays(check: impl Fn() -> bool) -> bool {
    !eventually(QUIET, || async { !check() }).await
}

#[tokio::test]
async fn a_socket_dropped_in_is_registered_then_deregistered_once() {
    let w = Watcher::new();
    // Whether this lands before or after the watch is set, the initial scan or an event sees it.
    let fake = w.registrar("hostpath.csi.k8s.io-reg.sock", "hostpath.csi.k8s.io");
    let plugin = w.wait_registered("hostpath.csi.k8s.io").await;
    assert_eq!(
        plugin,
        DiscoveredPlugin {
            name: "hostpath.csi.k8s.io".into(),
            endpoint: w.csi_endpoint("hostpath.csi.k8s.io").into(),
            registration_socket: w.dir.join("hostpath.csi.k8s.io-reg.sock"),
            versions: vec!["1.0.0".into()],
        }
    );
    assert_eq!(wait_status(&fake, 1).await, [(true, String::new())]);
    assert_eq!(fake.info_calls(), 1);

    fake.remove().await;
    let sink = &w.sink;
    assert_eventually!(WAIT, || async {
        !sink.deregistered("hostpath.csi.k8s.io").is_empty()
    });
    assert!(
        stays(|| sink.calls().len() == 2).await,
        "{:?}",
        sink.calls()
    );
    assert_eq!(
        sink.calls(),
        [Call::Register(plugin.clone()), Call::Deregister(plugin)]
    );
    w.stop().await;
}

#[tokio::test]
async fn sockets_present_before_start_are_found_and_others_ignored() {
    let (tmp, dir) = Watcher::dir();
    let a = FakeRegistrar::serve(
        &dir,
        "a-reg.sock",
        PluginInfoSpec::csi("a.csi.test", "unix:///run/a/csi.sock"),
    );
    let b = FakeRegistrar::serve(
        &dir,
        "b-reg.sock",
        PluginInfoSpec::csi("b.csi.test", "/run/b/csi.sock"),
    );
    let hidden = FakeRegistrar::serve(
        &dir,
        ".hidden-reg.sock",
        PluginInfoSpec::csi("hidden.csi.test", "/run/h.sock"),
    );
    std::fs::write(dir.join("not-a-socket.sock"), b"").expect("plain file");
    std::fs::create_dir(dir.join("subdir")).expect("subdir");

    let w = Watcher::start(tmp, dir, |r| r);
    assert_eq!(
        w.wait_registered("a.csi.test").await.endpoint,
        Path::new("/run/a/csi.sock")
    );
    assert_eq!(
        w.wait_registered("b.csi.test").await.endpoint,
        Path::new("/run/b/csi.sock")
    );
    assert_eq!(wait_status(&a, 1).await, [(true, String::new())]);
    assert_eq!(wait_status(&b, 1).await, [(true, String::new())]);

    // A hidden socket is never asked, as with kubelet.
    let hidden_later = w.registrar(".later-reg.sock", "later.csi.test");
    assert!(stays(|| hidden.info_calls() == 0 && hidden_later.info_calls() == 0).await);
    assert_eq!(w.sink.calls().len(), 2, "{:?}", w.sink.calls());
    w.stop().await;
}

#[tokio::test]
async fn invalid_registrars_are_told_why_and_the_watcher_keeps_working() {
    // Short rescans: a refused socket must still not be asked again.
    let (tmp, dir) = Watcher::dir();
    let w = Watcher::start(tmp, dir, |r| {
        RegistrationDir::new(r.dir().to_path_buf(), Duration::from_millis(20))
            .rpc_timeout(Duration::from_secs(2))
    });
    let good = |name: &str| PluginInfoSpec::csi(name, w.csi_endpoint(name));
    let cases = [
        (
            "type",
            PluginInfoSpec {
                plugin_type: "DevicePlugin".into(),
                ..good("t.csi.test")
            },
            "plugin type \"DevicePlugin\" is not supported",
        ),
        (
            "name",
            PluginInfoSpec {
                name: String::new(),
                ..good("n")
            },
            "invalid plugin name \"\": must not be empty",
        ),
        (
            "endpoint",
            PluginInfoSpec {
                endpoint: "csi.sock".into(),
                ..good("e.csi.test")
            },
            "socket path must be absolute",
        ),
        (
            "versions",
            PluginInfoSpec {
                versions: vec!["0.3.0".into(), "2.0.0".into()],
                ..good("v.csi.test")
            },
            "no supported version is 1.x",
        ),
    ];
    let mut fakes = Vec::new();
    for (file, spec, _) in &cases {
        fakes.push(FakeRegistrar::serve(
            &w.dir,
            &format!("{file}-reg.sock"),
            spec.clone(),
        ));
    }
    for (fake, (file, _, reason)) in fakes.iter().zip(&cases) {
        let statuses = wait_status(fake, 1).await;
        assert_eq!(statuses.len(), 1, "{file}: {statuses:?}");
        assert!(!statuses[0].0, "{file}: {statuses:?}");
        assert!(
            statuses[0].1.contains(reason),
            "{file}: {:?} lacks {reason:?}",
            statuses[0].1
        );
    }

    let later = w.registrar("good-reg.sock", "good.csi.test");
    w.wait_registered("good.csi.test").await;
    assert_eq!(wait_status(&later, 1).await, [(true, String::new())]);
    assert!(
        stays(|| fakes.iter().all(|f| f.info_calls() == 1)).await,
        "refused sockets are not asked again while unchanged: {:?}",
        fakes
            .iter()
            .map(FakeRegistrar::info_calls)
            .collect::<Vec<_>>()
    );
    assert_eq!(w.sink.calls().len(), 1, "{:?}", w.sink.calls());

    // Replaced by a good registrar: asked again, registered.
    let fixed = FakeRegistrar::serve(&w.dir, "type-reg.sock", good("fixed.csi.test"));
    w.wait_registered("fixed.csi.test").await;
    assert_eq!(wait_status(&fixed, 1).await, [(true, String::new())]);
    w.stop().await;
}

/// A CSI Identity server: a gRPC socket that is not a registrar.
struct Identity;

#[tonic::async_trait]
impl berth_csi::pb::identity_server::Identity for Identity {
    async fn get_plugin_info(
        &self,
        _: tonic::Request<berth_csi::pb::GetPluginInfoRequest>,
    ) -> Result<tonic::Response<berth_csi::pb::GetPluginInfoResponse>, tonic::Status> {
        Err(tonic::Status::internal("unused"))
    }
    async fn get_plugin_capabilities(
        &self,
        _: tonic::Request<berth_csi::pb::GetPluginCapabilitiesRequest>,
    ) -> Result<tonic::Response<berth_csi::pb::GetPluginCapabilitiesResponse>, tonic::Status> {
        Err(tonic::Status::internal("unused"))
    }
    async fn probe(
        &self,
        _: tonic::Request<berth_csi::pb::ProbeRequest>,
    ) -> Result<tonic::Response<berth_csi::pb::ProbeResponse>, tonic::Status> {
        Err(tonic::Status::internal("unused"))
    }
}

#[tokio::test]
async fn sockets_that_are_not_registrars_are_skipped() {
    let (logs, _guard) = Logs::capture();
    let (tmp, dir) = Watcher::dir();
    let w = Watcher::start(tmp, dir, |r| r.rpc_timeout(Duration::from_millis(300)));
    let stop = CancellationToken::new();
    let mut servers = tokio::task::JoinSet::new();

    // A CSI socket: answers gRPC, but not GetInfo.
    let csi = tokio::net::UnixListener::bind(w.dir.join("csi.sock")).expect("bind");
    let serve_csi = tonic::transport::Server::builder()
        .add_service(berth_csi::pb::identity_server::IdentityServer::new(
            Identity,
        ))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::UnixListenerStream::new(csi),
            stop.clone().cancelled_owned(),
        );
    servers.spawn(async move { serve_csi.await.expect("serve the CSI socket") });
    // Hangs up at once.
    let hangup = tokio::net::UnixListener::bind(w.dir.join("hangup.sock")).expect("bind");
    let hangups = Arc::new(AtomicUsize::new(0));
    servers.spawn({
        let (hangups, stop) = (Arc::clone(&hangups), stop.clone());
        async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    accepted = hangup.accept() => {
                        drop(accepted);
                        hangups.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        }
    });
    // Connects (the kernel's backlog) and never answers.
    let _silent = std::os::unix::net::UnixListener::bind(w.dir.join("silent.sock")).expect("bind");
    // Left behind by a registrar that died: connections refused until the deadline.
    drop(std::os::unix::net::UnixListener::bind(w.dir.join("refusing.sock")).expect("bind"));
    // A plain file.
    std::fs::write(w.dir.join("file.sock"), b"not a socket").expect("write");

    for (socket, reason) in [
        (
            "csi.sock",
            "does not serve the plugin registration API (GetInfo: unimplemented)",
        ),
        // Broken during the handshake or the call, depending on timing.
        ("hangup.sock", "GetInfo"),
        ("silent.sock", "did not answer GetInfo within 300ms"),
        ("refusing.sock", "cannot connect to"),
    ] {
        let path = w.dir.join(socket).display().to_string();
        assert_eventually!(
            WAIT,
            || async {
                logs.lines_with("skipping socket")
                    .iter()
                    .any(|l| l.contains(&path) && l.contains(reason))
            },
            "{socket} skipped with {reason:?}; logs:\n{}",
            logs.text()
        );
    }
    assert!(
        logs.lines_with("file.sock").is_empty(),
        "a plain file is ignored:\n{}",
        logs.text()
    );

    // The watcher still works, and asks none of them again.
    let good = w.registrar("good-reg.sock", "good.csi.test");
    w.wait_registered("good.csi.test").await;
    assert_eq!(wait_status(&good, 1).await, [(true, String::new())]);
    assert_eq!(hangups.load(Ordering::SeqCst), 1);
    for socket in ["csi.sock", "hangup.sock", "silent.sock", "refusing.sock"] {
        let path = w.dir.join(socket).display().to_string();
        let lines = logs.lines_with("skipping socket");
        assert_eq!(
            lines.iter().filter(|l| l.contains(&path)).count(),
            1,
            "{socket}: {lines:#?}"
        );
    }
    assert_eq!(w.sink.calls().len(), 1, "{:?}", w.sink.calls());
    stop.cancel();
    while let Some(joined) = servers.join_next().await {
        joined.expect("server task");
    }
    w.stop().await;
}

#[tokio::test]
async fn a_refusing_sink_reason_reaches_the_registrar() {
    let w = Watcher::new();
    w.sink.refuse.lock().expect("lock").insert(
        "dup.csi.test".into(),
        "plugin dup.csi.test is already registered".into(),
    );
    let fake = w.registrar("dup-reg.sock", "dup.csi.test");
    assert_eq!(
        wait_status(&fake, 1).await,
        [(
            false,
            "plugin dup.csi.test is already registered".to_string()
        )]
    );
    assert_eq!(w.sink.registered("dup.csi.test").len(), 1);

    // Refused, so its removal deregisters nothing.
    fake.remove().await;
    let other = w.registrar("other-reg.sock", "other.csi.test");
    w.wait_registered("other.csi.test").await;
    assert_eq!(wait_status(&other, 1).await, [(true, String::new())]);
    assert!(
        w.sink.deregistered("dup.csi.test").is_empty(),
        "{:?}",
        w.sink.calls()
    );
    w.stop().await;
}

#[tokio::test]
async fn a_replaced_socket_deregisters_the_old_plugin_first() {
    let w = Watcher::new();
    let old = w.registrar("x-reg.sock", "old.csi.test");
    let old_plugin = w.wait_registered("old.csi.test").await;
    // Replaced in place, as a restarting registrar does.
    let new = w.registrar("x-reg.sock", "new.csi.test");
    let new_plugin = w.wait_registered("new.csi.test").await;
    assert_eq!(
        w.sink.calls(),
        [
            Call::Register(old_plugin.clone()),
            Call::Deregister(old_plugin),
            Call::Register(new_plugin)
        ]
    );
    assert_eq!(wait_status(&new, 1).await, [(true, String::new())]);
    drop(old);
    drop(new);
    w.stop().await;
}

#[tokio::test]
async fn rescans_alone_find_new_and_removed_sockets() {
    let (tmp, dir) = Watcher::dir();
    let w = Watcher::start(tmp, dir, |r| {
        RegistrationDir::new(r.dir().to_path_buf(), Duration::from_millis(50)).inotify(false)
    });
    let fake = w.registrar("a-reg.sock", "a.csi.test");
    let plugin = w.wait_registered("a.csi.test").await;
    assert_eq!(wait_status(&fake, 1).await, [(true, String::new())]);
    fake.remove().await;
    let sink = &w.sink;
    assert_eventually!(WAIT, || async {
        sink.deregistered("a.csi.test") == [plugin.clone()]
    });
    w.stop().await;
}

#[tokio::test]
async fn a_missing_directory_is_created_0700() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("deep/plugins_registry");
    let w = Watcher::start(tmp, dir.clone(), |r| r);
    assert_eventually!(WAIT, || async { dir.is_dir() });
    let mode = std::fs::metadata(&dir).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    // And it is watched.
    let fake = w.registrar("a-reg.sock", "a.csi.test");
    w.wait_registered("a.csi.test").await;
    drop(fake);
    w.stop().await;
}

#[tokio::test]
async fn a_removed_directory_is_recreated_and_watched_again() {
    // Emptied first: the kernel reports the directory's removal at once, and inotify alone
    // (rescans are a minute apart) must see the next socket.
    let w = Watcher::new();
    let fake = w.registrar("a-reg.sock", "a.csi.test");
    let plugin = w.wait_registered("a.csi.test").await;
    fake.remove().await;
    let sink = &w.sink;
    assert_eventually!(WAIT, || async {
        sink.deregistered("a.csi.test") == [plugin.clone()]
    });
    std::fs::remove_dir(&w.dir).expect("rmdir");
    assert_eventually!(WAIT, || async { w.dir.is_dir() }, "recreated");
    let again = w.registrar("b-reg.sock", "b.csi.test");
    w.wait_registered("b.csi.test").await;
    assert_eq!(wait_status(&again, 1).await, [(true, String::new())]);
    w.stop().await;
}

#[tokio::test]
async fn a_directory_removed_under_a_live_registrar_is_recreated_by_a_rescan() {
    // A listening socket pins its directory: the kernel reports nothing until it closes, so
    // only a rescan sees the directory is gone.
    let (tmp, dir) = Watcher::dir();
    let w = Watcher::start(tmp, dir, |r| {
        RegistrationDir::new(r.dir().to_path_buf(), Duration::from_millis(50))
    });
    let fake = w.registrar("a-reg.sock", "a.csi.test");
    let plugin = w.wait_registered("a.csi.test").await;
    std::fs::remove_dir_all(&w.dir).expect("rm -r");
    let sink = &w.sink;
    assert_eventually!(WAIT, || async {
        sink.deregistered("a.csi.test") == [plugin.clone()]
    });
    assert_eventually!(WAIT, || async { w.dir.is_dir() }, "recreated");
    let again = w.registrar("b-reg.sock", "b.csi.test");
    w.wait_registered("b.csi.test").await;
    assert_eq!(wait_status(&again, 1).await, [(true, String::new())]);
    drop(fake);
    w.stop().await;
}

#[tokio::test]
async fn an_unusable_directory_is_an_error() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("file");
    std::fs::write(&file, b"").expect("write");
    let err = RegistrationDir::new(file.clone(), Duration::from_secs(1))
        .run(Arc::new(RecordingSink::default()), CancellationToken::new())
        .await
        .expect_err("a file is not a directory");
    assert!(matches!(err, RegDirError::CreateDir { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&file.display().to_string()),
        "{err}"
    );
}

#[tokio::test]
async fn shutdown_stops_run_promptly_even_mid_rpc() {
    let (tmp, dir) = Watcher::dir();
    // Accepts and never answers; the RPC deadline is far away.
    let _silent = std::os::unix::net::UnixListener::bind(dir.join("silent.sock")).expect("bind");
    let w = Watcher::start(tmp, dir, |r| r.rpc_timeout(Duration::from_secs(300)));
    let fake = w.registrar("a-reg.sock", "a.csi.test");
    w.wait_registered("a.csi.test").await;
    let started = tokio::time::Instant::now();
    w.stop().await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    drop(fake);
}
