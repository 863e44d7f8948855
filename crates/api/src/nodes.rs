//! The fleet's nodes as the API shows them (`GET /v1/nodes`, `GET /v1/nodes/{id}`) and as each
//! agent registers its own in a fleet.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::NodePlugin;

/// Where a node stands in the fleet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeState {
    /// Its agent holds a live lease and takes work.
    #[default]
    Ready,
    /// Its agent holds a live lease, takes no new work and gives its allocs back.
    Draining,
    /// Its lease has expired (or its agent stopped).
    Down,
}

impl NodeState {
    /// The word the CLI shows.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::Draining => "draining",
            Self::Down => "down",
        }
    }
}

/// A task driver on a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverState {
    /// `exec`, `raw_exec`, …
    pub name: String,
    /// Whether it can run tasks.
    pub healthy: bool,
    /// One line about it (why, when not healthy).
    #[serde(default)]
    pub description: String,
}

/// A device group on a node, counted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceCount {
    /// `vendor/type/name`.
    pub id: String,
    /// Healthy instances.
    pub healthy: usize,
    /// All instances.
    pub total: usize,
}

/// One node of the fleet: what its agent registered, and its state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetNode {
    /// berth's node id.
    pub id: String,
    /// `node.unique.name`.
    pub name: String,
    /// The machine's hostname.
    #[serde(default)]
    pub hostname: String,
    /// `node.datacenter`.
    #[serde(default)]
    pub datacenter: String,
    /// `node.region`.
    #[serde(default)]
    pub region: String,
    /// `node.class`.
    #[serde(default)]
    pub node_class: String,
    /// Nomad's computed class.
    #[serde(default)]
    pub computed_class: String,
    /// `attr.*`.
    #[serde(default)]
    pub attributes: BTreeMap<String, String>,
    /// `meta.*`.
    #[serde(default)]
    pub meta: BTreeMap<String, String>,
    /// Task drivers with their health.
    #[serde(default)]
    pub drivers: Vec<DriverState>,
    /// CSI node plugins with their node ids and topology.
    #[serde(default)]
    pub csi_plugins: Vec<NodePlugin>,
    /// CSI plugins with a healthy controller instance on this node (other nodes route their
    /// controller RPCs here).
    #[serde(default)]
    pub csi_controllers: Vec<NodeController>,
    /// Device groups.
    #[serde(default)]
    pub devices: Vec<DeviceCount>,
    /// What the node offers to allocs.
    #[serde(default)]
    pub resources: NodeResources,
    /// Set by an operator: the node takes no new work.
    #[serde(default)]
    pub drain: bool,
    /// The state now (computed when read: the registration's lease, and `drain`).
    #[serde(default)]
    pub status: NodeState,
    /// When the agent last registered (ms since the epoch).
    #[serde(default)]
    pub registered_ms: u64,
}

/// The CPU and memory a node offers (Nomad's `cpu.totalcompute` and `memory.totalbytes`, or
/// the agent's `client { cpu_total_compute, memory_total_mb }`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeResources {
    /// MHz over all cores.
    pub cpu_mhz: u64,
    /// MB.
    pub memory_mb: u64,
}

impl NodeResources {
    /// From a node's attributes: `cpu.totalcompute` (else 1000 MHz per `cpu.numcores`) and
    /// `memory.totalbytes`; 0 where they are missing.
    pub fn from_attributes(attrs: &BTreeMap<String, String>) -> Self {
        let num = |k: &str| attrs.get(k).and_then(|v| v.trim().parse::<u64>().ok());
        Self {
            cpu_mhz: num("cpu.totalcompute")
                .or_else(|| num("cpu.numcores").map(|n| n * 1000))
                .unwrap_or(0),
            memory_mb: num("memory.totalbytes").map_or(0, |b| b / (1024 * 1024)),
        }
    }
}

/// `POST /v1/nodes/{id}/drain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    /// Set (`true`) or clear `drain`.
    pub enable: bool,
}

impl DrainRequest {
    /// Nothing to check beyond its type.
    pub fn validate(&self) -> Result<(), crate::InvalidField> {
        Ok(())
    }
}

/// A healthy controller instance of a CSI plugin on a node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeController {
    /// The plugin.
    pub plugin_id: String,
    /// The instance that serves.
    pub instance: String,
    /// ControllerGetCapabilities.
    #[serde(default)]
    pub capabilities: berth_csi::model::ControllerCapabilities,
}

/// `GET /v1/nodes`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeList {
    /// Whether the agent is part of a fleet (an etcd control plane); otherwise the list
    /// holds this node only.
    pub fleet: bool,
    /// Every node, by id.
    pub nodes: Vec<FleetNode>,
}

impl FleetNode {
    /// The record of a node from its agent's own view (drivers and controllers are added by
    /// the agent). Devices are counted per group; their statistics stay on the node.
    pub fn from_status(n: &crate::NodeStatus) -> Self {
        Self {
            id: n.id.clone(),
            name: n.name.clone(),
            hostname: n.hostname.clone(),
            datacenter: n.datacenter.clone(),
            region: n.region.clone(),
            node_class: n.node_class.clone(),
            computed_class: n.computed_class.clone(),
            attributes: n.attributes.clone(),
            meta: n.meta.clone(),
            drivers: Vec::new(),
            csi_plugins: n.csi_plugins.clone(),
            csi_controllers: Vec::new(),
            devices: n
                .devices
                .groups
                .iter()
                .map(|g| DeviceCount {
                    id: g.id().to_string(),
                    healthy: g.instances.iter().filter(|i| i.healthy).count(),
                    total: g.instances.len(),
                })
                .collect(),
            resources: NodeResources::from_attributes(&n.attributes),
            drain: false,
            status: NodeState::Ready,
            registered_ms: 0,
        }
    }
}
