//! The node's own records: for each volume, where it is staged and published and with which
//! capability, and which of those directories the plugin made. They live in `node.journal`, in
//! the node's directory (the state directory, or `<statedir>/nodes/<nodeid>` with `--shared`),
//! apart from `state.json`, because they need no fsync:
//!
//! - Whether something is mounted is always asked of the kernel; a record only adds what the
//!   kernel cannot say (the capability asked for, and who made a directory), and is believed
//!   only for a path where the volume is mounted, except for directory ownership.
//! - Every change is appended with `write(2)` on an `O_APPEND` file before the RPC is answered,
//!   so it survives a kill of the plugin at any point: the written bytes are the kernel's.
//! - Only a crash of the machine can lose appended lines, and the machine takes every mount with
//!   it: what it can lose that still matters is that the plugin made a directory. Without
//!   `--strict` that changes nothing (an empty target directory is removed anyway, and staging
//!   directories are the CO's). With `--strict` the plugin would refuse its own target directory
//!   as the CO's, so that claim is synced (`fdatasync`) before the directory is made.
//!
//! Format: a header line (version, boot id), then one line per change giving a volume's
//! complete records (the last line of a volume wins; empty records remove it). A line is the
//! 16 hex digits of the FNV-1a 64-bit hash of its JSON, a space, the JSON and `\n`. At start,
//! and after [`COMPACT_AFTER`] appended lines, the file is rewritten atomically and synced with
//! one line per volume, under the current boot id.
//!
//! Loading drops an unterminated last line (a write cut short, so never answered). A damaged
//! complete line is only expected after a crash of the machine (pages written back out of
//! order): it is skipped with a warning when the header's boot id is not this boot's, and
//! otherwise refuses the start, naming the file and line.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs::{File, OpenOptions},
    io::{self, Write as _},
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
};

use nix::fcntl::OFlag;
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use tokio::sync::Mutex;

use crate::state::{NodePublication, Staging, State};

/// Name of the file in the node's directory.
pub(crate) const NODE_FILE: &str = "node.journal";

/// Version written in the header.
const VERSION: u32 = 1;

/// Appended lines after which the file is rewritten with one line per volume.
pub(crate) const COMPACT_AFTER: usize = 4096;

/// Where the kernel gives this boot's id.
const BOOT_ID_FILE: &str = "/proc/sys/kernel/random/boot_id";

/// A volume's records on this node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct NodeRecords {
    /// Stagings, by staging path.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub staged: BTreeMap<PathBuf, Staging>,
    /// Publications, by target path.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub published: BTreeMap<PathBuf, NodePublication>,
    /// Target paths NodePublishVolume created (recorded before it creates them) and
    /// NodeUnpublishVolume has not removed yet.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub created_targets: BTreeSet<PathBuf>,
}

impl NodeRecords {
    /// Whether there is nothing to remember.
    pub fn is_empty(&self) -> bool {
        self.staged.is_empty() && self.published.is_empty() && self.created_targets.is_empty()
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    version: u32,
    boot_id: String,
}

/// A line as read.
#[derive(Debug, Deserialize)]
struct Line {
    volume: String,
    records: NodeRecords,
}

/// A line to write.
#[derive(Debug, Serialize)]
struct LineRef<'a> {
    volume: &'a str,
    records: &'a NodeRecords,
}

