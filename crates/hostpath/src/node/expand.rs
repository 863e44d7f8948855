//! NodeExpandVolume.

use std::path::PathBuf;

use berth_csi::pb;
use tonic::{Code, Status};

use crate::{
    Backing, caps,
    image::{self, Online},
    locks::volume_key,
    plugin::{Plugin, blocking},
};

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
            let cap = caps::capability(cap, "volume_capability", Code::InvalidArgument)?;
            self.check_fs_type(&cap, "volume_capability")?;
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
        if self.settings.backing == Backing::Image {
            self.fill_mounted_image(id).await?;
        }
        // A directory has no filesystem to grow: the new capacity is already in effect.
        Ok(pb::NodeExpandVolumeResponse {
            capacity_bytes: v.capacity_bytes,
        })
    }

    /// Grows the mounted filesystem of volume `id` (image backing) to fill its image, through
    /// the loop device it is mounted from.
    async fn fill_mounted_image(&self, id: &str) -> Result<(), Status> {
        let mounts = self.volume_mounts(id)?;
        let Some(mount) = mounts.iter().find(|m| !m.read_only) else {
            return Err(Status::failed_precondition(format!(
                "volume {id} is mounted read-only only; its filesystem cannot grow while so \
                 mounted: stage it writable, or unstage it and stage it again (staging grows \
                 the filesystem first)"
            )));
        };
        let device = PathBuf::from(&mount.source);
        match blocking(move || image::fill_online(&device)).await? {
            Online::Done => Ok(()),
            Online::NotPermitted => Err(Status::failed_precondition(format!(
                "volume {id}'s filesystem must grow while it is mounted, and the kernel lets only \
                 a process with CAP_SYS_RESOURCE grow a mounted ext4 filesystem, which this \
                 plugin lacks: unpublish and unstage the volume and stage it again (staging \
                 grows the filesystem first)"
            ))),
        }
    }
}
