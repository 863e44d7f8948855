//! `berth plugin status` and `berth node status` against a fake agent served in this process on
//! a real unix socket and loopback TCP port: tables, JSON, exit codes and error messages.

use std::{
    collections::BTreeMap,
    process::Output,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use berth_api::{
    AgentView, ApiError, Event, Fingerprint, Health, Instance, Listeners, NodePlugin, NodeStatus,
    PluginList, PluginStatus, PluginType, RegisterRequest, Source,
};
use berth_csi::model::{
    ControllerCapability, NodeCapability, NodeInfo, PluginCapabilities, VolumeExpansion,
};
use tokio::{sync::broadcast, task::JoinHandle};
use tokio_util::sync::CancellationToken;

#[derive(Debug)]
struct FakeAgent {
    plugins: Vec<PluginStatus>,
    events: broadcast::Sender<Event>,
}

fn now_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    u64::try_from(since.as_millis()).unwrap()
}

fn health(healthy: bool, description: &str, last_transition_ms: u64) -> Health {
    Health {
        healthy,
        description: description.into(),
        last_transition_ms,
    }
}

impl FakeAgent {
    /// `hostpath` (monolith, fingerprinted, two instances) and `nfs` (node, unhealthy, never
    /// fingerprinted).
    fn new() -> Self {
        let now = now_ms();
        let hostpath = PluginStatus {
            id: "hostpath".into(),
            plugin_type: PluginType::Monolith,
            health: health(true, "probe ok", now - 3_000),
            fingerprint: Some(Fingerprint {
                provider: "hostpath.csi.berth.dev".into(),
                version: "0.1.0".into(),
                plugin_capabilities: PluginCapabilities {
                    controller_service: true,
                    volume_accessibility_constraints: true,
                    volume_expansion: Some(VolumeExpansion::Online),
                    ..PluginCapabilities::default()
                },
                controller_capabilities: Some(
                    [
                        ControllerCapability::PublishUnpublishVolume,
                        ControllerCapability::CreateDeleteVolume,
                    ]
                    .into_iter()
                    .collect(),
                ),
                node_capabilities: Some(
                    [
                        NodeCapability::StageUnstageVolume,
                        NodeCapability::GetVolumeStats,
                    ]
                    .into_iter()
                    .collect(),
                ),
                node_info: Some(NodeInfo {
                    node_id: "csi-node-7".into(),
                    max_volumes_per_node: 16,
                    accessible_topology: Some(BTreeMap::from([
                        ("rack".into(), "r2".into()),
                        ("zone".into(), "z1".into()),
                    ])),
                }),
                taken_ms: now - 1_000,
            }),
            instances: vec![
                Instance {
                    instance: "alloc-2".into(),
                    source: Source::Api,
                    socket: "/var/lib/berth/csi/plugins/alloc-2/csi.sock".into(),
                    registered_ms: now - 60_000,
                    active: true,
                    health: health(true, "probe ok", now - 3_000),
                },
                Instance {
                    instance: "alloc-1".into(),
                    source: Source::RegistrationDir,
                    socket: "/var/lib/berth/csi/plugins/alloc-1/csi.sock".into(),
                    registered_ms: now - 120_000,
                    active: false,
                    health: health(false, "socket gone", now - 30_000),
                },
            ],
        };
        let nfs = PluginStatus {
            id: "nfs".into(),
            plugin_type: PluginType::Node,
            health: health(false, "connection refused", now - 10_000),
            fingerprint: None,
            instances: vec![Instance {
                instance: "nfs".into(),
                source: Source::Config,
                socket: "/run/nfs/csi.sock".into(),
                registered_ms: now - 10_000,
                active: true,
                health: health(false, "connection refused", now - 10_000),
            }],
        };
        Self {
            plugins: vec![nfs, hostpath],
            events: broadcast::channel(4).0,
        }
    }
}

impl berth_api::VolumeView for FakeAgent {}

impl berth_api::JobView for FakeAgent {}

impl AgentView for FakeAgent {
    fn plugins(&self) -> Vec<PluginStatus> {
        self.plugins.clone()
    }

    fn plugin(&self, id: &str) -> Option<PluginStatus> {
        self.plugins.iter().find(|p| p.id == id).cloned()
    }

    fn node(&self) -> NodeStatus {
        NodeStatus {
            id: "node-uuid-1".into(),
            hostname: "worker-1".into(),
            csi_plugins: vec![
                NodePlugin {
                    plugin_id: "hostpath".into(),
                    healthy: true,
                    csi_node_id: Some("csi-node-7".into()),
                    max_volumes: 16,
                    topology: BTreeMap::from([("zone".into(), "z1".into())]),
                },
                NodePlugin {
                    plugin_id: "nfs".into(),
                    healthy: false,
                    csi_node_id: None,
                    max_volumes: 0,
                    topology: BTreeMap::new(),
                },
            ],
            ..Default::default()
        }
    }

    fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    fn metrics(&self) -> String {
        String::new()
    }

    async fn register(&self, req: RegisterRequest) -> Result<PluginStatus, ApiError> {
        Err(ApiError::Internal(format!("not in this test: {}", req.id)))
    }

    async fn deregister(&self, id: &str, _instance: &str) -> Result<(), ApiError> {
        Err(ApiError::Internal(format!("not in this test: {id}")))
    }
}

#[derive(Debug)]
struct Agent {
    view: Arc<FakeAgent>,
    unix: String,
    tcp: String,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Agent {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("berth.sock");
        let listeners = Listeners::bind(&socket, Some("127.0.0.1:0".parse().unwrap())).unwrap();
        let tcp = format!("http://{}", listeners.tcp_addr().unwrap());
        let view = Arc::new(FakeAgent::new());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(listeners.serve(berth_api::router(view.clone()), shutdown.clone()));
        Self {
            view,
            unix: format!("unix://{}", socket.display()),
            tcp,
            shutdown,
            task,
            _dir: dir,
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the server stops within 10s")
            .unwrap();
    }

    fn sorted_plugins(&self) -> Vec<PluginStatus> {
        let mut plugins = self.view.plugins.clone();
        plugins.sort_by(|a, b| a.id.cmp(&b.id));
        plugins
    }
}

async fn berth(args: &[&str]) -> Output {
    berth_env(args, None).await
}

async fn berth_env(args: &[&str], berth_addr: Option<&str>) -> Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_berth"));
    cmd.args(args).env_remove("BERTH_ADDR");
    if let Some(addr) = berth_addr {
        cmd.env("BERTH_ADDR", addr);
    }
    tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("berth finishes within 30s")
        .expect("run berth")
}

