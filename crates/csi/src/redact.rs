//! Redaction: secrets and mount flags never print.
//!
//! The generated messages that carry `secrets` or `mount_flags` get no derived `Debug` (see
//! `build.rs`); the impls here print every other field and `[REDACTED]` in place of those.
//! Each impl destructures its message exhaustively, so a field added to the proto fails the
//! build until it is listed here.

use std::fmt;

use crate::pb;

/// What a redacted value prints as.
pub const REDACTED: &str = "[REDACTED]";

/// Prints `[REDACTED]`, whatever it wraps.
#[derive(Clone, Copy)]
pub(crate) struct Redacted;

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

macro_rules! redacted_debug {
    ($ty:ty, $name:literal { $($field:ident),* $(,)? } redact { $($secret:ident),+ $(,)? }) => {
        impl fmt::Debug for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let Self { $($field,)* $($secret,)+ } = self;
                $( let _ = $secret; )+
                let mut d = f.debug_struct($name);
                $( d.field(stringify!($field), $field); )*
                $( d.field(stringify!($secret), &Redacted); )+
                d.finish()
            }
        }
    };
}

redacted_debug!(pb::volume_capability::MountVolume, "MountVolume" {
    fs_type, volume_mount_group
} redact { mount_flags });
redacted_debug!(pb::CreateVolumeRequest, "CreateVolumeRequest" {
    name, capacity_range, volume_capabilities, parameters, volume_content_source,
    accessibility_requirements, mutable_parameters
} redact { secrets });
redacted_debug!(pb::DeleteVolumeRequest, "DeleteVolumeRequest" { volume_id } redact { secrets });
redacted_debug!(pb::ControllerPublishVolumeRequest, "ControllerPublishVolumeRequest" {
    volume_id, node_id, volume_capability, readonly, volume_context
} redact { secrets });
redacted_debug!(pb::ControllerUnpublishVolumeRequest, "ControllerUnpublishVolumeRequest" {
    volume_id, node_id
} redact { secrets });
redacted_debug!(pb::ValidateVolumeCapabilitiesRequest, "ValidateVolumeCapabilitiesRequest" {
    volume_id, volume_context, volume_capabilities, parameters, mutable_parameters
} redact { secrets });
redacted_debug!(pb::ControllerModifyVolumeRequest, "ControllerModifyVolumeRequest" {
    volume_id, mutable_parameters
} redact { secrets });
redacted_debug!(pb::CreateSnapshotRequest, "CreateSnapshotRequest" {
    source_volume_id, name, parameters
} redact { secrets });
redacted_debug!(pb::DeleteSnapshotRequest, "DeleteSnapshotRequest" { snapshot_id } redact { secrets });
redacted_debug!(pb::ListSnapshotsRequest, "ListSnapshotsRequest" {
    max_entries, starting_token, source_volume_id, snapshot_id
} redact { secrets });
redacted_debug!(pb::GetSnapshotRequest, "GetSnapshotRequest" { snapshot_id } redact { secrets });
redacted_debug!(pb::ControllerExpandVolumeRequest, "ControllerExpandVolumeRequest" {
    volume_id, capacity_range, volume_capability
} redact { secrets });
redacted_debug!(pb::NodeStageVolumeRequest, "NodeStageVolumeRequest" {
    volume_id, publish_context, staging_target_path, volume_capability, volume_context
} redact { secrets });
redacted_debug!(pb::NodePublishVolumeRequest, "NodePublishVolumeRequest" {
    volume_id, publish_context, staging_target_path, target_path, volume_capability, readonly,
    volume_context
} redact { secrets });
redacted_debug!(pb::NodeExpandVolumeRequest, "NodeExpandVolumeRequest" {
    volume_id, volume_path, capacity_range, staging_target_path, volume_capability
} redact { secrets });

// Fails the build if a message with a sensitive field has no Debug impl above.
include!(concat!(env!("OUT_DIR"), "/redacted_debug_check.rs"));

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn stage_request_debug_hides_secrets_and_flags() {
        let req = pb::NodeStageVolumeRequest {
            volume_id: "vol-1".into(),
            secrets: HashMap::from([("password".into(), "hunter2".into())]),
            volume_capability: Some(pb::VolumeCapability {
                access_type: Some(pb::volume_capability::AccessType::Mount(
                    pb::volume_capability::MountVolume {
                        fs_type: "ext4".into(),
                        mount_flags: vec!["uid=4242".into()],
                        volume_mount_group: String::new(),
                    },
                )),
                access_mode: None,
            }),
            ..Default::default()
        };
        let out = format!("{req:?} {req:#?}");
        assert!(out.contains("vol-1") && out.contains("ext4"), "{out}");
        assert!(
            !out.contains("hunter2") && !out.contains("password"),
            "{out}"
        );
        assert!(!out.contains("uid=4242"), "{out}");
        assert!(out.contains(REDACTED));
    }
}
