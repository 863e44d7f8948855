//! Rotated task output through real log collectors (`berth-logmon`), with `raw_exec` and
//! `exec` tasks: rotation and deletion, a restart appending to the newest file, a collector
//! restarted on recovery; and `exec` into running tasks: the task's root, exit codes, input,
//! a terminal. Needs root for `exec`.

mod common;

use std::{path::Path, time::Duration};

use berth_drivers::{
    CgroupSetting, Driver, DriverError, EventSink, ExecDriver, ExecRequest, ExecSession,
    LogCollector, LogRotation, ProcessConfig, RawExecDriver, TaskConfig, TaskLogs, TerminalSize,
    logs::{collector_pid, fifo_path, rotated_files, rotated_path},
};
use berth_testkit::assert_eventually;
use common::{Reaper, TIMEOUT, exec::is_root, read};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

fn fast() -> ProcessConfig {
    ProcessConfig {
        poll_interval: Duration::from_millis(20),
        kill_timeout: Duration::from_secs(10),
        task_path: None,
    }
}

fn rotated(config: &mut TaskConfig, max_files: u32, max_file_size_mb: u32) {
    config.logs = TaskLogs::Rotated {
        collector: LogCollector {
            program: env!("CARGO_BIN_EXE_berth-logmon").into(),
            args: Vec::new(),
        },
        rotation: LogRotation {
            max_files,
            max_file_size_mb,
        },
    };
}

/// The stream's files, concatenated in order.
fn stream(base: &Path) -> Vec<u8> {
    rotated_files(base)
        .unwrap()
        .into_iter()
        .flat_map(|(_, p)| std::fs::read(p).unwrap())
        .collect()
}

fn indices(base: &Path) -> Vec<u64> {
    rotated_files(base)
        .unwrap()
        .into_iter()
        .map(|(i, _)| i)
        .collect()
}

/// Waits until no collector reads the stream at `base` (it wrote everything and ended).
async fn collector_gone(base: &Path) {
    assert_eventually!(
        TIMEOUT,
        || async { collector_pid(base).unwrap().is_none() },
        "the collector of {} still runs",
        base.display()
    );
}

/// `printf` of lines `from..=to` (`line N` each, padded to 100 bytes).
fn numbered(from: u32, to: u32) -> String {
    format!("i={from}; while [ $i -le {to} ]; do printf 'line %094d\\n' $i; i=$((i+1)); done")
}

fn expected(from: u32, to: u32) -> Vec<u8> {
    (from..=to)
        .flat_map(|i| format!("line {i:094}\n").into_bytes())
        .collect()
}

#[tokio::test]
async fn raw_exec_output_rotates_keeps_the_newest_files_and_a_restart_appends() {
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let driver = RawExecDriver::new(EventSink::discard(), fast());
    // 25,000 lines of 100 bytes: 2.38 MiB into files of 1 MiB, two kept.
    let mut config = common::sh(
        tmp.path(),
        "rot",
        &format!("{}; echo err >&2", numbered(1, 25_000)),
    );
    rotated(&mut config, 2, 1);
    let handle = driver.start(config.clone()).await.expect("start");
    reaper.track(&handle);
    assert!(
        handle.logs.is_some(),
        "the handle records the rotated output"
    );
    assert_eq!(driver.wait(&config.id).await.unwrap().exit_code, Some(0));
    collector_gone(&config.stdout_path).await;
    collector_gone(&config.stderr_path).await;

    assert_eq!(indices(&config.stdout_path), [1, 2], "file 0 was deleted");
    let all = expected(1, 25_000);
    let kept = stream(&config.stdout_path);
    assert_eq!(kept.len(), all.len() - 1024 * 1024);
    assert!(all.ends_with(&kept), "the newest bytes, in order");
    assert_eq!(
        std::fs::metadata(rotated_path(&config.stdout_path, 1))
            .unwrap()
            .len(),
        1024 * 1024
    );
    assert_eq!(read(rotated_path(&config.stderr_path, 0)), "err\n");
    // Nothing of the stream is left outside its files.
    assert!(!config.stdout_path.exists());

    // A second run of the task appends to the newest file and goes on numbering.
    driver.destroy(&config.id).await.unwrap();
    config.args = vec!["-c".into(), "echo second run".into()];
    let handle = driver.start(config.clone()).await.expect("restart");
    reaper.track(&handle);
    driver.wait(&config.id).await.unwrap();
    collector_gone(&config.stdout_path).await;
    assert_eq!(indices(&config.stdout_path), [1, 2]);
    let kept_now = stream(&config.stdout_path);
    assert_eq!(&kept_now[..kept.len()], &kept[..]);
    assert_eq!(&kept_now[kept.len()..], b"second run\n");
}