fn stdout(o: &Output) -> String {
    assert!(
        o.status.success(),
        "{:?}: {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

/// The whitespace-separated cells of each line.
fn cells(text: &str) -> Vec<Vec<&str>> {
    text.lines()
        .map(|l| l.split_whitespace().collect())
        .collect()
}

/// The value of a `key  value` line.
fn field<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(key)
                .filter(|rest| rest.starts_with("  "))
                .map(str::trim)
        })
        .unwrap_or_else(|| panic!("no field {key:?} in\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_status_lists_every_plugin_as_a_table_and_as_json() {
    let agent = Agent::start();
    for address in [&agent.unix, &agent.tcp] {
        let out = stdout(&berth(&["--address", address, "plugin", "status"]).await);
        assert_eq!(
            cells(&out),
            [
                vec![
                    "ID",
                    "TYPE",
                    "HEALTHY",
                    "PROVIDER",
                    "VERSION",
                    "CONTROLLERS",
                    "NODES",
                    "INSTANCES"
                ],
                vec![
                    "hostpath",
                    "monolith",
                    "healthy",
                    "hostpath.csi.berth.dev",
                    "0.1.0",
                    "1/2",
                    "1/2",
                    "2"
                ],
                vec!["nfs", "node", "unhealthy", "-", "-", "0/0", "0/1", "1"],
            ],
            "over {address}:\n{out}"
        );
    }

    let out = stdout(&berth(&["plugin", "status", "--json", "--address", &agent.unix]).await);
    let list: PluginList = serde_json::from_str(&out).expect("a PluginList");
    assert_eq!(list.plugins, agent.sorted_plugins());
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_status_with_an_id_shows_the_details() {
    let agent = Agent::start();
    let out = stdout(&berth(&["--address", &agent.unix, "plugin", "status", "hostpath"]).await);
    assert_eq!(field(&out, "id"), "hostpath");
    assert_eq!(field(&out, "type"), "monolith");
    assert_eq!(field(&out, "health"), "healthy");
    assert_eq!(field(&out, "description"), "probe ok");
    let since = field(&out, "last transition");
    assert!(
        since.contains("s ago (") && since.ends_with("Z)"),
        "{since}"
    );
    assert_eq!(field(&out, "provider"), "hostpath.csi.berth.dev");
    assert_eq!(field(&out, "version"), "0.1.0");
    assert_eq!(
        field(&out, "plugin capabilities"),
        "controller-service, volume-accessibility-constraints, volume-expansion=online"
    );
    assert_eq!(
        field(&out, "controller capabilities"),
        "create-delete-volume, publish-unpublish-volume"
    );
    assert_eq!(
        field(&out, "node capabilities"),
        "stage-unstage-volume, get-volume-stats"
    );
    assert_eq!(field(&out, "node id"), "csi-node-7");
    assert_eq!(field(&out, "max volumes"), "16");
    assert_eq!(field(&out, "topology"), "rack=r2, zone=z1");
    assert_eq!(field(&out, "controllers healthy"), "1/2");
    assert_eq!(field(&out, "nodes healthy"), "1/2");
    assert!(out.ends_with("no allocs run this plugin\n"), "{out}");
    let table: Vec<Vec<&str>> = cells(&out)
        .into_iter()
        .skip_while(|row| row.first() != Some(&"INSTANCE"))
        .take_while(|row| !row.is_empty())
        .collect();
    assert_eq!(
        table,
        [
            vec!["INSTANCE", "SOURCE", "SOCKET", "ACTIVE", "HEALTHY"],
            vec![
                "alloc-2",
                "api",
                "/var/lib/berth/csi/plugins/alloc-2/csi.sock",
                "yes",
                "healthy"
            ],
            vec![
                "alloc-1",
                "registration-dir",
                "/var/lib/berth/csi/plugins/alloc-1/csi.sock",
                "no",
                "unhealthy"
            ],
        ],
        "{out}"
    );

    // Never fingerprinted, node only: dashes, and no controller line.
    let out = stdout(&berth(&["--address", &agent.tcp, "plugin", "status", "nfs"]).await);
    assert_eq!(field(&out, "health"), "unhealthy");
    assert_eq!(field(&out, "description"), "connection refused");
    assert_eq!(field(&out, "provider"), "-");
    assert_eq!(field(&out, "fingerprinted"), "not yet");
    assert_eq!(field(&out, "node id"), "-");
    assert!(!out.contains("controller capabilities"), "{out}");

    let out = stdout(
        &berth(&[
            "--address",
            &agent.unix,
            "plugin",
            "status",
            "hostpath",
            "--json",
        ])
        .await,
    );
    let plugin: PluginStatus = serde_json::from_str(&out).expect("a PluginStatus");
    assert_eq!(plugin, agent.sorted_plugins()[0]);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_status_shows_the_node_and_its_csi_plugins() {
    let agent = Agent::start();
    let out = stdout(&berth_env(&["node", "status"], Some(&agent.unix)).await);
    assert_eq!(field(&out, "id"), "node-uuid-1");
    assert_eq!(field(&out, "hostname"), "worker-1");
    let table: Vec<Vec<&str>> = cells(&out)
        .into_iter()
        .skip_while(|row| row.first() != Some(&"PLUGIN"))
        .take_while(|row| !row.is_empty())
        .collect();
    assert_eq!(
        table,
        [
            vec![
                "PLUGIN", "HEALTHY", "CSI", "NODE", "ID", "MAX", "VOLUMES", "TOPOLOGY"
            ],
            vec!["hostpath", "healthy", "csi-node-7", "16", "zone=z1"],
            vec!["nfs", "unhealthy", "-", "no", "limit", "-"],
        ],
        "{out}"
    );
    assert!(out.contains("no device plugins"), "{out}");

    let out = stdout(&berth(&["--address", &agent.tcp, "node", "status", "--json"]).await);
    let node: NodeStatus = serde_json::from_str(&out).expect("a NodeStatus");
    assert_eq!(node, agent.view.node());
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_plugin_is_an_error_naming_it() {
    let agent = Agent::start();
    for json in [false, true] {
        let mut args = vec!["--address", &agent.unix, "plugin", "status", "ghost"];
        if json {
            args.push("--json");
        }
        let o = berth(&args).await;
        assert_eq!(o.status.code(), Some(1));
        assert_eq!(stderr(&o), "error: no plugin \"ghost\"\n");
        assert!(o.stdout.is_empty());
    }
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_agent_is_an_error_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("berth.sock");
    let address = format!("unix://{}", socket.display());
    let expected = format!(
        "error: cannot reach the agent at {address}: socket does not exist (is `berth agent` \
         running?)\n"
    );
    for args in [
        vec!["--address", &address, "plugin", "status"],
        vec!["--address", &address, "plugin", "status", "x"],
        vec!["--address", &address, "node", "status"],
    ] {
        let o = berth(&args).await;
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert_eq!(stderr(&o), expected);
    }
    // The environment variable, in the path-only form.
    let o = berth_env(&["plugin", "status"], Some(socket.to_str().unwrap())).await;
    assert_eq!((o.status.code(), stderr(&o)), (Some(1), expected));

    // A stale socket file that nobody listens on.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let o = berth(&["--address", &address, "node", "status"]).await;
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        format!(
            "error: cannot reach the agent at {address}: connection refused (is `berth agent` \
             running?)\n"
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_address_is_a_usage_error() {
    for address in [
        "relative.sock",
        "unix://relative.sock",
        "http://example.com:80",
        "",
    ] {
        let o = berth(&["--address", address, "plugin", "status"]).await;
        assert_eq!(o.status.code(), Some(2), "{address:?}");
        let err = stderr(&o);
        assert!(
            err.starts_with(&format!(
                "error: --address: invalid agent address {address:?}"
            )),
            "{err}"
        );
    }
    let o = berth_env(&["node", "status"], Some("tcp://127.0.0.1:1")).await;
    assert_eq!(o.status.code(), Some(2));
}
