//! What a driver is asked to run and what it reports back: task ids, configs, handles, exit
//! results, status and statistics.

use std::{
    collections::BTreeMap,
    fmt,
    path::{Component, Path, PathBuf},
    time::{Duration, SystemTime},
};

use berth_sys::{InvalidId, validate_path_segment};
use serde::{Deserialize, Serialize};

use crate::{
    error::DriverError,
    logs::{RotatedOutput, TaskLogs},
};

/// The version of [`TaskHandle`] records written by this build.
pub const HANDLE_VERSION: u32 = 1;

/// Separates the alloc id from the task name in a [`TaskId`] made by [`TaskId::for_alloc`].
const ALLOC_TASK_SEPARATOR: char = '.';

/// The id of a task inside a driver: one path segment (it names the task's cgroup), validated
/// by [`berth_sys::validate_path_segment`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TaskId(String);

impl TaskId {
    /// A task id used as is; it must be a valid path segment.
    pub fn new(id: impl Into<String>) -> Result<Self, InvalidId> {
        let id = id.into();
        validate_path_segment("task id", &id)?;
        Ok(Self(id))
    }

    /// The id of task `task` of alloc `alloc_id`: `<alloc_id>.<task>`, where `%` and `.` inside
    /// either part are written `%25` and `%2E`, so two different pairs never give the same id.
    /// Each part must be a valid path segment, and so must the result (at most 128 bytes).
    pub fn for_alloc(alloc_id: &str, task: &str) -> Result<Self, InvalidId> {
        validate_path_segment("alloc id", alloc_id)?;
        validate_path_segment("task name", task)?;
        Self::new(format!(
            "{}{ALLOC_TASK_SEPARATOR}{}",
            escape_part(alloc_id),
            escape_part(task)
        ))
    }

    /// The `(alloc id, task name)` this id was made from by [`TaskId::for_alloc`], if it was.
    pub fn alloc_and_task(&self) -> Option<(String, String)> {
        let (alloc, task) = self.0.split_once(ALLOC_TASK_SEPARATOR)?;
        if task.contains(ALLOC_TASK_SEPARATOR) {
            return None;
        }
        Some((unescape_part(alloc)?, unescape_part(task)?))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn escape_part(part: &str) -> String {
    part.replace('%', "%25").replace('.', "%2E")
}

fn unescape_part(part: &str) -> Option<String> {
    let mut out = String::with_capacity(part.len());
    let mut rest = part;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let code = rest.get(at + 1..at + 3)?;
        out.push(match code {
            "25" => '%',
            "2E" => '.',
            _ => return None,
        });
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Some(out)
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for TaskId {
    type Error = InvalidId;

    fn try_from(id: String) -> Result<Self, Self::Error> {
        Self::new(id)
    }
}

impl From<TaskId> for String {
    fn from(id: TaskId) -> Self {
        id.0
    }
}

/// A host path bind-mounted into an `exec` task's mount namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindMount {
    /// Absolute host path of a directory or file; it must exist.
    pub source: PathBuf,
    /// Absolute path where the task sees it; created (as a directory, or an empty file when
    /// `source` is a file) if missing. Without `..` components.
    pub destination: PathBuf,
    /// Mount it read-only: writes fail with `EROFS`.
    #[serde(default)]
    pub read_only: bool,
    /// How mounts made under it travel between the task and the host.
    #[serde(default)]
    pub propagation: Propagation,
}

/// A host device node given to an `exec` task: the node appears at `task_path` in the task's
/// root, and (where the host has the cgroup v1 `devices` controller) the task may use it with
/// `permissions` only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskDevice {
    /// Absolute host path of a character or block device node (symlinks are followed).
    pub host_path: PathBuf,
    /// Absolute path where the task sees the node, without `..` components.
    pub task_path: PathBuf,
    /// What the task may do with it: any of `r` (read), `w` (write), `m` (mknod), each at most
    /// once; empty means nothing (beyond what every task may).
    #[serde(default)]
    pub permissions: String,
}

/// Mount propagation of a [`BindMount`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Propagation {
    /// Host to task only: unmounts on the host reach the task's copy; the task's own mounts
    /// stay in its namespace.
    #[default]
    HostToTask,
    /// Nothing travels either way: the mount is private in the task's namespace.
    Private,
    /// Both ways (a CSI plugin's staging and publish root): mounts and unmounts the task makes
    /// under it show on the host, and the reverse. The source must lie on a shared mount
    /// (see `berth_sys::ensure_shared_mount`); it is bound recursively, so mounts already
    /// under it are seen.
    Bidirectional,
}

