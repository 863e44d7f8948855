//! `berth agent` as a real process, with real plugin processes and sockets.

mod agent_support;

use std::{path::PathBuf, time::Duration};

use agent_support::{AgentProcess, alive, hostpath_at};
use berth_api::{EventKind, EventLine, PluginType, RegisterRequest, Source};
use berth_regdir::testing::{FakeRegistrar, PluginInfoSpec};

const FAST_HEALTH: &str = "health {\n  interval = \"200ms\"\n  failures = 2\n}\n";

fn external(id: &str, socket: &std::path::Path) -> String {
    format!(
        "plugin \"{id}\" {{\n  type = \"monolith\"\n  socket = \"{}\"\n}}\n",
        socket.display()
    )
}

#[tokio::test]
async fn a_plugin_started_after_the_agent_is_healthy_at_once_not_at_the_next_interval() {
    let dir = tempfile::Builder::new()
        .prefix("bp")
        .tempdir_in("/tmp")
        .expect("tmp");
    let socket = dir.path().join("csi.sock");
    // A 30 s interval: only the socket watcher can make this fast.
    let agent = AgentProcess::start(&format!(
        "health {{\n  interval = \"30s\"\n}}\n{}",
        external("late", &socket)
    ))
    .await;
    let before = agent
        .client()
        .plugin("late")
        .await
        .expect("listed before it runs");
    assert!(!before.health.healthy);

    let plugin = hostpath_at(&socket).await;
    let accepted = tokio::time::Instant::now();
    let p = agent
        .wait_plugin("late", Duration::from_secs(10), |p| p.health.healthy)
        .await;
    let took = accepted.elapsed();
    eprintln!("healthy {took:?} after the socket accepted");
    assert!(took < Duration::from_secs(10), "{took:?}");
    let fp = p.fingerprint.expect("fingerprinted");
    assert_eq!(fp.provider, "hostpath.csi.berth.dev");
    assert!(!fp.version.is_empty());
    assert!(fp.plugin_capabilities.controller_service);
    assert!(fp.node_capabilities.is_some() && fp.controller_capabilities.is_some());
    assert_eq!(fp.node_info.expect("node info").node_id, plugin.nodeid());
}

#[tokio::test]
async fn a_plugin_restarted_behind_the_same_socket_is_fingerprinted_again() {
    let dir = tempfile::Builder::new()
        .prefix("bp")
        .tempdir_in("/tmp")
        .expect("tmp");
    let socket = dir.path().join("csi.sock");
    let spawn = |node: &'static str| {
        berth_testkit::HostpathPlugin::builder()
            .socket(&socket)
            .strict(true)
            .nodeid(node)
            .spawn()
    };
    let mut first = spawn("node-before").await;
    // A 30 s interval: only noticing the new socket can take the new fingerprint in time.
    let agent = AgentProcess::start(&format!(
        "health {{\n  interval = \"30s\"\n}}\n{}",
        external("hp", &socket)
    ))
    .await;
    let node_of = |p: &berth_api::PluginStatus| {
        p.fingerprint
            .as_ref()
            .and_then(|f| f.node_info.as_ref())
            .map(|n| n.node_id.clone())
    };
    agent
        .wait_plugin("hp", Duration::from_secs(10), |p| {
            node_of(p).as_deref() == Some("node-before")
        })
        .await;

    first.kill();
    let _second = spawn("node-after").await;
    let p = agent
        .wait_plugin("hp", Duration::from_secs(10), |p| {
            node_of(p).as_deref() == Some("node-after")
        })
        .await;
    assert!(p.health.healthy, "{:?}", p.health);
}

