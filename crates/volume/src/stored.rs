//! Mount options as records store them.

use std::fmt;

use berth_csi::model::{MountFlags, MountOptions};
use serde::{Deserialize, Serialize};

/// Mount options as stored: the flags in the clear (a usage is staged again with them after a
/// restart; the store is the agent's own 0600 file), but `Debug` never shows them.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredMountOptions {
    /// Filesystem type; empty for the plugin's default.
    pub fs_type: String,
    /// Mount flags. Never printed.
    pub mount_flags: Vec<String>,
    /// Group that should own the mounted volume; empty for none.
    #[serde(default)]
    pub volume_mount_group: String,
}

impl fmt::Debug for StoredMountOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredMountOptions")
            .field("fs_type", &self.fs_type)
            .field("mount_flags", &MountFlags::new(self.mount_flags.clone()))
            .field("volume_mount_group", &self.volume_mount_group)
            .finish()
    }
}

impl From<&MountOptions> for StoredMountOptions {
    fn from(o: &MountOptions) -> Self {
        Self {
            fs_type: o.fs_type.clone(),
            mount_flags: o.mount_flags.expose().to_vec(),
            volume_mount_group: o.volume_mount_group.clone(),
        }
    }
}

impl From<&StoredMountOptions> for MountOptions {
    fn from(o: &StoredMountOptions) -> Self {
        Self {
            fs_type: o.fs_type.clone(),
            mount_flags: MountFlags::new(o.mount_flags.clone()),
            volume_mount_group: o.volume_mount_group.clone(),
        }
    }
}
