//! DeleteVolume.

use berth_csi::pb;
use tonic::Status;

use crate::{
    caps, files,
    locks::volume_key,
    plugin::{Plugin, blocking},
    state::VolumeRecord,
};

/// `FAILED_PRECONDITION` if volume `v` is controller-published to a node.
fn require_unpublished(v: &VolumeRecord) -> Result<(), Status> {
    match v.published_nodes.keys().next() {
        None => Ok(()),
        Some(node) => Err(Status::failed_precondition(format!(
            "volume {} is published to node {node}; unpublish it first",
            v.id
        ))),
    }
}

impl Plugin {
    pub(super) async fn delete_volume(
        &self,
        req: &pb::DeleteVolumeRequest,
    ) -> Result<pb::DeleteVolumeResponse, Status> {
        let id = caps::id(&req.volume_id, "volume_id")?;
        let _guard = self.locks.lock(&[volume_key(id)]).await;
        if let Some(v) = self.store.read(|s| s.volumes.get(id).cloned()).await? {
            require_unpublished(&v)?;
            if let Some(m) = self.volume_mounts(id)?.first() {
                return Err(Status::failed_precondition(format!(
                    "volume {id} is still mounted at {}; unpublish and unstage it first",
                    m.mount_point.display()
                )));
            }
            let shared = self.settings.shared;
            self.store
                .update(|s| {
                    // Another copy may have published it since (its lock is not ours).
                    if shared && let Some(v) = s.volumes.get(id) {
                        require_unpublished(v)?;
                    }
                    s.volumes.remove(id);
                    Ok::<_, Status>(())
                })
                .await?;
            // A kill before this leaves records of a volume that is gone: dropped at the next
            // start.
            self.node.forget(id).await?;
            tracing::info!(volume_id = %id, "deleted volume");
        }
        let (dir, name) = (self.volumes_dir.clone(), self.entry_name(id));
        blocking(move || files::delete_tree(&dir, &name)).await?;
        Ok(pb::DeleteVolumeResponse {})
    }
}
