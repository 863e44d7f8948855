//! NodeGetVolumeStats.

use berth_csi::pb::{self, volume_usage::Unit};
use tonic::Status;

use crate::{
    caps, files,
    plugin::{Plugin, blocking},
};

impl Plugin {
    pub(super) async fn node_get_volume_stats(
        &self,
        req: &pb::NodeGetVolumeStatsRequest,
    ) -> Result<pb::NodeGetVolumeStatsResponse, Status> {
        // The volume first: an unknown one is NOT_FOUND whatever the other fields hold.
        let id = caps::id(&req.volume_id, "volume_id")?;
        let v = self.node_volume(id).await?;
        let path = caps::node_path(&req.volume_path, "volume_path")?;
        caps::optional_node_path(&req.staging_target_path, "staging_target_path")?;
        if self.settings.strict {
            self.check_staging_hint(id, &req.staging_target_path)?;
        }
        self.require_mounted(id, &path, "volume_path")?;
        let condition = self.condition(id);
        let walk_path = path.clone();
        let (used, _) = blocking(move || files::tree_usage(&walk_path)).await?;
        let fs = blocking(move || berth_sys::fs_stats(&path)).await?;
        let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let used = clamp(used);
        let available = (v.capacity_bytes - used)
            .min(clamp(fs.available_bytes))
            .max(0);
        Ok(pb::NodeGetVolumeStatsResponse {
            usage: vec![
                pb::VolumeUsage {
                    available,
                    total: v.capacity_bytes,
                    used,
                    unit: Unit::Bytes as i32,
                },
                pb::VolumeUsage {
                    available: clamp(fs.available_inodes),
                    total: clamp(fs.total_inodes),
                    used: clamp(fs.total_inodes.saturating_sub(fs.free_inodes)),
                    unit: Unit::Inodes as i32,
                },
            ],
            volume_condition: Some(condition),
        })
    }
}
