//! The checked job spec, and its canonical JSON form (serde).

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    path::Path,
    str::FromStr,
    time::Duration,
};

use berth_csi::model::{AccessMode, AttachmentMode, MountOptions};
use berth_devices::request::DeviceRequest;
use berth_input::Syntax;
use berth_volume::{PluginDir, SpecError, StoredMountOptions};
use serde::{Deserialize, Serialize};

use crate::{
    check,
    connect::{ServiceSpec, TaskKind, WorkloadIdentity},
    docker::DockerTask,
    duration::go_form,
    input,
    rules::Rules,
    template::Template,
    vars::{Eval, Inputs, VarFile},
};

/// Most problems one parse reports.
pub const MAX_REPORTED: usize = 20;

/// What `berth job run` adds to a spec: variable values and the node it is checked against.
#[derive(Debug, Clone, Default)]
pub struct ParseOptions {
    /// `-var name=value`, in order (a later one wins; every one wins over `var_files`).
    pub vars: Vec<(String, String)>,
    /// `-var-file`s, in order (a later one wins).
    pub var_files: Vec<VarFile>,
    /// The drivers this node has; `None`: not checked.
    pub drivers: Option<BTreeSet<String>>,
    /// The node's attribute and meta keys; `None`: not checked.
    pub node: Option<NodeKeys>,
}

/// The keys a node has, without their `attr.` and `meta.` prefixes.
#[derive(Debug, Clone, Default)]
pub struct NodeKeys {
    /// `attr.*`.
    pub attrs: BTreeSet<String>,
    /// `meta.*`.
    pub meta: BTreeSet<String>,
}

/// Every problem of a spec (at most [`MAX_REPORTED`]), in file order; never empty.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct SpecErrors {
    errors: Vec<SpecError>,
    more: usize,
}

impl SpecErrors {
    /// `errors` (not empty), cut to [`MAX_REPORTED`].
    pub fn new(mut errors: Vec<SpecError>) -> Self {
        let more = errors.len().saturating_sub(MAX_REPORTED);
        errors.truncate(MAX_REPORTED);
        Self { errors, more }
    }

    /// The problems, in order.
    pub fn iter(&self) -> impl Iterator<Item = &SpecError> {
        self.errors.iter()
    }

    /// The first problem.
    pub fn first(&self) -> &SpecError {
        &self.errors[0]
    }

    /// How many are kept.
    pub fn len(&self) -> usize {
        self.errors.len()
    }

    /// Never true (there is at least one).
    pub fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    fn into_first(self) -> SpecError {
        self.errors.into_iter().next().expect("at least one")
    }
}

impl From<SpecError> for SpecErrors {
    fn from(e: SpecError) -> Self {
        Self::new(vec![e])
    }
}

impl fmt::Display for SpecErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        if self.more > 0 {
            write!(f, "\n… and {} more", self.more)?;
        }
        Ok(())
    }
}

/// Fewest and most allocs a group may ask for.
pub const COUNT_RANGE: std::ops::RangeInclusive<u32> = 1..=100;
/// `kill_timeout` when not given.
pub const DEFAULT_KILL_TIMEOUT: Duration = Duration::from_secs(5);
/// `resources.cpu` (MHz) when not given, as in Nomad.
pub const DEFAULT_CPU_MHZ: u32 = 100;
/// `resources.memory` (MB) when not given, as in Nomad.
pub const DEFAULT_MEMORY_MB: u32 = 300;
/// Least `resources.cpu` (MHz), as in Nomad.
pub const MIN_CPU_MHZ: u32 = 1;
/// Least `resources.memory` (MB), as in Nomad.
pub const MIN_MEMORY_MB: u32 = 10;
/// `csi_plugin.mount_dir` when not given.
pub const DEFAULT_PLUGIN_MOUNT_DIR: &str = "/csi";
/// `csi_plugin.stage_publish_base_dir` when not given.
pub const DEFAULT_STAGE_PUBLISH_BASE_DIR: &str = "/local/csi";
/// `csi_plugin.health_timeout` when not given.
pub const DEFAULT_PLUGIN_HEALTH_TIMEOUT: Duration = Duration::from_secs(30);

