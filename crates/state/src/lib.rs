//! berth's store: one redb file (`state.redb` in the data dir) holding plain JSON records in
//! named tables, with a schema version and a migration step.
//!
//! Every write is one [`Batch`], all-or-nothing and durable when its call returns (a
//! [deferred](Batch::deferred) one: with the next durable commit): after a crash the store holds
//! either the old records or the new ones, never a torn one. Callers write a
//! record before they act and again after. Writes go through one commit thread that commits
//! the batches waiting together in one transaction (see [`commit`]), so concurrent writers
//! share fsyncs; async callers wait for it without holding a runtime thread.
//!
//! Tables are created by their first write; reading a table that was never written finds
//! nothing. So a table added by a newer build needs no migration: a store written before it
//! existed opens and reads it as empty.
//!
//! [`KeyedLocks`] serializes the callers that act on one key (e.g. one volume) while different
//! keys run in parallel.

pub mod commit;
mod journal;
mod locks;

pub use commit::{Batch, CommitGroup, CommitHook, CommitPoint, CommitStats, Committed};
pub use journal::Journal;
pub use locks::KeyedLocks;

use std::{
    fmt,
    path::{Path, PathBuf},
    sync::Arc,
};

use redb::{ReadableDatabase as _, ReadableTable as _, TableDefinition};
use serde::{Serialize, de::DeserializeOwned};

/// The schema this build writes.
pub const SCHEMA_VERSION: u64 = 1;

/// Memory redb may keep of the store's pages (its default is 1 GiB, which an agent's store
/// fills with every page it ever touched). Pages beyond it are read from the file again, most
/// often from the kernel's page cache; the catalog keeps its volume records decoded anyway.
const STORE_CACHE_BYTES: usize = 1 << 20;

/// [`STORE_CACHE_BYTES`] for the event journal, which is written and rarely read.
const JOURNAL_CACHE_BYTES: usize = 256 << 10;

const META: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("meta");
const SCHEMA_KEY: &str = "schema_version";

/// A table of records, keyed by string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Table(&'static str);

impl Table {
    /// Registered CSI plugin instances, keyed `<plugin id>/<instance>`.
    pub const PLUGINS: Table = Table("plugins");
    /// Facts about this node (its id).
    pub const NODE: Table = Table("node");
    /// Volume usages on this node (the volume manager's records), keyed
    /// `<plugin id>/<volume id>/<usage>`.
    pub const USAGES: Table = Table("usages");
    /// The volume catalog: one record per registered or created volume, keyed by berth's
    /// volume id, with its claims and controller publications inside (one write changes a
    /// volume and its claims together).
    pub const VOLUMES: Table = Table("volumes");
    /// Jobs the control plane placed, keyed by job id.
    pub const JOBS: Table = Table("jobs");
    /// Allocs on this node (the alloc runners' records), keyed by alloc id.
    pub const ALLOCS: Table = Table("allocs");
    /// The last device list of each device plugin, keyed `<protocol>:<plugin name>`.
    pub const DEVICES: Table = Table("devices");
    /// The keys that sign workload identities (one record, `keys`).
    pub const IDENTITY: Table = Table("identity");
    /// Consul ACL tokens an alloc holds, keyed by alloc id (one record per alloc).
    pub const CONSUL_TOKENS: Table = Table("consul_tokens");
    /// Each registered CSI plugin instance's last fingerprint with the identity of the socket
    /// it was taken through, keyed `<plugin id>/<instance>`: a restarted agent takes it as is
    /// while that socket is unchanged, instead of asking the plugin again.
    pub const FINGERPRINTS: Table = Table("fingerprints");
    /// The API's ACL tokens, keyed `token/<accessor id>` (a secret's SHA-256, never the
    /// secret), and the `bootstrap` record once the first token was made.
    pub const ACL: Table = Table("acl");

    pub(crate) fn def(self) -> TableDefinition<'static, &'static str, &'static [u8]> {
        TableDefinition::new(self.0)
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// A store failure, naming the file and what was being done.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The file cannot be created, or its mode cannot be made 0600.
    #[error("state store {path}: cannot create it or make it private (mode 0600): {source}")]
    Private {
        /// The store file.
        path: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// redb refused to open, read or write.
    #[error("state store {path}: {action}: {source}")]
    Db {
        /// The store file.
        path: PathBuf,
        /// What was being done.
        action: String,
        /// redb's error.
        #[source]
        source: Box<redb::Error>,
    },
    /// A record does not decode (or encode).
    #[error("state store {path}: table {table}, key {key:?}: {source}")]
    Record {
        /// The store file.
        path: PathBuf,
        /// The table.
        table: Table,
        /// The key.
        key: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// The schema version record is unreadable.
    #[error("state store {path}: the schema version record is damaged; refusing to guess")]
    BadSchema {
        /// The store file.
        path: PathBuf,
    },
    /// The file was written by a newer berth.
    #[error(
        "state store {path} has schema version {found}; this berth knows up to {SCHEMA_VERSION} (was it written by a newer berth?)"
    )]
    TooNew {
        /// The store file.
        path: PathBuf,
        /// The version found.
        found: u64,
    },
}

