//! Which device instances an alloc's task holds: chosen when the alloc is placed, persisted
//! with the alloc before its tasks start, released when the alloc ends.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{model::DeviceGroupId, plugin::PluginId};

/// Where assigned devices come from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum AssignedSource {
    /// Instances of a plugin's device group.
    Plugin {
        /// The plugin.
        plugin: PluginId,
        /// The group.
        group: DeviceGroupId,
    },
    /// CDI devices named in the job (`ids` are their qualified names).
    Cdi,
}

/// The devices one `device` block of a task got.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceAssignment {
    /// The block's label, as written (`nvidia/gpu`, `example.com/device=dev0`).
    pub request: String,
    /// Where they come from.
    pub source: AssignedSource,
    /// Instance ids (CDI: qualified names), in the order chosen.
    pub ids: Vec<String>,
}

impl DeviceAssignment {
    /// Each held device as `vendor/type/name/id` (CDI: its qualified name).
    pub fn device_names(&self) -> Vec<String> {
        match &self.source {
            AssignedSource::Plugin { group, .. } => {
                self.ids.iter().map(|id| format!("{group}/{id}")).collect()
            }
            AssignedSource::Cdi => self.ids.clone(),
        }
    }

    /// The keys under which the manager counts these devices as taken.
    pub(crate) fn keys(&self) -> impl Iterator<Item = DeviceKey> + '_ {
        self.ids.iter().map(|id| DeviceKey {
            source: self.source.clone(),
            id: id.clone(),
        })
    }
}

impl fmt::Display for DeviceAssignment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.request, self.device_names().join(", "))
    }
}

/// One device instance, as reservations count it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct DeviceKey {
    pub source: AssignedSource,
    pub id: String,
}
