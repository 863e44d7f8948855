//! Device nodes in `exec` tasks, and their devices cgroup (cgroup v1 `devices` controller),
//! with real processes, real device nodes (made with mknod in temp dirs) and real mounts, each
//! made inside the task's own mount namespace. Needs root.

mod common;

use std::{
    fs,
    path::{Path, PathBuf},
    time::Duration,
};

use berth_drivers::{
    CgroupSetting, DevicesCgroupSetting, Driver, DriverError, EventSink, ExecDriver, PidMode,
    ProcessConfig, RawExecDriver, TaskConfig, TaskDevice, TaskEvent, TaskEventKind,
};
use common::{
    Reaper, alive,
    exec::{
        CgroupGuard, bind, cgroup_name, config_with, drain, in_root, is_root, mknod_block,
        mknod_char, notes, sh,
    },
    read,
};
use tokio::sync::mpsc::UnboundedReceiver;

/// Skips (with the reason printed) when not root.
macro_rules! require_root {
    () => {
        if !is_root() {
            eprintln!("SKIPPED: the exec driver needs root");
            return;
        }
    };
}

/// An `exec` driver without cgroup v2 whose tasks get devices cgroups under a name of the
/// test's, its events, the devices cgroup parent (`None` when the host has no devices
/// controller: the reason is printed), and a guard removing that parent.
async fn driver(
    test: &str,
) -> (
    ExecDriver,
    UnboundedReceiver<TaskEvent>,
    Option<PathBuf>,
    CgroupGuard,
) {
    let (sink, events) = EventSink::channel();
    let driver = ExecDriver::new(
        sink,
        config_with(
            CgroupSetting::Disabled,
            DevicesCgroupSetting::Auto {
                name: cgroup_name(test),
            },
        ),
    );
    let fp = driver.fingerprint().await;
    let guard = CgroupGuard::of(&fp);
    let attr = &fp.attributes["driver.exec.devices_cgroup"];
    let parent = attr.starts_with('/').then(|| PathBuf::from(attr));
    match &parent {
        Some(parent) => assert!(parent.ends_with(cgroup_name(test)), "{attr}"),
        None => eprintln!("SKIPPED (devices cgroup parts): {attr}"),
    }
    (driver, events, parent, guard)
}

fn device(host_path: &Path, task_path: &str, permissions: &str) -> TaskDevice {
    TaskDevice {
        host_path: host_path.to_path_buf(),
        task_path: task_path.into(),
        permissions: permissions.into(),
    }
}

/// The devices cgroup line of `/proc/<pid>/cgroup` (its path), if any.
fn devices_cgroup_of(pid: &str) -> Option<String> {
    read(format!("/proc/{pid}/cgroup")).lines().find_map(|l| {
        let mut fields = l.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        controllers
            .split(',')
            .any(|c| c == "devices")
            .then(|| path.to_owned())
    })
}

