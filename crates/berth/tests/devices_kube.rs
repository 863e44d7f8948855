//! A Kubernetes device plugin, unchanged, with a real agent: it registers at the agent's
//! kubelet.sock, its devices show in `node status`, a job's exec task gets their env, mounts
//! and device nodes (it writes what it sees into its volume), health changes and crashes are
//! followed, and two allocs never share an instance.

mod agent_support;

use std::{path::Path, time::Duration};

use agent_support::{
    AgentProcess, client_config,
    devices::{KubePlugin, device_job, group, healthy, sleeper_job, wait_node},
    hostpath_config,
    jobs::{create_volume, run_job, wait_alloc},
};
use berth_api::{EventKind, EventLine, jobs::ClientStatus};

const WIDGET: &str = "example.com/widget/widget";

fn config() -> String {
    format!(
        "{}{}devices {{\n  kubelet_dir = \"@TMP@/dp\"\n  cdi_spec_dirs = [\"@TMP@/cdi\"]\n}}\n",
        hostpath_config("hostpath", &[]),
        client_config("")
    )
}

struct Setup {
    // Fields drop in order: the plugin (its state dir and socket are in the agent's temporary
    // dir) stops before the agent's dir is removed.
    plugin: KubePlugin,
    agent: AgentProcess,
    /// The volume's directory on the host (what the task wrote).
    out: std::path::PathBuf,
}

/// An agent with berth-hostpath and the widget plugin (`count` widgets over two NUMA nodes,
/// each with a copy of /dev/urandom at /dev/<id>), and a volume `out`.
async fn setup(count: usize, extra: &[&str]) -> Setup {
    let agent = AgentProcess::start_in_namespace(&config()).await;
    agent
        .wait_plugin("hostpath", Duration::from_secs(20), |p| p.health.healthy)
        .await;
    let tmp = agent.tmp.path().to_path_buf();
    let node = tmp.join("nodes/urandom");
    berth_testkit::mknod_char(&node, 1, 9);
    let count = count.to_string();
    let mut args = vec![
        "--count",
        count.as_str(),
        "--numa",
        "2",
        "--preferred",
        "--device-node",
        node.to_str().unwrap(),
        "--list-period",
        "100ms",
    ];
    args.extend_from_slice(extra);
    let plugin = KubePlugin::spawn(&tmp.join("dp"), &tmp.join("kstate"), &args);
    let external = create_volume(&agent.client(), "hostpath", "out").await;
    let out = tmp.join("hp/volumes").join(external);
    Setup { agent, plugin, out }
}

