//! Job specs: what `berth job run` reads. A subset of Nomad's job specification, in HCL or in
//! HCL's JSON form, checked whole into a [`JobSpec`].
//!
//! ```
//! use std::path::Path;
//!
//! let spec = berth_job::JobSpec::parse(
//!     Path::new("writer.hcl"),
//!     r#"
//! job "writer" {
//!   type = "batch"
//!   group "writer" {
//!     volume "data" {
//!       type        = "csi"
//!       source      = "demo"
//!       access_mode = "single-node-writer"
//!     }
//!     task "write" {
//!       driver = "exec"
//!       config {
//!         command = "/bin/sh"
//!         args    = ["-c", "echo hello > /data/hello.txt"]
//!       }
//!       volume_mount {
//!         volume      = "data"
//!         destination = "/data"
//!       }
//!     }
//!   }
//! }
//! "#,
//! )?;
//! assert_eq!(spec.groups[0].tasks[0].volume_mounts[0].volume, "data");
//! # Ok::<(), berth_job::SpecError>(())
//! ```
//!
//! # What is read
//!
//! One `job "<id>"` block per file, with:
//!
//! - `type` (`service`, the default, `batch` or `system`); `priority` (1 to 100, default
//!   [`rules::DEFAULT_PRIORITY`]); `datacenters` (names, where `*` and `?` glob, kept as
//!   written); `region`, `namespace`, `meta`; `constraint`, `affinity` and `spread` blocks;
//! - `group "<name>"` blocks: `count` (1 to 100, default 1); `constraint`, `affinity` and
//!   `spread` blocks (on top of the job's); `volume "<name>"` blocks with
//!   `type = "csi"`, `source` (berth's volume id), `access_mode`, `attachment_mode` (default
//!   `file-system`), `read_only` and `per_alloc` (default false), `mount_options { fs_type,
//!   mount_flags }`; `restart { attempts, interval, delay, mode }`; `service` blocks
//!   ([`ServiceSpec`]): `name`, `port`, `tags`, `provider` (`consul`, the default, or
//!   `nomad`), `connect { native, sidecar_service { port, tags } }` and `identity { aud, ttl
//!   }`; `task "<name>"` blocks;
//! - in a task: `driver`, `config { command, args }` (more for `docker`, below), `env`, `volume_mount { volume,
//!   destination, read_only }` blocks, `resources { cpu, memory }` (MHz and MB, default 100
//!   and 300), `kill_timeout` (default 5s), `restart`, `logs { max_files, max_file_size,
//!   disabled }` ([`LogConfig`]: 10 files of 10 MiB per stream by default; Nomad's older
//!   `enabled` is read too) and `csi_plugin { id, type, mount_dir,
//!   stage_publish_base_dir, health_timeout }` (defaults `/csi`, `/local/csi`, 30s), `kind`
//!   ([`TaskKind`]: `connect-proxy:<service>`, `connect-native:<service>`,
//!   `connect-ingress:<service>`, `connect-terminating:<service>` or
//!   `connect-mesh:<service>`) and `identity { name, aud, env, file, filepath, ttl,
//!   change_mode, change_signal }` blocks ([`WorkloadIdentity`]; the one without `name` is
//!   the default identity);
//! - in a task's `resources`: `device "<name>"` blocks ([`DeviceRequest`]), any number, with
//!   `count` (default 1), `constraint { attribute, operator, value }` and `affinity {
//!   attribute, operator, value, weight }` blocks (operator default `=`, weight default 50).
//!   The name is a type (`gpu`), `vendor/type` or `vendor/type/name`, or a CDI device
//!   (`vendor.com/class=name`). `attribute` and `value` are literals or `${device.model}`,
//!   `${device.vendor}`, `${device.type}`, `${device.ids}` or `${device.attr.<name>}`, kept as
//!   written for placement to resolve per device group (HCL2 variables in them are filled).
//!   Nomad's short forms `regexp = "…"`, `version`, `semver`, `set_contains`,
//!   `set_contains_all` and `set_contains_any` stand for the operator and its value.
//! - a job's and a group's placement rules, kept in [`rules::Rules`] for a fleet's scheduler:
//!   `constraint { attribute, operator, value }` (operator default `=`; besides the device
//!   operators, `distinct_hosts`, which takes no attribute, and `distinct_property`, whose
//!   `value` is how many allocs one value of the attribute may hold, default 1; Nomad's
//!   `distinct_hosts = true` and `distinct_property = "<attribute>"` forms too, and
//!   `distinct_hosts = false` is no constraint), `affinity { attribute, operator, value, weight
//!   }` (weight -100 to 100, not 0, default 50) and `spread { attribute, weight, target
//!   "<value>" { percent } }` (weight 1 to 100, default 50; percents 0 to 100, default 0, at
//!   most 100 in all). Sides are literals or text with `${attr.<key>}`, `${meta.<key>}`,
//!   `${node.unique.id}`, `${node.unique.name}`, `${node.datacenter}`, `${node.region}` or
//!   `${node.class}` references ([`rules::NODE_REFERENCES`]), kept as written for the
//!   scheduler to fill on each node (HCL2 variables in them are filled); the short forms above
//!   apply.
//!
//! Durations are Go's form (`"30s"`, `"1m30s"`, `"1.5h"`, `"500ms"`), as in Nomad. Restart
//! policies start from Nomad's defaults for the job type (service and system: 2 attempts in
//! 30m; batch: 3 in 24h; all a 15s delay and mode `fail`); a group's `restart` block changes
//! the fields it gives, and a task's changes the group's result the same way. They are checked
//! as Nomad checks them: `mode = "delay"` needs attempts, and `attempts × delay` must fit in
//! `interval`.
//!
//! # Errors
//!
//! The first problem is returned as a [`SpecError`], displayed `file:line: field: message`;
//! the line is known for HCL (and for JSON syntax errors), the field is a path such as
//! `job.group[web].task[app].volume_mount[0].volume`. Unknown fields are errors, everywhere.
//! Names that become path segments (job id, group, task and volume names, volume sources,
//! plugin ids) are checked as such. Mount flags and `env` values never appear in an error, and
//! `Debug` hides mount flags.
//!
//! # Stored form
//!
//! [`JobSpec`] is `Serialize` and `Deserialize` in a canonical JSON form of its own (field
//! names as in the structs, durations as Go strings), so the agent can store it. Mount flags
//! are written in the clear there (a restarted agent mounts with them) and are hidden from
//! `Debug` only. That form is not a spec form: specs go through [`JobSpec::parse`].
//!
//! # Variables
//!
//! HCL2 `variable` / `variables` and `locals` blocks (next to the job block), `var.x`,
//! `local.x`, operators, conditionals, for-expressions and a set of functions (`upper`,
//! `lower`, `title`, `trimspace`, `join`, `split`, `replace`, `substr`, `format`, `concat`,
//! `length`, `contains`, `keys`, `values`, `lookup`, `merge`, `coalesce`, `min`, `max`, `abs`,
//! `range`, `tostring`, `tonumber`, `tobool`, `jsonencode`) are evaluated when the spec is read,
//! with values from [`ParseOptions`] (`-var`, `-var-file`). Types `string`, `number`, `bool`,
//! `list`/`set`/`tuple`, `map`/`object` and `any` are checked by kind.
//!
//! `${…}` interpolations that name a runtime value (Nomad's `NOMAD_*` variables, `CSI_ENDPOINT`
//! in a plugin task, `attr.*`, `node.*`, `meta.*`, the task's own `env` keys) are kept as
//! [`Template`] references where Nomad interpolates at runtime (`config.command` and `args`,
//! a docker task's `image`, `entrypoint`, `volumes`, `mount` source and target and `work_dir`,
//! `env` values, `volume_mount.destination`, `csi_plugin` dirs), for the node to fill; anywhere
//! else they are refused. `${device.…}` references are kept as text in a device block's
//! constraints and affinities, and refused everywhere else; `${attr.…}`, `${meta.…}` and
//! `${node.…}` references are kept as text in a job's or group's `constraint`, `affinity` and
//! `spread`. An unknown reference is refused with its line; with [`ParseOptions::node`], so is
//! an attribute or meta key the node does not have, except in a job's or group's rules, which
//! are for every node of a fleet.
//!
//! # How it differs from Nomad
//!
//! - JSON is HCL's JSON form (the HCL structure, a block as an object or a list of objects,
//!   labelled blocks as objects keyed by label; strings are templates), not Nomad's API form
//!   (`{"Job": {…}}`), which is refused with a hint.
//! - Job type `sysbatch` is refused. As in Nomad, a `system` job's group has a count of 1
//!   (more is an error naming the count) and a system job takes no `affinity` or `spread`.
//!   `count` is at least 1. `priority` and `datacenters` are kept for a fleet's scheduler (a
//!   single node runs what it is given); `region`, `namespace` and `meta` are accepted
//!   (`region` and `namespace` feed `NOMAD_REGION` and `NOMAD_NAMESPACE`).
//! - A job's and a group's `constraint`, `affinity` and `spread` blocks are checked when read,
//!   as device blocks are: an unknown operator, a literal regexp that does not compile or
//!   version or semver constraint that does not parse, a reference that is not one of
//!   [`rules::NODE_REFERENCES`] (`${NOMAD_ALLOC_ID}`, `${device.model}`), `is_set`/`is_not_set`
//!   with a value or another operator without one, a missing attribute, an affinity with
//!   `is_set`, `is_not_set`, `distinct_hosts` or `distinct_property` or a weight of 0 or outside
//!   -100 to 100, `distinct_hosts` with an attribute or a value other than `"true"`, a
//!   `distinct_property` limit that is not a whole number of at least 1, a spread without an
//!   attribute or with a weight of 0 (Nomad takes 0 to 100; berth wants the spread to count),
//!   a target percent above 100, a repeated target or percents above 100 in all are errors;
//!   so are a short form (`regexp = "…"`, `distinct_hosts = true`, `distinct_property = "…"`)
//!   next to the fields it stands for (Nomad lets one silently win). A task's `constraint`,
//!   `affinity` and `spread` are unknown fields.
//! - Volumes are CSI volumes only; `access_mode` is required, `attachment_mode` defaults to
//!   `file-system`. As in Nomad, a reader-only access mode needs `read_only = true`;
//!   `mount_options` only go with `file-system`. A mount of a read-only volume is read-only.
//! - `volume_mount.destination` must be an absolute path without `..` (checked after its
//!   references are filled); two mounts of a task cannot share one. `propagation_mode`
//!   (`private`, `host-to-task`, `bidirectional`) is applied; `selinux_label` is accepted.
//! - `config` holds what berth's drivers take: `command` and `args`, and `pid_mode` for
//!   `exec`. With [`ParseOptions::drivers`], a driver the node lacks is reported first, and
//!   its task's config is not checked.
//! - A `docker` task's `config` ([`DockerTask`]) holds Nomad's docker options berth runs:
//!   `image` (required), `command` (optional: the image's own when left out), `args`,
//!   `entrypoint`, `privileged`, `network_mode` (`bridge`/`default`, `none`, `host` only),
//!   `volumes` (`"src:dst[:ro|rw]"`), `mount` blocks (`type` `bind` or `tmpfs`, which must be
//!   written: Nomad's default, a named `volume`, is refused), `devices`, `cap_add`, `cap_drop`,
//!   `ulimit`, `work_dir`, `labels`, `pid_mode`, `ipc_mode` and `init`. A bind source (in
//!   `volumes` or `mount`) has no `..`; a relative one lies in the task directory. Targets and
//!   `work_dir` are absolute. With [`ParseOptions::node`], `privileged = true` needs the
//!   attribute [`DOCKER_PRIVILEGED_ATTR`] and an absolute host path needs
//!   [`DOCKER_VOLUMES_ATTR`], as Nomad's docker driver needs `allow_privileged` and
//!   `volumes { enabled = true }`.
//! - `resources` holds `cpu`, `memory` (at least 1 MHz and 10 MB, as in Nomad) and `device`
//!   blocks only.
//! - `device` blocks are checked when read, not at placement: two with one name in a task, an
//!   empty part in a name, an unknown operator, a regexp that does not compile, a version or
//!   semver constraint that does not parse, a side that is neither a literal nor one of the
//!   `${device.…}` references (`${node.class}`, `${device.colour}`, or a reference inside
//!   other text), `is_set`/`is_not_set` with a value or another operator without one, an
//!   affinity with `is_set`/`is_not_set` or a weight of 0 or outside -100 to 100 are all
//!   errors; so is a `device` block outside `resources`, `distinct_hosts` or
//!   `distinct_property` in a device constraint, and a short form given next to `operator` or
//!   `value` (Nomad lets one silently win). A CDI device is one named device: its count is 1
//!   and it takes no constraint or affinity. `${device.…}` anywhere else is an error.
//! - `csi_plugin`: `id` and `type` are required; `mount_dir` and `stage_publish_base_dir` must
//!   be absolute and neither may lie inside the other.
//! - Services are a group's only (a task's `service` is an unknown field), and a service
//!   holds the fields above only (`check`, `meta`, a sidecar's `proxy`, `sidecar_task` and
//!   `gateway` are unknown fields). Checked as Nomad checks them: a name of 1 to 63 ASCII
//!   letters, digits and dashes, neither first nor last a dash, after `${NOMAD_JOB_NAME}`
//!   and `${NOMAD_GROUP_NAME}` are filled (when read; no other reference, and no
//!   `${NOMAD_TASK_NAME}`, since a group service has no task); one provider for all services
//!   of a group; `connect` only with `consul`, holding exactly one of `native = true` and
//!   `sidecar_service`. Names are unique in a group (Nomad tells services apart by name and
//!   port). Port labels are kept as written: berth reads no `network` block to check them
//!   against. No sidecar task is injected: a proxy is a task of the group written with its
//!   `kind`.
//! - A `connect-proxy:<service>` task needs a service of its group with that name and a
//!   `sidecar_service` block, a `connect-native:<service>` task one with `native = true`
//!   (both errors name the task's `kind`); a service has at most one proxy task. Gateway
//!   kinds are kept without a check. Any other `kind` is an error (Nomad keeps it).
//!   [`GroupSpec::consul_si_token_tasks`] lists the tasks that need a Consul service identity
//!   token with their services.
//! - `identity` blocks as Nomad checks them: names of 1 to 128 ASCII letters, digits, `-` and
//!   `_`, unique in the task (two blocks without `name` are two default identities); `aud`
//!   items not empty; `ttl` a duration, and none on the default identity; `change_signal`
//!   with `change_mode = "signal"` only, and required by it. Stricter than Nomad: an `aud`
//!   other than `nomadproject.io` on the default identity is an error (Nomad replaces it), a
//!   `ttl` of 0 is an error (leave it out for a token that does not expire), `filepath`
//!   needs `file = true` and is relative without `..`, and a label (`identity
//!   "vault_default" { … }`) is an error that says to write `name = "…"`. The same `aud` and
//!   `ttl` rules hold in a service's `identity`.
//! - Everything else of Nomad's job specification (task constraints, affinities and spreads,
//!   networks, templates, artifacts, update and reschedule policies…) is an unknown field.
//! - [`JobSpec::parse_with`] reports every problem (up to [`MAX_REPORTED`]); a volume spec
//!   given as a job says which command takes it.

