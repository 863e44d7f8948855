//! The CSI Controller service: volumes and snapshots as directories, controller publication as
//! a record.

use std::{collections::BTreeMap, path::Path, sync::Arc, time::SystemTime};

use rand::Rng as _;

use berth_csi::pb::{
    self, ControllerServiceCapability,
    controller_service_capability::{self, rpc},
    list_snapshots_response, list_volumes_response, validate_volume_capabilities_response,
    volume_content_source,
};
use tonic::{Code, Status};

use crate::{
    caps,
    files::{self, VOLUME_DIR_MODE},
    locks::{snapshot_key, snapshot_name_key, volume_key, volume_name_key},
    plugin::{PUBLISH_CONTEXT_NODE_KEY, Plugin, blocking},
    state::{ContentSource, ControllerPublication, SnapshotRecord, State, VolumeRecord},
};

/// Mode of a snapshot directory (never mounted).
const SNAPSHOT_DIR_MODE: u32 = 0o700;

/// Prefix of the pagination tokens of ListVolumes and ListSnapshots.
const TOKEN_PREFIX: &str = "after:";

#[derive(Debug, Clone)]
pub(crate) struct ControllerService(pub Arc<Plugin>);

/// The controller capabilities this plugin advertises.
pub(crate) fn controller_capabilities(attach: bool) -> Vec<ControllerServiceCapability> {
    let mut types = vec![rpc::Type::CreateDeleteVolume];
    if attach {
        types.push(rpc::Type::PublishUnpublishVolume);
    }
    types.extend([
        rpc::Type::ListVolumes,
        rpc::Type::GetCapacity,
        rpc::Type::CreateDeleteSnapshot,
        rpc::Type::ListSnapshots,
        rpc::Type::CloneVolume,
        rpc::Type::ExpandVolume,
        rpc::Type::ListVolumesPublishedNodes,
        rpc::Type::GetVolume,
        rpc::Type::SingleNodeMultiWriter,
    ]);
    types
        .into_iter()
        .map(|t| ControllerServiceCapability {
            r#type: Some(controller_service_capability::Type::Rpc(
                controller_service_capability::Rpc { r#type: t as i32 },
            )),
        })
        .collect()
}

/// A fresh random id: `<prefix>-<16 hex digits>`, not one `taken` says is in use. Never derived
/// from the name, so a volume deleted and created again under the same name gets a new id, and
/// a late DeleteVolume of the old id cannot touch the new volume.
fn new_id(prefix: &str, taken: impl Fn(&str) -> bool) -> String {
    let mut rng = rand::rng();
    loop {
        let id = format!("{prefix}-{:016x}", rng.random::<u64>());
        if !taken(&id) {
            return id;
        }
    }
}

/// The key after which a page starts; `ABORTED` for a token this plugin did not issue.
fn parse_token(token: &str) -> Result<Option<&str>, Status> {
    if token.is_empty() {
        return Ok(None);
    }
    match token.strip_prefix(TOKEN_PREFIX) {
        Some(key) if !key.is_empty() => Ok(Some(key)),
        _ => Err(Status::aborted(format!(
            "invalid starting_token {token:?}; start again without a token"
        ))),
    }
}

