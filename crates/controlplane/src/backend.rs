//! Where the catalog's volume records live: the agent's store (one node) or etcd (a fleet).
//!
//! Every change of a record is a conditional write against the version that was read, so two
//! writers that race (two agents claiming one volume) cannot both win: the loser reads again
//! and decides again.

use std::{collections::HashMap, future::Future, pin::Pin, sync::Arc};

use berth_state::{Batch, Store, Table};

use crate::{ControlPlaneError, catalog::VolumeRecord};

/// A boxed future, so a backend can be chosen at start (`dyn CatalogBackend`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The version a conditional write compares (etcd's `mod_revision`; 0: absent).
pub type Version = i64;

/// The outcome of a conditional write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Written; the record's new version.
    Done(Version),
    /// The record changed (or appeared, or vanished) since it was read; nothing was written.
    Changed,
}

/// Storage of volume records.
///
/// Callers serialize their own changes of one volume (the control plane holds a per-volume
/// lock); the conditional writes are what keeps writers in other processes apart.
pub trait CatalogBackend: Send + Sync + std::fmt::Debug + 'static {
    /// The record as stored now, with its version.
    fn load<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<(VolumeRecord, Version)>, ControlPlaneError>>;
    /// Writes `rec` when the stored version is still `version` (0: when there is none).
    fn store<'a>(
        &'a self,
        rec: &'a VolumeRecord,
        version: Version,
    ) -> BoxFuture<'a, Result<Written, ControlPlaneError>>;
    /// Whether [`CatalogBackend::store_deferred`] answers before the write is durable (and so
    /// costs less than [`CatalogBackend::store`]). Without it (the default), the control plane
    /// writes no deferred result on its own: it keeps it in memory, and the volume's next
    /// write carries it.
    fn defers_writes(&self) -> bool {
        false
    }
    /// [`CatalogBackend::store`] of a result that a crash may lose, because the intent written
    /// before it is redone idempotently at recovery: a backend may answer before it is durable,
    /// as long as its next durable write makes it durable too. The default is `store`.
    fn store_deferred<'a>(
        &'a self,
        rec: &'a VolumeRecord,
        version: Version,
    ) -> BoxFuture<'a, Result<Written, ControlPlaneError>> {
        self.store(rec, version)
    }
    /// Removes the record when its version is still `version`.
    fn remove<'a>(
        &'a self,
        id: &'a str,
        version: Version,
    ) -> BoxFuture<'a, Result<Written, ControlPlaneError>>;
    /// The record as last seen by this process (a fleet's view may trail another node's
    /// write by one watch event; decisions are taken on [`CatalogBackend::load`]).
    fn cached(&self, id: &str) -> Result<Option<VolumeRecord>, ControlPlaneError>;
    /// Every record as last seen, by id.
    fn list(&self) -> Result<Vec<VolumeRecord>, ControlPlaneError>;
    /// The record as last seen with the version it had then, when reading it costs a round
    /// trip that this view can save: a first guess for a conditional write, which finds out
    /// when the guess is stale. `None` (the default): always [`CatalogBackend::load`].
    fn cached_versioned(&self, _id: &str) -> Option<(VolumeRecord, Version)> {
        None
    }
}

/// The catalog in the agent's own store: one writer (this agent), so the version is always 0
/// and a write never finds the record changed by someone else.
///
/// Records read are kept decoded in memory, and every write of this catalog updates that copy
/// once its commit has answered: a claim reads its volume's record several times, and decoding
/// it from the store each time cost more than the rest of the catalog's work. Nothing else
/// writes the volumes table, so the copy is always the stored record.
#[derive(Clone)]
pub struct StoreCatalog {
    store: Arc<Store>,
    seen: Arc<std::sync::Mutex<Seen>>,
}

impl std::fmt::Debug for StoreCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The records stay out: they are the catalog's data, not its state.
        f.debug_struct("StoreCatalog")
            .field("store", &self.store)
            .field("records_kept", &self.seen().records.len())
            .finish()
    }
}