/// Resource limits of a task. Only drivers that put tasks in cgroups apply them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    /// Hard memory limit (`memory.max`), in bytes.
    #[serde(default)]
    pub memory_max_bytes: Option<u64>,
}

/// What to run. Checked by [`TaskConfig::validate`] before anything is created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskConfig {
    /// The task's id; unique among the driver's tasks until the task is destroyed.
    pub id: TaskId,
    /// Program to run: an absolute path, a path relative to `dir`, or a name looked up in the
    /// task's `PATH`.
    pub command: String,
    /// Its arguments (without the program name).
    #[serde(default)]
    pub args: Vec<String>,
    /// The task's whole environment. The agent's environment is not inherited, except `PATH`
    /// when `env` has none (so bare command names resolve as they do for the operator).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory (absolute); created if missing.
    pub dir: PathBuf,
    /// File the task's stdout is appended to (absolute); created, with its directory, if
    /// missing.
    pub stdout_path: PathBuf,
    /// File the task's stderr is appended to (absolute); created, with its directory, if
    /// missing.
    pub stderr_path: PathBuf,
    /// Bind mounts, made in this order (only drivers with a mount namespace accept them).
    #[serde(default)]
    pub mounts: Vec<BindMount>,
    /// Device nodes (only drivers whose [`Capabilities::device_nodes`](crate::Capabilities)
    /// is true accept them); bound after `mounts`.
    #[serde(default)]
    pub devices: Vec<TaskDevice>,
    /// Resource limits.
    #[serde(default)]
    pub resources: Resources,
    /// The task's directories (Nomad's layout). `exec` makes `task_dir` the task's `/`.
    #[serde(default)]
    pub dirs: Option<TaskDirs>,
    /// Run as this user (a name from the host's `/etc/passwd`, or a numeric uid); `None`: the
    /// driver's default (`exec`: `nobody`, as Nomad's exec; `raw_exec`: the agent's user).
    #[serde(default)]
    pub user: Option<String>,
    /// A PID namespace of its own (the default, as Nomad's exec) or the host's. `exec` only.
    #[serde(default)]
    pub pid_mode: PidMode,
    /// The host's `/dev` and `/sys` (read-write) inside the task's root, and no devices
    /// cgroup: for CSI plugins.
    #[serde(default)]
    pub privileged: bool,
    /// What a container task runs (`docker` only; other drivers refuse it). With it,
    /// `command` may be empty (the image's own command) and `env` is passed as it is (the
    /// image's `PATH` stays unless `env` sets one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<crate::docker::ContainerConfig>,
    /// Where its output goes: with [`TaskLogs::Rotated`], `stdout_path` and `stderr_path` are
    /// the base paths of the numbered files.
    #[serde(default)]
    pub logs: TaskLogs,
}

/// Where a task's directories are on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskDirs {
    /// `<alloc dir>/<task>`: the task's own (its `/` with `exec`).
    pub task_dir: PathBuf,
    /// `<alloc dir>/alloc`: shared by the alloc's tasks (`/alloc` with `exec`).
    pub alloc_dir: PathBuf,
}

/// A task's PID namespace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PidMode {
    /// Its own: it sees only its processes.
    #[default]
    Private,
    /// The host's.
    Host,
}

impl TaskConfig {
    /// A config with no arguments, environment, mounts or limits.
    pub fn new(
        id: TaskId,
        command: impl Into<String>,
        dir: impl Into<PathBuf>,
        stdout_path: impl Into<PathBuf>,
        stderr_path: impl Into<PathBuf>,
    ) -> Self {
        Self {
            id,
            command: command.into(),
            args: Vec::new(),
            env: BTreeMap::new(),
            dir: dir.into(),
            stdout_path: stdout_path.into(),
            stderr_path: stderr_path.into(),
            mounts: Vec::new(),
            devices: Vec::new(),
            resources: Resources::default(),
            dirs: None,
            user: None,
            pid_mode: PidMode::default(),
            privileged: false,
            container: None,
            logs: TaskLogs::Files,
        }
    }