#[tokio::test]
async fn a_task_uses_its_device_nodes_as_allowed_and_no_other() {
    require_root!();
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let (driver, mut events, parent, _guard) = driver("widget").await;
    // A copy of /dev/urandom, and of a loop device (not in the list every task gets).
    let widget = tmp.path().join("widget");
    mknod_char(&widget, 1, 9);
    let disk = tmp.path().join("disk");
    mknod_block(&disk, 7, 0);
    let script = r#"test -c /dev/widget0 && echo "char node"
        head -c 16 /dev/widget0 | wc -c
        (exec 3</dev/blk/disk) && echo "disk opened for reading"
        (exec 3>/dev/blk/disk) 2>&1
        (exec 3>/local/other) 2>&1
        (exec 3</local/other) 2>&1
        head -c 3 /dev/zero | wc -c
        echo ready; exec sleep 1000"#;
    let mut config = sh(tmp.path(), "user", script);
    config.pid_mode = PidMode::Private;
    config.devices = vec![
        device(&widget, "/dev/widget0", "rw"),
        device(&disk, "/dev/blk/disk", "r"),
    ];
    // A node the task was not given, made in its root as root: only the cgroup keeps it out.
    let other = in_root(&config, Path::new("/local/other"));
    fs::create_dir_all(other.parent().unwrap()).unwrap();
    mknod_block(&other, 7, 1);

    let handle = driver.start(config.clone()).await.expect("start");
    reaper.track(&handle);
    let sent = drain(&mut events);
    assert_eq!(sent[0].kind, TaskEventKind::Started { pid: handle.pid });
    common::wait_for_text(config.stdout_path.clone(), "ready").await;
    let out = read(&config.stdout_path);
    let lines: Vec<&str> = out.lines().map(str::trim).collect();
    assert_eq!(lines[0], "char node", "{out}");
    assert_eq!(lines[1], "16", "read from its node: {out}");
    assert_eq!(lines[2], "disk opened for reading", "{out}");
    let Some(parent) = parent else { return };
    let denied = |line: &str, path: &str| {
        assert!(
            line.contains(path) && line.contains("Operation not permitted"),
            "{path} must be refused: {out}"
        )
    };
    denied(lines[3], "/dev/blk/disk");
    denied(lines[4], "/local/other");
    denied(lines[5], "/local/other");
    assert_eq!(lines[6], "3", "the usual devices work: {out}");

    let dir = parent.join("user");
    let list = read(dir.join("devices.list"));
    let rules: Vec<&str> = list.lines().collect();
    for rule in [
        "c *:* m",
        "b *:* m",
        "c 1:3 rwm",
        "c 5:2 rwm",
        "c 136:* rwm",
        "c 1:9 rwm",
        "b 7:0 r",
    ] {
        assert!(rules.contains(&rule), "{rule} missing: {list}");
    }
    assert!(!list.contains("a *:*"), "{list}");
    assert!(!list.contains("b 7:1"), "{list}");
    // Every process of the task is in it (the set-up joined it before mounting anything).
    let procs = read(dir.join("cgroup.procs"));
    assert!(!procs.trim().is_empty());
    for pid in procs.lines() {
        let path = devices_cgroup_of(pid).expect("a devices line");
        assert!(
            path.ends_with(&format!("/{}/user", cgroup_name("widget"))),
            "{path}"
        );
    }
    // The mount points were made in the task's own /dev, not in its directory.
    assert!(!in_root(&config, Path::new("/dev/widget0")).exists());
    assert!(!in_root(&config, Path::new("/dev/blk")).exists());
    // One note per fact, right after `Started`.
    let canonical = |p: &Path| fs::canonicalize(p).unwrap().display().to_string();
    assert_eq!(
        notes(&sent),
        [
            "no cgroup: disabled".to_owned(),
            format!(
                "device nodes: /dev/widget0 (c 1:9) bound from {}",
                canonical(&widget)
            ),
            format!(
                "device nodes: /dev/blk/disk (b 7:0) bound from {}",
                canonical(&disk)
            ),
            "devices cgroup: allowed c 1:9 rw for /dev/widget0".to_owned(),
            "devices cgroup: allowed b 7:0 r for /dev/blk/disk".to_owned(),
        ]
    );
    assert!(sent[1..].iter().all(|e| e.kind == TaskEventKind::Note));

    driver.destroy(&config.id).await.expect("destroy");
    assert!(!alive(handle.pid));
    assert!(!dir.exists(), "destroy removes the devices cgroup");
}

#[tokio::test]
async fn device_nodes_and_bind_mounts_together() {
    require_root!();
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let (sink, mut events) = EventSink::channel();
    // No devices cgroup: the nodes are bound all the same, and a note says access is open.
    let driver = ExecDriver::new(
        sink,
        config_with(CgroupSetting::Disabled, DevicesCgroupSetting::Disabled),
    );
    let volume = tmp.path().join("volume");
    fs::create_dir(&volume).unwrap();
    fs::write(volume.join("hello"), "from the volume\n").unwrap();
    let widget = tmp.path().join("widget");
    mknod_char(&widget, 1, 9);
    let zero = tmp.path().join("zero");
    mknod_char(&zero, 1, 5);
    let script = r#"cat /data/hello
        (echo x > /data/new) 2>/dev/null || echo "volume read-only"
        test -c /opt/devs/widget && head -c 4 /opt/devs/widget | wc -c
        test -c /dev/sub/zero && head -c 2 /dev/sub/zero | wc -c"#;
    let mut config = sh(tmp.path(), "together", script);
    config.mounts.push(bind(&volume, Path::new("/data"), true));
    config.devices = vec![
        device(&widget, "/opt/devs/widget", "r"),
        device(&zero, "/dev/sub/zero", "rw"),
    ];
    reaper.track(&driver.start(config.clone()).await.expect("start"));
    let exit = driver.wait(&config.id).await.unwrap();
    assert!(exit.success(), "{exit:?}: {}", read(&config.stderr_path));
    let out: Vec<String> = read(&config.stdout_path)
        .lines()
        .map(|l| l.trim().to_owned())
        .collect();
    assert_eq!(out, ["from the volume", "volume read-only", "4", "2"]);
    assert!(!volume.join("new").exists());
    // The node outside /dev has its mount point in the root; nothing is made elsewhere.
    let point = in_root(&config, Path::new("/opt/devs/widget"));
    assert!(point.is_file() && fs::metadata(&point).unwrap().len() == 0);
    assert!(!in_root(&config, Path::new("/dev/sub")).exists());
    assert!(!Path::new("/opt/devs/widget").exists());
    let notes = notes(&drain(&mut events));
    assert!(
        notes.contains(&"devices cgroup: disabled: device access is not restricted".to_owned()),
        "{notes:?}"
    );
}

