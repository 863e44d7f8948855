//! The `config` of a `driver = "docker"` task: the options of Nomad's docker driver that berth
//! runs (through podman), as checked when the spec is read.

use std::{
    collections::BTreeMap,
    fmt,
    path::{Component, Path, PathBuf},
    str::FromStr,
};

use berth_input::Quoted;
use serde::{Deserialize, Serialize};

use crate::template::Template;

/// The node attribute a docker driver sets when its agent allows privileged containers
/// (`allow_privileged = true`), as Nomad's fingerprint does.
pub const DOCKER_PRIVILEGED_ATTR: &str = "driver.docker.privileged.enabled";
/// The node attribute a docker driver sets when its agent allows host paths in `volumes` and
/// bind mounts (`volumes { enabled = true }`), as Nomad's fingerprint does.
pub const DOCKER_VOLUMES_ATTR: &str = "driver.docker.volumes.enabled";

/// The keys of a docker task's `config`.
pub const DOCKER_CONFIG_KEYS: &[&str] = &[
    "image",
    "command",
    "args",
    "entrypoint",
    "privileged",
    "network_mode",
    "volumes",
    "mount",
    "devices",
    "cap_add",
    "cap_drop",
    "ulimit",
    "work_dir",
    "labels",
    "pid_mode",
    "ipc_mode",
    "init",
];

/// The resources `ulimit` may set (as `ulimit(1)` names them, without `RLIMIT_`).
pub const ULIMIT_NAMES: &[&str] = &[
    "core",
    "cpu",
    "data",
    "fsize",
    "locks",
    "memlock",
    "msgqueue",
    "nice",
    "nofile",
    "nproc",
    "rss",
    "rtprio",
    "rttime",
    "sigpending",
    "stack",
];

/// `config` of a `driver = "docker"` task: the options of Nomad's docker driver berth runs.
///
/// The task's `command` (empty: the image's own), `args` and `pid_mode` stay in
/// [`TaskSpec`](crate::TaskSpec). Templates hold `${…}` runtime references until the alloc is
/// placed; literal ones were checked when read (a literal `volumes` entry parses with
/// [`parse_docker_volume`], a bind source has no `..`, targets and `work_dir` are absolute).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DockerTask {
    /// `image`: not empty.
    pub image: Template,
    /// `entrypoint = ["/bin/x", "-y"]`; the image's when not given.
    pub entrypoint: Option<Vec<Template>>,
    /// `privileged`.
    pub privileged: bool,
    /// `network_mode`; bridge when not given.
    pub network_mode: DockerNetwork,
    /// `volumes`: `"src:dst"` or `"src:dst:ro|rw"`, as written. A relative `src` lies in the
    /// task directory.
    pub volumes: Vec<Template>,
    /// `mount { … }` blocks, in file order.
    pub mounts: Vec<DockerMount>,
    /// `devices = [{ host_path = "/dev/fuse" }]`.
    pub devices: Vec<DockerDevice>,
    /// `cap_add`: upper case, without `CAP_` (`SYS_ADMIN`, `ALL`).
    pub cap_add: Vec<String>,
    /// `cap_drop`, likewise.
    pub cap_drop: Vec<String>,
    /// `ulimit { nofile = "2048:4096" }`, by name ([`ULIMIT_NAMES`]).
    pub ulimits: BTreeMap<String, DockerUlimit>,
    /// `work_dir`: absolute once rendered; the image's when not given.
    pub work_dir: Option<Template>,
    /// `labels`.
    pub labels: BTreeMap<String, String>,
    /// `ipc_mode`; the runtime's default when not given.
    pub ipc_mode: Option<DockerIpc>,
    /// `init`: run an init process as PID 1 that reaps zombies.
    pub init: bool,
}

/// `network_mode`. berth runs these three; `container:<name>` and named networks are refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DockerNetwork {
    /// A network namespace of its own behind a bridge (`bridge`, `default` or not given).
    #[default]
    Bridge,
    /// A network namespace with loopback only.
    None,
    /// The host's network namespace.
    Host,
}

