//! `exec` with real processes and real mounts. Every mount is made inside the task's own
//! private mount namespace (the driver starts it with `unshare --mount --propagation
//! private`); the tests check that none shows in the test's namespace. Needs root.

mod common;

use std::{fs, path::Path, time::Duration};

use berth_drivers::{
    BindMount, CgroupSetting, Driver, DriverError, EventSink, ExecDriver, Health, PidMode, Signal,
    TaskEventKind, TaskState,
};
use berth_testkit::assert_eventually;
use common::{
    Reaper, TIMEOUT, alive,
    exec::{
        CgroupGuard, bind, cgroup_name, config, drain, in_root, is_root, mounted_at, notes, sh,
        task,
    },
    read,
};

/// Skips (with the reason printed) when not root.
macro_rules! require_root {
    () => {
        if !is_root() {
            eprintln!("SKIPPED: the exec driver needs root");
            return;
        }
    };
}

#[tokio::test]
async fn fingerprint_is_healthy_as_root() {
    require_root!();
    let driver = ExecDriver::new(EventSink::discard(), config(CgroupSetting::Disabled));
    let fp = driver.fingerprint().await;
    assert_eq!(fp.health, Health::Healthy, "{fp:?}");
    assert_eq!(fp.attributes["driver.exec"], "1");
    assert_eq!(fp.attributes["driver.exec.fs_isolation"], "chroot");
    assert!(fp.attributes["driver.exec.unshare"].ends_with("/unshare"));
    assert_eq!(fp.attributes["driver.exec.cgroup"], "disabled");
    assert_eq!(fp.attributes["driver.exec.devices_cgroup"], "disabled");
}

#[tokio::test]
async fn a_task_writes_through_its_bind_mount_and_the_mount_stays_private() {
    require_root!();
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let (sink, _events) = EventSink::channel();
    let driver = ExecDriver::new(sink, config(CgroupSetting::Disabled));

    let source = tmp.path().join("volume");
    fs::create_dir(&source).unwrap();
    fs::write(source.join("hello"), "from the host\n").unwrap();
    // The mount point does not exist yet: the driver creates it, in the task's root.
    let destination = tmp.path().join("task-view/data");
    let mut config = sh(
        tmp.path(),
        "writer",
        r#"cat "$1/hello" && echo "written by the task" > "$1/out" && echo ready && exec sleep 1000"#,
    );
    config
        .args
        .extend(["sh".into(), destination.display().to_string()]);
    config.mounts.push(bind(&source, &destination, false));

    let handle = driver.start(config.clone()).await.expect("start");
    reaper.track(&handle);
    common::wait_for_text(config.stdout_path.clone(), "ready").await;
    assert_eq!(
        read(&config.stdout_path),
        "from the host\nready\n",
        "stderr: {}",
        read(&config.stderr_path)
    );
    assert_eq!(read(source.join("out")), "written by the task\n");

    // The pid is the command's, in a mount namespace of its own that has the bind mount;
    // the test's namespace has neither.
    let comm = format!("/proc/{}/comm", handle.pid);
    assert_eventually!(
        TIMEOUT,
        || async { read(&comm).trim() == "sleep" },
        "the shell execs sleep; comm is {:?}",
        read(&comm)
    );
    assert_ne!(
        fs::read_link(format!("/proc/{}/ns/mnt", handle.pid)).unwrap(),
        fs::read_link("/proc/self/ns/mnt").unwrap()
    );
    let task_mountinfo = Path::new("/proc")
        .join(handle.pid.to_string())
        .join("mountinfo");
    let point = in_root(&config, &destination);
    // The task's mountinfo shows paths as the task sees them (from its root).
    assert!(mounted_at(&task_mountinfo, &destination));
    assert!(!mounted_at(Path::new("/proc/self/mountinfo"), &point));
    assert!(
        fs::read_dir(&point).unwrap().next().is_none(),
        "the host sees the empty mount point"
    );
    assert!(!destination.exists(), "nothing is made outside the root");

    driver.destroy(&config.id).await.unwrap();
    assert!(!alive(handle.pid));
    assert!(!mounted_at(Path::new("/proc/self/mountinfo"), &point));
}