/// What kind of job: it decides the default restart policy (and, at placement, whether a task
/// that exits is done or restarted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobType {
    /// Long-running tasks (the default).
    #[default]
    Service,
    /// Tasks that run to completion.
    Batch,
    /// Long-running tasks, one alloc on every eligible node (`count` is at most 1).
    System,
}

impl JobType {
    /// `service` or `batch`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Service => "service",
            Self::Batch => "batch",
            Self::System => "system",
        }
    }
}

impl fmt::Display for JobType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "service" => Ok(Self::Service),
            "batch" => Ok(Self::Batch),
            "system" => Ok(Self::System),
            "sysbatch" => Err(format!(
                "{s:?}: berth runs service, batch and system jobs only"
            )),
            _ => Err(format!(
                "unknown job type {} (expected service, batch or system)",
                berth_input::Quoted(s)
            )),
        }
    }
}

/// A checked job spec.
///
/// Guarantees (for one returned by [`JobSpec::parse`] and its siblings): `id`, every group name,
/// task name, volume name and source, and every plugin id is a valid path segment; group names
/// are unique in the job, task names unique in their group; every group has at least one task
/// and a count in [`COUNT_RANGE`]; every `volume_mount` names a volume of its group and has an
/// absolute destination without `..`; restart policies are consistent; mount flags take at
/// most 4 KiB; every device request passed [`DeviceRequest::build`] and its name is unique in
/// its task; service names are unique in their group, identity names in their task, and a
/// `connect-proxy` or `connect-native` kind names a service of its group that fits it.
/// Deserializing the canonical form does not check again: it is meant for what
/// this crate wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    /// The job's id: the label of the `job` block.
    pub id: String,
    /// `type`; `service` when not given.
    pub job_type: JobType,
    /// `group` blocks, in file order.
    pub groups: Vec<GroupSpec>,
    /// `region` (`NOMAD_REGION`); the node's when not given.
    #[serde(default)]
    pub region: Option<String>,
    /// `namespace` (`NOMAD_NAMESPACE`); `default` when not given.
    #[serde(default)]
    pub namespace: Option<String>,
    /// `priority`, 1 to 100; [`DEFAULT_PRIORITY`](crate::rules::DEFAULT_PRIORITY) when not
    /// given. A fleet may stop allocs of lower priority to place a job.
    #[serde(default = "default_priority")]
    pub priority: u8,
    /// `datacenters`: a fleet places the job only on nodes of one of them (`*` and `?` glob);
    /// every datacenter when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub datacenters: Vec<String>,
    /// The job's `constraint`, `affinity` and `spread` blocks.
    #[serde(default, skip_serializing_if = "Rules::is_empty")]
    pub rules: Rules,
}

fn default_priority() -> u8 {
    crate::rules::DEFAULT_PRIORITY
}

/// A group: `count` allocs of its tasks, placed together, sharing its volumes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSpec {
    /// The block's label.
    pub name: String,
    /// How many allocs; 1 when not given.
    pub count: u32,
    /// `volume` blocks by name (the block's label).
    pub volumes: BTreeMap<String, VolumeRequest>,
    /// The group's restart policy: the job type's defaults with the group's `restart` block
    /// applied. Tasks start from it.
    pub restart: RestartPolicy,
    /// `task` blocks, in file order (at least one).
    pub tasks: Vec<TaskSpec>,
    /// The group's `constraint`, `affinity` and `spread` blocks (on top of the job's).
    #[serde(default, skip_serializing_if = "Rules::is_empty")]
    pub rules: Rules,
    /// `service` blocks, in file order; names are unique in the group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<ServiceSpec>,
}

/// A group's `volume` block: a CSI volume its allocs claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRequest {
    /// The block's label; `volume_mount.volume` refers to it.
    pub name: String,
    /// berth's id of the volume (with `per_alloc`, the prefix of one; see
    /// [`VolumeRequest::source_for`]).
    pub source: String,
    /// How the volume is shared; it must match one of the volume's capabilities.
    pub access_mode: AccessMode,
    /// `file-system` when not given.
    pub attachment_mode: AttachmentMode,
    /// Claim for reading only. Always true with a reader-only access mode.
    pub read_only: bool,
    /// Each alloc claims its own volume, `<source>[<alloc index>]`.
    pub per_alloc: bool,
    /// The request's mount options (file-system only); they take precedence over the
    /// volume's. Stored with the flags in the clear; `Debug` hides the flags.
    pub mount_options: StoredMountOptions,
}