/// The open store. Cheap to share behind an `Arc`. Dropping the last handle waits for the
/// writes already queued, then closes the file.
pub struct Store {
    // Field order: the commit thread is joined before the database handle goes.
    committer: commit::Committer,
    db: Arc<redb::Database>,
    path: PathBuf,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// One migration: from `version` to `version + 1`.
type Migration = fn(&redb::WriteTransaction) -> Result<(), redb::Error>;

/// Migrations in order; entry `i` takes the schema from version `i + 1` to `i + 2`. Version 1 is
/// the first schema, so there is none yet.
const MIGRATIONS: &[Migration] = &[];

impl Store {
    /// Opens (or creates) the store at `path` and brings its schema to [`SCHEMA_VERSION`]. The
    /// file holds volume secrets and mount flags: it is created with mode 0600 whatever the
    /// umask, and an existing file with another mode is set to 0600 first.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, StateError> {
        Self::open_with_hook(path, None)
    }

    /// [`Store::open`], calling `hook` in the commit thread at each [`CommitPoint`] (crash
    /// tests kill the process there).
    pub fn open_with_hook(
        path: impl Into<PathBuf>,
        hook: Option<CommitHook>,
    ) -> Result<Self, StateError> {
        let path = path.into();
        make_private(&path).map_err(|source| StateError::Private {
            path: path.clone(),
            source,
        })?;
        let db = redb::Builder::new()
            .set_cache_size(STORE_CACHE_BYTES)
            .create(&path)
            .map_err(|e| db_err(&path, "open", e))?;
        migrate(&db, &path)?;
        let db = Arc::new(db);
        let committer = commit::Committer::start(Arc::clone(&db), &path, hook)
            .map_err(|e| db_err(&path, "start the commit thread", redb::Error::Io(e)))?;
        Ok(Self {
            committer,
            db,
            path,
        })
    }

    /// Commits `batch` (all of it or none) and returns once it is durable, without holding
    /// the caller's thread: the commit thread may share the transaction with other batches.
    pub async fn commit(&self, batch: Batch) -> Result<Committed, StateError> {
        if batch.is_empty() {
            return Ok(Committed::default());
        }
        self.submit(batch).await
    }

    /// Returns once every deferred batch committed before the call is durable: at once when
    /// none is waiting, otherwise after one durable commit (its own, or one it shares with
    /// other writers). For writers whose next durable step is elsewhere (a fleet's etcd).
    pub async fn sync(&self) -> Result<(), StateError> {
        // An empty batch that is not deferred: the commit thread's sync.
        self.submit(Batch::new()).await.map(drop)
    }

    async fn submit(&self, batch: Batch) -> Result<Committed, StateError> {
        self.committer
            .submit(batch)
            .await
            .unwrap_or_else(|_| Err(self.committer.gone()))
    }

