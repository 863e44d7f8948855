//! `raw_exec` with real processes: exit codes, logs, environment, stop (TERM, then KILL),
//! signals, stats, inspect, and recovery by a new driver instance.

mod common;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use berth_drivers::{
    Driver, DriverError, EventSink, ExitResult, Health, ProcessConfig, RAW_EXEC, RawExecDriver,
    Signal, TaskEventKind, TaskHandle, TaskId, TaskState,
};
use berth_testkit::assert_eventually;
use common::{Reaper, TIMEOUT, alive, events_until, next_event, read, sh, stat_field, task};

fn fast() -> ProcessConfig {
    ProcessConfig {
        poll_interval: Duration::from_millis(20),
        kill_timeout: Duration::from_secs(10),
        task_path: None,
    }
}

fn driver() -> (
    RawExecDriver,
    tokio::sync::mpsc::UnboundedReceiver<berth_drivers::TaskEvent>,
) {
    let (sink, rx) = EventSink::channel();
    (RawExecDriver::new(sink, fast()), rx)
}

#[tokio::test]
async fn runs_a_process_and_reports_its_exit_code_and_logs() {
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let (driver, mut events) = driver();
    assert_eq!(driver.fingerprint().await.health, Health::Healthy);

    let config = sh(tmp.path(), "t1", "echo out; echo err >&2; pwd; exit 3");
    let handle = driver.start(config.clone()).await.expect("start");
    reaper.track(&handle);
    assert_eq!(handle.driver, RAW_EXEC);
    assert_eq!(handle.task_id, config.id);

    let exit = driver.wait(&config.id).await.expect("wait");
    assert_eq!(
        exit,
        ExitResult {
            exit_code: Some(3),
            signal: None,
            oom_killed: false
        }
    );
    // A second wait returns the same at once.
    assert_eq!(driver.wait(&config.id).await.unwrap(), exit);
    assert_eq!(
        read(&config.stdout_path),
        format!("out\n{}\n", config.dir.display())
    );
    assert_eq!(read(&config.stderr_path), "err\n");

    let status = driver.inspect(&config.id).unwrap();
    assert_eq!(status.state, TaskState::Exited);
    assert_eq!(status.pid, handle.pid);
    assert_eq!(status.exit, Some(exit));

    assert_eq!(
        next_event(&mut events).await.kind,
        TaskEventKind::Started { pid: handle.pid }
    );
    let exited = next_event(&mut events).await;
    assert_eq!(
        exited.kind,
        TaskEventKind::Exited {
            code: Some(3),
            signal: None,
            oom_killed: false
        }
    );
    assert_eq!(exited.message, "exited with code 3");

    // Logs are appended to by a second run of the same id.
    driver.destroy(&config.id).await.expect("destroy");
    assert!(matches!(
        driver.inspect(&config.id),
        Err(DriverError::NotFound { .. })
    ));
    let handle = driver.start(config.clone()).await.expect("start again");
    reaper.track(&handle);
    driver.wait(&config.id).await.unwrap();
    assert_eq!(read(&config.stderr_path), "err\nerr\n");
}