/// The node's records cannot be loaded or saved.
#[derive(Debug, thiserror::Error)]
pub enum NodeStateError {
    /// Reading the file failed.
    #[error("reading the node records {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A line is damaged and the machine has not restarted since it was written.
    #[error("the node records {}:{line} are corrupt: {reason}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The file was written by a newer version.
    #[error(
        "the node records {} have version {found}; this plugin understands {VERSION}",
        path.display()
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// The version found.
        found: u32,
    },
    /// This boot's id cannot be read.
    #[error("reading the boot id from {BOOT_ID_FILE}")]
    BootId(#[source] io::Error),
    /// Rewriting the file failed; it keeps its previous content.
    #[error("saving the node records")]
    Write(#[source] berth_sys::AtomicWriteError),
    /// Appending a change failed; the change is not made.
    #[error("appending to the node records {}", path.display())]
    Append {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The records cannot be written as JSON (a path that is not UTF-8).
    #[error("encoding the node records")]
    Encode(#[source] serde_json::Error),
    /// The blocking rewrite task failed.
    #[error("saving the node records: the write task failed")]
    Task(#[source] tokio::task::JoinError),
}

/// The records of every volume on this node and their file. Changes of one volume are made
/// one at a time; memory changes only once the change is in the file.
#[derive(Debug)]
pub(crate) struct NodeState {
    path: PathBuf,
    boot_id: String,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    records: BTreeMap<String, NodeRecords>,
    /// Open for appending.
    file: File,
    /// Bytes of whole lines in the file.
    len: u64,
    /// Lines appended since the last rewrite.
    appended: usize,
    /// A failed append may have left part of a line that could not be cut off: rewrite the
    /// file before the next append.
    damaged: bool,
}

/// FNV-1a, 64 bits: detects lines damaged by a crash, not tampering.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, NodeStateError> {
    let json = serde_json::to_vec(value).map_err(NodeStateError::Encode)?;
    let mut line = format!("{:016x} ", fnv1a(&json)).into_bytes();
    line.extend_from_slice(&json);
    line.push(b'\n');
    Ok(line)
}

fn decode<T: DeserializeOwned>(line: &[u8]) -> Result<T, String> {
    let (sum, json) = match line.iter().position(|&b| b == b' ') {
        Some(16) => (&line[..16], &line[17..]),
        _ => return Err("expected a 16-digit checksum and a space".to_owned()),
    };
    let sum = std::str::from_utf8(sum)
        .ok()
        .and_then(|s| u64::from_str_radix(s, 16).ok())
        .ok_or_else(|| "the checksum is not hexadecimal".to_owned())?;
    if sum != fnv1a(json) {
        return Err("the checksum does not match".to_owned());
    }
    serde_json::from_slice(json).map_err(|e| e.to_string())
}

/// This boot's id.
fn boot_id() -> Result<String, NodeStateError> {
    std::fs::read_to_string(BOOT_ID_FILE)
        .map(|id| id.trim().to_owned())
        .map_err(NodeStateError::BootId)
}

/// The whole file for `records`: the header and one line per volume.
fn snapshot(
    boot_id: &str,
    records: &BTreeMap<String, NodeRecords>,
) -> Result<Vec<u8>, NodeStateError> {
    let mut bytes = encode(&Header {
        version: VERSION,
        boot_id: boot_id.to_owned(),
    })?;
    for (volume, records) in records {
        bytes.extend(encode(&LineRef { volume, records })?);
    }
    Ok(bytes)
}

/// Replays the file's content (see the module documentation).
fn replay(
    path: &Path,
    bytes: &[u8],
    boot_id: &str,
) -> Result<BTreeMap<String, NodeRecords>, NodeStateError> {
    let corrupt = |line, reason: String| NodeStateError::Corrupt {
        path: path.to_path_buf(),
        line,
        reason,
    };
    let Some(end) = bytes.iter().rposition(|&b| b == b'\n') else {
        return Err(corrupt(1, "no header line".to_owned()));
    };
    if end + 1 < bytes.len() {
        tracing::warn!(path = %path.display(), "dropping an unfinished last line of the node records");
    }
    let mut lines = bytes[..end].split(|&b| b == b'\n');
    let header: Header = decode(lines.next().unwrap_or_default())
        .map_err(|reason| corrupt(1, format!("header: {reason}")))?;
    if header.version > VERSION {
        return Err(NodeStateError::Version {
            path: path.to_path_buf(),
            found: header.version,
        });
    }
    let same_boot = header.boot_id == boot_id;
    let mut records = BTreeMap::new();
    for (i, line) in lines.enumerate() {
        let number = i + 2;
        match decode::<Line>(line) {
            Ok(Line { volume, records: r }) if r.is_empty() => {
                records.remove(&volume);
            }
            Ok(Line { volume, records: r }) => {
                records.insert(volume, r);
            }
            Err(reason) if !same_boot => {
                tracing::warn!(path = %path.display(), line = number, %reason,
                    "skipping a node record damaged by a crash of the machine");
            }
            Err(reason) => return Err(corrupt(number, reason)),
        }
    }
    Ok(records)
}

/// What [`NodeState::load`] needs from the state: the node records earlier versions kept in
/// it, and the ids of the volumes.
pub(crate) fn seed_and_volumes(state: &State) -> (BTreeMap<String, NodeRecords>, BTreeSet<String>) {
    let seed = state
        .volumes
        .iter()
        .map(|(id, v)| (id.clone(), v.legacy_node_records()))
        .filter(|(_, r)| !r.is_empty())
        .collect();
    (seed, state.volumes.keys().cloned().collect())
}

impl NodeState {
    /// Loads `path` and rewrites it (atomically, synced) under this boot's id, keeping the
    /// records of the volumes `exists` knows. A missing file starts from `seed` (records kept
    /// in `state.json` by earlier versions).
    pub fn load(
        path: &Path,
        seed: BTreeMap<String, NodeRecords>,
        exists: impl Fn(&str) -> bool,
    ) -> Result<Self, NodeStateError> {
        let boot_id = boot_id()?;
        Self::load_with_boot_id(path, boot_id, seed, exists)
    }

    fn load_with_boot_id(
        path: &Path,
        boot_id: String,
        seed: BTreeMap<String, NodeRecords>,
        exists: impl Fn(&str) -> bool,
    ) -> Result<Self, NodeStateError> {
        let mut records = match std::fs::read(path) {
            Ok(bytes) => replay(path, &bytes, &boot_id)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => seed,
            Err(source) => {
                return Err(NodeStateError::Read {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        records.retain(|volume, r| {
            let keep = exists(volume) && !r.is_empty();
            if !keep {
                tracing::debug!(volume_id = %volume, "dropping the node records of a deleted volume");
            }
            keep
        });
        let bytes = snapshot(&boot_id, &records)?;
        berth_sys::write_atomic(path, &bytes).map_err(NodeStateError::Write)?;
        let file = open_append(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            boot_id,
            inner: Mutex::new(Inner {
                records,
                file,
                len: bytes.len() as u64,
                appended: 0,
                damaged: false,
            }),
        })
    }

    /// Volume `id`'s records (empty if it has none).
    pub async fn get(&self, id: &str) -> NodeRecords {
        let inner = self.inner.lock().await;
        inner.records.get(id).cloned().unwrap_or_default()
    }

    /// Applies `f` to a copy of volume `id`'s records; if it returns `Ok` and changed them,
    /// appends the new records to the file and makes them current. With `sync`, the line is
    /// also synced to disk before this returns (a sync that fails only warns: the change is
    /// in the file). If `f` fails or the append fails, nothing changes.
    pub async fn update<R, E>(
        &self,
        id: &str,
        sync: bool,
        f: impl FnOnce(&mut NodeRecords) -> Result<R, E>,
    ) -> Result<R, E>
    where
        E: From<NodeStateError>,
    {
        let mut inner = self.inner.lock().await;
        let current = inner.records.get(id);
        let mut next = current.cloned().unwrap_or_default();
        let out = f(&mut next)?;
        if current.map_or(next.is_empty(), |c| *c == next) {
            return Ok(out);
        }
        if inner.damaged || inner.appended >= COMPACT_AFTER {
            self.rewrite(&mut inner).await?;
        }
        let line = encode(&LineRef {
            volume: id,
            records: &next,
        })?;
        self.append(&mut inner, &line)?;
        if sync && let Err(e) = inner.file.sync_data() {
            tracing::warn!(path = %self.path.display(), error = %e,
                "a node record is saved but may not survive a crash of the machine");
        }
        if next.is_empty() {
            inner.records.remove(id);
        } else {
            inner.records.insert(id.to_owned(), next);
        }
        Ok(out)
    }

    /// Forgets volume `id` (deleted).
    pub async fn forget(&self, id: &str) -> Result<(), NodeStateError> {
        self.update(id, false, |r| {
            *r = NodeRecords::default();
            Ok(())
        })
        .await
    }

    /// Appends one whole line; on failure, cuts off whatever part of it was written.
    fn append(&self, inner: &mut Inner, line: &[u8]) -> Result<(), NodeStateError> {
        match inner.file.write_all(line) {
            Ok(()) => {
                inner.len += line.len() as u64;
                inner.appended += 1;
                Ok(())
            }
            Err(source) => {
                if let Err(e) = inner.file.set_len(inner.len) {
                    tracing::warn!(path = %self.path.display(), error = %e,
                        "cannot cut off a failed append; the node records will be rewritten");
                    inner.damaged = true;
                }
                Err(NodeStateError::Append {
                    path: self.path.clone(),
                    source,
                })
            }
        }
    }

    /// Rewrites the file with one line per volume, and appends to the new file from now on.
    async fn rewrite(&self, inner: &mut Inner) -> Result<(), NodeStateError> {
        let bytes = snapshot(&self.boot_id, &inner.records)?;
        let path = self.path.clone();
        let file = tokio::task::spawn_blocking(move || {
            berth_sys::write_atomic(&path, &bytes).map_err(NodeStateError::Write)?;
            let file = open_append(&path)?;
            Ok::<_, NodeStateError>((file, bytes.len() as u64))
        })
        .await
        .map_err(NodeStateError::Task)??;
        (inner.file, inner.len) = file;
        inner.appended = 0;
        inner.damaged = false;
        Ok(())
    }
}

/// Opens `path` for appending, never through a symlink.
fn open_append(path: &Path) -> Result<File, NodeStateError> {
    OpenOptions::new()
        .append(true)
        .custom_flags(OFlag::O_NOFOLLOW.bits())
        .open(path)
        .map_err(|source| NodeStateError::Append {
            path: path.to_path_buf(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Capability;

    const BOOT: &str = "boot-a";

    fn staged(path: &str) -> NodeRecords {
        let mut r = NodeRecords::default();
        r.staged.insert(
            PathBuf::from(path),
            Staging {
                capability: Capability {
                    access_mode: "SINGLE_NODE_WRITER".to_owned(),
                    fs_type: String::new(),
                    mount_group: String::new(),
                },
                created_dir: true,
            },
        );
        r
    }

    fn load(path: &Path, boot: &str) -> Result<NodeState, NodeStateError> {
        NodeState::load_with_boot_id(path, boot.to_owned(), BTreeMap::new(), |_| true)
    }

    async fn stage(node: &NodeState, id: &str, path: &str) {
        node.update(id, false, |r| {
            *r = staged(path);
            Ok::<_, NodeStateError>(())
        })
        .await
        .expect("update");
    }

    #[tokio::test]
    async fn changes_survive_a_reload_and_refused_ones_change_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(NODE_FILE);
        let node = load(&path, BOOT).expect("load empty");
        stage(&node, "v1", "/s1").await;
        stage(&node, "v2", "/s2").await;
        node.forget("v2").await.expect("forget");
        let refused = node
            .update("v1", false, |r| {
                r.staged.clear();
                Err::<(), _>(NodeStateError::BootId(io::Error::other("no")))
            })
            .await;
        assert!(refused.is_err());
        assert_eq!(node.get("v1").await, staged("/s1"));
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(
            text.lines().count(),
            4,
            "header, v1, v2, v2 forgotten:\n{text}"
        );

        let again = load(&path, BOOT).expect("reload");
        assert_eq!(again.get("v1").await, staged("/s1"));
        assert_eq!(again.get("v2").await, NodeRecords::default());
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(
            text.lines().count(),
            2,
            "rewritten with one line per volume:\n{text}"
        );

        // Records of volumes that no longer exist are dropped at load.
        let pruned =
            NodeState::load_with_boot_id(&path, BOOT.to_owned(), BTreeMap::new(), |id| id != "v1")
                .expect("reload");
        assert_eq!(pruned.get("v1").await, NodeRecords::default());
    }

    #[tokio::test]
    async fn an_unfinished_last_line_is_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(NODE_FILE);
        let node = load(&path, BOOT).expect("load");
        stage(&node, "v1", "/s1").await;
        drop(node);
        let mut cut = encode(&LineRef {
            volume: "v2",
            records: &staged("/s2"),
        })
        .expect("encode");
        cut.truncate(cut.len() / 2);
        let mut file = OpenOptions::new().append(true).open(&path).expect("open");
        file.write_all(&cut).expect("write");

        let node = load(&path, BOOT).expect("a cut-off write is not corruption");
        assert_eq!(node.get("v1").await, staged("/s1"));
        assert_eq!(node.get("v2").await, NodeRecords::default());
        // New lines start on a line of their own.
        stage(&node, "v3", "/s3").await;
        let node = load(&path, BOOT).expect("reload");
        assert_eq!(node.get("v3").await, staged("/s3"));
    }

    #[tokio::test]
    async fn a_damaged_line_is_corruption_unless_the_machine_restarted_since() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(NODE_FILE);
        let node = load(&path, BOOT).expect("load");
        stage(&node, "v1", "/s1").await;
        stage(&node, "v2", "/s2").await;
        drop(node);
        let text = std::fs::read_to_string(&path).expect("read");
        let damaged = text.replacen("/s1", "/s9", 1);
        std::fs::write(&path, &damaged).expect("write");

        let err = load(&path, BOOT).expect_err("same boot");
        let message = err.to_string();
        assert!(
            matches!(err, NodeStateError::Corrupt { line: 2, .. })
                && message.contains(&format!("{}:2", path.display()))
                && message.contains("checksum"),
            "{message}"
        );
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            damaged,
            "a refused file is left as it was"
        );

        let node = load(&path, "boot-b").expect("after a restart of the machine");
        assert_eq!(node.get("v1").await, NodeRecords::default());
        assert_eq!(node.get("v2").await, staged("/s2"));
        // Rewritten under the new boot id: the damage is gone.
        load(&path, "boot-b").expect("reload");
    }

    #[test]
    fn a_bad_header_or_a_newer_version_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(NODE_FILE);
        for bad in ["", "no newline", "0000000000000000 {}\n"] {
            std::fs::write(&path, bad).expect("write");
            let err = load(&path, BOOT).map(drop).expect_err(bad);
            assert!(
                matches!(err, NodeStateError::Corrupt { line: 1, .. }),
                "{bad:?}: {err}"
            );
        }
        let newer = encode(&Header {
            version: VERSION + 1,
            boot_id: BOOT.to_owned(),
        })
        .expect("encode");
        std::fs::write(&path, newer).expect("write");
        let err = load(&path, BOOT).map(drop).expect_err("newer");
        assert!(matches!(err, NodeStateError::Version { .. }), "{err}");
    }

    #[tokio::test]
    async fn a_missing_file_starts_from_the_seed_and_appends_are_compacted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(NODE_FILE);
        let seed = BTreeMap::from([("v1".to_owned(), staged("/s1"))]);
        let node = NodeState::load_with_boot_id(&path, BOOT.to_owned(), seed.clone(), |_| true)
            .expect("load");
        assert_eq!(node.get("v1").await, staged("/s1"));
        // The seed is used only when there is no file.
        let node = NodeState::load_with_boot_id(
            &path,
            BOOT.to_owned(),
            BTreeMap::from([("v2".to_owned(), staged("/s2"))]),
            |_| true,
        )
        .expect("reload");
        assert_eq!(node.get("v2").await, NodeRecords::default());

        for i in 0..=COMPACT_AFTER {
            let path = if i % 2 == 0 { "/a" } else { "/b" };
            stage(&node, "v1", path).await;
        }
        let lines = std::fs::read_to_string(&path)
            .expect("read")
            .lines()
            .count();
        assert_eq!(lines, 3, "header, v1, and one line since the rewrite");
        let node = load(&path, BOOT).expect("reload");
        assert_eq!(node.get("v1").await, staged("/a"));
    }

    #[test]
    fn the_system_boot_id_is_read() {
        let id = boot_id().expect("boot id");
        assert_eq!(id.len(), 36, "{id}");
    }
}
