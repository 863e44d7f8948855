//! `exec`: a process in a root of its own (a chroot in its own mount and PID namespaces), with bind mounts and a cgroup.

use std::{
    collections::BTreeMap,
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
    cgroup::{self, CgroupParent, CgroupSetting, TaskCgroup, empty_within},
    devices::{self, DeviceBind, DevicesCgroupSetting, DevicesParent},
    driver::{Capabilities, Driver, DriverFuture, Fingerprint, FsIsolation, Health},
    error::DriverError,
    event::EventSink,
    logs::prepare_outputs,
    procfs,
    supervisor::{Isolation, ProcessConfig, Supervisor, task_env},
    task::{
        ExitResult, PidMode, Propagation, TaskConfig, TaskHandle, TaskId, TaskStats, TaskStatus,
        normalized,
    },
    task_exec::{ExecRequest, ExecSession},
};

/// The driver's name.
pub const EXEC: &str = "exec";

/// What the set-up script prints on stdout once the namespace is ready.
const READY: &[u8] = b"ready\n";

/// Most bytes of the set-up script's stderr kept for an error.
const SETUP_STDERR_LIMIT: u64 = 8192;

/// Runs in the task's new mount namespace (as PID 1 of its new PID namespace with a private
/// `pid_mode`), as `sh -c SETUP_SCRIPT berth-exec <stdout log> <stderr log> <cgroup.procs or
/// ""> <mount> <mkdir> <ln> <chroot> <root> <init 0|1> <devices cgroup.procs or ""> <uid>
/// <gid> <groups> <privileged 0|1> <cp> <chown> <count> <shared mount to make a slave>…
/// <count> (<source>
/// <path in root> <ro|rw> <keep|private|slave|shared>)… <count> (<device node> <path in root>
/// <make the mount point in the task's /dev 0|1>)… <command> <args>…`. It joins the cgroup and
/// the devices cgroup, makes the slaves (only with a bidirectional mount), mounts the root's
/// own file systems (`secrets` tmpfs, holding a copy of what the agent put in the root's
/// `secrets/` before the start and owned by the task's user; `proc`, `dev`, `sys`), then the
/// binds in order
/// (chroot_env, alloc, the task's mounts), then the device nodes, says `ready`, and runs the
/// command chrooted as the task's user. With `init`, it stays as PID 1,
/// passing signals on to the command and exiting with its status (a PID 1 ignores signals it
/// has no handler for). Every mount point exists already (see [`crate::root`]); every path
/// arrives as an argument and is quoted; nothing is interpolated into the script.
const SETUP_SCRIPT: &str = r#"
fail() { printf 'berth exec: %s\n' "$*" >&2; exit 125; }
exec 3>>"$1" || fail "cannot open the stdout log $1"
exec 4>>"$2" || fail "cannot open the stderr log $2"
cgroup_procs=$3 mount_bin=$4 mkdir_bin=$5 ln_bin=$6 chroot_bin=$7 root=$8 init=$9
shift 9
devices_procs=$1 uid=$2 gid=$3 groups=$4 privileged=$5 cp_bin=$6 chown_bin=$7 slaves=$8
shift 8
if [ -n "$cgroup_procs" ]; then
  printf '%s\n' "$$" >"$cgroup_procs" || fail "cannot join the cgroup ($cgroup_procs)"
fi
if [ -n "$devices_procs" ]; then
  printf '%s\n' "$$" >"$devices_procs" || fail "cannot join the devices cgroup ($devices_procs)"
fi
while [ "$slaves" -gt 0 ]; do
  "$mount_bin" --make-slave -- "$1" || fail "cannot make $1 a slave mount"
  shift
  slaves=$((slaves - 1))
done
# The root is a mount of its own (private): what runs in it sees `/` in its mount table, with
# where it lies on its filesystem, as in a container.
"$mount_bin" --bind -- "$root" "$root" || fail "cannot bind the root onto itself"
"$mount_bin" --make-private -- "$root" || fail "cannot make the root private"
# The secrets the agent wrote (si_token…) go into the task's own tmpfs: this shell's working
# directory keeps seeing the host directory once the tmpfs covers it.
cd -- "$root/secrets" || fail "cannot enter the task's secrets directory"
"$mount_bin" -t tmpfs -o "mode=0700,uid=$uid,gid=$gid,size=16m,nosuid,nodev" berth-secrets "$root/secrets" \
  || fail "cannot mount the task's secrets"
