//! Where the catalog's volume records live: the agent's store (one node) or etcd (a fleet).
//!
//! Every change of a record is a conditional write against the version that was read, so two
//! writers that race (two agents claiming one volume) cannot both win: the loser reads again
//! and decides again.

use std::{future::Future, pin::Pin, sync::Arc};

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
#[derive(Debug, Clone)]
pub struct StoreCatalog {
    store: Arc<Store>,
}

impl StoreCatalog {
    /// The catalog in `store`'s volumes table.
    pub fn new(store: Arc<Store>) -> Self {
        Self { store }
    }
}

impl StoreCatalog {
    async fn put(&self, rec: &VolumeRecord, deferred: bool) -> Result<Written, ControlPlaneError> {
        let mut b = Batch::new();
        b.put(Table::VOLUMES, &rec.id, rec);
        if deferred {
            b.deferred();
        }
        self.store.commit(b).await?;
        Ok(Written::Done(0))
    }
}

impl CatalogBackend for StoreCatalog {
    fn load<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<(VolumeRecord, Version)>, ControlPlaneError>> {
        Box::pin(async move {
            Ok(self
                .store
                .get::<VolumeRecord>(Table::VOLUMES, id)?
                .map(|r| (r, 0)))
        })
    }

    fn store<'a>(
        &'a self,
        rec: &'a VolumeRecord,
        _version: Version,
    ) -> BoxFuture<'a, Result<Written, ControlPlaneError>> {
        Box::pin(self.put(rec, false))
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
            self.store.commit(b).await?;
            Ok(Written::Done(0))
        })
    }

    fn cached(&self, id: &str) -> Result<Option<VolumeRecord>, ControlPlaneError> {
        Ok(self.store.get(Table::VOLUMES, id)?)
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