impl DockerNetwork {
    /// `bridge`, `none` or `host`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bridge => "bridge",
            Self::None => "none",
            Self::Host => "host",
        }
    }
}

impl fmt::Display for DockerNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DockerNetwork {
    type Err = String;
    /// `bridge`, `default` or empty, `none`, `host`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "" | "bridge" | "default" => Ok(Self::Bridge),
            "none" => Ok(Self::None),
            "host" => Ok(Self::Host),
            _ => Err(format!(
                "network mode {}: berth runs none, host and bridge (or default) only",
                Quoted(s)
            )),
        }
    }
}

/// `ipc_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DockerIpc {
    /// The host's IPC namespace.
    Host,
    /// An IPC namespace of its own, without `/dev/shm`.
    None,
    /// An IPC namespace of its own, not shared.
    Private,
    /// An IPC namespace of its own that other containers may join.
    Shareable,
}

impl DockerIpc {
    /// `host`, `none`, `private` or `shareable`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Host => "host",
            Self::None => "none",
            Self::Private => "private",
            Self::Shareable => "shareable",
        }
    }
}

impl fmt::Display for DockerIpc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DockerIpc {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "host" => Ok(Self::Host),
            "none" => Ok(Self::None),
            "private" => Ok(Self::Private),
            "shareable" => Ok(Self::Shareable),
            _ => Err(format!(
                "ipc mode {}: expected host, none, private or shareable",
                Quoted(s)
            )),
        }
    }
}

/// A `mount { … }` block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum DockerMount {
    /// `type = "bind"`: a host path (relative: in the task directory) at `target`.
    Bind {
        /// `source`: without `..` ([`check_bind_source`]) once rendered.
        source: Template,
        /// `target`: absolute, without `..`, once rendered.
        target: Template,
        /// `readonly`.
        readonly: bool,
        /// `bind_options { propagation }`; `rprivate` when not given.
        propagation: BindPropagation,
    },
    /// `type = "tmpfs"`: a fresh tmpfs at `target`.
    Tmpfs {
        /// `target`: absolute, without `..`, once rendered.
        target: Template,
        /// `readonly`.
        readonly: bool,
        /// `tmpfs_options { size }`, in bytes; the runtime's default when not given.
        size: Option<u64>,
        /// `tmpfs_options { mode }`: the permission bits of its root (at most `0o7777`).
        mode: Option<u32>,
    },
}

/// `bind_options { propagation }` of a bind mount.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BindPropagation {
    /// Nothing travels either way, recursively (the default).
    #[default]
    Rprivate,
    /// Nothing travels either way.
    Private,
    /// Host to container, recursively.
    Rslave,
    /// Host to container.
    Slave,
    /// Both ways, recursively.
    Rshared,
    /// Both ways.
    Shared,
}

impl BindPropagation {
    /// As docker writes it: `rprivate`, `private`, `rslave`, `slave`, `rshared`, `shared`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rprivate => "rprivate",
            Self::Private => "private",
            Self::Rslave => "rslave",
            Self::Slave => "slave",
            Self::Rshared => "rshared",
            Self::Shared => "shared",
        }
    }
}

impl fmt::Display for BindPropagation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BindPropagation {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "rprivate" => Ok(Self::Rprivate),
            "private" => Ok(Self::Private),
            "rslave" => Ok(Self::Rslave),
            "slave" => Ok(Self::Slave),
            "rshared" => Ok(Self::Rshared),
            "shared" => Ok(Self::Shared),
            _ => Err(format!(
                "propagation {}: expected rprivate, private, rslave, slave, rshared or shared",
                Quoted(s)
            )),
        }
    }
}

/// One `devices` item: a host device node given to the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DockerDevice {
    /// `host_path`: absolute, without `..`.
    pub host_path: String,
    /// `container_path`: absolute, without `..`; `host_path` when not given.
    pub container_path: String,
    /// `cgroup_permissions`: some of `r`, `w`, `m`, each at most once; `rwm` when not given.
    pub cgroup_permissions: String,
}