"$cp_bin" -pR -- ./. "$root/secrets/" || fail "cannot copy the task's secrets"
"$chown_bin" -R -h -- "$uid:$gid" "$root/secrets" || fail "cannot give the task its secrets"
cd / || fail "cannot leave the task's secrets directory"
"$mount_bin" -t proc -o nosuid,nodev,noexec proc "$root/proc" || fail "cannot mount /proc"
if [ "$privileged" = 1 ]; then
  "$mount_bin" --rbind -- /dev "$root/dev" || fail "cannot bind /dev"
  "$mount_bin" --rbind -- /sys "$root/sys" || fail "cannot bind /sys"
else
  "$mount_bin" -t tmpfs -o mode=0755,size=64k,nosuid berth-dev "$root/dev" || fail "cannot mount /dev"
  for n in null zero full random urandom tty; do
    : >"$root/dev/$n" && "$mount_bin" --bind -- "/dev/$n" "$root/dev/$n" || fail "cannot bind /dev/$n"
  done
  "$mkdir_bin" -p -- "$root/dev/shm" "$root/dev/pts" || fail "cannot make /dev/shm"
  "$mount_bin" -t tmpfs -o mode=1777,size=64m,nosuid,nodev shm "$root/dev/shm" || fail "cannot mount /dev/shm"
  "$mount_bin" -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$root/dev/pts" 2>/dev/null || true
  "$ln_bin" -s /proc/self/fd "$root/dev/fd"
  "$ln_bin" -s /proc/self/fd/0 "$root/dev/stdin"
  "$ln_bin" -s /proc/self/fd/1 "$root/dev/stdout"
  "$ln_bin" -s /proc/self/fd/2 "$root/dev/stderr"
  "$mount_bin" -t sysfs -o ro,nosuid,nodev,noexec sysfs "$root/sys" || fail "cannot mount /sys"
fi
count=$1
shift
while [ "$count" -gt 0 ]; do
  src=$1 dst=$root$2 access=$3 prop=$4
  shift 4
  if [ "$prop" = shared ]; then
    "$mount_bin" --rbind -- "$src" "$dst" || fail "cannot bind-mount $src at ${dst#"$root"}"
  else
    "$mount_bin" --bind -- "$src" "$dst" || fail "cannot bind-mount $src at ${dst#"$root"}"
  fi
  if [ "$access" = ro ]; then
    "$mount_bin" -o remount,bind,ro -- "$dst" || fail "cannot make ${dst#"$root"} read-only"
  fi
  case $prop in
    private) "$mount_bin" --make-private -- "$dst" || fail "cannot make ${dst#"$root"} private" ;;
    slave) "$mount_bin" --make-slave -- "$dst" || fail "cannot make ${dst#"$root"} a slave" ;;
  esac
  count=$((count - 1))
done
count=$1
shift
while [ "$count" -gt 0 ]; do
  src=$1 dst=$root$2 make=$3
  shift 3
  if [ "$make" = 1 ]; then
    # In the task's fresh /dev tmpfs, which holds nothing but what this script made.
    "$mkdir_bin" -p -- "${dst%/*}" || fail "cannot make the directory of ${dst#"$root"}"
    [ -e "$dst" ] || : >"$dst" || fail "cannot make the mount point ${dst#"$root"}"
  fi
  "$mount_bin" --bind -- "$src" "$dst" || fail "cannot bind the device node $src at ${dst#"$root"}"
  count=$((count - 1))
done
if [ "$init" = 1 ]; then
  # The command's process is forked before any trap is set, so it starts with every signal's
  # default disposition: a handler it inherited could catch a signal and drop it before the
  # command is exec'd. Nothing signals the task before `ready`; from then on this PID 1 has
  # its traps and passes each signal on.
  (
    exec 1>&3 2>&4 3>&- 4>&-
    exec "$chroot_bin" --userspec="$uid:$gid" --groups="$groups" -- "$root" "$@"
  ) &
  child=$!
  for s in TERM INT HUP QUIT USR1 USR2; do
    trap "kill -s $s $child 2>/dev/null" "$s"
  done
  printf 'ready\n'
  exec 1>&3 2>&4 3>&- 4>&-
  status=0
  while :; do
    wait "$child"
    status=$?
    kill -0 "$child" 2>/dev/null || break
  done
  exit "$status"
fi
printf 'ready\n'
exec 1>&3 2>&4 3>&- 4>&-
exec "$chroot_bin" --userspec="$uid:$gid" --groups="$groups" -- "$root" "$@"
"#;