#[tokio::test]
async fn killed_plugin_turns_unhealthy_after_the_failures_and_healthy_when_back() {
    let dir = tempfile::Builder::new()
        .prefix("bp")
        .tempdir_in("/tmp")
        .expect("tmp");
    let socket = dir.path().join("csi.sock");
    let mut plugin = hostpath_at(&socket).await;
    let agent = AgentProcess::start(&format!("{FAST_HEALTH}{}", external("hp", &socket))).await;
    agent
        .wait_plugin("hp", Duration::from_secs(10), |p| p.health.healthy)
        .await;

    let mut events = agent.client().events().await.expect("events");
    let killed = tokio::time::Instant::now();
    plugin.kill();
    let p = agent
        .wait_plugin("hp", Duration::from_secs(20), |p| !p.health.healthy)
        .await;
    // Hysteresis: failures = 2 at a 200 ms interval, so not before the second failed check.
    assert!(
        killed.elapsed() >= Duration::from_millis(200),
        "{:?}",
        killed.elapsed()
    );
    assert!(!p.health.description.is_empty(), "a readable reason");
    let ev = next_event(&mut events, "hp", EventKind::PluginUnhealthy).await;
    assert!(!ev.reason.is_empty());

    plugin.restart().await;
    agent
        .wait_plugin("hp", Duration::from_secs(10), |p| p.health.healthy)
        .await;
    next_event(&mut events, "hp", EventKind::PluginHealthy).await;
    // Still registered throughout: never forgotten.
    assert_eq!(
        agent.client().plugins().await.expect("list").plugins.len(),
        1
    );
}

