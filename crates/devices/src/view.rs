//! What the device manager shows: plugins with their state, device groups with their
//! instances' effective health, reservations and latest statistics, and the events it emits.
//! Plain serializable documents (the API serves them as they are).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{
    attribute::Attribute,
    model::{InstanceStats, Locality},
    plugin::PluginId,
};

/// Where a device plugin is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PluginState {
    /// Known from the store (an earlier run of the agent), not attached yet: its devices are
    /// shown as last known and cannot be given to tasks.
    Restored,
    /// Attached, not ready yet.
    Starting,
    /// Up and answering.
    Ready,
    /// Failed, exited or not answering; retried.
    Down,
}

impl PluginState {
    /// `restored`, `starting`, `ready` or `down`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Restored => "restored",
            Self::Starting => "starting",
            Self::Ready => "ready",
            Self::Down => "down",
        }
    }
}

/// One device plugin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PluginView {
    /// Protocol and name.
    pub id: PluginId,
    /// Its state.
    pub state: PluginState,
    /// What it said it is when it became ready (version, pid…); empty before.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
    /// Why it is down (or the last reason it went down).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the state last changed (ms since the epoch).
    pub since_ms: u64,
    /// How many times an instance was attached (starts and registrations).
    pub attachments: u64,
    /// Whether the current instance has sent its device list.
    pub fingerprinted: bool,
    /// What was wrong in its last device list (groups or instances dropped), if anything.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub invalid: Vec<String>,
}

/// One device instance as shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceView {
    /// Its id.
    pub id: String,
    /// Whether a task may be given it now: the plugin says so and the plugin is ready.
    pub healthy: bool,
    /// Why it is not (the plugin's words, or the plugin's state), or the plugin's note.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub health_description: String,
    /// Where it sits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locality: Option<Locality>,
    /// The alloc holding it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_by: Option<String>,
    /// Its latest statistics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<InstanceStats>,
}

/// One device group as shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupView {
    /// The vendor.
    pub vendor: String,
    /// The type.
    pub device_type: String,
    /// The name.
    pub name: String,
    /// The plugin that reports it.
    pub plugin: PluginId,
    /// Its attributes.
    #[serde(default)]
    pub attributes: BTreeMap<String, Attribute>,
    /// Its instances.
    pub instances: Vec<InstanceView>,
}

impl GroupView {
    /// The group's `vendor/type/name`.
    pub fn id(&self) -> crate::model::DeviceGroupId {
        crate::model::DeviceGroupId {
            vendor: self.vendor.clone(),
            device_type: self.device_type.clone(),
            name: self.name.clone(),
        }
    }
}

/// The node's devices.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DevicesView {
    /// Every device plugin, by id.
    pub plugins: Vec<PluginView>,
    /// Every device group, by vendor/type/name.
    pub groups: Vec<GroupView>,
    /// The CDI devices the spec directories define (qualified names), when asked for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cdi_devices: Vec<String>,
    /// The CDI spec files refused, each with its file, line and field, when asked for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cdi_errors: Vec<String>,
}

/// What metrics export: each plugin's readiness and starts, each instance's health, holder
/// and latest summary statistic.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceMetrics {
    /// Every plugin.
    pub plugins: Vec<PluginMetrics>,
    /// Every instance.
    pub instances: Vec<InstanceMetrics>,
}

/// One plugin, for metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginMetrics {
    /// `protocol:name`.
    pub plugin: String,
    /// Up and has reported its devices.
    pub ready: bool,
    /// How many times an instance was attached.
    pub attachments: u64,
}

/// One instance, for metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceMetrics {
    /// `protocol:name` of its plugin.
    pub plugin: String,
    /// Its group, `vendor/type/name`.
    pub device: String,
    /// Its id.
    pub instance: String,
    /// May be given to a task now.
    pub healthy: bool,
    /// Held by an alloc.
    pub reserved: bool,
    /// The latest summary statistic as a number, with its unit.
    pub summary: Option<(f64, String)>,
}

/// What a [`DeviceEvent`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceEventKind {
    /// A plugin instance is up.
    PluginReady,
    /// A plugin instance failed, exited or stopped answering.
    PluginDown,
    /// A plugin is gone, with its devices.
    PluginRemoved,
    /// A plugin's device list changed (groups or instances came or went).
    DevicesChanged,
    /// An instance turned healthy.
    DeviceHealthy,
    /// An instance turned unhealthy.
    DeviceUnhealthy,
    /// A plugin sent a device list with invalid entries; they were dropped.
    FingerprintInvalid,
}

/// Something that happened to devices; messages hold no secrets (none reach devices).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceEvent {
    /// What.
    pub kind: DeviceEventKind,
    /// Which plugin.
    pub plugin: PluginId,
    /// Which device, as `vendor/type/name/id` or `vendor/type/name`, when it is about one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// In words.
    pub message: String,
}
