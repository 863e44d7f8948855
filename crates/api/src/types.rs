//! The agent's HTTP API (`/v1/…`): the JSON documents it serves, shared by the server and the
//! CLI so the two cannot drift.

use std::{collections::BTreeMap, path::PathBuf};

use berth_csi::model::{ControllerCapabilities, NodeCapabilities, NodeInfo, PluginCapabilities};
use serde::{Deserialize, Serialize};

/// The default API socket name under the data dir.
pub const SOCKET_NAME: &str = "berth.sock";

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
    /// `POST /v1/plugins` (a plugin run as a task registers this way).
    Api,
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// berth's id for this node (stable across restarts).
    pub id: String,
    /// The machine's hostname.
    pub hostname: String,
    /// One entry per node plugin.
    pub csi_plugins: Vec<NodePlugin>,
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
    /// A plugin process the agent runs was started (again).
    PluginProcessStarted,
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
    /// Why, in words.
    pub reason: String,
}

/// An error body: `{"error": "…"}` with a 4xx/5xx status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong, naming the field where it is about input.
    pub error: String,
}
