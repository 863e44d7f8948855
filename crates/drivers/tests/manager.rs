//! The driver manager: first fingerprint round and its one log line, health states and their
//! changes, task events held back until a handler registers (in order, bounded, counted),
//! slow and vanished handlers, shutdown.

mod common;

use std::{
    io,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use berth_drivers::{
    Capabilities, Driver, DriverError, DriverFuture, DriverManager, ExitResult, Fingerprint,
    FsIsolation, Health, ManagerConfig, ProcessConfig, RawExecDriver, Signal, TaskConfig,
    TaskEvent, TaskEventKind, TaskHandle, TaskId, TaskStats, TaskStatus,
};
use berth_testkit::assert_eventually;
use common::{Reaper, TIMEOUT, task};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A driver whose fingerprint the test sets; it runs no tasks.
#[derive(Debug)]
struct FakeDriver {
    name: &'static str,
    fingerprint: Mutex<Fingerprint>,
    /// Fingerprints never finish.
    hang: bool,
    calls: AtomicU32,
}

impl FakeDriver {
    fn new(name: &'static str, health: Health, description: &str) -> Arc<Self> {
        Arc::new(Self {
            name,
            fingerprint: Mutex::new(Fingerprint::new(health, description)),
            hang: false,
            calls: AtomicU32::new(0),
        })
    }

    fn hanging(name: &'static str) -> Arc<Self> {
        Arc::new(Self {
            name,
            fingerprint: Mutex::new(Fingerprint::undetected()),
            hang: true,
            calls: AtomicU32::new(0),
        })
    }

    fn set(&self, health: Health, description: &str) {
        *self.fingerprint.lock().unwrap() = Fingerprint::new(health, description);
    }

    fn unsupported(&self, id: &TaskId) -> DriverError {
        DriverError::Unsupported {
            task_id: id.clone(),
            driver: self.name.into(),
            what: "tasks",
        }
    }
}

impl Driver for FakeDriver {
    fn name(&self) -> &str {
        self.name
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fs_isolation: FsIsolation::None,
            send_signals: false,
            exec: false,
            bind_mounts: false,
            resource_limits: false,
            device_nodes: false,
        }
    }

    fn fingerprint(&self) -> DriverFuture<'_, Fingerprint> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.hang {
                std::future::pending::<()>().await;
            }
            self.fingerprint.lock().unwrap().clone()
        })
    }

    fn start(&self, config: TaskConfig) -> DriverFuture<'_, Result<TaskHandle, DriverError>> {
        Box::pin(async move { Err(self.unsupported(&config.id)) })
    }

    fn wait<'a>(
        &'a self,
        task_id: &'a TaskId,
    ) -> DriverFuture<'a, Result<ExitResult, DriverError>> {
        Box::pin(async move { Err(self.unsupported(task_id)) })
    }

    fn stop<'a>(
        &'a self,
        task_id: &'a TaskId,
        _timeout: Duration,
        _signal: Signal,
    ) -> DriverFuture<'a, Result<(), DriverError>> {
        Box::pin(async move { Err(self.unsupported(task_id)) })
    }

    fn destroy<'a>(&'a self, task_id: &'a TaskId) -> DriverFuture<'a, Result<(), DriverError>> {
        Box::pin(async move { Err(self.unsupported(task_id)) })
    }

    fn inspect(&self, task_id: &TaskId) -> Result<TaskStatus, DriverError> {
        Err(self.unsupported(task_id))
    }

    fn signal(&self, task_id: &TaskId, _signal: Signal) -> Result<(), DriverError> {
        Err(self.unsupported(task_id))
    }

    fn stats<'a>(
        &'a self,
        task_id: &'a TaskId,
    ) -> DriverFuture<'a, Result<TaskStats, DriverError>> {
        Box::pin(async move { Err(self.unsupported(task_id)) })
    }

    fn recover(&self, handle: TaskHandle) -> DriverFuture<'_, Result<(), DriverError>> {
        Box::pin(async move { Err(self.unsupported(&handle.task_id)) })
    }

    fn shutdown(&self) -> DriverFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// Log output captured from `tracing` on this thread (the tests run on a current-thread
