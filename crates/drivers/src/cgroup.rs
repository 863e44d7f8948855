//! Per-task cgroups (v2) for the `exec` driver.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use nix::{
    sys::{
        signal::{Signal, kill},
        statfs::{CGROUP2_SUPER_MAGIC, statfs},
    },
    unistd::{AccessFlags, Pid, access},
};

use crate::{procfs, task::TaskId};

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
    match fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
    }
    if !is_cgroup2(&dir) {
        return Err(format!(
            "{} is not on a cgroup v2 filesystem",
            dir.display()
        ));
    }
    access(&dir, AccessFlags::W_OK)
        .map_err(|e| format!("{} is not writable: {e}", dir.display()))?;
    let memory = enable_memory(&dir);
    Ok(Some(CgroupParent { dir, memory }))
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

/// A task's cgroup directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TaskCgroup {
    pub dir: PathBuf,
}

/// A task cgroup could not be made ready; `what` and `path` say where.
#[derive(Debug)]
pub(crate) struct CgroupError {
    pub what: &'static str,
    pub path: PathBuf,
    pub source: io::Error,
}

impl TaskCgroup {
    /// Creates the task's cgroup under `parent`, and sets `memory.max` when asked and possible.
    /// A left-over empty cgroup of the same name (from a crash) is reused; one with processes
    /// in it is an `AlreadyExists` error. Returns a warning when the memory limit is not set.
    pub fn create(
        parent: &CgroupParent,
        id: &TaskId,
        memory_max: Option<u64>,
    ) -> Result<(Self, Option<String>), CgroupError> {
        let dir = parent.dir.join(id.as_str());
        let err = |what, path: &Path, source| CgroupError {
            what,
            path: path.to_path_buf(),
            source,
        };
        match fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let procs = procfs::cgroup_procs(&dir)
                    .map_err(|e| err("reading the processes of", &dir, e))?;
                if !procs.is_empty() {
                    return Err(err(
                        "creating the cgroup",
                        &dir,
                        io::Error::new(
                            io::ErrorKind::AlreadyExists,
                            format!("it exists and holds processes {procs:?}"),
                        ),
                    ));
                }
            }
            Err(e) => return Err(err("creating the cgroup", &dir, e)),
        }
        let cgroup = Self { dir };
        let mut warning = None;
        if let Some(bytes) = memory_max {
            match &parent.memory {
                Ok(()) => {
                    let path = cgroup.dir.join("memory.max");
                    if let Err(e) = fs::write(&path, bytes.to_string()) {
                        let _ = cgroup.remove();
                        return Err(err("setting the memory limit in", &path, e));
                    }
                }
                Err(reason) => {
                    warning = Some(format!("memory limit not applied: {reason}"));
                }
            }
        }
        Ok((cgroup, warning))
    }

    /// `cgroup.procs`, which a process writes its pid to in order to join.
    pub fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// Pids in the cgroup.
    pub fn pids(&self) -> io::Result<Vec<u32>> {
        procfs::cgroup_procs(&self.dir)
    }

    /// Whether any process is in the cgroup (`cgroup.events`: `populated`). A missing cgroup is
    /// empty.
    pub fn populated(&self) -> io::Result<bool> {
        match fs::read_to_string(self.dir.join("cgroup.events")) {
            Ok(text) => Ok(text.lines().any(|l| l.trim() == "populated 1")),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `SIGKILL`s every process in the cgroup: `cgroup.kill` (Linux ≥ 5.14), else each pid.
    pub fn kill_all(&self) -> io::Result<()> {
        match fs::write(self.dir.join("cgroup.kill"), "1") {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound && !self.dir.exists() => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                for pid in self.pids()? {
                    let pid = i32::try_from(pid).map_err(io::Error::other)?;
                    match kill(Pid::from_raw(pid), Signal::SIGKILL) {
                        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
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
