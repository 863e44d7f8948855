//! Added task hooks (the extension point for the CSI plugin supervisor), the upstream alloc
//! watcher, and what happens when a task's handle cannot be persisted.

mod common;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use berth_allocrunner::{
    AllocContext, AllocHook, AllocRecord, AllocRunner, AllocSpec, AllocStore, AllocStoreError,
    BoxFuture, ClientStatus, EventKind, HookError, MemoryAllocStore, TaskContext, TaskHook,
    UpstreamError, UpstreamWatcher,
};
use berth_drivers::{ExitResult, TaskConfig, TaskHandle};
use common::*;
use tokio_util::sync::CancellationToken;

/// Records what it is called for; its prestart adds `HOOKED=<name>` to the environment, or
/// fails when told to.
#[derive(Debug)]
struct Recorder {
    name: String,
    calls: Arc<Mutex<Vec<String>>>,
    fail_prestart: bool,
}

impl Recorder {
    fn new(name: &str) -> (Arc<Self>, Arc<Mutex<Vec<String>>>) {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let hook = Arc::new(Self {
            name: name.into(),
            calls: calls.clone(),
            fail_prestart: false,
        });
        (hook, calls)
    }

    fn push(&self, call: String) {
        self.calls.lock().unwrap().push(call);
    }
}

impl TaskHook for Recorder {
    fn name(&self) -> &str {
        &self.name
    }

    fn prestart<'a>(
        &'a self,
        ctx: &'a TaskContext,
        config: &'a mut TaskConfig,
    ) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async move {
            self.push(format!("prestart {} {}", ctx.task.name, ctx.task_id));
            if self.fail_prestart {
                return Err(HookError::new("plugin socket dir unavailable"));
            }
            config.env.insert("HOOKED".into(), self.name.clone());
            Ok(())
        })
    }

    fn poststart<'a>(
        &'a self,
        _ctx: &'a TaskContext,
        handle: &'a TaskHandle,
    ) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async move {
            self.push(format!("poststart {}", handle.pid));
            Ok(())
        })
    }

    fn exited<'a>(&'a self, _ctx: &'a TaskContext, exit: &'a ExitResult) -> BoxFuture<'a, ()> {
        Box::pin(async move { self.push(format!("exited {exit}")) })
    }

    fn stop<'a>(&'a self, _ctx: &'a TaskContext) -> BoxFuture<'a, ()> {
        Box::pin(async move { self.push("stop".into()) })
    }
}

