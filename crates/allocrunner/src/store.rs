//! Where alloc records are persisted: behind [`AllocStore`], in the agent's store
//! ([`StateAllocStore`]) or in memory ([`MemoryAllocStore`], for tests).

use std::{
    collections::BTreeMap,
    fmt,
    sync::{Arc, Mutex, MutexGuard},
};

use berth_state::{StateError, Store, Table};

use crate::record::AllocRecord;

/// A record could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum AllocStoreError {
    /// The agent's store failed (the error names the file, table and key).
    #[error(transparent)]
    State(#[from] StateError),
    /// Another store failed.
    #[error("alloc {alloc_id}: {message}")]
    Other {
        /// The alloc.
        alloc_id: String,
        /// What went wrong.
        message: String,
    },
}

/// Persists alloc records, keyed by alloc id. Every `put` is durable when it returns and
/// replaces the whole record (never a torn one).
pub trait AllocStore: Send + Sync + fmt::Debug {
    /// Writes `record` under its alloc id.
    fn put(&self, record: &AllocRecord) -> Result<(), AllocStoreError>;
    /// Writes every record: all or none where the store allows it (the agent's store does, in
    /// one commit); the default writes them one by one.
    fn put_all(&self, records: &[AllocRecord]) -> Result<(), AllocStoreError> {
        records.iter().try_for_each(|r| self.put(r))
    }
    /// The record of `alloc_id`, if any.
    fn get(&self, alloc_id: &str) -> Result<Option<AllocRecord>, AllocStoreError>;
    /// Every record, in alloc id order.
    fn list(&self) -> Result<Vec<AllocRecord>, AllocStoreError>;
    /// Removes the record of `alloc_id`; whether there was one.
    fn delete(&self, alloc_id: &str) -> Result<bool, AllocStoreError>;
}

/// Records in the agent's store, table [`Table::ALLOCS`].
#[derive(Debug, Clone)]
pub struct StateAllocStore {
    store: Arc<Store>,
}

impl StateAllocStore {
    /// Records in `store`.
    pub fn new(store: Arc<Store>) -> Self {
        Self { store }
    }
}

impl AllocStore for StateAllocStore {
    fn put(&self, record: &AllocRecord) -> Result<(), AllocStoreError> {
        Ok(self.store.put(Table::ALLOCS, &record.alloc_id, record)?)
    }

    fn put_all(&self, records: &[AllocRecord]) -> Result<(), AllocStoreError> {
        let items: Vec<(&str, &AllocRecord)> =
            records.iter().map(|r| (r.alloc_id.as_str(), r)).collect();
        Ok(self.store.put_all(Table::ALLOCS, &items)?)
    }

    fn get(&self, alloc_id: &str) -> Result<Option<AllocRecord>, AllocStoreError> {
        Ok(self.store.get(Table::ALLOCS, alloc_id)?)
    }

    fn list(&self) -> Result<Vec<AllocRecord>, AllocStoreError> {
        Ok(self
            .store
            .list(Table::ALLOCS)?
            .into_iter()
            .map(|(_, r)| r)
            .collect())
    }

    fn delete(&self, alloc_id: &str) -> Result<bool, AllocStoreError> {
        Ok(self.store.delete(Table::ALLOCS, alloc_id)?)
    }
}

/// Records in memory. Counts writes, and can be told to fail the next writes.
#[derive(Debug, Default)]
pub struct MemoryAllocStore {
    inner: Mutex<MemoryInner>,
}

#[derive(Debug, Default)]
struct MemoryInner {
    records: BTreeMap<String, AllocRecord>,
    puts: u64,
    fail_puts: u32,
}

impl MemoryAllocStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, MemoryInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many records were written so far.
    pub fn puts(&self) -> u64 {
        self.lock().puts
    }

    /// Makes the next `n` writes fail (they change nothing).
    pub fn fail_next_puts(&self, n: u32) {
        self.lock().fail_puts = n;
    }
}

impl AllocStore for MemoryAllocStore {
    fn put(&self, record: &AllocRecord) -> Result<(), AllocStoreError> {
        let mut inner = self.lock();
        if inner.fail_puts > 0 {
            inner.fail_puts -= 1;
            return Err(AllocStoreError::Other {
                alloc_id: record.alloc_id.clone(),
                message: "write refused (injected failure)".into(),
            });
        }
        inner.puts += 1;
        inner
            .records
            .insert(record.alloc_id.clone(), record.clone());
        Ok(())
    }

    fn get(&self, alloc_id: &str) -> Result<Option<AllocRecord>, AllocStoreError> {
        Ok(self.lock().records.get(alloc_id).cloned())
    }

    fn list(&self) -> Result<Vec<AllocRecord>, AllocStoreError> {
        Ok(self.lock().records.values().cloned().collect())
    }

    fn delete(&self, alloc_id: &str) -> Result<bool, AllocStoreError> {
        Ok(self.lock().records.remove(alloc_id).is_some())
    }
}

#[cfg(test)]
mod tests {
    use berth_job::JobSpec;

    use super::*;
    use crate::record::AllocSpec;

    fn record(id: &str) -> AllocRecord {
        let job = JobSpec::parse_hcl(
            std::path::Path::new("j.hcl"),
            "job \"j\" {\n group \"g\" {\n task \"t\" {\n driver = \"raw_exec\"\n config { command = \"true\" }\n }\n }\n}\n",
        )
        .expect("job");
        AllocRecord::new(&AllocSpec::from_job(&job, "g", id, 0).expect("spec"))
    }

    fn round_trip(store: &dyn AllocStore) {
        assert_eq!(store.get("a").expect("get"), None);
        store.put(&record("b")).expect("put b");
        let mut a = record("a");
        store.put(&a).expect("put a");
        a.index = 7;
        store.put(&a).expect("put a again");
        assert_eq!(store.get("a").expect("get"), Some(a.clone()));
        let ids: Vec<_> = store
            .list()
            .expect("list")
            .into_iter()
            .map(|r| r.alloc_id)
            .collect();
        assert_eq!(ids, ["a", "b"]);
        assert!(store.delete("a").expect("delete"));
        assert!(!store.delete("a").expect("delete again"));
        assert_eq!(store.get("a").expect("get"), None);
    }

    #[test]
    fn memory_store_round_trips_and_fails_on_demand() {
        let store = MemoryAllocStore::new();
        round_trip(&store);
        store.fail_next_puts(1);
        assert!(store.put(&record("c")).is_err());
        store.put(&record("c")).expect("put after the failure");
        assert_eq!(store.puts(), 4);
    }

    #[test]
    fn state_store_round_trips_through_redb() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.redb");
        {
            let store = StateAllocStore::new(Arc::new(Store::open(&path).expect("open")));
            round_trip(&store);
            store.put(&record("kept")).expect("put");
        }
        let store = StateAllocStore::new(Arc::new(Store::open(&path).expect("reopen")));
        assert_eq!(
            store.get("kept").expect("get").map(|r| r.alloc_id),
            Some("kept".to_owned())
        );
    }
}
