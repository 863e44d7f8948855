//! Alloc lifecycles with the real raw_exec driver: run, complete, restart, fail, stop.

mod common;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use berth_allocrunner::{AllocRunner, ClientStatus, EventKind, TaskRunState, VolumeCall};
use common::*;
use tokio_util::sync::CancellationToken;

/// Records, at each release, the state of every task of `runner`.
fn states_at_release(node: &Node, runner: &AllocRunner) -> Arc<Mutex<Vec<Vec<TaskRunState>>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    // A cycle (runner → host → observer → runner) that lives until the test ends.
    let runner = runner.clone();
    node.volumes.observe(move |call| {
        if matches!(call, VolumeCall::Release { .. }) {
            let states = runner.status().tasks.values().map(|t| t.state).collect();
            log.lock().unwrap().push(states);
        }
    });
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_exec_task_runs_with_state_events_and_logs_then_stops() {
    let node = Node::new();
    let reaper = Reaper::default();
    let job = job(r#"
job "web" {
  group "web" {
    task "server" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo task=$BERTH_TASK_NAME alloc=$BERTH_ALLOC_ID; exec sleep 600"]
      }
      kill_timeout = "5s"
    }
  }
}
"#);
    let runner = AllocRunner::new(alloc(&job, "web-0"), node.deps()).expect("runner");
    reaper.watch(&runner);
    let cancel = CancellationToken::new();
    let run = spawn_run(&runner, &cancel);

    let pid = wait_running(&runner, "server", &reaper).await;
    assert!(alive(pid));
    let status = runner.status();
    assert_eq!(status.client_status, ClientStatus::Running);
    let task = &status.tasks["server"];
    assert_eq!(task.state, TaskRunState::Running);
    assert_eq!(task.driver, "raw_exec");
    assert_eq!((task.restarts, task.failed), (0, false));
    assert_eq!(kinds(&status, Some("server")), [EventKind::Started]);
    assert_eq!(kinds(&status, None), [EventKind::Received]);

    // The handle was persisted.
    let stored = node.store.get("web-0").expect("get").expect("record");
    let handle = stored.tasks["server"].handle.as_ref().expect("handle");
    assert_eq!(handle.pid, pid);
    assert_eq!(handle.driver, "raw_exec");
    assert!(stored.hooks.prerun.contains("csi"));
    assert!(stored.tasks["server"].prestart_done.contains("task_dir"));

    let alloc_dir = runner.alloc_dir().to_path_buf();
    assert_eq!(alloc_dir, node.path().join("allocs/web-0"));
    assert!(alloc_dir.join("server").is_dir());
    wait_for_text(
        alloc_dir.join("logs/server.stdout"),
        "task=server alloc=web-0",
    )
    .await;

    runner.stop();
    assert_eq!(finished(run).await.expect("run"), ClientStatus::Complete);
    assert!(!alive(pid));
    let status = runner.status();
    assert_eq!(status.client_status, ClientStatus::Complete);
    let task = &status.tasks["server"];
    assert_eq!(task.state, TaskRunState::Dead);
    assert_eq!(task.pid, None);
    assert!(!task.failed);
    assert_eq!(task.last_exit.and_then(|e| e.signal), Some(15));
    assert!(
        in_order(
            &kinds(&status, Some("server")),
            &[
                EventKind::Started,
                EventKind::Killing,
                EventKind::Signaled,
                EventKind::Exited,
                EventKind::Destroyed,
            ]
        ),
        "{:#?}",
        status.events
    );
    assert_eq!(
        kinds(&status, None),
        [
            EventKind::Received,
            EventKind::AllocStopping,
            EventKind::AllocComplete
        ]
    );
    let stored = node.store.get("web-0").expect("get").expect("record");
    assert!(stored.is_finished());
    assert_eq!(stored.client_status, ClientStatus::Complete);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_task_exits_zero_alloc_completes_and_volume_is_released_after_it() {
    let node = Node::new();
    let reaper = Reaper::default();
    let job = job(r#"
job "batch" {
  type = "batch"
  group "g" {
    volume "data" {
      type        = "csi"
      source      = "vol-a"
      access_mode = "single-node-writer"
    }
    task "once" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo done"]
      }
    }
  }
}
"#);
    let runner = AllocRunner::new(alloc(&job, "batch-0"), node.deps()).expect("runner");
    reaper.watch(&runner);
    let seen = states_at_release(&node, &runner);

    let status = runner.run(CancellationToken::new()).await.expect("run");
    assert_eq!(status, ClientStatus::Complete);

    let calls = node.volumes.calls();
    assert_eq!(calls.len(), 2, "{calls:#?}");
    assert!(
        matches!(&calls[0], VolumeCall::Claim { volume_id, alloc_id, usage }
        if volume_id == "vol-a" && alloc_id == "batch-0" && !usage.read_only)
    );
    assert!(matches!(&calls[1], VolumeCall::Release { volume_id, .. } if volume_id == "vol-a"));
    assert_eq!(*seen.lock().unwrap(), [vec![TaskRunState::Dead]]);
    assert!(node.volumes.held().is_empty());

    let status = runner.status();
    let task = &status.tasks["once"];
    assert_eq!(task.state, TaskRunState::Dead);
    assert_eq!(task.last_exit.and_then(|e| e.exit_code), Some(0));
    assert_eq!((task.restarts, task.failed), (0, false));
    assert!(!status.volumes["data"].claimed);
    assert_eq!(status.volumes["data"].target, None);
    let all: Vec<EventKind> = status.events.iter().map(|e| e.kind).collect();
    assert!(
        in_order(
            &all,
            &[
                EventKind::Received,
                EventKind::VolumeClaimed,
                EventKind::Started,
                EventKind::Exited,
                EventKind::VolumeReleased,
                EventKind::AllocComplete,
            ]
        ),
        "{:#?}",
        status.events
    );
    assert_eq!(
        status.events.last().map(|e| e.kind),
        Some(EventKind::AllocComplete)
    );
    assert_eq!(read(runner.alloc_dir().join("logs/once.stdout")), "done\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_task_is_restarted_attempts_times_then_fails_and_its_sibling_is_stopped() {
    let node = Node::new();
    let reaper = Reaper::default();
    let job = job(r#"
job "flaky" {
  group "g" {
    volume "data" {
      type        = "csi"
      source      = "vol-f"
      access_mode = "single-node-writer"
    }
    restart {
      attempts = 2
      interval = "1h"
      delay    = "50ms"
      mode     = "fail"
    }
    task "flaky" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo run >> ../flaky-runs; exit 3"]
      }
    }
    task "sidecar" {
      driver = "raw_exec"
      config {
        command = "/bin/sleep"
        args    = ["600"]
      }
      kill_timeout = "2s"
    }
  }
}
"#);
    let runner = AllocRunner::new(alloc(&job, "flaky-0"), node.deps()).expect("runner");
    reaper.watch(&runner);
    let seen = states_at_release(&node, &runner);

    let status = runner.run(CancellationToken::new()).await.expect("run");
    assert_eq!(status, ClientStatus::Failed);

    let status = runner.status();
    let flaky = &status.tasks["flaky"];
    assert_eq!(flaky.restarts, 2);
    assert!(flaky.failed);
    assert_eq!(flaky.state, TaskRunState::Dead);
    assert_eq!(flaky.last_exit.and_then(|e| e.exit_code), Some(3));
    assert_eq!(
        read(runner.alloc_dir().join("flaky-runs")).lines().count(),
        3,
        "started three times"
    );
    use EventKind::*;
    assert_eq!(
        kinds(&status, Some("flaky")),
        [
            Started,
            Exited,
            Restarting,
            Started,
            Exited,
            Restarting,
            Started,
            Exited,
            NotRestarting,
            Destroyed
        ]
    );
    let restarting: Vec<&str> = status
        .events_of(Some("flaky"))
        .filter(|e| e.kind == Restarting)
        .map(|e| e.message.as_str())
        .collect();
    assert_eq!(
        restarting,
        [
            "restart 1 in 50ms (attempt 1 of 2 within 1h)",
            "restart 2 in 50ms (attempt 2 of 2 within 1h)"
        ]
    );
    let exited: Vec<&str> = status
        .events_of(Some("flaky"))
        .filter(|e| e.kind == Exited)
        .map(|e| e.message.as_str())
        .collect();
    assert_eq!(exited, ["exited with code 3"; 3]);

    // The sibling was stopped, not failed.
    let sidecar = &status.tasks["sidecar"];
    assert_eq!(sidecar.state, TaskRunState::Dead);
    assert!(!sidecar.failed);
    assert!(in_order(
        &kinds(&status, Some("sidecar")),
        &[Started, Killing, Exited]
    ));
    assert!(
        in_order(&kinds(&status, None), &[AllocStopping, AllocFailed]),
        "{:#?}",
        status.events
    );
    let failed = status
        .events_of(None)
        .find(|e| e.kind == AllocFailed)
        .expect("alloc failed event");
    assert_eq!(failed.message, "task flaky failed");
    // Released once both tasks were dead.
    assert_eq!(
        *seen.lock().unwrap(),
        [vec![TaskRunState::Dead, TaskRunState::Dead]]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_sends_sigterm_then_sigkill_after_kill_timeout_then_releases_volumes() {
    let node = Node::new();
    let reaper = Reaper::default();
    let job = job(r#"
job "stubborn" {
  group "g" {
    volume "data" {
      type        = "csi"
      source      = "vol-s"
      access_mode = "single-node-writer"
    }
    task "stubborn" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "trap 'echo got-term' TERM; echo ready; while true; do sleep 0.05; done"]
      }
      kill_timeout = "500ms"
    }
  }
}
"#);
    let runner = AllocRunner::new(alloc(&job, "stubborn-0"), node.deps()).expect("runner");
    reaper.watch(&runner);
    let seen = states_at_release(&node, &runner);
    let run = spawn_run(&runner, &CancellationToken::new());
    let pid = wait_running(&runner, "stubborn", &reaper).await;
    let stdout = runner.alloc_dir().join("logs/stubborn.stdout");
    wait_for_text(stdout.clone(), "ready").await;

    let asked = tokio::time::Instant::now();
    runner.stop();
    assert_eq!(finished(run).await.expect("run"), ClientStatus::Complete);
    assert!(
        asked.elapsed() >= Duration::from_millis(500),
        "SIGKILL came before kill_timeout"
    );
    assert!(!alive(pid));
    assert!(read(&stdout).contains("got-term"), "{}", read(&stdout));

    let status = runner.status();
    let task = &status.tasks["stubborn"];
    assert_eq!(task.last_exit.and_then(|e| e.signal), Some(9));
    use EventKind::*;
    assert!(
        in_order(
            &kinds(&status, Some("stubborn")),
            &[Started, Killing, Signaled, Killed, Exited, Destroyed]
        ),
        "{:#?}",
        status.events
    );
    let killing = status
        .events_of(Some("stubborn"))
        .find(|e| e.kind == Killing)
        .expect("killing");
    assert_eq!(
        killing.message,
        "stopping: SIGTERM, then SIGKILL after 500ms"
    );
    let exited = status
        .events_of(Some("stubborn"))
        .find(|e| e.kind == Exited)
        .expect("exited");
    assert_eq!(exited.message, "killed by SIGKILL");
    // Then the volume was released, with the task dead.
    let calls = node.volumes.calls();
    assert!(calls[1..].iter().all(|c| !c.is_claim()));
    assert!(matches!(calls.last(), Some(VolumeCall::Release { .. })));
    assert_eq!(*seen.lock().unwrap(), [vec![TaskRunState::Dead]]);
    let all: Vec<EventKind> = status.events.iter().map(|e| e.kind).collect();
    assert!(in_order(
        &all,
        &[Killed, Exited, VolumeReleased, AllocComplete]
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_is_called_once_and_a_stopped_alloc_that_never_ran_starts_nothing() {
    let node = Node::new();
    let reaper = Reaper::default();
    let job = job(r#"
job "never" {
  group "g" {
    volume "data" {
      type        = "csi"
      source      = "vol-n"
      access_mode = "single-node-writer"
    }
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/sleep"
        args    = ["600"]
      }
    }
  }
}
"#);
    let runner = AllocRunner::new(alloc(&job, "never-0"), node.deps()).expect("runner");
    reaper.watch(&runner);
    runner.stop();
    runner.stop();
    assert_eq!(
        runner.run(CancellationToken::new()).await.expect("run"),
        ClientStatus::Complete
    );
    assert!(node.volumes.calls().is_empty());
    let status = runner.status();
    assert_eq!(status.tasks["t"].state, TaskRunState::Dead);
    assert_eq!(status.tasks["t"].started_at, None);
    assert_eq!(
        status
            .events_of(None)
            .filter(|e| e.kind == EventKind::AllocStopping)
            .count(),
        1
    );
    let again = runner.run(CancellationToken::new()).await.unwrap_err();
    assert!(again.to_string().contains("already running"), "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drivers_from_a_plain_map_run_tasks_without_driver_events() {
    use std::collections::BTreeMap;

    use berth_drivers::{Driver, EventSink, RawExecDriver};

    let node = Node::new();
    let reaper = Reaper::default();
    let raw: Arc<dyn Driver> = Arc::new(RawExecDriver::new(EventSink::discard(), process_config()));
    let map: BTreeMap<String, Arc<dyn Driver>> = BTreeMap::from([("raw_exec".to_owned(), raw)]);
    let mut deps = node.deps();
    deps.drivers = Arc::new(map);
    let job = job(r#"
job "map" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/sleep"
        args    = ["600"]
      }
    }
    task "nodriver" {
      driver = "exec"
      config {
        command = "/bin/true"
      }
    }
  }
}
"#);
    let runner = AllocRunner::new(alloc(&job, "map-0"), deps).expect("runner");
    reaper.watch(&runner);
    // A task whose driver the node lacks fails at once; its sibling is stopped.
    assert_eq!(
        runner.run(CancellationToken::new()).await.expect("run"),
        ClientStatus::Failed
    );
    let status = runner.status();
    let failed = status
        .events_of(Some("nodriver"))
        .find(|e| e.kind == EventKind::StartFailed)
        .expect("start failed");
    assert_eq!(failed.message, "no task driver \"exec\" on this node");
    assert!(status.tasks["nodriver"].failed);
    let t = kinds(&status, Some("t"));
    assert!(!t.contains(&EventKind::Signaled), "{t:?}");
    assert!(
        in_order(&t, &[EventKind::Killing, EventKind::Exited]) || !t.contains(&EventKind::Started)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_all_writes_every_record_at_once_or_none_when_one_spec_is_bad() {
    let node = Node::with_store(|dir| {
        let store = berth_state::Store::open(dir.join("state.redb")).expect("store");
        Arc::new(berth_allocrunner::StateAllocStore::new(Arc::new(store)))
    });
    let job = job(r#"
job "many" {
  group "g" {
    count = 3
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/true"
      }
    }
  }
}
"#);
    let spec = |id: &str, index: u32| {
        berth_allocrunner::AllocSpec::from_job(&job, "g", id, index).expect("alloc spec")
    };
    // One bad spec (an alloc id that would become a path outside the allocs dir): nothing is
    // written, not even the good ones before it.
    let e = AllocRunner::new_all(
        vec![spec("many-0", 0), spec("../many-1", 1), spec("many-2", 2)],
        node.deps(),
    )
    .expect_err("a bad alloc id");
    assert!(e.to_string().contains("alloc id"), "{e}");
    assert!(node.store.list().expect("list").is_empty());

    let runners = AllocRunner::new_all(
        vec![spec("many-0", 0), spec("many-1", 1), spec("many-2", 2)],
        node.deps(),
    )
    .expect("runners");
    let ids: Vec<&str> = runners.iter().map(|r| r.alloc_id()).collect();
    assert_eq!(ids, ["many-0", "many-1", "many-2"]);
    let stored: Vec<(String, u32)> = node
        .store
        .list()
        .expect("list")
        .into_iter()
        .map(|r| (r.alloc_id, r.index))
        .collect();
    assert_eq!(
        stored,
        [
            ("many-0".to_string(), 0),
            ("many-1".to_string(), 1),
            ("many-2".to_string(), 2)
        ]
    );
    for r in &runners {
        assert_eq!(kinds(&r.status(), None), [EventKind::Received]);
    }
}

