//! The JSON documents of the API, shared by the server and the CLI so the two cannot drift.

use std::{collections::BTreeMap, fmt, os::unix::ffi::OsStrExt as _, path::PathBuf};

use berth_csi::model::{ControllerCapabilities, NodeCapabilities, NodeInfo, PluginCapabilities};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What a CSI plugin does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PluginType {
    /// Node service only.
    Node,
    /// Controller service only.
    Controller,
    /// Both.
    Monolith,
}

impl PluginType {
    /// Whether it serves the Node service.
    pub fn is_node(self) -> bool {
        matches!(self, Self::Node | Self::Monolith)
    }

    /// Whether it serves the Controller service.
    pub fn is_controller(self) -> bool {
        matches!(self, Self::Controller | Self::Monolith)
    }

    /// `node`, `controller` or `monolith`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Node => "node",
            Self::Controller => "controller",
            Self::Monolith => "monolith",
        }
    }
}

impl fmt::Display for PluginType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for PluginType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "node" => Ok(Self::Node),
            "controller" => Ok(Self::Controller),
            "monolith" => Ok(Self::Monolith),
            other => Err(format!(
                "unknown plugin type {other:?} (expected node, controller or monolith)"
            )),
        }
    }
}

/// Where a registration came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// A `plugin` block in the agent config.
    Config,
    /// A socket in the registration directory (kubelet style).
    RegistrationDir,
    /// `POST /v1/plugins`.
    Api,
    /// A job's task with a `csi_plugin` block, run and supervised by the agent.
    Task,
}

impl Source {
    /// `config`, `registration-dir`, `api` or `task`, as in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Config => "config",
            Self::RegistrationDir => "registration-dir",
            Self::Api => "api",
            Self::Task => "task",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Body of `POST /v1/plugins`: register one plugin instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    /// Plugin id (all instances of one plugin share it).
    pub id: String,
    /// What it does.
    #[serde(rename = "type")]
    pub plugin_type: PluginType,
    /// Absolute path of its CSI socket.
    pub socket: PathBuf,
    /// The instance name; unique per plugin (e.g. the task's alloc id). Defaults to one derived
    /// from the socket path.
    #[serde(default)]
    pub instance: Option<String>,
}

/// A field of a request that the agent refuses; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InvalidField {
    /// The JSON field, e.g. `"socket"`.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

impl RegisterRequest {
    /// Checks what serde cannot: `id` and `instance` (when given) are valid path segments
    /// ([`berth_sys::validate_path_segment`]), and `socket` is an absolute path without NUL,
    /// control or bidirectional-text characters that fits in a unix socket address
    /// ([`berth_csi::MAX_SOCKET_PATH`] bytes). The first broken rule is returned, naming its
    /// field; a path it quotes is escaped and cut.
    pub fn validate(&self) -> Result<(), InvalidField> {
        let invalid = |field, reason: String| InvalidField { field, reason };
        crate::checks::segment("id", "plugin id", &self.id)?;
        if let Some(instance) = &self.instance {
            crate::checks::segment("instance", "instance name", instance)?;
        }
        let bytes = self.socket.as_os_str().as_bytes();
        if bytes.contains(&0) {
            return Err(invalid("socket", "must not contain a NUL byte".into()));
        }
        if bytes.len() > berth_csi::MAX_SOCKET_PATH {
            return Err(invalid(
                "socket",
                format!(
                    "is {} bytes; a unix socket path must fit in {} bytes",
                    bytes.len(),
                    berth_csi::MAX_SOCKET_PATH
                ),
            ));
        }
        if self
            .socket
            .to_string_lossy()
            .chars()
            .any(berth_sys::is_unprintable)
        {
            return Err(invalid(
                "socket",
                "must not contain control characters".into(),
            ));
        }
        if !self.socket.is_absolute() {
            return Err(invalid("socket", "must be an absolute path".into()));
        }
        Ok(())
    }
}

/// Health of one plugin instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// Whether it answers and says it is ready.
    pub healthy: bool,
    /// Why, in words ("probe ok", "socket … does not exist", …).
    pub description: String,
    /// When health last changed, in milliseconds since the epoch (0 = never checked).
    pub last_transition_ms: u64,
}

/// What a plugin said about itself when last fingerprinted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// Provider name (GetPluginInfo).
    pub provider: String,
    /// Provider version.
    pub version: String,
    /// GetPluginCapabilities.
    pub plugin_capabilities: PluginCapabilities,
    /// ControllerGetCapabilities, for controller roles.
    pub controller_capabilities: Option<ControllerCapabilities>,
    /// NodeGetCapabilities, for node roles.
    pub node_capabilities: Option<NodeCapabilities>,
    /// NodeGetInfo, for node roles.
    pub node_info: Option<NodeInfo>,
    /// When it was taken, in milliseconds since the epoch.
    pub taken_ms: u64,
}

