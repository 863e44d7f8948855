//! A supervised instance of the example plugin, end to end: real plugin processes, real unix
//! sockets, real gRPC, events recorded by a sink.

mod common;

use std::{
    collections::BTreeMap, os::unix::fs::PermissionsExt as _, path::PathBuf, time::Duration,
};

use berth_devices::{
    attribute::Attribute,
    model::{DeviceMount, DeviceNode},
    plugin::{PluginError, PluginEvent},
};
use berth_testkit::assert_eventually;
use common::{Place, Recorder, Running, WAIT, recorded_pid};

#[tokio::test]
async fn ready_then_the_directory_as_devices() {
    let place = Place::new();
    place.add_device("b", b"bb");
    place.add_device("a", b"a");
    place.add_device(".hidden", b"");
    std::fs::create_dir(place.dev().join("sub")).unwrap();
    let mut config = place.config("files");
    config.config["attributes"] =
        serde_json::json!({"memory": "4 GiB", "ecc": "true", "model": "K80"});
    let run = Running::start(config);

    let (g, i) = run.sink.ready(0).await;
    let events = run.sink.events();
    let PluginEvent::Ready { detail } = &events[i - 1].1 else {
        unreachable!()
    };
    assert!(detail.contains("berth-nomad-device"), "{detail}");
    assert!(detail.contains("pid "), "{detail}");
    let (groups, _) = run.sink.devices(i, g).await;
    assert_eq!(groups.len(), 1, "{groups:?}");
    let group = &groups[0];
    assert_eq!(
        group.id().to_string(),
        "berth/file/mock",
        "the schema's defaults"
    );
    let ids: Vec<&str> = group.instances.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(
        ids,
        ["a", "b"],
        "sorted; dot files and directories left out"
    );
    assert!(group.instances.iter().all(|d| d.healthy));
    assert_eq!(
        group.attributes,
        BTreeMap::from([
            ("memory".to_string(), Attribute::int(4, "GiB")),
            ("ecc".to_string(), Attribute::bool(true)),
            ("model".to_string(), Attribute::string("K80")),
        ])
    );
    run.stop().await;
}