#[tokio::test]
async fn paths_with_shell_syntax_are_passed_as_data() {
    require_root!();
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let driver = ExecDriver::new(EventSink::discard(), config(CgroupSetting::Disabled));
    let odd = r#"sp ace 'q" $(touch pwned) ;x `id` *"#;
    let source = tmp.path().join(format!("src {odd}"));
    fs::create_dir(&source).unwrap();
    let destination = tmp.path().join(format!("dst {odd}/-rf"));
    let mut config = sh(tmp.path(), "odd", r#"echo ok > "$1/written""#);
    config.dir = Path::new("/").join(format!("cwd {odd}"));
    config
        .args
        .extend(["sh".into(), destination.display().to_string()]);
    config.mounts.push(bind(&source, &destination, false));
    reaper.track(&driver.start(config.clone()).await.expect("start"));
    assert!(
        driver.wait(&config.id).await.unwrap().success(),
        "stderr: {}",
        read(&config.stderr_path)
    );
    assert_eq!(read(source.join("written")), "ok\n");
    for dir in [
        Path::new("/"),
        tmp.path(),
        &in_root(&config, Path::new("/")),
        &in_root(&config, &config.dir),
    ] {
        assert!(!dir.join("pwned").exists(), "nothing was run from a path");
    }
}

#[tokio::test]
async fn a_task_sees_only_its_root_runs_as_nobody_and_keeps_its_secrets() {
    require_root!();
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    // Something like an agent's data dir, outside every root.
    let data = tmp.path().join("data");
    fs::create_dir_all(&data).unwrap();
    fs::write(data.join("state.redb"), "not yours\n").unwrap();
    let own = tmp.path().join("volumes/own");
    fs::create_dir_all(&own).unwrap();
    fs::set_permissions(&own, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let driver = ExecDriver::new(EventSink::discard(), config(CgroupSetting::Disabled));
    let host_root_before: Vec<_> = fs::read_dir("/")
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();

    let script = r#"ls -A / | tr '\n' ' '; echo; id -u; cat "$1/state.redb" 2>/dev/null || echo hidden;
        for p in /x /etc/x /usr/x; do (echo x > "$p") 2>/dev/null && echo "$p written" || echo "$p refused"; done;
        echo s3cret > /secrets/token && cat /secrets/token; echo mine > /data/out;
        ls /proc | grep -c '^[0-9]'"#;
    let mut a = sh(tmp.path(), "a", script);
    a.args.extend(["sh".into(), data.display().to_string()]);
    a.user = None;
    a.pid_mode = PidMode::Private;
    a.mounts.push(bind(&own, Path::new("/data"), false));
    reaper.track(&driver.start(a.clone()).await.expect("start"));
    let exit = driver.wait(&a.id).await.unwrap();
    assert!(exit.success(), "{exit:?}: {}", read(&a.stderr_path));
    let out = read(&a.stdout_path);
    let lines: Vec<&str> = out.lines().collect();
    let mut entries: Vec<&str> = lines[0].split_whitespace().collect();
    entries.sort();
    for e in &entries {
        assert!(
            [
                "alloc", "bin", "data", "dev", "etc", "lib", "lib32", "lib64", "local", "proc",
                "run", "sbin", "secrets", "sys", "tmp", "usr"
            ]
            .contains(e),
            "the task sees /{e}: {entries:?}"
        );
    }
    assert_eq!(lines[1], "65534", "nobody, as Nomad's exec");
    assert_eq!(lines[2], "hidden");
    assert_eq!(
        lines[3..6],
        ["/x refused", "/etc/x refused", "/usr/x refused"]
    );
    assert_eq!(lines[6], "s3cret");
    let pids: usize = lines[7].parse().unwrap();
    assert!(
        pids < 5,
        "a PID namespace of its own shows a few processes, not {pids}"
    );
    assert_eq!(read(own.join("out")), "mine\n");
    // The secret lived in the task's tmpfs: not on the host's disk.
    assert!(!in_root(&a, Path::new("/secrets/token")).exists());
    // A second task of the same alloc cannot read the first one's secrets.
    let mut b = sh(
        tmp.path(),
        "b",
        r#"cat /secrets/token 2>/dev/null; cat "$1" 2>/dev/null; echo end"#,
    );
    b.args.extend([
        "sh".into(),
        in_root(&a, Path::new("/secrets/token"))
            .display()
            .to_string(),
    ]);
    reaper.track(&driver.start(b.clone()).await.expect("start b"));
    assert!(driver.wait(&b.id).await.unwrap().success());
    assert_eq!(read(&b.stdout_path), "end\n");
    let host_root_after: Vec<_> = fs::read_dir("/")
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        host_root_before.len(),
        host_root_after.len(),
        "the host's / changed"
    );
}

#[tokio::test]
async fn secrets_written_before_the_start_reach_the_task_as_its_own_files() {
    require_root!();
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let driver = ExecDriver::new(EventSink::discard(), config(CgroupSetting::Disabled));
    let mut t = sh(
        tmp.path(),
        "proxy",
        "stat -c '%a %u' /secrets/si_token; cat /secrets/si_token; echo; echo more > /secrets/other",
    );
    t.user = None;
    // What the agent's si_token hook does before a start: a 0440 root file in the root's
    // `secrets/` directory (0700, root's).
    let root = in_root(&t, Path::new("/"));
    let secrets = root.join("secrets");
    fs::create_dir_all(&secrets).unwrap();
    berth_sys::write_file_beneath(
        &root,
        Path::new("secrets"),
        "si_token",
        b"token-value",
        0o440,
    )
    .unwrap();
    reaper.track(&driver.start(t.clone()).await.expect("start"));
    let exit = driver.wait(&t.id).await.unwrap();
    assert!(exit.success(), "{exit:?}: {}", read(&t.stderr_path));
    assert_eq!(
        read(&t.stdout_path),
        "440 65534\ntoken-value\n",
        "{}",
        read(&t.stderr_path)
    );
    // What the task writes stays in its tmpfs; the host copy is left as it was.
    assert!(!secrets.join("other").exists());
    assert_eq!(read(secrets.join("si_token")), "token-value");
}

#[tokio::test]
async fn sigterm_reaches_a_command_under_its_own_pid_1() {
    require_root!();
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let driver = ExecDriver::new(EventSink::discard(), config(CgroupSetting::Disabled));
    let mut config = task(tmp.path(), "sleeper", "sleep", &["1000"]);
    config.pid_mode = PidMode::Private;
    let handle = driver.start(config.clone()).await.expect("start");
    reaper.track(&handle);
    let started = std::time::Instant::now();
    driver
        .stop(&config.id, Duration::from_secs(20), Signal::SIGTERM)
        .await
        .unwrap();
    let exit = driver.wait(&config.id).await.unwrap();
    assert_ne!(exit.signal, Some(Signal::SIGKILL as i32), "{exit:?}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "SIGTERM was not passed on"
    );
    let mut failing = sh(tmp.path(), "failing", "exit 7");
    failing.pid_mode = PidMode::Private;
    reaper.track(&driver.start(failing.clone()).await.unwrap());
    assert_eq!(driver.wait(&failing.id).await.unwrap().exit_code, Some(7));
}

#[tokio::test]
async fn a_read_only_mount_refuses_writes() {
    require_root!();
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let driver = ExecDriver::new(EventSink::discard(), config(CgroupSetting::Disabled));
    let source = tmp.path().join("ro-src");
    fs::create_dir(&source).unwrap();
    fs::write(source.join("existing"), "keep\n").unwrap();
    let file_source = tmp.path().join("single-file");
    fs::write(&file_source, "one file\n").unwrap();
    let destination = tmp.path().join("ro-dst");
    let file_destination = tmp.path().join("files/mounted-file");

    let mut config = sh(
        tmp.path(),
        "reader",
        r#"cat "$1/existing" "$2"; echo new > "$1/new"; echo "status $?""#,
    );
    config.args.extend([
        "sh".into(),
        destination.display().to_string(),
        file_destination.display().to_string(),
    ]);
    config.mounts.push(bind(&source, &destination, true));
    config
        .mounts
        .push(bind(&file_source, &file_destination, false));
    reaper.track(&driver.start(config.clone()).await.expect("start"));
    assert!(driver.wait(&config.id).await.unwrap().success());
    assert_eq!(read(&config.stdout_path), "keep\none file\nstatus 2\n");
    assert!(
        read(&config.stderr_path).contains("Read-only file system"),
        "EROFS expected, stderr: {}",
        read(&config.stderr_path)
    );
    assert!(!source.join("new").exists());
    assert_eq!(
        read(in_root(&config, &file_destination)),
        "",
        "the host sees the empty file mount point"
    );
}

#[tokio::test]
async fn set_up_failures_fail_start_and_leave_nothing_running() {
    require_root!();
    let tmp = tempfile::tempdir().unwrap();
    let driver = ExecDriver::new(EventSink::discard(), config(CgroupSetting::Disabled));

    let missing = task(tmp.path(), "nocmd", "berth-no-such-command", &[]);
    let err = driver.start(missing.clone()).await.unwrap_err();
    match &err {
        DriverError::Setup { message, .. } => {
            assert!(
                message.contains("command not found in the task's root: berth-no-such-command"),
                "{message}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        driver.inspect(&missing.id),
        Err(DriverError::NotFound { .. })
    ));

    // A directory cannot be bind-mounted over a file, nor through a symlink a task left.
    let source = tmp.path().join("dir");
    fs::create_dir(&source).unwrap();
    let mut config = task(tmp.path(), "badmount", "true", &[]);
    let file = Path::new("/a-file");
    fs::create_dir_all(in_root(&config, Path::new("/"))).unwrap();
    fs::write(in_root(&config, file), "").unwrap();
    std::os::unix::fs::symlink(tmp.path(), in_root(&config, Path::new("/link"))).unwrap();
    config.mounts.push(bind(&source, file, false));
    match driver.start(config.clone()).await.unwrap_err() {
        DriverError::InvalidConfig { field, reason, .. } => {
            assert_eq!(field, "mounts[0].destination");
            assert!(reason.contains("is not a directory"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    config.mounts = vec![bind(&source, Path::new("/link/x"), false)];
    match driver.start(config.clone()).await.unwrap_err() {
        DriverError::InvalidConfig { reason, .. } => {
            assert!(reason.contains("is a symlink"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert!(!tmp.path().join("x").exists());
    // A destination inside a read-only chroot_env entry would write to the host: refused.
    config.mounts = vec![bind(&source, Path::new("/usr/berth-x"), false)];
    assert!(matches!(
        driver.start(config.clone()).await,
        Err(DriverError::InvalidConfig { field, .. }) if field == "mounts[0].destination"
    ));
    assert!(!Path::new("/usr/berth-x").exists());

    let mut config = task(tmp.path(), "nosource", "true", &[]);
    config.mounts.push(bind(
        &tmp.path().join("absent"),
        &tmp.path().join("x"),
        false,
    ));
    assert!(matches!(
        driver.start(config).await,
        Err(DriverError::InvalidConfig { field, .. }) if field == "mounts[0].source"
    ));
}

#[tokio::test]
async fn stop_and_signal_work_as_for_raw_exec() {
    require_root!();
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let (sink, mut events) = EventSink::channel();
    let driver = ExecDriver::new(sink, config(CgroupSetting::Disabled));
    let config = sh(
        tmp.path(),
        "stubborn",
        r#"trap "" TERM; echo ready; sleep 1000 & wait"#,
    );
    let handle = driver.start(config.clone()).await.unwrap();
    reaper.track(&handle);
    common::wait_for_text(config.stdout_path.clone(), "ready").await;
    driver
        .stop(&config.id, Duration::from_millis(200), Signal::SIGTERM)
        .await
        .unwrap();
    assert_eq!(
        driver.wait(&config.id).await.unwrap().signal,
        Some(Signal::SIGKILL as i32)
    );
    let kinds: Vec<_> =
        common::events_until(&mut events, |k| matches!(k, TaskEventKind::Exited { .. }))
            .await
            .into_iter()
            .filter(|k| *k != TaskEventKind::Note)
            .collect();
    assert_eq!(kinds.len(), 4, "{kinds:?}");
    assert_eq!(kinds[2], TaskEventKind::Killed);
}

#[tokio::test]
async fn each_task_gets_its_own_cgroup_when_the_host_has_cgroup_v2() {
    require_root!();
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let name = cgroup_name("grouped");
    let (sink, mut events) = EventSink::channel();
    let driver = ExecDriver::new(sink, config(CgroupSetting::Auto { name: name.clone() }));
    let fp = driver.fingerprint().await;
    let _guard = CgroupGuard::of(&fp);
    assert_eq!(fp.health, Health::Healthy, "{fp:?}");
    let cgroup_attr = fp.attributes["driver.exec.cgroup"].clone();
    if let Some(reason) = cgroup_attr.strip_prefix("unavailable: ") {
        eprintln!("SKIPPED: no cgroup v2 for tasks on this host: {reason}");
        return;
    }
    let parent = std::path::PathBuf::from(&cgroup_attr);
    assert!(parent.ends_with(&name));
    // With the cgroup v1 devices controller, a devices cgroup too.
    let devices_parent = fp.attributes["driver.exec.devices_cgroup"].clone();
    let devices_dir = devices_parent
        .starts_with('/')
        .then(|| std::path::PathBuf::from(&devices_parent).join("grouped"));
    let memory = fp.attributes["driver.exec.cgroup.memory"].clone();

    let mut config = sh(tmp.path(), "grouped", "echo ready; exec sleep 1000");
    config.resources.memory_max_bytes = Some(64 << 20);
    let handle = driver.start(config.clone()).await.expect("start");
    let started = common::next_event(&mut events).await;
    assert_eq!(started.kind, TaskEventKind::Started { pid: handle.pid });
    let notes = notes(&drain(&mut events));
    reaper.track(&handle);
    let dir = handle.cgroup.clone().expect("a cgroup");
    assert_eq!(dir, parent.join("grouped"));
    let procs = read(dir.join("cgroup.procs"));
    assert_eq!(
        procs.trim(),
        handle.pid.to_string(),
        "the task joined before exec"
    );
    let own = read(format!("/proc/{}/cgroup", handle.pid));
    assert!(
        own.lines()
            .any(|l| l.starts_with("0::/") && l.ends_with(&format!("/{name}/grouped"))),
        "{own}"
    );
    if memory == "enabled" {
        assert_eq!(
            read(dir.join("memory.max")).trim(),
            (64u64 << 20).to_string()
        );
    } else {
        // The task runs without the limit, and says so in a note of its own.
        assert!(
            notes
                .iter()
                .any(|n| n.starts_with("memory limit not applied")),
            "{notes:?}"
        );
        eprintln!("SKIPPED (memory.max part): {memory}");
    }
    let stats = driver.stats(&config.id).await.unwrap();
    assert_eq!(stats.pids, vec![handle.pid]);
    match &devices_dir {
        Some(dev) => assert_eq!(
            read(dev.join("cgroup.procs")).trim(),
            handle.pid.to_string()
        ),
        None => eprintln!("SKIPPED (devices cgroup part): {devices_parent}"),
    }

    driver.destroy(&config.id).await.expect("destroy");
    assert!(!dir.exists(), "destroy removes the cgroup");
    if let Some(dev) = &devices_dir {
        assert!(!dev.exists(), "destroy removes the devices cgroup");
    }
    assert!(!alive(handle.pid));
}

#[tokio::test]
async fn destroy_kills_processes_that_left_the_group_through_the_cgroup() {
    require_root!();
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let name = cgroup_name("escaper");
    let driver = ExecDriver::new(
        EventSink::discard(),
        config(CgroupSetting::Auto { name: name.clone() }),
    );
    let fp = driver.fingerprint().await;
    let _guard = CgroupGuard::of(&fp);
    let cgroup_attr = fp.attributes["driver.exec.cgroup"].clone();
    if let Some(reason) = cgroup_attr.strip_prefix("unavailable: ") {
        eprintln!("SKIPPED: no cgroup v2 for tasks on this host: {reason}");
        return;
    }
    // setsid puts the sleep in a session (and group) of its own: only the cgroup finds it.
    let config = sh(
        tmp.path(),
        "escaper",
        r#"setsid sleep 1000 & echo "escaped $!"; wait"#,
    );
    let handle = driver.start(config.clone()).await.unwrap();
    reaper.track(&handle);
    common::wait_for_text(config.stdout_path.clone(), "escaped ").await;
    let dir = handle.cgroup.clone().unwrap();
    assert_eventually!(
        TIMEOUT,
        || async { read(dir.join("cgroup.procs")).lines().count() == 2 },
        "both processes are in the cgroup"
    );
    let escaped: Vec<u32> = read(dir.join("cgroup.procs"))
        .lines()
        .map(|l| l.parse().unwrap())
        .filter(|&p| p != handle.pid)
        .collect();
    driver.destroy(&config.id).await.unwrap();
    assert!(!dir.exists());
    for pid in escaped {
        assert!(!alive(pid), "pid {pid} was killed through the cgroup");
    }
    assert_eq!(
        driver.inspect(&config.id).map(|s| s.state).ok(),
        None::<TaskState>
    );
}

#[tokio::test]
async fn a_new_exec_driver_recovers_the_task_with_its_cgroup() {
    require_root!();
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let name = cgroup_name("recover");
    let setting = CgroupSetting::Auto { name: name.clone() };
    let first = ExecDriver::new(EventSink::discard(), config(setting.clone()));
    let fp = first.fingerprint().await;
    let cgroup_attr = fp.attributes["driver.exec.cgroup"].clone();
    let _guard = CgroupGuard::of(&fp);
    let devices_parent = fp.attributes["driver.exec.devices_cgroup"].clone();
    let source = tmp.path().join("src");
    fs::create_dir(&source).unwrap();
    let mut config = sh(tmp.path(), "kept", "echo ready; exec sleep 1000");
    config
        .mounts
        .push(bind(&source, &tmp.path().join("dst"), false));
    let handle = first.start(config.clone()).await.unwrap();
    reaper.track(&handle);
    let devices_dir = devices_parent
        .starts_with('/')
        .then(|| std::path::PathBuf::from(&devices_parent).join("kept"));
    if let Some(dev) = &devices_dir {
        assert!(dev.is_dir(), "the task has a devices cgroup");
    }
    first.shutdown().await;
    drop(first);

    let second = ExecDriver::new(EventSink::discard(), self::config(setting));
    second.recover(handle.clone()).await.expect("recover");
    // Paths as the task sees them, once it is in its root.
    let task_mountinfo = Path::new("/proc")
        .join(handle.pid.to_string())
        .join("mountinfo");
    let dst = tmp.path().join("dst");
    assert_eventually!(TIMEOUT, || async { mounted_at(&task_mountinfo, &dst) });
    second.destroy(&config.id).await.unwrap();
    assert!(!alive(handle.pid));
    if let Some(dir) = &handle.cgroup {
        assert!(!dir.exists(), "the recovered task's cgroup is removed");
    } else {
        eprintln!("SKIPPED (cgroup part): {cgroup_attr}");
    }
    match &devices_dir {
        // Not in the handle: found again from the task id.
        Some(dev) => assert!(
            !dev.exists(),
            "the recovered task's devices cgroup is removed"
        ),
        None => eprintln!("SKIPPED (devices cgroup part): {devices_parent}"),
    }
}

#[tokio::test]
async fn a_bidirectional_mount_carries_mounts_both_ways_and_nothing_else_leaks() {
    require_root!();
    if !berth_testkit::in_own_mount_namespace(
        "a_bidirectional_mount_carries_mounts_both_ways_and_nothing_else_leaks",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let driver = ExecDriver::new(EventSink::discard(), config(CgroupSetting::Disabled));
    let root = tmp.path().join("plugin-root");
    let other = tmp.path().join("other-shared");
    let plain = tmp.path().join("plain");
    for d in [&root, &other, &plain] {
        fs::create_dir(d).unwrap();
    }
    fs::create_dir(other.join("inside")).unwrap();
    // Not shared yet: refused, nothing runs.
    let view = tmp.path().join("task/root");
    let mut refused = sh(tmp.path(), "refused", "exec sleep 1000");
    refused.mounts.push(BindMount {
        propagation: berth_drivers::Propagation::Bidirectional,
        ..bind(&root, &view, false)
    });
    match driver.start(refused).await {
        Err(DriverError::InvalidConfig { field, reason, .. }) => {
            assert_eq!(field, "mounts[0].propagation");
            assert!(reason.contains("shared mount"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    berth_sys::ensure_shared_mount(&root).unwrap();
    berth_sys::ensure_shared_mount(&other).unwrap();

    let plain_view = tmp.path().join("task/plain");
    let mut config = sh(
        tmp.path(),
        "plugin",
        r#"mkdir -p "$1/sub" && mount -t tmpfs from-task "$1/sub" && echo hi > "$1/sub/f" &&
           mkdir -p "$2/x" && mount -t tmpfs private-1 "$2/x" &&
           mount -t tmpfs private-2 /tmp && echo ready && exec sleep 1000"#,
    );
    config.privileged = true;
    config.args.extend([
        "sh".into(),
        view.display().to_string(),
        plain_view.display().to_string(),
    ]);
    config.mounts.push(BindMount {
        propagation: berth_drivers::Propagation::Bidirectional,
        ..bind(&root, &view, false)
    });
    config.mounts.push(bind(&plain, &plain_view, false));
    let handle = driver.start(config.clone()).await.expect("start");
    reaper.track(&handle);
    common::wait_for_text(config.stdout_path.clone(), "ready").await;

    // Task to host: its mount under the bidirectional one shows at the host's root…
    let host = Path::new("/proc/self/mountinfo");
    assert!(mounted_at(host, &root.join("sub")));
    assert_eq!(read(root.join("sub/f")), "hi\n");
    // …and nowhere else: not under a plain bind, not under another shared mount, and the
    // bind mounts themselves stay in the task.
    for p in [
        &plain.join("x"),
        &other.join("inside"),
        &in_root(&config, &view),
        &in_root(&config, &plain_view),
        &in_root(&config, Path::new("/tmp")),
    ] {
        assert!(!mounted_at(host, p), "{} leaked to the host", p.display());
    }
    // Host to task: a mount made on the host under the root shows in the task, and its
    // unmount too.
    let task_mountinfo = Path::new("/proc")
        .join(handle.pid.to_string())
        .join("mountinfo");
    fs::create_dir(root.join("from-host")).unwrap();
    nix::mount::mount(
        Some("from-host"),
        &root.join("from-host"),
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
    assert!(mounted_at(&task_mountinfo, &view.join("from-host")));
    nix::mount::umount(&root.join("sub")).unwrap();
    assert!(!mounted_at(&task_mountinfo, &view.join("sub")));

    driver.destroy(&config.id).await.unwrap();
    assert!(!alive(handle.pid));
}
