//! The narrow interface between the device manager and device plugin instances, whatever
//! their protocol. A protocol implementation (`berth-devices-nomad`, `berth-devices-kube`)
//! runs each instance (launches or dials it, follows its streams, restarts it) and tells the
//! manager what it learns through a [`PluginSink`]; the manager asks things of the instance
//! through the [`PluginOps`] it was given.
//!
//! The manager is the one owner of the device view: sinks never block and never fail, so a
//! protocol task can report from anywhere.

use std::{fmt, sync::Arc, time::Duration};

use serde::{Deserialize, Serialize};

use crate::{
    BoxFuture,
    model::{ContainerEdits, DeviceGroup, GroupStats},
};

/// The protocol a device plugin speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// Nomad's device plugin protocol (go-plugin, gRPC), launched by the agent.
    Nomad,
    /// The Kubernetes device plugin API v1beta1: the plugin registers at the agent's
    /// `kubelet.sock`.
    Kubernetes,
}

impl Protocol {
    /// `nomad` or `kubernetes`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Nomad => "nomad",
            Self::Kubernetes => "kubernetes",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Names a device plugin: its protocol and its name (a Nomad plugin's name in the agent
/// config, which is its binary's name in `plugin_dir`; a Kubernetes plugin's resource name,
/// `domain/type`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PluginId {
    /// The protocol.
    pub protocol: Protocol,
    /// The name.
    pub name: String,
}

impl PluginId {
    /// A Nomad plugin called `name`.
    pub fn nomad(name: impl Into<String>) -> Self {
        Self {
            protocol: Protocol::Nomad,
            name: name.into(),
        }
    }

    /// A Kubernetes plugin of resource `resource_name`.
    pub fn kubernetes(resource_name: impl Into<String>) -> Self {
        Self {
            protocol: Protocol::Kubernetes,
            name: resource_name.into(),
        }
    }
}

impl fmt::Display for PluginId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.protocol, self.name)
    }
}

/// Which attachment of a plugin an event comes from: every [`PluginSink::attach`] starts a
/// new one, and events of older ones are dropped (a late message of a replaced instance never
/// overwrites the new one's devices).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Generation(pub u64);

/// What a plugin instance tells the manager.
#[derive(Debug, Clone, PartialEq)]
pub enum PluginEvent {
    /// The instance is up and answered its first calls (for Nomad: handshake, `PluginInfo`,
    /// `SetConfig`; for Kubernetes: registration and `GetDevicePluginOptions`). `detail` says
    /// what it is (version, pid, socket), for events; no secrets.
    Ready {
        /// One line about it.
        detail: String,
    },
    /// The plugin's whole device list: it replaces the previous one. An empty list is an
    /// answer (no devices), never a reason to wait.
    Devices(Vec<DeviceGroup>),
    /// The latest statistics of some instances.
    Stats(Vec<GroupStats>),
    /// The instance failed, exited or stopped answering: its devices cannot be given to new
    /// tasks until it is back. `retry_in` is when it is tried again (`None`: not by the
    /// supervisor; a Kubernetes plugin must register again).
    Down {
        /// Why, for events and status; no secrets.
        reason: String,
        /// When the supervisor tries again.
        retry_in: Option<Duration>,
    },
    /// The plugin stopped for good in this agent's life (the agent shuts down): its devices
    /// are removed from the live view. Its last device list stays stored, so the node's
    /// devices and computed class are the same after a restart; the agent forgets stored
    /// lists of plugins that do not come back ([`DeviceManager::forget_restored`]).
    ///
    /// [`DeviceManager::forget_restored`]: crate::manager::DeviceManager::forget_restored
    Removed {
        /// Why.
        reason: String,
    },
}

/// Where plugin instances report. Implemented by the device manager; never blocks, never
/// fails.
pub trait PluginSink: Send + Sync + fmt::Debug {
    /// A (new) instance of `plugin` is attached: the manager's calls go to `ops` from now on,
    /// and events of earlier generations are ignored. Called at every (re)start of a launched
    /// plugin and at every (re)registration.
    fn attach(&self, plugin: &PluginId, ops: Arc<dyn PluginOps>) -> Generation;

    /// An event of the instance attached as `generation`.
    fn event(&self, plugin: &PluginId, generation: Generation, event: PluginEvent);
}

/// Why a call to a plugin failed. Messages are the plugin's, sanitized of control characters;
/// they never hold a secret (none is ever sent to a device plugin).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    /// The instance is not running or not reachable now.
    #[error("device plugin {plugin} is not available: {reason}")]
    Unavailable {
        /// The plugin.
        plugin: PluginId,
        /// Why.
        reason: String,
    },
    /// The plugin answered with an error.
    #[error("device plugin {plugin} refused {call}: {message}")]
    Refused {
        /// The plugin.
        plugin: PluginId,
        /// The RPC (`Reserve`, `Allocate`…).
        call: String,
        /// Its message.
        message: String,
    },
    /// The plugin did not answer in time.
    #[error("device plugin {plugin} did not answer {call} within {}", berth_sys::short_duration(*after))]
    Timeout {
        /// The plugin.
        plugin: PluginId,
        /// The RPC.
        call: String,
        /// The deadline.
        after: Duration,
    },
    /// The plugin's answer breaks the protocol (wrong number of responses, a relative path).
    #[error("device plugin {plugin} answered {call} wrongly: {reason}")]
    BadAnswer {
        /// The plugin.
        plugin: PluginId,
        /// The RPC.
        call: String,
        /// What is wrong.
        reason: String,
    },
}

/// What the manager asks of a plugin instance. The implementation sends each call to the
/// instance's current connection, with a deadline.
pub trait PluginOps: Send + Sync + fmt::Debug {
    /// Prepares `device_ids` (all of one group of this plugin) for a task and says what the
    /// task gets: Nomad's `Reserve`, Kubernetes' `Allocate` (one container request).
    fn reserve<'a>(
        &'a self,
        device_ids: &'a [String],
    ) -> BoxFuture<'a, Result<ContainerEdits, PluginError>>;

    /// Which `size` of the `available` ids (including every one of `must_include`) the plugin
    /// prefers: Kubernetes' `GetPreferredAllocation`, when the plugin offers it. `Ok(None)`
    /// when it does not (Nomad's never do).
    fn preferred<'a>(
        &'a self,
        available: &'a [String],
        must_include: &'a [String],
        size: usize,
    ) -> BoxFuture<'a, Result<Option<Vec<String>>, PluginError>> {
        let _ = (available, must_include, size);
        Box::pin(async { Ok(None) })
    }

    /// Whether [`pre_start`](Self::pre_start) does anything: the plugin asked for a call
    /// before every start (Kubernetes' `pre_start_required`).
    fn pre_start_required(&self) -> bool {
        false
    }

    /// Called before every start of a task holding `device_ids`: Kubernetes'
    /// `PreStartContainer`, when the plugin asked for it at registration; otherwise nothing.
    fn pre_start<'a>(&'a self, device_ids: &'a [String]) -> BoxFuture<'a, Result<(), PluginError>> {
        let _ = device_ids;
        Box::pin(async { Ok(()) })
    }
}