#[tokio::test]
async fn a_collector_that_died_is_restarted_when_the_task_is_recovered() {
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let driver = RawExecDriver::new(EventSink::discard(), fast());
    let go = tmp.path().join("go");
    // Writes one line each time `go` appears (and only then, so that it never writes while
    // no collector reads its output).
    let mut config = common::sh(
        tmp.path(),
        "rec",
        &format!(
            "echo first; n=0; while :; do if [ -e {go} ]; then rm {go}; n=$((n+1)); echo after $n; fi; sleep 0.02; done",
            go = go.display()
        ),
    );
    rotated(&mut config, 3, 1);
    let handle = driver.start(config.clone()).await.expect("start");
    reaper.track(&handle);
    let out = rotated_path(&config.stdout_path, 0);
    common::wait_for_text(out.clone(), "first\n").await;

    // The collector dies (the agent's machine killed it), and so does the agent.
    let pid = collector_pid(&config.stdout_path)
        .unwrap()
        .expect("a collector");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    collector_gone(&config.stdout_path).await;
    driver.shutdown().await;

    let (sink, mut events) = EventSink::channel();
    let next = RawExecDriver::new(sink, fast());
    next.recover(handle.clone()).await.expect("recover");
    let new_pid = collector_pid(&config.stdout_path)
        .unwrap()
        .expect("a new collector");
    assert_ne!(new_pid, pid);
    assert!(
        common::exec::drain(&mut events)
            .iter()
            .all(|e| e.kind != berth_drivers::TaskEventKind::Note),
        "no problem to report"
    );
    std::fs::write(&go, "").unwrap();
    common::wait_for_text(out.clone(), "after 1\n").await;
    assert_eq!(read(&out), "first\nafter 1\n");

    // Recovering again with live collectors starts none.
    next.shutdown().await;
    let third = RawExecDriver::new(EventSink::discard(), fast());
    third.recover(handle.clone()).await.expect("recover");
    assert_eq!(collector_pid(&config.stdout_path).unwrap(), Some(new_pid));
    third.destroy(&config.id).await.unwrap();
    collector_gone(&config.stdout_path).await;
    collector_gone(&config.stderr_path).await;
}

#[tokio::test]
async fn a_collector_that_cannot_start_fails_the_start_and_leaves_nothing_running() {
    let tmp = tempfile::tempdir().unwrap();
    let driver = RawExecDriver::new(EventSink::discard(), fast());
    let mut config = common::sh(tmp.path(), "bad", "echo never");
    rotated(&mut config, 1, 1);
    // Something that is not a FIFO where the FIFO goes.
    std::fs::create_dir_all(config.stdout_path.parent().unwrap()).unwrap();
    std::fs::write(fifo_path(&config.stdout_path), "x").unwrap();
    let err = driver.start(config.clone()).await.unwrap_err();
    assert!(
        matches!(&err, DriverError::Logs { path, .. } if *path == config.stdout_path),
        "{err:?}"
    );
    assert!(err.to_string().contains("is not a FIFO"), "{err}");
    assert!(driver.inspect(&config.id).is_err(), "no task was started");

    // A collector that refuses its arguments says why.
    let mut config = common::sh(tmp.path(), "bad2", "echo never");
    rotated(&mut config, 1, 1);
    config.logs = TaskLogs::Rotated {
        collector: LogCollector {
            program: env!("CARGO_BIN_EXE_berth-logmon").into(),
            args: vec!["--bogus".into(), "1".into()],
        },
        rotation: LogRotation::default(),
    };
    let err = driver.start(config.clone()).await.unwrap_err().to_string();
    assert!(err.contains("bogus"), "{err}");
    // Its stdout collector was started, then saw its stream end.
    collector_gone(&config.stdout_path).await;
}

/// Everything a session prints and its exit code, feeding it `input` (then closing it).
async fn run(mut session: ExecSession, input: &[u8]) -> (Vec<u8>, Vec<u8>, i32) {
    session.stdin.write_all(input).await.unwrap();
    session.stdin.shutdown().await.unwrap();
    let mut out = Vec::new();
    let mut err = Vec::new();
    let stderr = async {
        if let Some(mut e) = session.stderr.take() {
            e.read_to_end(&mut err).await.unwrap();
        }
    };
    let (code, _, _) = tokio::time::timeout(TIMEOUT, async {
        tokio::join!(
            session.process.wait(),
            session.stdout.read_to_end(&mut out),
            stderr
        )
    })
    .await
    .expect("the command ends");
    (out, err, code.unwrap())
}

fn request(command: &[&str]) -> ExecRequest {
    ExecRequest {
        command: command.iter().map(|s| s.to_string()).collect(),
        tty: None,
    }
}

