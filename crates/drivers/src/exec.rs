//! `exec`: a process in its own mount namespace, with bind mounts and a cgroup.

use std::{
    io,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use nix::{
    sys::signal::{Signal, killpg},
    unistd::{Pid, geteuid},
};
use tokio::{io::AsyncReadExt as _, process::Command};

use crate::{
    cgroup::{self, CgroupParent, CgroupSetting, TaskCgroup},
    driver::{Capabilities, Driver, DriverFuture, Fingerprint, FsIsolation, Health},
    error::DriverError,
    event::EventSink,
    procfs,
    supervisor::{ProcessConfig, Supervisor, prepare_files, task_env},
    task::{ExitResult, Propagation, TaskConfig, TaskHandle, TaskId, TaskStats, TaskStatus},
};

/// The driver's name.
pub const EXEC: &str = "exec";

/// What the set-up script prints on stdout once the namespace is ready.
const READY: &[u8] = b"ready\n";

/// Most bytes of the set-up script's stderr kept for an error.
const SETUP_STDERR_LIMIT: u64 = 8192;

/// Runs inside the new mount namespace, as `sh -c SETUP_SCRIPT berth-exec <stdout log>
/// <stderr log> <cgroup.procs or ""> <mount> <mkdir> <working dir> <count> <mount point>…
/// <count> (<source> <destination> <ro|rw|shared>)… <count> <hidden dir>… <command> <args>…`.
/// The first list holds the shared mounts to make slaves before anything is mounted (only
/// when a bind mount is bidirectional: the namespace then keeps the host's propagation, so
/// its plugin root stays a peer of the host's). Every path arrives as an argument and is
/// quoted; nothing is interpolated into the script. Set-up errors go to stderr (a pipe the
/// driver reads); `ready` on stdout means the command is about to be executed.
const SETUP_SCRIPT: &str = r#"
fail() { printf 'berth exec: %s\n' "$*" >&2; exit 125; }
exec 3>>"$1" || fail "cannot open the stdout log $1"
exec 4>>"$2" || fail "cannot open the stderr log $2"
cgroup_procs=$3 mount_bin=$4 mkdir_bin=$5 workdir=$6 slaves=$7
shift 7
if [ -n "$cgroup_procs" ]; then
  printf '%s\n' "$$" >"$cgroup_procs" || fail "cannot join the cgroup ($cgroup_procs)"
fi
while [ "$slaves" -gt 0 ]; do
  "$mount_bin" --make-slave -- "$1" || fail "cannot make $1 a slave mount"
  shift
  slaves=$((slaves - 1))
done
count=$1
shift
while [ "$count" -gt 0 ]; do
  src=$1 dst=$2 mode=$3
  shift 3
  if [ -d "$src" ]; then
    "$mkdir_bin" -p -- "$dst" || fail "cannot create the mount point $dst"
  else
    "$mkdir_bin" -p -- "${dst%/*}/" || fail "cannot create the directory of $dst"
    if [ ! -e "$dst" ]; then
      : >>"$dst" || fail "cannot create the mount point $dst"
    fi
  fi
  if [ "$mode" = shared ]; then
    "$mount_bin" --rbind -- "$src" "$dst" || fail "cannot bind-mount $src at $dst"
  else
    "$mount_bin" --bind -- "$src" "$dst" || fail "cannot bind-mount $src at $dst"
  fi
  if [ "$mode" = ro ]; then
    "$mount_bin" -o remount,bind,ro -- "$dst" || fail "cannot make $dst read-only"
  fi
  count=$((count - 1))
done
hidden=$1
shift
while [ "$hidden" -gt 0 ]; do
  if [ -d "$1" ]; then
    "$mount_bin" -t tmpfs -o ro,mode=0,size=4k -- berth-hidden "$1" || fail "cannot hide $1"
  fi
  shift
  hidden=$((hidden - 1))
done
cd "$workdir" || fail "cannot enter the working directory $workdir"
command -v "$1" >/dev/null 2>&1 || fail "command not found: $1"
printf 'ready\n'
exec 1>&3 2>&4 3>&- 4>&-
exec "$@"
"#;

/// Options of the [`ExecDriver`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecConfig {
    /// Where task cgroups go.
    pub cgroup: CgroupSetting,
    /// How long the set-up in the new namespace (mounts, cgroup) may take.
    pub setup_timeout: Duration,
    /// How processes are watched and stopped.
    pub process: ProcessConfig,
    /// Host directories a task must not see (e.g. where other allocs' volumes are mounted):
    /// an empty read-only tmpfs covers each, after the task's own bind mounts are made, so a
    /// bind mount whose destination lies inside one is covered too.
    pub hidden: Vec<PathBuf>,
}

