//! Device access control for `exec` tasks: what a device node is (its type and numbers), and a
//! cgroup v1 `devices` cgroup per task that denies every device but those a container usually
//! gets and the task's own.
//!
//! cgroup v2 has no `devices` controller (device access there is an eBPF program attached to
//! the cgroup, which berth does not load): on such hosts tasks still get their device nodes,
//! but their access is not restricted, and the driver says so.

use std::{
    fmt, fs, io,
    os::unix::fs::{FileTypeExt as _, MetadataExt as _},
    path::{Path, PathBuf},
};

use berth_sys::MountEntry;
use nix::{
    errno::Errno,
    sys::stat::{major, minor},
};

use crate::{
    cgroup::{CgroupError, CgroupKind, TaskCgroup, make_parent},
    task::{TaskId, normalized},
};

/// Where the `exec` driver puts its tasks' devices cgroups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DevicesCgroupSetting {
    /// `<the agent's own devices cgroup>/<name>/<task id>`, on hosts with the cgroup v1
    /// `devices` controller (`<name>` is created if missing). Elsewhere tasks run without one.
    Auto {
        /// Directory name under the agent's devices cgroup, e.g. `berth`.
        name: String,
    },
    /// No devices cgroups: tasks' device access is not restricted.
    Disabled,
}

impl Default for DevicesCgroupSetting {
    fn default() -> Self {
        Self::Auto {
            name: "berth".into(),
        }
    }
}

/// Character or block device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeKind {
    Char,
    Block,
}

impl NodeKind {
    fn letter(self) -> char {
        match self {
            Self::Char => 'c',
            Self::Block => 'b',
        }
    }
}

/// A device node's type and numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeviceNode {
    pub kind: NodeKind,
    pub major: u64,
    pub minor: u64,
}

impl DeviceNode {
    /// The node at `path` (symlinks followed); `Err(reason)` when it is missing or not a
    /// character or block device.
    pub fn of(path: &Path) -> Result<Self, String> {
        let meta = fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let kind = if meta.file_type().is_char_device() {
            NodeKind::Char
        } else if meta.file_type().is_block_device() {
            NodeKind::Block
        } else {
            return Err(format!(
                "{} is not a character or block device node",
                path.display()
            ));
        };
        let rdev = meta.rdev();
        Ok(Self {
            kind,
            major: major(rdev),
            minor: minor(rdev),
        })
    }

    /// The rule allowing `access` to this node.
    pub fn rule(&self, access: &str) -> Rule {
        Rule {
            kind: self.kind.letter(),
            major: Some(self.major),
            minor: Some(self.minor),
            access: access.to_owned(),
        }
    }
}

impl fmt::Display for DeviceNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}:{}", self.kind.letter(), self.major, self.minor)
    }
}

/// One line of `devices.allow`: `<a|b|c> <major|*>:<minor|*> <access>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rule {
    kind: char,
    major: Option<u64>,
    minor: Option<u64>,
    access: String,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let num = |n: Option<u64>| n.map_or_else(|| "*".to_owned(), |n| n.to_string());
        write!(
            f,
            "{} {}:{} {}",
            self.kind,
            num(self.major),
            num(self.minor),
            self.access
        )
    }
}

/// What every task may use, as a container does (runc's default list): `mknod` of any node
/// (opening one still needs its own rule), `/dev/null`, `zero`, `full`, `random`, `urandom`,
/// `tty`, `console`, `ptmx` and the pseudo-terminals.
pub(crate) fn default_rules() -> Vec<Rule> {
    let rule = |kind, major, minor| Rule {
        kind,
        major,
        minor,
        access: "rwm".into(),
    };
    let mknod = |kind| Rule {
        access: "m".into(),
        ..rule(kind, None, None)
    };
    vec![
        mknod('c'),
        mknod('b'),
        rule('c', Some(1), Some(3)),
        rule('c', Some(1), Some(5)),
        rule('c', Some(1), Some(7)),
        rule('c', Some(1), Some(8)),
        rule('c', Some(1), Some(9)),
        rule('c', Some(5), Some(0)),
        rule('c', Some(5), Some(1)),
        rule('c', Some(5), Some(2)),
        rule('c', Some(136), None),
    ]
}

/// How a device node gets into an `exec` task's root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeviceBind {
    /// It is there already: a privileged task's `/dev` is the host's.
    HostDev,
    /// Bound onto a mount point the set-up script makes in the task's own `/dev` tmpfs
    /// (mounted over the root's `dev/`, so a point made there beforehand would be hidden).
    InDev,
    /// Bound onto a mount point made in the task's directory before the start.
    InRoot,
}

