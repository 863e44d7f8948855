//! berth's CSI domain model: what the rest of berth speaks instead of raw protobuf.
//!
//! Conversions from the wire are checked (an unknown access mode or a capability without an
//! access type is an error naming the field). Mount flags and secrets never print.

use std::{collections::BTreeMap, fmt, str::FromStr};

use serde::{Deserialize, Serialize};

use crate::{pb, redact::Redacted};

/// Why a value could not become part of the model. Names the field it is about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// A required field was empty or absent.
    #[error("{field} is required")]
    Missing {
        /// Dotted path of the field.
        field: &'static str,
    },
    /// An access mode berth does not know.
    #[error("{field}: unknown access mode {value:?} (expected one of {})", AccessMode::NAMES.join(", "))]
    UnknownAccessMode {
        /// Dotted path of the field.
        field: &'static str,
        /// The value as given.
        value: String,
    },
    /// A path that is not valid UTF-8 (the wire carries paths as strings).
    #[error("{field}: path is not valid UTF-8")]
    NotUtf8 {
        /// Dotted path of the field.
        field: &'static str,
    },
    /// An attachment mode berth does not know.
    #[error("{field}: unknown attachment mode {value:?} (expected file-system or block-device)")]
    UnknownAttachmentMode {
        /// Dotted path of the field.
        field: &'static str,
        /// The value as given.
        value: String,
    },
    /// A filesystem type that no filesystem could have: too long, or with characters other
    /// than ASCII letters, digits, `.`, `_` and `-`. The value is not repeated (it may be
    /// anything, of any size).
    #[error(
        "{field}: not a filesystem type ({len} bytes; expected at most {MAX_FS_TYPE_LEN} of \
         a-z, A-Z, 0-9, '.', '_', '-')"
    )]
    InvalidFsType {
        /// Dotted path of the field.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
    },
}

/// Longest filesystem type accepted (`fuse.` plus a helper name fits with room to spare).
pub const MAX_FS_TYPE_LEN: usize = 64;

/// Checks a filesystem type (`ext4`, `xfs`, `nfs4`, `fuse.sshfs`…); empty means the plugin's
/// default and passes. `field` names it in the error.
pub fn validate_fs_type(field: &'static str, value: &str) -> Result<(), ModelError> {
    let ok = value.len() <= MAX_FS_TYPE_LEN
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ModelError::InvalidFsType {
            field,
            len: value.len(),
        })
    }
}

/// The provider's id of a volume: what the wire calls `volume_id`. Never empty.
///
/// berth's own volume id is a different thing; this type keeps the two apart.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ExternalId(String);

impl ExternalId {
    /// Checks that `id` is non-empty.
    pub fn new(id: impl Into<String>) -> Result<Self, ModelError> {
        let id = id.into();
        if id.is_empty() {
            return Err(ModelError::Missing {
                field: "external_id",
            });
        }
        Ok(Self(id))
    }

    /// The id as sent on the wire.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ExternalId {
    type Error = ModelError;
    fn try_from(s: String) -> Result<Self, ModelError> {
        Self::new(s)
    }
}

impl From<ExternalId> for String {
    fn from(id: ExternalId) -> Self {
        id.0
    }
}

impl fmt::Display for ExternalId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How a volume may be shared, as CSI defines it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AccessMode {
    /// One node, read-write; berth allows one writer there (readers on that node too).
    SingleNodeWriter,
    /// One node, read-only.
    SingleNodeReaderOnly,
    /// Many nodes, read-only.
    MultiNodeReaderOnly,
    /// Many nodes, one of them writing.
    MultiNodeSingleWriter,
    /// Many nodes, all writing.
    MultiNodeMultiWriter,
    /// One node, one workload writing.
    SingleNodeSingleWriter,
    /// One node, several workloads writing.
    SingleNodeMultiWriter,
}

