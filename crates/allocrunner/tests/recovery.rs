//! Recovery after an agent restart: running tasks are re-attached, not restarted; claims are
//! not sent again; a task whose process vanished waits for the servers-contacted gate.

mod common;

use std::sync::Arc;

use berth_allocrunner::{
    AllocError, AllocRunner, AllocStore, ClientStatus, EventKind, MemoryAllocStore,
    StateAllocStore, TaskRunState,
};
use berth_state::Store;
use common::*;
use nix::{
    sys::signal::{Signal, killpg},
    unistd::Pid,
};
use tokio_util::sync::CancellationToken;

const LONG_RUNNING: &str = r#"
job "svc" {
  group "g" {
    volume "data" {
      type        = "csi"
      source      = "vol-svc"
      access_mode = "single-node-writer"
    }
    restart {
      attempts = 2
      interval = "1h"
      delay    = "20ms"
      mode     = "fail"
    }
    task "server" {
      driver = "raw_exec"
      config {
        command = "/bin/sleep"
        args    = ["600"]
      }
      kill_timeout = "2s"
    }
  }
}
"#;

fn store_in(dir: &std::path::Path) -> Arc<dyn AllocStore> {
    Arc::new(StateAllocStore::new(Arc::new(
        Store::open(dir.join("state.redb")).expect("open store"),
    )))
}

