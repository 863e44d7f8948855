//! Where a plugin's volumes are staged and published, per DESIGN.md's on-disk layout:
//!
//! - `<data_dir>/csi/<type>/<plugin_id>/staging/<volume_id>/<usage>`
//! - `<data_dir>/csi/<type>/<plugin_id>/per-alloc/<alloc_id>/<volume_id>/<usage>`
//!
//! `<usage>` is [`UsageKey::dir_name`]: `ro|rw-<attachment>-<access-mode>`, plus `.<n>` for a
//! variant `n > 0` (the same usage with other mount options at the same time). Mount options
//! never appear in a path, not even hashed.
//!
//! Every id is checked with [`berth_sys::validate_path_segment`] before it becomes a segment,
//! so a path built here never leaves its plugin's directory. These are mount targets, not
//! sockets: the 107-byte unix socket limit does not apply (each id is at most 128 bytes, so a
//! path is at most the data dir plus about 450 bytes, well under `PATH_MAX`). Paths are
//! returned absolute, because the data dir must be. Nothing here touches the file system.

use std::{
    fmt,
    path::{Path, PathBuf},
    str::FromStr,
};

use berth_sys::{InvalidId, validate_path_segment};
use serde::{Deserialize, Serialize};

use crate::usage::UsageKey;

/// The `<type>` directory of a CSI plugin: which services it serves.
///
/// The same three names as `berth_api::PluginType` (`node`, `controller`, `monolith`); convert
/// through [`PluginDir::from_str`] on its `as_str()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PluginDir {
    /// Node service only.
    Node,
    /// Controller service only.
    Controller,
    /// Both.
    Monolith,
}

impl PluginDir {
    /// `node`, `controller` or `monolith`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Node => "node",
            Self::Controller => "controller",
            Self::Monolith => "monolith",
        }
    }
}

impl fmt::Display for PluginDir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PluginDir {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "node" => Ok(Self::Node),
            "controller" => Ok(Self::Controller),
            "monolith" => Ok(Self::Monolith),
            _ => Err(format!(
                "unknown plugin type {s:?} (expected node, controller or monolith)"
            )),
        }
    }
}

/// Why a path could not be built. Names the id that is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// The data dir is relative.
    #[error("data dir {} is not an absolute path", .0.display())]
    RelativeDataDir(PathBuf),
    /// An id that cannot be a path segment; its `kind` says which (`plugin id`, `volume id`,
    /// `alloc id`).
    #[error(transparent)]
    InvalidId(#[from] InvalidId),
}

/// The directory of one plugin, `<data_dir>/csi/<type>/<plugin_id>`, with its plugin id checked.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PluginPaths {
    root: PathBuf,
}

impl PluginPaths {
    /// Checks that `data_dir` is absolute and `plugin_id` is a valid path segment.
    pub fn new(
        data_dir: &Path,
        plugin_type: PluginDir,
        plugin_id: &str,
    ) -> Result<Self, PathError> {
        if !data_dir.is_absolute() {
            return Err(PathError::RelativeDataDir(data_dir.to_path_buf()));
        }
        validate_path_segment("plugin id", plugin_id)?;
        Ok(Self {
            root: data_dir
                .join("csi")
                .join(plugin_type.as_str())
                .join(plugin_id),
        })
    }

    /// `<data_dir>/csi/<type>/<plugin_id>`: the plugin's own root (it is given mounts inside it).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `…/staging/<volume_id>`: every staged usage of one volume.
    pub fn volume_staging_dir(&self, volume_id: &str) -> Result<PathBuf, PathError> {
        validate_path_segment("volume id", volume_id)?;
        Ok(self.root.join("staging").join(volume_id))
    }

    /// `…/staging/<volume_id>/<usage>`: the staging target of one usage.
    pub fn staging(&self, volume_id: &str, usage: UsageKey) -> Result<PathBuf, PathError> {
        Ok(self.volume_staging_dir(volume_id)?.join(usage.dir_name()))
    }

    /// `…/per-alloc/<alloc_id>`: everything published for one alloc.
    pub fn alloc_dir(&self, alloc_id: &str) -> Result<PathBuf, PathError> {
        validate_path_segment("alloc id", alloc_id)?;
        Ok(self.root.join("per-alloc").join(alloc_id))
    }

    /// `…/per-alloc/<alloc_id>/<volume_id>/<usage>`: the publish target of one usage for one
    /// alloc. Note the argument order (volume, then alloc) differs from the path's.
    pub fn publish(
        &self,
        volume_id: &str,
        alloc_id: &str,
        usage: UsageKey,
    ) -> Result<PathBuf, PathError> {
        let alloc = self.alloc_dir(alloc_id)?;
        validate_path_segment("volume id", volume_id)?;
        Ok(alloc.join(volume_id).join(usage.dir_name()))
    }
}