/// The task writes its widget env, the widgets mounted, and how many bytes it read from each
/// widget's device node, into `/data/<job>/`.
fn widget_script(job: &str) -> String {
    format!(
        "d=/data/{job}; mkdir -p $d; env | grep '^WIDGET' | sort > $d/env; ls /widgets > $d/mounts; \
         for id in $(echo $WIDGET_IDS | tr , ' '); do printf '%s ' $id; head -c 8 /dev/$id | wc -c; done > $d/nodes"
    )
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubernetes_plugin_registers_and_its_devices_reach_the_task() {
    let s = setup(3, &[]).await;
    let node = wait_node(&s.agent, "3 healthy widgets", |n| healthy(n, WIDGET) == 3).await;
    let g = group(&node, WIDGET).unwrap();
    assert_eq!(g.plugin.to_string(), "kubernetes:example.com/widget");
    assert_eq!(
        g.attributes["numa_nodes"].to_string(),
        "0,1",
        "NUMA topology is an attribute"
    );
    assert!(
        g.instances
            .iter()
            .all(|i| i.locality.as_ref().is_some_and(|l| l.numa_nodes.len() == 1)),
        "{g:?}"
    );
    let plugin = &node.devices.plugins[0];
    assert_eq!(plugin.state.as_str(), "ready");

    let job = device_job(
        "widgets",
        "batch",
        "out",
        "        device \"example.com/widget\" {\n          count = 2\n        }",
        &widget_script("widgets"),
    );
    run_job(&s.agent.client(), job).await.expect("job run");
    let alloc = wait_alloc(&s.agent, "widgets", |a| a.client_status.is_terminal()).await;
    assert_eq!(alloc.client_status, ClientStatus::Complete, "{alloc:#?}");

    // The two widgets the plugin preferred (one NUMA node: widget-0 and widget-2).
    let env = read(&s.out.join("widgets/env"));
    assert!(env.contains("WIDGET_IDS=widget-0,widget-2"), "{env}");
    assert!(env.contains("WIDGET_WIDGET_0=present"), "{env}");
    assert_eq!(read(&s.out.join("widgets/mounts")), "widget-0\nwidget-2\n");
    assert_eq!(
        read(&s.out.join("widgets/nodes")),
        "widget-0 8\nwidget-2 8\n"
    );
    let calls = s.plugin.calls();
    assert!(calls.contains("GetPreferredAllocation"), "{calls}");
    assert!(calls.contains("Allocate"), "{calls}");

    let task = &alloc.tasks["main"];
    assert_eq!(task.devices.len(), 1);
    assert_eq!(
        task.devices[0].devices,
        [
            "example.com/widget/widget/widget-0",
            "example.com/widget/widget/widget-2"
        ]
    );
    assert!(
        task.devices[0]
            .device_nodes
            .iter()
            .any(|d| d.ends_with("/dev/widget-0 (rw)")),
        "{:?}",
        task.devices[0]
    );
    // The alloc is done: its devices are free again.
    let node = wait_node(&s.agent, "widgets released", |n| {
        group(n, WIDGET).is_some_and(|g| g.instances.iter().all(|i| i.reserved_by.is_none()))
    })
    .await;
    assert_eq!(healthy(&node, WIDGET), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_allocs_never_share_a_device_and_too_many_is_refused_with_nothing_taken() {
    let s = setup(3, &[]).await;
    wait_node(&s.agent, "3 healthy widgets", |n| healthy(n, WIDGET) == 3).await;
    let client = s.agent.client();
    let sleeper = |id: &str| {
        sleeper_job(
            id,
            2,
            "        device \"widget\" {\n          count = 1\n        }",
        )
    };
    // Two allocs holding one widget each.
    let status = run_job(&client, sleeper("pair")).await.expect("job run");
    assert_eq!(status.allocs.len(), 2);
    let node = wait_node(&s.agent, "two widgets held", |n| {
        group(n, WIDGET).is_some_and(|g| {
            g.instances
                .iter()
                .filter(|i| i.reserved_by.is_some())
                .count()
                == 2
        })
    })
    .await;
    let holders: Vec<String> = group(&node, WIDGET)
        .unwrap()
        .instances
        .iter()
        .filter_map(|i| i.reserved_by.clone())
        .collect();
    assert_ne!(holders[0], holders[1], "one widget per alloc");

    // Two more allocs of one each: only one is free. Refused, with the reason, nothing taken.
    let err = run_job(&client, sleeper("more")).await.unwrap_err();
    let text = err.to_string();
    assert_eq!(err.status(), Some(400), "{text}");
    assert!(
        text.contains("group g (alloc 1 of 2), task main, device \"widget\": example.com/widget/widget: 0 healthy free instance(s) of 3, 1 needed"),
        "{text}"
    );
    assert!(text.contains("held by alloc pair-g-"), "{text}");
    let node = s.agent.client().node().await.unwrap();
    let held = group(&node, WIDGET)
        .unwrap()
        .instances
        .iter()
        .filter(|i| i.reserved_by.is_some())
        .count();
    assert_eq!(held, 2, "the refused job took nothing");
    assert!(client.job("more").await.is_err(), "nor was it stored");
    client.stop_job("pair").await.expect("stop");
    wait_node(&s.agent, "widgets released", |n| {
        group(n, WIDGET).is_some_and(|g| g.instances.iter().all(|i| i.reserved_by.is_none()))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_changes_and_crashes_are_followed_and_unhealthy_devices_never_given() {
    let mut s = setup(2, &[]).await;
    wait_node(&s.agent, "2 healthy widgets", |n| healthy(n, WIDGET) == 2).await;
    let mut events = s.agent.client().events().await.expect("events");

    s.plugin.fault("unhealthy");
    let node = wait_node(&s.agent, "unhealthy widgets", |n| {
        group(n, WIDGET).is_some_and(|g| g.instances.iter().all(|i| !i.healthy))
    })
    .await;
    assert!(
        group(&node, WIDGET).unwrap().instances[0]
            .health_description
            .contains("Unhealthy"),
        "{:?}",
        node.devices
    );
    let event = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match events.next().await.expect("stream").expect("an event") {
                EventLine::Event(e) if e.kind == EventKind::DeviceUnhealthy => return e,
                _ => {}
            }
        }
    })
    .await
    .expect("an unhealthy event");
    assert_eq!(event.plugin_id, "kubernetes:example.com/widget");
    assert!(event.device.is_some_and(|d| d.starts_with(WIDGET)));
    let job = device_job(
        "sick",
        "batch",
        "out",
        "        device \"example.com/widget\" {}",
        "true",
    );
    let err = run_job(&s.agent.client(), job.clone())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("widget-0 unhealthy"), "{err}");

    // Healthy again, then a crash: its devices are shown down, and back once it runs again.
    s.plugin.fault("");
    wait_node(&s.agent, "healthy again", |n| healthy(n, WIDGET) == 2).await;
    s.plugin.fault("crash");
    s.plugin.wait_exit().await;
    let node = wait_node(&s.agent, "the plugin down", |n| {
        n.devices.plugins.iter().any(|p| p.state.as_str() == "down")
    })
    .await;
    assert_eq!(healthy(&node, WIDGET), 0);
    s.plugin.fault("");
    s.plugin.restart();
    wait_node(&s.agent, "the widgets back", |n| healthy(n, WIDGET) == 2).await;
    let status = run_job(&s.agent.client(), job).await.expect("job run");
    assert_eq!(status.allocs.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_device_list_and_bad_device_blocks_are_refused_clearly() {
    let s = setup(2, &[]).await;
    wait_node(&s.agent, "2 healthy widgets", |n| healthy(n, WIDGET) == 2).await;
    let client = s.agent.client();

    // A device block naming a device this node does not have.
    let unknown = device_job(
        "fpga",
        "batch",
        "out",
        "        device \"xilinx/fpga\" {}",
        "true",
    );
    let err = run_job(&client, unknown).await.unwrap_err().to_string();
    assert!(
        err.contains(
            "device \"xilinx/fpga\": no such device on this node (it has example.com/widget/widget)"
        ),
        "{err}"
    );
    // Refused for its volume too: every reason at once.
    let both = device_job(
        "both",
        "batch",
        "nope",
        "        device \"xilinx/fpga\" {}",
        "true",
    );
    let err = run_job(&client, both).await.unwrap_err().to_string();
    assert!(err.contains("no volume \"nope\" is registered"), "{err}");
    assert!(
        err.contains("device \"xilinx/fpga\": no such device"),
        "{err}"
    );
    // A bad constraint: refused with its line and field before anything is placed.
    let bad = device_job(
        "bad",
        "batch",
        "out",
        "        device \"widget\" {\n          constraint {\n            attribute = \"${device.attr.numa_nodes}\"\n            operator  = \"≈\"\n            value     = \"0\"\n          }\n        }",
        "true",
    );
    let err = run_job(&client, bad).await.unwrap_err().to_string();
    assert!(err.contains("job.hcl:"), "{err}");
    assert!(
        err.contains("constraint[0].operator: unknown operator"),
        "{err}"
    );

    // An invalid entry from the plugin is reported and never given.
    s.plugin.fault("invalid");
    let node = wait_node(&s.agent, "the invalid entry reported", |n| {
        n.devices.plugins.iter().any(|p| !p.invalid.is_empty())
    })
    .await;
    let invalid = node.devices.plugins[0].invalid.join("\n");
    assert!(invalid.contains("empty"), "{invalid}");
    assert!(
        group(&node, WIDGET)
            .unwrap()
            .instances
            .iter()
            .all(|i| !i.id.is_empty())
    );
    let held = group(&node, WIDGET)
        .unwrap()
        .instances
        .iter()
        .filter(|i| i.reserved_by.is_some())
        .count();
    assert_eq!(held, 0, "nothing reserved");
    assert!(
        client.jobs().await.unwrap().jobs.is_empty(),
        "no job stored"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_is_called_once_and_pre_start_before_every_start() {
    let s = setup(2, &["--pre-start"]).await;
    wait_node(&s.agent, "2 healthy widgets", |n| healthy(n, WIDGET) == 2).await;
    // A task that fails at once: started four times (three restarts), then the alloc fails.
    let job = device_job(
        "flaky",
        "batch",
        "out",
        "        device \"example.com/widget\" {}",
        "echo $WIDGET_IDS >> /data/flaky-starts; exit 1",
    );
    run_job(&s.agent.client(), job).await.expect("job run");
    let alloc = wait_alloc(&s.agent, "flaky", |a| a.client_status.is_terminal()).await;
    assert_eq!(alloc.client_status, ClientStatus::Failed, "{alloc:#?}");
    assert_eq!(alloc.tasks["main"].restarts, 3);
    assert_eq!(
        read(&s.out.join("flaky-starts")),
        "widget-0\nwidget-0\nwidget-0\nwidget-0\n",
        "the same device at every start"
    );
    let calls = s.plugin.calls();
    let count = |method: &str| {
        calls
            .lines()
            .filter(|l| l.contains(&format!("\"{method}\"")))
            .count()
    };
    assert_eq!(count("Allocate"), 1, "{calls}");
    assert_eq!(count("PreStartContainer"), 4, "{calls}");
}