const SERVICE: &str = r#"
job "plugin" {
  group "g" {
    restart {
      attempts = 1
      interval = "1h"
      delay    = "10ms"
      mode     = "fail"
    }
    task "plugin" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo hooked=$HOOKED; exec sleep 600"]
      }
    }
  }
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn added_hooks_run_around_the_task_in_order_and_their_progress_is_persisted() {
    let node = Node::new();
    let reaper = Reaper::default();
    let runner = AllocRunner::new(alloc(&job(SERVICE), "plugin-0"), node.deps()).expect("runner");
    reaper.watch(&runner);
    let (hook, calls) = Recorder::new("supervisor");
    runner.add_task_hook("plugin", hook).expect("add hook");
    let (other, _) = Recorder::new("x");
    assert!(runner.add_task_hook("nope", other).is_err());

    let run = spawn_run(&runner, &CancellationToken::new());
    let pid = wait_running(&runner, "plugin", &reaper).await;
    wait_for_text(
        runner.alloc_dir().join("logs/plugin.stdout"),
        "hooked=supervisor",
    )
    .await;
    berth_testkit::assert_eventually!(
        TIMEOUT,
        || async {
            runner.record().tasks["plugin"]
                .poststart_done
                .contains("supervisor")
        },
        "poststart recorded"
    );
    let task = &runner.record().tasks["plugin"];
    let prestart: Vec<&str> = task.prestart_done.iter().map(String::as_str).collect();
    assert_eq!(prestart, ["supervisor", "task_dir", "volume_mounts"]);
    let (late, _) = Recorder::new("late");
    assert!(
        runner.add_task_hook("plugin", late).is_err(),
        "legal only before run"
    );

    runner.stop();
    assert_eq!(finished(run).await.expect("run"), ClientStatus::Complete);
    assert_eq!(
        *calls.lock().unwrap(),
        [
            "prestart plugin plugin-0.plugin".to_owned(),
            format!("poststart {pid}"),
            "stop".to_owned(),
            "exited killed by SIGTERM".to_owned(),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_prestart_hook_fails_the_start_under_the_restart_policy() {
    let node = Node::new();
    let runner = AllocRunner::new(alloc(&job(SERVICE), "plugin-1"), node.deps()).expect("runner");
    let calls = Arc::new(Mutex::new(Vec::new()));
    let hook = Arc::new(Recorder {
        name: "supervisor".into(),
        calls: calls.clone(),
        fail_prestart: true,
    });
    runner.add_task_hook("plugin", hook).expect("add hook");
    assert_eq!(
        runner.run(CancellationToken::new()).await.expect("run"),
        ClientStatus::Failed
    );
    let status = runner.status();
    assert_eq!(
        kinds(&status, Some("plugin")),
        [
            EventKind::StartFailed,
            EventKind::Restarting,
            EventKind::StartFailed,
            EventKind::NotRestarting
        ]
    );
    let failed = status
        .events_of(Some("plugin"))
        .find(|e| e.kind == EventKind::StartFailed)
        .expect("start failed");
    assert_eq!(
        failed.message,
        "prestart hook supervisor: plugin socket dir unavailable"
    );
    assert_eq!(calls.lock().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_task_runs_only_the_poststart_hooks_a_crash_interrupted() {
    let mut node = Node::new();
    let reaper = Reaper::default();
    let runner = AllocRunner::new(alloc(&job(SERVICE), "plugin-2"), node.deps()).expect("runner");
    let (hook, first_calls) = Recorder::new("supervisor");
    runner.add_task_hook("plugin", hook).expect("add hook");
    let cancel = CancellationToken::new();
    let run = spawn_run(&runner, &cancel);
    let pid = wait_running(&runner, "plugin", &reaper).await;
    berth_testkit::assert_eventually!(
        TIMEOUT,
        || async { first_calls.lock().unwrap().len() == 2 },
        "prestart and poststart ran"
    );
    cancel.cancel();
    assert!(finished(run).await.is_err());
    node.restart_drivers().await;

    // As if the agent had stopped between the start and the poststart hook.
    let mut record = node.store.get("plugin-2").expect("get").expect("record");
    record
        .tasks
        .get_mut("plugin")
        .unwrap()
        .poststart_done
        .clear();
    let runner = AllocRunner::recover(record, node.deps())
        .await
        .expect("recover");
    reaper.watch(&runner);
    let (hook, calls) = Recorder::new("supervisor");
    runner.add_task_hook("plugin", hook).expect("add hook");
    let run = spawn_run(&runner, &CancellationToken::new());
    berth_testkit::assert_eventually!(
        TIMEOUT,
        || async { !calls.lock().unwrap().is_empty() },
        "poststart ran again"
    );
    assert_eq!(*calls.lock().unwrap(), [format!("poststart {pid}")]);
    assert_eq!(runner.status().tasks["plugin"].pid, Some(pid));
    runner.stop();
    assert_eq!(finished(run).await.expect("run"), ClientStatus::Complete);
    assert_eq!(calls.lock().unwrap()[1], "stop");
}

/// An alloc hook that records its calls; its prerun fails when told to.
#[derive(Debug)]
struct AllocRecorder {
    name: &'static str,
    calls: Arc<Mutex<Vec<String>>>,
    fail: bool,
}

impl AllocHook for AllocRecorder {
    fn name(&self) -> &str {
        self.name
    }

    fn prerun<'a>(&'a self, ctx: &'a AllocContext) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async move {
            self.calls
                .lock()
                .unwrap()
                .push(format!("prerun {} {}", self.name, ctx.alloc_id));
            ctx.events
                .emit(EventKind::ConsulTokensDerived, format!("{} ran", self.name));
            if self.fail {
                return Err(HookError::new(format!("{} refused", self.name)));
            }
            Ok(())
        })
    }

    fn postrun<'a>(&'a self, ctx: &'a AllocContext) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.calls
                .lock()
                .unwrap()
                .push(format!("postrun {} {}", self.name, ctx.alloc_id));
        })
    }
}

