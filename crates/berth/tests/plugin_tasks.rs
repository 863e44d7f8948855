//! CSI plugins run as tasks: a real agent runs berth-hostpath as an `exec` task with a
//! `csi_plugin` block, registers it once it answers its probe (source `task`), serves volumes
//! through it (the plugin mounts in its own namespace, the mounts show on the host through the
//! bidirectional root), restarts it when it dies or is not ready in time, and keeps it across an
//! agent kill -9.

mod agent_support;

use std::{path::PathBuf, time::Duration};

use agent_support::{
    AgentProcess,
    jobs::{VOLUME_RPCS, create_volume, run_job, run_to_completion, volume_job, wait_alloc},
};
use berth_api::{
    Source,
    jobs::{AllocStatus, ClientStatus, EventKind},
};
use berth_hostpath::calllog;

const PLUGIN: &str = "tp";

/// A fast health loop, and `exec` roots that hold the test binaries.
fn config() -> String {
    format!(
        "health {{\n  interval = \"200ms\"\n  failures = 2\n}}\n{}",
        agent_support::client_config("")
    )
}

/// The plugin job: berth-hostpath as an exec task, in a root of its own. It keeps its state and
/// call log in the plugin's root (`/local/csi`, the host's `<data_dir>/csi/monolith/tp`), which
/// outlives the task, so a later plugin job finds the volumes.
fn plugin_job(health_timeout: &str) -> String {
    let hostpath = berth_testkit::bin_path("berth-hostpath");
    format!(
        r#"
job "plugin" {{
  type = "service"
  group "p" {{
    task "hostpath" {{
      driver = "exec"
      config {{
        command = "{hostpath}"
        args    = ["--statedir", "/local/csi/hp", "--nodeid", "n1", "--strict", "--call-log", "/local/csi/calls.log"]
      }}
      csi_plugin {{
        id                     = "{PLUGIN}"
        type                   = "monolith"
        mount_dir              = "/csi"
        stage_publish_base_dir = "/local/csi"
        health_timeout         = "{health_timeout}"
      }}
      restart {{
        attempts = 5
        delay    = "0s"
        interval = "1m"
        mode     = "fail"
      }}
      kill_timeout = "2s"
    }}
  }}
}}
"#,
        hostpath = hostpath.display()
    )
}

fn count(a: &AllocStatus, kind: EventKind) -> usize {
    a.events.iter().filter(|e| e.kind == kind).count()
}

fn pid(a: &AllocStatus) -> Option<u32> {
    a.tasks.get("hostpath").and_then(|t| t.pid)
}

/// The plugin's instances from its task, healthy.
async fn wait_task_instance_healthy(agent: &AgentProcess) -> String {
    let p = agent
        .wait_plugin(PLUGIN, Duration::from_secs(30), |p| {
            p.instances
                .iter()
                .any(|i| i.source == Source::Task && i.active && i.health.healthy)
        })
        .await;
    p.instances
        .iter()
        .find(|i| i.source == Source::Task)
        .map(|i| i.instance.clone())
        .expect("a task instance")
}

/// The plugin's root on the host: where the task keeps its state and call log.
fn plugin_root(agent: &AgentProcess) -> PathBuf {
    agent.data_dir.join("csi/monolith").join(PLUGIN)
}

fn volume_rpcs(agent: &AgentProcess) -> Vec<String> {
    calllog::read(plugin_root(agent).join("calls.log"))
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.rpc)
        .filter(|r| VOLUME_RPCS.contains(&r.as_str()))
        .collect()
}