    /// Checks every field; the error names the first bad one. Changes nothing.
    pub fn validate(&self) -> Result<(), DriverError> {
        let bad = |field: String, reason: String| DriverError::InvalidConfig {
            task_id: self.id.clone(),
            field,
            reason,
        };
        if self.command.is_empty() && self.container.is_none() {
            return Err(bad("command".into(), "must not be empty".into()));
        }
        if self.command.contains('\0') {
            return Err(bad("command".into(), "must not contain a NUL byte".into()));
        }
        if let Some(i) = self.args.iter().position(|a| a.contains('\0')) {
            return Err(bad(
                format!("args[{i}]"),
                "must not contain a NUL byte".into(),
            ));
        }
        for (key, value) in &self.env {
            if key.is_empty() || key.contains('=') || key.contains('\0') {
                return Err(bad(
                    format!("env[{key:?}]"),
                    "a name must be non-empty, without '=' or NUL".into(),
                ));
            }
            if value.contains('\0') {
                return Err(bad(
                    format!("env[{key:?}]"),
                    "must not contain a NUL byte".into(),
                ));
            }
        }
        for (field, path) in [
            ("dir", &self.dir),
            ("stdout_path", &self.stdout_path),
            ("stderr_path", &self.stderr_path),
        ] {
            check_absolute(path).map_err(|reason| bad(field.into(), reason))?;
        }
        for (field, path) in [
            ("stdout_path", &self.stdout_path),
            ("stderr_path", &self.stderr_path),
        ] {
            if path.file_name().is_none() {
                return Err(bad(field.into(), "must name a file".into()));
            }
        }
        for (i, mount) in self.mounts.iter().enumerate() {
            check_absolute(&mount.source)
                .map_err(|reason| bad(format!("mounts[{i}].source"), reason))?;
            check_absolute(&mount.destination)
                .map_err(|reason| bad(format!("mounts[{i}].destination"), reason))?;
            if mount.destination == Path::new("/") {
                return Err(bad(
                    format!("mounts[{i}].destination"),
                    "must not be /".into(),
                ));
            }
        }
        self.validate_devices()
            .map_err(|(field, reason)| bad(field, reason))?;
        if let TaskLogs::Rotated { rotation, .. } = &self.logs {
            if rotation.max_files == 0 {
                return Err(bad("logs.max_files".into(), "must be at least 1".into()));
            }
            if rotation.max_file_size_mb == 0 {
                return Err(bad(
                    "logs.max_file_size".into(),
                    "must be at least 1 (MiB)".into(),
                ));
            }
        }
        if self.resources.memory_max_bytes == Some(0) {
            return Err(bad(
                "resources.memory_max_bytes".into(),
                "must be more than 0".into(),
            ));
        }
        Ok(())
    }

    /// Refuses a container config: for drivers that run no images.
    pub(crate) fn refuse_container(&self, driver: &str) -> Result<(), DriverError> {
        if self.container.is_some() {
            return Err(DriverError::InvalidConfig {
                task_id: self.id.clone(),
                field: "container".into(),
                reason: format!("{driver} runs no images; use the docker driver"),
            });
        }
        Ok(())
    }

    /// The checks of [`TaskConfig::devices`] that need no host: `(field, reason)` of the first
    /// bad one.
    fn validate_devices(&self) -> Result<(), (String, String)> {
        let mut seen: Vec<PathBuf> = Vec::with_capacity(self.devices.len());
        for (i, device) in self.devices.iter().enumerate() {
            let field = |name: &str| format!("devices[{i}].{name}");
            check_absolute(&device.host_path).map_err(|reason| (field("host_path"), reason))?;
            check_absolute(&device.task_path).map_err(|reason| (field("task_path"), reason))?;
            let task_path = normalized(&device.task_path);
            if task_path == Path::new("/") {
                return Err((field("task_path"), "must not be /".into()));
            }
            let mut letters = String::new();
            for c in device.permissions.chars() {
                if !"rwm".contains(c) {
                    return Err((
                        field("permissions"),
                        format!("{:?}: {c:?} is not one of r, w, m", device.permissions),
                    ));
                }
                if letters.contains(c) {
                    return Err((
                        field("permissions"),
                        format!("{:?}: {c:?} appears twice", device.permissions),
                    ));
                }
                letters.push(c);
            }
            for (j, other) in seen.iter().enumerate() {
                if *other == task_path {
                    return Err((
                        field("task_path"),
                        format!("{} is also devices[{j}].task_path", task_path.display()),
                    ));
                }
                if task_path.starts_with(other) || other.starts_with(&task_path) {
                    return Err((
                        field("task_path"),
                        format!(
                            "{} and devices[{j}].task_path {} lie one inside the other",
                            task_path.display(),
                            other.display()
                        ),
                    ));
                }
            }
            seen.push(task_path);
        }
        Ok(())
    }
}