/// One registered instance of a plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    /// Instance name, unique within the plugin.
    pub instance: String,
    /// Where the registration came from.
    pub source: Source,
    /// The CSI socket.
    pub socket: PathBuf,
    /// When it registered, in milliseconds since the epoch.
    pub registered_ms: u64,
    /// Whether it is the one in use (the newest).
    pub active: bool,
    /// Its health.
    pub health: Health,
}

/// `GET /v1/plugin/csi/<id>`, and each entry of `GET /v1/plugins`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginStatus {
    /// Plugin id.
    pub id: String,
    /// What it does.
    #[serde(rename = "type")]
    pub plugin_type: PluginType,
    /// Health of the active instance.
    pub health: Health,
    /// The active instance's fingerprint, once taken.
    pub fingerprint: Option<Fingerprint>,
    /// Every instance, newest first.
    pub instances: Vec<Instance>,
}

/// `GET /v1/plugins`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginList {
    /// The plugins, by id.
    pub plugins: Vec<PluginStatus>,
}

/// The CSI view of this node from one node plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePlugin {
    /// Plugin id.
    pub plugin_id: String,
    /// Whether it is healthy.
    pub healthy: bool,
    /// The plugin's id for this node (NodeGetInfo).
    pub csi_node_id: Option<String>,
    /// Volume limit; 0 = none given.
    pub max_volumes: i64,
    /// Topology segments.
    pub topology: BTreeMap<String, String>,
}

/// `GET /v1/node`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// berth's id for this node (stable across restarts).
    pub id: String,
    /// The machine's hostname.
    pub hostname: String,
    /// One entry per node plugin.
    pub csi_plugins: Vec<NodePlugin>,
    /// The node's name (`node.unique.name` in a job).
    #[serde(default)]
    pub name: String,
    /// `node.datacenter`.
    #[serde(default)]
    pub datacenter: String,
    /// `node.region`.
    #[serde(default)]
    pub region: String,
    /// `node.class` (empty: none).
    #[serde(default)]
    pub node_class: String,
    /// What a job reads as `attr.<key>`.
    #[serde(default)]
    pub attributes: BTreeMap<String, String>,
    /// What a job reads as `meta.<key>`.
    #[serde(default)]
    pub meta: BTreeMap<String, String>,
    /// Nomad's computed class: a hash of what makes nodes interchangeable for placement
    /// (datacenter, class, attributes and meta but `unique.*` ones, device groups' vendor,
    /// type, name and attributes). Stable across restarts and device health changes.
    #[serde(default)]
    pub computed_class: String,
    /// Device plugins and device groups, with each instance's health, locality, holder and
    /// latest statistics.
    #[serde(default)]
    pub devices: berth_devices::view::DevicesView,
}

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventKind {
    /// An instance registered.
    PluginRegistered,
    /// An instance deregistered.
    PluginDeregistered,
    /// An instance became healthy.
    PluginHealthy,
    /// An instance became unhealthy.
    PluginUnhealthy,
    /// A plugin process the agent runs exited.
    PluginProcessExited,
    /// The agent recovered a node plugin's volumes (at start, or when the plugin came back):
    /// its records checked against the mount table and every claim of this node on them
    /// driven to its end. The reason counts what was kept and what was done again.
    PluginVolumesRecovered,
    /// A plugin process the agent runs was started (again).
    PluginProcessStarted,
    /// A volume entered the catalog (registered or created).
    VolumeRegistered,
    /// A volume left the catalog (deregistered or deleted).
    VolumeDeregistered,
    /// A volume was claimed and mounted for an alloc.
    VolumeClaimed,
    /// An alloc's claim was released (unmounted, controller-unpublished, freed).
    VolumeReleased,
    /// A step of a claim or release failed; it is retried.
    VolumeStepFailed,
    /// A device plugin instance is up.
    DevicePluginReady,
    /// A device plugin instance failed, exited or stopped answering; it is retried.
    DevicePluginDown,
    /// A device plugin is gone, with its devices.
    DevicePluginRemoved,
    /// A device plugin's device list changed.
    DevicesChanged,
    /// A device instance turned healthy.
    DeviceHealthy,
    /// A device instance turned unhealthy.
    DeviceUnhealthy,
    /// A device plugin sent invalid entries; they were dropped.
    DeviceFingerprintInvalid,
}