/// `<data_dir>/csi/<type>/<plugin_id>/staging/<volume_id>/<usage>`, every id checked.
pub fn staging_path(
    data_dir: &Path,
    plugin_type: PluginDir,
    plugin_id: &str,
    volume_id: &str,
    usage: UsageKey,
) -> Result<PathBuf, PathError> {
    PluginPaths::new(data_dir, plugin_type, plugin_id)?.staging(volume_id, usage)
}

/// `<data_dir>/csi/<type>/<plugin_id>/per-alloc/<alloc_id>/<volume_id>/<usage>`, every id
/// checked. Arguments come volume before alloc, as in [`PluginPaths::publish`].
pub fn publish_path(
    data_dir: &Path,
    plugin_type: PluginDir,
    plugin_id: &str,
    volume_id: &str,
    alloc_id: &str,
    usage: UsageKey,
) -> Result<PathBuf, PathError> {
    PluginPaths::new(data_dir, plugin_type, plugin_id)?.publish(volume_id, alloc_id, usage)
}

#[cfg(test)]
mod tests {
    use berth_csi::model::{AccessMode, AttachmentMode};
    use berth_sys::IdRule;

    use super::*;

    const RW: UsageKey = UsageKey {
        read_only: false,
        attachment_mode: AttachmentMode::FileSystem,
        access_mode: AccessMode::SingleNodeWriter,
        variant: 0,
    };

    #[test]
    fn paths_follow_the_layout() {
        let d = Path::new("/var/lib/berth");
        assert_eq!(
            staging_path(d, PluginDir::Node, "ebs", "vol-1", RW).unwrap(),
            Path::new(
                "/var/lib/berth/csi/node/ebs/staging/vol-1/rw-file-system-single-node-writer"
            )
        );
        let ro = UsageKey {
            read_only: true,
            attachment_mode: AttachmentMode::BlockDevice,
            access_mode: AccessMode::MultiNodeReaderOnly,
            variant: 0,
        };
        assert_eq!(
            publish_path(d, PluginDir::Monolith, "hostpath", "vol-1", "alloc-9", ro).unwrap(),
            Path::new(
                "/var/lib/berth/csi/monolith/hostpath/per-alloc/alloc-9/vol-1/ro-block-device-multi-node-reader-only"
            )
        );
        let p = PluginPaths::new(d, PluginDir::Controller, "c").unwrap();
        assert_eq!(p.root(), Path::new("/var/lib/berth/csi/controller/c"));
        assert_eq!(
            p.alloc_dir("a").unwrap(),
            Path::new("/var/lib/berth/csi/controller/c/per-alloc/a")
        );
        assert_eq!(
            p.volume_staging_dir("v").unwrap(),
            Path::new("/var/lib/berth/csi/controller/c/staging/v")
        );
        assert!(p.staging("v", RW).unwrap().is_absolute());
        assert_eq!(
            p.staging("v", RW.with_variant(1)).unwrap(),
            Path::new(
                "/var/lib/berth/csi/controller/c/staging/v/rw-file-system-single-node-writer.1"
            )
        );
        assert_eq!(
            p.publish("v", "a", RW.with_variant(12)).unwrap(),
            Path::new(
                "/var/lib/berth/csi/controller/c/per-alloc/a/v/rw-file-system-single-node-writer.12"
            )
        );
        for t in [PluginDir::Node, PluginDir::Controller, PluginDir::Monolith] {
            assert_eq!(t.as_str().parse::<PluginDir>(), Ok(t));
        }
        assert!("Node".parse::<PluginDir>().is_err());
    }

    #[test]
    fn bad_ids_are_refused_and_named() {
        let d = Path::new("/d");
        let long = "a".repeat(129);
        for (bad, rule) in [
            ("a/b", IdRule::Slash),
            ("..", IdRule::Dots),
            (".", IdRule::Dots),
            ("a\0b", IdRule::Nul),
            ("", IdRule::Empty),
            (long.as_str(), IdRule::TooLong { len: 129 }),
        ] {
            let cases: [(&str, Result<PathBuf, PathError>); 5] = [
                ("plugin id", staging_path(d, PluginDir::Node, bad, "v", RW)),
                ("volume id", staging_path(d, PluginDir::Node, "p", bad, RW)),
                (
                    "plugin id",
                    publish_path(d, PluginDir::Node, bad, "v", "a", RW),
                ),
                (
                    "volume id",
                    publish_path(d, PluginDir::Node, "p", bad, "a", RW),
                ),
                (
                    "alloc id",
                    publish_path(d, PluginDir::Node, "p", "v", bad, RW),
                ),
            ];
            for (kind, got) in cases {
                match got {
                    Err(PathError::InvalidId(e)) => {
                        assert_eq!((e.kind, e.rule), (kind, rule), "{bad:?}");
                        assert!(e.to_string().contains(kind), "{e}");
                    }
                    other => panic!("{bad:?} as {kind}: {other:?}"),
                }
            }
        }
        let e = staging_path(Path::new("data"), PluginDir::Node, "p", "v", RW).unwrap_err();
        assert_eq!(e, PathError::RelativeDataDir("data".into()));
        assert!(e.to_string().contains("not an absolute path"), "{e}");
    }
}
