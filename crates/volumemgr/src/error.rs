//! What can go wrong. Errors name the volume, alloc and usage; never secrets or mount flags
//! (CSI errors are already scrubbed of them by the client).

use std::path::PathBuf;

use berth_csi::CsiError;
use berth_state::StateError;
use berth_volume::{PathError, UsageKey};

/// A failed volume manager operation.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// An id cannot be a path segment (or the data dir is relative). Nothing was changed.
    #[error("volume {volume_id:?}: invalid path")]
    InvalidPath {
        /// berth's volume id, as given.
        volume_id: String,
        /// Which id, and why.
        #[source]
        source: PathError,
    },
    /// A CSI call failed for good; the record stays in its intent state for a later call or
    /// [`reconcile`](crate::VolumeManager::reconcile) to drive again.
    #[error("{}", csi_text(plugin_id, volume_id, alloc_id.as_deref(), *usage, source))]
    Csi {
        /// The node plugin called.
        plugin_id: String,
        /// berth's volume id.
        volume_id: String,
        /// The alloc, for publish and unpublish.
        alloc_id: Option<String>,
        /// The usage.
        usage: UsageKey,
        /// The client's error.
        #[source]
        source: Box<CsiError>,
    },
    /// The call was cancelled; the plugin may or may not have acted. The record stays in its
    /// intent state.
    #[error("volume {volume_id}, alloc {}, usage {usage}: cancelled", alloc_id.as_deref().unwrap_or("-"))]
    Cancelled {
        /// berth's volume id.
        volume_id: String,
        /// The alloc, for publish and unpublish.
        alloc_id: Option<String>,
        /// The usage.
        usage: UsageKey,
    },
    /// The volume is already in use with another external id, or every variant of the usage
    /// is taken by other mount options.
    #[error(
        "volume {volume_id}, usage {usage}: already staged with different {what}; release it first"
    )]
    Conflict {
        /// berth's volume id.
        volume_id: String,
        /// The usage asked for (variant 0).
        usage: UsageKey,
        /// `external id` or `mount options (no variant free)` (never the values).
        what: &'static str,
    },
    /// The store failed.
    #[error("volume {volume_id}: state store")]
    Store {
        /// berth's volume id.
        volume_id: String,
        /// The store's error.
        #[source]
        source: StateError,
    },
    /// A directory could not be created.
    #[error("volume {volume_id}: creating {}", path.display())]
    Dir {
        /// berth's volume id.
        volume_id: String,
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The mount table could not be read.
    #[error("reading the mount table")]
    MountTable(#[source] std::io::Error),
    /// The plugin id or data dir given to [`VolumeManager::new`](crate::VolumeManager::new)
    /// cannot make paths.
    #[error("plugin {plugin_id:?}: invalid plugin paths")]
    InvalidPlugin {
        /// The plugin id, as given.
        plugin_id: String,
        /// Why.
        #[source]
        source: PathError,
    },
}

impl VolumeError {
    /// True for [`VolumeError::Cancelled`].
    pub fn is_cancelled(&self) -> bool {
        matches!(self, Self::Cancelled { .. })
    }
}

/// A refusal names the plugin, the call and the plugin's reason
/// ([`CsiError::refusal_text`]); any other failure says where it happened (the source
/// follows in the chain).
fn csi_text(
    plugin_id: &str,
    volume_id: &str,
    alloc_id: Option<&str>,
    usage: UsageKey,
    source: &CsiError,
) -> String {
    let alloc = alloc_id
        .map(|a| format!(", alloc {a:?}"))
        .unwrap_or_default();
    source
        .refusal_text(plugin_id, &format!(" for volume {volume_id:?}{alloc}"))
        .unwrap_or_else(|| {
            format!(
                "volume {volume_id}, alloc {}, usage {usage}: CSI call failed",
                alloc_id.unwrap_or("-")
            )
        })
}
