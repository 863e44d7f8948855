//! The controller RPCs the control plane makes, behind one trait: served by a plugin socket on
//! this node ([`berth_csi::CsiClient`]) or, in a fleet, by the controller of another node.

use std::collections::BTreeMap;

use berth_csi::{
    CapacityRange, ControllerPublish, CreateVolume, CsiClient, CsiError, Page, Validation,
    model::{ExternalId, Secrets, Snapshot, Volume, VolumeCapability},
};

use crate::backend::BoxFuture;

/// The controller service of one plugin instance, wherever it runs. Every method has the
/// meaning, retries and errors of the [`CsiClient`] method of the same name.
pub trait ControllerRpc: Send + Sync + std::fmt::Debug + 'static {
    /// CreateVolume.
    fn create_volume<'a>(
        &'a self,
        req: &'a CreateVolume,
    ) -> BoxFuture<'a, Result<Volume, CsiError>>;
    /// ValidateVolumeCapabilities.
    fn validate_capabilities<'a>(
        &'a self,
        id: &'a ExternalId,
        capabilities: &'a [VolumeCapability],
        volume_context: &'a BTreeMap<String, String>,
        parameters: &'a BTreeMap<String, String>,
        secrets: &'a Secrets,
    ) -> BoxFuture<'a, Result<Validation, CsiError>>;
    /// DeleteVolume.
    fn delete_volume<'a>(
        &'a self,
        id: &'a ExternalId,
        secrets: &'a Secrets,
    ) -> BoxFuture<'a, Result<(), CsiError>>;
    /// ControllerExpandVolume: the new size and whether the node must expand too.
    fn controller_expand<'a>(
        &'a self,
        id: &'a ExternalId,
        capacity: CapacityRange,
        capability: Option<&'a VolumeCapability>,
        secrets: &'a Secrets,
    ) -> BoxFuture<'a, Result<(i64, bool), CsiError>>;
    /// CreateSnapshot.
    fn create_snapshot<'a>(
        &'a self,
        source: &'a ExternalId,
        name: &'a str,
        parameters: &'a BTreeMap<String, String>,
        secrets: &'a Secrets,
    ) -> BoxFuture<'a, Result<Snapshot, CsiError>>;
    /// DeleteSnapshot.
    fn delete_snapshot<'a>(
        &'a self,
        snapshot_id: &'a str,
        secrets: &'a Secrets,
    ) -> BoxFuture<'a, Result<(), CsiError>>;
    /// ListSnapshots, one page.
    fn list_snapshots<'a>(
        &'a self,
        source: Option<&'a ExternalId>,
        snapshot_id: Option<&'a str>,
        max_entries: i32,
        starting_token: &'a str,
        secrets: &'a Secrets,
    ) -> BoxFuture<'a, Result<Page<Snapshot>, CsiError>>;
    /// ControllerPublishVolume: the publish context.
    fn controller_publish<'a>(
        &'a self,
        req: &'a ControllerPublish,
    ) -> BoxFuture<'a, Result<BTreeMap<String, String>, CsiError>>;
    /// ControllerUnpublishVolume.
    fn controller_unpublish<'a>(
        &'a self,
        id: &'a ExternalId,
        node_id: &'a str,
        secrets: &'a Secrets,
    ) -> BoxFuture<'a, Result<(), CsiError>>;
}

impl ControllerRpc for CsiClient {
    fn create_volume<'a>(
        &'a self,
        req: &'a CreateVolume,
    ) -> BoxFuture<'a, Result<Volume, CsiError>> {
        Box::pin(CsiClient::create_volume(self, req))
    }

    fn validate_capabilities<'a>(
        &'a self,
        id: &'a ExternalId,
        capabilities: &'a [VolumeCapability],
        volume_context: &'a BTreeMap<String, String>,
        parameters: &'a BTreeMap<String, String>,
        secrets: &'a Secrets,
    ) -> BoxFuture<'a, Result<Validation, CsiError>> {
        Box::pin(CsiClient::validate_capabilities(
            self,
            id,
            capabilities,
            volume_context,
            parameters,
            secrets,
        ))
    }

    fn delete_volume<'a>(
        &'a self,
        id: &'a ExternalId,
        secrets: &'a Secrets,
    ) -> BoxFuture<'a, Result<(), CsiError>> {
        Box::pin(CsiClient::delete_volume(self, id, secrets))
    }

    fn controller_expand<'a>(
        &'a self,
        id: &'a ExternalId,
        capacity: CapacityRange,
        capability: Option<&'a VolumeCapability>,
        secrets: &'a Secrets,
    ) -> BoxFuture<'a, Result<(i64, bool), CsiError>> {
        Box::pin(CsiClient::controller_expand(
            self, id, capacity, capability, secrets,
        ))
    }

    fn create_snapshot<'a>(
        &'a self,
        source: &'a ExternalId,
        name: &'a str,
        parameters: &'a BTreeMap<String, String>,
        secrets: &'a Secrets,
    ) -> BoxFuture<'a, Result<Snapshot, CsiError>> {
        Box::pin(CsiClient::create_snapshot(
            self, source, name, parameters, secrets,
        ))
    }

    fn delete_snapshot<'a>(
        &'a self,
        snapshot_id: &'a str,
        secrets: &'a Secrets,
    ) -> BoxFuture<'a, Result<(), CsiError>> {
        Box::pin(CsiClient::delete_snapshot(self, snapshot_id, secrets))
    }

    fn list_snapshots<'a>(
        &'a self,
        source: Option<&'a ExternalId>,
        snapshot_id: Option<&'a str>,
        max_entries: i32,
        starting_token: &'a str,
        secrets: &'a Secrets,
    ) -> BoxFuture<'a, Result<Page<Snapshot>, CsiError>> {
        Box::pin(CsiClient::list_snapshots(
            self,
            source,
            snapshot_id,
            max_entries,
            starting_token,
            secrets,
        ))
    }

    fn controller_publish<'a>(
        &'a self,
        req: &'a ControllerPublish,
    ) -> BoxFuture<'a, Result<BTreeMap<String, String>, CsiError>> {
        Box::pin(CsiClient::controller_publish(self, req))
    }

    fn controller_unpublish<'a>(
        &'a self,
        id: &'a ExternalId,
        node_id: &'a str,
        secrets: &'a Secrets,
    ) -> BoxFuture<'a, Result<(), CsiError>> {
        Box::pin(CsiClient::controller_unpublish(self, id, node_id, secrets))
    }
}
