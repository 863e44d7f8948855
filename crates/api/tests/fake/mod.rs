#![allow(dead_code)] // Each test binary uses part of it.
//! An in-memory [`AgentView`] and a served instance of it, shared by this crate's tests.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use berth_api::{
    AgentView, ApiError, Event, EventKind, Health, Instance, Listeners, NodeStatus, PluginStatus,
    PluginType, RegisterRequest, Source,
    jobs::{AllocStatus, JobRunRequest, JobStatus},
    volumes::{
        ClaimRequest, ClaimResponse, DetachRequest, DetachResponse, ExpandRequest, ExpandResponse,
        ReleaseRequest, ReleaseResponse, SnapshotCreateRequest, SnapshotDeleteRequest,
        SnapshotList, SnapshotView, VolumeSpecRequest, VolumeStatus,
    },
};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    sync::broadcast,
    task::JoinHandle,
};
use tokio_util::sync::CancellationToken;

pub const METRICS: &str = "# TYPE berth_plugins gauge\nberth_plugins 2\n";

/// Plugins in a map, events through a broadcast channel, and call counters. The volume and
/// job views record each call (method name and ids) in `view_calls` and answer 404.
#[derive(Debug)]
pub struct FakeAgent {
    pub plugins: Mutex<BTreeMap<String, PluginStatus>>,
    pub events: broadcast::Sender<Event>,
    pub register_calls: AtomicUsize,
    pub deregister_calls: AtomicUsize,
    pub plugin_calls: AtomicUsize,
    pub view_calls: Mutex<Vec<String>>,
}

impl FakeAgent {
    /// Two plugins (`zeta` then `alpha`, so sorting shows), events buffered `capacity` deep.
    pub fn new(capacity: usize) -> Self {
        let plugins = [
            plugin("zeta", PluginType::Node),
            plugin("alpha", PluginType::Monolith),
        ]
        .into_iter()
        .map(|p| (p.id.clone(), p))
        .collect();
        Self {
            plugins: Mutex::new(plugins),
            events: broadcast::channel(capacity).0,
            register_calls: AtomicUsize::new(0),
            deregister_calls: AtomicUsize::new(0),
            plugin_calls: AtomicUsize::new(0),
            view_calls: Mutex::new(Vec::new()),
        }
    }

    /// Every call the router made into the agent: registrations, plugin lookups, volume and job
    /// view calls.
    pub fn calls(&self) -> usize {
        self.register_calls.load(Ordering::SeqCst)
            + self.deregister_calls.load(Ordering::SeqCst)
            + self.plugin_calls.load(Ordering::SeqCst)
            + self.view_calls.lock().unwrap().len()
    }

    fn record(&self, call: String) -> ApiError {
        self.view_calls.lock().unwrap().push(call);
        ApiError::NotFound("the fake has nothing".into())
    }

    /// Sends event number `seq`; never waits.
    pub fn emit(&self, seq: u64, reason: String) {
        self.events
            .send(Event {
                seq,
                time_ms: 1_700_000_000_000 + seq,
                kind: EventKind::PluginHealthy,
                plugin_id: "alpha".into(),
                instance: Some("i1".into()),
                volume_id: None,
                alloc_id: None,
                device: None,
                reason,
            })
            .expect("a subscriber");
    }
}

pub fn plugin(id: &str, plugin_type: PluginType) -> PluginStatus {
    let health = Health {
        healthy: true,
        description: "probe ok".into(),
        last_transition_ms: 1_700_000_000_000,
    };
    PluginStatus {
        id: id.into(),
        plugin_type,
        health: health.clone(),
        fingerprint: None,
        instances: vec![Instance {
            instance: "i1".into(),
            source: Source::Config,
            socket: format!("/run/{id}.sock").into(),
            registered_ms: 1_700_000_000_000,
            active: true,
            health,
        }],
    }
}