/// One page of `items` (in key order, after `after`), and the token of the next page.
fn page<'a, T: 'a>(
    items: impl Iterator<Item = (&'a String, T)>,
    after: Option<&str>,
    max_entries: i32,
) -> (Vec<T>, String) {
    let mut items = items
        .filter(|(k, _)| after.is_none_or(|a| k.as_str() > a))
        .peekable();
    let limit = usize::try_from(max_entries)
        .ok()
        .filter(|&m| m > 0)
        .unwrap_or(usize::MAX);
    let mut out = Vec::new();
    let mut last = None;
    while out.len() < limit {
        let Some((k, v)) = items.next() else { break };
        last = Some(k);
        out.push(v);
    }
    let next = match (items.peek(), last) {
        (Some(_), Some(k)) => format!("{TOKEN_PREFIX}{k}"),
        _ => String::new(),
    };
    (out, next)
}

/// Removes `dir/<id>`, made by a create whose record could not be written. A failure is only
/// logged: the caller reports the error that made the create fail, and the directory, which no
/// record points at, is replaced if the id is ever drawn again.
async fn discard_tree(dir: &Path, id: &str) {
    let (dir, id) = (dir.to_path_buf(), id.to_owned());
    if let Err(status) = blocking(move || files::delete_tree(&dir, &id)).await {
        tracing::warn!(
            error = status.message(),
            "could not remove an unrecorded directory"
        );
    }
}

fn allocated(state: &State) -> i64 {
    state.volumes.values().map(|v| v.capacity_bytes).sum()
}

impl Plugin {
    fn volume_pb(&self, v: &VolumeRecord) -> pb::Volume {
        pb::Volume {
            capacity_bytes: v.capacity_bytes,
            volume_id: v.id.clone(),
            volume_context: Default::default(),
            content_source: v.source.as_ref().map(ContentSource::to_pb),
            accessible_topology: vec![pb::Topology {
                segments: self.topology(),
            }],
        }
    }

    pub(crate) fn condition(&self, id: &str) -> pb::VolumeCondition {
        let dir = self.volume_dir(id);
        if dir.is_dir() {
            pb::VolumeCondition {
                abnormal: false,
                message: "volume directory is present".to_owned(),
            }
        } else {
            pb::VolumeCondition {
                abnormal: true,
                message: format!("volume directory {} is missing", dir.display()),
            }
        }
    }

    async fn volume(&self, id: &str) -> Result<VolumeRecord, Status> {
        self.store
            .read(|s| s.volumes.get(id).cloned())
            .await
            .ok_or_else(|| Status::not_found(format!("volume {id} does not exist")))
    }

    /// Fails with `RESOURCE_EXHAUSTED` if `extra` more bytes would exceed `--capacity`.
    fn check_pool(&self, state: &State, extra: i64) -> Result<(), Status> {
        let Some(total) = self.settings.capacity else {
            return Ok(());
        };
        let total = i64::try_from(total).unwrap_or(i64::MAX);
        let used = allocated(state);
        if used.saturating_add(extra) > total {
            return Err(Status::resource_exhausted(format!(
                "not enough capacity: {used} of {total} bytes are allocated, {extra} more requested"
            )));
        }
        Ok(())
    }

    pub(crate) async fn create_volume(
        &self,
        req: &pb::CreateVolumeRequest,
    ) -> Result<pb::CreateVolumeResponse, Status> {
        let name = caps::name(&req.name, "name")?;
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities is required"));
        }
        for (i, cap) in req.volume_capabilities.iter().enumerate() {
            caps::capability(
                cap,
                &format!("volume_capabilities[{i}]"),
                Code::InvalidArgument,
            )?;
        }
        let range = req.capacity_range.as_ref();
        caps::choose_capacity(range, 0, self.settings.max_volume_size)?;
        if !caps::topology_allows(req.accessibility_requirements.as_ref(), &self.topology()) {
            return Err(Status::resource_exhausted(format!(
                "no requisite topology includes this node ({}={})",
                crate::plugin::TOPOLOGY_KEY,
                self.settings.node_id
            )));
        }
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
            .await;
        let mut keys = vec![volume_name_key(name), volume_key(&id)];
        match &source {
            Some(ContentSource::Snapshot(id)) => keys.push(snapshot_key(id)),
            Some(ContentSource::Volume(id)) => keys.push(volume_key(id)),
            None => {}
        }
        let _guard = self.locks.lock(&keys).await;
        let parameters: BTreeMap<String, String> = req
            .parameters
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();

        let existing = self
            .store
            .read(|s| s.volumes.values().find(|v| v.name == name).cloned())
            .await;
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
                    volume: Some(self.volume_pb(&v)),
                }),
            };
        }

        let (source_dir, floor) = match &source {
            None => (None, 0),
            Some(ContentSource::Snapshot(id)) => {
                let size = self
                    .store
                    .read(|s| s.snapshots.get(id).map(|s| s.size_bytes))
                    .await
                    .ok_or_else(|| {
                        Status::not_found(format!("source snapshot {id} does not exist"))
                    })?;
                (Some(self.snapshot_dir(id)), size)
            }
            Some(ContentSource::Volume(id)) => {
                let size = self
                    .store
                    .read(|s| s.volumes.get(id).map(|v| v.capacity_bytes))
                    .await
                    .ok_or_else(|| {
                        Status::not_found(format!("source volume {id} does not exist"))
                    })?;
                (Some(self.volume_dir(id)), size)
            }
        };
        let capacity = caps::choose_capacity(range, floor, self.settings.max_volume_size)?;
        self.store.read(|s| self.check_pool(s, capacity)).await?;

        let dir = self.volumes_dir.clone();
        let dir_id = id.clone();
        blocking(move || files::create_tree(&dir, &dir_id, source_dir.as_deref(), VOLUME_DIR_MODE))
            .await?;
        let record = VolumeRecord {
            id: id.clone(),
            name: name.to_owned(),
            capacity_bytes: capacity,
            parameters,
            source,
            published_nodes: BTreeMap::new(),
            staged: BTreeMap::new(),
            published: BTreeMap::new(),
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
            // The record was not written: the directory must not outlive this call.
            discard_tree(&self.volumes_dir, &id).await;
            return Err(status);
        }
        tracing::info!(volume_id = %id, capacity, "created volume");
        Ok(pb::CreateVolumeResponse {
            volume: Some(self.volume_pb(&record)),
        })
    }

    async fn delete_volume(
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
        let dir = self.volumes_dir.clone();
        let id = id.to_owned();
        blocking(move || files::delete_tree(&dir, &id)).await?;
        Ok(pb::DeleteVolumeResponse {})
    }

    async fn controller_publish_volume(
        &self,
        req: &pb::ControllerPublishVolumeRequest,
    ) -> Result<pb::ControllerPublishVolumeResponse, Status> {
        if !self.settings.attach {
            return Err(Status::unimplemented(
                "ControllerPublishVolume is disabled (--enable-attach=false)",
            ));
        }
        let id = caps::id(&req.volume_id, "volume_id")?;
        let node = caps::required(&req.node_id, "node_id")?;
        let capability = caps::required_capability(
            req.volume_capability.as_ref(),
            "volume_capability",
            Code::InvalidArgument,
        )?;
        let _guard = self.locks.lock(&[volume_key(id)]).await;
        let v = self.volume(id).await?;
        if node != self.settings.node_id {
            return Err(Status::not_found(format!(
                "node {node} does not exist; this plugin serves node {}",
                self.settings.node_id
            )));
        }
        let context = pb::ControllerPublishVolumeResponse {
            publish_context: [(PUBLISH_CONTEXT_NODE_KEY.to_owned(), node.to_owned())].into(),
        };
        let wanted = ControllerPublication {
            readonly: req.readonly,
            capability,
        };
        match v.published_nodes.get(node) {
            Some(p) if *p == wanted => return Ok(context),
            Some(p) => {
                return Err(Status::already_exists(format!(
                    "volume {id} is already published to node {node} with readonly={} and \
                     access mode {}",
                    p.readonly, p.capability.access_mode
                )));
            }
            None => {}
        }
        let max = self.settings.max_volumes_per_node;
        self.store
            .update(|s| {
                let attached = s
                    .volumes
                    .values()
                    .filter(|v| v.published_nodes.contains_key(node))
                    .count();
                if max > 0 && attached >= max as usize {
                    return Err(Status::resource_exhausted(format!(
                        "node {node} already has {attached} volumes published, the maximum"
                    )));
                }
                if let Some(v) = s.volumes.get_mut(id) {
                    v.published_nodes.insert(node.to_owned(), wanted);
                }
                Ok(())
            })
            .await?;
        Ok(context)
    }

    async fn controller_unpublish_volume(
        &self,
        req: &pb::ControllerUnpublishVolumeRequest,
    ) -> Result<pb::ControllerUnpublishVolumeResponse, Status> {
        if !self.settings.attach {
            return Err(Status::unimplemented(
                "ControllerUnpublishVolume is disabled (--enable-attach=false)",
            ));
        }
        let id = caps::id(&req.volume_id, "volume_id")?;
        let node = req.node_id.as_str();
        let _guard = self.locks.lock(&[volume_key(id)]).await;
        // An unknown volume or node is not published: nothing to do.
        let published = self
            .store
            .read(|s| {
                s.volumes.get(id).is_some_and(|v| {
                    if node.is_empty() {
                        !v.published_nodes.is_empty()
                    } else {
                        v.published_nodes.contains_key(node)
                    }
                })
            })
            .await;
        if published {
            self.store
                .update(|s| {
                    if let Some(v) = s.volumes.get_mut(id) {
                        if node.is_empty() {
                            v.published_nodes.clear();
                        } else {
                            v.published_nodes.remove(node);
                        }
                    }
                    Ok::<_, Status>(())
                })
                .await?;
        }
        Ok(pb::ControllerUnpublishVolumeResponse {})
    }

    async fn validate_volume_capabilities(
        &self,
        req: &pb::ValidateVolumeCapabilitiesRequest,
    ) -> Result<pb::ValidateVolumeCapabilitiesResponse, Status> {
        let id = caps::id(&req.volume_id, "volume_id")?;
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities is required"));
        }
        let mut unsupported = None;
        for (i, cap) in req.volume_capabilities.iter().enumerate() {
            let field = format!("volume_capabilities[{i}]");
            match caps::capability(cap, &field, Code::FailedPrecondition) {
                Ok(_) => {}
                Err(s) if s.code() == Code::FailedPrecondition => {
                    unsupported.get_or_insert_with(|| s.message().to_owned());
                }
                Err(s) => return Err(s),
            }
        }
        self.volume(id).await?;
        Ok(match unsupported {
            Some(message) => pb::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message,
            },
            None => pb::ValidateVolumeCapabilitiesResponse {
                confirmed: Some(validate_volume_capabilities_response::Confirmed {
                    volume_context: req.volume_context.clone(),
                    volume_capabilities: req.volume_capabilities.clone(),
                    parameters: req.parameters.clone(),
                    mutable_parameters: req.mutable_parameters.clone(),
                }),
                message: String::new(),
            },
        })
    }

    async fn list_volumes(
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
                let entries = s.volumes.iter().map(|(id, v)| {
                    (
                        id,
                        list_volumes_response::Entry {
                            volume: Some(self.volume_pb(v)),
                            status: Some(list_volumes_response::VolumeStatus {
                                published_node_ids: v.published_nodes.keys().cloned().collect(),
                                volume_condition: None,
                            }),
                        },
                    )
                });
                page(entries, after, req.max_entries)
            })
            .await;
        Ok(pb::ListVolumesResponse {
            entries,
            next_token,
        })
    }

    async fn get_capacity(
        &self,
        req: &pb::GetCapacityRequest,
    ) -> Result<pb::GetCapacityResponse, Status> {
        let mut usable = true;
        for (i, cap) in req.volume_capabilities.iter().enumerate() {
            let field = format!("volume_capabilities[{i}]");
            match caps::capability(cap, &field, Code::FailedPrecondition) {
                Ok(_) => {}
                Err(s) if s.code() == Code::FailedPrecondition => usable = false,
                Err(s) => return Err(s),
            }
        }
        if let Some(t) = &req.accessible_topology {
            usable &= caps::topology_matches(&t.segments, &self.topology());
        }
        let available = if !usable {
            0
        } else if let Some(total) = self.settings.capacity {
            let total = i64::try_from(total).unwrap_or(i64::MAX);
            (total - self.store.read(allocated).await).max(0)
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

    async fn create_snapshot(
        &self,
        req: &pb::CreateSnapshotRequest,
    ) -> Result<pb::CreateSnapshotResponse, Status> {
        let source = caps::id(&req.source_volume_id, "source_volume_id")?;
        let name = caps::name(&req.name, "name")?;
        let _guard = self
            .locks
            .lock(&[snapshot_name_key(name), volume_key(source)])
            .await;
        let existing = self
            .store
            .read(|s| s.snapshots.values().find(|s| s.name == name).cloned())
            .await;
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
        let volume = self
            .store
            .read(|s| s.volumes.get(source).cloned())
            .await
            .ok_or_else(|| Status::not_found(format!("source volume {source} does not exist")))?;
        let id = self
            .store
            .read(|s| new_id("snap", |c| s.snapshots.contains_key(c)))
            .await;
        let dir = self.snapshots_dir.clone();
        let from = self.volume_dir(source);
        let dir_id = id.clone();
        blocking(move || files::create_tree(&dir, &dir_id, Some(&from), SNAPSHOT_DIR_MODE)).await?;
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
            discard_tree(&self.snapshots_dir, &id).await;
            return Err(status);
        }
        tracing::info!(snapshot_id = %id, volume_id = %source, "created snapshot");
        Ok(pb::CreateSnapshotResponse {
            snapshot: Some(record.to_pb()),
        })
    }

    async fn delete_snapshot(
        &self,
        req: &pb::DeleteSnapshotRequest,
    ) -> Result<pb::DeleteSnapshotResponse, Status> {
        let id = caps::id(&req.snapshot_id, "snapshot_id")?;
        let _guard = self.locks.lock(&[snapshot_key(id)]).await;
        if self.store.read(|s| s.snapshots.contains_key(id)).await {
            self.store
                .update(|s| {
                    s.snapshots.remove(id);
                    Ok::<_, Status>(())
                })
                .await?;
            tracing::info!(snapshot_id = %id, "deleted snapshot");
        }
        let dir = self.snapshots_dir.clone();
        let id = id.to_owned();
        blocking(move || files::delete_tree(&dir, &id)).await?;
        Ok(pb::DeleteSnapshotResponse {})
    }

    async fn list_snapshots(
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
            .await;
        Ok(pb::ListSnapshotsResponse {
            entries,
            next_token,
        })
    }

    async fn controller_expand_volume(
        &self,
        req: &pb::ControllerExpandVolumeRequest,
    ) -> Result<pb::ControllerExpandVolumeResponse, Status> {
        let id = caps::id(&req.volume_id, "volume_id")?;
        let range = req
            .capacity_range
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("capacity_range is required"))?;
        if let Some(cap) = &req.volume_capability {
            caps::capability(cap, "volume_capability", Code::InvalidArgument)?;
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
        let _guard = self.locks.lock(&[volume_key(id)]).await;
        let v = self.volume(id).await?;
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

    async fn controller_get_volume(
        &self,
        req: &pb::ControllerGetVolumeRequest,
    ) -> Result<pb::ControllerGetVolumeResponse, Status> {
        let id = caps::id(&req.volume_id, "volume_id")?;
        let v = self.volume(id).await?;
        Ok(pb::ControllerGetVolumeResponse {
            volume: Some(self.volume_pb(&v)),
            status: Some(pb::controller_get_volume_response::VolumeStatus {
                published_node_ids: v.published_nodes.keys().cloned().collect(),
                volume_condition: Some(self.condition(id)),
            }),
        })
    }
}

csi_service!(ControllerService: pb::controller_server::Controller {
    create_volume(pb::CreateVolumeRequest)
        -> pb::CreateVolumeResponse = CreateVolume
        |p, req| p.create_volume(&req).await;
    delete_volume(pb::DeleteVolumeRequest)
        -> pb::DeleteVolumeResponse = DeleteVolume [volume_id]
        |p, req| p.delete_volume(&req).await;
    controller_publish_volume(pb::ControllerPublishVolumeRequest)
        -> pb::ControllerPublishVolumeResponse = ControllerPublishVolume [volume_id]
        |p, req| p.controller_publish_volume(&req).await;
    controller_unpublish_volume(pb::ControllerUnpublishVolumeRequest)
        -> pb::ControllerUnpublishVolumeResponse = ControllerUnpublishVolume [volume_id]
        |p, req| p.controller_unpublish_volume(&req).await;
    validate_volume_capabilities(pb::ValidateVolumeCapabilitiesRequest)
        -> pb::ValidateVolumeCapabilitiesResponse = ValidateVolumeCapabilities [volume_id]
        |p, req| p.validate_volume_capabilities(&req).await;
    list_volumes(pb::ListVolumesRequest)
        -> pb::ListVolumesResponse = ListVolumes
        |p, req| p.list_volumes(&req).await;
    get_capacity(pb::GetCapacityRequest)
        -> pb::GetCapacityResponse = GetCapacity
        |p, req| p.get_capacity(&req).await;
    controller_get_capabilities(pb::ControllerGetCapabilitiesRequest)
        -> pb::ControllerGetCapabilitiesResponse = ControllerGetCapabilities
        |p, _| Ok(pb::ControllerGetCapabilitiesResponse {
            capabilities: controller_capabilities(p.settings.attach),
        });
    create_snapshot(pb::CreateSnapshotRequest)
        -> pb::CreateSnapshotResponse = CreateSnapshot [source_volume_id]
        |p, req| p.create_snapshot(&req).await;
    delete_snapshot(pb::DeleteSnapshotRequest)
        -> pb::DeleteSnapshotResponse = DeleteSnapshot
        |p, req| p.delete_snapshot(&req).await;
    list_snapshots(pb::ListSnapshotsRequest)
        -> pb::ListSnapshotsResponse = ListSnapshots [source_volume_id]
        |p, req| p.list_snapshots(&req).await;
    get_snapshot(pb::GetSnapshotRequest)
        -> pb::GetSnapshotResponse = GetSnapshot
        |_, _| Err(Status::unimplemented(
            "GetSnapshot is not supported (no GET_SNAPSHOT)",
        ));
    controller_expand_volume(pb::ControllerExpandVolumeRequest)
        -> pb::ControllerExpandVolumeResponse = ControllerExpandVolume [volume_id]
        |p, req| p.controller_expand_volume(&req).await;
    controller_get_volume(pb::ControllerGetVolumeRequest)
        -> pb::ControllerGetVolumeResponse = ControllerGetVolume [volume_id]
        |p, req| p.controller_get_volume(&req).await;
    controller_modify_volume(pb::ControllerModifyVolumeRequest)
        -> pb::ControllerModifyVolumeResponse = ControllerModifyVolume [volume_id]
        |_, _| Err(Status::unimplemented(
            "ControllerModifyVolume is not supported (no MODIFY_VOLUME)",
        ));
});

#[cfg(test)]
mod tests {
    use berth_sys::RecordingMounter;

    use super::*;
    use crate::plugin::test_plugin;

    #[test]
    fn ids_are_random_and_avoid_taken_ones() {
        let a = new_id("vol", |_| false);
        assert!(a.starts_with("vol-") && a.len() == 20, "{a}");
        assert!(a[4..].bytes().all(|b| b.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, new_id("vol", |_| false));
        let tries = std::cell::Cell::new(0);
        let b = new_id("snap", |_| {
            tries.set(tries.get() + 1);
            tries.get() < 3
        });
        assert!(b.starts_with("snap-"), "{b}");
        assert_eq!(tries.get(), 3, "drew again until an id was free");
    }

    fn cap() -> pb::VolumeCapability {
        use pb::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
        pb::VolumeCapability {
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(AccessType::Mount(MountVolume::default())),
        }
    }

    async fn create(p: &Plugin, name: &str) -> Result<String, Status> {
        let created = p
            .create_volume(&pb::CreateVolumeRequest {
                name: name.into(),
                volume_capabilities: vec![cap()],
                ..Default::default()
            })
            .await?;
        Ok(created.volume.expect("volume").volume_id)
    }

    async fn delete(p: &Plugin, id: &str) {
        p.delete_volume(&pb::DeleteVolumeRequest {
            volume_id: id.into(),
            ..Default::default()
        })
        .await
        .expect("delete");
    }

    /// Makes every later state write fail: the state file becomes a non-empty directory, which
    /// nothing can be renamed over.
    fn break_state_file(p: &Plugin) {
        let path = p.settings.statedir.join("state.json");
        std::fs::remove_file(&path).expect("remove state.json");
        std::fs::create_dir_all(path.join("in-the-way")).expect("mkdir");
    }

    fn entries(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect()
    }

    #[tokio::test]
    async fn a_late_delete_of_an_old_id_spares_the_volume_created_again_under_its_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = test_plugin(dir.path(), Arc::new(RecordingMounter::new()), true, false);
        let old = create(&p, "pvc-1").await.expect("create");
        assert_eq!(create(&p, "pvc-1").await.expect("again"), old, "idempotent");
        delete(&p, &old).await;

        let new = create(&p, "pvc-1").await.expect("create again");
        assert_ne!(new, old, "a new volume gets a new id");
        // A retried DeleteVolume of the old volume arrives late.
        delete(&p, &old).await;
        assert!(p.store.read(|s| s.volumes.contains_key(&new)).await);
        assert!(
            p.volume_dir(&new).is_dir(),
            "the new volume's directory is kept"
        );
    }

    #[tokio::test]
    async fn creates_whose_record_cannot_be_saved_leave_no_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = test_plugin(dir.path(), Arc::new(RecordingMounter::new()), true, false);
        let source = create(&p, "source").await.expect("create");
        break_state_file(&p);

        let status = p
            .create_snapshot(&pb::CreateSnapshotRequest {
                source_volume_id: source.clone(),
                name: "snap".into(),
                ..Default::default()
            })
            .await
            .expect_err("the record cannot be saved");
        assert_eq!(status.code(), Code::Internal, "{}", status.message());
        assert_eq!(entries(&p.snapshots_dir), Vec::<String>::new());
        assert!(p.store.read(|s| s.snapshots.is_empty()).await);

        let status = create(&p, "other").await.expect_err("not saved either");
        assert_eq!(status.code(), Code::Internal, "{}", status.message());
        assert_eq!(entries(&p.volumes_dir), [source]);
    }

    #[test]
    fn pages_and_tokens() {
        let keys: Vec<String> = (1..=5).map(|i| format!("k{i}")).collect();
        let items = || keys.iter().map(|k| (k, k.clone()));
        let (first, token) = page(items(), None, 2);
        assert_eq!(first, ["k1", "k2"]);
        assert_eq!(token, "after:k2");
        let after = parse_token(&token).expect("valid");
        let (second, token) = page(items(), after, 3);
        assert_eq!(second, ["k3", "k4", "k5"]);
        assert_eq!(token, "");
        let (all, token) = page(items(), None, 0);
        assert_eq!((all.len(), token.as_str()), (5, ""));
        assert_eq!(parse_token("garbage").unwrap_err().code(), Code::Aborted);
        assert_eq!(parse_token("after:").unwrap_err().code(), Code::Aborted);
        assert_eq!(parse_token("").ok(), Some(None));
    }
}
