//! [`Journal`]: an append-only, bounded log of opaque records keyed by a rising index, in a
//! redb file of its own (so its commits never wait on the main store's writers, nor they on
//! it).

use std::path::{Path, PathBuf};

use redb::{ReadableDatabase as _, ReadableTable as _, TableDefinition};

use crate::{StateError, db_err, make_private};

const ENTRIES: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("entries");

/// The journal file. Every [`Journal::append`] is one durable transaction: after a crash the
/// file holds a batch wholly or not at all, and indexes never go back.
pub struct Journal {
    db: redb::Database,
    path: PathBuf,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Journal {
    /// Opens (or creates, mode 0600) the journal at `path`.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, StateError> {
        let path = path.into();
        make_private(&path).map_err(|source| StateError::Private {
            path: path.clone(),
            source,
        })?;
        let db = redb::Builder::new()
            .set_cache_size(crate::JOURNAL_CACHE_BYTES)
            .create(&path)
            .map_err(|e| db_err(&path, "open", e))?;
        Ok(Self { db, path })
    }

    /// The journal file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every entry, oldest first.
    pub fn load(&self) -> Result<Vec<(u64, Vec<u8>)>, StateError> {
        let action = "read the journal";
        let txn = self
            .db
            .begin_read()
            .map_err(|e| db_err(&self.path, action, e))?;
        let t = match txn.open_table(ENTRIES) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(db_err(&self.path, action, e)),
        };
        let mut out = Vec::new();
        for row in t.iter().map_err(|e| db_err(&self.path, action, e))? {
            let (k, v) = row.map_err(|e| db_err(&self.path, action, e))?;
            out.push((k.value(), v.value().to_vec()));
        }
        Ok(out)
    }

    /// Adds `entries` and drops every entry below `keep_from`, in one durable transaction.
    pub fn append(&self, entries: &[(u64, &[u8])], keep_from: u64) -> Result<(), StateError> {
        let action = || format!("append {} entries to the journal", entries.len());
        let txn = self
            .db
            .begin_write()
            .map_err(|e| db_err(&self.path, &action(), e))?;
        {
            let mut t = txn
                .open_table(ENTRIES)
                .map_err(|e| db_err(&self.path, &action(), e))?;
            for (index, bytes) in entries {
                t.insert(*index, *bytes)
                    .map_err(|e| db_err(&self.path, &action(), e))?;
            }
            t.retain_in(..keep_from, |_, _| false)
                .map_err(|e| db_err(&self.path, &action(), e))?;
        }
        txn.commit().map_err(|e| db_err(&self.path, &action(), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_survive_reopen_and_old_ones_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.redb");
        let j = Journal::open(&path).unwrap();
        assert!(j.load().unwrap().is_empty());
        j.append(&[(1, b"a".as_slice()), (2, b"b")], 0).unwrap();
        j.append(&[(3, b"c".as_slice())], 2).unwrap();
        drop(j);
        let j = Journal::open(&path).unwrap();
        assert_eq!(
            j.load().unwrap(),
            vec![(2, b"b".to_vec()), (3, b"c".to_vec())]
        );
    }
}
