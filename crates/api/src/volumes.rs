//! The JSON documents of the volume routes (`/v1/volumes`, `/v1/volume/csi/{id}`).
//!
//! Secrets are write-only: request types carry them in [`WriteOnly`] (redacted `Debug`), and no
//! answer has a field that could hold one. Mount flags are answered as [`REDACTED`].

use std::{collections::BTreeMap, fmt, path::PathBuf};

use berth_csi::model::{AccessMode, AttachmentMode, MountFlags, VolumeStats};
use serde::{Deserialize, Serialize};

use crate::{checks, types::InvalidField};

/// What mount flags are shown as.
pub const REDACTED: &str = "[REDACTED]";

/// Longest spec text a request may carry (volume and job specs), in bytes: the parsers' own
/// bound, and the CLI's for a spec file.
pub const MAX_SPEC_BYTES: usize = berth_input::MAX_SPEC_BYTES;

/// Longest `file` name a spec request may give, in bytes: the agent repeats it in its errors.
pub const MAX_FILE_NAME_BYTES: usize = 256;

/// Checks the `spec` and `file` of a spec request (volume or job).
pub(crate) fn validate_spec(spec: &str, file: Option<&str>) -> Result<(), InvalidField> {
    checks::bounded("spec", spec, MAX_SPEC_BYTES)?;
    if let Some(file) = file {
        checks::printable("file", file, MAX_FILE_NAME_BYTES)?;
    }
    Ok(())
}

/// A key/value map that is sent but never shown: `Debug` prints `[REDACTED]` (or `{}` when empty).
/// For secrets in requests.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WriteOnly(pub BTreeMap<String, String>);

impl fmt::Debug for WriteOnly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("{}")
        } else {
            f.write_str(REDACTED)
        }
    }
}

/// Mount flags in a request: sent, never shown.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FlagsInput(pub Vec<String>);

impl fmt::Debug for FlagsInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("[]")
        } else {
            f.write_str(REDACTED)
        }
    }
}

/// The language of a spec text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpecFormat {
    /// HCL, as `nomad volume register/create` takes.
    #[default]
    Hcl,
    /// JSON.
    Json,
}

/// `POST /v1/volumes/register` and `POST /v1/volumes/create`: a volume spec as the user wrote
/// it. The agent parses it; errors name `file:line: field`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeSpecRequest {
    /// The spec text (may hold secrets: never echoed).
    pub spec: String,
    /// Its language.
    #[serde(default)]
    pub format: SpecFormat,
    /// The name errors use for it, e.g. the file name; `request body` when absent.
    #[serde(default)]
    pub file: Option<String>,
}

impl VolumeSpecRequest {
    /// Checks what serde cannot: `spec` is at most [`MAX_SPEC_BYTES`], `file` (when given) is
    /// non-empty, at most [`MAX_FILE_NAME_BYTES`] and free of control and
    /// bidirectional-text characters. The spec itself is the agent's to parse.
    pub fn validate(&self) -> Result<(), InvalidField> {
        validate_spec(&self.spec, self.file.as_deref())
    }
}

impl fmt::Debug for VolumeSpecRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VolumeSpecRequest")
            .field("spec", &format_args!("<{} bytes>", self.spec.len()))
            .field("format", &self.format)
            .field("file", &self.file)
            .finish()
    }
}

/// One (access mode, attachment mode) a volume offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapabilityView {
    /// Access mode.
    pub access_mode: AccessMode,
    /// Attachment mode.
    pub attachment_mode: AttachmentMode,
}

/// Mount options as answered: the flags never, only whether there are any.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountOptionsView {
    /// Filesystem type; empty for the plugin's default.
    pub fs_type: String,
    /// [`REDACTED`] when flags are set, absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_flags: Option<String>,
}

/// Whether a volume was registered (it existed at the provider) or created by berth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VolumeOrigin {
    /// `volume register`.
    Registered,
    /// `volume create`.
    Created,
}

/// Where a claim stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClaimState {
    /// Granted; ControllerPublish and the node mount are under way.
    Claiming,
    /// Granted and mounted on its node.
    Claimed,
    /// Being released: node unpublish/unstage, then controller unpublish, then freed.
    Releasing,
}

