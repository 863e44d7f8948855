//! CreateVolume.

use std::collections::{BTreeMap, BTreeSet};

use berth_csi::pb::{self, volume_content_source};
use tonic::{Code, Status};

use super::{discard_tree, new_id};
use crate::{
    caps,
    files::VOLUME_DIR_MODE,
    locks::{snapshot_key, volume_key, volume_name_key},
    plugin::Plugin,
    state::{ContentSource, VolumeRecord},
};

impl Plugin {
    /// The size of a content source: 0 for none, `None` if it does not exist.
    async fn source_size(&self, source: Option<&ContentSource>) -> Result<Option<i64>, Status> {
        self.store
            .read(|s| match source {
                None => Some(0),
                Some(ContentSource::Snapshot(id)) => s.snapshots.get(id).map(|s| s.size_bytes),
                Some(ContentSource::Volume(id)) => s.volumes.get(id).map(|v| v.capacity_bytes),
            })
            .await
            .map_err(Status::from)
    }

    pub(crate) async fn create_volume(
        &self,
        req: &pb::CreateVolumeRequest,
    ) -> Result<pb::CreateVolumeResponse, Status> {
        // The content source first: an unknown one is NOT_FOUND whatever the other fields hold
        // (except in a retry of a create from it that succeeded, answered from the volume).
        let source = match req.volume_content_source.as_ref().map(|s| &s.r#type) {
            None => None,
            Some(None) => {
                return Err(Status::invalid_argument(
                    "volume_content_source.type is required",
                ));
            }
            Some(Some(volume_content_source::Type::Snapshot(s))) => Some(ContentSource::Snapshot(
                caps::id(&s.snapshot_id, "volume_content_source.snapshot.snapshot_id")?.to_owned(),
            )),
            Some(Some(volume_content_source::Type::Volume(v))) => Some(ContentSource::Volume(
                caps::id(&v.volume_id, "volume_content_source.volume.volume_id")?.to_owned(),
            )),
        };
        // The id the volume gets if it is new. Its key is locked with the others, so that a
        // DeleteVolume of that id waits until the record is written (or the directory is gone).
        let id = self
            .store
            .read(|s| new_id("vol", |c| s.volumes.contains_key(c)))
            .await?;
        let mut keys = vec![volume_name_key(&req.name), volume_key(&id)];
        match &source {
            Some(ContentSource::Snapshot(id)) => keys.push(snapshot_key(id)),
            Some(ContentSource::Volume(id)) => keys.push(volume_key(id)),
            None => {}
        }
        let _guard = self.locks.lock(&keys).await;
        let (existing, topologies) = self
            .store
            .read(|s| {
                let named = s.volumes.values().find(|v| v.name == req.name);
                let named = named.filter(|_| !req.name.is_empty()).cloned();
                (named, self.volume_topologies(s))
            })
            .await?;
        let floor = match (self.source_size(source.as_ref()).await?, &existing) {
            (Some(size), _) => size,
            (None, Some(v)) if v.source == source => 0,
            (None, _) => {
                return Err(Status::not_found(match &source {
                    Some(ContentSource::Snapshot(id)) => {
                        format!("source snapshot {id} does not exist")
                    }
                    Some(ContentSource::Volume(id)) => format!("source volume {id} does not exist"),
                    None => "the content source does not exist".to_owned(),
                }));
            }
        };

        let name = caps::name(&req.name, "name")?;
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities is required"));
        }
        for (i, cap) in req.volume_capabilities.iter().enumerate() {
            let field = format!("volume_capabilities[{i}]");
            let cap = caps::capability(cap, &field, Code::InvalidArgument)?;
            self.check_fs_type(&cap, &field)?;
        }
        let range = req.capacity_range.as_ref();
        caps::choose_capacity(range, 0, self.settings.max_volume_size)?;
        let requirements = req.accessibility_requirements.as_ref();
        if !topologies
            .iter()
            .any(|t| caps::topology_allows(requirements, t))
        {
            return Err(Status::resource_exhausted(format!(
                "no requisite topology includes {}",
                self.describe_nodes(&topologies)
            )));
        }
        let parameters: BTreeMap<String, String> = req
            .parameters
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();

        if let Some(v) = existing {
            let conflict = if !caps::capacity_fits(v.capacity_bytes, range) {
                Some(format!(
                    "capacity {} bytes, outside the requested range",
                    v.capacity_bytes
                ))
            } else if v.parameters != parameters {
                Some("other parameters".to_owned())
            } else if v.source != source {
                Some("another content source".to_owned())
            } else {
                None
            };
            return match conflict {
                Some(what) => Err(Status::already_exists(format!(
                    "volume named {name:?} already exists as {} with {what}",
                    v.id
                ))),
                None => Ok(pb::CreateVolumeResponse {
                    volume: Some(self.volume_pb(&v, &topologies)),
                }),
            };
        }

        let from = match &source {
            None => None,
            Some(ContentSource::Snapshot(id)) => Some((id.as_str(), self.snapshot_path(id))),
            Some(ContentSource::Volume(id)) => Some((id.as_str(), self.volume_path(id))),
        };
        let capacity = caps::choose_capacity(range, floor, self.settings.max_volume_size)?;
        self.store.read(|s| self.check_pool(s, capacity)).await??;
        self.make_entry(&self.volumes_dir, &id, from, capacity, VOLUME_DIR_MODE)
            .await?;
        let record = VolumeRecord {
            id: id.clone(),
            name: name.to_owned(),
            capacity_bytes: capacity,
            parameters,
            source,
            published_nodes: BTreeMap::new(),
            legacy_staged: BTreeMap::new(),
            legacy_published: BTreeMap::new(),
            legacy_created_targets: BTreeSet::new(),
        };
        let saved = self
            .store
            .update(|s| {
                if s.volumes.contains_key(&id) {
                    // Another volume took this random id since it was drawn (a 2^-64 chance).
                    return Err(Status::aborted(format!(
                        "volume id {id} was taken concurrently; try again"
                    )));
                }
                self.check_pool(s, capacity)?;
                s.volumes.insert(id.clone(), record.clone());
                Ok::<_, Status>(())
            })
            .await;
        if let Err(status) = saved {
            // The record was not written: the directory or image must not outlive this call.
            discard_tree(&self.volumes_dir, self.entry_name(&id)).await;
            return Err(status);
        }
        tracing::info!(volume_id = %id, capacity, "created volume");
        Ok(pb::CreateVolumeResponse {
            volume: Some(self.volume_pb(&record, &topologies)),
        })
    }
}