/// Options of the [`ExecDriver`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecConfig {
    /// Where task cgroups go.
    pub cgroup: CgroupSetting,
    /// Where tasks' devices cgroups go (cgroup v1 hosts only).
    pub devices_cgroup: DevicesCgroupSetting,
    /// How long the set-up in the new namespace (mounts, cgroup) may take.
    pub setup_timeout: Duration,
    /// How processes are watched and stopped.
    pub process: ProcessConfig,
    /// Host paths bound read-only into every task's root: host path → path in the root.
    /// Entries whose host path is missing are skipped. Default: Nomad's `chroot_env`.
    pub chroot_env: BTreeMap<PathBuf, PathBuf>,
    /// Who a task runs as when it names no user: `nobody`, as Nomad's exec.
    pub default_user: String,
}

/// Nomad's default `chroot_env`: each of these at its own path.
pub const DEFAULT_CHROOT_ENV: [&str; 8] = [
    "/bin",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/run/resolvconf",
    "/sbin",
    "/usr",
];

impl Default for ExecConfig {
    fn default() -> Self {
        Self {
            cgroup: CgroupSetting::default(),
            devices_cgroup: DevicesCgroupSetting::default(),
            setup_timeout: Duration::from_secs(30),
            process: ProcessConfig::default(),
            chroot_env: DEFAULT_CHROOT_ENV
                .iter()
                .map(|p| (PathBuf::from(p), PathBuf::from(p)))
                .collect(),
            default_user: "nobody".into(),
        }
    }
}

/// What the host offers, found by the fingerprint.
#[derive(Debug, Clone)]
struct Host {
    unshare: PathBuf,
    mount: PathBuf,
    mkdir: PathBuf,
    ln: PathBuf,
    chroot: PathBuf,
    sh: PathBuf,
    cp: PathBuf,
    chown: PathBuf,
    /// `Ok(None)`: disabled; `Err(reason)`: unavailable.
    cgroups: Result<Option<CgroupParent>, String>,
    /// Where devices cgroups go; `Ok(None)`: disabled; `Err(reason)`: unavailable.
    devices: Result<Option<DevicesParent>, String>,
}

