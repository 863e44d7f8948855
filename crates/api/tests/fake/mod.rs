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
};
use tokio::{sync::broadcast, task::JoinHandle};
use tokio_util::sync::CancellationToken;

pub const METRICS: &str = "# TYPE berth_plugins gauge\nberth_plugins 2\n";

/// Plugins in a map, events through a broadcast channel, and call counters.
#[derive(Debug)]
pub struct FakeAgent {
    pub plugins: Mutex<BTreeMap<String, PluginStatus>>,
    pub events: broadcast::Sender<Event>,
    pub register_calls: AtomicUsize,
    pub deregister_calls: AtomicUsize,
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
        }
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

impl berth_api::VolumeView for FakeAgent {}

impl berth_api::JobView for FakeAgent {}

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
        self.plugins.lock().unwrap().get(id).cloned()
    }

    fn node(&self) -> NodeStatus {
        NodeStatus {
            id: "node-1".into(),
            hostname: "host-1".into(),
            csi_plugins: Vec::new(),
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
        let dir = tempfile::tempdir().expect("tempdir");
        // A dir that does not exist yet: bind creates it.
        let socket = dir.path().join("data").join("berth.sock");
        let listeners =
            Listeners::bind(&socket, Some("127.0.0.1:0".parse().unwrap())).expect("bind the API");
        let tcp = listeners.tcp_addr().expect("a tcp address");
        let agent = Arc::new(FakeAgent::new(capacity));
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(
            listeners
                .with_drain_timeout(Duration::from_secs(5))
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
