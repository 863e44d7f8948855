//! The `devices` hook: a task's devices are reserved once, the answer persisted before its
//! first start and reused for every restart (after an agent restart too), pre-started before
//! every start, and released when the alloc ends.

mod common;

use std::{collections::BTreeMap, sync::Arc};

use berth_allocrunner::{
    AllocRunner, AllocStore, ClientStatus, DeviceCall, EventKind, FakeDeviceHost, StateAllocStore,
};
use berth_devices::{
    assignment::{AssignedSource, DeviceAssignment},
    model::{ContainerEdits, DeviceGroupId, DeviceMount, DeviceNode},
    plugin::PluginId,
};
use berth_state::Store;
use common::*;
use tokio_util::sync::CancellationToken;

/// A raw_exec task that appends `$GPU` to a file and fails, so it is restarted once.
fn failing_job(out: &std::path::Path) -> String {
    format!(
        r#"
job "gpu" {{
  group "g" {{
    restart {{
      attempts = 1
      interval = "1h"
      delay    = "20ms"
      mode     = "fail"
    }}
    task "train" {{
      driver = "raw_exec"
      config {{
        command = "/bin/sh"
        args    = ["-c", "echo \"$GPU $KEEP\" >> {}; exit 1"]
      }}
      env {{
        GPU  = "from-the-task"
        KEEP = "kept"
      }}
    }}
  }}
}}
"#,
        out.display()
    )
}

fn assignment() -> DeviceAssignment {
    DeviceAssignment {
        request: "nvidia/gpu".into(),
        source: AssignedSource::Plugin {
            plugin: PluginId::nomad("nvidia"),
            group: DeviceGroupId {
                vendor: "nvidia".into(),
                device_type: "gpu".into(),
                name: "k80".into(),
            },
        },
        ids: vec!["gpu-0".into()],
    }
}

fn edits() -> ContainerEdits {
    ContainerEdits {
        env: BTreeMap::from([("GPU".into(), "gpu-0".into())]),
        mounts: vec![DeviceMount {
            host_path: "/usr".into(),
            task_path: "/opt/gpu".into(),
            read_only: true,
        }],
        device_nodes: vec![DeviceNode {
            host_path: "/dev/null".into(),
            task_path: "/dev/gpu0".into(),
            permissions: "rw".into(),
        }],
        cdi_devices: Vec::new(),
    }
}