/// One of a task's devices, checked against the host and the task's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DevicePlan {
    /// Its index in `TaskConfig::devices`.
    pub index: usize,
    pub node: DeviceNode,
    /// The host node, symlinks resolved.
    pub source: PathBuf,
    /// Where the task sees it (normalized).
    pub task_path: PathBuf,
    pub permissions: String,
    pub bind: DeviceBind,
}

/// Entries of a task's own `/dev` that are symlinks or mounts of their own: nothing goes at
/// or under them.
const DEV_OWN: [&str; 6] = ["fd", "stdin", "stdout", "stderr", "pts", "shm"];

/// Nodes of a task's own `/dev`: another node may replace one, but nothing lies under them.
const DEV_NODES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// Checks a task's devices (already validated by `TaskConfig::validate`) against the host
/// and its root, and says how each gets in. `taken` are the root's paths that get mounts of
/// their own besides `/dev` (`/alloc`, `/proc`, the chroot_env…); `mounts` the destinations of
/// the task's bind mounts. Errors are `(field, reason)`. Reads only; changes nothing.
pub(crate) fn plan(
    devices: &[crate::task::TaskDevice],
    privileged: bool,
    taken: &[PathBuf],
    mounts: &[PathBuf],
) -> Result<Vec<DevicePlan>, (String, String)> {
    let dev = Path::new("/dev");
    let mut plans = Vec::with_capacity(devices.len());
    for (index, device) in devices.iter().enumerate() {
        let bad = |name: &str, reason: String| (format!("devices[{index}].{name}"), reason);
        let node = DeviceNode::of(&device.host_path).map_err(|r| bad("host_path", r))?;
        let source = fs::canonicalize(&device.host_path)
            .map_err(|e| bad("host_path", format!("{}: {e}", device.host_path.display())))?;
        let task_path = normalized(&device.task_path);
        let shown = task_path.display();
        if task_path == dev {
            return Err(bad("task_path", "must not be /dev itself".into()));
        }
        if let Some(t) = taken.iter().find(|t| task_path.starts_with(t)) {
            return Err(bad(
                "task_path",
                format!(
                    "{shown} lies in {}, which the task's root mounts itself",
                    t.display()
                ),
            ));
        }
        for (j, m) in mounts.iter().enumerate() {
            if task_path.starts_with(m) {
                return Err(bad(
                    "task_path",
                    format!(
                        "{shown} lies in mounts[{j}].destination {}, a bind mount",
                        m.display()
                    ),
                ));
            }
            if m.starts_with(&task_path) {
                return Err(bad(
                    "task_path",
                    format!("mounts[{j}].destination {} lies under {shown}", m.display()),
                ));
            }
        }
        let bind = match task_path.strip_prefix(dev) {
            Err(_) => DeviceBind::InRoot,
            Ok(_) if privileged => {
                let host = normalized(&device.host_path);
                if host != task_path {
                    return Err(bad(
                        "task_path",
                        format!(
                            "a privileged task sees the host's /dev: a node there keeps its host path ({}), not {shown}",
                            host.display()
                        ),
                    ));
                }
                DeviceBind::HostDev
            }
            Ok(rel) => {
                let mut parts = rel.components();
                let first = parts.next().map(|c| c.as_os_str().to_string_lossy());
                let deeper = parts.next().is_some();
                if let Some(first) = first {
                    if DEV_OWN.contains(&first.as_ref()) {
                        return Err(bad(
                            "task_path",
                            format!("{shown} lies in /dev/{first}, which the driver makes itself"),
                        ));
                    }
                    if deeper && DEV_NODES.contains(&first.as_ref()) {
                        return Err(bad(
                            "task_path",
                            format!("{shown} lies under /dev/{first}, a device node"),
                        ));
                    }
                }
                DeviceBind::InDev
            }
        };
        plans.push(DevicePlan {
            index,
            node,
            source,
            task_path,
            permissions: device.permissions.clone(),
            bind,
        });
    }
    Ok(plans)
}

/// The directory task devices cgroups are made in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DevicesParent {
    pub dir: PathBuf,
}

impl DevicesParent {
    /// The devices cgroup of task `id` (which may not exist).
    pub fn task(&self, id: &TaskId) -> TaskCgroup {
        TaskCgroup::new(CgroupKind::Devices, self.dir.join(id.as_str()))
    }

    /// Creates task `id`'s devices cgroup (see [`TaskCgroup::create`]), denies every device,
    /// then allows `usual` and `own` in order. A rule of `usual` the agent's own devices
    /// cgroup does not allow (`EPERM`: a child never gets more than its parent) is left out
    /// and returned; every rule of `own` must be allowed. When a rule cannot be written, the
    /// cgroup is removed again.
    pub fn create_task(
        &self,
        id: &TaskId,
        usual: &[Rule],
        own: &[Rule],
    ) -> Result<(TaskCgroup, Vec<Rule>), CgroupError> {
        let cgroup = self.task(id);
        cgroup.create()?;
        match write_rules(&cgroup.dir, usual, own) {
            Ok(left_out) => Ok((cgroup, left_out)),
            Err(e) => {
                let _ = cgroup.remove();
                Err(e)
            }
        }
    }
}

