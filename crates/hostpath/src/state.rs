//! The persisted state: `<statedir>/state.json`, rewritten atomically (and synced) on every
//! change. With `--shared` several copies share the file: each reads it again under an `flock`
//! on `<statedir>/state.lock` before every read and every change. The node's own records
//! (stagings, publications) are kept apart, in [`crate::nodestate`].

use std::{
    collections::{BTreeMap, BTreeSet},
    fs::{File, OpenOptions},
    io,
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
};

use berth_csi::pb;
use nix::{
    errno::Errno,
    fcntl::{Flock, FlockArg, OFlag},
};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::nodestate::NodeRecords;

/// Name of the file, in the state directory, whose `flock` orders the copies sharing it
/// (`--shared`).
pub(crate) const STATE_LOCK_FILE: &str = "state.lock";

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
    /// With `--shared`: the node id of every copy that has run on this state directory (each
    /// records its own when it starts). Absent from files written without `--shared`.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub nodes: BTreeSet<String>,
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
    /// The node records earlier versions kept here (the node's own records now live in
    /// [`crate::nodestate`]): read to seed a missing node record file, carried along unchanged
    /// (copies sharing the directory may still need them), never written anew.
    #[serde(default, rename = "staged", skip_serializing_if = "BTreeMap::is_empty")]
    pub legacy_staged: BTreeMap<PathBuf, Staging>,
    /// See [`legacy_staged`](Self::legacy_staged).
    #[serde(
        default,
        rename = "published",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub legacy_published: BTreeMap<PathBuf, NodePublication>,
    /// See [`legacy_staged`](Self::legacy_staged).
    #[serde(
        default,
        rename = "created_targets",
        skip_serializing_if = "BTreeSet::is_empty"
    )]
    pub legacy_created_targets: BTreeSet<PathBuf>,
}