fn store_in(dir: &std::path::Path) -> Arc<dyn AllocStore> {
    Arc::new(StateAllocStore::new(Arc::new(
        Store::open(dir.join("state.redb")).expect("open store"),
    )))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_are_reserved_once_reused_at_every_start_and_released_at_the_end() {
    let node = Node::new();
    let reaper = Reaper::default();
    let out = node.path().join("env.txt");
    let host = Arc::new(FakeDeviceHost::default());
    host.set_edits("train", edits());
    let mut deps = node.deps();
    deps.devices = host.clone();
    let mut spec = alloc(&job(&failing_job(&out)), "gpu-0");
    spec.devices.insert("train".into(), vec![assignment()]);
    let runner = AllocRunner::new(spec, deps).expect("runner");
    reaper.watch(&runner);
    let status = finished(spawn_run(&runner, &CancellationToken::new()))
        .await
        .expect("run");
    assert_eq!(status, ClientStatus::Failed);

    // Both starts saw the device's env, which wins over the task's own, as in Nomad.
    assert_eq!(read(&out), "gpu-0 kept\ngpu-0 kept\n");
    let calls = host.calls();
    let reserves = calls
        .iter()
        .filter(|c| matches!(c, DeviceCall::Reserve { .. }))
        .count();
    let pre_starts = calls
        .iter()
        .filter(|c| matches!(c, DeviceCall::PreStart { .. }))
        .count();
    assert_eq!(reserves, 1, "{calls:?}");
    assert_eq!(pre_starts, 2, "{calls:?}");
    assert_eq!(
        calls.last(),
        Some(&DeviceCall::Release {
            alloc_id: "gpu-0".into()
        })
    );
    let record = runner.record();
    assert_eq!(record.tasks["train"].device_edits, Some(edits()));
    let status = runner.status();
    let task = &status.tasks["train"];
    assert_eq!(task.devices.len(), 1);
    assert_eq!(task.devices[0].devices, ["nvidia/gpu/k80/gpu-0"]);
    assert_eq!(task.devices[0].env, ["GPU"], "names only");
    assert_eq!(task.devices[0].device_nodes, ["/dev/null → /dev/gpu0 (rw)"]);
    let events = kinds(&status, Some("train"));
    assert!(
        in_order(&events, &[EventKind::DevicesReserved, EventKind::Started]),
        "{events:?}"
    );
    // raw_exec has no isolation: the task is told its mounts and nodes were not applied.
    let note = status
        .events_of(Some("train"))
        .find(|e| e.kind == EventKind::DeviceNote)
        .expect("a note");
    assert!(
        note.message.contains("environment only")
            && note.message.contains("1 mount(s) and 1 device node(s)"),
        "{}",
        note.message
    );
    assert!(kinds(&status, None).contains(&EventKind::DevicesReleased));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_that_fails_fails_the_start_and_nothing_runs() {
    let node = Node::new();
    let reaper = Reaper::default();
    let out = node.path().join("env.txt");
    let host = Arc::new(FakeDeviceHost::default());
    host.fail_reserve(
        "train",
        "device plugin nomad:nvidia is not available: it is down",
    );
    let mut deps = node.deps();
    deps.devices = host.clone();
    let mut spec = alloc(&job(&failing_job(&out)), "gpu-1");
    spec.devices.insert("train".into(), vec![assignment()]);
    let runner = AllocRunner::new(spec, deps).expect("runner");
    reaper.watch(&runner);
    let status = finished(spawn_run(&runner, &CancellationToken::new()))
        .await
        .expect("run");
    assert_eq!(status, ClientStatus::Failed);
    assert_eq!(read(&out), "", "the task never ran");
    let status = runner.status();
    let failed = status
        .events_of(Some("train"))
        .find(|e| e.kind == EventKind::DevicesFailed)
        .expect("a failure event");
    assert!(failed.message.contains("it is down"), "{}", failed.message);
    assert!(runner.record().tasks["train"].device_edits.is_none());
    assert!(host.calls().contains(&DeviceCall::Release {
        alloc_id: "gpu-1".into()
    }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_alloc_keeps_its_devices_and_reuses_the_persisted_answer() {
    let mut node = Node::with_store(store_in);
    let reaper = Reaper::default();
    let out = node.path().join("env.txt");
    let script = format!(
        r#"
job "gpu" {{
  group "g" {{
    restart {{
      attempts = 3
      interval = "1h"
      delay    = "20ms"
      mode     = "fail"
    }}
    task "train" {{
      driver = "raw_exec"
      config {{
        command = "/bin/sh"
        args    = ["-c", "echo \"$GPU\" >> {}; exec sleep 600"]
      }}
      kill_timeout = "2s"
    }}
  }}
}}
"#,
        out.display()
    );
    let first = Arc::new(FakeDeviceHost::default());
    first.set_edits("train", edits());
    let mut deps = node.deps();
    deps.devices = first.clone();
    let mut spec = alloc(&job(&script), "gpu-2");
    spec.devices.insert("train".into(), vec![assignment()]);
    let runner = AllocRunner::new(spec, deps).expect("runner");
    let cancel = CancellationToken::new();
    let run = spawn_run(&runner, &cancel);
    let pid = wait_running(&runner, "train", &reaper).await;
    wait_for_text(out.clone(), "gpu-0").await;
    cancel.cancel();
    let _ = finished(run).await;
    node.restart_drivers().await;

    // A new agent: its device host has no answer for the task (the plugin is gone), yet the
    // restarted task gets the same env from the persisted reservation.
    let second = Arc::new(FakeDeviceHost::default());
    second.fail_reserve("train", "no such plugin any more");
    let mut deps = node.deps();
    deps.devices = second.clone();
    let record = deps.store.get("gpu-2").expect("read").expect("record");
    let runner = AllocRunner::recover(record, deps).await.expect("recover");
    reaper.watch(&runner);
    assert_eq!(
        second.calls(),
        [DeviceCall::Restore {
            alloc_id: "gpu-2".into(),
            task: "train".into()
        }]
    );
    let cancel = CancellationToken::new();
    let run = spawn_run(&runner, &cancel);
    // Its process dies: the restart reuses the kept answer (no reserve).
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the task");
    wait_for_text(out.clone(), "gpu-0\ngpu-0\n").await;
    wait_running(&runner, "train", &reaper).await;
    assert!(
        !second
            .calls()
            .iter()
            .any(|c| matches!(c, DeviceCall::Reserve { .. })),
        "{:?}",
        second.calls()
    );
    runner.stop();
    assert_eq!(finished(run).await.expect("run"), ClientStatus::Complete);
    assert_eq!(
        second.calls().last(),
        Some(&DeviceCall::Release {
            alloc_id: "gpu-2".into()
        })
    );
}