async fn next_event(
    events: &mut berth_api::EventStream,
    plugin: &str,
    kind: EventKind,
) -> berth_api::Event {
    let deadline = Duration::from_secs(20);
    tokio::time::timeout(deadline, async {
        loop {
            match events.next().await {
                Some(Ok(EventLine::Event(e))) if e.plugin_id == plugin && e.kind == kind => {
                    return e;
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => panic!("event stream: {e}"),
                None => panic!("event stream ended"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {kind:?} event for {plugin} within {deadline:?}"))
}

#[tokio::test]
async fn a_registration_socket_registers_its_plugin_and_removing_it_deregisters() {
    let dir = tempfile::Builder::new()
        .prefix("bp")
        .tempdir_in("/tmp")
        .expect("tmp");
    let socket = dir.path().join("csi.sock");
    let _plugin = hostpath_at(&socket).await;
    let agent = AgentProcess::start(FAST_HEALTH).await;
    let regdir = agent.data_dir.join("plugins_registry");
    let registrar = FakeRegistrar::serve(
        &regdir,
        "hostpath.csi.berth.dev-reg.sock",
        PluginInfoSpec::csi("hostpath.csi.berth.dev", socket.display().to_string()),
    );
    let p = agent
        .wait_plugin("hostpath.csi.berth.dev", Duration::from_secs(10), |p| {
            p.health.healthy
        })
        .await;
    assert_eq!(p.instances[0].source, Source::RegistrationDir);
    assert_eq!(p.plugin_type, PluginType::Node);
    assert_eventually_statuses(&registrar).await;

    registrar.remove().await;
    let client = agent.client();
    berth_testkit::assert_eventually!(Duration::from_secs(10), || async {
        client.plugins().await.is_ok_and(|l| l.plugins.is_empty())
    });
}

async fn assert_eventually_statuses(registrar: &FakeRegistrar) {
    berth_testkit::assert_eventually!(Duration::from_secs(10), || async {
        registrar.statuses().iter().any(|(ok, _)| *ok)
    });
}

#[tokio::test]
async fn the_newest_instance_is_active_and_removing_the_old_one_leaves_it() {
    let dir = tempfile::Builder::new()
        .prefix("bp")
        .tempdir_in("/tmp")
        .expect("tmp");
    let (s1, s2) = (dir.path().join("a.sock"), dir.path().join("b.sock"));
    let _p1 = hostpath_at(&s1).await;
    let _p2 = hostpath_at(&s2).await;
    let agent = AgentProcess::start(FAST_HEALTH).await;
    let client = agent.client();
    let reg = |instance: &str, socket: &PathBuf| RegisterRequest {
        id: "rolling".into(),
        plugin_type: PluginType::Monolith,
        socket: socket.clone(),
        instance: Some(instance.into()),
    };
    client.register(&reg("v1", &s1)).await.expect("register v1");
    client.register(&reg("v2", &s2)).await.expect("register v2");
    let p = agent
        .wait_plugin("rolling", Duration::from_secs(10), |p| p.health.healthy)
        .await;
    let active: Vec<_> = p
        .instances
        .iter()
        .filter(|i| i.active)
        .map(|i| i.instance.as_str())
        .collect();
    assert_eq!(active, ["v2"]);

    client
        .deregister("rolling", "v1")
        .await
        .expect("deregister v1");
    let p = client.plugin("rolling").await.expect("still there");
    assert_eq!(p.instances.len(), 1);
    assert_eq!(p.instances[0].instance, "v2");
    assert!(p.instances[0].active && p.health.healthy);
}

#[tokio::test]
async fn after_kill_9_the_registry_is_back_from_the_store_before_any_plugin_registers_again() {
    let dir = tempfile::Builder::new()
        .prefix("bp")
        .tempdir_in("/tmp")
        .expect("tmp");
    let (s1, s2) = (dir.path().join("a.sock"), dir.path().join("b.sock"));
    let mut agent =
        AgentProcess::start(&format!("{FAST_HEALTH}{}", external("declared", &s1))).await;
    let client = agent.client();
    client
        .register(&RegisterRequest {
            id: "by-api".into(),
            plugin_type: PluginType::Node,
            socket: s2.clone(),
            instance: Some("task-1".into()),
        })
        .await
        .expect("register");
    let key = |l: berth_api::PluginList| -> Vec<(String, String, Source, PathBuf, u64)> {
        l.plugins
            .into_iter()
            .flat_map(|p| {
                p.instances.into_iter().map(move |i| {
                    (
                        p.id.clone(),
                        i.instance,
                        i.source,
                        i.socket,
                        i.registered_ms,
                    )
                })
            })
            .collect()
    };
    let before = key(client.plugins().await.expect("list"));
    assert_eq!(before.len(), 2);

    agent.kill9();
    agent.respawn();
    agent.wait_ready().await;
    // The first answer after the restart already has everything (no plugin process exists, so
    // nothing could have registered again).
    let after = key(agent.client().plugins().await.expect("list"));
    assert!(!after.is_empty());
    assert_eq!(after, before);
}

#[tokio::test]
async fn a_declared_plugin_process_is_restarted_with_backoff_and_stopped_at_shutdown() {
    let mut agent = AgentProcess::start(&managed_config()).await;
    let p = agent
        .wait_plugin("managed", Duration::from_secs(10), |p| p.health.healthy)
        .await;
    assert!(
        p.instances[0].socket.starts_with(&agent.data_dir),
        "{:?}",
        p.instances[0].socket
    );

    let mut events = agent.client().events().await.expect("events");
    let pid = logged_plugin_pid(&agent).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill plugin");
    let exited = next_event(&mut events, "managed", EventKind::PluginProcessExited).await;
    assert!(exited.reason.contains("restarting in"), "{}", exited.reason);
    next_event(&mut events, "managed", EventKind::PluginProcessStarted).await;
    agent
        .wait_plugin("managed", Duration::from_secs(10), |p| p.health.healthy)
        .await;
    let new_pid = plugin_pid_after(&agent.log(), pid).expect("a new pid");
    assert!(alive(new_pid));

    let status = agent.terminate().await;
    assert!(status.success(), "{status}");
    berth_testkit::assert_eventually!(Duration::from_secs(10), || async { !alive(new_pid) });
}

/// A config whose plugin "managed" is a berth-hostpath the agent runs, its state in the test's
/// temporary dir (`@TMP@`, filled in by `AgentProcess`).
fn managed_config() -> String {
    let hostpath = berth_testkit::bin_path("berth-hostpath");
    let state = "@TMP@/hostpath-state";
    format!(
        "{FAST_HEALTH}plugin \"managed\" {{\n  type = \"monolith\"\n  command = \"{}\"\n  args = [\"--statedir\", \"{}\", \"--nodeid\", \"n1\", \"--strict\"]\n}}\n",
        hostpath.display(),
        state
    )
}

#[tokio::test]
async fn after_kill_9_the_agent_stops_the_plugin_process_it_left_and_starts_one() {
    let mut agent = AgentProcess::start(&managed_config()).await;
    agent
        .wait_plugin("managed", Duration::from_secs(10), |p| p.health.healthy)
        .await;
    let orphan = logged_plugin_pid(&agent).await;
    agent.kill9();
    assert!(alive(orphan), "the plugin outlives a SIGKILLed agent");
    agent.respawn();
    agent.wait_ready().await;
    berth_testkit::assert_eventually!(Duration::from_secs(15), || async { !alive(orphan) });
    agent
        .wait_plugin("managed", Duration::from_secs(10), |p| p.health.healthy)
        .await;
    // The orphan may have answered the health check before it was stopped: wait for the new
    // process's start to be logged.
    berth_testkit::assert_eventually!(Duration::from_secs(15), || async {
        plugin_pid_after(&agent.log(), orphan).is_some_and(alive)
    });
    let new = plugin_pid_after(&agent.log(), orphan).expect("a new plugin process");
    assert!(alive(new));
    let status = agent.terminate().await;
    assert!(status.success(), "{status}");
    berth_testkit::assert_eventually!(Duration::from_secs(10), || async { !alive(new) });
}

/// The pid of the plugin process the agent logged starting. The plugin can answer (and be
/// healthy) before its start is logged: waits for the line.
async fn logged_plugin_pid(agent: &AgentProcess) -> i32 {
    berth_testkit::assert_eventually!(Duration::from_secs(10), || async {
        plugin_pid(&agent.log()).is_some()
    });
    plugin_pid(&agent.log()).expect("started event names the pid")
}

/// The pid in the last "started … (pid N)" line of the log.
fn plugin_pid(log: &str) -> Option<i32> {
    log.lines()
        .filter(|l| l.contains("plugin-process-started") || l.contains("PluginProcessStarted"))
        .filter_map(|l| l.split("(pid ").nth(1)?.split(')').next()?.parse().ok())
        .next_back()
}

fn plugin_pid_after(log: &str, old: i32) -> Option<i32> {
    plugin_pid(log).filter(|p| *p != old)
}

#[tokio::test]
async fn a_socket_that_is_not_a_csi_plugin_is_unhealthy_with_a_reason_and_the_agent_keeps_going() {
    let dir = tempfile::Builder::new()
        .prefix("bp")
        .tempdir_in("/tmp")
        .expect("tmp");
    let socket = dir.path().join("not-csi.sock");
    // Accepts connections and answers with bytes that are not HTTP/2.
    let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
    let server = tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt as _;
                let _ = s
                    .write_all(b"HTTP/1.1 400 Bad Request\r\n\r\nnot a CSI plugin\n")
                    .await;
            });
        }
    });
    let agent =
        AgentProcess::start(&format!("{FAST_HEALTH}{}", external("impostor", &socket))).await;
    let p = agent
        .wait_plugin("impostor", Duration::from_secs(20), |p| {
            !p.health.healthy && p.health.last_transition_ms > 0
        })
        .await;
    assert!(
        p.health.description.contains("GetPluginInfo"),
        "{}",
        p.health.description
    );
    // The agent is fine.
    assert!(agent.client().node().await.is_ok());
    server.abort();
}

#[tokio::test]
async fn a_bad_config_stops_the_agent_from_starting_and_names_the_place() {
    let cases = [
        ("plugin \"a\" {\n  type = \n}\n", "agent.hcl:2"),
        (
            "plugin \"a\" {\n  type = \"storage\"\n  socket = \"/a.sock\"\n}\n",
            "plugin \"a\".type",
        ),
        (
            "plugin \"a\" {\n  type = \"node\"\n  socket = \"a.sock\"\n}\n",
            "plugin \"a\".socket",
        ),
        (
            "plugin \"a\" {\n  type = \"node\"\n  socket = \"/a.sock\"\n}\nplugin \"a\" {\n  type = \"node\"\n  socket = \"/b.sock\"\n}\n",
            "agent.hcl:5",
        ),
    ];
    for (text, place) in cases {
        let tmp = tempfile::tempdir().expect("tmp");
        let cfg = tmp.path().join("agent.hcl");
        std::fs::write(&cfg, text).expect("write");
        let data = tmp.path().join("data");
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["agent", "--config"])
            .arg(&cfg)
            .arg("--data-dir")
            .arg(&data)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run");
        // Bounded: an agent that wrongly started would otherwise run forever.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while child.try_wait().expect("wait").is_none() {
            if tokio::time::Instant::now() >= deadline {
                let _ = child.kill();
                panic!("{text:?}: the agent started with a bad config");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let out = child.wait_with_output().expect("output");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text:?}: {err}");
        assert!(
            err.contains(place),
            "{text:?}: stderr should name {place:?}: {err}"
        );
        assert!(
            !data.exists(),
            "{text:?}: the agent must not start (data dir created)"
        );
    }
}