#[tokio::test]
async fn a_file_with_the_unhealthy_mode_becomes_unhealthy() {
    let place = Place::new();
    let a = place.add_device("a", b"");
    place.add_device("b", b"");
    let run = Running::start(place.config("files"));
    let (g, i) = run.sink.ready(0).await;
    let (groups, i) = run.sink.devices(i, g).await;
    assert!(groups[0].instances.iter().all(|d| d.healthy));

    std::fs::set_permissions(&a, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (groups, _) = run.sink.devices(i, g).await;
    let a = &groups[0].instances[0];
    assert_eq!(a.id, "a");
    assert!(!a.healthy);
    assert_eq!(
        a.health_description,
        "Device has bad permissions \"-rwxrwxrwx\""
    );
    assert!(groups[0].instances[1].healthy);
    run.stop().await;
}

#[tokio::test]
async fn an_empty_directory_is_an_empty_device_list_at_once() {
    let place = Place::new();
    let mut config = place.config("files");
    // Re-listed only hourly: the first list must come at once, not after a period.
    config.config["list_period"] = "1h".into();
    let run = Running::start(config);
    let (g, i) = run.sink.ready(0).await;
    let (groups, _) = tokio::time::timeout(Duration::from_secs(5), run.sink.devices(i, g))
        .await
        .expect("the first device list comes at once");
    assert!(groups.is_empty(), "{groups:?}");
    run.stop().await;
}

#[tokio::test]
async fn reserve_gives_env_mounts_and_device_nodes() {
    let place = Place::new();
    let a = place.add_device("a", b"data");
    let node = place.dev().join("null0");
    nix::sys::stat::mknod(
        &node,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(1, 3),
    )
    .expect("mknod (needs root)");
    let sick = place.add_device("sick", b"");
    std::fs::set_permissions(&sick, std::fs::Permissions::from_mode(0o777)).unwrap();
    let run = Running::start(place.config("files"));
    let (g, i) = run.sink.ready(0).await;
    run.sink.devices(i, g).await;
    let ops = run.sink.ops(g);

    let edits = ops
        .reserve(&["a".to_string(), "null0".to_string()])
        .await
        .expect("reserved");
    assert_eq!(edits.env["BERTH_DEVICE_A"], a.display().to_string());
    assert_eq!(edits.env["BERTH_DEVICE_NULL0"], node.display().to_string());
    assert_eq!(edits.env["BERTH_DEVICE_IDS"], "a,null0");
    assert_eq!(
        edits.mounts,
        vec![
            DeviceMount {
                host_path: a.clone(),
                task_path: PathBuf::from("/device/a"),
                read_only: true,
            },
            DeviceMount {
                host_path: node.clone(),
                task_path: PathBuf::from("/device/null0"),
                read_only: true,
            },
        ]
    );
    assert_eq!(
        edits.device_nodes,
        vec![DeviceNode {
            host_path: node.clone(),
            task_path: PathBuf::from("/dev/null0"),
            permissions: "rw".into(),
        }]
    );

    let err = ops.reserve(&["nope".to_string()]).await.unwrap_err();
    assert!(
        matches!(&err, PluginError::Refused { call, message, .. }
            if call == "Reserve" && message.contains("unknown device \"nope\"") && message.contains("NotFound")),
        "{err}"
    );
    let err = ops.reserve(&["sick".to_string()]).await.unwrap_err();
    assert!(
        matches!(&err, PluginError::Refused { message, .. } if message.contains("FailedPrecondition")),
        "{err}"
    );
    run.stop().await;
    // The attachment's ops are disconnected once the instance stopped.
    let err = ops.reserve(&["a".to_string()]).await.unwrap_err();
    assert!(matches!(err, PluginError::Unavailable { .. }), "{err}");
}

#[tokio::test]
async fn stats_arrive_at_the_configured_interval() {
    let place = Place::new();
    place.add_device("a", b"12345");
    let mut config = place.config("files");
    config.stats_interval = Duration::from_millis(300);
    // The plugin's own period is an hour: only the interval berth asks for brings 4 messages.
    config.config["stats_period"] = "1h".into();
    let run = Running::start(config);
    let (g, _) = run.sink.ready(0).await;
    let mut times = Vec::new();
    assert_eventually!(WAIT, || {
        times = run
            .sink
            .timed()
            .into_iter()
            .filter(|(eg, e, _)| *eg == g && matches!(e, PluginEvent::Stats(_)))
            .map(|(_, e, t)| (e, t))
            .collect::<Vec<_>>();
        let enough = times.len() >= 4;
        async move { enough }
    });
    let (PluginEvent::Stats(first), _) = &times[0] else {
        unreachable!()
    };
    let a = &first[0].instances["a"];
    assert_eq!(a.summary.as_ref().unwrap().to_string(), "5 bytes");
    assert!(a.timestamp_ms > 0);
    let stats = a.stats.as_ref().unwrap();
    assert_eq!(
        stats.attributes["mode"].string.as_deref(),
        Some("-rw-r--r--")
    );
    // Three intervals between the first and the fourth: not faster than asked.
    let spread = times[3].1 - times[0].1;
    assert!(spread >= Duration::from_millis(800), "{spread:?}");
    run.stop().await;
}

#[tokio::test]
async fn a_crash_is_reported_and_restarted() {
    let place = Place::new();
    place.add_device("a", b"");
    let run = Running::start(place.config("files"));
    let (g1, i) = run.sink.ready(0).await;
    let (_, i) = run.sink.devices(i, g1).await;

    place.set_faults(&["crash"]);
    let (reason, retry_in, i) = run.sink.down(i).await;
    assert!(reason.contains("exit status: 2"), "{reason}");
    assert!(retry_in.is_some());
    place.set_faults(&[]);
    let (g2, i) = run.sink.ready(i).await;
    assert!(g2 > g1, "a new generation");
    let (groups, _) = run.sink.devices(i, g2).await;
    assert_eq!(groups[0].instances[0].id, "a");
    run.stop().await;
    assert!(place.marked_processes().is_empty());
}

#[tokio::test]
async fn a_hanging_plugin_is_found_by_liveness_and_killed() {
    let place = Place::new();
    place.add_device("a", b"");
    let run = Running::start(place.config("files"));
    let (g1, i) = run.sink.ready(0).await;
    let (_, i) = run.sink.devices(i, g1).await;
    let pid = recorded_pid(&place).await;

    place.set_faults(&["hang"]);
    let (reason, _, i) = run.sink.down(i).await;
    assert!(reason.contains("liveness checks in a row"), "{reason}");
    assert!(reason.contains("it hangs"), "{reason}");
    assert_eventually!(
        WAIT,
        || async move { !berth_sys::procs::is_alive(pid) },
        "the hung plugin {pid} is killed"
    );
    place.set_faults(&[]);
    let (g2, i) = run.sink.ready(i).await;
    assert!(g2 > g1);
    run.sink.devices(i, g2).await;
    run.stop().await;
}

#[tokio::test]
async fn a_fingerprint_error_never_gives_the_plugin_up() {
    let place = Place::new();
    place.add_device("a", b"");
    let run = Running::start(place.config("files"));
    let (g1, i) = run.sink.ready(0).await;
    let (_, i) = run.sink.devices(i, g1).await;

    place.set_faults(&["fingerprint-error"]);
    let (reason, retry_first, i) = run.sink.down(i).await;
    assert!(
        reason.contains("Fingerprint stream failed: Internal: injected fault: fingerprint-error"),
        "{reason}"
    );
    // Still failing: restarted, and down again, with a longer wait.
    let (g2, i) = run.sink.ready(i).await;
    let (_, retry_again, i) = run.sink.down(i).await;
    assert!(g2 > g1);
    assert!(
        retry_again > retry_first,
        "backoff: {retry_first:?} then {retry_again:?}"
    );
    place.set_faults(&[]);
    let (g3, i) = run.sink.ready(i).await;
    let (groups, _) = run.sink.devices(i, g3).await;
    assert_eq!(groups[0].instances.len(), 1);
    run.stop().await;
}

#[tokio::test]
async fn the_unhealthy_and_invalid_faults_are_reported_faithfully() {
    let place = Place::new();
    place.add_device("a", b"");
    let run = Running::start(place.config("files"));
    let (g, i) = run.sink.ready(0).await;
    let (_, i) = run.sink.devices(i, g).await;
    place.set_faults(&["unhealthy", "invalid"]);
    let (groups, _) = run.sink.devices(i, g).await;
    assert_eq!(groups.len(), 2, "{groups:?}");
    assert!(!groups[0].instances[0].healthy);
    assert_eq!(
        groups[0].instances[0].health_description,
        "injected fault: unhealthy"
    );
    assert_eq!(groups[1].vendor, "", "passed on for the manager to refuse");
    assert_eq!(groups[1].instances[0].id, "");
    run.stop().await;
}

#[tokio::test]
async fn shutdown_asks_the_plugin_to_stop_and_leaves_nothing() {
    let place = Place::new();
    place.add_device("a", b"");
    let run = Running::start(place.config("files"));
    let (g, i) = run.sink.ready(0).await;
    run.sink.devices(i, g).await;
    let pid = recorded_pid(&place).await;
    assert_eq!(place.marked_processes(), vec![pid]);

    let sink = run.sink.clone();
    run.stop().await;
    let events = sink.events();
    assert!(
        matches!(events.last(), Some((_, PluginEvent::Removed { .. }))),
        "{events:#?}"
    );
    let log = std::fs::read_to_string(place.plugin_dir().join("plugin.log")).unwrap();
    assert!(log.contains("GRPCController.Shutdown: stopping"), "{log}");
    assert!(!berth_sys::procs::is_alive(pid));
    assert!(place.marked_processes().is_empty());
    assert!(!place.plugin_dir().join("plugin.pid").exists());
    let mode = std::fs::metadata(place.plugin_dir())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o700);
    let mode = std::fs::metadata(place.plugin_dir().join("plugin.log"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
}

#[tokio::test]
async fn a_driver_plugin_is_refused_clearly() {
    let place = Place::new();
    let mut config = place.config("drv");
    config
        .env
        .insert("BERTH_NOMAD_DEVICE_TYPE".into(), "driver".into());
    let run = Running::start(config);
    let (reason, retry_in, i) = run.sink.down(0).await;
    assert_eq!(
        reason,
        "plugin \"drv\" is a driver plugin; berth runs device plugins only"
    );
    assert!(retry_in.is_some());
    // Tried again, never given up.
    run.sink.down(i).await;
    assert!(
        !run.sink
            .events()
            .iter()
            .any(|(_, e)| matches!(e, PluginEvent::Ready { .. }))
    );
    run.stop().await;
    assert!(place.marked_processes().is_empty());
}

#[tokio::test]
async fn a_config_error_names_the_field_and_is_retried() {
    let place = Place::new();
    let mut config = place.config("files");
    config.config["bogus"] = 1.into();
    let run = Running::start(config);
    let (reason, _, i) = run.sink.down(0).await;
    assert!(
        reason.starts_with("plugin \"files\".config.bogus: unsupported argument"),
        "{reason}"
    );
    let (again, _, _) = run.sink.down(i).await;
    assert_eq!(again, reason);
    run.stop().await;

    let mut config = place.config("files");
    config.config["list_period"] = "soon".into();
    let run = Running::start(config);
    let (reason, _, _) = run.sink.down(0).await;
    assert!(reason.starts_with("plugin \"files\" refused its configuration (SetConfig): InvalidArgument: config key \"list_period\""), "{reason}");
    // The bad value is named: a short setting is no secret.
    assert!(
        reason.contains("\"soon\" is not a positive Go duration"),
        "{reason}"
    );
    run.stop().await;
}

#[tokio::test]
async fn what_the_plugin_says_is_scrubbed_of_its_config_values() {
    let place = Place::new();
    // A long value the plugin repeats in its refusal of the config.
    let mut config = place.config("files");
    config.config["list_period"] = "hunter2-hunter2".into();
    let run = Running::start(config);
    let (reason, _, _) = run.sink.down(0).await;
    assert!(
        reason.contains("config key \"list_period\": \"[REDACTED]\""),
        "{reason}"
    );
    assert!(!reason.contains("hunter2"), "{reason}");
    run.stop().await;

    // A value the plugin repeats when it refuses a Reserve.
    let sick = place.add_device("sick", b"");
    std::fs::set_permissions(&sick, std::fs::Permissions::from_mode(0o666)).unwrap();
    let mut config = place.config("files");
    config.config["unhealthy_perm"] = "-rw-rw-rw-".into();
    let run = Running::start(config);
    let (g, i) = run.sink.ready(0).await;
    let (groups, _) = run.sink.devices(i, g).await;
    assert!(!groups[0].instances[0].healthy);
    let err = run
        .sink
        .ops(g)
        .reserve(&["sick".to_string()])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, PluginError::Refused { message, .. }
            if message.contains("bad permissions \"[REDACTED]\"") && !message.contains("-rw-rw-rw-")),
        "{err}"
    );
    run.stop().await;
}