#[tokio::test]
async fn environment_is_the_tasks_own_plus_path() {
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let (driver, _events) = driver();
    let mut config = sh(
        tmp.path(),
        "env",
        r#"echo "foo=$FOO home=${HOME-unset} path=${PATH:+set}""#,
    );
    config.env.insert("FOO".into(), "bar baz".into());
    reaper.track(&driver.start(config.clone()).await.unwrap());
    assert!(driver.wait(&config.id).await.unwrap().success());
    assert_eq!(
        read(&config.stdout_path),
        "foo=bar baz home=unset path=set\n"
    );

    let mut config = sh(tmp.path(), "env2", r#"echo "$PATH""#);
    config.env.insert("PATH".into(), "/bin:/usr/bin".into());
    reaper.track(&driver.start(config.clone()).await.unwrap());
    driver.wait(&config.id).await.unwrap();
    assert_eq!(read(&config.stdout_path), "/bin:/usr/bin\n");
}

#[tokio::test]
async fn each_task_leads_its_own_process_group() {
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let (driver, _events) = driver();
    let config = task(tmp.path(), "pg", "sleep", &["1000"]);
    let handle = driver.start(config.clone()).await.unwrap();
    reaper.track(&handle);
    assert_eq!(stat_field(handle.pid, 5), Some(handle.pid.to_string()));
    assert_eq!(
        stat_field(handle.pid, 22),
        Some(handle.start_ticks.to_string())
    );
    assert_ne!(
        stat_field(std::process::id(), 5),
        Some(handle.pid.to_string())
    );
    driver.destroy(&config.id).await.unwrap();
    assert!(!alive(handle.pid));
}

#[tokio::test]
async fn stop_sends_the_signal_then_sigkill_to_the_whole_group_after_the_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let (driver, mut events) = driver();
    // Ignored signals stay ignored across fork and exec: the background sleep ignores TERM too.
    let config = sh(
        tmp.path(),
        "stubborn",
        r#"trap "" TERM; sleep 1000 & echo "child $!"; wait"#,
    );
    let handle = driver.start(config.clone()).await.unwrap();
    reaper.track(&handle);
    common::wait_for_text(config.stdout_path.clone(), "child ").await;
    let child: u32 = read(&config.stdout_path)
        .trim()
        .strip_prefix("child ")
        .unwrap()
        .parse()
        .unwrap();
    assert!(alive(child));

    let timeout = Duration::from_millis(300);
    let started = Instant::now();
    driver
        .stop(&config.id, timeout, Signal::SIGTERM)
        .await
        .expect("stop");
    assert!(
        started.elapsed() >= timeout,
        "SIGKILL only after the timeout"
    );
    let exit = driver.wait(&config.id).await.unwrap();
    assert_eq!(exit.signal, Some(Signal::SIGKILL as i32), "{exit:?}");
    assert_eq!(exit.exit_code, None);
    assert_eq!(driver.inspect(&config.id).unwrap().state, TaskState::Exited);
    assert_eventually!(
        TIMEOUT,
        || async { !alive(child) },
        "the group's other process was killed too"
    );

    let kinds = events_until(&mut events, |k| matches!(k, TaskEventKind::Exited { .. })).await;
    assert_eq!(
        kinds,
        vec![
            TaskEventKind::Started { pid: handle.pid },
            TaskEventKind::Signaled {
                signal: Signal::SIGTERM as i32
            },
            TaskEventKind::Killed,
            TaskEventKind::Exited {
                code: None,
                signal: Some(Signal::SIGKILL as i32),
                oom_killed: false
            },
        ]
    );

    // Stopping an exited task does nothing.
    driver
        .stop(&config.id, timeout, Signal::SIGTERM)
        .await
        .expect("stop again");
}

#[tokio::test]
async fn stop_of_a_process_that_obeys_needs_no_sigkill() {
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let (driver, mut events) = driver();
    let config = task(tmp.path(), "polite", "sleep", &["1000"]);
    reaper.track(&driver.start(config.clone()).await.unwrap());
    driver
        .stop(&config.id, Duration::from_secs(30), Signal::SIGTERM)
        .await
        .unwrap();
    let exit = driver.wait(&config.id).await.unwrap();
    assert_eq!(exit.signal, Some(Signal::SIGTERM as i32));
    let kinds = events_until(&mut events, |k| matches!(k, TaskEventKind::Exited { .. })).await;
    assert!(!kinds.contains(&TaskEventKind::Killed), "{kinds:?}");
}

#[tokio::test]
async fn signal_reaches_the_main_process() {
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let (driver, mut events) = driver();
    let config = sh(
        tmp.path(),
        "sig",
        r#"trap 'echo got-usr1; exit 7' USR1; echo ready; while :; do sleep 0.05; done"#,
    );
    let handle = driver.start(config.clone()).await.unwrap();
    reaper.track(&handle);
    common::wait_for_text(config.stdout_path.clone(), "ready").await;
    driver.signal(&config.id, Signal::SIGUSR1).expect("signal");
    let exit = driver.wait(&config.id).await.unwrap();
    assert_eq!(exit.exit_code, Some(7));
    assert_eq!(read(&config.stdout_path), "ready\ngot-usr1\n");
    assert!(matches!(
        driver.signal(&config.id, Signal::SIGUSR1),
        Err(DriverError::NotRunning { .. })
    ));
    let kinds = events_until(&mut events, |k| matches!(k, TaskEventKind::Exited { .. })).await;
    assert_eq!(
        kinds[1],
        TaskEventKind::Signaled {
            signal: Signal::SIGUSR1 as i32
        }
    );
    driver.destroy(&config.id).await.unwrap();
}