impl From<berth_devices::view::DeviceEventKind> for EventKind {
    fn from(k: berth_devices::view::DeviceEventKind) -> Self {
        use berth_devices::view::DeviceEventKind as D;
        match k {
            D::PluginReady => Self::DevicePluginReady,
            D::PluginDown => Self::DevicePluginDown,
            D::PluginRemoved => Self::DevicePluginRemoved,
            D::DevicesChanged => Self::DevicesChanged,
            D::DeviceHealthy => Self::DeviceHealthy,
            D::DeviceUnhealthy => Self::DeviceUnhealthy,
            D::FingerprintInvalid => Self::DeviceFingerprintInvalid,
        }
    }
}

/// One line of `GET /v1/events` (newline-delimited JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Increases by one per event in this agent's life.
    pub seq: u64,
    /// Milliseconds since the epoch.
    pub time_ms: u64,
    /// What happened.
    pub kind: EventKind,
    /// The plugin.
    pub plugin_id: String,
    /// The instance, when it is about one.
    pub instance: Option<String>,
    /// The volume, for volume events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_id: Option<String>,
    /// The alloc, for claim events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alloc_id: Option<String>,
    /// The device (`vendor/type/name/id`), for device events about one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Why, in words.
    pub reason: String,
}

/// One line of `GET /v1/events`: an event, or word that the reader fell behind and `n` events
/// were dropped for it (`{"lagged": n}`); the stream goes on after a `Lagged` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventLine {
    /// The next event.
    Event(Event),
    /// This many events were skipped because the reader was too slow.
    Lagged(u64),
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LaggedLine {
    lagged: u64,
}

impl Serialize for EventLine {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Event(event) => event.serialize(s),
            Self::Lagged(n) => LaggedLine { lagged: *n }.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for EventLine {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        // An object with `lagged` is a lag notice; anything else must be a whole event, so a
        // broken event is reported with the field it lacks.
        let value = serde_json::Value::deserialize(d)?;
        if value.get("lagged").is_some() {
            LaggedLine::deserialize(value)
                .map(|l| Self::Lagged(l.lagged))
                .map_err(D::Error::custom)
        } else {
            Event::deserialize(value)
                .map(Self::Event)
                .map_err(D::Error::custom)
        }
    }
}

/// An error body: `{"error": "…"}` with a 4xx/5xx status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong, naming the field where it is about input.
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(id: &str, socket: &str, instance: Option<&str>) -> RegisterRequest {
        RegisterRequest {
            id: id.into(),
            plugin_type: PluginType::Node,
            socket: socket.into(),
            instance: instance.map(Into::into),
        }
    }

    #[test]
    fn register_request_validation_names_the_field() {
        assert_eq!(request("p", "/run/p.sock", Some("a1")).validate(), Ok(()));
        let field = |r: RegisterRequest| r.validate().unwrap_err().field;
        assert_eq!(field(request("a/b", "/run/p.sock", None)), "id");
        assert_eq!(field(request("", "/run/p.sock", None)), "id");
        assert_eq!(field(request("p", "/run/p.sock", Some(".."))), "instance");
        assert_eq!(field(request("p", "run/p.sock", None)), "socket");
        assert_eq!(field(request("p", "/run/\0p.sock", None)), "socket");
        let longest = format!("/{}", "s".repeat(berth_csi::MAX_SOCKET_PATH - 1));
        assert_eq!(request("p", &longest, None).validate(), Ok(()));
        let err = request("p", &format!("{longest}s"), None)
            .validate()
            .unwrap_err();
        assert_eq!(err.field, "socket");
        assert!(err.to_string().contains("108 bytes"), "{err}");
    }

    #[test]
    fn event_lines_round_trip() {
        let event = EventLine::Event(Event {
            seq: 7,
            time_ms: 1,
            kind: EventKind::PluginHealthy,
            plugin_id: "p".into(),
            instance: None,
            volume_id: None,
            alloc_id: None,
            device: None,
            reason: "probe ok".into(),
        });
        let text = serde_json::to_string(&event).unwrap();
        assert!(text.starts_with(r#"{"seq":7,"#), "{text}");
        assert_eq!(serde_json::from_str::<EventLine>(&text).unwrap(), event);
        let lagged = serde_json::to_string(&EventLine::Lagged(3)).unwrap();
        assert_eq!(lagged, r#"{"lagged":3}"#);
        assert_eq!(
            serde_json::from_str::<EventLine>(&lagged).unwrap(),
            EventLine::Lagged(3)
        );
        let err = serde_json::from_str::<EventLine>(r#"{"seq":1}"#).unwrap_err();
        assert!(err.to_string().contains("time_ms"), "{err}");
    }

    #[test]
    fn names_match_json() {
        for source in [
            Source::Config,
            Source::RegistrationDir,
            Source::Api,
            Source::Task,
        ] {
            assert_eq!(
                serde_json::to_value(source).unwrap(),
                serde_json::Value::from(source.as_str())
            );
        }
    }
}