impl Default for ExecConfig {
    fn default() -> Self {
        Self {
            cgroup: CgroupSetting::default(),
            setup_timeout: Duration::from_secs(30),
            process: ProcessConfig::default(),
            hidden: Vec::new(),
        }
    }
}

/// What the host offers, found by the fingerprint.
#[derive(Debug, Clone)]
struct Host {
    unshare: PathBuf,
    mount: PathBuf,
    mkdir: PathBuf,
    sh: PathBuf,
    /// `Ok(None)`: disabled; `Err(reason)`: unavailable.
    cgroups: Result<Option<CgroupParent>, String>,
}

/// Runs a task like `raw_exec` (own process group, logs, environment, survives the agent),
/// but in its own mount namespace: the task sees the host's filesystem (there is no chroot
/// yet) plus its [`BindMount`](crate::BindMount)s, minus the [`ExecConfig::hidden`]
/// directories, and mounts made in it never show on the
/// host (the task's namespace is a slave of the host's: host unmounts reach it, its own mounts
/// never leave it). Mount points missing on the host are created there.
///
/// The process is started as `unshare --mount --propagation slave -- sh -c <set-up>`: the
/// script joins the task's cgroup, makes the bind mounts, enters the working directory and
/// executes the command, so the pid is the command's (no extra process stays around). A
/// set-up failure fails [`start`](Driver::start) with the script's message.
///
/// Each task gets a cgroup v2 (`<parent>/<task id>`) when the host has a writable cgroup v2
/// hierarchy, with `memory.max` from the task's resources when the memory controller is
/// available; the fingerprint's attributes say what is available and why not.
///
/// Needs root, util-linux's `unshare` and `mount`, `mkdir` and `sh`.
#[derive(Debug)]
pub struct ExecDriver {
    sup: Supervisor,
    config: ExecConfig,
    host: Mutex<Option<Arc<Host>>>,
}

impl ExecDriver {
    /// A driver sending its task events to `events`.
    pub fn new(events: EventSink, config: ExecConfig) -> Self {
        Self {
            sup: Supervisor::new(EXEC, events, config.process.clone()),
            config,
            host: Mutex::new(None),
        }
    }

    /// Looks at the host; `Err(reason)` when tasks cannot run.
    async fn detect(&self) -> Result<Host, String> {
        let euid = geteuid();
        let tools = find_tools(euid.is_root(), euid.as_raw(), procfs::find_program)?;
        let host = Host {
            unshare: tools.unshare,
            mount: tools.mount,
            mkdir: tools.mkdir,
            sh: tools.sh,
            cgroups: cgroup::prepare(&self.config.cgroup),
        };
        probe_unshare(&host).await?;
        Ok(host)
    }

    /// The host as last fingerprinted (or found now if never).
    async fn host(&self) -> Result<Arc<Host>, String> {
        if let Some(host) = self.lock_host().clone() {
            return Ok(host);
        }
        let host = Arc::new(self.detect().await?);
        *self.lock_host() = Some(host.clone());
        Ok(host)
    }

    fn lock_host(&self) -> std::sync::MutexGuard<'_, Option<Arc<Host>>> {
        self.host.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn fingerprint_host(&self) -> Fingerprint {
        let host = match self.detect().await {
            Ok(host) => Arc::new(host),
            Err(reason) => {
                *self.lock_host() = None;
                let mut fp = Fingerprint::new(Health::Unhealthy, reason);
                fp.attributes.insert(format!("driver.{EXEC}"), "0".into());
                return fp;
            }
        };
        let mut fp = Fingerprint::new(
            Health::Healthy,
            "runs processes in their own mount namespace",
        );
        let attrs = &mut fp.attributes;
        attrs.insert(format!("driver.{EXEC}"), "1".into());
        attrs.insert(
            format!("driver.{EXEC}.fs_isolation"),
            "mount-namespace".into(),
        );
        attrs.insert(
            format!("driver.{EXEC}.unshare"),
            host.unshare.display().to_string(),
        );
        match &host.cgroups {
            Ok(Some(parent)) => {
                attrs.insert(
                    format!("driver.{EXEC}.cgroup"),
                    parent.dir.display().to_string(),
                );
                attrs.insert(
                    format!("driver.{EXEC}.cgroup.memory"),
                    match &parent.memory {
                        Ok(()) => "enabled".into(),
                        Err(reason) => format!("unavailable: {reason}"),
                    },
                );
            }
            Ok(None) => {
                attrs.insert(format!("driver.{EXEC}.cgroup"), "disabled".into());
            }
            Err(reason) => {
                attrs.insert(
                    format!("driver.{EXEC}.cgroup"),
                    format!("unavailable: {reason}"),
                );
            }
        }
        *self.lock_host() = Some(host);
        fp
    }