#[tokio::test]
async fn exec_runs_in_an_exec_tasks_root_with_its_exit_code_and_input() {
    if !is_root() {
        eprintln!("SKIPPED: the exec driver needs root");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let driver = ExecDriver::new(
        EventSink::discard(),
        common::exec::config(CgroupSetting::Disabled),
    );
    let mut config = common::exec::sh(tmp.path(), "ex", "echo up; exec sleep 1000");
    config.pid_mode = berth_drivers::PidMode::Private;
    config.user = Some("nobody".into());
    config.env.insert("TASK_VAR".into(), "from the task".into());
    rotated(&mut config, 2, 1);
    let root = config.dirs.as_ref().unwrap().task_dir.clone();
    std::fs::create_dir_all(root.join("local")).unwrap();
    let handle = driver.start(config.clone()).await.expect("start");
    reaper.track(&handle);
    common::wait_for_text(rotated_path(&config.stdout_path, 0), "up\n").await;

    let (out, err, code) = run(
        driver
            .exec(&config.id, request(&["ls", "/"]))
            .await
            .unwrap(),
        b"",
    )
    .await;
    let listing = String::from_utf8(out).unwrap();
    let names: Vec<&str> = listing.lines().collect();
    for want in ["alloc", "local", "secrets", "usr", "proc"] {
        assert!(names.contains(&want), "{want} in {names:?} ({err:?})");
    }
    // The host's own paths outside the chroot_env are not there.
    let host_only = tmp.path().file_name().unwrap().to_str().unwrap().to_owned();
    for absent in ["home", "root", "var", host_only.as_str()] {
        assert!(!names.contains(&absent), "{absent} in {names:?}");
    }
    assert_eq!(code, 0);

    let script = "id -un; echo $TASK_VAR; cat; echo err >&2; exit 3";
    let (out, err, code) = run(
        driver
            .exec(&config.id, request(&["sh", "-c", script]))
            .await
            .unwrap(),
        b"from stdin\n",
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&out),
        "nobody\nfrom the task\nfrom stdin\n"
    );
    assert_eq!(err, b"err\n");
    assert_eq!(code, 3);

    // In the task's PID namespace: its own processes only, the task's init first.
    let (out, _, _) = run(
        driver
            .exec(
                &config.id,
                request(&["sh", "-c", "echo $$; ls /proc | grep -c '^[0-9]'"]),
            )
            .await
            .unwrap(),
        b"",
    )
    .await;
    let text = String::from_utf8(out).unwrap();
    let mut lines = text.lines();
    let pid: u32 = lines.next().unwrap().parse().unwrap();
    let count: u32 = lines.next().unwrap().parse().unwrap();
    assert!(pid < 100 && count < 10, "{text}");

    // A terminal: the command's input and output are one, sized as asked.
    let mut on_tty = request(&["sh", "-c", "test -t 0 && test -t 1 && stty size"]);
    on_tty.tty = Some(TerminalSize { cols: 77, rows: 11 });
    let session = driver.exec(&config.id, on_tty).await.unwrap();
    assert!(session.stderr.is_none());
    let (out, _, code) = run(session, b"").await;
    assert_eq!(String::from_utf8_lossy(&out).trim(), "11 77");
    assert_eq!(code, 0);

    // A resize reaches the command's terminal.
    let mut resized = request(&["sh", "-c", "read line; stty size"]);
    resized.tty = Some(TerminalSize { cols: 80, rows: 24 });
    let session = driver.exec(&config.id, resized).await.unwrap();
    session
        .process
        .resize(TerminalSize {
            cols: 132,
            rows: 50,
        })
        .unwrap();
    let (out, _, code) = run(session, b"go\n").await;
    assert!(
        String::from_utf8_lossy(&out).ends_with("50 132\r\n"),
        "{out:?}"
    );
    assert_eq!(code, 0);

    // A program the task does not have.
    let (_, err, code) = run(
        driver
            .exec(&config.id, request(&["no-such-program"]))
            .await
            .unwrap(),
        b"",
    )
    .await;
    assert_ne!(code, 0);
    assert!(!err.is_empty());

    // Bad requests and stopped tasks are refused.
    let err = driver.exec(&config.id, request(&[])).await.unwrap_err();
    assert!(
        matches!(&err, DriverError::InvalidConfig { field, .. } if field == "exec"),
        "{err:?}"
    );
    driver.destroy(&config.id).await.unwrap();
    let err = driver.exec(&config.id, request(&["ls"])).await.unwrap_err();
    assert!(matches!(err, DriverError::NotFound { .. }), "{err:?}");
}

#[tokio::test]
async fn exec_into_raw_exec_runs_in_the_task_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let driver = RawExecDriver::new(EventSink::discard(), fast());
    let mut config = common::sh(tmp.path(), "rx", "exec sleep 1000");
    config.env.insert("TASK_VAR".into(), "raw".into());
    let handle = driver.start(config.clone()).await.expect("start");
    reaper.track(&handle);
    let (out, _, code) = run(
        driver
            .exec(
                &config.id,
                request(&["sh", "-c", "pwd; echo $TASK_VAR; exit 7"]),
            )
            .await
            .unwrap(),
        b"",
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&out),
        format!("{}\nraw\n", config.dir.display())
    );
    assert_eq!(code, 7);

    // A command killed by a signal reports 128 + its number, and what it left running goes.
    let session = driver
        .exec(
            &config.id,
            request(&["sh", "-c", "sleep 1000 & echo started; kill -9 $$"]),
        )
        .await
        .unwrap();
    let (out, _, code) = run(session, b"").await;
    assert_eq!(out, b"started\n");
    assert_eq!(code, 128 + 9);
    driver.destroy(&config.id).await.unwrap();
}