/// runtime, so the manager's tasks log here too).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    fn lines_with(&self, needle: &str) -> Vec<String> {
        self.text()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }
}

impl io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn capture_logs() -> (Logs, tracing::subscriber::DefaultGuard) {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    (logs, tracing::subscriber::set_default(subscriber))
}

fn fast_config() -> ManagerConfig {
    ManagerConfig {
        fingerprint_interval: Duration::from_millis(50),
        retry_interval: Duration::from_millis(20),
        fingerprint_timeout: Duration::from_millis(200),
        held_events_per_task: 64,
    }
}

fn event(task: &TaskId, n: u32) -> TaskEvent {
    TaskEvent::new(
        task.clone(),
        "test",
        TaskEventKind::Signaled { signal: n as i32 },
        format!("event {n}"),
    )
}

fn numbers(events: &[TaskEvent]) -> Vec<i32> {
    events
        .iter()
        .filter_map(|e| match e.kind {
            TaskEventKind::Signaled { signal } => Some(signal),
            _ => None,
        })
        .collect()
}

async fn recv(rx: &mut mpsc::Receiver<TaskEvent>) -> TaskEvent {
    tokio::time::timeout(TIMEOUT, rx.recv())
        .await
        .expect("an event within the timeout")
        .expect("open")
}

async fn recv_n(rx: &mut mpsc::Receiver<TaskEvent>, n: usize) -> Vec<TaskEvent> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(recv(rx).await);
    }
    out
}

#[tokio::test]
async fn first_round_logs_one_line_with_every_driver_and_health_follows_fingerprints() {
    let (logs, _guard) = capture_logs();
    let cancel = CancellationToken::new();
    let mut builder = DriverManager::builder(fast_config(), &cancel);
    let raw = Arc::new(RawExecDriver::new(
        builder.event_sink(),
        ProcessConfig::default(),
    ));
    let flaky = FakeDriver::new("flaky", Health::Unhealthy, "no widgets found");
    let absent = FakeDriver::new("absent", Health::Undetected, "not installed");
    let slow = FakeDriver::hanging("slow");
    builder.add(raw).unwrap();
    builder.add(flaky.clone()).unwrap();
    builder.add(absent.clone()).unwrap();
    builder.add(slow.clone()).unwrap();
    let dup = builder
        .add(FakeDriver::new("flaky", Health::Healthy, ""))
        .unwrap_err();
    assert!(dup.to_string().contains("flaky"));
    let manager = builder.start();
    assert_eq!(manager.health("flaky"), Some(Health::Undetected));

    tokio::time::timeout(TIMEOUT, manager.ready())
        .await
        .expect("first round");
    assert_eq!(manager.health("raw_exec"), Some(Health::Healthy));
    assert_eq!(manager.health("flaky"), Some(Health::Unhealthy));
    assert_eq!(manager.health("absent"), Some(Health::Undetected));
    assert_eq!(manager.health("slow"), Some(Health::Unhealthy));
    assert!(
        manager
            .fingerprint("slow")
            .unwrap()
            .description
            .contains("did not finish within 200ms")
    );
    assert_eq!(manager.health("nope"), None);
    assert!(manager.driver("raw_exec").is_some());
    assert!(manager.driver("nope").is_none());
    assert_eq!(
        manager.driver_names(),
        vec!["absent", "flaky", "raw_exec", "slow"]
    );

    let lines = logs.lines_with("drivers fingerprinted");
    assert_eq!(lines.len(), 1, "{}", logs.text());
    let line = &lines[0];
    assert!(line.contains(" INFO "), "{line}");
    for part in [
        "absent: undetected (not installed)",
        "flaky: unhealthy (no widgets found)",
        "raw_exec: healthy",
        "slow: unhealthy (fingerprint did not finish within 200ms)",
    ] {
        assert!(line.contains(part), "{part:?} missing from {line}");
    }

    // Later fingerprints move the health; the summary line is not repeated.
    flaky.set(Health::Healthy, "widgets found");
    let m = manager.clone();
    assert_eventually!(
        TIMEOUT,
        || async { m.health("flaky") == Some(Health::Healthy) },
        "flaky becomes healthy"
    );
    let calls = flaky.calls.load(Ordering::SeqCst);
    assert_eventually!(
        TIMEOUT,
        || async { flaky.calls.load(Ordering::SeqCst) > calls + 1 },
        "a healthy driver is fingerprinted again"
    );
    flaky.set(Health::Unhealthy, "widgets gone");
    assert_eventually!(
        TIMEOUT,
        || async { m.health("flaky") == Some(Health::Unhealthy) },
        "flaky becomes unhealthy again"
    );
    assert_eq!(logs.lines_with("drivers fingerprinted").len(), 1);
    let changes = logs.lines_with("driver health changed");
    assert!(
        changes
            .iter()
            .any(|l| l.contains("from=unhealthy") && l.contains("to=healthy")),
        "{changes:?}"
    );

    let mut changes = manager.subscribe();
    assert_eq!(
        changes.borrow_and_update()["flaky"].description,
        "widgets gone"
    );

    // Cancelling the parent token stops every loop; shutdown waits for them.
    cancel.cancel();
    tokio::time::timeout(TIMEOUT, manager.shutdown())
        .await
        .expect("shutdown finishes");
    let calls = absent.calls.load(Ordering::SeqCst);
    assert!(calls >= 1);
}

