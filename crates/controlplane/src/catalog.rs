//! The volume catalog's persisted records: one [`VolumeRecord`] per volume, holding the volume,
//! its claims (with where each stands) and its controller publications per node.

use std::{collections::BTreeMap, fmt};

use berth_csi::model::{AccessMode, AttachmentMode, ExternalId, Secrets, VolumeCapability};
use berth_volume::{StoredMountOptions, VolumeSpec};
use serde::{Deserialize, Serialize};

use crate::claims::{Claim, ClaimSet, ClaimSetError};

/// Secrets as stored: the values in the clear (the store is the agent's own 0600 file), `Debug`
/// redacted. Never answered by the API.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StoredSecrets(BTreeMap<String, String>);

impl StoredSecrets {
    /// For the wire.
    pub fn to_secrets(&self) -> Secrets {
        Secrets::new(self.0.clone())
    }

    /// The secrets' names.
    pub fn names(&self) -> Vec<String> {
        self.0.keys().cloned().collect()
    }
}

impl From<&Secrets> for StoredSecrets {
    fn from(s: &Secrets) -> Self {
        Self(s.expose().clone())
    }
}

impl fmt::Debug for StoredSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.to_secrets(), f)
    }
}

/// Registered (existed at the provider) or created (CreateVolume).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// `volume register`.
    Registered,
    /// `volume create`.
    Created,
}

/// Where a claim stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClaimState {
    /// Granted and persisted; the controller and node steps may not have run yet.
    Claiming,
    /// Mounted on its node.
    Claimed,
    /// Being released; freed only after the node and controller steps are done.
    Releasing,
}

/// One alloc's claim and where it stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRecord {
    /// The claim.
    pub claim: Claim,
    /// Where it stands.
    pub state: ClaimState,
    /// The last failure of a step still being retried (sanitized text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The mount options the claim mounts with (the volume's merged with the request's), so a
    /// claim interrupted by a crash is finished as it was asked for. Flags never print.
    #[serde(default)]
    pub mount_options: StoredMountOptions,
}

/// Where ControllerPublishVolume stands for one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PublicationState {
    /// ControllerPublishVolume about to be (or being) sent.
    Publishing,
    /// It succeeded.
    Published,
    /// ControllerUnpublishVolume about to be (or being) sent.
    Unpublishing,
}

/// The volume's controller publication to one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publication {
    /// The node's id as the plugin knows it (NodeGetInfo).
    pub csi_node_id: String,
    /// Where it stands.
    pub state: PublicationState,
    /// What ControllerPublishVolume returned.
    pub publish_context: BTreeMap<String, String>,
    /// Whether it was published read-only.
    pub read_only: bool,
}

/// One (access mode, attachment mode) the volume offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredCapability {
    /// Access mode.
    pub access_mode: AccessMode,
    /// Attachment mode.
    pub attachment_mode: AttachmentMode,
}

/// A volume in the catalog, stored under its id in `Table::VOLUMES`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    /// berth's id.
    pub id: String,
    /// Display name (CreateVolume's name).
    pub name: String,
    /// The plugin that serves it.
    pub plugin_id: String,
    /// The provider's id.
    pub external_id: ExternalId,
    /// Registered or created.
    pub origin: Origin,
    /// What it offers.
    pub capabilities: Vec<StoredCapability>,
    /// Base mount options.
    pub mount_options: StoredMountOptions,
    /// Opaque parameters.
    pub parameters: BTreeMap<String, String>,
    /// Volume context (to every node and controller call that takes it).
    pub context: BTreeMap<String, String>,
    /// Secrets (write-only).
    pub secrets: StoredSecrets,
    /// Where it can be reached from.
    pub topology: Vec<BTreeMap<String, String>>,
    /// Size in bytes; 0 when unknown.
    pub capacity_bytes: i64,
    /// When it entered the catalog.
    pub created_ms: u64,
    /// Claims by alloc id.
    pub claims: BTreeMap<String, ClaimRecord>,
    /// Controller publications by node id (berth's node id).
    pub publications: BTreeMap<String, Publication>,
    /// Whether claims need ControllerPublishVolume (the plugin's controller offered
    /// PUBLISH_UNPUBLISH_VOLUME when the volume was added or last claimed). A claim then waits
    /// for a healthy controller instead of skipping the step.
    #[serde(default)]
    pub controller_publish: bool,
    /// The controller instance that created it (CreateVolume), when berth created it: named
    /// when a delete finds that the serving instance has no such volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
}

impl VolumeRecord {
    /// A record for a checked spec, with the provider's id, size, context and topology.
    pub fn from_spec(
        spec: &VolumeSpec,
        origin: Origin,
        external_id: ExternalId,
        capacity_bytes: i64,
        context: BTreeMap<String, String>,
        topology: Vec<BTreeMap<String, String>>,
        now_ms: u64,
    ) -> Self {
        Self {
            id: spec.id.clone(),
            name: spec.name.clone(),
            plugin_id: spec.plugin_id.clone(),
            external_id,
            origin,
            capabilities: spec
                .capabilities
                .iter()
                .map(|c| StoredCapability {
                    access_mode: c.access_mode,
                    attachment_mode: c.attachment_mode(),
                })
                .collect(),
            mount_options: (&spec.mount_options).into(),
            parameters: spec.parameters.clone(),
            context,
            secrets: (&spec.secrets).into(),
            topology,
            capacity_bytes,
            created_ms: now_ms,
            claims: BTreeMap::new(),
            publications: BTreeMap::new(),
            controller_publish: false,
            created_by: None,
        }
    }

    /// The (access, attachment) pairs it offers.
    pub fn capability_pairs(&self) -> Vec<(AccessMode, AttachmentMode)> {
        self.capabilities
            .iter()
            .map(|c| (c.access_mode, c.attachment_mode))
            .collect()
    }

    /// The capability for a claim's modes, with the volume's mount options.
    pub fn capability(&self, access: AccessMode, attachment: AttachmentMode) -> VolumeCapability {
        match attachment {
            AttachmentMode::FileSystem => {
                VolumeCapability::mount(access, (&self.mount_options).into())
            }
            AttachmentMode::BlockDevice => VolumeCapability::block(access),
        }
    }

    /// Every capability, for ValidateVolumeCapabilities.
    pub fn all_capabilities(&self) -> Vec<VolumeCapability> {
        self.capabilities
            .iter()
            .map(|c| self.capability(c.access_mode, c.attachment_mode))
            .collect()
    }

    /// The claims as a [`ClaimSet`], for the access-mode rules.
    pub fn claim_set(&self) -> Result<ClaimSet, ClaimSetError> {
        ClaimSet::try_from(
            self.claims
                .values()
                .map(|c| c.claim.clone())
                .collect::<Vec<_>>(),
        )
    }

    /// Whether the definition (what a spec sets) equals `other`'s, claims and times aside.
    pub fn same_definition(&self, other: &Self) -> bool {
        self.name == other.name
            && self.plugin_id == other.plugin_id
            && self.external_id == other.external_id
            && self.capabilities == other.capabilities
            && self.mount_options == other.mount_options
            && self.parameters == other.parameters
            && self.context == other.context
            && self.secrets == other.secrets
    }
}