/// raw_exec, except that the first `refusals` stops and destroys do nothing and fail as a
/// process that survives SIGKILL makes them fail.
#[derive(Debug)]
struct Unkillable {
    inner: berth_drivers::RawExecDriver,
    refusals: std::sync::atomic::AtomicU32,
}

impl Unkillable {
    fn refuse(&self, task_id: &berth_drivers::TaskId) -> Option<berth_drivers::DriverError> {
        use std::sync::atomic::Ordering;
        let left = self.refusals.load(Ordering::SeqCst);
        if left == 0 {
            return None;
        }
        self.refusals.store(left - 1, Ordering::SeqCst);
        Some(berth_drivers::DriverError::KillTimeout {
            task_id: task_id.clone(),
            pid: berth_drivers::Driver::inspect(&self.inner, task_id).map_or(0, |s| s.pid),
            waited: Duration::from_millis(1),
        })
    }
}

impl berth_drivers::Driver for Unkillable {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn capabilities(&self) -> berth_drivers::Capabilities {
        self.inner.capabilities()
    }
    fn fingerprint(&self) -> berth_drivers::DriverFuture<'_, berth_drivers::Fingerprint> {
        self.inner.fingerprint()
    }
    fn start(
        &self,
        config: berth_drivers::TaskConfig,
    ) -> berth_drivers::DriverFuture<
        '_,
        Result<berth_drivers::TaskHandle, berth_drivers::DriverError>,
    > {
        self.inner.start(config)
    }
    fn wait<'a>(
        &'a self,
        task_id: &'a berth_drivers::TaskId,
    ) -> berth_drivers::DriverFuture<
        'a,
        Result<berth_drivers::ExitResult, berth_drivers::DriverError>,
    > {
        self.inner.wait(task_id)
    }
    fn stop<'a>(
        &'a self,
        task_id: &'a berth_drivers::TaskId,
        timeout: Duration,
        signal: berth_drivers::Signal,
    ) -> berth_drivers::DriverFuture<'a, Result<(), berth_drivers::DriverError>> {
        match self.refuse(task_id) {
            Some(e) => Box::pin(async move { Err(e) }),
            None => self.inner.stop(task_id, timeout, signal),
        }
    }
    fn destroy<'a>(
        &'a self,
        task_id: &'a berth_drivers::TaskId,
    ) -> berth_drivers::DriverFuture<'a, Result<(), berth_drivers::DriverError>> {
        match self.refuse(task_id) {
            Some(e) => Box::pin(async move { Err(e) }),
            None => self.inner.destroy(task_id),
        }
    }
    fn inspect(
        &self,
        task_id: &berth_drivers::TaskId,
    ) -> Result<berth_drivers::TaskStatus, berth_drivers::DriverError> {
        self.inner.inspect(task_id)
    }
    fn signal(
        &self,
        task_id: &berth_drivers::TaskId,
        signal: berth_drivers::Signal,
    ) -> Result<(), berth_drivers::DriverError> {
        self.inner.signal(task_id, signal)
    }
    fn stats<'a>(
        &'a self,
        task_id: &'a berth_drivers::TaskId,
    ) -> berth_drivers::DriverFuture<'a, Result<berth_drivers::TaskStats, berth_drivers::DriverError>>
    {
        self.inner.stats(task_id)
    }
    fn recover(
        &self,
        handle: berth_drivers::TaskHandle,
    ) -> berth_drivers::DriverFuture<'_, Result<(), berth_drivers::DriverError>> {
        self.inner.recover(handle)
    }
    fn shutdown(&self) -> berth_drivers::DriverFuture<'_, ()> {
        self.inner.shutdown()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_survives_sigkill_keeps_its_volumes_until_it_dies() {
    let node = Node::new();
    let reaper = Reaper::default();
    let cancel = CancellationToken::new();
    let mut builder =
        berth_drivers::DriverManager::builder(berth_drivers::ManagerConfig::default(), &cancel);
    let sink = builder.event_sink();
    builder
        .add(Arc::new(Unkillable {
            inner: berth_drivers::RawExecDriver::new(sink, process_config()),
            refusals: std::sync::atomic::AtomicU32::new(4),
        }))
        .expect("add the driver");
    let mut deps = node.deps();
    deps.drivers = Arc::new(builder.start());
    let job = job(r#"
job "stuck" {
  group "g" {
    volume "data" {
      type        = "csi"
      source      = "vol-stuck"
      access_mode = "single-node-writer"
    }
    task "stuck" {
      driver = "raw_exec"
      config {
        command = "/bin/sleep"
        args    = ["600"]
      }
      kill_timeout = "100ms"
    }
  }
}
"#);
    let runner = AllocRunner::new(alloc(&job, "stuck-0"), deps).expect("runner");
    reaper.watch(&runner);
    // At each release: whether the task's process was still alive.
    let alive_at_release = Arc::new(Mutex::new(Vec::new()));
    let pid_cell = Arc::new(Mutex::new(None::<u32>));
    {
        let (log, pid_cell) = (alive_at_release.clone(), pid_cell.clone());
        node.volumes.observe(move |call| {
            if matches!(call, VolumeCall::Release { .. }) {
                let pid = *pid_cell.lock().unwrap();
                log.lock().unwrap().push(pid.is_some_and(alive));
            }
        });
    }
    let run = spawn_run(&runner, &cancel);
    let pid = wait_running(&runner, "stuck", &reaper).await;
    *pid_cell.lock().unwrap() = Some(pid);

    runner.stop();
    assert_eq!(finished(run).await.expect("run"), ClientStatus::Complete);
    assert!(!alive(pid));
    // Released once, after the process died.
    assert_eq!(*alive_at_release.lock().unwrap(), [false]);
    let status = runner.status();
    let failed: Vec<&str> = status
        .events_of(Some("stuck"))
        .filter(|e| e.kind == EventKind::StopFailed)
        .map(|e| e.message.as_str())
        .collect();
    // The stop and three SIGKILLs failed; the fourth SIGKILL worked.
    assert_eq!(failed.len(), 4, "{failed:#?}");
    assert!(
        failed[1..]
            .iter()
            .all(|m| m.contains("its volumes stay mounted while it lives")),
        "{failed:#?}"
    );
    let all: Vec<EventKind> = status.events.iter().map(|e| e.kind).collect();
    use EventKind::*;
    assert!(
        in_order(
            &all,
            &[
                StopFailed,
                StopFailed,
                Exited,
                VolumeReleased,
                AllocComplete
            ]
        ),
        "{:#?}",
        status.events
    );
    cancel.cancel();
}
