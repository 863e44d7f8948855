//! Per-task cgroups for the `exec` driver: one [`TaskCgroup`] directory type for a task's
//! cgroup v2 (which adds `memory.max`) and its cgroup v1 `devices` cgroup (which adds its
//! allow and deny rules, see `devices.rs`), and [`empty_within`] to empty one.

use std::{
    fs, io,
    path::{Path, PathBuf},
    time::Duration,
};

use nix::{
    errno::Errno,
    sys::{
        signal::{Signal, kill},
        statfs::{CGROUP2_SUPER_MAGIC, statfs},
    },
    unistd::{AccessFlags, Pid, access},
};

use crate::{error::DriverError, procfs, task::TaskId};

/// Where the `exec` driver puts its tasks' cgroups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupSetting {
    /// `<hierarchy>/<name>`, where the hierarchy is the cgroup v2 filesystem at
    /// `/sys/fs/cgroup`, or at `/sys/fs/cgroup/unified` on hosts that mount v1 and v2 side by
    /// side (there the memory controller usually belongs to v1, so limits are not applied).
    Auto {
        /// Directory name under the hierarchy, e.g. `berth`.
        name: String,
    },
    /// This directory, which must be on a cgroup v2 filesystem; created if missing.
    Under(PathBuf),
    /// No cgroups.
    Disabled,
}

impl Default for CgroupSetting {
    fn default() -> Self {
        Self::Auto {
            name: "berth".into(),
        }
    }
}

/// The directory task cgroups are made in, and whether they get the memory controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CgroupParent {
    pub dir: PathBuf,
    /// `Err(reason)` when `memory.max` cannot be set in task cgroups.
    pub memory: Result<(), String>,
}

/// The places cgroup v2 is looked for, in order.
const HIERARCHIES: [&str; 2] = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"];

fn is_cgroup2(path: &Path) -> bool {
    statfs(path).is_ok_and(|s| s.filesystem_type() == CGROUP2_SUPER_MAGIC)
}

/// Finds (and creates) the parent directory for task cgroups. `Ok(None)` when disabled,
/// `Err(reason)` when cgroups cannot be used on this host.
pub(crate) fn prepare(setting: &CgroupSetting) -> Result<Option<CgroupParent>, String> {
    let dir = match setting {
        CgroupSetting::Disabled => return Ok(None),
        CgroupSetting::Auto { name } => {
            berth_sys::validate_path_segment("cgroup name", name).map_err(|e| e.to_string())?;
            let Some(root) = HIERARCHIES.iter().map(Path::new).find(|p| is_cgroup2(p)) else {
                return Err(format!(
                    "no cgroup v2 filesystem at {} (cgroup v1 only?)",
                    HIERARCHIES.join(" or ")
                ));
            };
            root.join(name)
        }
        CgroupSetting::Under(dir) => dir.clone(),
    };
    make_parent(&dir, is_cgroup2, "on a cgroup v2 filesystem")?;
    let memory = enable_memory(&dir);
    Ok(Some(CgroupParent { dir, memory }))
}

/// Creates the parent directory of task cgroups `dir` if missing, and checks that it `is`
/// what it must be (`Err("<dir> is not <what>")`) and writable.
pub(crate) fn make_parent(dir: &Path, is: fn(&Path) -> bool, what: &str) -> Result<(), String> {
    match fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
    }
    if !is(dir) {
        return Err(format!("{} is not {what}", dir.display()));
    }
    access(dir, AccessFlags::W_OK).map_err(|e| format!("{} is not writable: {e}", dir.display()))
}

fn controllers(dir: &Path, file: &str) -> Result<Vec<String>, String> {
    let path = dir.join(file);
    fs::read_to_string(&path)
        .map(|s| s.split_whitespace().map(str::to_owned).collect())
        .map_err(|e| format!("reading {}: {e}", path.display()))
}

/// Makes the memory controller available to `dir`'s children: enables it in `dir`'s parent's
/// `cgroup.subtree_control` if needed, then in `dir`'s.
fn enable_memory(dir: &Path) -> Result<(), String> {
    let has = |dir: &Path, file: &str| -> Result<bool, String> {
        Ok(controllers(dir, file)?.iter().any(|c| c == "memory"))
    };
    let enable = |dir: &Path| -> Result<(), String> {
        let path = dir.join("cgroup.subtree_control");
        fs::write(&path, "+memory")
            .map_err(|e| format!("writing +memory to {}: {e}", path.display()))
    };
    if !has(dir, "cgroup.controllers")? {
        let parent = dir.parent().unwrap_or(Path::new("/"));
        if !has(parent, "cgroup.controllers")? {
            return Err(format!(
                "the memory controller is not available in {} (it may belong to cgroup v1)",
                parent.display()
            ));
        }
        enable(parent)?;
    }
    if !has(dir, "cgroup.subtree_control")? {
        enable(dir)?;
    }
    Ok(())
}

