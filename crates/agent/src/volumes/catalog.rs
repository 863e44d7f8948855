//! The volume catalog's operations: list, register/create, deregister, delete, expand.

use super::*;

impl Volumes {
    /// `GET /v1/volumes`.
    pub fn list(&self) -> Result<VolumeList, ApiError> {
        let volumes = self
            .cp
            .list()
            .map_err(cp_error)?
            .into_iter()
            .map(|v| VolumeSummary {
                access_modes: v.capabilities.iter().map(|c| c.access_mode).collect(),
                read_claims: v
                    .claims
                    .values()
                    .filter(|c| c.claim.mode == ClaimMode::Read)
                    .count(),
                write_claims: v
                    .claims
                    .values()
                    .filter(|c| c.claim.mode == ClaimMode::Write)
                    .count(),
                id: v.id,
                name: v.name,
                plugin_id: v.plugin_id,
                external_id: v.external_id.as_str().to_string(),
                capacity_bytes: v.capacity_bytes,
                controller_required: v.controller_publish,
            })
            .collect();
        Ok(VolumeList { volumes })
    }

    /// `POST /v1/volumes/register|create`. Creating a volume that berth already created, with
    /// a `capacity_min` above its capacity, expands it (as Nomad does).
    pub async fn put(
        self: &Arc<Self>,
        op: SpecOp,
        req: VolumeSpecRequest,
    ) -> Result<VolumeStatus, ApiError> {
        let file = PathBuf::from(req.file.clone().unwrap_or_else(|| "request body".into()));
        let operation = match op {
            SpecOp::Register => Operation::Register,
            SpecOp::Create => Operation::Create,
        };
        let spec = match req.format {
            SpecFormat::Hcl => VolumeSpec::parse_hcl(operation, &file, &req.spec),
            SpecFormat::Json => VolumeSpec::parse_json(operation, &file, &req.spec),
        }
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
        let mut warnings = spec.warnings.clone();
        if let berth_volume::SpecKind::Create {
            capacity_min: Some(min),
            capacity_max,
            ..
        } = &spec.kind
            && let Some(old) = self.cp.volume(&spec.id).map_err(cp_error)?
            && old.origin == Origin::Created
            && old.name == spec.name
            && old.plugin_id == spec.plugin_id
            && i64::try_from(*min).unwrap_or(i64::MAX) > old.capacity_bytes
        {
            let grown = self
                .expand(
                    &spec.id,
                    ExpandRequest {
                        capacity_min: *min,
                        capacity_max: *capacity_max,
                    },
                )
                .await?;
            warnings.push(format!(
                "volume {:?} exists: expanded from {} to {} bytes",
                spec.id, old.capacity_bytes, grown.capacity_bytes
            ));
        }
        let rec = self.cp.put(&spec).await.map_err(cp_error)?;
        self.events.emit_volume(
            EventKind::VolumeRegistered,
            &rec.plugin_id,
            &rec.id,
            None,
            match rec.origin {
                Origin::Registered => "registered",
                Origin::Created => "created",
            },
        );
        let mut status = status_of(&rec, Vec::new());
        status.warnings = warnings;
        Ok(status)
    }

    /// `DELETE /v1/volume/csi/{id}`.
    pub async fn deregister(
        self: &Arc<Self>,
        id: &str,
        force: bool,
    ) -> Result<DetachResponse, ApiError> {
        let vol = self
            .cp
            .volume(id)
            .map_err(cp_error)?
            .ok_or_else(|| ApiError::NotFound(format!("no volume {id:?}")))?;
        let mut out = DetachResponse::default();
        if force && !vol.claims.is_empty() {
            if let Some(other) = vol
                .claims
                .values()
                .find(|c| c.claim.node_id != self.node_id)
            {
                return Err(ApiError::Conflict(format!(
                    "volume {id:?} is claimed by alloc {:?} on node {:?}; it can only be released there",
                    other.claim.alloc_id, other.claim.node_id
                )));
            }
            out = self.detach(id, DetachRequest::default()).await?;
            if let Some(pending) = out.releases.iter().find(|r| !r.released) {
                return Err(ApiError::Conflict(format!(
                    "volume {id:?}: the claim of alloc {:?} is still being released ({}); deregister again when it is gone",
                    pending.alloc_id,
                    pending.error.as_deref().unwrap_or("retrying")
                )));
            }
        }
        if !self.cp.deregister(id).await.map_err(cp_error)? {
            return Err(ApiError::NotFound(format!("no volume {id:?}")));
        }
        self.events.emit_volume(
            EventKind::VolumeDeregistered,
            &vol.plugin_id,
            id,
            None,
            "deregistered",
        );
        Ok(out)
    }

    /// `POST /v1/volume/csi/{id}/delete`.
    pub async fn delete(&self, id: &str) -> Result<(), ApiError> {
        let vol = self
            .cp
            .volume(id)
            .map_err(cp_error)?
            .ok_or_else(|| ApiError::NotFound(format!("no volume {id:?}")))?;
        self.cp.delete(id).await.map_err(cp_error)?;
        self.events.emit_volume(
            EventKind::VolumeDeregistered,
            &vol.plugin_id,
            id,
            None,
            "deleted",
        );
        Ok(())
    }

    /// `POST /v1/volume/csi/{id}/expand`.
    pub async fn expand(
        self: &Arc<Self>,
        id: &str,
        req: ExpandRequest,
    ) -> Result<ExpandResponse, ApiError> {
        let capacity = CapacityRange {
            required_bytes: i64::try_from(req.capacity_min).unwrap_or(i64::MAX),
            limit_bytes: req
                .capacity_max
                .map_or(0, |m| i64::try_from(m).unwrap_or(i64::MAX)),
        };
        let vol = self
            .cp
            .volume(id)
            .map_err(cp_error)?
            .ok_or_else(|| ApiError::NotFound(format!("no volume {id:?}")))?;
        if capacity.required_bytes < vol.capacity_bytes {
            return Err(ApiError::BadRequest(format!(
                "capacity_min: {} bytes is below the volume's size ({} bytes); volumes only grow",
                capacity.required_bytes, vol.capacity_bytes
            )));
        }
        let (bytes, node_required) = self.cp.expand(id, capacity).await.map_err(cp_error)?;
        let mut node_expanded = false;
        if node_required
            && let Some(plugin) = self.node_plugin_for(&vol).await?
            && plugin
                .caps
                .has(berth_csi::model::NodeCapability::ExpandVolume)
        {
            let done = plugin
                .manager
                .expand(
                    id,
                    CapacityRange {
                        required_bytes: bytes,
                        limit_bytes: capacity.limit_bytes,
                    },
                    &vol.secrets.to_secrets(),
                )
                .await
                .map_err(|e| vol_error(&e))?;
            node_expanded = !done.is_empty();
        }
        Ok(ExpandResponse {
            volume_id: id.to_string(),
            capacity_bytes: bytes,
            node_expanded,
        })
    }
}
