//! ListVolumes and GetCapacity.

use berth_csi::pb::{self, list_volumes_response};
use tonic::{Code, Status};

use super::{allocated, page, parse_token};
use crate::{
    caps,
    plugin::{Plugin, blocking},
};

impl Plugin {
    pub(super) async fn list_volumes(
        &self,
        req: &pb::ListVolumesRequest,
    ) -> Result<pb::ListVolumesResponse, Status> {
        if req.max_entries < 0 {
            return Err(Status::invalid_argument("max_entries must not be negative"));
        }
        let after = parse_token(&req.starting_token)?;
        let (entries, next_token) = self
            .store
            .read(|s| {
                let topologies = self.volume_topologies(s);
                let entries = s.volumes.iter().map(|(id, v)| {
                    (
                        id,
                        list_volumes_response::Entry {
                            volume: Some(self.volume_pb(v, &topologies)),
                            status: Some(list_volumes_response::VolumeStatus {
                                published_node_ids: v.published_nodes.keys().cloned().collect(),
                                volume_condition: None,
                            }),
                        },
                    )
                });
                page(entries, after, req.max_entries)
            })
            .await?;
        Ok(pb::ListVolumesResponse {
            entries,
            next_token,
        })
    }

    pub(super) async fn get_capacity(
        &self,
        req: &pb::GetCapacityRequest,
    ) -> Result<pb::GetCapacityResponse, Status> {
        let mut usable = true;
        for (i, cap) in req.volume_capabilities.iter().enumerate() {
            let field = format!("volume_capabilities[{i}]");
            match caps::capability(cap, &field, Code::FailedPrecondition) {
                Ok(c) if !self.fs_type_supported(&c) => usable = false,
                Ok(_) => {}
                Err(s) if s.code() == Code::FailedPrecondition => usable = false,
                Err(s) => return Err(s),
            }
        }
        if let Some(t) = &req.accessible_topology {
            let ours = self.store.read(|s| self.volume_topologies(s)).await?;
            usable &= ours.iter().any(|o| caps::topology_matches(&t.segments, o));
        }
        let available = if !usable {
            0
        } else if let Some(total) = self.settings.capacity {
            let total = i64::try_from(total).unwrap_or(i64::MAX);
            (total - self.store.read(allocated).await?).max(0)
        } else {
            let statedir = self.settings.statedir.clone();
            let stats = blocking(move || berth_sys::fs_stats(&statedir)).await?;
            i64::try_from(stats.available_bytes).unwrap_or(i64::MAX)
        };
        Ok(pb::GetCapacityResponse {
            available_capacity: available,
            maximum_volume_size: self
                .settings
                .max_volume_size
                .map(|m| i64::try_from(m).unwrap_or(i64::MAX)),
            minimum_volume_size: None,
        })
    }
}
