//! NodeGetVolumeStats.

use berth_csi::pb::{self, volume_usage::Unit};
use tonic::Status;

use crate::{
    Backing, caps, files,
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
        let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let (fs, (total, used, available)) = match self.settings.backing {
            Backing::Dir => {
                // The directory shares its filesystem: count what is in it, against its
                // capacity.
                let walk_path = path.clone();
                let (used, _) = blocking(move || files::tree_usage(&walk_path)).await?;
                let fs = blocking(move || berth_sys::fs_stats(&path)).await?;
                let used = clamp(used);
                let available = (v.capacity_bytes - used)
                    .min(clamp(fs.available_bytes))
                    .max(0);
                (fs, (v.capacity_bytes, used, available))
            }
            Backing::Image => {
                // The volume is a filesystem of its own (without reserved blocks): its figures.
                let fs = blocking(move || berth_sys::fs_stats(&path)).await?;
                let (total, available) = (clamp(fs.total_bytes), clamp(fs.available_bytes));
                (fs, (total, total.saturating_sub(available), available))
            }
        };
        Ok(pb::NodeGetVolumeStatsResponse {
            usage: vec![
                pb::VolumeUsage {
                    available,
                    total,
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