/// One alloc's claim on a volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimView {
    /// The alloc.
    pub alloc_id: String,
    /// Its node.
    pub node_id: String,
    /// `read` or `write`.
    pub mode: String,
    /// Access mode.
    pub access_mode: AccessMode,
    /// Attachment mode.
    pub attachment_mode: AttachmentMode,
    /// Where it stands.
    pub state: ClaimState,
    /// The last failure of a step still being retried (sanitized).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One alloc's publication of a usage on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedView {
    /// The alloc.
    pub alloc_id: String,
    /// `publishing`, `published` or `unpublishing`.
    pub state: String,
    /// The publish target.
    pub target: PathBuf,
    /// NodeGetVolumeStats on the target, where the plugin has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<VolumeStats>,
}

/// One usage of the volume on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageView {
    /// Its directory name, e.g. `rw-file-system-single-node-writer`.
    pub usage: String,
    /// Its merged mount options.
    pub mount_options: MountOptionsView,
    /// `staging`, `staged`, `unstaging`, or absent when the plugin does not stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staging: Option<String>,
    /// The allocs it is published for.
    pub allocs: Vec<PublishedView>,
}

/// `GET /v1/volume/csi/{id}` (and the answer of register and create).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeStatus {
    /// berth's id.
    pub id: String,
    /// Display name.
    pub name: String,
    /// The plugin that serves it.
    pub plugin_id: String,
    /// The provider's id.
    pub external_id: String,
    /// Registered or created.
    pub origin: VolumeOrigin,
    /// What it offers.
    pub capabilities: Vec<CapabilityView>,
    /// Its base mount options.
    pub mount_options: MountOptionsView,
    /// Size in bytes; 0 when unknown.
    pub capacity_bytes: i64,
    /// Opaque parameters.
    pub parameters: BTreeMap<String, String>,
    /// Volume context.
    pub context: BTreeMap<String, String>,
    /// The names of its secrets (never the values).
    pub secret_names: Vec<String>,
    /// Where it can be reached from.
    pub topology: Vec<BTreeMap<String, String>>,
    /// Whether claims need ControllerPublishVolume.
    pub controller_required: bool,
    /// Every claim, by alloc.
    pub claims: Vec<ClaimView>,
    /// Its usages on this node.
    pub usages: Vec<UsageView>,
    /// When it was registered or created, ms since the epoch.
    pub created_ms: u64,
    /// Fields of the spec that were accepted but not used, one line each (`register` and
    /// `create` answers only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// One line of `GET /v1/volumes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeSummary {
    /// berth's id.
    pub id: String,
    /// Display name.
    pub name: String,
    /// The plugin.
    pub plugin_id: String,
    /// The provider's id.
    pub external_id: String,
    /// Access modes offered.
    pub access_modes: Vec<AccessMode>,
    /// Read claims.
    pub read_claims: usize,
    /// Write claims.
    pub write_claims: usize,
    /// Size in bytes; 0 when unknown.
    pub capacity_bytes: i64,
    /// Whether a claim needs the plugin's controller (ControllerPublishVolume).
    #[serde(default)]
    pub controller_required: bool,
}

/// `GET /v1/volumes`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeList {
    /// By id.
    pub volumes: Vec<VolumeSummary>,
}

/// Mount options a claim asks for: `fs_type` overrides the volume's when set, `mount_flags`
/// replace the volume's when set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MountOptionsInput {
    /// Filesystem type.
    #[serde(default)]
    pub fs_type: Option<String>,
    /// Mount flags (never shown).
    #[serde(default)]
    pub mount_flags: Option<FlagsInput>,
}

/// `POST /v1/volume/csi/{id}/claim`: claim and mount the volume for an alloc on this node.
/// Idempotent: the same claim again answers the same.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    /// The alloc (a path segment).
    pub alloc_id: String,
    /// Mount read-only (a `read` claim) or not (`write`).
    #[serde(default)]
    pub read_only: bool,
    /// One of the volume's access modes.
    pub access_mode: AccessMode,
    /// One of the volume's attachment modes; `file-system` when absent.
    #[serde(default = "file_system")]
    pub attachment_mode: AttachmentMode,
    /// Mount options on top of the volume's.
    #[serde(default)]
    pub mount_options: Option<MountOptionsInput>,
}