impl AccessMode {
    /// Every mode, in wire order.
    pub const ALL: [AccessMode; 7] = [
        Self::SingleNodeWriter,
        Self::SingleNodeReaderOnly,
        Self::MultiNodeReaderOnly,
        Self::MultiNodeSingleWriter,
        Self::MultiNodeMultiWriter,
        Self::SingleNodeSingleWriter,
        Self::SingleNodeMultiWriter,
    ];
    const NAMES: [&'static str; 7] = [
        "single-node-writer",
        "single-node-reader-only",
        "multi-node-reader-only",
        "multi-node-single-writer",
        "multi-node-multi-writer",
        "single-node-single-writer",
        "single-node-multi-writer",
    ];

    /// The kebab-case name used in specs and the CLI.
    pub fn as_str(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// True for the modes that confine the volume to one node.
    pub fn is_single_node(self) -> bool {
        matches!(
            self,
            Self::SingleNodeWriter
                | Self::SingleNodeReaderOnly
                | Self::SingleNodeSingleWriter
                | Self::SingleNodeMultiWriter
        )
    }

    /// True for the reader-only modes.
    pub fn is_read_only(self) -> bool {
        matches!(self, Self::SingleNodeReaderOnly | Self::MultiNodeReaderOnly)
    }

    fn to_pb(self) -> pb::volume_capability::access_mode::Mode {
        use pb::volume_capability::access_mode::Mode;
        match self {
            Self::SingleNodeWriter => Mode::SingleNodeWriter,
            Self::SingleNodeReaderOnly => Mode::SingleNodeReaderOnly,
            Self::MultiNodeReaderOnly => Mode::MultiNodeReaderOnly,
            Self::MultiNodeSingleWriter => Mode::MultiNodeSingleWriter,
            Self::MultiNodeMultiWriter => Mode::MultiNodeMultiWriter,
            Self::SingleNodeSingleWriter => Mode::SingleNodeSingleWriter,
            Self::SingleNodeMultiWriter => Mode::SingleNodeMultiWriter,
        }
    }

    fn from_pb(field: &'static str, raw: i32) -> Result<Self, ModelError> {
        use pb::volume_capability::access_mode::Mode;
        let unknown = || ModelError::UnknownAccessMode {
            field,
            value: raw.to_string(),
        };
        Ok(match Mode::try_from(raw).map_err(|_| unknown())? {
            Mode::Unknown => return Err(unknown()),
            Mode::SingleNodeWriter => Self::SingleNodeWriter,
            Mode::SingleNodeReaderOnly => Self::SingleNodeReaderOnly,
            Mode::MultiNodeReaderOnly => Self::MultiNodeReaderOnly,
            Mode::MultiNodeSingleWriter => Self::MultiNodeSingleWriter,
            Mode::MultiNodeMultiWriter => Self::MultiNodeMultiWriter,
            Mode::SingleNodeSingleWriter => Self::SingleNodeSingleWriter,
            Mode::SingleNodeMultiWriter => Self::SingleNodeMultiWriter,
        })
    }
}

impl fmt::Display for AccessMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AccessMode {
    type Err = ModelError;
    /// Accepts the kebab-case name (`single-node-writer`) or the wire name (`SINGLE_NODE_WRITER`).
    fn from_str(s: &str) -> Result<Self, ModelError> {
        let norm = s.trim().to_ascii_lowercase().replace('_', "-");
        Self::NAMES
            .iter()
            .position(|n| *n == norm)
            .map(|i| Self::ALL[i])
            .ok_or_else(|| ModelError::UnknownAccessMode {
                field: "access_mode",
                value: s.into(),
            })
    }
}

/// Whether a volume is attached as a filesystem or as a raw block device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttachmentMode {
    /// Mounted as a filesystem.
    FileSystem,
    /// Exposed as a block device.
    BlockDevice,
}

impl AttachmentMode {
    /// The kebab-case name used in specs and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FileSystem => "file-system",
            Self::BlockDevice => "block-device",
        }
    }
}