#[tokio::test]
async fn dev_mode_gives_a_healthy_hostpath_plugin_with_its_fingerprint() {
    let mut agent = AgentProcess::start_with("", &["--dev"]).await;
    let p = agent
        .wait_plugin("hostpath", Duration::from_secs(10), |p| p.health.healthy)
        .await;
    let fp = p.fingerprint.expect("fingerprint");
    assert_eq!(fp.provider, "hostpath.csi.berth.dev");
    assert!(!fp.version.is_empty());
    assert!(
        fp.controller_capabilities
            .is_some_and(|c| c.iter().count() > 0)
    );
    assert!(fp.node_capabilities.is_some_and(|c| c.iter().count() > 0));
    let node = agent.client().node().await.expect("node");
    assert_eq!(node.csi_plugins.len(), 1);
    assert!(node.csi_plugins[0].csi_node_id.is_some());
    let metrics = agent.client().metrics().await.expect("metrics");
    assert!(
        metrics.contains("berth_plugin_healthy{plugin=\"hostpath\",instance=\"config\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("berth_csi_rpcs_total{plugin=\"hostpath\",method=\"Probe\",code=\"OK\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("berth_csi_probe_duration_seconds_bucket"),
        "{metrics}"
    );
    let status = agent.terminate().await;
    assert!(status.success(), "{status}");
}

#[tokio::test]
async fn a_registration_socket_removed_while_the_agent_was_down_is_forgotten_at_start() {
    let dir = tempfile::Builder::new()
        .prefix("bp")
        .tempdir_in("/tmp")
        .expect("tmp");
    let socket = dir.path().join("csi.sock");
    let _plugin = hostpath_at(&socket).await;
    let mut agent = AgentProcess::start(FAST_HEALTH).await;
    let registrar = FakeRegistrar::serve(
        &agent.data_dir.join("plugins_registry"),
        "hp-reg.sock",
        PluginInfoSpec::csi("hostpath.csi.berth.dev", socket.display().to_string()),
    );
    agent
        .wait_plugin("hostpath.csi.berth.dev", Duration::from_secs(10), |p| {
            p.health.healthy
        })
        .await;
    agent.kill9();
    registrar.remove().await;
    agent.respawn();
    agent.wait_ready().await;
    let list = agent.client().plugins().await.expect("list");
    assert!(list.plugins.is_empty(), "{list:?}");
}

/// One soft limit of `/proc/<pid>/limits`: `(soft, hard)`.
fn open_files_limit(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("open files line");
    let fields: Vec<&str> = line["Max open files".len()..].split_whitespace().collect();
    (fields[0].to_string(), fields[1].to_string())
}

#[tokio::test]
async fn the_agent_raises_its_soft_open_files_limit_to_the_hard_one() {
    // Started with the soft limit at 1024, as a shell often gives it (this test runs in a
    // process of its own: the agent inherits the lowered limit).
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    setrlimit(Resource::RLIMIT_NOFILE, 1024.min(hard), hard).expect("setrlimit");
    let agent = AgentProcess::start("").await;
    let (soft, hard) = open_files_limit(agent.pid());
    assert_eq!(soft, hard, "soft {soft}, hard {hard}");
}