impl ClaimRequest {
    /// Checks what serde cannot: `alloc_id` is a valid path segment, `mount_options.fs_type` a
    /// filesystem type ([`berth_csi::model::validate_fs_type`]), and `mount_options.mount_flags`
    /// at most [`berth_volume::MAX_MOUNT_FLAGS_BYTES`] joined, without NUL. No error quotes a
    /// flag.
    pub fn validate(&self) -> Result<(), InvalidField> {
        checks::segment("alloc_id", "alloc id", &self.alloc_id)?;
        let Some(options) = &self.mount_options else {
            return Ok(());
        };
        if let Some(fs_type) = &options.fs_type {
            const FIELD: &str = "mount_options.fs_type";
            berth_csi::model::validate_fs_type(FIELD, fs_type).map_err(|e| {
                let text = e.to_string();
                InvalidField {
                    field: FIELD,
                    reason: text
                        .strip_prefix(&format!("{FIELD}: "))
                        .unwrap_or(&text)
                        .to_string(),
                }
            })?;
        }
        if let Some(flags) = &options.mount_flags {
            berth_volume::check_mount_flags(&MountFlags::new(flags.0.clone())).map_err(|e| {
                InvalidField {
                    field: "mount_options.mount_flags",
                    reason: e.to_string(),
                }
            })?;
        }
        Ok(())
    }
}

fn file_system() -> AttachmentMode {
    AttachmentMode::FileSystem
}

/// The answer to a claim: where the volume is mounted for the alloc.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimResponse {
    /// The volume.
    pub volume_id: String,
    /// The alloc.
    pub alloc_id: String,
    /// This node.
    pub node_id: String,
    /// The usage's directory name.
    pub usage: String,
    /// The publish target: the volume as the alloc sees it.
    pub target: PathBuf,
    /// What ControllerPublishVolume returned (empty without a controller step).
    pub publish_context: BTreeMap<String, String>,
}

/// `POST /v1/volume/csi/{id}/release`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    /// The alloc whose claim is released.
    pub alloc_id: String,
}

impl ReleaseRequest {
    /// Checks that `alloc_id` is a valid path segment, as a claim's is.
    pub fn validate(&self) -> Result<(), InvalidField> {
        checks::segment("alloc_id", "alloc id", &self.alloc_id)
    }
}

/// The answer to a release (and one entry of a detach).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseResponse {
    /// The volume.
    pub volume_id: String,
    /// The alloc.
    pub alloc_id: String,
    /// True when the claim is freed; false when a step failed and is retried in the background
    /// (the claim stays, `state: releasing`).
    pub released: bool,
    /// Why it is not freed yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `POST /v1/volume/csi/{id}/detach`: release every claim of one node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetachRequest {
    /// The node; this node when absent.
    #[serde(default)]
    pub node_id: Option<String>,
}

impl DetachRequest {
    /// Checks that `node_id`, when given, is a valid path segment.
    pub fn validate(&self) -> Result<(), InvalidField> {
        match &self.node_id {
            Some(node) => checks::segment("node_id", "node id", node),
            None => Ok(()),
        }
    }
}

/// The answer to a detach or a forced deregister.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DetachResponse {
    /// One entry per claim released.
    pub releases: Vec<ReleaseResponse>,
}

/// `POST /v1/volume/csi/{id}/expand`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpandRequest {
    /// At least this many bytes.
    pub capacity_min: u64,
    /// At most this many bytes; no limit when absent.
    #[serde(default)]
    pub capacity_max: Option<u64>,
}

impl ExpandRequest {
    /// Checks that both sizes fit in CSI's `int64` and `capacity_max`, when given, is not below
    /// `capacity_min`.
    pub fn validate(&self) -> Result<(), InvalidField> {
        const MAX: u64 = i64::MAX as u64;
        if self.capacity_min > MAX {
            return Err(InvalidField {
                field: "capacity_min",
                reason: format!("more than {MAX} bytes"),
            });
        }
        match self.capacity_max {
            Some(max) if max > MAX => Err(InvalidField {
                field: "capacity_max",
                reason: format!("more than {MAX} bytes"),
            }),
            Some(max) if max < self.capacity_min => Err(InvalidField {
                field: "capacity_max",
                reason: "below capacity_min".into(),
            }),
            _ => Ok(()),
        }
    }
}