    async fn start_task(&self, config: TaskConfig) -> Result<TaskHandle, DriverError> {
        config.validate()?;
        let host = self
            .host()
            .await
            .map_err(|reason| DriverError::DriverUnhealthy {
                task_id: config.id.clone(),
                driver: EXEC.into(),
                reason,
            })?;
        for (i, mount) in config.mounts.iter().enumerate() {
            if let Err(e) = std::fs::metadata(&mount.source) {
                return Err(DriverError::InvalidConfig {
                    task_id: config.id.clone(),
                    field: format!("mounts[{i}].source"),
                    reason: format!("{}: {e}", mount.source.display()),
                });
            }
        }
        let reservation = self.sup.reserve(&config.id)?;
        prepare_files(&config)?;

        let mut notes = Vec::new();
        let memory = config.resources.memory_max_bytes;
        let cgroup = match &host.cgroups {
            Ok(Some(parent)) => {
                let (cg, warning) =
                    TaskCgroup::create(parent, &config.id, memory).map_err(|e| {
                        DriverError::Cgroup {
                            task_id: config.id.clone(),
                            what: e.what,
                            path: e.path,
                            source: e.source,
                        }
                    })?;
                notes.extend(warning);
                Some(cg)
            }
            Ok(None) => {
                notes.push("no cgroup: disabled".to_owned());
                None
            }
            Err(reason) => {
                notes.push(format!("no cgroup: {reason}"));
                None
            }
        };
        if cgroup.is_none() && memory.is_some() {
            notes.push("memory limit not applied".into());
        }
        for note in &notes {
            tracing::warn!(task_id = %config.id, "{note}");
        }

        let slaves = slaves_for(&config)?;
        let mut cmd = Command::new(&host.unshare);
        // Slave: unmounts on the host (another alloc's volume released) reach the task's copy,
        // so it never pins them; the task's own mounts still stay private to it. With a
        // bidirectional mount, every shared mount but that one's is made a slave by the script.
        let propagation = if slaves.is_some() {
            "unchanged"
        } else {
            "slave"
        };
        cmd.args(["--mount", "--propagation", propagation, "--"])
            .arg(&host.sh)
            .args(["-c", SETUP_SCRIPT, "berth-exec"])
            .arg(&config.stdout_path)
            .arg(&config.stderr_path)
            .arg(
                cgroup
                    .as_ref()
                    .map(TaskCgroup::procs_file)
                    .unwrap_or_default(),
            )
            .arg(&host.mount)
            .arg(&host.mkdir)
            .arg(&config.dir);
        let slaves = slaves.unwrap_or_default();
        cmd.arg(slaves.len().to_string()).args(&slaves);
        cmd.arg(config.mounts.len().to_string());
        for mount in &config.mounts {
            cmd.arg(&mount.source)
                .arg(normalized(&mount.destination))
                .arg(match (mount.propagation, mount.read_only) {
                    (Propagation::Bidirectional, _) => "shared",
                    (Propagation::HostToTask, true) => "ro",
                    (Propagation::HostToTask, false) => "rw",
                });
        }
        cmd.arg(self.config.hidden.len().to_string())
            .args(&self.config.hidden);
        cmd.arg(&config.command)
            .args(&config.args)
            .env_clear()
            .envs(task_env(&config, &self.config.process))
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(false);
        let mut abandon = Abandon { pgid: None, cgroup };
        let mut child = cmd.spawn().map_err(|source| DriverError::Spawn {
            task_id: config.id.clone(),
            program: host.unshare.display().to_string(),
            source,
        })?;
        abandon.pgid = child.id();

        let pipes = (child.stdout.take(), child.stderr.take());
        let setup = async {
            let (Some(mut stdout), Some(mut stderr)) = pipes else {
                let missing = io::Error::other("stdout or stderr is not a pipe");
                return (Err(missing), Ok(Vec::new()));
            };
            let mut out = Vec::new();
            let mut err = Vec::new();
            let mut stdout = (&mut stdout).take(READY.len() as u64 + 1);
            let mut stderr = (&mut stderr).take(SETUP_STDERR_LIMIT);
            let (r_out, r_err) =
                tokio::join!(stdout.read_to_end(&mut out), stderr.read_to_end(&mut err),);
            (r_out.map(|_| out), r_err.map(|_| err))
        };
        let failure = match tokio::time::timeout(self.config.setup_timeout, setup).await {
            Ok((Ok(out), err)) if out == READY => {
                let err = err.unwrap_or_default();
                if !err.is_empty() {
                    tracing::warn!(task_id = %config.id, stderr = %String::from_utf8_lossy(&err).trim(), "set-up wrote to stderr");
                }
                None
            }
            Ok((_, err)) => Some(
                String::from_utf8_lossy(&err.unwrap_or_default())
                    .trim()
                    .to_owned(),
            ),
            Err(_) => Some(format!(
                "did not finish within {:?}",
                self.config.setup_timeout
            )),
        };
        if let Some(mut message) = failure {
            abandon.kill_group();
            match child.wait().await {
                Ok(status) if message.is_empty() => message = format!("set-up {status}"),
                _ => {}
            }
            // Reaped: the group id may be reused from now on.
            abandon.pgid = None;
            drop(abandon);
            return Err(DriverError::Setup {
                task_id: config.id.clone(),
                message,
            });
        }
        let note = (!notes.is_empty()).then(|| notes.join("; "));
        let cgroup = abandon.disarm();
        reservation.commit_child(child, cgroup, note).await
    }
}