impl CgroupParent {
    /// Creates task `id`'s cgroup (see [`TaskCgroup::create`]) and sets `memory.max` when
    /// asked and possible (when writing it fails, the cgroup is removed again). Returns a
    /// warning when the memory limit is not set because the controller is unavailable.
    pub fn create_task(
        &self,
        id: &TaskId,
        memory_max: Option<u64>,
    ) -> Result<(TaskCgroup, Option<String>), CgroupError> {
        let cgroup = TaskCgroup::new(CgroupKind::V2, self.dir.join(id.as_str()));
        cgroup.create()?;
        let Some(bytes) = memory_max else {
            return Ok((cgroup, None));
        };
        match &self.memory {
            Ok(()) => {
                let path = cgroup.dir.join("memory.max");
                if let Err(source) = fs::write(&path, bytes.to_string()) {
                    let _ = cgroup.remove();
                    return Err(CgroupError {
                        what: "setting the memory limit in",
                        path,
                        source,
                    });
                }
                Ok((cgroup, None))
            }
            Err(reason) => Ok((cgroup, Some(format!("memory limit not applied: {reason}")))),
        }
    }
}

/// The hierarchy a [`TaskCgroup`] lies in; they differ in how a cgroup is seen to be empty and
/// how its processes are killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CgroupKind {
    /// The task's cgroup v2.
    V2,
    /// The task's cgroup v1 `devices` cgroup.
    Devices,
}

/// A task's cgroup directory (which may not exist yet: see [`create`](Self::create)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TaskCgroup {
    pub kind: CgroupKind,
    pub dir: PathBuf,
}

/// A task cgroup could not be made ready or emptied; `what` and `path` say where.
#[derive(Debug)]
pub(crate) struct CgroupError {
    pub what: &'static str,
    pub path: PathBuf,
    pub source: io::Error,
}

impl CgroupError {
    /// The error of task `task_id`.
    pub fn for_task(self, task_id: &TaskId) -> DriverError {
        DriverError::Cgroup {
            task_id: task_id.clone(),
            what: self.what,
            path: self.path,
            source: self.source,
        }
    }
}

impl TaskCgroup {
    /// The cgroup of `kind` at `dir`; nothing is created.
    pub fn new(kind: CgroupKind, dir: PathBuf) -> Self {
        Self { kind, dir }
    }