#[tokio::test]
async fn a_binary_that_prints_garbage_gets_a_clear_error() {
    let place = Place::new();
    let mut config = place.config("junk");
    config.command = "/bin/sh".into();
    config.args = vec![
        "-c".into(),
        "echo oops >&2; echo 'hello world'; exec sleep 60".into(),
    ];
    let run = Running::start(config);
    let (reason, _, _) = run.sink.down(0).await;
    assert!(
        reason.contains("bad handshake: not a go-plugin handshake line"),
        "{reason}"
    );
    assert!(reason.contains("hello world"), "{reason}");
    assert!(reason.contains("oops"), "{reason}");
    run.stop().await;
    assert!(place.marked_processes().is_empty());
}

#[tokio::test]
async fn socket_paths_that_do_not_fit_are_refused_up_front() {
    let place = Place::new();
    let mut config = place.config("files");
    config.dir = place.tmp.path().join("x".repeat(90));
    let err = berth_devices_nomad::NomadPlugin::new(config).unwrap_err();
    assert_eq!(err.field, "dir");
    assert!(err.to_string().contains("must fit in 107 bytes"), "{err}");
}

/// Not a test by itself (hence ignored): the "agent" that [`spawn_agent`] runs in a child
/// process, for tests to kill with SIGKILL. Runs the example plugin of the place at
/// `BERTH_NOMAD_TEST_AGENT` in `BERTH_NOMAD_TEST_PLUGIN_DIR` (default: the place's).
#[tokio::test]
#[ignore = "run by the tests that kill an agent, in a child process"]
async fn agent_child_helper() {
    let root = PathBuf::from(
        std::env::var("BERTH_NOMAD_TEST_AGENT")
            .expect("run by a test, with BERTH_NOMAD_TEST_AGENT"),
    );
    let ready = root.join("agent-ready");
    let mut config = common::config_at(&root, "files");
    if let Ok(dir) = std::env::var("BERTH_NOMAD_TEST_PLUGIN_DIR") {
        config.dir = PathBuf::from(dir);
    }
    let recorder = Recorder::with_callback(move |e| {
        if matches!(e, PluginEvent::Ready { .. }) {
            let _ = std::fs::write(&ready, b"ready");
        }
    });
    let run = Running::start_with(config, recorder);
    // Runs until killed.
    tokio::time::sleep(Duration::from_secs(120)).await;
    drop(run);
}