/// Denies every device in the devices cgroup `dir`, then allows `usual` (those refused with
/// `EPERM` are returned) and `own`.
fn write_rules(dir: &Path, usual: &[Rule], own: &[Rule]) -> Result<Vec<Rule>, CgroupError> {
    let deny = dir.join("devices.deny");
    fs::write(&deny, "a").map_err(|source| CgroupError {
        what: "denying every device in",
        path: deny,
        source,
    })?;
    let allow = dir.join("devices.allow");
    let mut left_out = Vec::new();
    for (rule, required) in usual
        .iter()
        .map(|r| (r, false))
        .chain(own.iter().map(|r| (r, true)))
    {
        match fs::write(&allow, rule.to_string()) {
            Ok(()) => {}
            Err(e) if !required && e.raw_os_error() == Some(Errno::EPERM as i32) => {
                left_out.push(rule.clone());
            }
            Err(e) => {
                return Err(CgroupError {
                    what: "allowing a device in",
                    path: allow,
                    source: io::Error::new(e.kind(), format!("{rule}: {e}")),
                });
            }
        }
    }
    Ok(left_out)
}

/// Finds (and creates) the parent of task devices cgroups. `Ok(None)` when disabled,
/// `Err(reason)` when the host has no cgroup v1 `devices` controller to use.
pub(crate) fn prepare(setting: &DevicesCgroupSetting) -> Result<Option<DevicesParent>, String> {
    let DevicesCgroupSetting::Auto { name } = setting else {
        return Ok(None);
    };
    berth_sys::validate_path_segment("devices cgroup name", name).map_err(|e| e.to_string())?;
    let cgroups = fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("reading /proc/self/cgroup: {e}"))?;
    let mounts = berth_sys::read_mountinfo(Path::new("/proc/self/mountinfo")).map_err(|e| {
        match std::error::Error::source(&e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        }
    })?;
    let dir = own_devices_cgroup(&cgroups, &mounts)?.join(name);
    make_parent(
        &dir,
        |dir| dir.join("devices.allow").exists(),
        "a cgroup of the devices controller",
    )?;
    Ok(Some(DevicesParent { dir }))
}

