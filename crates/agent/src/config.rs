//! The agent's configuration file (HCL; JSON when the file ends in `.json`), checked whole
//! before the agent starts. Every error names the file, and the line or the field.
//!
//! The text is bounded before it is parsed ([`berth_input::check_text`]: 1 MiB, 64 levels of
//! nesting). Errors repeat no value of the wrong type (a plugin's `env` may hold credentials),
//! and what they do repeat (the file name, keys, values of the right type) is escaped and cut.

use std::{
    collections::{BTreeMap, HashSet},
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use berth_api::PluginType;
use berth_input::{Quoted, Shown, Syntax, serde_message};
use serde::Deserialize;

mod api;
mod control_plane;
mod devices;
mod docker;

pub use api::{ApiTls, SocketGroup};
pub use control_plane::check as check_etcd;
pub use devices::{DEFAULT_KUBELET_DIR, DEFAULT_STATS_INTERVAL, DevicesConfig, NomadPluginDecl};

/// Default interval between health probes.
pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_secs(30);
/// Default consecutive failed probes before a healthy plugin is unhealthy.
pub const DEFAULT_HEALTH_FAILURES: u32 = 3;
/// Default rescan interval of the registration directory.
pub const DEFAULT_RESCAN_INTERVAL: Duration = Duration::from_secs(60);

/// A configuration problem: file, line when known, the field, and what is wrong. The file name
/// is shown escaped and cut.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}: {field}{}{message}", Shown(&file.to_string_lossy()), line.map(|l| format!(":{l}")).unwrap_or_default(), if field.is_empty() { "" } else { ": " })]
pub struct ConfigError {
    /// The config file.
    pub file: PathBuf,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// The field, e.g. `plugin "x".socket`; empty for syntax errors.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// How health is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthConfig {
    /// Between probes.
    pub interval: Duration,
    /// Consecutive failures before healthy → unhealthy.
    pub failures: u32,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            interval: DEFAULT_HEALTH_INTERVAL,
            failures: DEFAULT_HEALTH_FAILURES,
        }
    }
}

/// How a declared plugin is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginRun {
    /// Someone else runs it; it listens here.
    External {
        /// Absolute socket path.
        socket: PathBuf,
    },
    /// The agent runs it, with `CSI_ENDPOINT` set to a socket in the data dir.
    Command {
        /// The program.
        command: PathBuf,
        /// Its arguments.
        args: Vec<String>,
        /// Extra environment.
        env: BTreeMap<String, String>,
    },
}

/// A `plugin "<id>" { … }` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginDecl {
    /// Plugin id.
    pub id: String,
    /// What it does.
    pub plugin_type: PluginType,
    /// How it is reached.
    pub run: PluginRun,
}

/// The checked configuration. Every field is optional in the file; flags override it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    /// `data_dir`.
    pub data_dir: Option<PathBuf>,
    /// `log_level`.
    pub log_level: Option<String>,
    /// `log_format` (`human` or `json`).
    pub log_format: Option<String>,
    /// `api { socket = … }`: the API socket; default `<data_dir>/berth.sock`.
    pub api_socket: Option<PathBuf>,
    /// `api { address = "127.0.0.1:PORT" }`: an extra TCP listener; loopback, unless `api_tls`
    /// is set and ACLs are on.
    pub api_address: Option<SocketAddr>,
    /// `api { tls { cert_file, key_file } }`: the TCP listener serves HTTPS.
    pub api_tls: Option<ApiTls>,
    /// `api { socket_group = "name" }`: the socket is mode 0660, owned by this group.
    pub api_socket_group: Option<SocketGroup>,
    /// `acl { enabled = true }`: every API request but the public ones needs a token.
    pub acl_enabled: bool,
    /// `plugins_registry_dir`: default `<data_dir>/plugins_registry`.
    pub registry_dir: Option<PathBuf>,
    /// `registry_rescan_interval`.
    pub rescan_interval: Option<Duration>,
    /// `health { interval, failures }`.
    pub health: HealthConfig,
    /// `plugin` blocks, in file order.
    pub plugins: Vec<PluginDecl>,
    /// `name`, `datacenter`, `region` and `client { node_class, meta }`: what jobs read as
    /// `node.*` and `meta.*`.
    pub node: NodeConfig,
    /// `client { chroot_env = { "<host path>" = "<path in the task>" } }`: what every `exec`
    /// task's root holds, read-only; `None`: Nomad's defaults.
    pub chroot_env: Option<BTreeMap<PathBuf, PathBuf>>,
    /// `plugin_dir`, `plugin` blocks without `type` (Nomad device plugins) and `devices { … }`.
    pub devices: DevicesConfig,
    /// `control_plane { etcd { endpoints, prefix, lease_ttl, tls { … } } }`: a fleet on etcd;
    /// `None`: the embedded control plane.
    pub etcd: Option<berth_fleet::EtcdSettings>,
    /// `consul { address, token, service_identity_auth_method, task_identity_auth_method,
    /// ssl, ca_file }`: where the Consul the alloc's tokens come from is (Nomad's defaults,
    /// `127.0.0.1:8500` and the `nomad-workloads` auth method, without the block).
    pub consul: berth_consul::ConsulConfig,
    /// `plugin "docker" { config { podman, runtime, allow_privileged, volumes { enabled },
    /// storage_root, run_root } }`: the `docker` task driver's settings.
    pub docker: berth_drivers::DockerConfig,
    /// `events { window = N }`: how many of the latest events the event stream keeps on disk
    /// for readers that reconnect; default [`crate::event_log::DEFAULT_WINDOW`].
    pub event_window: Option<usize>,
}

