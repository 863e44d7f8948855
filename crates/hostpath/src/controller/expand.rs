//! ControllerExpandVolume.

use berth_csi::pb;
use tonic::{Code, Status};

use crate::{
    Backing, caps, image,
    locks::volume_key,
    plugin::{Plugin, blocking},
};

impl Plugin {
    pub(super) async fn controller_expand_volume(
        &self,
        req: &pb::ControllerExpandVolumeRequest,
    ) -> Result<pb::ControllerExpandVolumeResponse, Status> {
        // The volume first: an unknown one is NOT_FOUND whatever the other fields hold.
        let id = caps::id(&req.volume_id, "volume_id")?;
        let _guard = self.locks.lock(&[volume_key(id)]).await;
        let v = self.volume(id).await?;
        let range = req
            .capacity_range
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("capacity_range is required"))?;
        if let Some(cap) = &req.volume_capability {
            let cap = caps::capability(cap, "volume_capability", Code::InvalidArgument)?;
            self.check_fs_type(&cap, "volume_capability")?;
        }
        let (required, limit) = (range.required_bytes, range.limit_bytes);
        if required < 0 || limit < 0 {
            return Err(Status::invalid_argument(
                "capacity_range.required_bytes and limit_bytes must not be negative",
            ));
        }
        if required == 0 && limit == 0 {
            return Err(Status::invalid_argument(
                "capacity_range needs required_bytes or limit_bytes",
            ));
        }
        if limit > 0 && required > limit {
            return Err(Status::out_of_range(format!(
                "capacity_range.limit_bytes {limit} is less than required_bytes {required}"
            )));
        }
        let target = if required > 0 { required } else { limit };
        let done = |capacity_bytes| pb::ControllerExpandVolumeResponse {
            capacity_bytes,
            node_expansion_required: true,
        };
        if target <= v.capacity_bytes {
            return Ok(done(v.capacity_bytes));
        }
        if let Some(max) = self.settings.max_volume_size
            && u64::try_from(target).is_ok_and(|t| t > max)
        {
            return Err(Status::out_of_range(format!(
                "{target} bytes requested but the maximum volume size is {max} bytes"
            )));
        }
        self.store
            .read(|s| self.check_pool(s, target - v.capacity_bytes))
            .await??;
        if self.settings.backing == Backing::Image {
            // The file first: a record never promises more than the image has. The filesystem
            // grows in NodeExpandVolume (or when next staged).
            let (path, size) = (self.volume_path(id), u64::try_from(target).unwrap_or(0));
            blocking(move || image::grow(&path, size)).await?;
        }
        self.store
            .update(|s| {
                self.check_pool(s, target - v.capacity_bytes)?;
                if let Some(v) = s.volumes.get_mut(id) {
                    v.capacity_bytes = target;
                }
                Ok::<_, Status>(())
            })
            .await?;
        tracing::info!(volume_id = %id, capacity = target, "expanded volume");
        Ok(done(target))
    }
}
