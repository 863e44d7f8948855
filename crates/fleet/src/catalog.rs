//! The volume catalog of a fleet: one etcd key per volume (`<prefix>/volumes/<id>`, its
//! claims inside), never on a lease (a partitioned node may still hold the mount), changed only
//! by transactions that compare the `mod_revision` the writer read.

use std::sync::Arc;

use berth_controlplane::{
    ControlPlaneError, VolumeRecord,
    backend::{BoxFuture, CatalogBackend, Version, Written},
};

use crate::{
    cache::WatchedDir,
    etcd::{Etcd, Fence, FleetError, Outcome},
    nodes::Membership,
};

/// The catalog in etcd, mirrored by a watch for reads. Every write is fenced by this node's
/// registration: a node whose lease lapsed changes nothing until it has registered again.
#[derive(Debug, Clone)]
pub struct EtcdCatalog {
    etcd: Etcd,
    volumes: Arc<WatchedDir<VolumeRecord>>,
    membership: Arc<Membership>,
}

fn backend(e: FleetError) -> ControlPlaneError {
    ControlPlaneError::Backend(e.to_string())
}

impl EtcdCatalog {
    /// The catalog over `etcd`; reads come from `volumes`, the mirror of `<prefix>/volumes/`
    /// (run by the caller).
    pub fn new(
        etcd: Etcd,
        volumes: Arc<WatchedDir<VolumeRecord>>,
        membership: Arc<Membership>,
    ) -> Self {
        Self {
            etcd,
            volumes,
            membership,
        }
    }

    fn fence(&self) -> Result<Fence, ControlPlaneError> {
        self.membership.fence().ok_or_else(|| {
            ControlPlaneError::Backend(
                "this node is not registered with the fleet (its lease lapsed or etcd is out of reach); nothing was changed".into(),
            )
        })
    }

    fn written(
        &self,
        id: &str,
        rec: Option<&VolumeRecord>,
        fence: &Fence,
        o: Outcome,
    ) -> Result<Written, ControlPlaneError> {
        match o {
            Outcome::Done(revision) => {
                self.volumes.note(id, rec.cloned(), revision);
                Ok(Written::Done(revision))
            }
            Outcome::Changed => Ok(Written::Changed),
            Outcome::Fenced => {
                self.membership.lapsed(fence);
                Err(ControlPlaneError::Backend(
                    "this node's fleet registration lapsed; nothing was changed".into(),
                ))
            }
        }
    }

    /// The directory the mirror must watch.
    pub fn dir(etcd: &Etcd) -> String {
        etcd.dir("volumes")
    }

    fn key(&self, id: &str) -> String {
        self.etcd.key(&["volumes", id])
    }
}

impl CatalogBackend for EtcdCatalog {
    fn load<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<(VolumeRecord, Version)>, ControlPlaneError>> {
        Box::pin(async move {
            let got = self
                .etcd
                .get::<VolumeRecord>(&self.key(id))
                .await
                .map_err(backend)?;
            Ok(got.map(|v| (v.value, v.mod_revision)))
        })
    }

    fn store<'a>(
        &'a self,
        rec: &'a VolumeRecord,
        version: Version,
    ) -> BoxFuture<'a, Result<Written, ControlPlaneError>> {
        Box::pin(async move {
            let fence = self.fence()?;
            let o = self
                .etcd
                .put_if(&self.key(&rec.id), rec, version, Some(&fence))
                .await
                .map_err(backend)?;
            self.written(&rec.id, Some(rec), &fence, o)
        })
    }

    fn remove<'a>(
        &'a self,
        id: &'a str,
        version: Version,
    ) -> BoxFuture<'a, Result<Written, ControlPlaneError>> {
        Box::pin(async move {
            let fence = self.fence()?;
            let o = self
                .etcd
                .delete_if(&self.key(id), version, Some(&fence))
                .await
                .map_err(backend)?;
            self.written(id, None, &fence, o)
        })
    }

    fn cached(&self, id: &str) -> Result<Option<VolumeRecord>, ControlPlaneError> {
        Ok(self.volumes.get(id))
    }

    fn cached_versioned(&self, id: &str) -> Option<(VolumeRecord, Version)> {
        self.volumes
            .get_versioned(id)
            .map(|v| (v.value, v.mod_revision))
    }

    fn list(&self) -> Result<Vec<VolumeRecord>, ControlPlaneError> {
        Ok(self.volumes.all().into_iter().map(|(_, v)| v).collect())
    }
}