#[tokio::test]
async fn bad_devices_are_refused_by_field_and_leave_nothing_behind() {
    require_root!();
    let tmp = tempfile::tempdir().unwrap();
    let (driver, _events, parent, _guard) = driver("bad").await;
    let widget = tmp.path().join("widget");
    mknod_char(&widget, 1, 9);
    let file = tmp.path().join("plain-file");
    fs::write(&file, "not a device\n").unwrap();
    let volume = tmp.path().join("volume");
    fs::create_dir(&volume).unwrap();

    let cases: Vec<(Vec<TaskDevice>, bool, &str, &str)> = vec![
        (
            vec![device(&widget, "dev/widget", "r")],
            false,
            "devices[0].task_path",
            "not an absolute path",
        ),
        (
            vec![device(Path::new("widget"), "/dev/widget", "r")],
            false,
            "devices[0].host_path",
            "not an absolute path",
        ),
        (
            vec![device(&widget, "/dev/a/../widget", "r")],
            false,
            "devices[0].task_path",
            "'..'",
        ),
        (
            vec![device(&file, "/opt/plain", "r")],
            false,
            "devices[0].host_path",
            "not a character or block device",
        ),
        (
            vec![device(&tmp.path().join("absent"), "/opt/absent", "r")],
            false,
            "devices[0].host_path",
            "No such file",
        ),
        (
            vec![device(&widget, "/dev/widget", "x")],
            false,
            "devices[0].permissions",
            "not one of r, w, m",
        ),
        (
            vec![device(&widget, "/proc/widget", "r")],
            false,
            "devices[0].task_path",
            "lies in /proc",
        ),
        (
            vec![device(&widget, "/alloc/widget", "r")],
            false,
            "devices[0].task_path",
            "lies in /alloc",
        ),
        (
            vec![device(&widget, "/usr/widget", "r")],
            false,
            "devices[0].task_path",
            "lies in /usr",
        ),
        (
            vec![device(&widget, "/dev/fd/9", "r")],
            false,
            "devices[0].task_path",
            "lies in /dev/fd",
        ),
        (
            vec![device(&widget, "/dev", "r")],
            false,
            "devices[0].task_path",
            "/dev itself",
        ),
        (
            vec![
                device(&widget, "/dev/widget", "r"),
                device(&widget, "/dev/./widget", "rw"),
            ],
            false,
            "devices[1].task_path",
            "also devices[0].task_path",
        ),
        // The first device is fine: its mount point is not made, as the second is refused.
        (
            vec![
                device(&widget, "/opt/good", "r"),
                device(&file, "/opt/bad", "r"),
            ],
            false,
            "devices[1].host_path",
            "not a character or block device",
        ),
        (
            vec![device(&widget, "/data/widget", "r")],
            false,
            "devices[0].task_path",
            "lies in mounts[0].destination /data",
        ),
        // A privileged task's /dev is the host's: nothing may be made there.
        (
            vec![device(&widget, "/dev/widget", "r")],
            true,
            "devices[0].task_path",
            "keeps its host path",
        ),
    ];
    for (devices, privileged, field, reason) in cases {
        let mut config = sh(tmp.path(), "bad", "exit 0");
        config.mounts.push(bind(&volume, Path::new("/data"), false));
        config.devices = devices.clone();
        config.privileged = privileged;
        match driver.start(config.clone()).await {
            Err(DriverError::InvalidConfig {
                field: got,
                reason: why,
                ..
            }) => {
                assert_eq!(got, field, "{devices:?}: {why}");
                assert!(why.contains(reason), "{devices:?}: {why}");
            }
            other => panic!("{devices:?} must be refused: {other:?}"),
        }
        assert!(matches!(
            driver.inspect(&config.id),
            Err(DriverError::NotFound { .. })
        ));
        if let Some(parent) = &parent {
            assert!(!parent.join("bad").exists(), "{devices:?} left a cgroup");
        }
        for p in ["/opt", "/widget", "/dev/widget", "/data/widget"] {
            assert!(
                !in_root(&config, Path::new(p)).exists(),
                "{devices:?} made {p} in the root"
            );
        }
        assert!(!config.stdout_path.exists(), "{devices:?}: nothing ran");
    }
    for p in ["/opt/plain", "/opt/good", "/dev/widget", "/usr/widget"] {
        assert!(!Path::new(p).exists(), "{p} made on the host");
    }
}