/// Runs a task like `raw_exec` (own process group, logs, environment, survives the agent),
/// but in a root of its own, as Nomad's exec: its [`TaskDirs::task_dir`](crate::TaskDirs)
/// becomes its `/`, holding the [`ExecConfig::chroot_env`] read-only, `alloc/` (the alloc's
/// shared directory), `local/` and `tmp/`, `secrets/` (a tmpfs only it sees), a small `/dev`,
/// `/proc` and a read-only `/sys` (the host's `/dev` and `/sys` when
/// [`privileged`](TaskConfig::privileged)), its [`BindMount`](crate::BindMount)s at their
/// destinations in the root, then its [`TaskDevice`](crate::TaskDevice)s' nodes bound at
/// their `task_path`s. Every mount is made in the task's own mount namespace (a slave of the
/// host's: host unmounts reach it, its own mounts never leave it); mount points are made in
/// the task's directory (or, for device nodes under `/dev`, in the task's own `/dev` tmpfs),
/// never following a symlink and never elsewhere on the host. It runs as its user (default
/// [`ExecConfig::default_user`]) in a PID namespace of its own unless
/// [`PidMode::Host`](crate::PidMode).
///
/// The process is started as `unshare --mount [--pid --fork] -- sh -c <set-up>`: the script
/// joins the task's cgroups, mounts, and runs the command through `chroot --userspec`; with a
/// PID namespace it stays as its PID 1, passing signals on. A set-up failure fails
/// [`start`](Driver::start) with the script's message, and removes the task's cgroups.
///
/// Each task gets a cgroup v2 (`<parent>/<task id>`) when the host has a writable cgroup v2
/// hierarchy, with `memory.max` from the task's resources when the memory controller is
/// available; the fingerprint's attributes say what is available and why not.
///
/// Devices: a device's host path must be a character or block device node; its task path may
/// not lie in `/proc`, `/sys`, `/alloc`, `/secrets`, a chroot_env entry, a bind mount, or what
/// the driver makes in `/dev` itself (`fd`, `std*`, `pts`, `shm`). On hosts with the cgroup
/// v1 `devices` controller each task (but a privileged one, which sees the host's devices)
/// also gets a devices cgroup, `<the agent's devices cgroup>/<name>/<task id>`
/// ([`ExecConfig::devices_cgroup`]), joined before anything is mounted: every device is denied
/// but those a container usually gets (`mknod` of any node, `/dev/null`, `zero`, `full`,
/// `random`, `urandom`, `tty`, `console`, `ptmx`, `pts/*`) and each of the task's nodes with
/// its permissions. It is removed with the task's cgroup, and found again from the task id by
/// [`recover`](Driver::recover). Without the controller (cgroup v2 only: device access there
/// would need an eBPF program, which berth does not load) the nodes are bound all the same and
/// device access is not restricted. The fingerprint's `driver.exec.devices_cgroup` says which.
/// A privileged task's device under `/dev` must keep its host path (it is visible already).
///
/// What the task's set-up leaves unsaid in its state (no cgroup, a limit not applied, the
/// device nodes it got, the device access it is allowed) is sent as
/// [`Note`](crate::TaskEventKind::Note) events, one per fact, right after `Started`.
///
/// Needs root, util-linux's `unshare` and `mount`, coreutils' `chroot`, `mkdir` and `ln`, and
/// `sh`.
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
            ln: tools.ln,
            chroot: tools.chroot,
            sh: tools.sh,
            cp: tools.cp,
            chown: tools.chown,
            cgroups: cgroup::prepare(&self.config.cgroup),
            devices: devices::prepare(&self.config.devices_cgroup),
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
            "runs processes in a root of their own (a chroot in their own mount and PID namespaces)",
        );
        let attrs = &mut fp.attributes;
        attrs.insert(format!("driver.{EXEC}"), "1".into());
        attrs.insert(format!("driver.{EXEC}.fs_isolation"), "chroot".into());
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
        attrs.insert(
            format!("driver.{EXEC}.devices_cgroup"),
            match &host.devices {
                Ok(Some(parent)) => parent.dir.display().to_string(),
                Ok(None) => "disabled".into(),
                Err(reason) => format!("unavailable: {reason}"),
            },
        );
        *self.lock_host() = Some(host);
        fp
    }

    async fn start_task(&self, config: TaskConfig) -> Result<TaskHandle, DriverError> {
        config.validate()?;
        config.refuse_container(EXEC)?;
        let host = self
            .host()
            .await
            .map_err(|reason| DriverError::DriverUnhealthy {
                task_id: config.id.clone(),
                driver: EXEC.into(),
                reason,
            })?;
        let invalid = |field: &str, reason: String| DriverError::InvalidConfig {
            task_id: config.id.clone(),
            field: field.into(),
            reason,
        };
        for (i, mount) in config.mounts.iter().enumerate() {
            if let Err(e) = std::fs::metadata(&mount.source) {
                return Err(invalid(
                    &format!("mounts[{i}].source"),
                    format!("{}: {e}", mount.source.display()),
                ));
            }
        }
        let dirs = config.dirs.clone().ok_or_else(|| {
            invalid(
                "dirs",
                "exec needs the task's directories (its root)".into(),
            )
        })?;
        let user = config
            .user
            .clone()
            .unwrap_or_else(|| self.config.default_user.clone());
        let who = crate::root::resolve_user(&user).map_err(|reason| invalid("user", reason))?;
        let root = dirs.task_dir.clone();
        let chroot_env =
            crate::root::prepare(&root, &who, &self.config.chroot_env).map_err(|e| {
                invalid(
                    "dirs.task_dir",
                    format!("laying out {}: {e}", root.display()),
                )
            })?;
        // What gets a mount of its own: a task's mount under one would be hidden, or would
        // write through a read-only bind to the host.
        let taken: Vec<PathBuf> = ["/alloc", "/secrets", "/proc", "/dev", "/sys"]
            .iter()
            .map(PathBuf::from)
            .chain(chroot_env.iter().map(|(_, dst)| dst.clone()))
            .collect();
        // Devices are checked before any mount point is made; they may go in `/dev`.
        let planned = {
            let taken: Vec<PathBuf> = taken
                .iter()
                .filter(|t| t.as_path() != Path::new("/dev"))
                .cloned()
                .collect();
            let mounts: Vec<PathBuf> = config
                .mounts
                .iter()
                .map(|m| normalized(&m.destination))
                .collect();
            devices::plan(&config.devices, config.privileged, &taken, &mounts)
                .map_err(|(field, reason)| invalid(&field, reason))?
        };
        let mut binds: Vec<(PathBuf, PathBuf, &str, &str)> = chroot_env
            .iter()
            .map(|(src, dst)| (src.clone(), dst.clone(), "ro", "keep"))
            .collect();
        binds.push((dirs.alloc_dir.clone(), "/alloc".into(), "rw", "keep"));
        for (i, m) in config.mounts.iter().enumerate() {
            let dest = normalized(&m.destination);
            if let Some(t) = taken.iter().find(|t| dest.starts_with(t)) {
                return Err(invalid(
                    &format!("mounts[{i}].destination"),
                    format!(
                        "{} lies in {}, which the task's root mounts itself",
                        dest.display(),
                        t.display()
                    ),
                ));
            }
            let file = std::fs::metadata(&m.source).is_ok_and(|md| !md.is_dir());
            crate::root::make_point(&root, &dest, file).map_err(|e| {
                invalid(
                    &format!("mounts[{i}].destination"),
                    format!("making the mount point: {e}"),
                )
            })?;
            let (access, prop) = match m.propagation {
                Propagation::Bidirectional => ("rw", "shared"),
                Propagation::HostToTask => (if m.read_only { "ro" } else { "rw" }, "slave"),
                Propagation::Private => (if m.read_only { "ro" } else { "rw" }, "private"),
            };
            binds.push((m.source.clone(), dest, access, prop));
        }
        for d in planned.iter().filter(|d| d.bind == DeviceBind::InRoot) {
            crate::root::make_point(&root, &d.task_path, true).map_err(|e| {
                invalid(
                    &format!("devices[{}].task_path", d.index),
                    format!("making the mount point: {e}"),
                )
            })?;
        }
        let env = task_env(&config, &self.config.process);
        let path = env.get("PATH").cloned().unwrap_or_default();
        let workdir = normalized(&config.dir);
        if let Some(t) = taken.iter().find(|t| workdir.starts_with(t)) {
            return Err(invalid(
                "dir",
                format!("{} lies in {}", workdir.display(), t.display()),
            ));
        }
        crate::root::make_point(&root, &workdir, false)
            .map_err(|e| invalid("dir", format!("making the working directory: {e}")))?;
        let seen: Vec<(PathBuf, PathBuf)> = binds
            .iter()
            .map(|(src, dst, _, _)| (src.clone(), dst.clone()))
            .collect();
        if !crate::root::command_exists(&root, &seen, &config.command, &path, &workdir) {
            return Err(DriverError::Setup {
                task_id: config.id.clone(),
                message: format!(
                    "command not found in the task's root: {} (PATH {path}); the root holds the chroot_env, alloc/, local/ and the task's volumes",
                    config.command
                ),
            });
        }
        let reservation = self.sup.reserve(&config.id)?;
        // Held until the set-up has opened the output paths itself (a FIFO's collector then
        // sees the stream end only once the task's own ends close).
        let outputs = prepare_outputs(&config, false).await?;

        // Kills and removes what is made from here on if the start does not complete.
        let mut abandon = Abandon {
            pgid: None,
            isolation: Isolation::default(),
        };
        let cgroup_err = |e: cgroup::CgroupError| e.for_task(&config.id);
        // Facts the task's events show, each with whether it is a warning for the log.
        let mut notes: Vec<(bool, String)> = Vec::new();
        let memory = config.resources.memory_max_bytes;
        match &host.cgroups {
            Ok(Some(parent)) => {
                let (cg, warning) = parent.create_task(&config.id, memory).map_err(cgroup_err)?;
                notes.extend(warning.map(|w| (true, w)));
                abandon.isolation.cgroup = Some(cg);
            }
            Ok(None) => notes.push((true, "no cgroup: disabled".to_owned())),
            Err(reason) => notes.push((true, format!("no cgroup: {reason}"))),
        }
        if abandon.isolation.cgroup.is_none() && memory.is_some() {
            notes.push((true, "memory limit not applied".into()));
        }
        for d in &planned {
            let fact = match d.bind {
                DeviceBind::HostDev => format!(
                    "device nodes: {} ({}) is the host's own (a privileged task sees the host's /dev)",
                    d.task_path.display(),
                    d.node
                ),
                DeviceBind::InDev | DeviceBind::InRoot => format!(
                    "device nodes: {} ({}) bound from {}",
                    d.task_path.display(),
                    d.node,
                    d.source.display()
                ),
            };
            notes.push((false, fact));
        }
        let unrestricted =
            |why: &str| format!("devices cgroup: {why}: device access is not restricted");
        if config.privileged {
            // A CSI plugin needs the host's devices: no devices cgroup.
            if !planned.is_empty() {
                notes.push((false, unrestricted("none for a privileged task")));
            }
        } else {
            match &host.devices {
                Ok(Some(parent)) => {
                    let own: Vec<_> = planned
                        .iter()
                        .filter(|d| !d.permissions.is_empty())
                        .map(|d| d.node.rule(&d.permissions))
                        .collect();
                    let (dev, left_out) = parent
                        .create_task(&config.id, &devices::default_rules(), &own)
                        .map_err(cgroup_err)?;
                    abandon.isolation.devices = Some(dev);
                    for rule in left_out {
                        notes.push((
                            true,
                            format!("devices cgroup: {rule} left out: the agent's own devices cgroup does not allow it"),
                        ));
                    }
                    for d in &planned {
                        notes.push((
                            false,
                            if d.permissions.is_empty() {
                                format!(
                                    "devices cgroup: no permissions for {} ({})",
                                    d.task_path.display(),
                                    d.node
                                )
                            } else {
                                format!(
                                    "devices cgroup: allowed {} {} for {}",
                                    d.node,
                                    d.permissions,
                                    d.task_path.display()
                                )
                            },
                        ));
                    }
                }
                Ok(None) if !planned.is_empty() => notes.push((true, unrestricted("disabled"))),
                Err(reason) if !planned.is_empty() => {
                    notes.push((true, unrestricted(&format!("unavailable ({reason})"))));
                }
                _ => {}
            }
        }
        for (warning, note) in &notes {
            if *warning {
                tracing::warn!(task_id = %config.id, "{note}");
            } else {
                tracing::info!(task_id = %config.id, "{note}");
            }
        }

        let slaves = slaves_for(&config)?;
        let init = config.pid_mode == PidMode::Private;
        let mut cmd = Command::new(&host.unshare);
        // Slave: unmounts on the host (another alloc's volume released) reach the task's copy,
        // so it never pins them; the task's own mounts still stay private to it. With a
        // bidirectional mount, every shared mount but that one's is made a slave by the script.
        let propagation = if slaves.is_some() {
            "unchanged"
        } else {
            "slave"
        };
        cmd.args(["--mount", "--propagation", propagation]);
        if init {
            cmd.args(["--pid", "--fork", "--kill-child"]);
        }
        let groups: Vec<String> = who.groups.iter().map(u32::to_string).collect();
        cmd.arg("--")
            .arg(&host.sh)
            .args(["-c", SETUP_SCRIPT, "berth-exec"])
            .arg(&outputs.stdout.path)
            .arg(&outputs.stderr.path)
            .arg(
                abandon
                    .isolation
                    .cgroup
                    .as_ref()
                    .map(TaskCgroup::procs_file)
                    .unwrap_or_default(),
            )
            .arg(&host.mount)
            .arg(&host.mkdir)
            .arg(&host.ln)
            .arg(&host.chroot)
            .arg(&root)
            .arg(if init { "1" } else { "0" })
            .arg(
                abandon
                    .isolation
                    .devices
                    .as_ref()
                    .map(TaskCgroup::procs_file)
                    .unwrap_or_default(),
            )
            .arg(who.uid.to_string())
            .arg(who.gid.to_string())
            .arg(if groups.is_empty() {
                who.gid.to_string()
            } else {
                groups.join(",")
            })
            .arg(if config.privileged { "1" } else { "0" })
            .arg(&host.cp)
            .arg(&host.chown);
        let slaves = slaves.unwrap_or_default();
        cmd.arg(slaves.len().to_string()).args(&slaves);
        cmd.arg(binds.len().to_string());
        for (src, dst, access, prop) in &binds {
            cmd.arg(src).arg(dst).arg(access).arg(prop);
        }
        let nodes: Vec<_> = planned
            .iter()
            .filter(|d| d.bind != DeviceBind::HostDev)
            .collect();
        cmd.arg(nodes.len().to_string());
        for d in nodes {
            cmd.arg(&d.source)
                .arg(&d.task_path)
                .arg(if d.bind == DeviceBind::InDev {
                    "1"
                } else {
                    "0"
                });
        }
        if workdir != Path::new("/") {
            // chroot starts in `/`: a shell in the root enters the working directory.
            cmd.args(["/bin/sh", "-c", "cd \"$0\" && exec \"$@\""])
                .arg(&workdir);
        }
        cmd.arg(&config.command)
            .args(&config.args)
            .env_clear()
            .envs(env)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(false);
        let mut child = cmd.spawn().map_err(|source| DriverError::Spawn {
            task_id: config.id.clone(),
            program: host.unshare.display().to_string(),
            source,
        })?;
        abandon.pgid = child.id();

        let pipes = (child.stdout.take(), child.stderr.take());
        // `ready` is read as soon as it comes: with a PID namespace, unshare stays (waiting for
        // the namespace's PID 1) and holds both pipes open, so neither ends. The script's
        // stderr is read to its end only when set-up failed (then every process is gone).
        let (Some(mut stdout), Some(mut stderr)) = pipes else {
            return Err(DriverError::Setup {
                task_id: config.id.clone(),
                message: "stdout or stderr is not a pipe".into(),
            });
        };
        let ready = async {
            let mut out = Vec::new();
            let mut buf = [0u8; 64];
            while out.len() < READY.len() {
                match stdout.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => out.extend_from_slice(&buf[..n]),
                }
            }
            out == READY
        };
        let failure = match tokio::time::timeout(self.config.setup_timeout, ready).await {
            Ok(true) => None,
            Ok(false) => {
                let mut err = Vec::new();
                let mut stderr = (&mut stderr).take(SETUP_STDERR_LIMIT);
                let _ =
                    tokio::time::timeout(self.config.setup_timeout, stderr.read_to_end(&mut err))
                        .await;
                Some(String::from_utf8_lossy(&err).trim().to_owned())
            }
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
            abandon.clean_up(self.config.process.kill_timeout).await;
            return Err(DriverError::Setup {
                task_id: config.id.clone(),
                message,
            });
        }
        let isolation = abandon.disarm();
        let notes = notes.into_iter().map(|(_, note)| note).collect();
        reservation
            .commit_child(child, isolation, notes, outputs.rotated)
            .await
    }
}

