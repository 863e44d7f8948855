//! The persisted state: `<statedir>/state.json`, rewritten atomically on every change.

use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    path::{Path, PathBuf},
};

use berth_csi::pb;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

/// Version written in `state.json`.
const VERSION: u32 = 1;

/// Everything the plugin remembers.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct State {
    pub version: u32,
    /// By volume id.
    pub volumes: BTreeMap<String, VolumeRecord>,
    /// By snapshot id.
    pub snapshots: BTreeMap<String, SnapshotRecord>,
}

/// Where a volume's initial content came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ContentSource {
    Snapshot(String),
    Volume(String),
}

impl ContentSource {
    pub fn to_pb(&self) -> pb::VolumeContentSource {
        use pb::volume_content_source::{SnapshotSource, Type, VolumeSource};
        pb::VolumeContentSource {
            r#type: Some(match self {
                Self::Snapshot(id) => Type::Snapshot(SnapshotSource {
                    snapshot_id: id.clone(),
                }),
                Self::Volume(id) => Type::Volume(VolumeSource {
                    volume_id: id.clone(),
                }),
            }),
        }
    }
}

/// The parts of a volume capability that matter for compatibility (mount flags are not kept:
/// they may be sensitive, and bind mounts ignore them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Capability {
    /// Access mode name, e.g. `SINGLE_NODE_WRITER`.
    pub access_mode: String,
    pub fs_type: String,
    pub mount_group: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ControllerPublication {
    pub readonly: bool,
    pub capability: Capability,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Staging {
    pub capability: Capability,
    /// Whether NodeStageVolume created the staging directory (then NodeUnstageVolume removes it).
    pub created_dir: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct NodePublication {
    pub readonly: bool,
    pub capability: Capability,
    pub staging_path: Option<PathBuf>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct VolumeRecord {
    pub id: String,
    pub name: String,
    pub capacity_bytes: i64,
    pub parameters: BTreeMap<String, String>,
    pub source: Option<ContentSource>,
    /// Controller publications, by node id.
    #[serde(default)]
    pub published_nodes: BTreeMap<String, ControllerPublication>,
    /// Node stagings, by staging path.
    #[serde(default)]
    pub staged: BTreeMap<PathBuf, Staging>,
    /// Node publications, by target path.
    #[serde(default)]
    pub published: BTreeMap<PathBuf, NodePublication>,
    /// Target paths NodePublishVolume created (recorded before it creates them) and
    /// NodeUnpublishVolume has not removed yet.
    #[serde(default)]
    pub created_targets: BTreeSet<PathBuf>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SnapshotRecord {
    pub id: String,
    pub name: String,
    pub source_volume_id: String,
    pub size_bytes: i64,
    pub created_seconds: i64,
    pub created_nanos: i32,
}

impl SnapshotRecord {
    pub fn to_pb(&self) -> pb::Snapshot {
        pb::Snapshot {
            size_bytes: self.size_bytes,
            snapshot_id: self.id.clone(),
            source_volume_id: self.source_volume_id.clone(),
            creation_time: Some(prost_types::Timestamp {
                seconds: self.created_seconds,
                nanos: self.created_nanos,
            }),
            ready_to_use: true,
            group_snapshot_id: String::new(),
        }
    }
}

/// The state file cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Reading failed.
    #[error("reading the state file {}", path.display())]
    Read {
        /// The state file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The content is not valid.
    #[error("the state file {} is corrupt", path.display())]
    Corrupt {
        /// The state file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// The file was written by a newer version.
    #[error("the state file {} has version {found}; this plugin understands {VERSION}", path.display())]
    Version {
        /// The state file.
        path: PathBuf,
        /// The version found.
        found: u32,
    },
    /// Writing failed; the file keeps its previous content.
    #[error("saving the state")]
    Write(#[source] berth_sys::AtomicWriteError),
    /// The blocking write task failed.
    #[error("saving the state: the write task failed")]
    Task(#[source] tokio::task::JoinError),
}

/// How the state file is written: [`berth_sys::write_atomic`], or a fake in unit tests.
type WriteFn = fn(&Path, &[u8]) -> Result<(), berth_sys::AtomicWriteError>;

/// The state and its file. One writer at a time; the in-memory state changes only once the new
/// state is on disk, so memory always holds what the file holds.
#[derive(Debug)]
pub(crate) struct Store {
    path: PathBuf,
    state: Mutex<State>,
    write: WriteFn,
}

impl Store {
    /// Loads `path`, or starts empty if it does not exist.
    pub fn load(path: &Path) -> Result<Self, StateError> {
        let state = match std::fs::read(path) {
            Ok(bytes) => {
                let state: State =
                    serde_json::from_slice(&bytes).map_err(|source| StateError::Corrupt {
                        path: path.to_path_buf(),
                        source,
                    })?;
                if state.version > VERSION {
                    return Err(StateError::Version {
                        path: path.to_path_buf(),
                        found: state.version,
                    });
                }
                state
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => State {
                version: VERSION,
                ..State::default()
            },
            Err(source) => {
                return Err(StateError::Read {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        Ok(Self {
            path: path.to_path_buf(),
            state: Mutex::new(state),
            write: berth_sys::write_atomic,
        })
    }

    /// Writes the state file with `write` instead of [`berth_sys::write_atomic`].
    #[cfg(test)]
    pub fn with_writer(mut self, write: WriteFn) -> Self {
        self.write = write;
        self
    }

    /// Runs `f` on the current state.
    pub async fn read<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&*self.state.lock().await)
    }

    /// Applies `f` to a copy of the state; if it returns `Ok`, writes the copy atomically and
    /// makes it current. If `f` fails or the write fails, nothing changes. A write that fails
    /// only after the new file replaced the old one (syncing the directory) counts as done:
    /// the new state is what readers of the file see, so it becomes current too (with a
    /// warning, as it may not survive a crash).
    pub async fn update<R, E>(&self, f: impl FnOnce(&mut State) -> Result<R, E>) -> Result<R, E>
    where
        E: From<StateError>,
    {
        let mut current = self.state.lock().await;
        let mut next = current.clone();
        let out = f(&mut next)?;
        next.version = VERSION;
        let bytes = serde_json::to_vec_pretty(&next).map_err(|source| StateError::Corrupt {
            path: self.path.clone(),
            source,
        })?;
        let path = self.path.clone();
        let write = self.write;
        let written = tokio::task::spawn_blocking(move || write(&path, &bytes))
            .await
            .map_err(StateError::Task)?;
        match written {
            Ok(()) => {}
            Err(e) if e.content_replaced() => {
                tracing::warn!(
                    error = %crate::error::chain(&e),
                    "the new state is saved but may not survive a crash"
                );
            }
            Err(e) => return Err(StateError::Write(e).into()),
        }
        *current = next;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use berth_sys::{AtomicWriteError, WriteStep};

    use super::*;

    #[derive(Debug)]
    struct Refused;

    impl From<StateError> for Refused {
        fn from(_: StateError) -> Self {
            Self
        }
    }

    fn volume(id: &str) -> VolumeRecord {
        VolumeRecord {
            id: id.to_owned(),
            name: format!("name-{id}"),
            capacity_bytes: 1,
            parameters: BTreeMap::new(),
            source: None,
            published_nodes: BTreeMap::new(),
            staged: BTreeMap::new(),
            published: BTreeMap::new(),
            created_targets: BTreeSet::new(),
        }
    }

    #[tokio::test]
    async fn survives_a_reload_and_failed_updates_change_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.json");
        let store = Store::load(&path).expect("load empty");
        store
            .update(|s| {
                s.volumes.insert("v1".into(), volume("v1"));
                Ok::<_, Refused>(())
            })
            .await
            .expect("update");
        let refused = store
            .update(|s| {
                s.volumes.clear();
                Err::<(), _>(Refused)
            })
            .await;
        assert!(refused.is_err());
        assert_eq!(store.read(|s| s.volumes.len()).await, 1);

        let reloaded = Store::load(&path).expect("reload");
        assert_eq!(
            reloaded.read(|s| s.volumes["v1"].name.clone()).await,
            "name-v1"
        );
    }

    fn write_then_fail_to_sync_dir(path: &Path, bytes: &[u8]) -> Result<(), AtomicWriteError> {
        berth_sys::write_atomic(path, bytes)?;
        Err(AtomicWriteError {
            path: path.to_path_buf(),
            step: WriteStep::SyncDir,
            source: io::Error::from_raw_os_error(5),
        })
    }

    fn fail_to_rename(path: &Path, _: &[u8]) -> Result<(), AtomicWriteError> {
        Err(AtomicWriteError {
            path: path.to_path_buf(),
            step: WriteStep::Rename,
            source: io::Error::from_raw_os_error(5),
        })
    }

    #[tokio::test]
    async fn a_write_that_fails_after_the_rename_is_committed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.json");
        let store = Store::load(&path)
            .expect("load empty")
            .with_writer(write_then_fail_to_sync_dir);
        store
            .update(|s| {
                s.volumes.insert("v1".into(), volume("v1"));
                Ok::<_, Refused>(())
            })
            .await
            .expect("the new state is in place: the update is done");
        assert!(store.read(|s| s.volumes.contains_key("v1")).await);
        let on_disk = Store::load(&path).expect("reload");
        assert!(on_disk.read(|s| s.volumes.contains_key("v1")).await);
    }

    #[tokio::test]
    async fn a_write_that_fails_before_the_rename_changes_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.json");
        let store = Store::load(&path)
            .expect("load empty")
            .with_writer(fail_to_rename);
        let result = store
            .update(|s| {
                s.volumes.insert("v1".into(), volume("v1"));
                Ok::<_, StateError>(())
            })
            .await;
        let err = result.expect_err("nothing was written");
        assert!(
            matches!(&err, StateError::Write(e) if e.step == WriteStep::Rename),
            "{err:?}"
        );
        assert!(store.read(|s| s.volumes.is_empty()).await);
        assert!(!path.exists());
    }

    #[test]
    fn corrupt_and_newer_files_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.json");
        std::fs::write(&path, b"{not json").expect("write");
        assert!(matches!(
            Store::load(&path),
            Err(StateError::Corrupt { .. })
        ));
        std::fs::write(&path, br#"{"version":9,"volumes":{},"snapshots":{}}"#).expect("write");
        let err = Store::load(&path).unwrap_err();
        assert!(err.to_string().contains("version 9"), "{err}");
    }
}