    /// [`Store::commit`] for synchronous callers: blocks this thread until the batch is
    /// durable (on a multi-thread runtime's worker, without stalling that worker's other
    /// tasks).
    pub fn commit_blocking(&self, batch: Batch) -> Result<Committed, StateError> {
        if batch.is_empty() {
            return Ok(Committed::default());
        }
        let wait = || {
            futures::executor::block_on(self.committer.submit(batch))
                .unwrap_or_else(|_| Err(self.committer.gone()))
        };
        // On a runtime's worker, the other tasks of this worker move to another one while
        // this thread waits for the commit.
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(wait)
            }
            _ => wait(),
        }
    }

    /// Transactions and batches committed since the store opened.
    pub fn commit_stats(&self) -> CommitStats {
        self.committer.stats()
    }

    /// The store file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The schema version in the file.
    pub fn schema_version(&self) -> Result<u64, StateError> {
        schema_version(&self.db, &self.path)
    }

    /// Writes `value` under `key`, replacing what was there. Durable when it returns.
    pub fn put<T: Serialize>(&self, table: Table, key: &str, value: &T) -> Result<(), StateError> {
        let mut b = Batch::new();
        b.put(table, key, value);
        self.commit_blocking(b).map(drop)
    }

    /// Writes every `(key, value)` into `table` in one transaction: all of them or none.
    /// Durable when it returns; one commit however many records.
    pub fn put_all<T: Serialize>(
        &self,
        table: Table,
        items: &[(&str, &T)],
    ) -> Result<(), StateError> {
        let mut b = Batch::new();
        for (key, value) in items {
            b.put(table, key, *value);
        }
        self.commit_blocking(b).map(drop)
    }

    /// Removes `key`; whether it was there. Durable when it returns.
    pub fn delete(&self, table: Table, key: &str) -> Result<bool, StateError> {
        let mut b = Batch::new();
        b.delete(table, key);
        Ok(self
            .commit_blocking(b)?
            .removed
            .first()
            .copied()
            .unwrap_or(false))
    }

    /// The record under `key`, if any.
    pub fn get<T: DeserializeOwned>(
        &self,
        table: Table,
        key: &str,
    ) -> Result<Option<T>, StateError> {
        let action = || format!("read {table}/{key}");
        let txn = self.db.begin_read().map_err(|e| self.err(&action(), e))?;
        let t = match txn.open_table(table.def()) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(self.err(&action(), e)),
        };
        let Some(v) = t.get(key).map_err(|e| self.err(&action(), e))? else {
            return Ok(None);
        };
        serde_json::from_slice(v.value())
            .map(Some)
            .map_err(|source| self.record_err(table, key, source))
    }

    /// Every record of `table`, in key order.
    pub fn list<T: DeserializeOwned>(&self, table: Table) -> Result<Vec<(String, T)>, StateError> {
        let action = || format!("list {table}");
        let txn = self.db.begin_read().map_err(|e| self.err(&action(), e))?;
        let t = match txn.open_table(table.def()) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(self.err(&action(), e)),
        };
        let mut out = Vec::new();
        for row in t.iter().map_err(|e| self.err(&action(), e))? {
            let (k, v) = row.map_err(|e| self.err(&action(), e))?;
            let key = k.value().to_string();
            let value = serde_json::from_slice(v.value())
                .map_err(|source| self.record_err(table, &key, source))?;
            out.push((key, value));
        }
        Ok(out)
    }

    /// Every key of `table`, in order, without reading the records.
    pub fn keys(&self, table: Table) -> Result<Vec<String>, StateError> {
        let action = || format!("list the keys of {table}");
        let txn = self.db.begin_read().map_err(|e| self.err(&action(), e))?;
        let t = match txn.open_table(table.def()) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(self.err(&action(), e)),
        };
        let mut out = Vec::new();
        for row in t.iter().map_err(|e| self.err(&action(), e))? {
            let (k, _) = row.map_err(|e| self.err(&action(), e))?;
            out.push(k.value().to_string());
        }
        Ok(out)
    }

    /// Every record of `table` whose key starts with `prefix`, in key order.
    pub fn list_prefix<T: DeserializeOwned>(
        &self,
        table: Table,
        prefix: &str,
    ) -> Result<Vec<(String, T)>, StateError> {
        let action = || format!("list {table}/{prefix}*");
        let txn = self.db.begin_read().map_err(|e| self.err(&action(), e))?;
        let t = match txn.open_table(table.def()) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(self.err(&action(), e)),
        };
        let mut out = Vec::new();
        for row in t.range(prefix..).map_err(|e| self.err(&action(), e))? {
            let (k, v) = row.map_err(|e| self.err(&action(), e))?;
            let key = k.value();
            if !key.starts_with(prefix) {
                break;
            }
            let key = key.to_string();
            let value = serde_json::from_slice(v.value())
                .map_err(|source| self.record_err(table, &key, source))?;
            out.push((key, value));
        }
        Ok(out)
    }

    fn err(&self, action: &str, e: impl Into<redb::Error>) -> StateError {
        db_err(&self.path, action, e)
    }

    fn record_err(&self, table: Table, key: &str, source: serde_json::Error) -> StateError {
        StateError::Record {
            path: self.path.clone(),
            table,
            key: key.to_string(),
            source,
        }
    }
}

fn schema_version(db: &redb::Database, path: &Path) -> Result<u64, StateError> {
    let err = |e: redb::Error| db_err(path, "read schema version", e);
    let txn = db.begin_read().map_err(|e| err(e.into()))?;
    let table = match txn.open_table(META) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
        Err(e) => return Err(err(e.into())),
    };
    let v = table.get(SCHEMA_KEY).map_err(|e| err(e.into()))?;
    match v {
        None => Ok(0),
        Some(g) => decode_version(g.value()).ok_or_else(|| StateError::BadSchema {
            path: path.to_path_buf(),
        }),
    }
}