/// A child process running [`agent_child_helper`]; killed (and reaped) when dropped.
struct ChildAgent(std::process::Child);

impl ChildAgent {
    /// Kills the agent at once (SIGKILL), leaving its plugin behind.
    fn kill9(mut self) {
        self.0.kill().unwrap();
        let _ = self.0.wait();
    }
}

impl Drop for ChildAgent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts an agent in a child process running the place's example plugin in `dir`, and waits
/// until the plugin is ready; returns it and the plugin's pid.
async fn spawn_agent(place: &Place, dir: &std::path::Path) -> (ChildAgent, i32) {
    let exe = std::env::current_exe().unwrap();
    let agent = ChildAgent(
        std::process::Command::new(exe)
            .args([
                "--ignored",
                "--exact",
                "agent_child_helper",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("BERTH_NOMAD_TEST_AGENT", place.tmp.path())
            .env("BERTH_NOMAD_TEST_PLUGIN_DIR", dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let ready = place.tmp.path().join("agent-ready");
    assert_eventually!(
        WAIT,
        || async { ready.exists() },
        "the child agent's plugin is ready"
    );
    let _ = std::fs::remove_file(&ready);
    let pid_file = dir.join("plugin.pid");
    let mut pid = 0;
    assert_eventually!(
        WAIT,
        || {
            pid = std::fs::read_to_string(&pid_file)
                .unwrap_or_default()
                .trim()
                .parse()
                .unwrap_or(0);
            let found = pid > 0;
            async move { found }
        },
        "the pid file {}",
        pid_file.display()
    );
    (agent, pid)
}

#[tokio::test]
async fn a_plugin_left_by_a_killed_agent_is_stopped() {
    let place = Place::new();
    place.add_device("a", b"");
    let (agent, old) = spawn_agent(&place, &place.plugin_dir()).await;
    // The agent dies at once, leaving its plugin behind.
    agent.kill9();
    assert!(
        berth_sys::procs::is_alive(old),
        "the plugin outlives its killed agent"
    );
    assert_eq!(place.marked_processes(), vec![old]);

    let run = Running::start(place.config("files"));
    let (g, i) = run.sink.ready(0).await;
    run.sink.devices(i, g).await;
    let new = recorded_pid(&place).await;
    assert_ne!(new, old);
    assert!(!berth_sys::procs::is_alive(old), "the leftover was stopped");
    assert_eq!(place.marked_processes(), vec![new]);
    run.stop().await;
    assert!(place.marked_processes().is_empty());
}

#[tokio::test]
async fn leftovers_of_plugins_not_kept_are_stopped_and_kept_ones_left_alone() {
    let place = Place::new();
    place.add_device("a", b"");
    let root = place.tmp.path().join("devices");
    let dir = berth_devices_nomad::plugin_dir(&root, "files");
    assert_eq!(dir, root.join("nomad/files"));
    /// Whatever a failed assertion leaves in `dir` is killed.
    struct Reap(PathBuf);
    impl Drop for Reap {
        fn drop(&mut self) {
            for pid in common::marked_processes(&self.0) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
    let _reap = Reap(dir.clone());
    let (agent, pid) = spawn_agent(&place, &dir).await;
    agent.kill9();
    assert_eq!(common::marked_processes(&dir), vec![pid]);
    // A probe an agent of the earlier layout left: a directory of its own, removed.
    let legacy = root.join("inspect/old-probe");
    std::fs::create_dir_all(legacy.join("sock")).unwrap();

    let grace = Duration::from_secs(2);
    let keep = std::collections::BTreeSet::from(["files".to_string()]);
    berth_devices_nomad::stop_leftovers(&root, &keep, grace).await;
    assert!(
        berth_sys::procs::is_alive(pid),
        "a kept plugin's run claims its slot itself"
    );
    assert!(!root.join("inspect").exists());

    berth_devices_nomad::stop_leftovers(&root, &Default::default(), grace).await;
    assert!(!berth_sys::procs::is_alive(pid), "the leftover was stopped");
    assert!(common::marked_processes(&dir).is_empty());
    assert!(!dir.join("plugin.pid").exists());
    assert!(dir.join("plugin.log").exists(), "its log stays");
}

#[tokio::test]
async fn a_reserve_without_an_answer_times_out() {
    let place = Place::new();
    place.add_device("a", b"");
    let mut config = place.config("files");
    // Liveness stays out of the way: the call's own deadline must end it.
    config.liveness_interval = Duration::from_secs(600);
    config.call_timeout = Duration::from_millis(500);
    let run = Running::start(config);
    let (g, i) = run.sink.ready(0).await;
    run.sink.devices(i, g).await;
    let ops = run.sink.ops(g);
    place.set_faults(&["hang"]);
    let err = ops.reserve(&["a".to_string()]).await.unwrap_err();
    assert_eq!(
        err,
        PluginError::Timeout {
            plugin: berth_devices::plugin::PluginId::nomad("files"),
            call: "Reserve".into(),
            after: Duration::from_millis(500),
        },
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "device plugin nomad:files did not answer Reserve within 500ms"
    );
    place.set_faults(&[]);
    run.stop().await;
}

#[tokio::test]
async fn a_plugin_found_in_plugin_dir_that_is_no_device_plugin_stops_telling_nothing() {
    let place = Place::new();
    for (name, command, args, env) in [
        // A Nomad plugin of another kind.
        (
            "drv",
            common::plugin_bin(),
            vec![],
            vec![("BERTH_NOMAD_DEVICE_TYPE", "driver")],
        ),
        // No Nomad plugin at all.
        (
            "script",
            PathBuf::from("/bin/sh"),
            vec!["-c".to_string(), "echo not a plugin; exit 0".to_string()],
            vec![],
        ),
    ] {
        let mut config = place.config(name);
        config.found_in_plugin_dir = true;
        config.command = command;
        config.args = args;
        config
            .env
            .extend(env.into_iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let run = Running::start(config);
        let sink = run.sink.clone();
        tokio::time::timeout(WAIT, run.finished())
            .await
            .unwrap_or_else(|_| panic!("{name}: run returns by itself"));
        assert!(
            sink.attachments() == 0 && sink.events().is_empty(),
            "{name}: {sink:?}"
        );
        assert!(place.marked_processes().is_empty(), "{name}");
    }
}

#[tokio::test]
async fn a_device_plugin_found_in_plugin_dir_runs_as_a_declared_one() {
    let place = Place::new();
    place.add_device("a", b"");
    let mut config = place.config("files");
    config.found_in_plugin_dir = true;
    let run = Running::start(config);
    let (g1, i) = run.sink.ready(0).await;
    let (groups, i) = run.sink.devices(i, g1).await;
    assert_eq!(groups[0].instances[0].id, "a");
    // Once known to be a device plugin, a failure is Down and retried, like any plugin's.
    place.set_faults(&["crash"]);
    let (reason, retry_in, i) = run.sink.down(i).await;
    assert!(reason.contains("exit status: 2"), "{reason}");
    assert!(retry_in.is_some());
    place.set_faults(&[]);
    let (g2, _) = run.sink.ready(i).await;
    assert!(g2 > g1);
    let sink = run.sink.clone();
    run.stop().await;
    assert!(
        matches!(sink.events().last(), Some((_, PluginEvent::Removed { .. }))),
        "{:?}",
        sink.events()
    );
}