#[tokio::test]
async fn stats_count_cpu_and_memory_of_the_group() {
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let (driver, _events) = driver();
    let config = sh(
        tmp.path(),
        "busy",
        "sleep 1000 & x=0; while :; do x=$((x + 1)); done",
    );
    let handle = driver.start(config.clone()).await.unwrap();
    reaper.track(&handle);
    // Right after start the task may still be exec'ing (no resident pages yet): the first
    // sample counted is the first one taken once it runs.
    assert_eventually!(
        TIMEOUT,
        || async {
            driver
                .stats(&config.id)
                .await
                .is_ok_and(|s| s.rss_bytes > 0)
        },
        "the task has resident memory"
    );
    let first = driver.stats(&config.id).await.expect("stats");
    assert!(first.pids.contains(&handle.pid));
    assert!(first.rss_bytes > 0);
    assert!(first.ticks_per_second > 0);
    assert_eventually!(
        TIMEOUT,
        || async {
            let s = driver.stats(&config.id).await.unwrap();
            s.pids.len() == 2 && s.cpu_time() > first.cpu_time()
        },
        "the busy loop uses CPU and the sleep is counted"
    );
    let later = driver.stats(&config.id).await.unwrap();
    assert!(later.cpu_percent_since(&first) > 0.0);

    let status = driver.inspect(&config.id).unwrap();
    assert_eq!(status.state, TaskState::Running);
    assert_eq!(status.pid, handle.pid);
    assert_eq!(status.exit, None);
    assert_eq!(status.started_at, handle.started_at);

    driver.destroy(&config.id).await.unwrap();
    assert!(matches!(
        driver.stats(&config.id).await,
        Err(DriverError::NotFound { .. })
    ));
}

#[tokio::test]
async fn bad_requests_change_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let (driver, _events) = driver();

    let mut config = task(tmp.path(), "bad", "true", &[]);
    config.dir = "relative".into();
    assert!(matches!(
        driver.start(config).await,
        Err(DriverError::InvalidConfig { field, .. }) if field == "dir"
    ));

    let mut config = task(tmp.path(), "mounts", "true", &[]);
    config.mounts.push(berth_drivers::BindMount {
        source: "/tmp".into(),
        destination: "/mnt".into(),
        read_only: false,
        propagation: Default::default(),
    });
    assert!(matches!(
        driver.start(config.clone()).await,
        Err(DriverError::Unsupported { .. })
    ));
    assert!(!config.dir.exists(), "nothing was created");

    let missing = task(tmp.path(), "missing", "/nonexistent/berth-program", &[]);
    let err = driver.start(missing.clone()).await.unwrap_err();
    assert!(matches!(err, DriverError::Spawn { .. }), "{err:?}");
    // The id is free again.
    let ok = task(tmp.path(), "missing", "true", &[]);
    reaper.track(&driver.start(ok.clone()).await.expect("the id is free"));

    let sleeper = task(tmp.path(), "dup", "sleep", &["1000"]);
    reaper.track(&driver.start(sleeper.clone()).await.unwrap());
    assert!(matches!(
        driver.start(sleeper.clone()).await,
        Err(DriverError::AlreadyExists { .. })
    ));
    let unknown = TaskId::new("unknown").unwrap();
    assert!(matches!(
        driver.wait(&unknown).await,
        Err(DriverError::NotFound { .. })
    ));
    assert!(matches!(
        driver.destroy(&unknown).await,
        Err(DriverError::NotFound { .. })
    ));
    driver.destroy(&sleeper.id).await.unwrap();
}