/// The agent's own devices cgroup directory, from its `/proc/self/cgroup` and its mounts: the
/// mount of the cgroup v1 hierarchy holding the `devices` controller, joined with the agent's
/// path in it (relative to the mount's root).
fn own_devices_cgroup(cgroups: &str, mounts: &[MountEntry]) -> Result<PathBuf, String> {
    const NO_CONTROLLER: &str = "no cgroup v1 devices controller (with cgroup v2 only, device access control needs an eBPF program, which berth does not load)";
    let path = cgroups
        .lines()
        .filter_map(|l| {
            let mut fields = l.splitn(3, ':');
            let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            controllers
                .split(',')
                .any(|c| c == "devices")
                .then(|| PathBuf::from(path))
        })
        .next()
        .ok_or_else(|| NO_CONTROLLER.to_owned())?;
    let mut mounted = false;
    for mount in mounts
        .iter()
        .filter(|m| m.fs_type == "cgroup" && m.super_options.split(',').any(|o| o == "devices"))
    {
        mounted = true;
        if let Ok(rel) = path.strip_prefix(&mount.root) {
            return Ok(mount.mount_point.join(rel));
        }
    }
    Err(if mounted {
        format!(
            "the agent's devices cgroup {} lies outside every mount of the devices hierarchy",
            path.display()
        )
    } else {
        format!(
            "{NO_CONTROLLER}: the agent is in a devices cgroup, but its hierarchy is not mounted"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_MOUNTINFO: &str = "\
25 1 253:0 / / rw,relatime - ext4 /dev/vda rw
30 25 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
34 30 0:30 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory
35 30 0:31 / /sys/fs/cgroup/devices rw,relatime shared:10 - cgroup cgroup rw,devices
40 30 0:36 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    fn own(cgroups: &str, mountinfo: &str) -> Result<PathBuf, String> {
        let mounts = berth_sys::parse_mountinfo(mountinfo.as_bytes()).expect("mountinfo parses");
        own_devices_cgroup(cgroups, &mounts)
    }

    #[test]
    fn finds_the_agents_devices_cgroup() {
        let cgroups = "5:devices:/system.slice/berth.service\n4:memory:/x\n0::/\n";
        assert_eq!(
            own(cgroups, HYBRID_MOUNTINFO).unwrap(),
            PathBuf::from("/sys/fs/cgroup/devices/system.slice/berth.service")
        );
        assert_eq!(
            own("5:devices:/\n", HYBRID_MOUNTINFO).unwrap(),
            PathBuf::from("/sys/fs/cgroup/devices")
        );
        // A container without a cgroup namespace: the hierarchy is mounted from its cgroup.
        let nested = "35 30 0:31 /docker/abc /sys/fs/cgroup/dev\\040ices rw - cgroup cgroup rw,devices,freezer\n";
        assert_eq!(
            own("3:freezer,devices:/docker/abc/inner\n", nested).unwrap(),
            PathBuf::from("/sys/fs/cgroup/dev ices/inner")
        );
        let err = own("3:devices:/elsewhere\n", nested).unwrap_err();
        assert!(err.contains("outside every mount"), "{err}");
        let err = own("0::/\n", HYBRID_MOUNTINFO).unwrap_err();
        assert!(err.starts_with("no cgroup v1 devices controller"), "{err}");
        let err = own("5:devices:/\n", "").unwrap_err();
        assert!(err.contains("not mounted"), "{err}");
    }

    #[test]
    fn rules_print_as_devices_allow_wants_them() {
        let rules: Vec<String> = default_rules().iter().map(Rule::to_string).collect();
        assert_eq!(rules[0], "c *:* m");
        assert_eq!(rules[1], "b *:* m");
        assert!(rules.contains(&"c 1:9 rwm".to_owned()));
        assert_eq!(rules.last().unwrap(), "c 136:* rwm");
        let node = DeviceNode {
            kind: NodeKind::Block,
            major: 7,
            minor: 0,
        };
        assert_eq!(node.to_string(), "b 7:0");
        assert_eq!(node.rule("rw").to_string(), "b 7:0 rw");
    }

    fn plan_one(task_path: &str, privileged: bool) -> Result<DeviceBind, String> {
        let device = crate::task::TaskDevice {
            host_path: "/dev/null".into(),
            task_path: task_path.into(),
            permissions: "rw".into(),
        };
        let taken = [PathBuf::from("/alloc"), PathBuf::from("/usr")];
        let mounts = [PathBuf::from("/data"), PathBuf::from("/opt/x/y")];
        plan(&[device], privileged, &taken, &mounts)
            .map(|p| p[0].bind)
            .map_err(|(field, reason)| format!("{field}: {reason}"))
    }

    #[test]
    fn plans_say_where_each_node_goes() {
        assert_eq!(plan_one("/dev/widget", false), Ok(DeviceBind::InDev));
        assert_eq!(plan_one("/dev/a/b/", false), Ok(DeviceBind::InDev));
        assert_eq!(plan_one("/dev/null", false), Ok(DeviceBind::InDev));
        assert_eq!(plan_one("/local/widget", false), Ok(DeviceBind::InRoot));
        assert_eq!(plan_one("/dev/null", true), Ok(DeviceBind::HostDev));
        assert_eq!(plan_one("/local/widget", true), Ok(DeviceBind::InRoot));
        let refused = |path, privileged| plan_one(path, privileged).unwrap_err();
        assert!(refused("/dev/widget", true).contains("keeps its host path (/dev/null)"));
        assert!(refused("/dev", false).contains("/dev itself"));
        assert!(refused("/usr/lib/widget", false).contains("lies in /usr"));
        assert!(refused("/data/widget", false).contains("mounts[0].destination /data"));
        assert!(refused("/opt/x", false).contains("mounts[1].destination /opt/x/y lies under"));
        for path in [
            "/dev/fd",
            "/dev/fd/3",
            "/dev/stdout",
            "/dev/pts/9",
            "/dev/shm/w",
        ] {
            assert!(
                refused(path, false).contains("which the driver makes itself"),
                "{path}"
            );
        }
        assert!(refused("/dev/null/x", false).contains("under /dev/null, a device node"));
        assert!(refused("/dev/widget", true).starts_with("devices[0].task_path: "));
    }

    #[test]
    fn device_nodes_are_told_from_other_files() {
        let null = DeviceNode::of(Path::new("/dev/null")).unwrap();
        assert_eq!(null.to_string(), "c 1:3");
        let tmp = tempfile::tempdir().unwrap();
        let err = DeviceNode::of(tmp.path()).unwrap_err();
        assert!(err.contains("not a character or block device"), "{err}");
        let err = DeviceNode::of(&tmp.path().join("absent")).unwrap_err();
        assert!(err.contains("No such file"), "{err}");
    }
}