impl fmt::Display for AttachmentMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AttachmentMode {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self, ModelError> {
        match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
            "file-system" | "filesystem" | "mount" => Ok(Self::FileSystem),
            "block-device" | "block" => Ok(Self::BlockDevice),
            _ => Err(ModelError::UnknownAttachmentMode {
                field: "attachment_mode",
                value: s.into(),
            }),
        }
    }
}

/// Mount flags (`mount -o` options). They may carry credentials, so they never print, and they
/// do not implement `Serialize`: whatever stores or returns them must do so on purpose, through
/// [`MountFlags::expose`].
#[derive(Clone, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(transparent)]
pub struct MountFlags(Vec<String>);

impl MountFlags {
    /// Wraps the flags.
    pub fn new(flags: Vec<String>) -> Self {
        Self(flags)
    }

    /// The flags themselves, for the wire and for the mount call.
    pub fn expose(&self) -> &[String] {
        &self.0
    }

    /// True when no flag is set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for MountFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("[]")
        } else {
            Redacted.fmt(f)
        }
    }
}

/// How a filesystem volume is mounted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize)]
pub struct MountOptions {
    /// Filesystem type; empty means the plugin's default.
    #[serde(default)]
    pub fs_type: String,
    /// Mount flags; never printed.
    #[serde(default)]
    pub mount_flags: MountFlags,
    /// Group that should own the mounted volume; empty means none.
    #[serde(default)]
    pub volume_mount_group: String,
}

/// Secrets passed to a plugin. The values never print, and the type does not implement
/// `Serialize`: storing them takes a deliberate [`Secrets::expose`].
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secrets(BTreeMap<String, String>);

impl Secrets {
    /// Wraps a key/value map.
    pub fn new(map: BTreeMap<String, String>) -> Self {
        Self(map)
    }

    /// The map itself, for the wire.
    pub fn expose(&self) -> &BTreeMap<String, String> {
        &self.0
    }

    /// The secret values, so error text can be scrubbed of them.
    pub fn values(&self) -> impl Iterator<Item = &str> {
        self.0.values().map(String::as_str)
    }

    /// True when there is no secret.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn to_wire(&self) -> std::collections::HashMap<String, String> {
        self.0.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("{}")
        } else {
            Redacted.fmt(f)
        }
    }
}

impl FromIterator<(String, String)> for Secrets {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

/// How the volume is accessed: as a block device, or mounted with options.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AccessType {
    /// Raw block device.
    Block,
    /// Mounted filesystem.
    Mount(MountOptions),
}

/// One way a volume may be used: access type plus access mode.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
pub struct VolumeCapability {
    /// Block or mount (with its options).
    pub access_type: AccessType,
    /// The sharing mode.
    pub access_mode: AccessMode,
}

impl VolumeCapability {
    /// A filesystem capability with the given mode and options.
    pub fn mount(access_mode: AccessMode, options: MountOptions) -> Self {
        Self {
            access_type: AccessType::Mount(options),
            access_mode,
        }
    }

    /// A block capability with the given mode.
    pub fn block(access_mode: AccessMode) -> Self {
        Self {
            access_type: AccessType::Block,
            access_mode,
        }
    }

    /// File-system or block-device.
    pub fn attachment_mode(&self) -> AttachmentMode {
        match self.access_type {
            AccessType::Block => AttachmentMode::BlockDevice,
            AccessType::Mount(_) => AttachmentMode::FileSystem,
        }
    }

    /// The mount flags, when it is a mount capability.
    pub fn mount_flags(&self) -> &[String] {
        match &self.access_type {
            AccessType::Mount(o) => o.mount_flags.expose(),
            AccessType::Block => &[],
        }
    }