#[tokio::test]
async fn a_failed_set_up_removes_the_devices_cgroup() {
    require_root!();
    let tmp = tempfile::tempdir().unwrap();
    let name = cgroup_name("setup");
    let mut exec = config_with(
        CgroupSetting::Disabled,
        DevicesCgroupSetting::Auto { name: name.clone() },
    );
    // The set-up cannot say it is ready in no time: the start fails once it has begun.
    exec.setup_timeout = Duration::ZERO;
    let driver = ExecDriver::new(EventSink::discard(), exec);
    let fp = driver.fingerprint().await;
    let _guard = CgroupGuard::of(&fp);
    let attr = &fp.attributes["driver.exec.devices_cgroup"];
    if !attr.starts_with('/') {
        eprintln!("SKIPPED: {attr}");
        return;
    }
    let widget = tmp.path().join("widget");
    mknod_char(&widget, 1, 9);
    let mut config = sh(tmp.path(), "slow", "exec sleep 1000");
    config.devices = vec![device(&widget, "/dev/widget", "r")];
    match driver.start(config.clone()).await {
        Err(DriverError::Setup { message, .. }) => {
            assert!(message.contains("did not finish"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    assert!(!Path::new(attr).join("slow").exists());
}

#[tokio::test]
async fn a_recovered_task_loses_its_devices_cgroup_on_destroy() {
    require_root!();
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let (first, _events, parent, _guard) = driver("recover").await;
    let Some(parent) = parent else { return };
    let widget = tmp.path().join("widget");
    mknod_char(&widget, 1, 9);
    let mut config = sh(tmp.path(), "kept", "echo ready; exec sleep 1000");
    config.devices = vec![device(&widget, "/dev/widget", "r")];
    // A left-over empty devices cgroup of the id (a crash) is reused.
    let dir = parent.join("kept");
    fs::create_dir(&dir).unwrap();
    let handle = first.start(config.clone()).await.expect("start");
    reaper.track(&handle);
    assert_eq!(
        read(dir.join("cgroup.procs")).trim(),
        handle.pid.to_string()
    );
    first.shutdown().await;
    drop(first);

    // A new agent: another driver instance with the same settings.
    let (second, mut events, _, _second_guard) = driver("recover").await;
    // One with processes in it is not taken over by a new start of the id.
    match second.start(config.clone()).await {
        Err(DriverError::Cgroup { path, source, .. }) => {
            assert_eq!(path, dir);
            assert!(source.to_string().contains("holds processes"), "{source}");
        }
        other => panic!("{other:?}"),
    }
    assert!(alive(handle.pid));
    second.recover(handle.clone()).await.expect("recover");
    assert_eq!(
        common::next_event(&mut events).await.kind,
        TaskEventKind::Recovered { pid: handle.pid }
    );
    let stats = second.stats(&config.id).await.unwrap();
    assert_eq!(
        stats.pids,
        vec![handle.pid],
        "counted through the devices cgroup"
    );
    second.destroy(&config.id).await.expect("destroy");
    assert!(!alive(handle.pid));
    assert!(!dir.exists(), "found from the task id, and removed");
}

#[tokio::test]
async fn under_a_restricted_agent_usual_devices_are_left_out_and_own_ones_refused() {
    require_root!();
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let (driver, mut events, parent, _guard) = driver("restricted").await;
    let Some(parent) = parent else { return };
    // As when the agent itself runs in a container: its devices cgroup lacks some devices.
    for rule in ["c 5:1 rwm", "c 1:9 rwm"] {
        fs::write(parent.join("devices.deny"), rule).unwrap();
    }
    let widget = tmp.path().join("widget");
    mknod_char(&widget, 1, 9);
    let mut config = sh(tmp.path(), "restricted", "echo ready; exec sleep 1000");
    config.devices = vec![device(&widget, "/dev/widget", "r")];
    match driver.start(config.clone()).await {
        Err(DriverError::Cgroup { path, source, .. }) => {
            assert_eq!(path, parent.join("restricted/devices.allow"));
            assert!(source.to_string().starts_with("c 1:9 r: "), "{source}");
        }
        other => panic!("{other:?}"),
    }
    assert!(!parent.join("restricted").exists());
    // Without devices of its own the task runs, and its notes say what it does not get.
    config.devices.clear();
    let handle = driver.start(config.clone()).await.expect("start");
    reaper.track(&handle);
    let notes = notes(&drain(&mut events));
    for rule in ["c 1:9 rwm", "c 5:1 rwm"] {
        let note = format!(
            "devices cgroup: {rule} left out: the agent's own devices cgroup does not allow it"
        );
        assert!(notes.contains(&note), "{notes:?}");
    }
    let list = read(parent.join("restricted/devices.list"));
    assert!(
        list.contains("c 1:3 rwm") && !list.contains("c 5:1"),
        "{list}"
    );
    driver.destroy(&config.id).await.expect("destroy");
    assert!(!parent.join("restricted").exists());
}

#[tokio::test]
async fn a_privileged_task_gets_its_nodes_but_no_devices_cgroup() {
    require_root!();
    let tmp = tempfile::tempdir().unwrap();
    let reaper = Reaper::default();
    let (driver, mut events, parent, _guard) = driver("privileged").await;
    let widget = tmp.path().join("widget");
    mknod_char(&widget, 1, 9);
    let mut config = sh(
        tmp.path(),
        "plugin",
        r#"test -c /dev/urandom && head -c 2 /local/widget | wc -c; echo ready; exec sleep 1000"#,
    );
    config.privileged = true;
    config.devices = vec![
        // In the host's /dev, which the task sees: nothing to bind.
        device(Path::new("/dev/urandom"), "/dev/urandom", "rw"),
        device(&widget, "/local/widget", "r"),
    ];
    let handle = driver.start(config.clone()).await.expect("start");
    reaper.track(&handle);
    common::wait_for_text(config.stdout_path.clone(), "ready").await;
    assert_eq!(read(&config.stdout_path), "2\nready\n");
    if let Some(parent) = &parent {
        assert!(!parent.join("plugin").exists());
    }
    assert_eq!(
        devices_cgroup_of(&handle.pid.to_string()),
        devices_cgroup_of("self"),
        "the task stays in the agent's devices cgroup"
    );
    let notes = notes(&drain(&mut events));
    for note in [
        "device nodes: /dev/urandom (c 1:9) is the host's own (a privileged task sees the host's /dev)",
        "devices cgroup: none for a privileged task: device access is not restricted",
    ] {
        assert!(notes.contains(&note.to_owned()), "{notes:?}");
    }
    driver.destroy(&config.id).await.expect("destroy");
    assert!(!alive(handle.pid));
}

#[tokio::test]
async fn raw_exec_refuses_devices() {
    let tmp = tempfile::tempdir().unwrap();
    let raw = RawExecDriver::new(EventSink::discard(), ProcessConfig::default());
    assert!(!raw.capabilities().device_nodes);
    let exec = ExecDriver::new(EventSink::discard(), Default::default());
    assert!(exec.capabilities().device_nodes);
    let mut config: TaskConfig = common::task(tmp.path(), "raw", "true", &[]);
    config.devices = vec![device(Path::new("/dev/null"), "/dev/null", "rw")];
    match raw.start(config.clone()).await {
        Err(DriverError::InvalidConfig { field, reason, .. }) => {
            assert_eq!(field, "devices");
            assert!(reason.contains("use exec"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert!(!config.dir.exists(), "nothing was created");
}