/// One `ulimit` entry: `"N"` (soft = hard = N) or `"soft:hard"`, soft at most hard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DockerUlimit {
    /// The soft limit.
    pub soft: u64,
    /// The hard limit.
    pub hard: u64,
}

impl FromStr for DockerUlimit {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let number = |t: &str| t.parse::<u64>().ok().filter(|_| !t.starts_with('+'));
        let (soft, hard) = match s.split_once(':') {
            None => (number(s), number(s)),
            Some((a, b)) => (number(a), number(b)),
        };
        match (soft, hard) {
            (Some(soft), Some(hard)) if soft <= hard => Ok(Self { soft, hard }),
            (Some(soft), Some(hard)) => {
                Err(format!("soft limit {soft} is more than hard limit {hard}"))
            }
            _ => Err(format!(
                "{}: expected \"N\" or \"soft:hard\", whole numbers",
                Quoted(s)
            )),
        }
    }
}

/// One `volumes` entry, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerVolume {
    /// The host path as written: absolute, or relative to the task directory; without `..`.
    pub source: String,
    /// Where it appears in the container: absolute, without `..`, normalized.
    pub target: PathBuf,
    /// `:ro`.
    pub read_only: bool,
}

impl DockerVolume {
    /// Parses `"src:dst[:ro|rw]"` (after rendering); the error says what is wrong without
    /// repeating `text` (for a text that holds an `env` value).
    pub fn parse(text: &str) -> Result<Self, &'static str> {
        const FORM: &str = "expected \"source:target\" or \"source:target:ro|rw\"";
        let parts: Vec<&str> = text.split(':').collect();
        let (source, target, read_only) = match parts.as_slice() {
            [s, t] => (*s, *t, false),
            [s, t, "ro"] => (*s, *t, true),
            [s, t, "rw"] => (*s, *t, false),
            [_, _, _] => return Err("the mode (after the second ':') must be ro or rw"),
            _ => return Err(FORM),
        };
        check_bind_source(source)?;
        let target = check_container_path(target).map_err(|e| match e {
            NOT_ABSOLUTE => "the target (after the ':') is not an absolute path",
            _ => "the target (after the ':') must not contain \"..\"",
        })?;
        Ok(Self {
            source: source.to_owned(),
            target,
            read_only,
        })
    }
}

/// Parses `"src:dst[:ro|rw]"` (after rendering): `src` not empty, without `..` (a relative one
/// lies in the task directory), `dst` absolute without `..`. The error quotes `text`.
pub fn parse_docker_volume(text: &str) -> Result<DockerVolume, String> {
    DockerVolume::parse(text).map_err(|why| format!("{}: {why}", Quoted(text)))
}

const NOT_ABSOLUTE: &str = "is not an absolute path";

/// A bind source (a `volumes` entry's or a bind `mount`'s, after rendering): not empty, and
/// without a `..` component. A relative one lies in the task directory.
pub fn check_bind_source(source: &str) -> Result<(), &'static str> {
    if source.is_empty() {
        return Err("the source is empty");
    }
    if Path::new(source)
        .components()
        .any(|c| c == Component::ParentDir)
    {
        return Err(if source.starts_with('/') {
            "the source must not contain \"..\""
        } else {
            "the source must stay inside the task directory (no \"..\")"
        });
    }
    Ok(())
}

/// A path in the container (after rendering): absolute and without `..`; normalized.
pub fn check_container_path(path: &str) -> Result<PathBuf, &'static str> {
    if !path.starts_with('/') {
        return Err(NOT_ABSOLUTE);
    }
    let parts: Vec<Component<'_>> = Path::new(path).components().collect();
    if parts.contains(&Component::ParentDir) {
        return Err("must not contain \"..\"");
    }
    Ok(parts.into_iter().collect())
}