fn alloc_hook(name: &'static str, fail: bool) -> (Arc<AllocRecorder>, Arc<Mutex<Vec<String>>>) {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let hook = Arc::new(AllocRecorder {
        name,
        calls: calls.clone(),
        fail,
    });
    (hook, calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alloc_hooks_run_before_the_tasks_and_after_they_die_and_are_not_run_twice() {
    let mut node = Node::new();
    let reaper = Reaper::default();
    let runner = AllocRunner::new(alloc(&job(SERVICE), "hooked-0"), node.deps()).expect("runner");
    let (hook, calls) = alloc_hook("tokens", false);
    runner.add_alloc_hook(hook).expect("add");
    let (same, _) = alloc_hook("tokens", false);
    assert!(runner.add_alloc_hook(same).is_err(), "names are unique");
    let (builtin, _) = alloc_hook("csi", false);
    assert!(
        runner.add_alloc_hook(builtin).is_err(),
        "built-in names are taken"
    );
    let cancel = CancellationToken::new();
    let run = spawn_run(&runner, &cancel);
    wait_running(&runner, "plugin", &reaper).await;
    assert_eq!(*calls.lock().unwrap(), ["prerun tokens hooked-0"]);
    assert!(runner.record().hooks.prerun.contains("tokens"));
    cancel.cancel();
    assert!(finished(run).await.is_err());
    node.restart_drivers().await;

    // A recovered alloc does not run a finished prerun again; its postrun runs once the tasks
    // are dead.
    let record = node.store.get("hooked-0").expect("get").expect("record");
    let runner = AllocRunner::recover(record, node.deps())
        .await
        .expect("recover");
    let (hook, calls) = alloc_hook("tokens", false);
    runner.add_alloc_hook(hook).expect("add");
    let run = spawn_run(&runner, &CancellationToken::new());
    runner.stop();
    assert_eq!(finished(run).await.expect("run"), ClientStatus::Complete);
    assert_eq!(*calls.lock().unwrap(), ["postrun tokens hooked-0"]);
    assert!(runner.record().hooks.postrun.contains("tokens"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_alloc_hook_fails_the_alloc_before_any_task_starts_and_postrun_still_runs() {
    let node = Node::new();
    let runner = AllocRunner::new(alloc(&job(SERVICE), "hooked-1"), node.deps()).expect("runner");
    let (first, calls) = alloc_hook("first", true);
    let second = Arc::new(AllocRecorder {
        name: "second",
        calls: calls.clone(),
        fail: false,
    });
    runner.add_alloc_hook(first).expect("add");
    runner.add_alloc_hook(second).expect("add");
    let run = spawn_run(&runner, &CancellationToken::new());
    assert_eq!(finished(run).await.expect("run"), ClientStatus::Failed);
    assert_eq!(
        *calls.lock().unwrap(),
        [
            "prerun first hooked-1",
            "postrun first hooked-1",
            "postrun second hooked-1"
        ]
    );
    let status = runner.status();
    assert_eq!(status.failure.as_deref(), Some("first refused"));
    assert!(status.tasks["plugin"].pid.is_none(), "no task started");
    let events = kinds(&status, None);
    assert!(
        in_order(
            &events,
            &[EventKind::ConsulTokensDerived, EventKind::AllocFailed]
        ),
        "{events:?}"
    );
}

/// Waits for an alloc that finishes when `done` is set, or never.
#[derive(Debug)]
struct Upstream {
    finishes: bool,
}

impl UpstreamWatcher for Upstream {
    fn upstream(&self, alloc: &AllocSpec) -> Vec<String> {
        vec![format!("{}-previous", alloc.alloc_id)]
    }

    fn wait<'a>(&'a self, _alloc: &'a AllocSpec) -> BoxFuture<'a, Result<(), UpstreamError>> {
        Box::pin(async move {
            if !self.finishes {
                std::future::pending::<()>().await;
            }
            Ok(())
        })
    }
}

const BATCH: &str = r#"
job "after" {
  type = "batch"
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/true"
      }
    }
  }
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_allocs_are_waited_for_with_a_timeout_and_visible_status() {
    let node = Node::new();
    for (finishes, last) in [
        (true, "previous allocs finished"),
        (
            false,
            "previous allocs still not finished after 100ms; going on",
        ),
    ] {
        let mut deps = node.deps();
        deps.upstream = Arc::new(Upstream { finishes });
        deps.config.upstream_timeout = Duration::from_millis(100);
        let id = format!("after-{finishes}");
        let runner = AllocRunner::new(alloc(&job(BATCH), &id), deps).expect("runner");
        assert_eq!(
            runner.run(CancellationToken::new()).await.expect("run"),
            ClientStatus::Complete
        );
        let status = runner.status();
        let upstream: Vec<(EventKind, String)> = status
            .events_of(None)
            .filter(|e| {
                matches!(
                    e.kind,
                    EventKind::UpstreamWaiting
                        | EventKind::UpstreamDone
                        | EventKind::UpstreamGaveUp
                )
            })
            .map(|e| (e.kind, e.message.clone()))
            .collect();
        assert_eq!(upstream.len(), 2, "{upstream:?}");
        assert_eq!(
            upstream[0].1,
            format!("waiting up to 100ms for previous allocs {id}-previous to finish")
        );
        assert_eq!(upstream[1].1, last);
    }
    // No upstream: no event.
    let runner = AllocRunner::new(alloc(&job(BATCH), "after-none"), node.deps()).expect("runner");
    runner.run(CancellationToken::new()).await.expect("run");
    assert_eq!(
        kinds(&runner.status(), None),
        [EventKind::Received, EventKind::AllocComplete]
    );
}

/// Fails the first write that carries a task handle.
#[derive(Debug, Default)]
struct LosesFirstHandle {
    inner: MemoryAllocStore,
    failed: AtomicBool,
}

impl AllocStore for LosesFirstHandle {
    fn put(&self, record: &AllocRecord) -> Result<(), AllocStoreError> {
        if record.tasks.values().any(|t| t.handle.is_some())
            && !self.failed.swap(true, Ordering::SeqCst)
        {
            return Err(AllocStoreError::Other {
                alloc_id: record.alloc_id.clone(),
                message: "disk full".into(),
            });
        }
        self.inner.put(record)
    }

    fn get(&self, alloc_id: &str) -> Result<Option<AllocRecord>, AllocStoreError> {
        self.inner.get(alloc_id)
    }

    fn list(&self) -> Result<Vec<AllocRecord>, AllocStoreError> {
        self.inner.list()
    }

    fn delete(&self, alloc_id: &str) -> Result<bool, AllocStoreError> {
        self.inner.delete(alloc_id)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_whose_handle_cannot_be_persisted_is_killed_and_counts_as_a_failed_start() {
    let node = Node::with_store(|_| Arc::new(LosesFirstHandle::default()));
    let reaper = Reaper::default();
    let runner = AllocRunner::new(alloc(&job(SERVICE), "plugin-3"), node.deps()).expect("runner");
    reaper.watch(&runner);
    let run = spawn_run(&runner, &CancellationToken::new());
    // The first process shows in memory for a moment (its handle is written there before
    // the store refuses it): wait for the second.
    let status = wait_status(&runner, "a second start", |s| {
        kinds(s, Some("plugin"))
            .iter()
            .filter(|k| **k == EventKind::Started)
            .count()
            == 2
            && s.tasks["plugin"].pid.is_some()
    })
    .await;
    let pid = status.tasks["plugin"].pid.expect("pid");
    reaper.track(pid);
    let started: Vec<u32> = status
        .events_of(Some("plugin"))
        .filter(|e| e.kind == EventKind::Started)
        .map(|e| {
            e.message
                .strip_prefix("started pid ")
                .and_then(|p| p.parse().ok())
                .expect("pid in the message")
        })
        .collect();
    assert_eq!(started.len(), 2);
    assert_eq!(started[1], pid);
    reaper.track(started[0]);
    assert!(!alive(started[0]), "the first process was killed");
    // The driver's kill of the first process shows too (copied in the background).
    wait_status(&runner, "the first process's events", |s| {
        kinds(s, Some("plugin"))
            == [
                EventKind::Started,
                EventKind::Killed,
                EventKind::StartFailed,
                EventKind::Restarting,
                EventKind::Started,
            ]
    })
    .await;
    let failed = status
        .events_of(Some("plugin"))
        .find(|e| e.kind == EventKind::StartFailed)
        .expect("start failed");
    assert!(
        failed
            .message
            .starts_with("its handle could not be persisted (alloc plugin-3: disk full)"),
        "{}",
        failed.message
    );
    let stored = node.store.get("plugin-3").expect("get").expect("record");
    assert_eq!(
        stored.tasks["plugin"].handle.as_ref().map(|h| h.pid),
        Some(pid)
    );
    runner.stop();
    assert_eq!(finished(run).await.expect("run"), ClientStatus::Complete);
}