    /// Checks a wire capability; `field` names it in errors (e.g. `volume_capability`).
    pub fn from_pb(field: &'static str, cap: &pb::VolumeCapability) -> Result<Self, ModelError> {
        use pb::volume_capability::AccessType as Pt;
        let (mode_field, type_field) = match field {
            "volume_capabilities" => (
                "volume_capabilities.access_mode",
                "volume_capabilities.access_type",
            ),
            _ => (
                "volume_capability.access_mode",
                "volume_capability.access_type",
            ),
        };
        let mode = cap
            .access_mode
            .ok_or(ModelError::Missing { field: mode_field })?;
        let access_mode = AccessMode::from_pb(mode_field, mode.mode)?;
        let access_type = match cap.access_type.as_ref() {
            None => return Err(ModelError::Missing { field: type_field }),
            Some(Pt::Block(_)) => AccessType::Block,
            Some(Pt::Mount(m)) => AccessType::Mount(MountOptions {
                fs_type: m.fs_type.clone(),
                mount_flags: MountFlags(m.mount_flags.clone()),
                volume_mount_group: m.volume_mount_group.clone(),
            }),
        };
        Ok(Self {
            access_type,
            access_mode,
        })
    }

    /// The wire form.
    pub fn to_pb(&self) -> pb::VolumeCapability {
        use pb::volume_capability::{
            AccessMode as PbMode, AccessType as Pt, BlockVolume, MountVolume,
        };
        let access_type = match &self.access_type {
            AccessType::Block => Pt::Block(BlockVolume {}),
            AccessType::Mount(o) => Pt::Mount(MountVolume {
                fs_type: o.fs_type.clone(),
                mount_flags: o.mount_flags.0.clone(),
                volume_mount_group: o.volume_mount_group.clone(),
            }),
        };
        pb::VolumeCapability {
            access_type: Some(access_type),
            access_mode: Some(PbMode {
                mode: self.access_mode.to_pb() as i32,
            }),
        }
    }
}

/// Name and version a plugin reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginInfo {
    /// The plugin's name (reverse-domain style).
    pub name: String,
    /// The plugin's version.
    pub vendor_version: String,
    /// Free-form facts the plugin adds.
    pub manifest: BTreeMap<String, String>,
}

/// How a plugin's volumes may be expanded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VolumeExpansion {
    /// While published.
    Online,
    /// Only while not published.
    Offline,
}

/// What a plugin as a whole offers (GetPluginCapabilities).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginCapabilities {
    /// It serves the Controller service.
    pub controller_service: bool,
    /// Its volumes are not equally reachable from every node.
    pub volume_accessibility_constraints: bool,
    /// It serves the GroupController service.
    pub group_controller_service: bool,
    /// It serves the SnapshotMetadata service.
    pub snapshot_metadata_service: bool,
    /// How it expands volumes, if it does.
    pub volume_expansion: Option<VolumeExpansion>,
}

impl PluginCapabilities {
    /// Reads the wire list; values this version does not know are ignored.
    pub fn from_pb(caps: &[pb::PluginCapability]) -> Self {
        use pb::plugin_capability::{Type, service, volume_expansion};
        let mut out = Self::default();
        for cap in caps {
            match &cap.r#type {
                Some(Type::Service(s)) => match service::Type::try_from(s.r#type) {
                    Ok(service::Type::ControllerService) => out.controller_service = true,
                    Ok(service::Type::VolumeAccessibilityConstraints) => {
                        out.volume_accessibility_constraints = true
                    }
                    Ok(service::Type::GroupControllerService) => {
                        out.group_controller_service = true
                    }
                    Ok(service::Type::SnapshotMetadataService) => {
                        out.snapshot_metadata_service = true
                    }
                    _ => {}
                },
                Some(Type::VolumeExpansion(e)) => {
                    match volume_expansion::Type::try_from(e.r#type) {
                        Ok(volume_expansion::Type::Online) => {
                            out.volume_expansion = Some(VolumeExpansion::Online)
                        }
                        Ok(volume_expansion::Type::Offline) => {
                            out.volume_expansion = Some(VolumeExpansion::Offline)
                        }
                        _ => {}
                    }
                }
                None => {}
            }
        }
        out
    }
}