#[tokio::test]
async fn events_held_back_until_a_handler_registers_arrive_in_order() {
    let cancel = CancellationToken::new();
    let builder = DriverManager::builder(fast_config(), &cancel);
    let sink = builder.event_sink();
    let manager = builder.start();
    let task = TaskId::new("early").unwrap();
    for n in 1..=5 {
        sink.emit(event(&task, n));
    }
    assert_eq!(manager.held_back_events(&task), 5);

    let (tx, mut rx) = mpsc::channel(16);
    manager.register_handler(&task, tx);
    assert_eq!(numbers(&recv_n(&mut rx, 5).await), vec![1, 2, 3, 4, 5]);
    assert_eq!(manager.held_back_events(&task), 0);
    // Later events go straight through.
    sink.emit(event(&task, 6));
    assert_eq!(numbers(&[recv(&mut rx).await]), vec![6]);
    // Another task's events are not mixed in.
    let other = TaskId::new("other").unwrap();
    sink.emit(event(&other, 99));
    assert_eq!(manager.held_back_events(&other), 1);
    assert!(rx.try_recv().is_err());
    assert_eq!(manager.dropped_events(), 0);

    // Deregistering forgets the handler and what is held for a task.
    manager.deregister_handler(&other);
    assert_eq!(manager.held_back_events(&other), 0);
    manager.deregister_handler(&task);
    sink.emit(event(&task, 7));
    assert!(rx.try_recv().is_err(), "no handler any more");
    assert_eq!(manager.held_back_events(&task), 1);
    manager.shutdown().await;
}

#[tokio::test]
async fn overflow_drops_the_oldest_counts_them_and_says_so_first() {
    let (logs, _guard) = capture_logs();
    let cancel = CancellationToken::new();
    let config = ManagerConfig {
        held_events_per_task: 4,
        ..fast_config()
    };
    let builder = DriverManager::builder(config, &cancel);
    let sink = builder.event_sink();
    let manager = builder.start();
    let task = TaskId::new("flood").unwrap();
    for n in 1..=10 {
        sink.emit(event(&task, n));
    }
    assert_eq!(manager.held_back_events(&task), 4);
    assert_eq!(manager.dropped_events(), 6);
    let warnings = logs.lines_with("task event dropped");
    assert!(!warnings.is_empty() && warnings.len() < 6, "{warnings:?}");
    assert!(warnings.iter().all(|l| l.contains("WARN")));

    let (tx, mut rx) = mpsc::channel(16);
    manager.register_handler(&task, tx);
    let first = recv(&mut rx).await;
    assert_eq!(first.kind, TaskEventKind::Dropped { count: 6 });
    assert_eq!(first.task_id, task);
    assert_eq!(numbers(&recv_n(&mut rx, 4).await), vec![7, 8, 9, 10]);
    manager.shutdown().await;
}