/// `path` without repeated or trailing `/` and inner `.` components (`/a/./b/` is `/a/b`), so
/// that paths spelled differently compare equal; symlinks and `..` are left as they are.
pub(crate) fn normalized(path: &Path) -> PathBuf {
    path.components().collect()
}

/// An absolute path without `..`, NUL or newline (the path is passed through a shell script's
/// arguments and `/proc` files; a newline would make either ambiguous).
fn check_absolute(path: &Path) -> Result<(), String> {
    if !path.is_absolute() {
        return Err(format!("{} is not an absolute path", path.display()));
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(format!("{} contains '..'", path.display()));
    }
    let text = path.as_os_str().as_encoded_bytes();
    if text.contains(&0) || text.contains(&b'\n') {
        return Err(format!(
            "{} contains a NUL byte or a newline",
            path.display()
        ));
    }
    Ok(())
}

/// A serializable record of a running task: what the agent persists so that a new driver
/// instance can [`recover`](crate::Driver::recover) the task after an agent restart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskHandle {
    /// Record version ([`HANDLE_VERSION`]).
    pub version: u32,
    /// Name of the driver that started the task.
    pub driver: String,
    /// The task's id.
    pub task_id: TaskId,
    /// Pid of the task's main process; also its process group id.
    pub pid: u32,
    /// Start time of `pid` in clock ticks after boot (`/proc/<pid>/stat` field 22): a pid
    /// that was recycled by another process has another start time.
    pub start_ticks: u64,
    /// `/proc/sys/kernel/random/boot_id` when the task started: start times only compare
    /// within one boot.
    pub boot_id: String,
    /// Wall-clock time the task started.
    pub started_at: SystemTime,
    /// The task's cgroup directory, when it has one.
    #[serde(default)]
    pub cgroup: Option<PathBuf>,
    /// The container's id (`docker` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// Its rotated output, when it has some: what a recovery needs to restart a collector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<RotatedOutput>,
}

/// How a task's main process ended.
///
/// A task recovered after an agent restart is no longer the agent's child, and the kernel only
/// tells a process's parent how it ended: then both `exit_code` and `signal` are `None`
/// ([`ExitResult::is_unknown`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitResult {
    /// Exit code, if it exited.
    pub exit_code: Option<i32>,
    /// Number of the signal that killed it, if one did.
    pub signal: Option<i32>,
    /// Whether the kernel's OOM killer killed a process of the task's cgroup (always false
    /// without a cgroup with the memory controller).
    pub oom_killed: bool,
}

impl ExitResult {
    /// The result of a task whose end could not be observed (a recovered task).
    pub const UNKNOWN: Self = Self {
        exit_code: None,
        signal: None,
        oom_killed: false,
    };

    /// Whether how the task ended is unknown.
    pub fn is_unknown(&self) -> bool {
        self.exit_code.is_none() && self.signal.is_none()
    }

    /// Exited with code 0.
    pub fn success(&self) -> bool {
        self.exit_code == Some(0)
    }
}

impl fmt::Display for ExitResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.exit_code, self.signal) {
            (Some(code), _) => write!(f, "exited with code {code}")?,
            (None, Some(sig)) => write!(f, "killed by {}", signal_name(sig))?,
            (None, None) => f.write_str("exited (status unknown: not the agent's child)")?,
        }
        if self.oom_killed {
            f.write_str(" (OOM killed)")?;
        }
        Ok(())
    }
}

/// `SIGTERM`-style name of a signal number, or the number.
pub(crate) fn signal_name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig)
        .map(|s| s.as_str().to_owned())
        .unwrap_or_else(|_| format!("signal {sig}"))
}

/// Whether a task's main process is still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Running (or not yet seen to exit).
    Running,
    /// Exited; the driver keeps the task until it is destroyed.
    Exited,
}

