//! Claims: granted by the control plane, then staged and published on this node.

use super::*;

impl Volumes {
    /// The claim's controller and node steps (idempotent), with the mount options it was made
    /// with; returns the target and the publish context. The caller holds the alloc's lock.
    pub(super) async fn drive_claim(
        &self,
        plugin: &NodePlugin,
        volume_id: &str,
        claim: &ClaimRecord,
    ) -> Result<(PathBuf, BTreeMap<String, String>), StepError> {
        let alloc_id = claim.claim.alloc_id.clone();
        let grant = self
            .cp
            .claim(NodeClaim {
                volume_id: volume_id.to_string(),
                claim: claim.claim.clone(),
                csi_node_id: plugin.csi_node_id.clone(),
                mount_options: claim.mount_options.clone(),
            })
            .await
            .map_err(StepError::Cp)?;
        if let Some(h) = &self.hook {
            h.hit("claim:persisted");
        }
        let usage = Usage {
            read_only: claim.claim.mode == ClaimMode::Read,
            attachment_mode: claim.claim.attachment_mode,
            access_mode: claim.claim.access_mode,
            mount_options: (&claim.mount_options).into(),
        };
        let target = plugin
            .manager
            .mount(MountRequest {
                volume_id: volume_id.to_string(),
                external_id: grant.volume.external_id.clone(),
                alloc_id: alloc_id.clone(),
                usage,
                publish_context: grant.publish_context.clone(),
                volume_context: grant.volume.context.clone(),
                secrets: grant.volume.secrets.to_secrets(),
            })
            .await
            .map_err(StepError::Node)?;
        // Answered only once the node's records of the mount are durable too (in a fleet the
        // confirm does not make them so; both run at once).
        let (synced, confirmed) = tokio::join!(
            self.sync_node_records(volume_id),
            self.cp.confirm(volume_id, &alloc_id)
        );
        synced?;
        confirmed.map_err(StepError::Cp)?;
        Ok((target, grant.publish_context))
    }

    /// `POST /v1/volume/csi/{id}/claim`: claims and mounts. Everything in the request is checked
    /// before anything changes. A claim that fails after it was granted is released again (in
    /// the background), unless the alloc held it, mounted, before this call.
    pub async fn claim(
        self: &Arc<Self>,
        id: &str,
        req: ClaimRequest,
    ) -> Result<ClaimResponse, ApiError> {
        let vol = self
            .cp
            .volume(id)
            .map_err(cp_error)?
            .ok_or_else(|| ApiError::NotFound(format!("no volume {id:?}")))?;
        let request_options = MountOptions {
            fs_type: req
                .mount_options
                .as_ref()
                .and_then(|o| o.fs_type.clone())
                .unwrap_or_default(),
            mount_flags: MountFlags::new(
                req.mount_options
                    .as_ref()
                    .and_then(|o| o.mount_flags.clone())
                    .map(|f| f.0)
                    .unwrap_or_default(),
            ),
            volume_mount_group: String::new(),
        };
        let merged = merge_mount_options(&(&vol.mount_options).into(), &request_options);
        check_mount_flags(&merged.mount_flags)
            .map_err(|e| ApiError::BadRequest(format!("mount_options.mount_flags: {e}")))?;
        let claim = ClaimRecord {
            claim: Claim {
                alloc_id: req.alloc_id.clone(),
                node_id: self.node_id.clone(),
                mode: if req.read_only {
                    ClaimMode::Read
                } else {
                    ClaimMode::Write
                },
                access_mode: req.access_mode,
                attachment_mode: req.attachment_mode,
            },
            state: ClaimState::Claiming,
            error: None,
            mount_options: (&merged).into(),
        };
        let mut set = vol
            .claim_set()
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        set.claim(&vol.capability_pairs(), claim.claim.clone())
            .map_err(|e| {
                ApiError::Conflict(format!(
                    "volume {id:?}: claim by alloc {:?} refused: {e}",
                    req.alloc_id
                ))
            })?;
        // The plugin first, then the alloc's lock (the plugin's recovery takes alloc locks).
        let plugin = self.node_plugin(&vol.plugin_id).await?;
        let lock = self.alloc_locks.lock(&alloc_key(id, &req.alloc_id)).await;
        // What the node holds of the volume may refuse the usage (one staging per volume):
        // refused before the control plane grants anything.
        let usage = Usage {
            read_only: claim.claim.mode == ClaimMode::Read,
            attachment_mode: claim.claim.attachment_mode,
            access_mode: claim.claim.access_mode,
            mount_options: merged.clone(),
        };
        plugin
            .manager
            .check_mount(id, &vol.external_id, &usage)
            .map_err(|e| self.api_error(id, StepError::Node(e)))?;
        let held_before = self
            .cp
            .volume(id)
            .ok()
            .flatten()
            .and_then(|v| v.claims.get(&req.alloc_id).map(|c| c.state))
            == Some(ClaimState::Claimed);
        match self.drive_claim(&plugin, id, &claim).await {
            Ok((target, publish_context)) => {
                let usage_name = plugin
                    .manager
                    .alloc_target(id, &req.alloc_id)
                    .ok()
                    .flatten()
                    .map_or_else(String::new, |(r, _)| r.usage.dir_name());
                self.events.emit_volume(
                    EventKind::VolumeClaimed,
                    &vol.plugin_id,
                    id,
                    Some(&req.alloc_id),
                    format!("claimed for {} as {usage_name}", claim.claim.mode),
                );
                Ok(ClaimResponse {
                    volume_id: id.to_string(),
                    alloc_id: req.alloc_id,
                    node_id: self.node_id.clone(),
                    usage: usage_name,
                    target,
                    publish_context,
                })
            }
            Err(e) => {
                // Refusals happen before anything is written.
                let refused = matches!(
                    e,
                    StepError::Cp(
                        ControlPlaneError::Refused { .. }
                            | ControlPlaneError::Conflict(_)
                            | ControlPlaneError::NoVolume(_)
                            | ControlPlaneError::Invalid(_)
                    )
                );
                let err = self.api_error(id, e);
                if !refused && !held_before {
                    tracing::warn!(volume_id = id, alloc_id = %req.alloc_id, error = %err, "claim failed; releasing it");
                    if self.cp.begin_release(id, &req.alloc_id).await.is_ok() {
                        drop(lock);
                        self.release_in_background(
                            id.to_string(),
                            req.alloc_id.clone(),
                            Duration::ZERO,
                        );
                    }
                }
                Err(err)
            }
        }
    }
}
