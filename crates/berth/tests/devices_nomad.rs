//! A Nomad device plugin (the example one, files as devices) launched by a real agent from its
//! `plugin_dir`: its devices show healthy in `node status` with their statistics, a job's exec
//! task gets their env, mounts and device nodes, health changes and crashes are followed, an
//! empty device list delays nothing (and a device added to it is usable once listed), and a
//! task restarted after a kill -9 of the agent gets the same devices.

mod agent_support;

use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    time::Duration,
};

use agent_support::{
    AgentProcess, client_config,
    devices::{device_job, group, healthy, wait_node, wait_node_before},
    hostpath_config,
    jobs::{create_volume, run_job, wait_alloc, wait_alloc_before},
};
use berth_api::{EventKind, EventLine, jobs::ClientStatus};
use tempfile::TempDir;

const MOCK: &str = "berth/file/mock";

/// How soon after the agent answers a plugin's first (immediate) list and a job without
/// devices must show: well below the hour-long list period of the test that uses it.
const PROMPTLY: Duration = Duration::from_secs(5);

/// The plugin's binary (in a plugin_dir of its own), its device directory, and how often it
/// lists that directory.
struct Plugin {
    dir: TempDir,
    list_period: &'static str,
}

impl Plugin {
    /// A plugin that lists its devices every 100 ms.
    fn new() -> Self {
        Self::listing_every("100ms")
    }

    /// A plugin that lists its devices every `list_period` (a Go duration); its first list is
    /// sent at once.
    fn listing_every(list_period: &'static str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("bn")
            .tempdir_in("/tmp")
            .expect("tempdir");
        std::fs::create_dir(dir.path().join("plugins")).unwrap();
        std::os::unix::fs::symlink(
            berth_testkit::bin_path("berth-nomad-device"),
            dir.path().join("plugins/example-device"),
        )
        .unwrap();
        std::fs::create_dir(dir.path().join("devs")).unwrap();
        Self { dir, list_period }
    }

    fn devs(&self) -> PathBuf {
        self.dir.path().join("devs")
    }

    fn fault(&self, word: &str) {
        std::fs::write(self.dir.path().join("faults"), format!("{word}\n")).unwrap();
    }

    /// The agent config: berth-hostpath, the example plugin (devices = files in `devs`, one
    /// attribute, its list period), stats every 200 ms.
    fn config(&self) -> String {
        let d = self.dir.path().display();
        let list_period = self.list_period;
        format!(
            r#"{}{}
plugin_dir = "{d}/plugins"

plugin "example-device" {{
  config {{
    dir         = "{d}/devs"
    list_period = "{list_period}"
    fault_file  = "{d}/faults"
    attributes  = {{
      memory = "4 GiB"
    }}
  }}
}}

devices {{
  stats_interval = "200ms"
  kubernetes     = false
}}
"#,
            hostpath_config("hostpath", &[]),
            client_config("")
        )
    }
}