/// Kills the process group and cgroups of a task whose start is abandoned (an error, or the
/// `start` future dropped during set-up) before the supervisor owns it, and removes the
/// cgroups: at once when dropped (best effort: a cgroup still emptying stays, and is reused by
/// the next start of the id), or after they empty with [`clean_up`](Self::clean_up).
#[derive(Debug)]
struct Abandon {
    pgid: Option<u32>,
    isolation: Isolation,
}

impl Abandon {
    fn kill_group(&self) {
        if let Some(pgid) = self.pgid {
            let _ = killpg(Pid::from_raw(pgid as i32), Signal::SIGKILL);
        }
    }

    /// Kills what is left in the cgroups, waits (up to `timeout` for each) until they are
    /// empty, and removes them.
    async fn clean_up(&mut self, timeout: Duration) {
        self.kill_group();
        let isolation = std::mem::take(&mut self.isolation);
        for cgroup in isolation.cgroups() {
            // Whatever the outcome, `abandon` tries to remove it.
            let _ = empty_within(cgroup, timeout).await;
        }
        isolation.abandon();
    }

    /// The task is handed over: nothing to kill.
    fn disarm(mut self) -> Isolation {
        self.pgid = None;
        std::mem::take(&mut self.isolation)
    }
}

impl Drop for Abandon {
    fn drop(&mut self) {
        self.kill_group();
        self.isolation.abandon();
    }
}