mod check;
mod connect;
mod docker;
mod duration;
mod input;
mod path;
pub mod rules;
mod spec;
mod template;
mod vars;

use std::path::{Component, Path, PathBuf};

pub use berth_devices::request::{DeviceRequest, DeviceTarget};
pub use berth_volume::SpecError;
pub use connect::{
    ConnectSpec, DEFAULT_IDENTITY_AUD, DEFAULT_IDENTITY_NAME, IdentityChangeMode,
    MAX_IDENTITY_NAME_CHARS, MAX_SERVICE_NAME_CHARS, ServiceIdentity, ServiceNameError,
    ServiceProvider, ServiceSpec, SidecarService, TASK_KIND_PREFIXES, TaskKind, TaskKindError,
    WorkloadIdentity, check_service_name,
};
pub use docker::{
    BindPropagation, DOCKER_CONFIG_KEYS, DOCKER_PRIVILEGED_ATTR, DOCKER_VOLUMES_ATTR, DockerDevice,
    DockerIpc, DockerMount, DockerNetwork, DockerTask, DockerUlimit, DockerVolume, ULIMIT_NAMES,
    check_bind_source, check_cgroup_permissions, check_container_path, normalize_capability,
    parse_docker_volume,
};
pub use duration::{DurationError, GoDuration, format_duration, parse_duration};
pub use spec::{
    COUNT_RANGE, CsiPluginSpec, CsiPluginType, DEFAULT_CPU_MHZ, DEFAULT_KILL_TIMEOUT,
    DEFAULT_LOG_MAX_FILE_SIZE_MB, DEFAULT_LOG_MAX_FILES, DEFAULT_MEMORY_MB,
    DEFAULT_PLUGIN_HEALTH_TIMEOUT, DEFAULT_PLUGIN_MOUNT_DIR, DEFAULT_STAGE_PUBLISH_BASE_DIR,
    GroupSpec, JobSpec, JobType, LogConfig, MAX_REPORTED, MIN_CPU_MHZ, MIN_MEMORY_MB, NodeKeys,
    ParseOptions, PidMode, PropagationMode, Resources, RestartMode, RestartPolicy, SpecErrors,
    TaskSpec, VolumeMount, VolumeRequest,
};
pub use template::{NODE_VARIABLES, Part, RUNTIME_VARIABLES, Template};
pub use vars::VarFile;

/// A rendered `volume_mount.destination`: absolute, without `..`, normalized.
pub fn check_destination(rendered: &str) -> Result<PathBuf, String> {
    if !rendered.starts_with('/') {
        return Err(format!(
            "{} is not an absolute path",
            berth_input::Quoted(rendered)
        ));
    }
    let parts: Vec<Component<'_>> = Path::new(rendered).components().collect();
    if parts.contains(&Component::ParentDir) {
        return Err(format!(
            "{} must not contain \"..\"",
            berth_input::Quoted(rendered)
        ));
    }
    Ok(parts.into_iter().collect())
}

/// Rendered `csi_plugin` dirs: both absolute without `..`, and neither inside the other.
pub fn check_plugin_dirs(mount_dir: &str, stage: &str) -> Result<(PathBuf, PathBuf), String> {
    let m = check_destination(mount_dir).map_err(|e| format!("mount_dir: {e}"))?;
    let s = check_destination(stage).map_err(|e| format!("stage_publish_base_dir: {e}"))?;
    if m.starts_with(&s) || s.starts_with(&m) {
        return Err(format!(
            "mount_dir {} and stage_publish_base_dir {} must lie apart",
            m.display(),
            s.display()
        ));
    }
    Ok((m, s))
}