/// Kills the process group and cgroup of a task whose start is abandoned (an error, or the
/// `start` future dropped during set-up) before the supervisor owns it, and removes the
/// cgroup (best effort: a cgroup still emptying stays, and is reused by the next start of
/// the id).
#[derive(Debug)]
struct Abandon {
    pgid: Option<u32>,
    cgroup: Option<TaskCgroup>,
}

impl Abandon {
    fn kill_group(&self) {
        if let Some(pgid) = self.pgid {
            let _ = killpg(Pid::from_raw(pgid as i32), Signal::SIGKILL);
        }
    }

    /// The task is handed over: nothing to kill.
    fn disarm(mut self) -> Option<TaskCgroup> {
        self.pgid = None;
        self.cgroup.take()
    }
}

impl Drop for Abandon {
    fn drop(&mut self) {
        self.kill_group();
        if let Some(cg) = self.cgroup.take() {
            let _ = cg.kill_all();
            let _ = cg.remove();
        }
    }
}

/// The programs the driver runs.
#[derive(Debug, PartialEq, Eq)]
struct Tools {
    unshare: PathBuf,
    mount: PathBuf,
    mkdir: PathBuf,
    sh: PathBuf,
}

/// Checks the privileges and finds the programs; the error is the reason tasks cannot run.
fn find_tools(
    root: bool,
    euid: u32,
    find: impl Fn(&str) -> Option<PathBuf>,
) -> Result<Tools, String> {
    if !root {
        return Err(format!(
            "must run as root to make mount namespaces (euid is {euid})"
        ));
    }
    let find = |name: &str| find(name).ok_or_else(|| format!("{name} not found in PATH"));
    Ok(Tools {
        unshare: find("unshare")?,
        mount: find("mount")?,
        mkdir: find("mkdir")?,
        sh: find("sh")?,
    })
}

/// With a bidirectional bind mount in `config`: the host's shared mounts outside every
/// bidirectional source, which the task's namespace must turn into slaves (so nothing it mounts
/// elsewhere reaches the host). `None` when no mount is bidirectional. Fails when a
/// bidirectional source does not lie on a shared mount (nothing would travel).
fn slaves_for(config: &TaskConfig) -> Result<Option<Vec<PathBuf>>, DriverError> {
    let sources: Vec<(usize, &Path)> = config
        .mounts
        .iter()
        .enumerate()
        .filter(|(_, m)| m.propagation == Propagation::Bidirectional)
        .map(|(i, m)| (i, m.source.as_path()))
        .collect();
    if sources.is_empty() {
        return Ok(None);
    }
    let table = berth_sys::Mounter::mounts(&berth_sys::LinuxMounter).map_err(|e| {
        DriverError::InvalidConfig {
            task_id: config.id.clone(),
            field: "mounts".into(),
            reason: format!("reading the mount table: {e}"),
        }
    })?;
    for (i, source) in &sources {
        if !berth_sys::containing_mount(&table, source).is_some_and(|e| e.shared) {
            return Err(DriverError::InvalidConfig {
                task_id: config.id.clone(),
                field: format!("mounts[{i}].propagation"),
                reason: format!("bidirectional needs {} on a shared mount", source.display()),
            });
        }
    }
    let mut points: Vec<PathBuf> = table
        .iter()
        .filter(|e| e.shared)
        .filter(|e| !sources.iter().any(|(_, s)| e.mount_point.starts_with(s)))
        .map(|e| e.mount_point.clone())
        .collect();
    // Stacked mounts repeat a mount point, not always next to each other.
    points.sort();
    points.dedup();
    Ok(Some(points))
}

