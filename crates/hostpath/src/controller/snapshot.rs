//! CreateSnapshot, DeleteSnapshot and ListSnapshots.

use std::time::SystemTime;

use berth_csi::pb::{self, list_snapshots_response};
use tonic::Status;

use super::{SNAPSHOT_DIR_MODE, discard_tree, new_id, page, parse_token};
use crate::{
    caps, files,
    locks::{snapshot_key, snapshot_name_key, volume_key},
    plugin::{Plugin, blocking},
    state::SnapshotRecord,
};

impl Plugin {
    pub(super) async fn create_snapshot(
        &self,
        req: &pb::CreateSnapshotRequest,
    ) -> Result<pb::CreateSnapshotResponse, Status> {
        // The source volume first: an unknown one is NOT_FOUND whatever the other fields hold
        // (except in a retry of a snapshot of it that succeeded, answered from the snapshot).
        let source = caps::id(&req.source_volume_id, "source_volume_id")?;
        let _guard = self
            .locks
            .lock(&[snapshot_name_key(&req.name), volume_key(source)])
            .await;
        let (volume, existing) = self
            .store
            .read(|s| {
                let named = s.snapshots.values().find(|s| s.name == req.name);
                (
                    s.volumes.get(source).cloned(),
                    named.filter(|_| !req.name.is_empty()).cloned(),
                )
            })
            .await?;
        let retry = existing
            .as_ref()
            .is_some_and(|snap| snap.source_volume_id == source);
        if volume.is_none() && !retry {
            return Err(Status::not_found(format!(
                "source volume {source} does not exist"
            )));
        }
        let name = caps::name(&req.name, "name")?;
        if let Some(snap) = existing {
            if snap.source_volume_id != source {
                return Err(Status::already_exists(format!(
                    "snapshot named {name:?} already exists as {} of volume {}",
                    snap.id, snap.source_volume_id
                )));
            }
            return Ok(pb::CreateSnapshotResponse {
                snapshot: Some(snap.to_pb()),
            });
        }
        let Some(volume) = volume else {
            return Err(Status::not_found(format!(
                "source volume {source} does not exist"
            )));
        };
        let id = self
            .store
            .read(|s| new_id("snap", |c| s.snapshots.contains_key(c)))
            .await?;
        let from = Some((source, self.volume_path(source)));
        self.make_entry(&self.snapshots_dir, &id, from, 0, SNAPSHOT_DIR_MODE)
            .await?;
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let record = SnapshotRecord {
            id: id.clone(),
            name: name.to_owned(),
            source_volume_id: source.to_owned(),
            size_bytes: volume.capacity_bytes,
            created_seconds: i64::try_from(now.as_secs()).unwrap_or(i64::MAX),
            created_nanos: i32::try_from(now.subsec_nanos()).unwrap_or(0),
        };
        let saved = self
            .store
            .update(|s| {
                if s.snapshots.contains_key(&id) {
                    // Another snapshot took this random id since it was drawn (a 2^-64 chance).
                    return Err(Status::aborted(format!(
                        "snapshot id {id} was taken concurrently; try again"
                    )));
                }
                s.snapshots.insert(id.clone(), record.clone());
                Ok::<_, Status>(())
            })
            .await;
        if let Err(status) = saved {
            // The record was not written: the directory must not outlive this call.
            discard_tree(&self.snapshots_dir, self.entry_name(&id)).await;
            return Err(status);
        }
        tracing::info!(snapshot_id = %id, volume_id = %source, "created snapshot");
        Ok(pb::CreateSnapshotResponse {
            snapshot: Some(record.to_pb()),
        })
    }

    pub(super) async fn delete_snapshot(
        &self,
        req: &pb::DeleteSnapshotRequest,
    ) -> Result<pb::DeleteSnapshotResponse, Status> {
        let id = caps::id(&req.snapshot_id, "snapshot_id")?;
        let _guard = self.locks.lock(&[snapshot_key(id)]).await;
        if self.store.read(|s| s.snapshots.contains_key(id)).await? {
            self.store
                .update(|s| {
                    s.snapshots.remove(id);
                    Ok::<_, Status>(())
                })
                .await?;
            tracing::info!(snapshot_id = %id, "deleted snapshot");
        }
        let (dir, name) = (self.snapshots_dir.clone(), self.entry_name(id));
        blocking(move || files::delete_tree(&dir, &name)).await?;
        Ok(pb::DeleteSnapshotResponse {})
    }

    pub(super) async fn list_snapshots(
        &self,
        req: &pb::ListSnapshotsRequest,
    ) -> Result<pb::ListSnapshotsResponse, Status> {
        if req.max_entries < 0 {
            return Err(Status::invalid_argument("max_entries must not be negative"));
        }
        let after = parse_token(&req.starting_token)?;
        let (entries, next_token) = self
            .store
            .read(|s| {
                let entries = s
                    .snapshots
                    .iter()
                    .filter(|(id, _)| req.snapshot_id.is_empty() || **id == req.snapshot_id)
                    .filter(|(_, snap)| {
                        req.source_volume_id.is_empty()
                            || snap.source_volume_id == req.source_volume_id
                    })
                    .map(|(id, snap)| {
                        (
                            id,
                            list_snapshots_response::Entry {
                                snapshot: Some(snap.to_pb()),
                            },
                        )
                    });
                page(entries, after, req.max_entries)
            })
            .await?;
        Ok(pb::ListSnapshotsResponse {
            entries,
            next_token,
        })
    }
}
