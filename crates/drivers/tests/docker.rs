//! `docker` with real podman and runc, on images built offline from Debian's busybox-static
//! into a podman storage of each test's own. Each test runs in a private mount namespace of
//! its own (the containers' mounts die with it). Needs root, podman, runc and busybox-static.

mod common;

use std::{
    fs,
    path::PathBuf,
    time::{Duration, Instant},
};

use berth_drivers::{
    BindMount, ContainerConfig, DockerConfig, DockerDriver, Driver, DriverError, EventSink, Health,
    NetworkMode, Propagation, Signal, TaskConfig, TaskDirs, TaskEventKind, TaskId, TaskState,
};
use berth_testkit::{TestPodman, in_own_mount_namespace};
use common::{TIMEOUT, events_until, read, wait_for_text};

const IMAGE: &str = "localhost/berth-busybox:test";

/// Runs the test body in its own mount namespace.
macro_rules! in_namespace {
    ($name:literal) => {
        if !in_own_mount_namespace(concat!($name)) {
            return;
        }
    };
}

struct Setup {
    podman: TestPodman,
    tmp: tempfile::TempDir,
}

impl Setup {
    fn new() -> Self {
        let podman = TestPodman::new();
        podman.build_image(IMAGE, &[], None);
        Self {
            podman,
            tmp: tempfile::tempdir().unwrap(),
        }
    }

    fn config(&self) -> DockerConfig {
        DockerConfig {
            storage_root: Some(self.podman.root()),
            run_root: Some(self.podman.run_root()),
            ..DockerConfig::default()
        }
    }

    fn driver(
        &self,
        config: DockerConfig,
    ) -> (
        DockerDriver,
        tokio::sync::mpsc::UnboundedReceiver<berth_drivers::TaskEvent>,
    ) {
        let (sink, rx) = EventSink::channel();
        (DockerDriver::new(sink, config), rx)
    }

    /// A task `name` of alloc `a1` running `sh -c script` in the image.
    fn task(&self, name: &str, script: &str) -> TaskConfig {
        let alloc = self.tmp.path().join("a1");
        let task_dir = alloc.join(name);
        let shared = alloc.join("alloc");
        for d in [&task_dir, &shared] {
            fs::create_dir_all(d).unwrap();
        }
        let logs = shared.join("logs");
        let mut t = TaskConfig::new(
            TaskId::for_alloc("a1", name).unwrap(),
            "sh",
            "/",
            logs.join(format!("{name}.stdout.0")),
            logs.join(format!("{name}.stderr.0")),
        );
        t.args = vec!["-c".into(), script.into()];
        t.dirs = Some(TaskDirs {
            task_dir,
            alloc_dir: shared,
        });
        t.container = Some(ContainerConfig {
            image: IMAGE.into(),
            network_mode: NetworkMode::None,
            ..ContainerConfig::default()
        });
        t
    }

    fn task_dir(&self, name: &str) -> PathBuf {
        self.tmp.path().join("a1").join(name)
    }
}

fn container_of(events: &[TaskEventKind]) -> bool {
    events
        .iter()
        .any(|e| matches!(e, TaskEventKind::Started { .. }))
}

/// Whether a cgroup directory of container `id` is left in any hierarchy.
fn cgroup_left(id: &str) -> bool {
    let needle = format!("libpod-{id}");
    let Ok(roots) = fs::read_dir("/sys/fs/cgroup") else {
        return false;
    };
    roots.flatten().any(|r| {
        [
            r.path().join("libpod_parent").join(&needle),
            r.path().join(&needle),
        ]
        .iter()
        .any(|p| p.exists())
    })
}

fn mounts_of(id: &str) -> usize {
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(id))
        .count()
}