impl VolumeRecord {
    /// The node records earlier versions kept in this record.
    pub fn legacy_node_records(&self) -> NodeRecords {
        NodeRecords {
            staged: self.legacy_staged.clone(),
            published: self.legacy_published.clone(),
            created_targets: self.legacy_created_targets.clone(),
        }
    }
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
    /// The lock shared with the other copies (`--shared`) cannot be taken.
    #[error("locking {}", path.display())]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

/// How the state file is written: [`berth_sys::write_atomic`], or a fake in unit tests.
type WriteFn = fn(&Path, &[u8]) -> Result<(), berth_sys::AtomicWriteError>;

/// The state and its file. One writer at a time; the in-memory state changes only once the new
/// state is on disk, so memory always holds what the file holds. With `--shared` the file is
/// the truth: every read and update reads it again first, under the lock the copies share.
#[derive(Debug)]
pub(crate) struct Store {
    path: PathBuf,
    state: Mutex<State>,
    write: WriteFn,
    /// With `--shared`: [`STATE_LOCK_FILE`].
    lock_path: Option<PathBuf>,
}

/// An `flock` on the lock file the copies sharing a state directory share.
type FileLock = Flock<File>;

/// Reads the state file at `path`; an empty state if it does not exist.
fn read_state_file(path: &Path) -> Result<State, StateError> {
    match std::fs::read(path) {
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
            Ok(state)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(State {
            version: VERSION,
            ..State::default()
        }),
        Err(source) => Err(StateError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Takes an `flock` on `lock_path` (created, mode 0600; never through a symlink), waiting for
/// it: shared, or `exclusive`.
fn lock_file(lock_path: &Path, exclusive: bool) -> Result<FileLock, StateError> {
    let err = |source| StateError::Lock {
        path: lock_path.to_path_buf(),
        source,
    };
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(OFlag::O_NOFOLLOW.bits())
        .open(lock_path)
        .map_err(err)?;
    let arg = if exclusive {
        FlockArg::LockExclusive
    } else {
        FlockArg::LockShared
    };
    loop {
        file = match Flock::lock(file, arg) {
            Ok(locked) => return Ok(locked),
            Err((file, Errno::EINTR)) => file,
            Err((_, errno)) => return Err(err(errno.into())),
        };
    }
}

/// Reads the state file at `path` under an `flock` on `lock_path` (shared, or `exclusive`);
/// returns the lock, still held, with the state.
fn read_locked(
    path: &Path,
    lock_path: &Path,
    exclusive: bool,
) -> Result<(FileLock, State), StateError> {
    let lock = lock_file(lock_path, exclusive)?;
    let state = read_state_file(path)?;
    Ok((lock, state))
}

impl Store {
    /// Loads `path`, or starts empty if it does not exist.
    pub fn load(path: &Path) -> Result<Self, StateError> {
        Ok(Self {
            path: path.to_path_buf(),
            state: Mutex::new(read_state_file(path)?),
            write: berth_sys::write_atomic,
            lock_path: None,
        })
    }

    /// `--shared`: loads `path`, shared with other copies that take an `flock` on `lock_path`
    /// around every read and update of it (as this store does).
    pub fn load_shared(path: &Path, lock_path: &Path) -> Result<Self, StateError> {
        let (_lock, state) = read_locked(path, lock_path, false)?;
        Ok(Self {
            path: path.to_path_buf(),
            state: Mutex::new(state),
            write: berth_sys::write_atomic,
            lock_path: Some(lock_path.to_path_buf()),
        })
    }

    /// Writes the state file with `write` instead of [`berth_sys::write_atomic`].
    #[cfg(test)]
    pub fn with_writer(mut self, write: WriteFn) -> Self {
        self.write = write;
        self
    }

    /// With `--shared`: reads the file again into `current` under the shared lock (shared, or
    /// `exclusive`), and returns the lock, still held. Without it: nothing to do.
    async fn refresh(
        &self,
        current: &mut State,
        exclusive: bool,
    ) -> Result<Option<FileLock>, StateError> {
        let Some(lock_path) = &self.lock_path else {
            return Ok(None);
        };
        let (path, lock_path) = (self.path.clone(), lock_path.clone());
        let (lock, state) =
            tokio::task::spawn_blocking(move || read_locked(&path, &lock_path, exclusive))
                .await
                .map_err(StateError::Task)??;
        *current = state;
        Ok(Some(lock))
    }

    /// Runs `f` on the current state (with `--shared`, as the file holds it now). Fails only
    /// with `--shared`, if the file cannot be read.
    pub async fn read<R>(&self, f: impl FnOnce(&State) -> R) -> Result<R, StateError> {
        let mut current = self.state.lock().await;
        // Released at once: `f` sees a consistent copy.
        drop(self.refresh(&mut current, false).await?);
        Ok(f(&current))
    }

    /// Applies `f` to a copy of the state; if it returns `Ok`, writes the copy atomically and
    /// makes it current. If `f` fails or the write fails, nothing changes. A write that fails
    /// only after the new file replaced the old one (syncing the directory) counts as done:
    /// the new state is what readers of the file see, so it becomes current too (with a
    /// warning, as it may not survive a crash). With `--shared`, the copy is made from the file
    /// as it is now, and the other copies wait from that read until the new file is in place.
    pub async fn update<R, E>(&self, f: impl FnOnce(&mut State) -> Result<R, E>) -> Result<R, E>
    where
        E: From<StateError>,
    {
        let mut current = self.state.lock().await;
        let lock = self.refresh(&mut current, true).await?;
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
        drop(lock);
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
            legacy_staged: BTreeMap::new(),
            legacy_published: BTreeMap::new(),
            legacy_created_targets: BTreeSet::new(),
        }
    }

    /// Adds volume `v1` through `store`.
    async fn add_v1(store: &Store) {
        store
            .update(|s| {
                s.volumes.insert("v1".into(), volume("v1"));
                Ok::<_, Refused>(())
            })
            .await
            .expect("update");
    }

    #[tokio::test]
    async fn survives_a_reload_and_failed_updates_change_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.json");
        let store = Store::load(&path).expect("load empty");
        add_v1(&store).await;
        let refused = store
            .update(|s| {
                s.volumes.clear();
                Err::<(), _>(Refused)
            })
            .await;
        assert!(refused.is_err());
        assert_eq!(store.read(|s| s.volumes.len()).await.expect("read"), 1);

        let reloaded = Store::load(&path).expect("reload");
        assert_eq!(
            reloaded
                .read(|s| s.volumes["v1"].name.clone())
                .await
                .expect("read"),
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
        add_v1(&store).await;
        assert!(
            store
                .read(|s| s.volumes.contains_key("v1"))
                .await
                .expect("read")
        );
        let on_disk = Store::load(&path).expect("reload");
        assert!(
            on_disk
                .read(|s| s.volumes.contains_key("v1"))
                .await
                .expect("read")
        );
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
        assert!(store.read(|s| s.volumes.is_empty()).await.expect("read"));
        assert!(!path.exists());
    }

    #[tokio::test]
    async fn shared_stores_decide_on_what_the_others_wrote_and_lose_no_update() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.json");
        let lock = dir.path().join(STATE_LOCK_FILE);
        let a = std::sync::Arc::new(Store::load_shared(&path, &lock).expect("a"));
        let b = std::sync::Arc::new(Store::load_shared(&path, &lock).expect("b"));
        add_v1(&a).await;
        assert!(
            b.read(|s| s.volumes.contains_key("v1"))
                .await
                .expect("read")
        );
        b.update(|s| {
            s.nodes.insert("node-b".into());
            Ok::<_, Refused>(())
        })
        .await
        .expect("update through b");
        assert!(a.read(|s| s.nodes.contains("node-b")).await.expect("read"));

        // Read-modify-write through both at once: every change lands.
        let mut tasks = Vec::new();
        for (name, store) in [("a", &a), ("b", &b)] {
            for i in 0..20 {
                let store = std::sync::Arc::clone(store);
                tasks.push(tokio::spawn(async move {
                    store
                        .update(|s| {
                            let id = format!("{name}-{i}");
                            s.volumes.insert(id.clone(), volume(&id));
                            Ok::<_, Refused>(())
                        })
                        .await
                }));
            }
        }
        for task in tasks {
            assert!(task.await.expect("task").is_ok());
        }
        assert_eq!(a.read(|s| s.volumes.len()).await.expect("read"), 41);
        let on_disk = Store::load(&path).expect("reload");
        assert_eq!(on_disk.read(|s| s.volumes.len()).await.expect("read"), 41);

        // A failed update changes neither the file nor the others' view.
        let refused = a
            .update(|s| {
                s.volumes.clear();
                Err::<(), _>(Refused)
            })
            .await;
        assert!(refused.is_err());
        assert_eq!(b.read(|s| s.volumes.len()).await.expect("read"), 41);
    }

    #[tokio::test]
    async fn a_file_written_without_shared_has_no_node_list() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.json");
        let store = Store::load(&path).expect("load");
        add_v1(&store).await;
        let text = std::fs::read_to_string(&path).expect("read");
        let value: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(value.get("nodes"), None, "{text}");
        assert!(!dir.path().join(STATE_LOCK_FILE).exists());
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
