//! Typed requests for the CSI calls that take more than an id.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
};

use crate::{
    model::{ExternalId, ModelError, Secrets, VolumeCapability},
    pb,
};

/// Bytes a volume must have, and may have.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CapacityRange {
    /// At least this many bytes; 0 means no minimum.
    pub required_bytes: i64,
    /// At most this many bytes; 0 means no maximum.
    pub limit_bytes: i64,
}

impl CapacityRange {
    pub(crate) fn to_pb(self) -> Option<pb::CapacityRange> {
        (self.required_bytes != 0 || self.limit_bytes != 0).then_some(pb::CapacityRange {
            required_bytes: self.required_bytes,
            limit_bytes: self.limit_bytes,
        })
    }
}

/// Where a new volume's data comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContentSource {
    /// A snapshot, by the provider's snapshot id.
    Snapshot(String),
    /// Another volume (a clone), by the provider's volume id.
    Volume(ExternalId),
}

/// CreateVolume.
#[derive(Debug, Clone, Default)]
pub struct CreateVolume {
    /// Name; the plugin makes the call idempotent by it.
    pub name: String,
    /// Size bounds.
    pub capacity: CapacityRange,
    /// Capabilities the volume must support (at least one).
    pub capabilities: Vec<VolumeCapability>,
    /// Opaque parameters for the plugin.
    pub parameters: BTreeMap<String, String>,
    /// Secrets for the plugin.
    pub secrets: Secrets,
    /// Data to start from.
    pub source: Option<ContentSource>,
    /// Topology the volume must (or should) be reachable from.
    pub accessibility_requirements: Option<pb::TopologyRequirement>,
}

/// ControllerPublishVolume.
#[derive(Debug, Clone)]
pub struct ControllerPublish {
    /// The provider's volume id.
    pub external_id: ExternalId,
    /// The plugin's id of the node to publish to.
    pub node_id: String,
    /// How it will be used.
    pub capability: VolumeCapability,
    /// Publish read-only.
    pub read_only: bool,
    /// Volume context from CreateVolume.
    pub volume_context: BTreeMap<String, String>,
    /// Secrets for the plugin.
    pub secrets: Secrets,
}

/// NodeStageVolume.
#[derive(Debug, Clone)]
pub struct NodeStage {
    /// The provider's volume id.
    pub external_id: ExternalId,
    /// Where the plugin stages the volume.
    pub staging_path: PathBuf,
    /// How it will be used.
    pub capability: VolumeCapability,
    /// What ControllerPublishVolume returned.
    pub publish_context: BTreeMap<String, String>,
    /// Volume context from CreateVolume.
    pub volume_context: BTreeMap<String, String>,
    /// Secrets for the plugin.
    pub secrets: Secrets,
}

/// NodePublishVolume.
#[derive(Debug, Clone)]
pub struct NodePublish {
    /// The provider's volume id.
    pub external_id: ExternalId,
    /// Where it was staged, when the plugin stages.
    pub staging_path: Option<PathBuf>,
    /// Where the workload will see it.
    pub target_path: PathBuf,
    /// How it will be used.
    pub capability: VolumeCapability,
    /// Publish read-only.
    pub read_only: bool,
    /// What ControllerPublishVolume returned.
    pub publish_context: BTreeMap<String, String>,
    /// Volume context from CreateVolume.
    pub volume_context: BTreeMap<String, String>,
    /// Secrets for the plugin.
    pub secrets: Secrets,
}

/// NodeExpandVolume.
#[derive(Debug, Clone)]
pub struct NodeExpand {
    /// The provider's volume id.
    pub external_id: ExternalId,
    /// A path where the volume is published or staged.
    pub volume_path: PathBuf,
    /// Where it was staged, when the plugin stages.
    pub staging_path: Option<PathBuf>,
    /// New size bounds.
    pub capacity: CapacityRange,
    /// How it is used, when known.
    pub capability: Option<VolumeCapability>,
    /// Secrets for the plugin.
    pub secrets: Secrets,
}

pub(crate) fn path_str(field: &'static str, path: &Path) -> Result<String, ModelError> {
    let s = path.to_str().ok_or(ModelError::NotUtf8 { field })?;
    if s.is_empty() {
        return Err(ModelError::Missing { field });
    }
    Ok(s.to_string())
}

pub(crate) fn opt_path_str(field: &'static str, path: Option<&Path>) -> Result<String, ModelError> {
    path.map_or(Ok(String::new()), |p| path_str(field, p))
}

pub(crate) fn wire_map(map: &BTreeMap<String, String>) -> HashMap<String, String> {
    map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

pub(crate) fn model_map(map: &HashMap<String, String>) -> BTreeMap<String, String> {
    map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// Every value that must never appear in a stored message: secrets and mount flags.
pub(crate) fn sensitive<'a>(
    secrets: &Secrets,
    caps: impl IntoIterator<Item = &'a VolumeCapability>,
) -> Vec<String> {
    secrets
        .values()
        .map(str::to_string)
        .chain(
            caps.into_iter()
                .flat_map(|c| c.mount_flags().iter().cloned()),
        )
        .collect()
}