#[tokio::test]
async fn fingerprint_names_podman_and_runc() {
    in_namespace!("fingerprint_names_podman_and_runc");
    let s = Setup::new();
    let (driver, _rx) = s.driver(DockerConfig {
        allow_privileged: true,
        ..s.config()
    });
    let fp = driver.fingerprint().await;
    assert_eq!(fp.health, Health::Healthy, "{fp:?}");
    assert_eq!(fp.attributes["driver.docker"], "1");
    assert_eq!(fp.attributes["driver.docker.runtime"], "runc");
    assert!(
        fp.attributes["driver.docker.version"].starts_with('4'),
        "{fp:?}"
    );
    assert_eq!(fp.attributes["driver.docker.privileged.enabled"], "1");
    assert!(!fp.attributes.contains_key("driver.docker.volumes.enabled"));

    let (missing, _rx) = s.driver(DockerConfig {
        podman: "/nonexistent/podman".into(),
        ..s.config()
    });
    assert_eq!(missing.fingerprint().await.health, Health::Undetected);
    let (no_runtime, _rx) = s.driver(DockerConfig {
        runtime: "no-such-runtime".into(),
        ..s.config()
    });
    let fp = no_runtime.fingerprint().await;
    assert_eq!(fp.health, Health::Unhealthy, "{fp:?}");
}

#[tokio::test]
async fn a_container_logs_sees_its_dirs_and_env_and_leaves_nothing() {
    in_namespace!("a_container_logs_sees_its_dirs_and_env_and_leaves_nothing");
    let s = Setup::new();
    let (driver, mut rx) = s.driver(s.config());
    let mut t = s.task(
        "web",
        "echo out; echo err >&2; echo \"$GREETING\"; ls -d /alloc /local /secrets; \
         echo hi > /local/written; cat /secrets/token; exit 3",
    );
    t.env.insert("GREETING".into(), "hello from env".into());
    fs::create_dir_all(s.task_dir("web").join("secrets")).unwrap();
    fs::write(s.task_dir("web").join("secrets/token"), "tok\n").unwrap();
    let handle = driver.start(t.clone()).await.unwrap();
    let cid = handle.container_id.clone().expect("a container id");
    let exit = driver.wait(&t.id).await.unwrap();
    assert_eq!(exit.exit_code, Some(3), "{exit:?}");
    let out = read(&t.stdout_path);
    assert_eq!(out, "out\nhello from env\n/alloc\n/local\n/secrets\ntok\n");
    assert_eq!(read(&t.stderr_path), "err\n");
    assert_eq!(read(s.task_dir("web").join("local/written")), "hi\n");
    // The environment file never outlives the create.
    assert!(!s.task_dir("web").join(".container/env").exists());
    let kinds = events_until(&mut rx, |k| matches!(k, TaskEventKind::Exited { .. })).await;
    assert!(container_of(&kinds), "{kinds:?}");
    assert_eq!(driver.inspect(&t.id).unwrap().state, TaskState::Exited);

    driver.destroy(&t.id).await.unwrap();
    assert!(s.podman.containers().is_empty());
    assert!(!cgroup_left(&cid));
    assert_eq!(mounts_of(&cid), 0);
    assert!(matches!(
        driver.inspect(&t.id),
        Err(DriverError::NotFound { .. })
    ));
}

#[tokio::test]
async fn stop_signals_then_kills_after_the_timeout() {
    in_namespace!("stop_signals_then_kills_after_the_timeout");
    let s = Setup::new();
    let (driver, mut rx) = s.driver(s.config());

    // A task that exits on SIGTERM stops at once, with the signal's exit.
    let t = s.task(
        "polite",
        "trap 'echo bye; exit 0' TERM; echo up; while :; do sleep 0.05; done",
    );
    driver.start(t.clone()).await.unwrap();
    wait_for_text(t.stdout_path.clone(), "up").await;
    let started = Instant::now();
    driver
        .stop(&t.id, Duration::from_secs(20), Signal::SIGTERM)
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(driver.wait(&t.id).await.unwrap().exit_code, Some(0));
    assert!(read(&t.stdout_path).contains("bye"));
    driver.destroy(&t.id).await.unwrap();

    // One that ignores it is killed once the timeout has passed, not before.
    let t = s.task(
        "stubborn",
        "trap '' TERM; echo up; while :; do sleep 0.05; done",
    );
    driver.start(t.clone()).await.unwrap();
    wait_for_text(t.stdout_path.clone(), "up").await;
    while rx.try_recv().is_ok() {}
    let started = Instant::now();
    driver
        .stop(&t.id, Duration::from_millis(700), Signal::SIGTERM)
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(700));
    let exit = driver.wait(&t.id).await.unwrap();
    assert_eq!(exit.signal, Some(9), "{exit:?}");
    let kinds = events_until(&mut rx, |k| matches!(k, TaskEventKind::Exited { .. })).await;
    let signaled = kinds
        .iter()
        .position(|k| matches!(k, TaskEventKind::Signaled { signal: 15 }));
    let killed = kinds
        .iter()
        .position(|k| matches!(k, TaskEventKind::Killed));
    assert!(signaled.is_some() && killed > signaled, "{kinds:?}");
    driver.destroy(&t.id).await.unwrap();
    assert!(s.podman.containers().is_empty());
}