#[tokio::test]
async fn a_new_driver_recovers_a_running_task_from_its_serialized_handle() {
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let (first, _events) = driver();
    let config = task(tmp.path(), "survivor", "sleep", &["1000"]);
    let handle = first.start(config.clone()).await.unwrap();
    reaper.track(&handle);
    let stored = serde_json::to_string(&handle).unwrap();

    // "Restart": the first instance goes away; its task does not.
    first.shutdown().await;
    assert!(matches!(
        first.wait(&config.id).await,
        Err(DriverError::ShutDown { .. })
    ));
    drop(first);
    assert!(alive(handle.pid), "the task outlives its driver");

    let (sink, mut events) = EventSink::channel();
    let second: Arc<dyn Driver> = Arc::new(RawExecDriver::new(sink, fast()));
    let restored: TaskHandle = serde_json::from_str(&stored).unwrap();
    second.recover(restored.clone()).await.expect("recover");
    second
        .recover(restored)
        .await
        .expect("recovering again is a no-op");
    assert_eq!(
        next_event(&mut events).await.kind,
        TaskEventKind::Recovered { pid: handle.pid }
    );
    let status = second.inspect(&config.id).unwrap();
    assert_eq!(status.state, TaskState::Running);
    assert_eq!(status.pid, handle.pid);
    assert!(second.stats(&config.id).await.unwrap().pids == vec![handle.pid]);

    // Stop through the new instance: it is not the process's parent, so the exit is seen but
    // the status is not.
    second
        .stop(&config.id, Duration::from_secs(30), Signal::SIGTERM)
        .await
        .expect("stop");
    let exit = second.wait(&config.id).await.unwrap();
    assert!(exit.is_unknown(), "{exit:?}");
    assert_eq!(exit, ExitResult::UNKNOWN);
    assert_eq!(second.inspect(&config.id).unwrap().state, TaskState::Exited);
    let kinds = events_until(&mut events, |k| matches!(k, TaskEventKind::Exited { .. })).await;
    assert_eq!(
        kinds.last(),
        Some(&TaskEventKind::Exited {
            code: None,
            signal: None,
            oom_killed: false
        })
    );
    second.destroy(&config.id).await.unwrap();
}

#[tokio::test]
async fn a_recovered_task_killed_from_outside_is_seen_to_exit() {
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let (first, _events) = driver();
    let config = task(tmp.path(), "outside", "sleep", &["1000"]);
    let handle = first.start(config.clone()).await.unwrap();
    reaper.track(&handle);
    first.shutdown().await;
    drop(first);

    let (second, _events) = driver();
    second.recover(handle.clone()).await.unwrap();
    let waiter = second.wait(&config.id);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(handle.pid as i32),
        Signal::SIGKILL,
    )
    .unwrap();
    let exit = tokio::time::timeout(TIMEOUT, waiter)
        .await
        .expect("exit seen")
        .unwrap();
    assert_eq!(exit, ExitResult::UNKNOWN);
}

#[tokio::test]
async fn recover_refuses_handles_that_do_not_match_a_live_process() {
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let (first, _events) = driver();
    let config = task(tmp.path(), "victim", "sleep", &["1000"]);
    let handle = first.start(config.clone()).await.unwrap();
    reaper.track(&handle);
    first.shutdown().await;
    drop(first);
    let (second, _events) = driver();

    let recycled = TaskHandle {
        start_ticks: handle.start_ticks + 1,
        ..handle.clone()
    };
    let err = second.recover(recycled).await.unwrap_err();
    assert!(
        matches!(err, DriverError::PidRecycled { pid, expected, .. } if pid == handle.pid && expected == handle.start_ticks + 1),
        "{err:?}"
    );
    assert!(matches!(
        second.inspect(&config.id),
        Err(DriverError::NotFound { .. })
    ));

    let other_boot = TaskHandle {
        boot_id: "00000000-0000-0000-0000-000000000000".into(),
        ..handle.clone()
    };
    assert!(matches!(
        second.recover(other_boot).await,
        Err(DriverError::OtherBoot { .. })
    ));
    let other_driver = TaskHandle {
        driver: "exec".into(),
        ..handle.clone()
    };
    assert!(matches!(
        second.recover(other_driver).await,
        Err(DriverError::WrongDriver { .. })
    ));
    let newer = TaskHandle {
        version: 99,
        ..handle.clone()
    };
    assert!(matches!(
        second.recover(newer).await,
        Err(DriverError::HandleVersion { .. })
    ));

    // The real handle still works, and after the process is gone it is refused.
    second.recover(handle.clone()).await.unwrap();
    second.destroy(&config.id).await.unwrap();
    assert!(!alive(handle.pid));
    let err = second.recover(handle.clone()).await.unwrap_err();
    assert!(
        matches!(
            err,
            DriverError::NotRunning { .. } | DriverError::PidRecycled { .. }
        ),
        "{err:?}"
    );
}
