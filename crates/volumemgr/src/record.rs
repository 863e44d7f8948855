//! The persisted record of one usage of a volume on the node.

use std::collections::BTreeMap;

use berth_csi::model::ExternalId;
pub use berth_volume::StoredMountOptions;
use berth_volume::{Usage, UsageKey};
use serde::{Deserialize, Serialize};

/// Where the staging of a usage stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StageState {
    /// NodeStageVolume is about to be (or was being) sent.
    Staging,
    /// NodeStageVolume succeeded.
    Staged,
    /// NodeUnstageVolume is about to be (or was being) sent.
    Unstaging,
}

/// Where the publication of a usage for one alloc stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PublishState {
    /// NodePublishVolume is about to be (or was being) sent.
    Publishing,
    /// NodePublishVolume succeeded.
    Published,
    /// NodeUnpublishVolume is about to be (or was being) sent.
    Unpublishing,
}

/// One usage of one volume on this node, by value: its staging, and every alloc it is
/// published for. Stored under [`record_key`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRecord {
    /// The plugin that stages and publishes it.
    pub plugin_id: String,
    /// berth's volume id.
    pub volume_id: String,
    /// The provider's volume id (the `volume_id` of the RPCs).
    pub external_id: ExternalId,
    /// Which usage, variant included (see [`UsageKey::variant`]).
    pub usage: UsageKey,
    /// The options it is staged and published with.
    pub mount_options: StoredMountOptions,
    /// `None` when the plugin does not stage (no `STAGE_UNSTAGE_VOLUME`): publish directly.
    pub staging: Option<StageState>,
    /// Every alloc the usage is published for, and how far.
    pub allocs: BTreeMap<String, PublishState>,
    /// What ControllerPublishVolume returned (from the call that created the record).
    pub publish_context: BTreeMap<String, String>,
    /// Volume context from CreateVolume (from the call that created the record).
    pub volume_context: BTreeMap<String, String>,
    /// Whether its staging is the volume's one staging path on the node, shared with the
    /// record of the other read-only flag ([`UsageRecord::staging_dir_name`]). Records written
    /// before the CSI rule of one staging path per volume was kept read `false`: they keep
    /// the per-usage path they were staged at.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared_staging: bool,
}

impl UsageRecord {
    /// Its key in the store.
    pub fn key(&self) -> String {
        record_key(&self.plugin_id, &self.volume_id, self.usage)
    }

    /// The name of its staging directory under the volume's: `<attachment>-<access mode>`
    /// (with `.<variant>`), the same for its read-only and read-write usages, since
    /// NodeStageVolume knows nothing of read-only and the CSI spec allows one staging path per
    /// volume; the usage's own name for records staged before that rule was kept.
    pub fn staging_dir_name(&self) -> String {
        if self.shared_staging {
            staging_dir_name(self.usage)
        } else {
            self.usage.dir_name()
        }
    }

    /// The usage, options included, as the RPCs need it (its variant is only in `usage`).
    pub fn full_usage(&self) -> Usage {
        Usage {
            read_only: self.usage.read_only,
            attachment_mode: self.usage.attachment_mode,
            access_mode: self.usage.access_mode,
            mount_options: (&self.mount_options).into(),
        }
    }
}

/// The volume's one staging directory name for a usage, whatever its read-only flag:
/// `<attachment>-<access mode>`, with `.<variant>` when not 0.
pub fn staging_dir_name(usage: UsageKey) -> String {
    let base = format!(
        "{}-{}",
        usage.attachment_mode.as_str(),
        usage.access_mode.as_str()
    );
    match usage.variant {
        0 => base,
        n => format!("{base}.{n}"),
    }
}

/// `<plugin id>/<volume id>/<usage dir name>`. The ids are path segments (validated, no `/`),
/// so keys are unambiguous.
pub fn record_key(plugin_id: &str, volume_id: &str, usage: UsageKey) -> String {
    format!("{plugin_id}/{volume_id}/{}", usage.dir_name())
}

#[cfg(test)]
mod tests {
    use berth_csi::model::{AccessMode, AttachmentMode, MountOptions};

    use super::*;

    #[test]
    fn debug_hides_flags_and_json_round_trips() {
        let opts = StoredMountOptions {
            fs_type: "ext4".into(),
            mount_flags: vec!["password=hunter2".into()],
            volume_mount_group: String::new(),
        };
        assert!(!format!("{opts:?}").contains("hunter2"));
        let rec = UsageRecord {
            plugin_id: "p".into(),
            volume_id: "v".into(),
            external_id: ExternalId::new("ext").unwrap(),
            usage: UsageKey {
                read_only: false,
                attachment_mode: AttachmentMode::FileSystem,
                access_mode: AccessMode::SingleNodeWriter,
                variant: 0,
            },
            mount_options: opts.clone(),
            staging: Some(StageState::Staged),
            allocs: [("a".to_string(), PublishState::Publishing)].into(),
            publish_context: BTreeMap::new(),
            volume_context: BTreeMap::new(),
            shared_staging: false,
        };
        assert!(!format!("{rec:?}").contains("hunter2"));
        assert_eq!(rec.staging_dir_name(), "rw-file-system-single-node-writer");
        let shared = UsageRecord {
            shared_staging: true,
            usage: UsageKey {
                read_only: true,
                ..rec.usage
            },
            ..rec.clone()
        };
        assert_eq!(shared.staging_dir_name(), "file-system-single-node-writer");
        assert!(serde_json::to_value(&shared).unwrap()["shared_staging"] == true);
        assert_eq!(rec.key(), "p/v/rw-file-system-single-node-writer");
        assert_eq!(
            MountOptions::from(&opts).mount_flags.expose(),
            ["password=hunter2"]
        );
        assert_eq!(rec.full_usage().key(), rec.usage);
        let rec2 = UsageRecord {
            usage: rec.usage.with_variant(2),
            ..rec.clone()
        };
        assert_eq!(rec2.key(), "p/v/rw-file-system-single-node-writer.2");
        assert_eq!(rec2.full_usage().key(), rec.usage);
        // Variant 0 is stored as before variants existed.
        let json = serde_json::to_value(&rec).unwrap();
        assert!(json["usage"].get("variant").is_none(), "{json}");
        assert_eq!(serde_json::to_value(&rec2).unwrap()["usage"]["variant"], 2);
    }
}