#[tokio::test]
async fn a_plugin_task_serves_volumes_and_is_restarted_and_registered_again_when_killed() {
    let agent = AgentProcess::start_in_namespace(&config()).await;
    let client = agent.client();
    let tmp = agent.tmp.path().to_path_buf();
    run_job(&client, plugin_job("20s"))
        .await
        .expect("plugin job");
    let instance = wait_task_instance_healthy(&agent).await;
    let a = wait_alloc(&agent, "plugin", |a| {
        count(a, EventKind::PluginRegistered) == 1 && count(a, EventKind::PluginHealthy) >= 1
    })
    .await;
    let first_pid = pid(&a).expect("running");
    // The plugin's socket is in its own instance directory.
    let plugin = client.plugin(PLUGIN).await.expect("plugin");
    let socket = &plugin.instances[0].socket;
    assert_eq!(
        socket,
        &agent
            .data_dir
            .join("csi/plugins")
            .join(&instance)
            .join("csi.sock")
    );

    // A job writes through a volume the plugin task mounts: the data is in its volume.
    let external = create_volume(&client, PLUGIN, "v1").await;
    let dest = tmp.join("writer-data");
    run_to_completion(
        &agent,
        "w1",
        volume_job("w1", "batch", "v1", &dest, "echo hello > $0/hello.txt"),
    )
    .await;
    assert_eq!(
        std::fs::read_to_string(
            plugin_root(&agent)
                .join("hp/volumes")
                .join(&external)
                .join("hello.txt")
        )
        .expect("the file is in the plugin's volume"),
        "hello\n"
    );
    berth_testkit::assert_eventually!(Duration::from_secs(20), || async {
        client.volume("v1").await.is_ok_and(|v| v.claims.is_empty())
    });
    assert_eq!(volume_rpcs(&agent), VOLUME_RPCS, "CSI order");
    let ns_mounts = agent.namespace().mountinfo().expect("mountinfo");
    let csi_root = agent.data_dir.join("csi");
    assert!(
        !ns_mounts
            .iter()
            .any(|m| m.mount_point.starts_with(&csi_root)
                && m.mount_point != csi_root.join("monolith").join(PLUGIN)),
        "nothing left mounted but the shared root: {ns_mounts:#?}"
    );

    // Killed: restarted under its policy, deregistered, then registered again when ready.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(first_pid).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let a = wait_alloc(&agent, "plugin", |a| {
        count(a, EventKind::PluginRegistered) == 2
            && pid(a).is_some_and(|p| p != first_pid)
            && a.tasks["hostpath"].restarts == 1
    })
    .await;
    let kinds: Vec<EventKind> = a
        .events
        .iter()
        .filter(|e| e.task.as_deref() == Some("hostpath"))
        .map(|e| e.kind)
        .collect();
    let after_kill: Vec<EventKind> = kinds
        .iter()
        .copied()
        .skip_while(|k| *k != EventKind::Exited)
        .filter(|k| {
            matches!(
                k,
                EventKind::Exited
                    | EventKind::PluginDeregistered
                    | EventKind::Restarting
                    | EventKind::Started
                    | EventKind::PluginRegistered
            )
        })
        .collect();
    assert_eq!(
        after_kill,
        [
            EventKind::Exited,
            EventKind::PluginDeregistered,
            EventKind::Restarting,
            EventKind::Started,
            EventKind::PluginRegistered
        ],
        "{a:#?}"
    );
    assert_eq!(wait_task_instance_healthy(&agent).await, instance);

    // It serves volumes again.
    run_to_completion(
        &agent,
        "w2",
        volume_job("w2", "batch", "v1", &dest, "cat $0/hello.txt"),
    )
    .await;

    // Stopped: deregistered; the instance is gone from the registry.
    client.stop_job("plugin").await.expect("stop");
    let a = wait_alloc(&agent, "plugin", |a| a.client_status.is_terminal()).await;
    assert!(count(&a, EventKind::PluginDeregistered) >= 2, "{a:#?}");
    berth_testkit::assert_eventually!(Duration::from_secs(10), || async {
        client.plugin(PLUGIN).await.is_err()
    });
}

#[tokio::test]
async fn a_plugin_not_ready_within_its_health_timeout_is_restarted_with_an_event() {
    let agent = AgentProcess::start_in_namespace(&config()).await;
    let client = agent.client();
    // A "plugin" that never opens its socket.
    let text = plugin_job("300ms")
        .replace(
            &format!(
                "command = \"{}\"",
                berth_testkit::bin_path("berth-hostpath").display()
            ),
            "command = \"/bin/sleep\"",
        )
        .replace(
            "args    = [\"--statedir\", \"/local/csi/hp\", \"--nodeid\", \"n1\", \"--strict\", \"--call-log\", \"/local/csi/calls.log\"]",
            "args    = [\"3600\"]",
        )
        .replace("attempts = 5", "attempts = 1");
    assert!(text.contains("/bin/sleep") && text.contains("attempts = 1"));
    run_job(&client, text).await.expect("job run");
    let a = wait_alloc(&agent, "plugin", |a| a.client_status.is_terminal()).await;
    assert_eq!(a.client_status, ClientStatus::Failed, "{a:#?}");
    assert_eq!(count(&a, EventKind::PluginNotReady), 2, "{a:#?}");
    assert_eq!(count(&a, EventKind::Restarting), 1, "{a:#?}");
    assert_eq!(count(&a, EventKind::PluginRegistered), 0, "{a:#?}");
    let not_ready = a
        .events
        .iter()
        .find(|e| e.kind == EventKind::PluginNotReady)
        .unwrap();
    assert!(
        not_ready.message.contains("not ready within 300ms")
            && not_ready.message.contains("no socket"),
        "{}",
        not_ready.message
    );
    assert!(client.plugin(PLUGIN).await.is_err(), "never registered");
}