macro_rules! capability_set {
    ($(#[$doc:meta])* $name:ident, $set:ident, $pb:path { $($variant:ident => $wire:ident, $label:literal;)+ }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "kebab-case")]
        pub enum $name {
            $(#[doc = $label] $variant,)+
        }

        impl $name {
            /// The kebab-case name.
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $label,)+ }
            }

            fn from_wire(raw: i32) -> Option<Self> {
                use $pb as W;
                match W::try_from(raw).ok()? {
                    $(W::$wire => Some(Self::$variant),)+
                    _ => None,
                }
            }

            /// The wire value.
            pub fn to_wire(self) -> i32 {
                use $pb as W;
                match self { $(Self::$variant => W::$wire as i32,)+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        /// A set of capabilities; values this version does not know are dropped.
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $set(std::collections::BTreeSet<$name>);

        impl $set {
            /// True when the capability is in the set.
            pub fn has(&self, cap: $name) -> bool {
                self.0.contains(&cap)
            }

            /// The capabilities, in order.
            pub fn iter(&self) -> impl Iterator<Item = $name> + '_ {
                self.0.iter().copied()
            }

            /// Builds a set from raw wire values.
            pub fn from_wire(raw: impl IntoIterator<Item = i32>) -> Self {
                Self(raw.into_iter().filter_map($name::from_wire).collect())
            }
        }

        impl FromIterator<$name> for $set {
            fn from_iter<I: IntoIterator<Item = $name>>(iter: I) -> Self {
                Self(iter.into_iter().collect())
            }
        }
    };
}

capability_set!(
    /// An optional Controller RPC a plugin may offer.
    ControllerCapability, ControllerCapabilities,
    pb::controller_service_capability::rpc::Type {
        CreateDeleteVolume => CreateDeleteVolume, "create-delete-volume";
        PublishUnpublishVolume => PublishUnpublishVolume, "publish-unpublish-volume";
        ListVolumes => ListVolumes, "list-volumes";
        GetCapacity => GetCapacity, "get-capacity";
        CreateDeleteSnapshot => CreateDeleteSnapshot, "create-delete-snapshot";
        ListSnapshots => ListSnapshots, "list-snapshots";
        CloneVolume => CloneVolume, "clone-volume";
        PublishReadonly => PublishReadonly, "publish-readonly";
        ExpandVolume => ExpandVolume, "expand-volume";
        ListVolumesPublishedNodes => ListVolumesPublishedNodes, "list-volumes-published-nodes";
        VolumeCondition => VolumeCondition, "volume-condition";
        GetVolume => GetVolume, "get-volume";
        SingleNodeMultiWriter => SingleNodeMultiWriter, "single-node-multi-writer";
        ModifyVolume => ModifyVolume, "modify-volume";
        GetSnapshot => GetSnapshot, "get-snapshot";
    }
);

capability_set!(
    /// An optional Node RPC a plugin may offer.
    NodeCapability, NodeCapabilities,
    pb::node_service_capability::rpc::Type {
        StageUnstageVolume => StageUnstageVolume, "stage-unstage-volume";
        GetVolumeStats => GetVolumeStats, "get-volume-stats";
        ExpandVolume => ExpandVolume, "expand-volume";
        VolumeCondition => VolumeCondition, "volume-condition";
        SingleNodeMultiWriter => SingleNodeMultiWriter, "single-node-multi-writer";
        VolumeMountGroup => VolumeMountGroup, "volume-mount-group";
    }
);

impl ControllerCapabilities {
    /// Reads ControllerGetCapabilities' answer.
    pub fn from_pb(caps: &[pb::ControllerServiceCapability]) -> Self {
        use pb::controller_service_capability::Type;
        Self::from_wire(
            caps.iter()
                .filter_map(|c| c.r#type.as_ref().map(|Type::Rpc(r)| r.r#type)),
        )
    }
}

impl NodeCapabilities {
    /// Reads NodeGetCapabilities' answer.
    pub fn from_pb(caps: &[pb::NodeServiceCapability]) -> Self {
        use pb::node_service_capability::Type;
        Self::from_wire(
            caps.iter()
                .filter_map(|c| c.r#type.as_ref().map(|Type::Rpc(r)| r.r#type)),
        )
    }
}

/// What NodeGetInfo reports about the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// The plugin's id for this node.
    pub node_id: String,
    /// How many volumes the node can take; 0 means no limit given.
    pub max_volumes_per_node: i64,
    /// Topology segments of this node, if any.
    pub accessible_topology: Option<BTreeMap<String, String>>,
}

/// A volume the provider knows (CreateVolume, ListVolumes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Volume {
    /// The provider's id.
    pub external_id: ExternalId,
    /// Size in bytes; 0 means unknown.
    pub capacity_bytes: i64,
    /// Volume context to pass to later node and controller calls.
    pub context: BTreeMap<String, String>,
    /// Where the volume can be reached from.
    pub accessible_topology: Vec<BTreeMap<String, String>>,
}

impl Volume {
    /// Reads a wire volume; an empty `volume_id` is an error.
    pub fn from_pb(v: &pb::Volume) -> Result<Self, ModelError> {
        Ok(Self {
            external_id: ExternalId::new(v.volume_id.clone()).map_err(|_| ModelError::Missing {
                field: "volume.volume_id",
            })?,
            capacity_bytes: v.capacity_bytes,
            context: v
                .volume_context
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            accessible_topology: v
                .accessible_topology
                .iter()
                .map(|t| {
                    t.segments
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                })
                .collect(),
        })
    }
}

/// A snapshot the provider knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The provider's snapshot id.
    pub snapshot_id: String,
    /// The provider's id of the volume it was taken from.
    pub source_external_id: String,
    /// Size in bytes; 0 means unknown.
    pub size_bytes: i64,
    /// Seconds since the epoch when it was taken, if known.
    pub creation_time: Option<i64>,
    /// Whether it can be used as a volume source now.
    pub ready_to_use: bool,
}