/// A task's status ([`Driver::inspect`](crate::Driver::inspect)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskStatus {
    /// The task.
    pub task_id: TaskId,
    /// Running or exited.
    pub state: TaskState,
    /// Pid of its main process.
    pub pid: u32,
    /// When it started.
    pub started_at: SystemTime,
    /// How it ended, once it has.
    pub exit: Option<ExitResult>,
}

/// Resource usage of a task's processes, read from `/proc` (`Driver::stats`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskStats {
    /// Pids counted: the task's cgroup, or else its process group.
    pub pids: Vec<u32>,
    /// User CPU time of those processes, in clock ticks.
    pub cpu_user_ticks: u64,
    /// System CPU time of those processes, in clock ticks.
    pub cpu_system_ticks: u64,
    /// Clock ticks per second (`sysconf(_SC_CLK_TCK)`).
    pub ticks_per_second: u64,
    /// Resident memory of those processes, in bytes (shared pages count once per process).
    pub rss_bytes: u64,
    /// When the numbers were read.
    pub timestamp: SystemTime,
}

impl TaskStats {
    /// User plus system CPU time.
    pub fn cpu_time(&self) -> Duration {
        let ticks = self.cpu_user_ticks + self.cpu_system_ticks;
        let per_second = self.ticks_per_second.max(1);
        Duration::from_secs(ticks / per_second)
            + Duration::from_nanos((ticks % per_second) * 1_000_000_000 / per_second)
    }

