//! Snapshots through the volume's controller plugin.

use super::*;

impl Volumes {
    /// `POST /v1/volume/csi/{id}/snapshot`.
    pub async fn create_snapshot(
        &self,
        id: &str,
        req: SnapshotCreateRequest,
    ) -> Result<SnapshotView, ApiError> {
        let secrets = req.secrets.map(|s| Secrets::new(s.0));
        let (vol, snap) = self
            .cp
            .create_snapshot(id, &req.name, &req.parameters, secrets.as_ref())
            .await
            .map_err(cp_error)?;
        Ok(snapshot_view(&vol.plugin_id, snap, Some(vol.id)))
    }

    /// `POST /v1/volumes/snapshot/delete`.
    pub async fn delete_snapshot(&self, req: SnapshotDeleteRequest) -> Result<(), ApiError> {
        self.cp
            .delete_snapshot(
                &req.plugin_id,
                &req.snapshot_id,
                &Secrets::new(req.secrets.0),
            )
            .await
            .map_err(cp_error)
    }

    /// `GET /v1/volumes/snapshots`.
    pub async fn list_snapshots(&self, plugin_id: &str) -> Result<SnapshotList, ApiError> {
        let snaps = self.cp.list_snapshots(plugin_id).await.map_err(cp_error)?;
        let by_external: HashMap<String, String> = self
            .cp
            .list()
            .map_err(cp_error)?
            .into_iter()
            .filter(|v| v.plugin_id == plugin_id)
            .map(|v| (v.external_id.as_str().to_string(), v.id))
            .collect();
        Ok(SnapshotList {
            snapshots: snaps
                .into_iter()
                .map(|s| {
                    let vol = by_external.get(&s.source_external_id).cloned();
                    snapshot_view(plugin_id, s, vol)
                })
                .collect(),
        })
    }
}

pub(super) fn snapshot_view(
    plugin_id: &str,
    s: berth_csi::model::Snapshot,
    source_volume_id: Option<String>,
) -> SnapshotView {
    SnapshotView {
        snapshot_id: s.snapshot_id,
        plugin_id: plugin_id.to_string(),
        source_external_id: s.source_external_id,
        source_volume_id,
        size_bytes: s.size_bytes,
        creation_time: s.creation_time,
        ready_to_use: s.ready_to_use,
    }
}