impl From<&pb::Snapshot> for Snapshot {
    fn from(s: &pb::Snapshot) -> Self {
        Self {
            snapshot_id: s.snapshot_id.clone(),
            source_external_id: s.source_volume_id.clone(),
            size_bytes: s.size_bytes,
            creation_time: s.creation_time.as_ref().map(|t| t.seconds),
            ready_to_use: s.ready_to_use,
        }
    }
}

/// One usage figure from NodeGetVolumeStats.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeUsage {
    /// `bytes` or `inodes`.
    pub unit: String,
    /// Free amount.
    pub available: i64,
    /// Total amount.
    pub total: i64,
    /// Used amount.
    pub used: i64,
}

/// What NodeGetVolumeStats reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeStats {
    /// Usage figures.
    pub usage: Vec<VolumeUsage>,
    /// `Some(message)` when the plugin reports the volume abnormal.
    pub abnormal: Option<String>,
}

impl From<&pb::NodeGetVolumeStatsResponse> for VolumeStats {
    fn from(r: &pb::NodeGetVolumeStatsResponse) -> Self {
        use pb::volume_usage::Unit;
        Self {
            usage: r
                .usage
                .iter()
                .map(|u| VolumeUsage {
                    unit: match Unit::try_from(u.unit) {
                        Ok(Unit::Bytes) => "bytes".into(),
                        Ok(Unit::Inodes) => "inodes".into(),
                        _ => "unknown".into(),
                    },
                    available: u.available,
                    total: u.total,
                    used: u.used,
                })
                .collect(),
            abnormal: r
                .volume_condition
                .as_ref()
                .filter(|c| c.abnormal)
                .map(|c| c.message.clone()),
        }
    }
}