#[tokio::test]
async fn after_kill_9_the_plugin_task_and_its_volumes_are_kept_and_it_registers_again() {
    let mut agent = AgentProcess::start_in_namespace(&config()).await;
    let client = agent.client();
    let tmp = agent.tmp.path().to_path_buf();
    run_job(&client, plugin_job("20s"))
        .await
        .expect("plugin job");
    let instance = wait_task_instance_healthy(&agent).await;
    create_volume(&client, PLUGIN, "v1").await;
    let dest = tmp.join("server-data");
    run_job(
        &client,
        volume_job("srv", "service", "v1", &dest, "exec sleep 3600"),
    )
    .await
    .expect("service");
    let srv = wait_alloc(&agent, "srv", |a| {
        a.client_status == ClientStatus::Running && a.tasks["main"].pid.is_some()
    })
    .await;
    let plugin = wait_alloc(&agent, "plugin", |a| pid(a).is_some()).await;
    let calls_before = volume_rpcs(&agent).len();
    assert_eq!(calls_before, 3, "claimed once");

    agent.kill9();
    agent.respawn();
    agent.wait_ready().await;
    let client = agent.client();
    assert_eq!(wait_task_instance_healthy(&agent).await, instance);
    let plugin_after = wait_alloc(&agent, "plugin", |a| {
        a.client_status == ClientStatus::Running
            && count(a, EventKind::Recovered) >= 1
            && count(a, EventKind::PluginRegistered) == 2
    })
    .await;
    assert_eq!(
        pid(&plugin_after),
        pid(&plugin),
        "the plugin was not restarted"
    );
    let srv_after = wait_alloc(&agent, "srv", |a| a.client_status == ClientStatus::Running).await;
    assert_eq!(srv_after.tasks["main"].pid, srv.tasks["main"].pid);
    assert_eq!(volume_rpcs(&agent).len(), calls_before, "nothing remounted");
    assert_eq!(client.volume("v1").await.unwrap().claims.len(), 1);

    // The plugin stops: deregistered, and the volume it mounted for the service stays.
    client.stop_job("plugin").await.expect("stop plugin");
    wait_alloc(&agent, "plugin", |a| a.client_status.is_terminal()).await;
    berth_testkit::assert_eventually!(Duration::from_secs(10), || async {
        client.plugin(PLUGIN).await.is_err()
    });
    let per_alloc = agent
        .data_dir
        .join("csi/monolith")
        .join(PLUGIN)
        .join("per-alloc")
        .join(&srv.alloc_id);
    assert!(
        agent
            .namespace()
            .mountinfo()
            .expect("mountinfo")
            .iter()
            .any(|m| m.mount_point.starts_with(&per_alloc)),
        "the service's volume is still mounted"
    );
    // Its plugin gone, the volume's status still shows what the node holds, where.
    let status = client
        .volume("v1")
        .await
        .expect("status without its plugin");
    let published: Vec<_> = status
        .usages
        .iter()
        .flat_map(|u| &u.allocs)
        .filter(|a| a.alloc_id == srv.alloc_id && a.state == "published")
        .collect();
    assert_eq!(published.len(), 1, "{status:?}");
    assert!(published[0].target.starts_with(&per_alloc), "{status:?}");
    // A new plugin job takes over; the service's release goes through it, in CSI order.
    client.stop_job("plugin").await.ok();
    run_job(
        &client,
        plugin_job("20s").replace("job \"plugin\"", "job \"plugin2\""),
    )
    .await
    .expect("plugin job again");
    client.stop_job("srv").await.expect("stop srv");
    berth_testkit::assert_eventually!(Duration::from_secs(30), || async {
        client.volume("v1").await.is_ok_and(|v| v.claims.is_empty())
    });
    assert_eq!(volume_rpcs(&agent), VOLUME_RPCS, "released in CSI order");
    client.stop_job("plugin2").await.expect("stop plugin2");
}