fn migrate(db: &redb::Database, path: &Path) -> Result<(), StateError> {
    let found = schema_version(db, path)?;
    if found > SCHEMA_VERSION {
        return Err(StateError::TooNew {
            path: path.to_path_buf(),
            found,
        });
    }
    if found == SCHEMA_VERSION {
        return Ok(());
    }
    let err = |e: redb::Error| db_err(path, "migrate", e);
    let txn = db.begin_write().map_err(|e| err(e.into()))?;
    // 0 is a new file, created at the current schema; older files run each step, all in this
    // one transaction.
    if found > 0 {
        for (i, step) in MIGRATIONS.iter().enumerate().skip(found as usize - 1) {
            tracing::info!(path = %path.display(), from = i + 1, to = i + 2, "migrating state");
            step(&txn).map_err(err)?;
        }
    }
    {
        let mut meta = txn.open_table(META).map_err(|e| err(e.into()))?;
        meta.insert(SCHEMA_KEY, SCHEMA_VERSION.to_be_bytes().as_slice())
            .map_err(|e| err(e.into()))?;
    }
    txn.commit().map_err(|e| err(e.into()))?;
    Ok(())
}

/// Creates `path` (empty) with mode 0600 if it is missing, and sets an existing file to 0600.
fn make_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)?;
    // The umask may have narrowed a new file's mode; an old file may have any mode.
    if file.metadata()?.permissions().mode() & 0o7777 != 0o600 {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

fn db_err(path: &Path, action: &str, e: impl Into<redb::Error>) -> StateError {
    StateError::Db {
        path: path.to_path_buf(),
        action: action.to_string(),
        source: Box::new(e.into()),
    }
}

fn decode_version(bytes: &[u8]) -> Option<u64> {
    bytes.try_into().ok().map(u64::from_be_bytes)
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Rec {
        name: String,
        n: u32,
    }

    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn the_file_is_private_whether_new_or_old() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let s = Store::open(&path).unwrap();
        assert_eq!(mode(&path), 0o600, "a new store");
        s.put(Table::NODE, "id", &"n1").unwrap();
        drop(s);
        for wide in [0o644, 0o666, 0o4755, 0o400] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(wide)).unwrap();
            let s = Store::open(&path).unwrap();
            assert_eq!(mode(&path), 0o600, "a store that was {wide:o}");
            assert_eq!(
                s.get::<String>(Table::NODE, "id").unwrap().as_deref(),
                Some("n1")
            );
        }
    }

    #[test]
    fn a_store_that_cannot_be_created_names_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing").join("state.redb");
        let err = Store::open(&path).unwrap_err();
        assert!(matches!(err, StateError::Private { .. }), "{err:?}");
        assert!(err.to_string().contains("missing/state.redb"), "{err}");
        assert!(!path.exists());
    }

    #[test]
    fn put_all_writes_every_record_in_one_go_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let recs: Vec<Rec> = (0..5)
            .map(|n| Rec {
                name: format!("r{n}"),
                n,
            })
            .collect();
        {
            let s = Store::open(&path).unwrap();
            s.put(
                Table::ALLOCS,
                "r1",
                &Rec {
                    name: "old".into(),
                    n: 99,
                },
            )
            .unwrap();
            let items: Vec<(&str, &Rec)> = recs.iter().map(|r| (r.name.as_str(), r)).collect();
            s.put_all(Table::ALLOCS, &items).unwrap();
            s.put_all::<Rec>(Table::ALLOCS, &[]).unwrap();
        }
        let s = Store::open(&path).unwrap();
        let listed: Vec<(String, Rec)> = s.list(Table::ALLOCS).unwrap();
        let want: Vec<(String, Rec)> = recs.into_iter().map(|r| (r.name.clone(), r)).collect();
        assert_eq!(listed, want);
    }

    #[test]
    fn records_survive_reopen_and_delete_is_durable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        {
            let s = Store::open(&path).unwrap();
            assert_eq!(s.schema_version().unwrap(), SCHEMA_VERSION);
            s.put(
                Table::PLUGINS,
                "a/1",
                &Rec {
                    name: "a".into(),
                    n: 1,
                },
            )
            .unwrap();
            s.put(
                Table::PLUGINS,
                "b/1",
                &Rec {
                    name: "b".into(),
                    n: 2,
                },
            )
            .unwrap();
            s.put(
                Table::PLUGINS,
                "a/1",
                &Rec {
                    name: "a".into(),
                    n: 3,
                },
            )
            .unwrap();
            assert!(s.delete(Table::PLUGINS, "b/1").unwrap());
            assert!(!s.delete(Table::PLUGINS, "b/1").unwrap());
        }
        let s = Store::open(&path).unwrap();
        let all: Vec<(String, Rec)> = s.list(Table::PLUGINS).unwrap();
        assert_eq!(
            all,
            vec![(
                "a/1".to_string(),
                Rec {
                    name: "a".into(),
                    n: 3
                }
            )]
        );
        assert_eq!(s.get::<Rec>(Table::PLUGINS, "a/1").unwrap().unwrap().n, 3);
        assert!(s.get::<Rec>(Table::NODE, "x").unwrap().is_none());
        assert!(s.list::<Rec>(Table::NODE).unwrap().is_empty());
    }

    #[test]
    fn prefix_lists_only_matching_keys_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path().join("state.redb")).unwrap();
        assert!(
            s.list_prefix::<u32>(Table::USAGES, "p/")
                .unwrap()
                .is_empty()
        );
        for (k, n) in [
            ("p/b/x", 2),
            ("p/a/x", 1),
            ("p/a/y", 3),
            ("p/", 0),
            ("q/a", 9),
            ("o/a", 8),
        ] {
            s.put(Table::USAGES, k, &n).unwrap();
        }
        let keys = |prefix| -> Vec<(String, u32)> { s.list_prefix(Table::USAGES, prefix).unwrap() };
        assert_eq!(
            keys("p/a/"),
            vec![("p/a/x".to_string(), 1), ("p/a/y".to_string(), 3)]
        );
        assert_eq!(keys("p/").len(), 4);
        assert_eq!(keys("").len(), 6);
        assert!(keys("r").is_empty());
    }

    #[test]
    fn tables_added_later_open_empty_in_an_older_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        {
            // A store that only ever had the first tables written.
            let s = Store::open(&path).unwrap();
            s.put(Table::USAGES, "p/v/u", &1u32).unwrap();
        }
        let s = Store::open(&path).unwrap();
        let t = Table::VOLUMES;
        assert!(s.list::<u32>(t).unwrap().is_empty());
        assert!(s.get::<u32>(t, "v").unwrap().is_none());
        assert!(!s.delete(t, "v").unwrap());
        s.put(Table::VOLUMES, "vol-1", &7u32).unwrap();
        assert_eq!(s.get::<u32>(Table::VOLUMES, "vol-1").unwrap(), Some(7));
        assert_eq!(s.get::<u32>(Table::USAGES, "p/v/u").unwrap(), Some(1));
        assert_eq!(Table::VOLUMES.to_string(), "volumes");
    }

    #[test]
    fn a_newer_schema_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        {
            let db = redb::Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut meta = txn.open_table(META).unwrap();
                meta.insert(SCHEMA_KEY, 9u64.to_be_bytes().as_slice())
                    .unwrap();
            }
            txn.commit().unwrap();
        }
        let err = Store::open(&path).unwrap_err();
        assert!(matches!(err, StateError::TooNew { found: 9, .. }), "{err}");
        assert!(err.to_string().contains("newer berth"), "{err}");
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_read().unwrap();
        let meta = txn.open_table(META).unwrap();
        assert_eq!(
            decode_version(meta.get(SCHEMA_KEY).unwrap().unwrap().value()),
            Some(9)
        );
    }

    #[test]
    fn one_migration_per_version_step() {
        assert_eq!(MIGRATIONS.len() as u64, SCHEMA_VERSION - 1);
    }

    #[test]
    fn a_damaged_schema_record_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        {
            let db = redb::Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut meta = txn.open_table(META).unwrap();
                meta.insert(SCHEMA_KEY, b"x".as_slice()).unwrap();
            }
            txn.commit().unwrap();
        }
        let err = Store::open(&path).unwrap_err();
        assert!(matches!(err, StateError::BadSchema { .. }), "{err}");
    }

    #[test]
    fn a_bad_record_names_table_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path().join("state.redb")).unwrap();
        s.put(Table::PLUGINS, "x/1", &"not a record").unwrap();
        let err = s.list::<Rec>(Table::PLUGINS).unwrap_err();
        assert!(
            err.to_string().contains("plugins") && err.to_string().contains("x/1"),
            "{err}"
        );
    }
}