/// Starts the alloc, waits for its task, then "stops the agent": cancels the run and shuts
/// the drivers down. Returns the task's pid.
async fn start_then_stop_agent(node: &mut Node, reaper: &Reaper) -> u32 {
    // Not watched by the reaper (which would keep the store open): its pid is tracked.
    let runner = AllocRunner::new(alloc(&job(LONG_RUNNING), "svc-0"), node.deps()).expect("runner");
    let cancel = CancellationToken::new();
    let run = spawn_run(&runner, &cancel);
    let pid = wait_running(&runner, "server", reaper).await;
    assert_eq!(node.volumes.claim_count(), 1);
    cancel.cancel();
    assert!(matches!(
        finished(run).await,
        Err(AllocError::Cancelled { .. })
    ));
    node.restart_drivers().await;
    // Nothing was stopped or released.
    assert!(alive(pid));
    assert_eq!(node.volumes.calls().len(), 1);
    assert_eq!(node.volumes.held().len(), 1);
    pid
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovered_alloc_reattaches_the_same_process_claims_nothing_and_stops() {
    let mut node = Node::with_store(store_in);
    let reaper = Reaper::default();
    let pid = start_then_stop_agent(&mut node, &reaper).await;

    // A new agent: the store is closed (the old runner is gone), opened again, and the
    // record read back from it.
    node.store = Arc::new(MemoryAllocStore::new());
    node.store = store_in(node.path());
    let record = node.store.get("svc-0").expect("get").expect("record");
    assert_eq!(record.tasks["server"].state, TaskRunState::Running);
    let runner = AllocRunner::recover(record, node.deps())
        .await
        .expect("recover");
    reaper.watch(&runner);
    let status = runner.status();
    assert_eq!(status.tasks["server"].pid, Some(pid));
    assert_eq!(status.tasks["server"].state, TaskRunState::Running);
    let recovered = status
        .events_of(Some("server"))
        .find(|e| e.kind == EventKind::Recovered)
        .expect("recovered event");
    assert_eq!(recovered.message, format!("re-attached to pid {pid}"));
    assert!(status.volumes["data"].claimed);

    let run = spawn_run(&runner, &CancellationToken::new());
    // Still the same process, and no new claim.
    let status = wait_status(&runner, "running", |s| {
        s.client_status == ClientStatus::Running
    })
    .await;
    assert_eq!(status.tasks["server"].pid, Some(pid));
    assert_eq!(status.tasks["server"].restarts, 0);
    assert!(alive(pid));
    assert_eq!(node.volumes.claim_count(), 1);
    assert_eq!(
        kinds(&status, Some("server"))
            .iter()
            .filter(|k| **k == EventKind::Started)
            .count(),
        1
    );

    runner.stop();
    assert_eq!(finished(run).await.expect("run"), ClientStatus::Complete);
    wait_dead(pid).await;
    let calls = node.volumes.calls();
    assert_eq!(calls.len(), 2);
    assert!(!calls[1].is_claim());
    assert!(node.volumes.held().is_empty());
    let status = runner.status();
    assert_eq!(status.tasks["server"].state, TaskRunState::Dead);
    assert!(in_order(
        &kinds(&status, Some("server")),
        &[
            EventKind::Started,
            EventKind::Recovered,
            EventKind::Killing,
            EventKind::Exited,
            EventKind::Destroyed
        ]
    ));
    let stored = node.store.get("svc-0").expect("get").expect("record");
    assert!(stored.is_finished());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_lost_while_the_agent_was_down_restarts_only_after_the_gate_opens() {
    let mut node = Node::new();
    let reaper = Reaper::default();
    let old_pid = start_then_stop_agent(&mut node, &reaper).await;

    // The process dies while no agent watches it.
    killpg(Pid::from_raw(old_pid as i32), Signal::SIGKILL).expect("kill");
    wait_dead(old_pid).await;

    node.gate.send_replace(false);
    let record = node.store.get("svc-0").expect("get").expect("record");
    let runner = AllocRunner::recover(record, node.deps())
        .await
        .expect("recover");
    reaper.watch(&runner);
    let status = runner.status();
    let task = &status.tasks["server"];
    assert_eq!(
        (task.state, task.pid, task.lost),
        (TaskRunState::Pending, None, true)
    );
    let failed = status
        .events_of(Some("server"))
        .find(|e| e.kind == EventKind::RecoverFailed)
        .expect("recover failed event");
    assert!(
        failed
            .message
            .starts_with(&format!("cannot re-attach to pid {old_pid}: ")),
        "{}",
        failed.message
    );

    let run = spawn_run(&runner, &CancellationToken::new());
    // The runner reached the gate and waits there: nothing was started.
    let status = wait_status(&runner, "waiting for the servers", |s| {
        kinds(s, Some("server")).contains(&EventKind::WaitingForServers)
    })
    .await;
    let task = &status.tasks["server"];
    assert_eq!(
        (task.state, task.pid, task.restarts),
        (TaskRunState::Pending, None, 0)
    );
    assert_eq!(
        kinds(&status, Some("server")).last(),
        Some(&EventKind::WaitingForServers)
    );
    assert_eq!(node.volumes.claim_count(), 1);

    node.gate.send_replace(true);
    let new_pid = wait_running(&runner, "server", &reaper).await;
    assert_ne!(new_pid, old_pid);
    let status = runner.status();
    let task = &status.tasks["server"];
    assert_eq!((task.restarts, task.lost, task.failed), (1, false, false));
    assert!(in_order(
        &kinds(&status, Some("server")),
        &[
            EventKind::RecoverFailed,
            EventKind::WaitingForServers,
            EventKind::Exited,
            EventKind::Restarting,
            EventKind::Started
        ]
    ));
    assert_eq!(node.volumes.claim_count(), 1);

    runner.stop();
    assert_eq!(finished(run).await.expect("run"), ClientStatus::Complete);
    wait_dead(new_pid).await;
    assert!(node.volumes.held().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_persisted_before_the_restart_goes_on_after_recovery() {
    let mut node = Node::new();
    let reaper = Reaper::default();
    let pid = start_then_stop_agent(&mut node, &reaper).await;
    // The stop was asked for while no runner ran it (e.g. just before the agent stopped).
    let mut record = node.store.get("svc-0").expect("get").expect("record");
    record.desired = berth_allocrunner::DesiredState::Stop;
    node.store.put(&record).expect("put");

    let record = node.store.get("svc-0").expect("get").expect("record");
    let runner = AllocRunner::recover(record, node.deps())
        .await
        .expect("recover");
    reaper.watch(&runner);
    assert_eq!(
        runner.run(CancellationToken::new()).await.expect("run"),
        ClientStatus::Complete
    );
    wait_dead(pid).await;
    assert!(node.volumes.held().is_empty());
    assert_eq!(node.volumes.claim_count(), 1);

    // A finished alloc recovers as finished and runs nothing.
    let record = node.store.get("svc-0").expect("get").expect("record");
    let calls = node.volumes.calls().len();
    let runner = AllocRunner::recover(record, node.deps())
        .await
        .expect("recover");
    assert_eq!(
        runner.run(CancellationToken::new()).await.expect("run"),
        ClientStatus::Complete
    );
    assert_eq!(node.volumes.calls().len(), calls);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_another_version_or_damaged_are_refused() {
    let node = Node::new();
    let runner = AllocRunner::new(alloc(&job(LONG_RUNNING), "v-0"), node.deps()).expect("runner");
    let mut record = runner.record();
    record.version = 99;
    let err = AllocRunner::recover(record, node.deps()).await.unwrap_err();
    assert!(
        matches!(err, AllocError::RecordVersion { found: 99, .. }),
        "{err}"
    );
    let mut record = runner.record();
    record.tasks.clear();
    let err = AllocRunner::recover(record, node.deps()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "alloc v-0: damaged record: task server has no state"
    );
    let mut record = runner.record();
    record.alloc_id = "../x".into();
    assert!(matches!(
        AllocRunner::recover(record, node.deps()).await.unwrap_err(),
        AllocError::InvalidId(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_started_but_not_recorded_is_killed_before_the_task_runs_again() {
    let node = Node::new();
    let reaper = Reaper::default();
    // The agent died between starting the process and writing its handle: the record says
    // starting, with no handle, and the process runs (with the env every task gets).
    let runner =
        AllocRunner::new(alloc(&job(LONG_RUNNING), "orphan-0"), node.deps()).expect("runner");
    drop(runner);
    let mut record = node.store.get("orphan-0").expect("get").expect("record");
    record.tasks.get_mut("server").expect("task").state = TaskRunState::Starting;
    node.store.put(&record).expect("put");
    let orphan = ChildGuard(
        std::process::Command::new("/bin/sleep")
            .arg("600")
            .env("BERTH_ALLOC_ID", "orphan-0")
            .env("BERTH_TASK_NAME", "server")
            .spawn()
            .expect("spawn the orphan"),
    );
    let orphan_pid = orphan.0.id();

    let runner = AllocRunner::recover(record, node.deps())
        .await
        .expect("recover");
    reaper.watch(&runner);
    // Killed by the time recover returns (a zombie until the guard reaps it counts as dead).
    assert!(!alive(orphan_pid));
    let lost = runner
        .status()
        .events_of(Some("server"))
        .find(|e| e.kind == EventKind::RecoverFailed)
        .map(|e| e.message.clone())
        .expect("a recover-failed event");
    assert_eq!(
        lost,
        format!(
            "the agent stopped while the task was starting; killed its unrecorded process(es) {orphan_pid}"
        )
    );
    // Then the task runs again, once.
    let run = spawn_run(&runner, &CancellationToken::new());
    let pid = wait_running(&runner, "server", &reaper).await;
    assert_ne!(pid, orphan_pid);
    runner.stop();
    assert_eq!(finished(run).await.expect("run"), ClientStatus::Complete);
}

/// Kills and reaps a child process when dropped, also when a test fails.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
