//! DeleteVolume.

use berth_csi::pb;
use tonic::Status;

use crate::{
    caps, files,
    locks::volume_key,
    plugin::{Plugin, blocking},
};

impl Plugin {
    pub(super) async fn delete_volume(
        &self,
        req: &pb::DeleteVolumeRequest,
    ) -> Result<pb::DeleteVolumeResponse, Status> {
        let id = caps::id(&req.volume_id, "volume_id")?;
        let _guard = self.locks.lock(&[volume_key(id)]).await;
        if let Some(v) = self.store.read(|s| s.volumes.get(id).cloned()).await {
            if let Some(node) = v.published_nodes.keys().next() {
                return Err(Status::failed_precondition(format!(
                    "volume {id} is published to node {node}; unpublish it first"
                )));
            }
            if let Some(m) = self.volume_mounts(id)?.first() {
                return Err(Status::failed_precondition(format!(
                    "volume {id} is still mounted at {}; unpublish and unstage it first",
                    m.mount_point.display()
                )));
            }
            self.store
                .update(|s| {
                    s.volumes.remove(id);
                    Ok::<_, Status>(())
                })
                .await?;
            tracing::info!(volume_id = %id, "deleted volume");
        }
        let (dir, name) = (self.volumes_dir.clone(), self.entry_name(id));
        blocking(move || files::delete_tree(&dir, &name)).await?;
        Ok(pb::DeleteVolumeResponse {})
    }
}