    /// CPU use between `earlier` and `self`, in percent of one core (0 when no time passed).
    pub fn cpu_percent_since(&self, earlier: &TaskStats) -> f64 {
        let wall = self
            .timestamp
            .duration_since(earlier.timestamp)
            .unwrap_or_default();
        if wall.is_zero() {
            return 0.0;
        }
        let cpu = self.cpu_time().saturating_sub(earlier.cpu_time());
        cpu.as_secs_f64() / wall.as_secs_f64() * 100.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> TaskConfig {
        TaskConfig::new(
            TaskId::new("t").unwrap(),
            "true",
            "/tmp/t",
            "/tmp/t/out",
            "/tmp/t/err",
        )
    }

    #[test]
    fn destinations_are_normalized() {
        assert_eq!(normalized(Path::new("/a/./b/")), PathBuf::from("/a/b"));
        // Paths compare by components; their text is what a task's notes and errors show.
        assert_eq!(normalized(Path::new("/a/./b/")).as_os_str(), "/a/b");
        assert_eq!(normalized(Path::new("//dev//x")).as_os_str(), "/dev/x");
    }

    #[test]
    fn task_ids_are_path_segments() {
        assert!(TaskId::new("web").is_ok());
        for bad in ["", ".", "..", "a/b", "a\0b"] {
            assert!(TaskId::new(bad).is_err(), "{bad:?}");
        }
        let err = serde_json::from_str::<TaskId>("\"../x\"").unwrap_err();
        assert!(err.to_string().contains("task id"), "{err}");
    }

    #[test]
    fn alloc_task_ids_are_unambiguous() {
        let a = TaskId::for_alloc("a.b", "c").unwrap();
        let b = TaskId::for_alloc("a", "b.c").unwrap();
        assert_ne!(a, b);
        assert_eq!(a.as_str(), "a%2Eb.c");
        assert_eq!(a.alloc_and_task(), Some(("a.b".into(), "c".into())));
        assert_eq!(b.alloc_and_task(), Some(("a".into(), "b.c".into())));
        let odd = TaskId::for_alloc("50%", "..x").unwrap();
        assert_eq!(odd.alloc_and_task(), Some(("50%".into(), "..x".into())));
        assert!(TaskId::for_alloc("a/b", "c").is_err());
        assert!(TaskId::for_alloc("a", "..").is_err());
        assert!(TaskId::for_alloc(&"a".repeat(100), &"b".repeat(40)).is_err());
        assert_eq!(TaskId::new("plain").unwrap().alloc_and_task(), None);
    }

    #[test]
    fn validation_names_the_field() {
        let field = |c: TaskConfig| match c.validate() {
            Err(DriverError::InvalidConfig { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert!(config().validate().is_ok());
        let mut c = config();
        c.command.clear();
        assert_eq!(field(c), "command");
        let mut c = config();
        c.dir = "rel".into();
        assert_eq!(field(c), "dir");
        let mut c = config();
        c.env.insert("A=B".into(), "x".into());
        assert_eq!(field(c), "env[\"A=B\"]");
        let mut c = config();
        c.args = vec!["ok".into(), "no\0".into()];
        assert_eq!(field(c), "args[1]");
        let mut c = config();
        c.mounts.push(BindMount {
            source: "/src".into(),
            destination: "/a/../etc".into(),
            read_only: false,
            propagation: Propagation::HostToTask,
        });
        assert_eq!(field(c), "mounts[0].destination");
        let mut c = config();
        c.mounts.push(BindMount {
            source: "/src\nx".into(),
            destination: "/d".into(),
            read_only: false,
            propagation: Propagation::HostToTask,
        });
        assert_eq!(field(c), "mounts[0].source");
        let mut c = config();
        c.stdout_path = "/".into();
        assert_eq!(field(c), "stdout_path");
    }

    #[test]
    fn devices_are_validated_by_field() {
        let field = |devices: Vec<(&str, &str, &str)>| {
            let mut c = config();
            c.devices = devices
                .into_iter()
                .map(|(host, task, permissions)| TaskDevice {
                    host_path: host.into(),
                    task_path: task.into(),
                    permissions: permissions.into(),
                })
                .collect();
            match c.validate() {
                Ok(()) => "ok".to_owned(),
                Err(DriverError::InvalidConfig { field, reason, .. }) => {
                    format!("{field}: {reason}")
                }
                Err(other) => panic!("{other:?}"),
            }
        };
        assert_eq!(field(vec![("/dev/a", "/dev/a", "rwm")]), "ok");
        assert_eq!(
            field(vec![("/dev/a", "/dev/a", "")]),
            "ok",
            "no permissions"
        );
        assert!(field(vec![("dev/a", "/dev/a", "r")]).starts_with("devices[0].host_path: "));
        assert!(field(vec![("/dev/a", "/x/../a", "r")]).starts_with("devices[0].task_path: "));
        assert!(field(vec![("/dev/a", "/", "r")]).starts_with("devices[0].task_path: "));
        assert_eq!(
            field(vec![("/dev/a", "/dev/a", "rx")]),
            "devices[0].permissions: \"rx\": 'x' is not one of r, w, m"
        );
        assert!(field(vec![("/dev/a", "/dev/a", "rr")]).contains("appears twice"));
        assert_eq!(
            field(vec![("/dev/a", "/dev/a", "r"), ("/dev/b", "/dev/a/", "r")]),
            "devices[1].task_path: /dev/a is also devices[0].task_path"
        );
        assert!(
            field(vec![("/dev/a", "/dev/a", "r"), ("/dev/b", "/dev/a/b", "r")])
                .starts_with("devices[1].task_path: /dev/a/b and devices[0].task_path /dev/a")
        );
        // Old records without the field still read.
        let mut json = serde_json::to_value(config()).unwrap();
        json.as_object_mut().unwrap().remove("devices");
        let back: TaskConfig = serde_json::from_value(json).unwrap();
        assert!(back.devices.is_empty());
    }

    #[test]
    fn exit_results_print_what_is_known() {
        let code = ExitResult {
            exit_code: Some(3),
            signal: None,
            oom_killed: false,
        };
        assert_eq!(code.to_string(), "exited with code 3");
        let sig = ExitResult {
            exit_code: None,
            signal: Some(9),
            oom_killed: true,
        };
        assert_eq!(sig.to_string(), "killed by SIGKILL (OOM killed)");
        assert!(ExitResult::UNKNOWN.is_unknown());
        assert!(ExitResult::UNKNOWN.to_string().contains("unknown"));
    }

    #[test]
    fn cpu_percent_from_two_samples() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let a = TaskStats {
            pids: vec![1],
            cpu_user_ticks: 100,
            cpu_system_ticks: 0,
            ticks_per_second: 100,
            rss_bytes: 0,
            timestamp: at,
        };
        let b = TaskStats {
            cpu_user_ticks: 150,
            cpu_system_ticks: 50,
            timestamp: at + Duration::from_secs(2),
            ..a.clone()
        };
        assert_eq!(b.cpu_time(), Duration::from_secs(2));
        assert!((b.cpu_percent_since(&a) - 50.0).abs() < 1e-9);
        assert_eq!(a.cpu_percent_since(&a), 0.0);
    }
}