impl VolumeRequest {
    /// The id of the volume that the alloc with `index` (0-based, below the group's count)
    /// claims: `source`, or `source[index]` with `per_alloc`, as in Nomad.
    pub fn source_for(&self, index: u32) -> String {
        if self.per_alloc {
            format!("{}[{index}]", self.source)
        } else {
            self.source.clone()
        }
    }

    /// The mount options as the CSI model holds them.
    pub fn csi_mount_options(&self) -> MountOptions {
        MountOptions::from(&self.mount_options)
    }
}

/// What happens when a task fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartPolicy {
    /// Restarts allowed within `interval`.
    pub attempts: u32,
    /// The window that `attempts` counts in.
    #[serde(with = "go_form")]
    pub interval: Duration,
    /// Wait before each restart.
    #[serde(with = "go_form")]
    pub delay: Duration,
    /// What happens when the attempts are used up.
    pub mode: RestartMode,
}

impl RestartPolicy {
    /// Nomad's defaults: service and system jobs 2 attempts in 30m, batch jobs 3 in 24h; all
    /// with a 15s delay and mode `fail`.
    pub fn default_for(job_type: JobType) -> Self {
        let (attempts, interval) = match job_type {
            JobType::Service | JobType::System => (2, Duration::from_secs(30 * 60)),
            JobType::Batch => (3, Duration::from_secs(24 * 3600)),
        };
        Self {
            attempts,
            interval,
            delay: Duration::from_secs(15),
            mode: RestartMode::Fail,
        }
    }
}

/// `restart.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RestartMode {
    /// The task (and its alloc) fails.
    Fail,
    /// Wait until the interval is over, then start counting again.
    Delay,
}

impl RestartMode {
    /// `fail` or `delay`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fail => "fail",
            Self::Delay => "delay",
        }
    }
}

impl fmt::Display for RestartMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A task: one process, run by a driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSpec {
    /// The block's label.
    pub name: String,
    /// Task driver (`exec`, `raw_exec`…). Non-empty; whether this node has it is decided at
    /// placement.
    pub driver: String,
    /// `config.command`; its `${…}` runtime references are filled when the alloc is placed.
    /// Empty for a docker task that gives none: the image's own command.
    pub command: Template,
    /// `config.args`, likewise.
    pub args: Vec<Template>,
    /// `env`; values likewise (they may not reference other `env` keys).
    pub env: BTreeMap<String, Template>,
    /// `user`: who the task runs as (the driver's default when not given).
    #[serde(default)]
    pub user: Option<String>,
    /// `config.pid_mode` (exec and docker only): the driver's default when not given.
    #[serde(default)]
    pub pid_mode: Option<PidMode>,
    /// `meta` of the job, group and task, merged (the task's wins).
    #[serde(default)]
    pub meta: BTreeMap<String, String>,
    /// `volume_mount` blocks, in file order.
    pub volume_mounts: Vec<VolumeMount>,
    /// `resources`.
    pub resources: Resources,
    /// `resources { device "<name>" { … } }` blocks, in file order; labels are unique in the
    /// task. Their `${device.…}` references are kept as written, for placement to resolve
    /// against each device group. Empty in specs stored before devices were read.
    #[serde(default)]
    pub devices: Vec<DeviceRequest>,
    /// How long the task has to exit after the stop signal; 5s when not given.
    #[serde(with = "go_form")]
    pub kill_timeout: Duration,
    /// The group's policy with the task's `restart` block applied field by field.
    pub restart: RestartPolicy,
    /// Set when the task runs a CSI plugin.
    pub csi_plugin: Option<CsiPluginSpec>,
    /// `kind`: the task's Connect role. A `connect-proxy` kind names a group service with
    /// `connect { sidecar_service {} }`, a `connect-native` kind one with `connect { native =
    /// true }`; at most one proxy task fronts a service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<TaskKind>,
    /// `identity` blocks, in file order; names are unique in the task (the one without a name
    /// is the default identity).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub identities: Vec<WorkloadIdentity>,
    /// The rest of `config` of a docker task: `Some` exactly when `driver` is `docker`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub docker: Option<DockerTask>,
    /// `logs`: how much of the task's output is kept (Nomad's defaults when not given, and in
    /// specs stored before it was read).
    #[serde(default)]
    pub logs: LogConfig,
}

