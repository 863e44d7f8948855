//! Helpers of the `exec` driver's tests.

use std::{
    fs,
    path::{Path, PathBuf},
    time::Duration,
};

use berth_drivers::{
    BindMount, CgroupSetting, DevicesCgroupSetting, ExecConfig, Fingerprint, PidMode,
    ProcessConfig, TaskConfig, TaskDirs, TaskEvent, TaskEventKind,
};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use tokio::sync::mpsc;

/// Device nodes, made as in every berth test.
#[allow(unused_imports)] // Not every test binary makes device nodes.
pub use berth_testkit::{mknod_block, mknod_char};

/// A task of `exec` as root, in the host's PID namespace (its pid is the command's), with its
/// root at `<dir>/root` and its alloc directory at `<dir>/alloc`.
pub fn task(root: &Path, name: &str, command: &str, args: &[&str]) -> TaskConfig {
    let mut config = super::task(root, name, command, args);
    let dir = root.join(name);
    fs::create_dir_all(dir.join("alloc")).unwrap();
    config.dirs = Some(TaskDirs {
        task_dir: dir.join("root"),
        alloc_dir: dir.join("alloc"),
    });
    config.dir = "/".into();
    config.user = Some("root".into());
    config.pid_mode = PidMode::Host;
    config
}

/// `sh -c <script>` as [`task`].
pub fn sh(root: &Path, name: &str, script: &str) -> TaskConfig {
    task(root, name, "sh", &["-c", script])
}

/// Where path `p` of the task's root is on the host.
pub fn in_root(config: &TaskConfig, p: &Path) -> PathBuf {
    let root = &config.dirs.as_ref().unwrap().task_dir;
    root.join(p.strip_prefix("/").unwrap_or(p))
}

/// Quick polling; tasks get a devices cgroup next to their cgroup v2 (under the same name of
/// the test's), or none when cgroups are disabled.
pub fn config(cgroup: CgroupSetting) -> ExecConfig {
    let devices_cgroup = match &cgroup {
        CgroupSetting::Auto { name } => DevicesCgroupSetting::Auto { name: name.clone() },
        _ => DevicesCgroupSetting::Disabled,
    };
    config_with(cgroup, devices_cgroup)
}

/// Quick polling, these cgroup settings.
pub fn config_with(cgroup: CgroupSetting, devices_cgroup: DevicesCgroupSetting) -> ExecConfig {
    ExecConfig {
        cgroup,
        devices_cgroup,
        setup_timeout: Duration::from_secs(30),
        process: ProcessConfig {
            poll_interval: Duration::from_millis(20),
            kill_timeout: Duration::from_secs(10),
            task_path: None,
        },
        ..ExecConfig::default()
    }
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

pub fn mounted_at(mountinfo: &Path, path: &Path) -> bool {
    let mounts = berth_sys::read_mountinfo(mountinfo).expect("mountinfo");
    berth_sys::top_mount_at(&mounts, path).is_some()
}

pub fn bind(source: &Path, destination: &Path, read_only: bool) -> BindMount {
    BindMount {
        source: source.to_path_buf(),
        destination: destination.to_path_buf(),
        read_only,
        propagation: Default::default(),
    }
}

/// A cgroup parent name of this test process and test, so that tests running in parallel
/// never share one.
pub fn cgroup_name(test: &str) -> String {
    format!("berth-test-{}-{test}", std::process::id())
}

/// Removes the test's cgroup parents (v2, and v1 devices), after killing the processes of the
/// task cgroups left in them and removing those.
pub struct CgroupGuard(pub Vec<PathBuf>);

impl CgroupGuard {
    /// The parents a fingerprint of `exec` names (`driver.exec.cgroup`,
    /// `driver.exec.devices_cgroup`), when they are directories.
    pub fn of(fp: &Fingerprint) -> Self {
        Self(
            ["driver.exec.cgroup", "driver.exec.devices_cgroup"]
                .iter()
                .filter_map(|k| fp.attributes.get(*k))
                .filter(|v| v.starts_with('/'))
                .map(PathBuf::from)
                .collect(),
        )
    }
}

impl Drop for CgroupGuard {
    fn drop(&mut self) {
        for dir in &self.0 {
            if let Ok(entries) = fs::read_dir(dir) {
                for entry in entries.flatten() {
                    let path = entry.path();
                    if !path.is_dir() {
                        continue;
                    }
                    let _ = fs::write(path.join("cgroup.kill"), "1");
                    for pid in super::read(path.join("cgroup.procs")).lines() {
                        if let Ok(pid) = pid.trim().parse::<i32>() {
                            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                        }
                    }
                    let _ = fs::remove_dir(&path);
                }
            }
            let _ = fs::remove_dir(dir);
        }
    }
}

/// The events already sent (without waiting).
pub fn drain(rx: &mut mpsc::UnboundedReceiver<TaskEvent>) -> Vec<TaskEvent> {
    let mut events = Vec::new();
    while let Ok(event) = rx.try_recv() {
        events.push(event);
    }
    events
}

/// The messages of the `Note` events among `events`.
pub fn notes(events: &[TaskEvent]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.kind == TaskEventKind::Note)
        .map(|e| e.message.clone())
        .collect()
}