#[tokio::test]
async fn a_slow_handler_gets_everything_in_order_and_a_vanished_one_is_replaced() {
    let cancel = CancellationToken::new();
    let builder = DriverManager::builder(fast_config(), &cancel);
    let sink = builder.event_sink();
    let manager = builder.start();
    let task = TaskId::new("slow-reader").unwrap();

    // Room for one event: the rest wait in the manager, not in the driver.
    let (tx, mut rx) = mpsc::channel(1);
    manager.register_handler(&task, tx);
    for n in 1..=20 {
        sink.emit(event(&task, n));
    }
    assert!(manager.held_back_events(&task) >= 18);
    assert_eq!(
        numbers(&recv_n(&mut rx, 20).await),
        (1..=20).collect::<Vec<_>>()
    );

    // The handler goes away: events are held again, and reach the next handler.
    drop(rx);
    sink.emit(event(&task, 21));
    sink.emit(event(&task, 22));
    assert_eq!(manager.held_back_events(&task), 2);
    let (tx, mut rx) = mpsc::channel(8);
    manager.register_handler(&task, tx);
    assert_eq!(numbers(&recv_n(&mut rx, 2).await), vec![21, 22]);
    assert_eq!(manager.dropped_events(), 0);
    manager.shutdown().await;
}

#[tokio::test]
async fn a_real_tasks_events_wait_for_its_handler_and_recover_goes_to_the_right_driver() {
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let cancel = CancellationToken::new();
    let mut builder = DriverManager::builder(fast_config(), &cancel);
    let process = ProcessConfig {
        poll_interval: Duration::from_millis(20),
        kill_timeout: Duration::from_secs(10),
        task_path: None,
    };
    builder
        .add(Arc::new(RawExecDriver::new(
            builder.event_sink(),
            process.clone(),
        )))
        .unwrap();
    let manager = builder.start();
    manager.ready().await;
    let driver = manager.driver("raw_exec").unwrap();

    let config = task(tmp.path(), "quick", "sh", &["-c", "exit 4"]);
    let handle = driver.start(config.clone()).await.unwrap();
    reaper.track(&handle);
    driver.wait(&config.id).await.unwrap();

    let (tx, mut rx) = mpsc::channel(8);
    manager.register_handler(&config.id, tx);
    let events = recv_n(&mut rx, 2).await;
    assert_eq!(events[0].kind, TaskEventKind::Started { pid: handle.pid });
    assert_eq!(
        events[1].kind,
        TaskEventKind::Exited {
            code: Some(4),
            signal: None,
            oom_killed: false
        }
    );
    assert!(events.iter().all(|e| e.driver == "raw_exec"));

    // A handle of a driver the manager does not have is refused by name.
    let foreign = TaskHandle {
        driver: "docker".into(),
        ..handle.clone()
    };
    let err = manager.recover(foreign).await.unwrap_err();
    assert!(err.to_string().contains("docker"), "{err}");
    driver.destroy(&config.id).await.unwrap();

    // A live task recovered through the manager by a fresh manager's driver.
    let sleeper = task(tmp.path(), "sleeper", "sleep", &["1000"]);
    let handle = driver.start(sleeper.clone()).await.unwrap();
    reaper.track(&handle);
    manager.shutdown().await;
    drop(driver);
    drop(manager);

    let cancel = CancellationToken::new();
    let mut builder = DriverManager::builder(fast_config(), &cancel);
    builder
        .add(Arc::new(RawExecDriver::new(builder.event_sink(), process)))
        .unwrap();
    let manager = builder.start();
    manager.recover(handle.clone()).await.expect("recover");
    let (tx, mut rx) = mpsc::channel(8);
    manager.register_handler(&sleeper.id, tx);
    assert_eq!(
        recv(&mut rx).await.kind,
        TaskEventKind::Recovered { pid: handle.pid }
    );
    let driver = manager.driver("raw_exec").unwrap();
    driver.destroy(&sleeper.id).await.unwrap();
    let kinds: Vec<_> = recv_n(&mut rx, 2)
        .await
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        kinds,
        vec![
            TaskEventKind::Killed,
            TaskEventKind::Exited {
                code: None,
                signal: None,
                oom_killed: false
            }
        ]
    );
    cancel.cancel();
    manager.shutdown().await;
}