/// A task's `logs` block: its stdout and stderr are each kept in at most `max_files` files of
/// `max_file_size` MiB, the oldest deleted; or not kept at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogConfig {
    /// `max_files`: files kept per stream, at least 1 (default 10).
    pub max_files: u32,
    /// `max_file_size`: size of one file in MiB, at least 1 (default 10).
    pub max_file_size_mb: u32,
    /// `disabled` (or `enabled = false`, Nomad's older form): the output is thrown away.
    pub disabled: bool,
}

/// Nomad's default `logs.max_files`.
pub const DEFAULT_LOG_MAX_FILES: u32 = 10;

/// Nomad's default `logs.max_file_size`, in MiB.
pub const DEFAULT_LOG_MAX_FILE_SIZE_MB: u32 = 10;

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            max_files: DEFAULT_LOG_MAX_FILES,
            max_file_size_mb: DEFAULT_LOG_MAX_FILE_SIZE_MB,
            disabled: false,
        }
    }
}

/// A `volume_mount` block: where a group volume appears in the task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMount {
    /// The name of one of the group's volumes.
    pub volume: String,
    /// Absolute path in the task, without `..` (normalized: no `.`, no repeated or trailing
    /// `/`) once its runtime references are filled ([`crate::check_destination`]).
    pub destination: Template,
    /// Mount read-only (also the case when the group's volume is read-only).
    pub read_only: bool,
    /// `propagation_mode`; `private` when not given.
    #[serde(default)]
    pub propagation: PropagationMode,
    /// `selinux_label`: accepted and kept; berth applies no SELinux label.
    #[serde(default)]
    pub selinux_label: Option<String>,
}

/// `volume_mount.propagation_mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PropagationMode {
    /// Nothing travels either way (the default).
    #[default]
    Private,
    /// Mounts and unmounts under the source on the host reach the task.
    HostToTask,
    /// Both ways (the source must lie on a shared mount).
    Bidirectional,
}

/// `config.pid_mode` of an `exec` or `docker` task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PidMode {
    /// A PID namespace of its own.
    Private,
    /// The host's.
    Host,
}

/// `resources`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    /// `cpu`, in MHz; [`DEFAULT_CPU_MHZ`] when not given.
    pub cpu_mhz: u32,
    /// `memory`, in MB; [`DEFAULT_MEMORY_MB`] when not given.
    pub memory_mb: u32,
}

impl Default for Resources {
    fn default() -> Self {
        Self {
            cpu_mhz: DEFAULT_CPU_MHZ,
            memory_mb: DEFAULT_MEMORY_MB,
        }
    }
}

/// A `csi_plugin` block: the task is a CSI plugin, and berth registers and supervises it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsiPluginSpec {
    /// The plugin's id (volumes name it as `plugin_id`).
    pub id: String,
    /// Which services it serves.
    pub plugin_type: CsiPluginType,
    /// Where, inside the task, the plugin expects its socket directory (`csi.sock` in it).
    pub mount_dir: Template,
    /// Where, inside the task, the plugin is told to stage and publish volumes. Neither of
    /// `mount_dir` and this lies inside the other ([`crate::check_plugin_dirs`]).
    pub stage_publish_base_dir: Template,
    /// How long the plugin has to answer its first probe before it counts as unhealthy.
    #[serde(with = "go_form")]
    pub health_timeout: Duration,
}

/// `csi_plugin.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CsiPluginType {
    /// Node service only.
    Node,
    /// Controller service only.
    Controller,
    /// Both.
    Monolith,
}

impl CsiPluginType {
    /// `node`, `controller` or `monolith`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Node => "node",
            Self::Controller => "controller",
            Self::Monolith => "monolith",
        }
    }

    /// Whether it serves the Node service.
    pub fn is_node(self) -> bool {
        matches!(self, Self::Node | Self::Monolith)
    }

    /// Whether it serves the Controller service.
    pub fn is_controller(self) -> bool {
        matches!(self, Self::Controller | Self::Monolith)
    }
}