#[tokio::test]
async fn a_container_outlives_its_driver_and_is_recovered_by_id() {
    in_namespace!("a_container_outlives_its_driver_and_is_recovered_by_id");
    let s = Setup::new();
    let (first, _rx) = s.driver(s.config());
    let t = s.task(
        "svc",
        "echo up; trap 'exit 7' TERM; while :; do sleep 0.05; done",
    );
    let handle = first.start(t.clone()).await.unwrap();
    wait_for_text(t.stdout_path.clone(), "up").await;
    first.shutdown().await;
    drop(first);
    assert!(
        common::alive(handle.pid),
        "the container died with its driver"
    );

    let (second, mut rx) = s.driver(s.config());
    // A handle that does not name this container is refused.
    let mut wrong = handle.clone();
    wrong.pid = std::process::id();
    assert!(second.recover(wrong).await.is_err());
    if let Err(e) = second.recover(handle.clone()).await {
        let state = s.podman.run(&[
            "inspect",
            "--format",
            "{{json .State}}",
            handle.container_id.as_deref().unwrap(),
        ]);
        panic!(
            "{e}: {} alive={}; log: {}",
            String::from_utf8_lossy(&state.stdout),
            common::alive(handle.pid),
            read(&t.stdout_path)
        );
    }
    let kinds = events_until(&mut rx, |k| matches!(k, TaskEventKind::Recovered { .. })).await;
    assert!(matches!(kinds.last(), Some(TaskEventKind::Recovered { pid }) if *pid == handle.pid));
    assert_eq!(
        s.podman.containers(),
        vec![handle.container_id.clone().unwrap()]
    );
    let stats = second.stats(&t.id).await.unwrap_or_else(|e| {
        let state = s.podman.run(&[
            "inspect",
            "--format",
            "{{json .State}}",
            &handle.container_id.clone().unwrap(),
        ]);
        panic!(
            "{e}: {}; log: {}",
            String::from_utf8_lossy(&state.stdout),
            read(&t.stdout_path)
        )
    });
    assert!(stats.pids.contains(&handle.pid), "{stats:?}");

    second
        .stop(&t.id, Duration::from_secs(20), Signal::SIGTERM)
        .await
        .unwrap();
    // Recovered, and still its exit code is known (podman recorded it).
    assert_eq!(second.wait(&t.id).await.unwrap().exit_code, Some(7));
    second.destroy(&t.id).await.unwrap();
    assert!(s.podman.containers().is_empty());
}