/// The programs the driver runs.
#[derive(Debug, PartialEq, Eq)]
struct Tools {
    unshare: PathBuf,
    mount: PathBuf,
    mkdir: PathBuf,
    ln: PathBuf,
    chroot: PathBuf,
    sh: PathBuf,
    cp: PathBuf,
    chown: PathBuf,
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
        ln: find("ln")?,
        chroot: find("chroot")?,
        sh: find("sh")?,
        cp: find("cp")?,
        chown: find("chown")?,
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
            fs_isolation: FsIsolation::Chroot,
            send_signals: true,
            exec: true,
            bind_mounts: true,
            resource_limits: true,
            device_nodes: true,
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
        self.sup.signal_namespace_init(task_id, signal)
    }

    fn stats<'a>(
        &'a self,
        task_id: &'a TaskId,
    ) -> DriverFuture<'a, Result<TaskStats, DriverError>> {
        Box::pin(async move { self.sup.stats(task_id) })
    }

    fn recover(&self, handle: TaskHandle) -> DriverFuture<'_, Result<(), DriverError>> {
        Box::pin(async move {
            // Not in the handle: the devices cgroup's path follows from the task id.
            let devices = match self.host().await {
                Ok(host) => match &host.devices {
                    Ok(Some(parent)) => Some(parent.task(&handle.task_id)),
                    _ => None,
                },
                Err(_) => None,
            };
            let logs = handle.logs.clone();
            let id = handle.task_id.clone();
            self.sup.recover(handle, devices)?;
            self.sup.ensure_collectors(&id, logs.as_ref()).await;
            Ok(())
        })
    }

    fn exec<'a>(
        &'a self,
        task_id: &'a TaskId,
        request: ExecRequest,
    ) -> DriverFuture<'a, Result<ExecSession, DriverError>> {
        Box::pin(self.exec_in(task_id, request))
    }

    fn shutdown(&self) -> DriverFuture<'_, ()> {
        Box::pin(self.sup.shutdown())
    }
}