impl fmt::Display for CsiPluginType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CsiPluginType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "node" => Ok(Self::Node),
            "controller" => Ok(Self::Controller),
            "monolith" => Ok(Self::Monolith),
            _ => Err(format!(
                "unknown plugin type {} (expected node, controller or monolith)",
                berth_input::Quoted(s)
            )),
        }
    }
}

impl From<CsiPluginType> for PluginDir {
    fn from(t: CsiPluginType) -> Self {
        match t {
            CsiPluginType::Node => PluginDir::Node,
            CsiPluginType::Controller => PluginDir::Controller,
            CsiPluginType::Monolith => PluginDir::Monolith,
        }
    }
}

impl JobSpec {
    /// Reads and checks `file`: JSON when its name ends in `.json`, HCL otherwise. Reads at
    /// most one byte past the 1 MiB a spec may take.
    pub fn load(file: &Path) -> Result<Self, SpecError> {
        let text = berth_input::read_text(file).map_err(|e| SpecError {
            file: file.to_path_buf(),
            line: None,
            field: String::new(),
            message: format!("cannot read: {e}"),
        })?;
        Self::parse(file, &text)
    }

    /// Checks `text` as the contents of `file`: JSON when `file` ends in `.json`, HCL
    /// otherwise.
    pub fn parse(file: &Path, text: &str) -> Result<Self, SpecError> {
        if file.extension().is_some_and(|e| e == "json") {
            Self::parse_json(file, text)
        } else {
            Self::parse_hcl(file, text)
        }
    }

    /// Checks `text` as HCL; `file` only names it in errors. A text over 1 MiB or nested
    /// deeper than 64 levels is refused before it is parsed ([`berth_input::check_text`]).
    /// The first problem is returned; [`JobSpec::parse_with`] returns them all.
    pub fn parse_hcl(file: &Path, text: &str) -> Result<Self, SpecError> {
        Self::parse_with(file, text, Syntax::Hcl, &ParseOptions::default())
            .map_err(SpecErrors::into_first)
    }

    /// Checks `text` as JSON in HCL's JSON form (e.g. an API body); `file` only names it in
    /// errors. Bounded as [`JobSpec::parse_hcl`] is.
    pub fn parse_json(file: &Path, text: &str) -> Result<Self, SpecError> {
        Self::parse_with(file, text, Syntax::Json, &ParseOptions::default())
            .map_err(SpecErrors::into_first)
    }

    /// Checks `text` in `syntax`, with HCL2 variables from `opts` and against the node in
    /// `opts` (its drivers, attributes and meta, when given). Every problem is returned (at
    /// most [`MAX_REPORTED`]), in file order.
    pub fn parse_with(
        file: &Path,
        text: &str,
        syntax: Syntax,
        opts: &ParseOptions,
    ) -> Result<Self, SpecErrors> {
        bounded(file, syntax, text)?;
        let inputs = Inputs {
            vars: &opts.vars,
            var_files: &opts.var_files,
        };
        let root = match syntax {
            Syntax::Hcl => input::from_hcl(file, text, &inputs).map_err(SpecErrors::new)?,
            Syntax::Json => {
                let mut root = input::from_json(file, text)?;
                input::json_templates(&mut root, &Eval::bare());
                root
            }
        };
        check::job(file, root, opts)
    }

    /// The group called `name`.
    pub fn group(&self, name: &str) -> Option<&GroupSpec> {
        self.groups.iter().find(|g| g.name == name)
    }
}

/// [`berth_input::check_text`], as a [`SpecError`].
fn bounded(file: &Path, syntax: Syntax, text: &str) -> Result<(), SpecError> {
    berth_input::check_text(syntax, text).map_err(|e| SpecError {
        file: file.to_path_buf(),
        line: e.line(),
        field: String::new(),
        message: e.to_string(),
    })
}

impl GroupSpec {
    /// The task called `name`.
    pub fn task(&self, name: &str) -> Option<&TaskSpec> {
        self.tasks.iter().find(|t| t.name == name)
    }
}
