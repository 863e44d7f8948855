//! What the `docker` driver is configured with, and what a container task asks for beyond
//! what every task has.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::task::BindMount;

/// The `docker` driver's configuration (the agent's `plugin "docker" { config { … } }`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DockerConfig {
    /// The podman program.
    pub podman: PathBuf,
    /// The OCI runtime podman runs containers with (`runc`: podman's default, crun, refuses
    /// hosts with hybrid cgroups).
    pub runtime: String,
    /// Whether tasks may ask for `privileged = true` (Nomad's default: no).
    pub allow_privileged: bool,
    /// Whether tasks may bind host paths outside their alloc directory (`volumes`, `mount`
    /// blocks; Nomad's `volumes { enabled }`, default no).
    pub volumes_enabled: bool,
    /// podman's storage directory (`--root`); `None`: podman's own.
    pub storage_root: Option<PathBuf>,
    /// podman's run-time state directory (`--runroot`); `None`: podman's own.
    pub run_root: Option<PathBuf>,
}

impl Default for DockerConfig {
    fn default() -> Self {
        Self {
            podman: PathBuf::from("podman"),
            runtime: "runc".into(),
            allow_privileged: false,
            volumes_enabled: false,
            storage_root: None,
            run_root: None,
        }
    }
}

/// The network a container joins.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// podman's default bridge network.
    #[default]
    Bridge,
    /// No network but loopback.
    None,
    /// The host's network namespace.
    Host,
}

impl NetworkMode {
    /// podman's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bridge => "bridge",
            Self::None => "none",
            Self::Host => "host",
        }
    }
}

/// A tmpfs mounted in the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TmpfsMount {
    /// Absolute path in the container.
    pub destination: PathBuf,
    /// Its size limit in bytes.
    #[serde(default)]
    pub size_bytes: Option<u64>,
    /// Its root's mode.
    #[serde(default)]
    pub mode: Option<u32>,
    /// Mount it read-only.
    #[serde(default)]
    pub read_only: bool,
}

/// A resource limit (`setrlimit`) of the container's processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ulimit {
    /// Soft limit.
    pub soft: u64,
    /// Hard limit.
    pub hard: u64,
}

/// What a container task runs, beyond what every [`TaskConfig`](crate::TaskConfig) has
/// (`docker` driver only). The task's `command` (empty: the image's own) and `args` become
/// the container's command; `env`, `user`, `mounts`, `devices`, `resources`, `pid_mode`
/// and `privileged` apply as for `exec`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerConfig {
    /// The image: a name in podman's storage (`localhost/x:tag`), or an archive or layout
    /// on disk, loaded before the start: `docker-archive:/path.tar`, `oci-archive:/path.tar`,
    /// `oci:/dir[:tag]`.
    pub image: String,
    /// Replaces the image's entrypoint.
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    /// The network.
    #[serde(default)]
    pub network_mode: NetworkMode,
    /// The task's own bind mounts of host paths (`volumes`, `mount { type = "bind" }`),
    /// sources absolute; unlike [`TaskConfig::mounts`](crate::TaskConfig::mounts), which the
    /// agent makes (volumes, plugin directories), these need `volumes_enabled` when their
    /// source lies outside the task's directories.
    #[serde(default)]
    pub host_volumes: Vec<BindMount>,
    /// tmpfs mounts.
    #[serde(default)]
    pub tmpfs: Vec<TmpfsMount>,
    /// Capabilities added.
    #[serde(default)]
    pub cap_add: Vec<String>,
    /// Capabilities dropped.
    #[serde(default)]
    pub cap_drop: Vec<String>,
    /// Resource limits by name (`nofile`, `nproc`…); `nofile` and `nproc` default to what
    /// the agent may give.
    #[serde(default)]
    pub ulimits: BTreeMap<String, Ulimit>,
    /// Working directory in the container; `None`: the image's.
    #[serde(default)]
    pub work_dir: Option<PathBuf>,
    /// Labels of the container (berth adds its own, `berth.*`).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// IPC namespace: `host`, `none`, `private` or `shareable`; `None`: podman's default.
    #[serde(default)]
    pub ipc_mode: Option<String>,
    /// Run a minimal init as the container's first process (it reaps zombies and forwards
    /// signals).
    #[serde(default)]
    pub init: bool,
}

/// Whether `path` lies in (or is) `dir`, compared by components.
pub(crate) fn lies_in(path: &Path, dir: &Path) -> bool {
    crate::task::normalized(path).starts_with(crate::task::normalized(dir))
}