#[cfg(test)]
mod fs_type_tests {
    use super::*;

    #[test]
    fn fs_types() {
        for ok in ["", "ext4", "xfs", "nfs4", "fuse.sshfs", "ceph_fuse-2"] {
            assert_eq!(validate_fs_type("fs_type", ok), Ok(()), "{ok:?}");
        }
        let long = "x".repeat(1 << 20);
        for bad in ["ext4,ro", "../../x", "a\0b", "ext4 ro", "é", long.as_str()] {
            let err = validate_fs_type("mount_options.fs_type", bad)
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("mount_options.fs_type: not a filesystem type"),
                "{err}"
            );
            assert!(err.len() < 200, "the value is not echoed: {err}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_mode_round_trips_all_seven() {
        for mode in AccessMode::ALL {
            let pb = VolumeCapability::mount(mode, MountOptions::default()).to_pb();
            let back = VolumeCapability::from_pb("volume_capability", &pb).unwrap();
            assert_eq!(back.access_mode, mode);
            assert_eq!(mode.as_str().parse::<AccessMode>().unwrap(), mode);
            let wire = mode.to_pb().as_str_name();
            assert_eq!(wire.parse::<AccessMode>().unwrap(), mode);
        }
    }

    #[test]
    fn unknown_access_mode_is_named() {
        let err = "single-node-everything".parse::<AccessMode>().unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("access_mode") && msg.contains("single-node-everything"),
            "{msg}"
        );

        let mut pb = VolumeCapability::block(AccessMode::SingleNodeWriter).to_pb();
        pb.access_mode = Some(pb::volume_capability::AccessMode { mode: 0 });
        let err = VolumeCapability::from_pb("volume_capability", &pb).unwrap_err();
        assert!(matches!(
            err,
            ModelError::UnknownAccessMode {
                field: "volume_capability.access_mode",
                ..
            }
        ));
        pb.access_mode = Some(pb::volume_capability::AccessMode { mode: 99 });
        assert!(VolumeCapability::from_pb("volume_capability", &pb).is_err());
    }

    #[test]
    fn capability_without_access_type_is_refused() {
        let mut pb = VolumeCapability::block(AccessMode::SingleNodeWriter).to_pb();
        pb.access_type = None;
        let err = VolumeCapability::from_pb("volume_capability", &pb).unwrap_err();
        assert_eq!(
            err,
            ModelError::Missing {
                field: "volume_capability.access_type"
            }
        );
        assert_eq!(err.to_string(), "volume_capability.access_type is required");
    }

    #[test]
    fn empty_external_id_is_refused() {
        assert_eq!(
            ExternalId::new("").unwrap_err(),
            ModelError::Missing {
                field: "external_id"
            }
        );
        assert!(serde_json::from_str::<ExternalId>("\"\"").is_err());
    }

    #[test]
    fn flags_and_secrets_never_print() {
        let opts = MountOptions {
            fs_type: "xfs".into(),
            mount_flags: MountFlags::new(vec!["password=swordfish".into()]),
            volume_mount_group: String::new(),
        };
        let cap = VolumeCapability::mount(AccessMode::SingleNodeWriter, opts);
        let secrets: Secrets = [("token".to_string(), "s3cr3t-value".to_string())]
            .into_iter()
            .collect();
        let out = format!("{cap:?} {cap:#?} {secrets:?} {secrets:#?}");
        assert!(
            !out.contains("swordfish") && !out.contains("s3cr3t-value"),
            "{out}"
        );
        assert!(out.contains("xfs") && out.contains(crate::REDACTED));
    }

    #[test]
    fn unknown_wire_capabilities_are_dropped() {
        let set = NodeCapabilities::from_wire([1, 2, 999]);
        assert!(set.has(NodeCapability::StageUnstageVolume));
        assert_eq!(set.iter().count(), 2);
    }
}