/// A capability as written in `cap_add` / `cap_drop`: letters, digits and `_`, with or without
/// `CAP_`, any case; returned upper case without `CAP_` (`ALL` stays `ALL`).
pub fn normalize_capability(name: &str) -> Result<String, String> {
    let upper = name.to_ascii_uppercase();
    let bare = upper.strip_prefix("CAP_").unwrap_or(&upper);
    if bare.is_empty() || !bare.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!(
            "{} is not a capability name (letters, digits and _, such as SYS_ADMIN or \
             CAP_NET_RAW; or ALL)",
            Quoted(name)
        ));
    }
    Ok(bare.to_owned())
}

/// `cgroup_permissions`: some of `r`, `w` and `m`, each at most once (empty: `rwm`).
pub fn check_cgroup_permissions(text: &str) -> Result<String, String> {
    if text.is_empty() {
        return Ok("rwm".into());
    }
    let mut seen = String::new();
    for c in text.chars() {
        if !matches!(c, 'r' | 'w' | 'm') || seen.contains(c) {
            return Err(format!(
                "{}: expected some of r, w and m, each at most once (such as \"rwm\" or \"r\")",
                Quoted(text)
            ));
        }
        seen.push(c);
    }
    Ok(seen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volumes_parse() {
        let v = parse_docker_volume("local/data:/data:ro").unwrap();
        assert_eq!(
            v,
            DockerVolume {
                source: "local/data".into(),
                target: "/data".into(),
                read_only: true
            }
        );
        let v = parse_docker_volume("/srv//x:/x/./y/:rw").unwrap();
        assert_eq!(
            (v.source.as_str(), v.target.as_path()),
            ("/srv//x", Path::new("/x/y"))
        );
        assert!(!v.read_only);
        for (bad, why) in [
            ("/a", "expected"),
            ("/a:/b:ro:x", "expected"),
            ("/a:/b:z", "ro or rw"),
            (":/b", "empty"),
            ("../x:/b", "stay inside the task directory"),
            ("./a/../../x:/b", "stay inside the task directory"),
            ("/a/../b:/b", "must not contain"),
            ("a:b", "not an absolute path"),
            ("a:/b/../c", "must not contain"),
        ] {
            let e = parse_docker_volume(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
            assert!(e.starts_with(&format!("{}", Quoted(bad))), "{e}");
            assert!(!DockerVolume::parse(bad).unwrap_err().contains(bad));
        }
    }

    #[test]
    fn small_parsers() {
        assert_eq!(
            "10".parse::<DockerUlimit>(),
            Ok(DockerUlimit { soft: 10, hard: 10 })
        );
        assert_eq!(
            "1:2".parse::<DockerUlimit>(),
            Ok(DockerUlimit { soft: 1, hard: 2 })
        );
        for bad in ["", "x", "2:1", "-1", "+1", "1:", ":1", "1:2:3"] {
            assert!(bad.parse::<DockerUlimit>().is_err(), "{bad}");
        }
        assert_eq!(normalize_capability("cap_sys_admin").unwrap(), "SYS_ADMIN");
        assert_eq!(normalize_capability("all").unwrap(), "ALL");
        assert!(normalize_capability("CAP_").is_err());
        assert!(normalize_capability("net-raw").is_err());
        assert_eq!(check_cgroup_permissions("").unwrap(), "rwm");
        assert_eq!(check_cgroup_permissions("mr").unwrap(), "mr");
        assert!(check_cgroup_permissions("rr").is_err());
        assert!(check_cgroup_permissions("rx").is_err());
        assert_eq!("default".parse(), Ok(DockerNetwork::Bridge));
        assert!("container:x".parse::<DockerNetwork>().is_err());
        assert_eq!("rslave".parse(), Ok(BindPropagation::Rslave));
        assert_eq!("shareable".parse(), Ok(DockerIpc::Shareable));
        let json = serde_json::to_string(&DockerMount::Tmpfs {
            target: "/t".into(),
            readonly: false,
            size: Some(1),
            mode: None,
        })
        .unwrap();
        assert!(json.starts_with("{\"type\":\"tmpfs\""), "{json}");
    }
}