    /// Creates the directory. A left-over one of the same name (from a crash) is reused when
    /// empty; one with processes in it is an `AlreadyExists` error.
    pub fn create(&self) -> Result<(), CgroupError> {
        let creating = match self.kind {
            CgroupKind::V2 => "creating the cgroup",
            CgroupKind::Devices => "creating the devices cgroup",
        };
        let err = |what, source| CgroupError {
            what,
            path: self.dir.clone(),
            source,
        };
        match fs::create_dir(&self.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let procs = procfs::cgroup_procs(&self.dir)
                    .map_err(|e| err("reading the processes of", e))?;
                if procs.is_empty() {
                    return Ok(());
                }
                Err(err(
                    creating,
                    io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("it exists and holds processes {procs:?}"),
                    ),
                ))
            }
            Err(e) => Err(err(creating, e)),
        }
    }

    /// `cgroup.procs`, which a process writes its pid to in order to join.
    pub fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// Pids in the cgroup; none when it is gone.
    pub fn pids(&self) -> io::Result<Vec<u32>> {
        match procfs::cgroup_procs(&self.dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            other => other,
        }
    }

    /// Whether any process is in the cgroup. A missing cgroup is empty. In cgroup v2 this is
    /// `cgroup.events`' `populated` (`cgroup.procs` leaves out dying processes, which still
    /// keep the cgroup from being removed); in v1, whether `cgroup.procs` lists any.
    pub fn populated(&self) -> io::Result<bool> {
        match self.kind {
            CgroupKind::V2 => match fs::read_to_string(self.dir.join("cgroup.events")) {
                Ok(text) => Ok(text.lines().any(|l| l.trim() == "populated 1")),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(e),
            },
            CgroupKind::Devices => Ok(!self.pids()?.is_empty()),
        }
    }

    /// `SIGKILL`s every process in the cgroup: through `cgroup.kill` in cgroup v2 (Linux ≥
    /// 5.14), else each pid. A missing cgroup is fine.
    pub fn kill_all(&self) -> io::Result<()> {
        if self.kind == CgroupKind::V2 {
            match fs::write(self.dir.join("cgroup.kill"), "1") {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        for pid in self.pids()? {
            let pid = i32::try_from(pid).map_err(io::Error::other)?;
            match kill(Pid::from_raw(pid), Signal::SIGKILL) {
                Ok(()) | Err(Errno::ESRCH) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Whether the OOM killer killed a process in the cgroup (`memory.events`: `oom_kill`).
    pub fn oom_killed(&self) -> bool {
        fs::read_to_string(self.dir.join("memory.events")).is_ok_and(|text| {
            text.lines().any(|l| {
                l.strip_prefix("oom_kill ")
                    .and_then(|n| n.trim().parse::<u64>().ok())
                    .is_some_and(|n| n > 0)
            })
        })
    }

    /// Removes the (empty) cgroup; a missing one is fine.
    pub fn remove(&self) -> io::Result<()> {
        match fs::remove_dir(&self.dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
}

/// Polls `cgroup` every 10 ms, `SIGKILL`ing what is left in it each time, until it holds no
/// process (the kernel empties a killed cgroup asynchronously); a missing cgroup holds none.
/// Fails when whether it is empty cannot be read, or with `TimedOut` when it still holds
/// processes after `timeout`. Removes nothing.
pub(crate) async fn empty_within(
    cgroup: &TaskCgroup,
    timeout: Duration,
) -> Result<(), CgroupError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    loop {
        tick.tick().await;
        let populated = cgroup.populated().map_err(|source| CgroupError {
            what: "reading the processes of",
            path: cgroup.dir.clone(),
            source,
        })?;
        if !populated {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(CgroupError {
                what: "waiting for the processes to leave",
                path: cgroup.dir.clone(),
                source: io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "still holds processes after {}",
                        berth_sys::short_duration(timeout)
                    ),
                ),
            });
        }
        let _ = cgroup.kill_all();
    }
}

#[cfg(test)]
mod tests {
    use std::{
        os::unix::process::ExitStatusExt as _,
        process::{Child, Command},
    };

    use super::*;
    use crate::devices::{self, DevicesCgroupSetting};

    /// Removes the test's parent cgroups, killing what is left in their children (best
    /// effort: only a failed test leaves any).
    struct Parents(Vec<(CgroupKind, PathBuf)>);

    impl Drop for Parents {
        fn drop(&mut self) {
            for (kind, dir) in &self.0 {
                for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
                    if entry.path().is_dir() {
                        let child = TaskCgroup::new(*kind, entry.path());
                        let _ = child.kill_all();
                        let _ = child.remove();
                    }
                }
                let _ = fs::remove_dir(dir);
            }
        }
    }

    /// A child process killed and reaped when dropped.
    struct Reaped(Child);

    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// The parents of a cgroup v2 and a devices cgroup this host offers, under a name of the
    /// test's.
    fn parents() -> Parents {
        let name = format!("berth-unit-{}", std::process::id());
        let mut parents = Vec::new();
        match prepare(&CgroupSetting::Auto { name: name.clone() }) {
            Ok(Some(parent)) => parents.push((CgroupKind::V2, parent.dir)),
            other => eprintln!("SKIPPED (cgroup v2): {other:?}"),
        }
        match devices::prepare(&DevicesCgroupSetting::Auto { name }) {
            Ok(Some(parent)) => parents.push((CgroupKind::Devices, parent.dir)),
            other => eprintln!("SKIPPED (devices cgroup): {other:?}"),
        }
        Parents(parents)
    }

    #[tokio::test]
    async fn a_cgroup_is_emptied_by_killing_and_only_an_empty_leftover_is_reused() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIPPED: needs root");
            return;
        }
        let parents = parents();
        for (kind, parent) in &parents.0 {
            let cgroup = TaskCgroup::new(*kind, parent.join("task"));
            cgroup.create().unwrap();
            let mut sleeper = Reaped(Command::new("sleep").arg("600").spawn().unwrap());
            let pid = sleeper.0.id();
            fs::write(cgroup.procs_file(), pid.to_string()).unwrap();
            assert_eq!(cgroup.pids().unwrap(), [pid], "{kind:?}");
            assert!(cgroup.populated().unwrap(), "{kind:?}");

            let err = cgroup.create().unwrap_err();
            assert_eq!(err.source.kind(), io::ErrorKind::AlreadyExists, "{kind:?}");
            assert!(
                err.source.to_string().contains("holds processes"),
                "{err:?}"
            );

            // Out of time at the first look: nothing is killed.
            let err = empty_within(&cgroup, Duration::ZERO).await.unwrap_err();
            assert_eq!(err.what, "waiting for the processes to leave");
            assert_eq!(err.source.kind(), io::ErrorKind::TimedOut);
            assert!(
                err.source
                    .to_string()
                    .starts_with("still holds processes after")
            );
            assert_eq!(cgroup.pids().unwrap(), [pid], "{kind:?}");

            empty_within(&cgroup, Duration::from_secs(10))
                .await
                .unwrap();
            let status = sleeper.0.wait().unwrap();
            assert_eq!(status.signal(), Some(Signal::SIGKILL as i32), "{kind:?}");
            assert!(!cgroup.populated().unwrap(), "{kind:?}");

            // An empty leftover (a crash) is reused.
            cgroup.create().unwrap();
            cgroup.remove().unwrap();
            assert!(!cgroup.dir.exists());
            // A missing cgroup holds nothing, and is removed already.
            assert!(cgroup.pids().unwrap().is_empty());
            assert!(!cgroup.populated().unwrap());
            cgroup.kill_all().unwrap();
            empty_within(&cgroup, Duration::ZERO).await.unwrap();
            cgroup.remove().unwrap();
        }
    }
}