impl berth_api::VolumeView for FakeAgent {
    async fn volume(&self, id: &str) -> Result<VolumeStatus, ApiError> {
        Err(self.record(format!("volume {id}")))
    }
    async fn put_volume(
        &self,
        op: berth_api::SpecOp,
        _req: VolumeSpecRequest,
    ) -> Result<VolumeStatus, ApiError> {
        Err(self.record(format!("put_volume {op:?}")))
    }
    async fn deregister_volume(&self, id: &str, force: bool) -> Result<DetachResponse, ApiError> {
        Err(self.record(format!("deregister_volume {id} {force}")))
    }
    async fn delete_volume(&self, id: &str) -> Result<(), ApiError> {
        Err(self.record(format!("delete_volume {id}")))
    }
    async fn detach_volume(
        &self,
        id: &str,
        req: DetachRequest,
    ) -> Result<DetachResponse, ApiError> {
        Err(self.record(format!("detach_volume {id} {:?}", req.node_id)))
    }
    async fn expand_volume(
        &self,
        id: &str,
        _req: ExpandRequest,
    ) -> Result<ExpandResponse, ApiError> {
        Err(self.record(format!("expand_volume {id}")))
    }
    async fn claim_volume(&self, id: &str, req: ClaimRequest) -> Result<ClaimResponse, ApiError> {
        Err(self.record(format!("claim_volume {id} {}", req.alloc_id)))
    }
    async fn release_volume(
        &self,
        id: &str,
        req: ReleaseRequest,
    ) -> Result<ReleaseResponse, ApiError> {
        Err(self.record(format!("release_volume {id} {}", req.alloc_id)))
    }
    async fn create_snapshot(
        &self,
        id: &str,
        _req: SnapshotCreateRequest,
    ) -> Result<SnapshotView, ApiError> {
        Err(self.record(format!("create_snapshot {id}")))
    }
    async fn delete_snapshot(&self, req: SnapshotDeleteRequest) -> Result<(), ApiError> {
        Err(self.record(format!("delete_snapshot {}", req.plugin_id)))
    }
    async fn list_snapshots(&self, plugin_id: &str) -> Result<SnapshotList, ApiError> {
        Err(self.record(format!("list_snapshots {plugin_id}")))
    }
}

impl berth_api::JobView for FakeAgent {
    fn job(&self, id: &str) -> Result<JobStatus, ApiError> {
        Err(self.record(format!("job {id}")))
    }
    fn alloc(&self, id: &str) -> Result<AllocStatus, ApiError> {
        Err(self.record(format!("alloc {id}")))
    }
    async fn run_job(&self, _req: JobRunRequest) -> Result<JobStatus, ApiError> {
        Err(self.record("run_job".into()))
    }
    async fn stop_job(&self, id: &str, _purge: bool) -> Result<JobStatus, ApiError> {
        Err(self.record(format!("stop_job {id}")))
    }
}

impl AgentView for FakeAgent {
    fn plugins(&self) -> Vec<PluginStatus> {
        // Reverse order, so the router's sorting shows.
        self.plugins
            .lock()
            .unwrap()
            .values()
            .rev()
            .cloned()
            .collect()
    }

    fn plugin(&self, id: &str) -> Option<PluginStatus> {
        self.plugin_calls.fetch_add(1, Ordering::SeqCst);
        self.plugins.lock().unwrap().get(id).cloned()
    }

    fn node(&self) -> NodeStatus {
        NodeStatus {
            id: "node-1".into(),
            hostname: "host-1".into(),
            csi_plugins: Vec::new(),
            ..Default::default()
        }
    }

    fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    fn metrics(&self) -> String {
        METRICS.into()
    }

    async fn register(&self, req: RegisterRequest) -> Result<PluginStatus, ApiError> {
        self.register_calls.fetch_add(1, Ordering::SeqCst);
        let mut plugins = self.plugins.lock().unwrap();
        if let Some(existing) = plugins.get(&req.id)
            && existing.plugin_type != req.plugin_type
        {
            return Err(ApiError::Conflict(format!(
                "plugin {:?} is registered as {}",
                req.id, existing.plugin_type
            )));
        }
        let mut status = plugin(&req.id, req.plugin_type);
        status.instances[0].instance = req.instance.unwrap_or_else(|| "derived".into());
        status.instances[0].socket = req.socket;
        status.instances[0].source = Source::Api;
        plugins.insert(req.id, status.clone());
        Ok(status)
    }

    async fn deregister(&self, id: &str, instance: &str) -> Result<(), ApiError> {
        self.deregister_calls.fetch_add(1, Ordering::SeqCst);
        let mut plugins = self.plugins.lock().unwrap();
        let found = plugins
            .get(id)
            .is_some_and(|p| p.instances.iter().any(|i| i.instance == instance));
        if !found {
            return Err(ApiError::NotFound(format!(
                "no instance {instance:?} of plugin {id:?}"
            )));
        }
        plugins.remove(id);
        Ok(())
    }
}