/// Most events `events.window` may keep.
pub const MAX_EVENT_WINDOW: usize = 1_000_000;

/// The node as jobs see it (Nomad's `name`, `datacenter`, `region`, `client.node_class`,
/// `client.meta`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    /// `name`; default: the hostname.
    pub name: Option<String>,
    /// `datacenter`; default `dc1`.
    pub datacenter: String,
    /// `region`; default `global`.
    pub region: String,
    /// `client.node_class`; default empty.
    pub node_class: String,
    /// `client.meta`.
    pub meta: BTreeMap<String, String>,
    /// `client.cpu_total_compute`: the MHz the node offers, instead of what it fingerprints.
    pub cpu_total_compute: Option<u64>,
    /// `client.memory_total_mb`: the MB the node offers, instead of what it fingerprints.
    pub memory_total_mb: Option<u64>,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            name: None,
            datacenter: "dc1".into(),
            region: "global".into(),
            node_class: String::new(),
            meta: BTreeMap::new(),
            cpu_total_compute: None,
            memory_total_mb: None,
        }
    }
}

/// Paths of a task's root that get mounts of their own: a `chroot_env` entry may not land on
/// or under them (`/local` and `/tmp` are plain directories, which an entry may go into).
const TASK_LAYOUT: [&str; 5] = ["/alloc", "/secrets", "/proc", "/dev", "/sys"];

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    data_dir: Option<PathBuf>,
    log_level: Option<String>,
    log_format: Option<String>,
    api: Option<api::RawApi>,
    acl: Option<api::RawAcl>,
    plugins_registry_dir: Option<PathBuf>,
    registry_rescan_interval: Option<String>,
    health: Option<RawHealth>,
    plugin: Option<BTreeMap<String, RawPlugin>>,
    name: Option<String>,
    datacenter: Option<String>,
    region: Option<String>,
    client: Option<RawClient>,
    plugin_dir: Option<PathBuf>,
    devices: Option<devices::RawDevices>,
    control_plane: Option<control_plane::RawControlPlane>,
    consul: Option<berth_consul::ConsulConfig>,
    events: Option<RawEvents>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEvents {
    window: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClient {
    node_class: Option<String>,
    meta: Option<BTreeMap<String, String>>,
    chroot_env: Option<BTreeMap<PathBuf, PathBuf>>,
    cpu_total_compute: Option<u64>,
    memory_total_mb: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHealth {
    interval: Option<String>,
    failures: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlugin {
    /// CSI plugins have a type; Nomad device plugins (in `plugin_dir`) have none.
    #[serde(rename = "type")]
    plugin_type: Option<String>,
    socket: Option<PathBuf>,
    command: Option<PathBuf>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// A Nomad plugin's configuration (its schema is applied when it runs).
    config: Option<serde_json::Value>,
}

impl Config {
    /// Reads and checks `file`. Nothing is created or changed. Reads at most one byte past the
    /// 1 MiB a config may take.
    pub fn load(file: &Path) -> Result<Config, ConfigError> {
        let text = berth_input::read_text(file).map_err(|e| ConfigError {
            file: file.to_path_buf(),
            line: None,
            field: String::new(),
            message: format!("cannot read: {e}"),
        })?;
        Self::parse(file, &text)
    }

    /// Checks `text` as the contents of `file` (HCL, or JSON when `file` ends in `.json`).
    pub fn parse(file: &Path, text: &str) -> Result<Config, ConfigError> {
        let err = |line: Option<usize>, field: &str, message: String| ConfigError {
            file: file.to_path_buf(),
            line,
            field: field.to_string(),
            message,
        };
        let json = file.extension().is_some_and(|e| e == "json");
        let syntax = if json { Syntax::Json } else { Syntax::Hcl };
        berth_input::check_text(syntax, text).map_err(|e| err(e.line(), "", e.to_string()))?;
        let raw: Raw = if json {
            serde_json::from_str(text).map_err(|e| {
                let line = Some(e.line()).filter(|l| *l > 0);
                err(line, "", serde_message(&e.to_string()))
            })?
        } else {
            let body = hcl::parse(text).map_err(|e| match &e {
                // Without the source line hcl quotes (it could hold an env value).
                hcl::Error::Parse(p) => err(
                    Some(p.location().line()),
                    "",
                    format!(
                        "column {}: {}",
                        p.location().column(),
                        one_line(p.message())
                    ),
                ),
                other => err(None, "", serde_message(&other.to_string())),
            })?;
            check_duplicate_blocks(&body, text).map_err(|(line, label)| {
                err(
                    line,
                    &format!("plugin {}", Quoted(&label)),
                    "declared more than once".into(),
                )
            })?;
            // The path of the failing field (e.g. `plugin.a.args[0]`) names where it is.
            serde_path_to_error::deserialize(hcl::de::Deserializer::from_body(body)).map_err(
                |e| {
                    let field = e.path().to_string();
                    let field = if field == "." {
                        String::new()
                    } else {
                        Shown(&field).to_string()
                    };
                    err(None, &field, serde_message(&e.inner().to_string()))
                },
            )?
        };

        let mut cfg = Config {
            data_dir: raw.data_dir,
            log_level: raw.log_level,
            log_format: raw.log_format,
            registry_dir: raw.plugins_registry_dir,
            ..Config::default()
        };
        node_fields(&mut cfg, raw.name, raw.datacenter, raw.region, raw.client)
            .map_err(|(field, m)| err(None, &field, m))?;
        if let Some(f) = &cfg.log_format
            && f != "human"
            && f != "json"
        {
            return Err(err(
                None,
                "log_format",
                format!("{}: expected \"human\" or \"json\"", Quoted(f)),
            ));
        }
        for (field, dir) in [
            ("data_dir", &cfg.data_dir),
            ("plugins_registry_dir", &cfg.registry_dir),
        ] {
            if let Some(d) = dir
                && !d.is_absolute()
            {
                return Err(err(
                    None,
                    field,
                    format!("{} must be an absolute path", Shown(&d.to_string_lossy())),
                ));
            }
        }
        api::api_block(&mut cfg, raw.api, raw.acl).map_err(|(field, m)| {
            let block = if field.starts_with("acl") {
                "acl"
            } else {
                "api"
            };
            let line = (!json).then(|| unlabeled_block_line(text, block)).flatten();
            err(line, &field, m)
        })?;
        if let Some(w) = raw.events.and_then(|e| e.window) {
            let n = usize::try_from(w)
                .ok()
                .filter(|n| (1..=MAX_EVENT_WINDOW).contains(n))
                .ok_or_else(|| {
                    err(
                        None,
                        "events.window",
                        format!("{w} is not a number of events from 1 to {MAX_EVENT_WINDOW}"),
                    )
                })?;
            cfg.event_window = Some(n);
        }
        if let Some(s) = raw.registry_rescan_interval {
            cfg.rescan_interval =
                Some(duration(&s).map_err(|m| err(None, "registry_rescan_interval", m))?);
        }
        if let Some(h) = raw.health {
            if let Some(s) = h.interval {
                cfg.health.interval = duration(&s).map_err(|m| err(None, "health.interval", m))?;
            }
            if let Some(n) = h.failures {
                if n == 0 {
                    return Err(err(None, "health.failures", "must be at least 1".into()));
                }
                cfg.health.failures = n;
            }
        }
        for (id, p) in raw.plugin.unwrap_or_default() {
            let line = if json {
                None
            } else {
                block_line(text, "plugin", &id, 0)
            };
            let field = |f: &str| format!("plugin {}.{f}", Quoted(&id));
            berth_sys::validate_path_segment("plugin id", &id)
                .map_err(|e| err(line, &format!("plugin {}", Quoted(&id)), e.to_string()))?;
            if id == berth_drivers::DOCKER && p.plugin_type.is_none() {
                // Nomad's block for its docker driver, which berth has built in.
                if p.socket.is_some() || p.command.is_some() || !p.env.is_empty() {
                    return Err(err(
                        line,
                        &field("config"),
                        "plugin \"docker\" configures the built-in docker driver: it takes config only".into(),
                    ));
                }
                cfg.docker =
                    docker::docker_plugin(&p.args, p.config).map_err(|(f, m)| err(line, &f, m))?;
                continue;
            }
            let Some(plugin_type) = p.plugin_type else {
                // Nomad's form: a plugin binary in plugin_dir, with its own config.
                if p.socket.is_some() || p.command.is_some() || !p.env.is_empty() {
                    return Err(err(
                        line,
                        &field("type"),
                        "a CSI plugin needs type (node, controller or monolith); a plugin without type is a Nomad device plugin in plugin_dir, which takes args and config only".into(),
                    ));
                }
                let decl = devices::nomad_plugin(&id, p.args, p.config)
                    .map_err(|(f, m)| err(line, &f, m))?;
                cfg.devices.nomad_plugins.push(decl);
                continue;
            };
            if p.config.is_some() {
                return Err(err(
                    line,
                    &field("config"),
                    "config goes with Nomad device plugins (no type), not CSI plugins".into(),
                ));
            }
            let plugin_type: PluginType = plugin_type
                .parse()
                .map_err(|m| err(line, &field("type"), m))?;
            let run = match (p.socket, p.command) {
                (Some(_), Some(_)) => {
                    return Err(err(
                        line,
                        &field("socket"),
                        "give either socket or command, not both".into(),
                    ));
                }
                (None, None) => {
                    return Err(err(line, &field("socket"), "give socket (a plugin run by someone else) or command (one the agent runs)".into()));
                }
                (Some(socket), None) => {
                    if !socket.is_absolute() {
                        return Err(err(
                            line,
                            &field("socket"),
                            format!(
                                "{} must be an absolute path",
                                Shown(&socket.to_string_lossy())
                            ),
                        ));
                    }
                    berth_csi::Endpoint::from_path(&socket)
                        .map_err(|e| err(line, &field("socket"), e.to_string()))?;
                    if !p.args.is_empty() || !p.env.is_empty() {
                        return Err(err(
                            line,
                            &field("args"),
                            "args and env go with command, not socket".into(),
                        ));
                    }
                    PluginRun::External { socket }
                }
                (None, Some(command)) => PluginRun::Command {
                    command,
                    args: p.args,
                    env: p.env,
                },
            };
            cfg.plugins.push(PluginDecl {
                id,
                plugin_type,
                run,
            });
        }
        // File order, for stable start-up.
        if !json {
            cfg.plugins
                .sort_by_key(|p| block_line(text, "plugin", &p.id, 0).unwrap_or(usize::MAX));
            cfg.devices
                .nomad_plugins
                .sort_by_key(|p| block_line(text, "plugin", &p.name, 0).unwrap_or(usize::MAX));
        }
        devices::devices_block(&mut cfg.devices, raw.plugin_dir, raw.devices)
            .map_err(|(field, m)| err(None, &field, m))?;
        cfg.etcd = control_plane::etcd_settings(raw.control_plane)
            .map_err(|(field, m)| err(None, &field, m))?;
        if let Some(consul) = raw.consul {
            let line = (!json)
                .then(|| unlabeled_block_line(text, "consul"))
                .flatten();
            consul.check().map_err(|e| err(line, e.field, e.message))?;
            if consul.ssl || consul.address.starts_with("https://") {
                return Err(err(
                    line,
                    "consul.ssl",
                    "TLS to Consul is not supported yet: talk plain HTTP to a local Consul agent (address 127.0.0.1:8500)".into(),
                ));
            }
            cfg.consul = consul;
        }
        if !cfg.devices.nomad_plugins.is_empty() && cfg.devices.plugin_dir.is_none() {
            let name = &cfg.devices.nomad_plugins[0].name;
            let line = (!json)
                .then(|| block_line(text, "plugin", name, 0))
                .flatten();
            return Err(err(
                line,
                &format!("plugin {}", Quoted(name)),
                "a plugin without type is a Nomad device plugin: set plugin_dir to the directory holding its binary".into(),
            ));
        }
        Ok(cfg)
    }
}

/// The node's names, meta and `chroot_env`, checked: names are non-empty text without control
/// characters; `chroot_env` maps absolute paths without `..` to absolute paths other than `/`
/// that stay clear of what a task's root mounts itself (`/alloc`, `/secrets`, `/proc`, `/dev`, `/sys`) and are not its `/local` or `/tmp` itself. `Err((field, message))`.
fn node_fields(
    cfg: &mut Config,
    name: Option<String>,
    datacenter: Option<String>,
    region: Option<String>,
    client: Option<RawClient>,
) -> Result<(), (String, String)> {
    let text = |field: &str, v: String| -> Result<String, (String, String)> {
        if v.is_empty() || v.len() > 128 || v.chars().any(|c| c.is_control()) {
            return Err((
                field.to_string(),
                format!(
                    "{}: must be 1 to 128 bytes without control characters",
                    Quoted(&v)
                ),
            ));
        }
        Ok(v)
    };
    if let Some(n) = name {
        cfg.node.name = Some(text("name", n)?);
    }
    if let Some(d) = datacenter {
        cfg.node.datacenter = text("datacenter", d)?;
    }
    if let Some(r) = region {
        cfg.node.region = text("region", r)?;
    }
    let Some(client) = client else {
        return Ok(());
    };
    if let Some(c) = client.node_class {
        // Empty is Nomad's "no class".
        if !c.is_empty() {
            cfg.node.node_class = text("client.node_class", c)?;
        }
    }
    for (k, v) in client.meta.unwrap_or_default() {
        let field = format!("client.meta.{}", Shown(&k));
        if k.is_empty()
            || k.chars()
                .any(|c| c.is_control() || c == '.' || c.is_whitespace())
        {
            return Err((
                field,
                "is not a valid key (empty, or has a dot, space or control character)".into(),
            ));
        }
        if v.chars().any(char::is_control) {
            return Err((field, "has a control character".into()));
        }
        cfg.node.meta.insert(k, v);
    }
    for (field, v, slot) in [
        (
            "client.cpu_total_compute",
            client.cpu_total_compute,
            &mut cfg.node.cpu_total_compute,
        ),
        (
            "client.memory_total_mb",
            client.memory_total_mb,
            &mut cfg.node.memory_total_mb,
        ),
    ] {
        if let Some(v) = v {
            if v == 0 || v > 1 << 40 {
                return Err((field.into(), format!("{v}: must be from 1 to 2^40")));
            }
            *slot = Some(v);
        }
    }
    if let Some(env) = client.chroot_env {
        for (src, dst) in &env {
            let field = format!("client.chroot_env.{}", Shown(&src.to_string_lossy()));
            for (what, p) in [("the host path", src), ("the path in the task", dst)] {
                if !p.is_absolute() || p.components().any(|c| c == std::path::Component::ParentDir)
                {
                    return Err((
                        field,
                        format!(
                            "{what} {} must be absolute, without ..",
                            Shown(&p.to_string_lossy())
                        ),
                    ));
                }
            }
            if dst == Path::new("/") {
                return Err((field, "cannot be the task's / itself".into()));
            }
            if let Some(own) = TASK_LAYOUT
                .iter()
                .find(|own| dst.starts_with(own) || Path::new(own).starts_with(dst))
                .or_else(|| ["/local", "/tmp"].iter().find(|own| Path::new(own) == dst))
            {
                return Err((
                    field,
                    format!(
                        "{} collides with the task's own {own}",
                        Shown(&dst.to_string_lossy())
                    ),
                ));
            }
        }
        cfg.chroot_env = Some(env);
    }
    Ok(())
}

fn duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| {
        format!(
            "{}: {} (e.g. \"30s\", \"2m\")",
            Quoted(s),
            Shown(&e.to_string())
        )
    })?;
    if d.is_zero() {
        return Err(format!("{}: must be more than zero", Quoted(s)));
    }
    Ok(d)
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `Err((line, label))` for the second `plugin "<label>"` block with a label already seen.
fn check_duplicate_blocks(body: &hcl::Body, text: &str) -> Result<(), (Option<usize>, String)> {
    let mut seen = HashSet::new();
    for block in body.blocks().filter(|b| b.identifier() == "plugin") {
        let Some(label) = block.labels().first() else {
            continue;
        };
        let label = label.as_str().to_string();
        if !seen.insert(label.clone()) {
            return Err((block_line(text, "plugin", &label, 1), label));
        }
    }
    Ok(())
}

/// 1-based line of the `nth` (0-based) `<ident> "<label>"` block header in `text`.
fn block_line(text: &str, ident: &str, label: &str, nth: usize) -> Option<usize> {
    let quoted = format!("\"{label}\"");
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            let t = l.trim_start();
            t.strip_prefix(ident)
                .is_some_and(|rest| rest.trim_start().starts_with(&quoted))
        })
        .nth(nth)
        .map(|(i, _)| i + 1)
}