/// Runs on the host as `sh -c EXEC_SCRIPT berth-exec <cgroup.procs or ""> <devices
/// cgroup.procs or ""> <nsenter> <args>…`: joins the task's cgroups, then becomes `nsenter`,
/// which enters the task's namespaces and root.
const EXEC_SCRIPT: &str = r#"
for procs in "$1" "$2"; do
  if [ -n "$procs" ]; then
    printf '%s
' "$$" >"$procs" || { printf 'berth exec: cannot join %s
' "$procs" >&2; exit 126; }
  fi
done
shift 2
exec "$@"
"#;

impl ExecDriver {
    /// `alloc exec` into a task: as its user, with its environment, in its working directory,
    /// through `nsenter` into the mount, PID, IPC, UTS and network namespaces and the root of
    /// its oldest process that runs in its root, after joining its cgroups.
    async fn exec_in(&self, id: &TaskId, request: ExecRequest) -> Result<ExecSession, DriverError> {
        request
            .validate()
            .map_err(|reason| DriverError::InvalidConfig {
                task_id: id.clone(),
                field: "exec".into(),
                reason,
            })?;
        let host = self
            .host()
            .await
            .map_err(|reason| DriverError::DriverUnhealthy {
                task_id: id.clone(),
                driver: EXEC.into(),
                reason,
            })?;
        let target = self.sup.exec_target(id)?;
        let ours = std::fs::read_link("/proc/self/root").unwrap_or_else(|_| "/".into());
        // The command's process (or one it started): its root is the task's. The set-up
        // shell around it stays in the host's root.
        let inside = target
            .pids
            .iter()
            .filter_map(|&pid| {
                let view = crate::task_exec::ProcessView::read(pid).ok()?;
                let start = procfs::read_stat(pid).ok()??.start_ticks;
                (view.root != ours).then_some((start, pid, view))
            })
            .min_by_key(|(start, pid, _)| (*start, *pid));
        let Some((_, pid, view)) = inside else {
            return Err(DriverError::NotRunning {
                task_id: id.clone(),
                pid: target.pid,
            });
        };
        let nsenter = procfs::find_program("nsenter").ok_or_else(|| DriverError::Setup {
            task_id: id.clone(),
            message: "exec needs util-linux's nsenter, which is not in PATH".into(),
        })?;
        let procs = |i: usize| -> std::ffi::OsString {
            target
                .cgroup_procs
                .get(i)
                .map(|p| p.clone().into_os_string())
                .unwrap_or_default()
        };
        let mut args: Vec<std::ffi::OsString> =
            vec!["-c".into(), EXEC_SCRIPT.into(), "berth-exec".into()];
        args.push(procs(0));
        args.push(procs(1));
        args.push(nsenter.into_os_string());
        for a in [
            "--target".to_owned(),
            pid.to_string(),
            "--mount".into(),
            "--uts".into(),
            "--ipc".into(),
            "--net".into(),
            "--pid".into(),
            "--root".into(),
            "--wd".into(),
            "--setuid".into(),
            view.uid.to_string(),
            "--setgid".into(),
            view.gid.to_string(),
            "--".into(),
        ] {
            args.push(a.into());
        }
        args.extend(request.command.iter().map(Into::into));
        let cmd = crate::task_exec::ExecCommand {
            program: host.sh.clone(),
            args,
            env: view.env,
            cwd: "/".into(),
            user: None,
        };
        crate::task_exec::spawn_exec(id, cmd, request.tty)
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
}