/// A [`FakeAgent`] served on a unix socket in a temp dir and on 127.0.0.1:<free port>.
#[derive(Debug)]
pub struct Served {
    pub agent: Arc<FakeAgent>,
    pub socket: PathBuf,
    pub tcp: SocketAddr,
    pub shutdown: CancellationToken,
    task: JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Served {
    pub fn start(capacity: usize) -> Self {
        Self::start_with(capacity, |l| l)
    }

    /// Like [`Served::start`], with the listeners configured by `configure`.
    pub fn start_with(capacity: usize, configure: impl FnOnce(Listeners) -> Listeners) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        // A dir that does not exist yet: bind creates it.
        let socket = dir.path().join("data").join("berth.sock");
        let listeners =
            Listeners::bind(&socket, Some("127.0.0.1:0".parse().unwrap())).expect("bind the API");
        let tcp = listeners.tcp_addr().expect("a tcp address");
        let agent = Arc::new(FakeAgent::new(capacity));
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(
            configure(listeners.with_drain_timeout(Duration::from_secs(5)))
                .serve(berth_api::router(agent.clone()), shutdown.clone()),
        );
        Self {
            agent,
            socket,
            tcp,
            shutdown,
            task,
            _dir: dir,
        }
    }

    pub fn unix_address(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    pub fn tcp_address(&self) -> String {
        format!("http://{}", self.tcp)
    }

    pub fn data_dir(&self) -> &Path {
        self.socket.parent().unwrap()
    }

    /// Cancels the server and waits (bounded) until it has drained and returned.
    pub async fn stop(self) -> tempfile::TempDir {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the server stops within 10s")
            .expect("the server task");
        self._dir
    }
}

/// How long a raw exchange may take before the test fails.
pub const RAW_WAIT: Duration = Duration::from_secs(20);

/// The answer to a raw request: status, lower-cased head, body.
#[derive(Debug, Clone)]
pub struct RawAnswer {
    pub status: u16,
    pub head: String,
    pub body: String,
}

impl RawAnswer {
    /// Head and body, for "never appears anywhere" checks.
    pub fn all(&self) -> String {
        format!("{}\r\n\r\n{}", self.head, self.body)
    }
}

/// One HTTP/1.1 request on the socket, written as given (`path` must already be
/// percent-encoded), with a JSON body and its `Content-Length`; reads the whole answer.
pub async fn raw(socket: &Path, method: &str, path: &str, body: &[u8]) -> RawAnswer {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut request = head.into_bytes();
    request.extend_from_slice(body);
    raw_bytes(socket, &request).await
}

/// Writes `request` as it is and reads the answer. A write error is ignored (the server may
/// answer and close before it has read everything, e.g. a 413).
pub async fn raw_bytes(socket: &Path, request: &[u8]) -> RawAnswer {
    let mut stream = tokio::net::UnixStream::connect(socket)
        .await
        .expect("connect");
    let _ = stream.write_all(request).await;
    read_answer(&mut stream).await
}

/// Reads an answer up to the end of the connection.
pub async fn read_answer(stream: &mut tokio::net::UnixStream) -> RawAnswer {
    let mut answer = Vec::new();
    match tokio::time::timeout(RAW_WAIT, stream.read_to_end(&mut answer)).await {
        Ok(Ok(_)) => {}
        // The server closed with our request unread: what it sent before still counts.
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset && !answer.is_empty() => {}
        Ok(Err(e)) => panic!("reading the answer: {e}"),
        Err(_) => panic!("no answer within {RAW_WAIT:?}"),
    }
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {answer:?}"));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    RawAnswer {
        status,
        head: head.to_ascii_lowercase(),
        body: body.to_string(),
    }
}

/// How many file descriptors of this process are server-side connections of the unix socket
/// at `socket` (the listener included): sockets the kernel lists under that path. Client ends
/// are unnamed, so they do not count.
pub fn server_fds(socket: &Path) -> usize {
    let path = socket.to_string_lossy();
    let table = std::fs::read_to_string("/proc/net/unix").expect("/proc/net/unix");
    let inodes: std::collections::HashSet<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.len() >= 8 && fields[7] == path).then(|| fields[6].to_string())
        })
        .collect();
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|target| {
            let t = target.to_string_lossy().into_owned();
            t.strip_prefix("socket:[")?
                .strip_suffix(']')
                .map(str::to_string)
        })
        .filter(|inode| inodes.contains(inode))
        .count()
}