/// The 1-based line where the first unlabeled block `ident { … }` opens.
fn unlabeled_block_line(text: &str, ident: &str) -> Option<usize> {
    text.lines()
        .position(|l| {
            l.trim_start()
                .strip_prefix(ident)
                .is_some_and(|rest| rest.trim_start().starts_with('{'))
        })
        .map(|i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("/etc/berth/agent.hcl"), text)
    }

    #[test]
    fn a_full_config_parses() {
        let cfg = parse(
            r#"
data_dir  = "/var/lib/berth"
log_level = "debug"
log_format = "json"
plugins_registry_dir = "/var/lib/berth/reg"
registry_rescan_interval = "10s"
api {
  socket  = "/run/berth.sock"
  address = "127.0.0.1:4747"
}
health {
  interval = "5s"
  failures = 2
}
plugin "ebs" {
  type   = "node"
  socket = "/run/csi/ebs.sock"
}
plugin "hostpath" {
  type    = "monolith"
  command = "/usr/bin/berth-hostpath"
  args    = ["--statedir", "/var/lib/hp"]
  env     = { RUST_LOG = "info" }
}
"#,
        )
        .unwrap();
        assert_eq!(cfg.data_dir.as_deref(), Some(Path::new("/var/lib/berth")));
        assert_eq!(cfg.api_address, Some("127.0.0.1:4747".parse().unwrap()));
        assert_eq!(
            cfg.health,
            HealthConfig {
                interval: Duration::from_secs(5),
                failures: 2
            }
        );
        assert_eq!(cfg.rescan_interval, Some(Duration::from_secs(10)));
        assert_eq!(cfg.plugins.len(), 2);
        assert_eq!(cfg.plugins[0].id, "ebs");
        assert_eq!(
            cfg.plugins[0].run,
            PluginRun::External {
                socket: "/run/csi/ebs.sock".into()
            }
        );
        match &cfg.plugins[1].run {
            PluginRun::Command { command, args, env } => {
                assert_eq!(command, Path::new("/usr/bin/berth-hostpath"));
                assert_eq!(args, &["--statedir", "/var/lib/hp"]);
                assert_eq!(env["RUST_LOG"], "info");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_node_and_chroot_env_are_read_and_checked() {
        let cfg = parse(
            r#"
name       = "edge-1"
datacenter = "west"
region     = "eu"
client {
  node_class = "storage"
  meta { rack = "r7" }
  cpu_total_compute = 4000
  memory_total_mb   = 2048
  chroot_env = {
    "/usr" = "/usr"
    "/opt/tools" = "/tools"
  }
}
"#,
        )
        .unwrap();
        assert_eq!(
            cfg.node,
            NodeConfig {
                name: Some("edge-1".into()),
                datacenter: "west".into(),
                region: "eu".into(),
                node_class: "storage".into(),
                meta: BTreeMap::from([("rack".into(), "r7".into())]),
                cpu_total_compute: Some(4000),
                memory_total_mb: Some(2048),
            }
        );
        let env = cfg.chroot_env.unwrap();
        assert_eq!(env[Path::new("/opt/tools")], Path::new("/tools"));
        assert_eq!(parse("").unwrap().node, NodeConfig::default());
        assert_eq!(parse("").unwrap().chroot_env, None);

        for (text, field) in [
            (
                "client {
 chroot_env = { \"usr\" = \"/usr\" }
}
",
                "client.chroot_env.usr",
            ),
            (
                "client {
 chroot_env = { \"/x\" = \"/\" }
}
",
                "client.chroot_env./x",
            ),
            (
                "client {
 chroot_env = { \"/x\" = \"/secrets/x\" }
}
",
                "client.chroot_env./x",
            ),
            (
                "client {
 chroot_env = { \"/x\" = \"/a/../etc\" }
}
",
                "client.chroot_env./x",
            ),
            (
                "client {
 meta = { \"a.b\" = \"1\" }
}
",
                "client.meta.a.b",
            ),
            (
                "datacenter = \"\"
",
                "datacenter",
            ),
            (
                "client {
 colour = 1
}
",
                "",
            ),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.to_string().contains(field), "{text}: {e}");
        }
    }

    #[test]
    fn the_readme_example_parses() {
        let readme = include_str!("../../../README.md");
        let start = readme.find("```hcl\n").expect("an hcl block in the README") + 7;
        let end = start + readme[start..].find("```").expect("closed");
        let cfg = parse(&readme[start..end]).unwrap();
        assert_eq!(cfg.plugins.len(), 2);
        assert_eq!(cfg.health, HealthConfig::default());
        // The Consul section's config: Nomad's defaults, spelled out.
        let consul = readme
            .find("## Consul service identity tokens")
            .expect("the Consul section");
        let start = consul + readme[consul..].find("```hcl\n").expect("its config") + 7;
        let end = start + readme[start..].find("```").expect("closed");
        let cfg = parse(&readme[start..end]).unwrap();
        assert_eq!(cfg.consul, berth_consul::ConsulConfig::default());
        assert!(cfg.api_address.is_some());
    }

    #[test]
    fn json_is_accepted() {
        let cfg = Config::parse(
            Path::new("/etc/berth/agent.json"),
            r#"{"data_dir": "/d", "plugin": {"p": {"type": "controller", "socket": "/s.sock"}}}"#,
        )
        .unwrap();
        assert_eq!(cfg.plugins[0].plugin_type, PluginType::Controller);
        let e =
            Config::parse(Path::new("/etc/berth/agent.json"), "{\n\"data_dir\": }").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
    }

    #[test]
    fn bad_configs_name_file_line_or_field() {
        let cases = [
            (
                "data_dir = \"/x\"\nplugin \"a\" {\n  type = \n}\n",
                "agent.hcl:3",
                "",
            ),
            (
                "plugin \"a\" {\n  type = \"storage\"\n  socket = \"/a.sock\"\n}\n",
                "agent.hcl:1: plugin \"a\".type",
                "unknown plugin type \"storage\"",
            ),
            (
                "plugin \"a\" {\n  type = \"node\"\n  socket = \"a.sock\"\n}\n",
                "agent.hcl:1: plugin \"a\".socket",
                "absolute",
            ),
            (
                "plugin \"a\" {\n  type = \"node\"\n  socket = \"/a.sock\"\n}\n\nplugin \"a\" {\n  type = \"node\"\n  socket = \"/b.sock\"\n}\n",
                "agent.hcl:6: plugin \"a\"",
                "more than once",
            ),
            (
                "plugin \"a\" {\n  type = \"node\"\n}\n",
                "plugin \"a\".socket",
                "give socket",
            ),
            (
                "colour = \"blue\"\n",
                "agent.hcl: ",
                "unknown field `colour`",
            ),
            (
                "api {\n  address = \"0.0.0.0:1\"\n}\n",
                "api.address",
                "loopback",
            ),
            (
                "health {\n  interval = \"soon\"\n}\n",
                "health.interval",
                "soon",
            ),
            (
                "health {\n  failures = 0\n}\n",
                "health.failures",
                "at least 1",
            ),
            (
                &format!(
                    "plugin \"a\" {{\n  type = \"node\"\n  socket = \"/{}\"\n}}\n",
                    "s".repeat(120)
                ),
                "plugin \"a\".socket",
                "107 bytes",
            ),
            (
                "plugin \"../x\" {\n  type = \"node\"\n  socket = \"/a.sock\"\n}\n",
                "plugin \"../x\"",
                "",
            ),
        ];
        for (text, place, what) in cases {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.starts_with("/etc/berth/"), "{e}");
            assert!(e.contains(place), "{text:?}: {e} should name {place:?}");
            assert!(e.contains(what), "{text:?}: {e} should say {what:?}");
        }
        let syntax = parse("data_dir = \"/x\"\nplugin \"a\" {\n  type = \n}\n").unwrap_err();
        assert!(syntax.line.is_some(), "a syntax error has a line: {syntax}");
    }

    #[test]
    fn deep_or_huge_configs_are_refused_before_parsing() {
        let plugin = "plugin \"p\" {\n  type = \"node\"\n  command = \"/bin/p\"\n";
        for (file, text, line) in [
            (
                "/etc/b/agent.hcl",
                format!("{}{}", "a{\n".repeat(65), "}\n".repeat(65)),
                65,
            ),
            (
                "/etc/b/agent.hcl",
                format!(
                    "{plugin}  env = {}1{}\n}}\n",
                    "{a=".repeat(64),
                    "}".repeat(64)
                ),
                4,
            ),
            (
                "/etc/b/agent.hcl",
                format!(
                    "{plugin}  args = {}\"x\"{}\n}}\n",
                    "[".repeat(64),
                    "]".repeat(64)
                ),
                4,
            ),
            (
                "/etc/b/agent.json",
                format!(
                    "{{\"plugin\":\n{}1{}}}",
                    "{\"\":".repeat(64),
                    "}".repeat(64)
                ),
                2,
            ),
        ] {
            let e = Config::parse(Path::new(file), &text).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("{file}:{line}: nesting deeper than 64 levels")
            );
        }
        for (file, text) in [
            (
                "/etc/b/agent.hcl",
                format!("{}{}", "a{\n".repeat(200_000), "}\n".repeat(200_000)),
            ),
            ("/etc/b/agent.hcl", format!("x = {}", "{a=".repeat(300_000))),
            ("/etc/b/agent.json", "[".repeat(1_000_000)),
        ] {
            let e = berth_testkit::on_small_stack(move || Config::parse(Path::new(file), &text))
                .unwrap_err();
            assert!(e.message.contains("nesting deeper than 64"), "{e}");
        }
        let huge = format!("# {}\n", "x".repeat(berth_input::MAX_SPEC_BYTES));
        let e = parse(&huge).unwrap_err();
        assert!(e.message.starts_with("too large"), "{e}");
        // At the limit it parses (and is then checked).
        let ok = format!(
            "{plugin}  args = {}\"x\"{}\n}}\n",
            "[".repeat(63),
            "]".repeat(63)
        );
        // hcl turns the nested list into one string.
        assert!(parse(&ok).is_ok());
    }

    #[test]
    fn the_consul_block_is_read_checked_and_never_shows_its_token() {
        let cfg = parse("name = \"n\"\n").unwrap();
        assert_eq!(cfg.consul, berth_consul::ConsulConfig::default());
        let cfg = parse(
            "consul {\n  address = \"127.0.0.1:18500\"\n  token = \"agent-token-8841\"\n  service_identity_auth_method = \"svc\"\n  task_identity_auth_method = \"tasks\"\n  ssl = false\n}\n",
        )
        .unwrap();
        assert_eq!(cfg.consul.address, "127.0.0.1:18500");
        assert_eq!(
            cfg.consul.token.as_ref().map(|t| t.expose()),
            Some("agent-token-8841")
        );
        assert_eq!(cfg.consul.service_identity_auth_method, "svc");
        assert_eq!(cfg.consul.task_identity_auth_method, "tasks");
        assert!(!format!("{cfg:?}").contains("agent-token-8841"));

        let cases = [
            (
                "name = \"n\"\nconsul {\n  address = \"127.0.0.1:99999\"\n}\n",
                "agent.hcl:2: consul.address",
            ),
            ("consul {\n  token = \"\"\n}\n", "agent.hcl:1: consul.token"),
            (
                "consul {\n  service_identity_auth_method = \"a b\"\n}\n",
                "consul.service_identity_auth_method",
            ),
            (
                "consul {\n  task_identity_auth_method = \"\"\n}\n",
                "consul.task_identity_auth_method",
            ),
            (
                "consul {\n  ssl = true\n  token = \"agent-token-8841\"\n}\n",
                "consul.ssl",
            ),
            (
                "consul {\n  adress = \"127.0.0.1:8500\"\n  token = \"agent-token-8841\"\n}\n",
                "unknown field `adress`",
            ),
            ("consul {\n  ssl = \"agent-token-8841\"\n}\n", "consul.ssl"),
        ];
        for (text, place) in cases {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(place), "{text:?}: {e} should name {place:?}");
            assert!(!e.contains("agent-token-8841"), "{e}");
        }
    }

    #[test]
    fn values_of_the_wrong_type_never_show() {
        const CANARY: &str = "canary-env-2291";
        const NUMBER: &str = "75318642";
        let plugin = |x: &str| {
            format!("plugin \"p\" {{\n  type = \"node\"\n  command = \"/bin/p\"\n  {x}\n}}\n")
        };
        let json = |x: &str| {
            format!(
                "{{\"plugin\": {{\"p\": {{\"type\": \"node\", \"command\": \"/bin/p\", {x}}}}}}}"
            )
        };
        let hcl_cases = [
            format!("env = \"{CANARY}\""),
            format!("env = {NUMBER}"),
            format!("env = [\"{CANARY}\"]"),
            format!("env = {{ A = [\"{CANARY}\"] }}"),
            format!("env = {{ A = {{ x = \"{CANARY}\" }} }}"),
            format!("env = {{ A = [{{ x = \"{CANARY}\" }}] }}"),
            format!("args = \"{CANARY}\""),
            format!("args = [{{ x = \"{CANARY}\" }}]"),
            format!("args = [[\"{CANARY}\"]]"),
            format!("env = {{ A = \"{CANARY}\" ]"),
            format!("env = {{ A = \"{CANARY}\" }} }}"),
        ];
        let json_cases = [
            format!("\"env\": \"{CANARY}\""),
            format!("\"env\": {NUMBER}"),
            format!("\"env\": [\"{CANARY}\"]"),
            format!("\"env\": {{\"A\": [\"{CANARY}\"]}}"),
            format!("\"env\": {{\"A\": {{\"x\": \"{CANARY}\"}}}}"),
            format!("\"env\": {{\"A\": {NUMBER}}}"),
            format!("\"args\": \"{CANARY}\""),
            format!("\"args\": [{{\"x\": \"{CANARY}\"}}]"),
            format!("\"env\": {{\"A\": \"{CANARY}\" ]"),
        ];
        let cases = hcl_cases
            .iter()
            .map(|c| ("/etc/b/agent.hcl", plugin(c)))
            .chain(json_cases.iter().map(|c| ("/etc/b/agent.json", json(c))));
        let mut refused = 0;
        for (file, text) in cases {
            // hcl turns some shapes into strings (`"${[…]}"`) rather than refusing them.
            if let Err(e) = Config::parse(Path::new(file), &text) {
                let out = format!("{e} {e:?}");
                assert!(
                    !out.contains(CANARY) && !out.contains(NUMBER),
                    "leaked:\n{text}\n{out}"
                );
                refused += 1;
            }
        }
        assert!(refused >= 12, "only {refused} refused");
        let e = parse(&plugin(&format!("env = \"{CANARY}\""))).unwrap_err();
        assert!(
            e.message
                .starts_with("invalid type: string, expected a map"),
            "{e}"
        );
    }

    #[test]
    fn echoes_are_escaped_and_cut() {
        let long = format!("a\\nb\\u001b[2J{}", "x".repeat(100_000));
        for text in [
            format!("log_format = \"{long}\"\n"),
            format!("data_dir = \"{long}\"\n"),
            format!("api {{\n  address = \"{long}\"\n}}\n"),
            format!("health {{\n  interval = \"{long}\"\n}}\n"),
            format!("{} = 1\n", "k".repeat(100_000)),
            format!("plugin \"{long}\" {{\n  type = \"node\"\n  socket = \"/s\"\n}}\n"),
            format!(
                "plugin \"p\" {{\n  type = \"node\"\n  command = \"/p\"\n  env = {{ \"{long}\" = [1] }}\n}}\n"
            )
            .replace("command", "socket"),
        ] {
            let e = parse(&text).unwrap_err();
            let shown = e.to_string();
            assert!(
                shown.len() < 1500,
                "{} bytes: {}",
                shown.len(),
                &shown[..300]
            );
            assert!(!shown.chars().any(berth_sys::is_unprintable), "{shown:?}");
        }
        let name = format!("/etc/x\ny: forged\u{1b}{}", "n".repeat(10_000));
        let e = Config::parse(Path::new(&name), "colour = 1\n").unwrap_err();
        let shown = e.to_string();
        assert!(shown.starts_with("/etc/x\\ny: forged\\u{1b}nnn"), "{shown}");
        assert!(shown.len() < 800, "{}", shown.len());
    }

    #[test]
    fn syntax_errors_far_along_a_line_are_reported() {
        // hcl's own error text cannot be formatted past column 65535, and quotes the line.
        let e = parse(&format!("data_dir = \"/{}\" ]\n", "x".repeat(70_000))).unwrap_err();
        assert_eq!(e.line, Some(1), "{e}");
        assert!(e.message.starts_with("column 70"), "{e}");
        assert!(e.to_string().len() < 400, "{e}");
    }
}