/// `path` without trailing `/` or `.` components.
fn normalized(path: &Path) -> PathBuf {
    path.components().collect()
}

/// Checks that a mount namespace can be made: `unshare --mount --propagation slave -- sh -c :`.
async fn probe_unshare(host: &Host) -> Result<(), String> {
    let mut cmd = Command::new(&host.unshare);
    cmd.args(["--mount", "--propagation", "slave", "--"])
        .arg(&host.sh)
        .args(["-c", ":"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(10), cmd.output())
        .await
        .map_err(|_| "unshare --mount did not finish within 10s".to_owned())?
        .map_err(|e| format!("running {}: {e}", host.unshare.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "cannot make a mount namespace: unshare {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Driver for ExecDriver {
    fn name(&self) -> &str {
        EXEC
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fs_isolation: FsIsolation::MountNamespace,
            send_signals: true,
            exec: false,
            bind_mounts: true,
            resource_limits: true,
        }
    }

    fn fingerprint(&self) -> DriverFuture<'_, Fingerprint> {
        Box::pin(self.fingerprint_host())
    }

    fn start(&self, config: TaskConfig) -> DriverFuture<'_, Result<TaskHandle, DriverError>> {
        Box::pin(self.start_task(config))
    }

    fn wait<'a>(
        &'a self,
        task_id: &'a TaskId,
    ) -> DriverFuture<'a, Result<ExitResult, DriverError>> {
        Box::pin(self.sup.wait(task_id))
    }

    fn stop<'a>(
        &'a self,
        task_id: &'a TaskId,
        timeout: Duration,
        signal: Signal,
    ) -> DriverFuture<'a, Result<(), DriverError>> {
        Box::pin(self.sup.stop(task_id, timeout, signal))
    }

    fn destroy<'a>(&'a self, task_id: &'a TaskId) -> DriverFuture<'a, Result<(), DriverError>> {
        Box::pin(self.sup.destroy(task_id))
    }

    fn inspect(&self, task_id: &TaskId) -> Result<TaskStatus, DriverError> {
        self.sup.inspect(task_id)
    }

    fn signal(&self, task_id: &TaskId, signal: Signal) -> Result<(), DriverError> {
        self.sup.signal(task_id, signal)
    }

    fn stats<'a>(
        &'a self,
        task_id: &'a TaskId,
    ) -> DriverFuture<'a, Result<TaskStats, DriverError>> {
        Box::pin(async move { self.sup.stats(task_id) })
    }

    fn recover(&self, handle: TaskHandle) -> DriverFuture<'_, Result<(), DriverError>> {
        Box::pin(async move { self.sup.recover(handle) })
    }

    fn shutdown(&self) -> DriverFuture<'_, ()> {
        Box::pin(self.sup.shutdown())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unhealthy_reasons_name_what_is_missing() {
        let all = |name: &str| Some(PathBuf::from(format!("/bin/{name}")));
        assert_eq!(
            find_tools(false, 1000, all).unwrap_err(),
            "must run as root to make mount namespaces (euid is 1000)"
        );
        let no_mount = |name: &str| (name != "mount").then(|| PathBuf::from(name));
        assert_eq!(
            find_tools(true, 0, no_mount).unwrap_err(),
            "mount not found in PATH"
        );
        let tools = find_tools(true, 0, all).unwrap();
        assert_eq!(tools.unshare, PathBuf::from("/bin/unshare"));
        assert_eq!(tools.sh, PathBuf::from("/bin/sh"));
    }

    #[test]
    fn destinations_are_normalized() {
        assert_eq!(normalized(Path::new("/a/./b/")), PathBuf::from("/a/b"));
    }
}