#[tokio::test]
async fn mounts_reach_the_container_read_only_when_asked() {
    in_namespace!("mounts_reach_the_container_read_only_when_asked");
    let s = Setup::new();
    let (driver, _rx) = s.driver(s.config());
    let rw = s.tmp.path().join("volume");
    let ro = s.tmp.path().join("ro");
    fs::create_dir_all(&rw).unwrap();
    fs::create_dir_all(&ro).unwrap();
    let mut t = s.task(
        "writer",
        "echo data > /data/file && (echo x > /ro/file 2>/dev/null && echo wrote || echo refused)",
    );
    t.mounts = vec![
        BindMount {
            source: rw.clone(),
            destination: "/data".into(),
            read_only: false,
            propagation: Propagation::Private,
        },
        BindMount {
            source: ro.clone(),
            destination: "/ro".into(),
            read_only: true,
            propagation: Propagation::Private,
        },
    ];
    driver.start(t.clone()).await.unwrap();
    assert_eq!(driver.wait(&t.id).await.unwrap().exit_code, Some(0));
    assert_eq!(read(rw.join("file")), "data\n");
    assert!(!ro.join("file").exists());
    assert_eq!(read(&t.stdout_path), "refused\n");
    driver.destroy(&t.id).await.unwrap();
}

#[tokio::test]
async fn images_load_from_a_docker_archive() {
    in_namespace!("images_load_from_a_docker_archive");
    let s = Setup::new();
    let archive = s.tmp.path().join("image.tar");
    s.podman.save_docker_archive(IMAGE, &archive);
    let (driver, _rx) = s.driver(s.config());
    let mut t = s.task("archived", "echo from the archive");
    t.container.as_mut().unwrap().image = format!("docker-archive:{}", archive.display());
    driver.start(t.clone()).await.unwrap();
    assert_eq!(driver.wait(&t.id).await.unwrap().exit_code, Some(0));
    assert_eq!(read(&t.stdout_path), "from the archive\n");
    driver.destroy(&t.id).await.unwrap();
}

#[tokio::test]
async fn bad_input_starts_nothing() {
    in_namespace!("bad_input_starts_nothing");
    let s = Setup::new();
    let (driver, _rx) = s.driver(s.config());
    let field = |r: Result<berth_drivers::TaskHandle, DriverError>| match r {
        Err(DriverError::InvalidConfig { field, reason, .. }) => format!("{field}: {reason}"),
        other => panic!("{other:?}"),
    };

    let mut t = s.task("priv", "true");
    t.privileged = true;
    let e = field(driver.start(t).await);
    assert!(
        e.starts_with("privileged: ") && e.contains("allow_privileged"),
        "{e}"
    );

    let outside = s.tmp.path().join("host-dir");
    fs::create_dir_all(&outside).unwrap();
    let mut t = s.task("vol", "true");
    t.container.as_mut().unwrap().host_volumes.push(BindMount {
        source: outside.clone(),
        destination: "/h".into(),
        read_only: false,
        propagation: Propagation::Private,
    });
    let e = field(driver.start(t.clone()).await);
    assert!(
        e.starts_with("host_volumes[0].source: ") && e.contains("volumes"),
        "{e}"
    );
    // With volumes enabled it runs.
    let (open, _rx2) = s.driver(DockerConfig {
        volumes_enabled: true,
        ..s.config()
    });
    open.start(t.clone()).await.unwrap();
    open.wait(&t.id).await.unwrap();
    open.destroy(&t.id).await.unwrap();

    let mut t = s.task("rel", "true");
    t.container.as_mut().unwrap().host_volumes.push(BindMount {
        source: "local/x".into(),
        destination: "/x".into(),
        read_only: false,
        propagation: Propagation::Private,
    });
    let e = field(driver.start(t).await);
    assert!(e.starts_with("host_volumes[0].source: "), "{e}");

    let mut t = s.task("missing", "true");
    t.container.as_mut().unwrap().image = "localhost/not-here:1".into();
    let started = Instant::now();
    match driver.start(t).await {
        Err(DriverError::Image { reason, .. }) => {
            assert!(reason.contains("no registry"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < TIMEOUT, "a missing image must not hang");

    let mut t = s.task("secret-env", "true");
    t.env.insert("TOKEN".into(), "hunter2\nmore".into());
    let e = field(driver.start(t).await);
    assert!(
        e.starts_with("env[\"TOKEN\"]") && !e.contains("hunter2"),
        "{e}"
    );

    assert!(
        s.podman.containers().is_empty(),
        "bad input created a container"
    );
}
