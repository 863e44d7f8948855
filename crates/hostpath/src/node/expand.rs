//! NodeExpandVolume.

use berth_csi::pb;
use tonic::{Code, Status};

use crate::{caps, locks::volume_key, plugin::Plugin};

impl Plugin {
    pub(super) async fn node_expand_volume(
        &self,
        req: &pb::NodeExpandVolumeRequest,
    ) -> Result<pb::NodeExpandVolumeResponse, Status> {
        // The volume first: an unknown one is NOT_FOUND whatever the other fields hold.
        let id = caps::id(&req.volume_id, "volume_id")?;
        let _guard = self.locks.lock(&[volume_key(id)]).await;
        let v = self.node_volume(id).await?;
        let path = caps::node_path(&req.volume_path, "volume_path")?;
        caps::optional_node_path(&req.staging_target_path, "staging_target_path")?;
        if let Some(cap) = &req.volume_capability {
            caps::capability(cap, "volume_capability", Code::InvalidArgument)?;
        }
        let (required, limit) = req
            .capacity_range
            .map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
        if required < 0 || limit < 0 {
            return Err(Status::invalid_argument(
                "capacity_range.required_bytes and limit_bytes must not be negative",
            ));
        }
        if limit > 0 && required > limit {
            return Err(Status::out_of_range(format!(
                "capacity_range.limit_bytes {limit} is less than required_bytes {required}"
            )));
        }
        if self.settings.strict {
            self.check_staging_hint(id, &req.staging_target_path)?;
        }
        self.require_mounted(id, &path, "volume_path")?;
        if required > v.capacity_bytes {
            return Err(Status::out_of_range(format!(
                "volume {id} has {} bytes, less than the {required} required; expand it with \
                 ControllerExpandVolume first",
                v.capacity_bytes
            )));
        }
        // A directory has no filesystem to grow: the new capacity is already in effect.
        Ok(pb::NodeExpandVolumeResponse {
            capacity_bytes: v.capacity_bytes,
        })
    }
}