impl StoreCatalog {
    /// The catalog in `store`'s volumes table.
    pub fn new(store: Arc<Store>) -> Self {
        Self {
            store,
            seen: Arc::default(),
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The record, from memory when it was read or written before.
    fn get(&self, id: &str) -> Result<Option<VolumeRecord>, ControlPlaneError> {
        let writes = {
            let seen = self.seen();
            if let Some(known) = seen.records.get(id) {
                return Ok(Some(known.clone()));
            }
            seen.writes
        };
        let rec: Option<VolumeRecord> = self.store.get(Table::VOLUMES, id)?;
        let mut seen = self.seen();
        // A write that answered since may have changed what was read: then it is not kept.
        if let Some(r) = &rec
            && seen.writes == writes
        {
            seen.records.insert(id.to_string(), r.clone());
        }
        Ok(rec)
    }

    async fn put(&self, rec: &VolumeRecord, deferred: bool) -> Result<Written, ControlPlaneError> {
        let mut b = Batch::new();
        b.put(Table::VOLUMES, &rec.id, rec);
        if deferred {
            b.deferred();
        }
        let written = self.store.commit(b).await;
        // When it failed, whether the store holds it is not known: the next read asks.
        self.seen()
            .wrote(&rec.id, written.as_ref().ok().map(|_| rec.clone()));
        written?;
        Ok(Written::Done(0))
    }
}

/// [`StoreCatalog`]'s decoded records.
#[derive(Default)]
struct Seen {
    /// By id; absent ones are not kept (ids asked for need not exist).
    records: HashMap<String, VolumeRecord>,
    /// Writes answered so far: a read from the store is kept only when none answered while
    /// it ran.
    writes: u64,
}

impl Seen {
    /// After a write of `id` answered: `rec` is what the store holds now (`None`: nothing, or
    /// not known).
    fn wrote(&mut self, id: &str, rec: Option<VolumeRecord>) {
        self.writes += 1;
        match rec {
            Some(r) => self.records.insert(id.to_string(), r),
            None => self.records.remove(id),
        };
    }
}

impl CatalogBackend for StoreCatalog {
    fn load<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<(VolumeRecord, Version)>, ControlPlaneError>> {
        Box::pin(async move { Ok(self.get(id)?.map(|r| (r, 0))) })
    }

    fn store<'a>(
        &'a self,
        rec: &'a VolumeRecord,
        _version: Version,
    ) -> BoxFuture<'a, Result<Written, ControlPlaneError>> {
        Box::pin(self.put(rec, false))
    }

    fn defers_writes(&self) -> bool {
        true
    }

    fn store_deferred<'a>(
        &'a self,
        rec: &'a VolumeRecord,
        _version: Version,
    ) -> BoxFuture<'a, Result<Written, ControlPlaneError>> {
        Box::pin(self.put(rec, true))
    }

    fn remove<'a>(
        &'a self,
        id: &'a str,
        _version: Version,
    ) -> BoxFuture<'a, Result<Written, ControlPlaneError>> {
        Box::pin(async move {
            let mut b = Batch::new();
            b.delete(Table::VOLUMES, id);
            let removed = self.store.commit(b).await;
            self.seen().wrote(id, None);
            removed?;
            Ok(Written::Done(0))
        })
    }

    fn cached(&self, id: &str) -> Result<Option<VolumeRecord>, ControlPlaneError> {
        self.get(id)
    }

    fn list(&self) -> Result<Vec<VolumeRecord>, ControlPlaneError> {
        Ok(self
            .store
            .list::<VolumeRecord>(Table::VOLUMES)?
            .into_iter()
            .map(|(_, v)| v)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use berth_csi::model::AccessMode;

    use super::*;
    use crate::placement::tests::volume;

    #[tokio::test]
    async fn the_kept_copy_follows_every_write_and_absent_ids_are_not_kept() {
        let tmp = tempfile::tempdir().expect("tmp");
        let store = Arc::new(Store::open(tmp.path().join("state.redb")).expect("store"));
        let catalog = StoreCatalog::new(Arc::clone(&store));
        let stored = |id: &str| store.get::<VolumeRecord>(Table::VOLUMES, id).expect("read");
        // Written before the catalog saw it: read from the store, then kept.
        let v1 = volume("v1", AccessMode::SingleNodeWriter);
        store.put(Table::VOLUMES, "v1", &v1).expect("put");
        assert_eq!(catalog.cached("v1").expect("cached"), Some(v1.clone()));
        assert!(catalog.seen().records.contains_key("v1"));
        let shown = format!("{catalog:?}");
        assert!(
            shown.contains("records_kept: 1") && !shown.contains("ext-v1"),
            "{shown}"
        );
        assert_eq!(catalog.cached("nope").expect("cached"), None);
        assert!(!catalog.seen().records.contains_key("nope"));

        let mut v2 = v1.clone();
        v2.capacity_bytes = 7;
        catalog.store(&v2, 0).await.expect("store");
        assert_eq!(catalog.cached("v1").expect("cached"), Some(v2.clone()));
        assert_eq!(stored("v1"), Some(v2.clone()));
        v2.capacity_bytes = 8;
        catalog.store_deferred(&v2, 0).await.expect("store");
        assert_eq!(
            catalog.load("v1").await.expect("load"),
            Some((v2.clone(), 0))
        );
        assert_eq!(stored("v1"), Some(v2));

        catalog.remove("v1", 0).await.expect("remove");
        assert_eq!(catalog.cached("v1").expect("cached"), None);
        assert_eq!(catalog.load("v1").await.expect("load"), None);
        assert_eq!(stored("v1"), None);
        assert!(catalog.seen().records.is_empty());
    }
}