/// The answer to an expand.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpandResponse {
    /// The volume.
    pub volume_id: String,
    /// Its new size.
    pub capacity_bytes: i64,
    /// Whether the node step (NodeExpandVolume) ran.
    pub node_expanded: bool,
}

/// `POST /v1/volume/csi/{id}/snapshot`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotCreateRequest {
    /// The snapshot's name (CreateSnapshot is idempotent by name).
    pub name: String,
    /// Opaque parameters.
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
    /// Secrets for CreateSnapshot; the volume's when absent.
    #[serde(default)]
    pub secrets: Option<WriteOnly>,
}

impl SnapshotCreateRequest {
    /// Checks that `name` is non-empty, printable and at most
    /// [`berth_volume::MAX_STRING_BYTES`], and that `parameters` and `secrets` are within
    /// CSI's map limit with printable keys.
    pub fn validate(&self) -> Result<(), InvalidField> {
        checks::printable("name", &self.name, berth_volume::MAX_STRING_BYTES)?;
        checks::string_map("parameters", &self.parameters)?;
        if let Some(secrets) = &self.secrets {
            checks::string_map("secrets", &secrets.0)?;
        }
        Ok(())
    }
}

/// `POST /v1/volumes/snapshot/delete`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotDeleteRequest {
    /// The controller plugin.
    pub plugin_id: String,
    /// The provider's snapshot id.
    pub snapshot_id: String,
    /// Secrets for DeleteSnapshot.
    #[serde(default)]
    pub secrets: WriteOnly,
}

impl SnapshotDeleteRequest {
    /// Checks that `plugin_id` is a valid path segment, `snapshot_id` (the provider's id, which
    /// may hold `/`) is non-empty, printable and at most [`berth_volume::MAX_STRING_BYTES`],
    /// and `secrets` is within CSI's map limit with printable keys.
    pub fn validate(&self) -> Result<(), InvalidField> {
        checks::segment("plugin_id", "plugin id", &self.plugin_id)?;
        checks::printable(
            "snapshot_id",
            &self.snapshot_id,
            berth_volume::MAX_STRING_BYTES,
        )?;
        checks::string_map("secrets", &self.secrets.0)
    }
}

/// A snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotView {
    /// The provider's snapshot id.
    pub snapshot_id: String,
    /// The plugin.
    pub plugin_id: String,
    /// The provider's id of its source volume.
    pub source_external_id: String,
    /// berth's id of the source volume, when it is in the catalog.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_volume_id: Option<String>,
    /// Size in bytes; 0 when unknown.
    pub size_bytes: i64,
    /// Seconds since the epoch, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_time: Option<i64>,
    /// Usable as a volume source now.
    pub ready_to_use: bool,
}

/// `GET /v1/volumes/snapshots?plugin_id=…`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotList {
    /// Every snapshot the plugin lists.
    pub snapshots: Vec<SnapshotView>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_only_values_never_debug() {
        let s = WriteOnly([("password".to_string(), "hunter2".to_string())].into());
        assert_eq!(format!("{s:?}"), REDACTED);
        let f = FlagsInput(vec!["pass=hunter2".into()]);
        assert!(!format!("{f:?}").contains("hunter2"));
        let req = VolumeSpecRequest {
            spec: "secrets { password = \"hunter2\" }".into(),
            format: SpecFormat::Hcl,
            file: None,
        };
        assert!(!format!("{req:?}").contains("hunter2"));
        let claim: ClaimRequest = serde_json::from_str(
            r#"{"alloc_id":"a","access_mode":"single-node-writer","mount_options":{"mount_flags":["pass=hunter2"]}}"#,
        )
        .unwrap();
        assert_eq!(claim.attachment_mode, AttachmentMode::FileSystem);
        assert!(!format!("{claim:?}").contains("hunter2"));
    }

    #[test]
    fn unknown_fields_are_refused() {
        let e = serde_json::from_str::<ClaimRequest>(
            r#"{"alloc_id":"a","access_mode":"single-node-writer","bogus":1}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
    }
}