async fn agent(plugin: &Plugin) -> AgentProcess {
    let agent = AgentProcess::start_in_namespace(&plugin.config()).await;
    agent
        .wait_plugin("hostpath", Duration::from_secs(20), |p| p.health.healthy)
        .await;
    agent
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The task writes its device env, the device files mounted, and how many bytes it read from
/// each device node, into `/data/<job>/`, appending one line per start.
fn script(job: &str) -> String {
    format!(
        "d=/data/{job}; mkdir -p $d; env | grep '^BERTH_DEVICE' | sort | tr '\\n' ' ' >> $d/env; echo >> $d/env; \
         ls /device | tr '\\n' ' ' >> $d/mounts; echo >> $d/mounts; \
         for id in $(echo $BERTH_DEVICE_IDS | tr , ' '); do printf '%s ' $id; head -c 8 /dev/$id | wc -c; done >> $d/nodes"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nomad_plugin_fingerprints_and_its_devices_reach_the_task() {
    let plugin = Plugin::new();
    berth_testkit::mknod_char(&plugin.devs().join("dev0"), 1, 9);
    std::fs::write(plugin.devs().join("dev1"), b"plain file").unwrap();
    let agent = agent(&plugin).await;
    let node = wait_node(&agent, "2 healthy mocks with stats", |n| {
        healthy(n, MOCK) == 2
            && group(n, MOCK).is_some_and(|g| {
                g.instances
                    .iter()
                    .all(|i| i.stats.as_ref().is_some_and(|s| s.summary.is_some()))
            })
    })
    .await;
    let g = group(&node, MOCK).unwrap();
    assert_eq!(g.plugin.to_string(), "nomad:example-device");
    assert_eq!(g.attributes["memory"].to_string(), "4 GiB");
    assert!(
        node.computed_class.starts_with("v1:"),
        "{}",
        node.computed_class
    );
    let metrics = agent.client().metrics().await.unwrap();
    assert!(
        metrics.contains(
            "berth_device_healthy{plugin=\"nomad:example-device\",device=\"berth/file/mock\",instance=\"dev0\"} 1"
        ),
        "{metrics}"
    );
    assert!(metrics.contains("berth_device_stat{"), "{metrics}");

    let external = create_volume(&agent.client(), "hostpath", "out").await;
    let out = agent.tmp.path().join("hp/volumes").join(external);
    let job = device_job(
        "mock",
        "batch",
        "out",
        "        device \"berth/file/mock\" {\n          constraint {\n            attribute = \"${device.attr.memory}\"\n            operator  = \">=\"\n            value     = \"2048 MiB\"\n          }\n        }",
        &script("mock"),
    );
    run_job(&agent.client(), job).await.expect("job run");
    let alloc = wait_alloc(&agent, "mock", |a| a.client_status.is_terminal()).await;
    assert_eq!(alloc.client_status, ClientStatus::Complete, "{alloc:#?}");
    let env = read(&out.join("mock/env"));
    assert!(env.contains("BERTH_DEVICE_IDS=dev0"), "{env}");
    assert!(env.contains("BERTH_DEVICE_DEV0="), "{env}");
    assert_eq!(read(&out.join("mock/mounts")).trim(), "dev0");
    assert_eq!(read(&out.join("mock/nodes")), "dev0 8\n");
    let task = &alloc.tasks["main"];
    assert_eq!(task.devices[0].devices, ["berth/file/mock/dev0"]);

    // The CLI shows the same.
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(args)
            .env("BERTH_ADDR", format!("unix://{}", agent.socket().display()))
            .output()
            .expect("berth");
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8(out.stdout).expect("utf-8")
    };
    let status = cli(&["node", "status"]);
    assert!(status.contains("nomad:example-device  ready"), "{status}");
    assert!(status.contains("berth/file/mock  dev0"), "{status}");
    assert!(status.contains("memory=4 GiB"), "{status}");
    assert!(status.contains("computed class  v1:"), "{status}");
    let status = cli(&["alloc", "status", &alloc.alloc_id]);
    assert!(status.contains("berth/file/mock/dev0"), "{status}");
    assert!(status.contains("BERTH_DEVICE_IDS"), "{status}");
    assert!(
        !status.contains("BERTH_DEVICE_IDS=dev0"),
        "env values are not shown: {status}"
    );
    assert!(status.contains("devices_reserved"), "{status}");
    assert!(
        task.devices[0].stats.contains_key("berth/file/mock/dev0"),
        "the latest stats are shown: {:?}",
        task.devices[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_changes_and_a_crash_are_followed() {
    let plugin = Plugin::new();
    std::fs::write(plugin.devs().join("dev0"), b"a").unwrap();
    std::fs::write(plugin.devs().join("dev1"), b"b").unwrap();
    let agent = agent(&plugin).await;
    wait_node(&agent, "2 healthy mocks", |n| healthy(n, MOCK) == 2).await;
    let mut events = agent.client().events().await.expect("events");

    // The plugin's unhealthy mode: the device is shown unhealthy, an event says so, and it is
    // not given to a new alloc.
    std::fs::set_permissions(
        plugin.devs().join("dev1"),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    let node = wait_node(&agent, "dev1 unhealthy", |n| healthy(n, MOCK) == 1).await;
    let dev1 = group(&node, MOCK)
        .unwrap()
        .instances
        .iter()
        .find(|i| i.id == "dev1")
        .cloned()
        .unwrap();
    assert!(
        dev1.health_description.contains("bad permissions"),
        "{dev1:?}"
    );
    let event = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let EventLine::Event(e) = events.next().await.expect("stream").expect("an event")
                && e.kind == EventKind::DeviceUnhealthy
            {
                return e;
            }
        }
    })
    .await
    .expect("an unhealthy event");
    assert_eq!(event.device.as_deref(), Some("berth/file/mock/dev1"));
    let two = agent_support::devices::sleeper_job(
        "two",
        1,
        "        device \"file\" {\n          count = 2\n        }",
    );
    let err = run_job(&agent.client(), two.clone())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("dev1 unhealthy: Device has bad permissions"),
        "{err}"
    );

    // A crash: the plugin is restarted and its devices come back.
    std::fs::set_permissions(
        plugin.devs().join("dev1"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    wait_node(&agent, "healthy again", |n| healthy(n, MOCK) == 2).await;
    plugin.fault("crash");
    let down = wait_node(&agent, "the plugin down", |n| {
        n.devices.plugins.iter().any(|p| p.state.as_str() == "down")
    })
    .await;
    assert!(
        down.devices.plugins[0]
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("exit")),
        "{:?}",
        down.devices.plugins[0]
    );
    plugin.fault("");
    let back = wait_node(&agent, "the devices back", |n| {
        healthy(n, MOCK) == 2 && n.devices.plugins[0].attachments >= 2
    })
    .await;
    assert_eq!(back.devices.plugins[0].state.as_str(), "ready");
    run_job(&agent.client(), two)
        .await
        .expect("placed once the plugin is back");

    // An invalid device list: what is wrong is reported, and never given.
    plugin.fault("invalid");
    let node = wait_node(&agent, "the invalid entries reported", |n| {
        !n.devices.plugins[0].invalid.is_empty()
    })
    .await;
    let invalid = node.devices.plugins[0].invalid.join("\n");
    assert!(invalid.contains("empty vendor"), "{invalid}");
    assert!(
        node.devices
            .groups
            .iter()
            .all(|g| !g.vendor.is_empty() && g.instances.iter().all(|i| !i.id.is_empty())),
        "{:?}",
        node.devices.groups
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_device_list_delays_nothing() {
    // The plugin lists its directory once an hour: within the bound, only its first list, sent
    // at once, can be seen.
    let plugin = Plugin::listing_every("1h");
    let agent = AgentProcess::start_in_namespace(&plugin.config()).await;
    let deadline = tokio::time::Instant::now() + PROMPTLY;
    // A job without devices runs at once, whatever the device plugins are doing.
    let plain = agent_support::devices::sleeper_job("plain", 1, "");
    run_job(&agent.client(), plain).await.expect("placed");
    wait_alloc_before(&agent, "plain", deadline, |a| {
        a.client_status == ClientStatus::Running
            && a.tasks.get("main").is_some_and(|t| t.pid.is_some())
    })
    .await;
    // The plugin answers with no devices: shown at once, not after a list period.
    let node = wait_node_before(
        &agent,
        "the plugin ready and fingerprinted with no devices",
        deadline,
        |n| {
            n.devices.plugins.iter().any(|p| {
                p.id.to_string() == "nomad:example-device"
                    && p.state.as_str() == "ready"
                    && p.fingerprinted
            })
        },
    )
    .await;
    assert!(node.devices.groups.is_empty(), "{:?}", node.devices);
    let wants = agent_support::devices::sleeper_job("wants", 1, "        device \"file\" {}");
    let err = run_job(&agent.client(), wants)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no such device on this node (it has no devices)"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_appears_in_an_empty_list_is_usable_once_listed() {
    let plugin = Plugin::new();
    let agent = agent(&plugin).await;
    wait_node(&agent, "the plugin ready with no devices", |n| {
        n.devices
            .plugins
            .iter()
            .any(|p| p.state.as_str() == "ready" && p.fingerprinted)
            && n.devices.groups.is_empty()
    })
    .await;
    std::fs::write(plugin.devs().join("dev0"), b"x").unwrap();
    wait_node(&agent, "dev0", |n| healthy(n, MOCK) == 1).await;
    let wants = agent_support::devices::sleeper_job("wants", 1, "        device \"file\" {}");
    run_job(&agent.client(), wants)
        .await
        .expect("placed once the device is listed");
    let alloc = wait_alloc(&agent, "wants", |a| {
        a.tasks.get("main").is_some_and(|t| t.pid.is_some())
    })
    .await;
    assert_eq!(
        alloc.tasks["main"].devices[0].devices,
        ["berth/file/mock/dev0"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_kill_9_of_the_agent_a_restarted_task_gets_the_same_devices() {
    let plugin = Plugin::new();
    berth_testkit::mknod_char(&plugin.devs().join("dev0"), 1, 9);
    berth_testkit::mknod_char(&plugin.devs().join("dev1"), 1, 9);
    let mut agent = agent(&plugin).await;
    wait_node(&agent, "2 healthy mocks", |n| healthy(n, MOCK) == 2).await;
    let external = create_volume(&agent.client(), "hostpath", "out").await;
    let out = agent.tmp.path().join("hp/volumes").join(external);
    let job = device_job(
        "keep",
        "service",
        "out",
        "        device \"berth/file/mock\" {}",
        &format!("{}; exec sleep 600", script("keep")),
    );
    run_job(&agent.client(), job).await.expect("job run");
    let alloc = wait_alloc(&agent, "keep", |a| a.tasks["main"].pid.is_some()).await;
    let pid = alloc.tasks["main"].pid.unwrap();
    berth_testkit::assert_eventually!(
        Duration::from_secs(20),
        || {
            let p = out.join("keep/nodes");
            async move { std::fs::read_to_string(p).is_ok_and(|t| t.ends_with('\n')) }
        },
        "the task wrote what it sees"
    );

    // The plugin will not come back for a while: its binary is replaced by one that fails.
    let plugin_pid: i32 = read(
        &agent
            .data_dir
            .join("devices/nomad/example-device/plugin.pid"),
    )
    .trim()
    .parse()
    .expect("the plugin's pid");
    let binary = plugin.dir.path().join("plugins/example-device");
    std::fs::remove_file(&binary).unwrap();
    std::fs::write(&binary, "#!/bin/sh\necho broken >&2\nexit 1\n").unwrap();
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();
    agent.kill9();
    agent.respawn();
    agent.wait_ready().await;
    let node = wait_node(&agent, "the plugin down", |n| {
        n.devices.plugins.iter().any(|p| p.state.as_str() == "down")
    })
    .await;
    assert_eq!(healthy(&node, MOCK), 0, "{:?}", node.devices);
    assert!(
        !agent_support::alive(plugin_pid),
        "the plugin the killed agent left running was stopped"
    );
    // Its process is killed: the restart policy starts it again, with the same devices,
    // env, mounts and device nodes, though the plugin is down (the answer was persisted).
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the task");
    let alloc = wait_alloc(&agent, "keep", |a| {
        a.tasks["main"].restarts == 1 && a.tasks["main"].pid.is_some()
    })
    .await;
    berth_testkit::assert_eventually!(
        Duration::from_secs(20),
        || {
            let p = out.join("keep/nodes");
            // Two whole lines: the second one may still be being written.
            async move {
                std::fs::read_to_string(p)
                    .is_ok_and(|t| t.ends_with('\n') && t.lines().count() == 2)
            }
        },
        "the restarted task wrote what it sees"
    );
    for file in ["env", "mounts", "nodes"] {
        let text = read(&out.join("keep").join(file));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{file}: {text}");
        assert_eq!(lines[0], lines[1], "{file}: the same after the restart");
    }
    assert_eq!(read(&out.join("keep/nodes")).lines().next(), Some("dev0 8"));
    assert_eq!(
        alloc.tasks["main"].devices[0].devices,
        ["berth/file/mock/dev0"]
    );
    // The plugin comes back: dev0 is still the alloc's.
    std::fs::remove_file(&binary).unwrap();
    std::os::unix::fs::symlink(berth_testkit::bin_path("berth-nomad-device"), &binary).unwrap();
    let node = wait_node(&agent, "the plugin back", |n| healthy(n, MOCK) == 2).await;
    let dev0 = group(&node, MOCK).unwrap().instances[0].clone();
    assert_eq!(dev0.reserved_by.as_deref(), Some(alloc.alloc_id.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_computed_class_is_stable_across_health_changes_and_restarts() {
    let plugin = Plugin::new();
    std::fs::write(plugin.devs().join("dev0"), b"a").unwrap();
    std::fs::write(plugin.devs().join("dev1"), b"b").unwrap();
    let mut agent = agent(&plugin).await;
    let node = wait_node(&agent, "2 healthy mocks", |n| healthy(n, MOCK) == 2).await;
    let class = node.computed_class.clone();
    assert!(class.starts_with("v1:"), "{class}");

    // Health and instances do not count.
    std::fs::set_permissions(
        plugin.devs().join("dev1"),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    let node = wait_node(&agent, "dev1 unhealthy", |n| healthy(n, MOCK) == 1).await;
    assert_eq!(node.computed_class, class);
    std::fs::write(plugin.devs().join("dev2"), b"c").unwrap();
    let node = wait_node(&agent, "dev2", |n| {
        group(n, MOCK).is_some_and(|g| g.instances.len() == 3)
    })
    .await;
    assert_eq!(node.computed_class, class);

    // A clean restart: the devices are known from the store at once, the class is the same.
    agent.terminate().await;
    agent.respawn();
    agent.wait_ready().await;
    let node = agent.client().node().await.unwrap();
    assert_eq!(
        node.computed_class, class,
        "{:?}\nattributes: {:?}",
        node.devices, node.attributes
    );
    assert!(group(&node, MOCK).is_some(), "{:?}", node.devices);
    let node = wait_node(&agent, "the plugin back", |n| healthy(n, MOCK) == 2).await;
    assert_eq!(node.computed_class, class);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_dropped_from_the_config_after_a_kill_9_is_stopped_and_forgotten() {
    let plugin = Plugin::new();
    std::fs::write(plugin.devs().join("dev0"), b"a").unwrap();
    let mut agent = agent(&plugin).await;
    wait_node(&agent, "dev0", |n| healthy(n, MOCK) == 1).await;
    let pid: i32 = read(
        &agent
            .data_dir
            .join("devices/nomad/example-device/plugin.pid"),
    )
    .trim()
    .parse()
    .expect("the plugin's pid");
    agent.kill9();
    assert!(
        agent_support::alive(pid),
        "the plugin outlives a killed agent"
    );
    // The next agent no longer has the plugin in its config.
    std::fs::write(
        &agent.config,
        format!(
            "{}{}devices {{\n  kubernetes = false\n}}\n",
            hostpath_config("hostpath", &[]),
            client_config("")
        ),
    )
    .unwrap();
    agent.respawn();
    agent.wait_ready().await;
    berth_testkit::assert_eventually!(
        Duration::from_secs(20),
        || async move { !agent_support::alive(pid) },
        "the plugin left by the killed agent was stopped"
    );
    let node = agent.client().node().await.unwrap();
    assert!(node.devices.plugins.is_empty(), "{:?}", node.devices);
    assert!(node.devices.groups.is_empty(), "{:?}", node.devices);
}
