//! A volume's status: the catalog's record, this node's usages, and stats.

use super::*;

/// How long a volume status waits for one target's NodeGetVolumeStats.
pub(super) const STATS_TIMEOUT: Duration = Duration::from_secs(2);

impl Volumes {
    /// `GET /v1/volume/csi/{id}`.
    pub async fn status(self: &Arc<Self>, id: &str) -> Result<VolumeStatus, ApiError> {
        let vol = self
            .cp
            .volume(id)
            .map_err(cp_error)?
            .ok_or_else(|| ApiError::NotFound(format!("no volume {id:?}")))?;
        let mut usages = Vec::new();
        if let Some(plugin) = self.existing_node_plugin(&vol.plugin_id) {
            // Stats only from the instance that serves now, and never for long: a status
            // must not hang on a plugin that went away.
            let live = self.active_node_socket(&vol.plugin_id).as_ref() == Some(&plugin.socket);
            for rec in plugin.manager.usages_of(id).map_err(|e| vol_error(&e))? {
                let mut allocs = Vec::new();
                for (alloc_id, state) in &rec.allocs {
                    let target = plugin
                        .manager
                        .paths()
                        .publish(id, alloc_id, rec.usage)
                        .unwrap_or_default();
                    let stats = if live && *state == PublishState::Published {
                        tokio::time::timeout(STATS_TIMEOUT, plugin.manager.stats(id, alloc_id))
                            .await
                            .ok()
                            .and_then(|r| r.ok().flatten())
                    } else {
                        None
                    };
                    allocs.push(PublishedView {
                        alloc_id: alloc_id.clone(),
                        state: publish_state(*state).into(),
                        target,
                        stats,
                    });
                }
                usages.push(UsageView {
                    usage: rec.usage.dir_name(),
                    mount_options: options_view(&rec.full_usage().mount_options),
                    staging: rec.staging.map(|s| stage_state(s).to_string()),
                    allocs,
                });
            }
        }
        Ok(status_of(&vol, usages))
    }
}

pub(super) fn publish_state(s: PublishState) -> &'static str {
    match s {
        PublishState::Publishing => "publishing",
        PublishState::Published => "published",
        PublishState::Unpublishing => "unpublishing",
    }
}

pub(super) fn stage_state(s: StageState) -> &'static str {
    match s {
        StageState::Staging => "staging",
        StageState::Staged => "staged",
        StageState::Unstaging => "unstaging",
    }
}

pub(super) fn options_view(o: &MountOptions) -> MountOptionsView {
    MountOptionsView {
        fs_type: o.fs_type.clone(),
        mount_flags: (!o.mount_flags.is_empty()).then(|| berth_api::volumes::REDACTED.to_string()),
    }
}

pub(super) fn claim_view(c: &ClaimRecord) -> ClaimView {
    ClaimView {
        alloc_id: c.claim.alloc_id.clone(),
        node_id: c.claim.node_id.clone(),
        mode: c.claim.mode.to_string(),
        access_mode: c.claim.access_mode,
        attachment_mode: c.claim.attachment_mode,
        state: match c.state {
            ClaimState::Claiming => ApiClaimState::Claiming,
            ClaimState::Claimed => ApiClaimState::Claimed,
            ClaimState::Releasing => ApiClaimState::Releasing,
        },
        error: c.error.clone(),
    }
}

pub(super) fn status_of(v: &VolumeRecord, usages: Vec<UsageView>) -> VolumeStatus {
    VolumeStatus {
        id: v.id.clone(),
        name: v.name.clone(),
        plugin_id: v.plugin_id.clone(),
        external_id: v.external_id.as_str().to_string(),
        origin: match v.origin {
            Origin::Registered => VolumeOrigin::Registered,
            Origin::Created => VolumeOrigin::Created,
        },
        capabilities: v
            .capabilities
            .iter()
            .map(|c| CapabilityView {
                access_mode: c.access_mode,
                attachment_mode: c.attachment_mode,
            })
            .collect(),
        mount_options: options_view(&(&v.mount_options).into()),
        capacity_bytes: v.capacity_bytes,
        parameters: v.parameters.clone(),
        context: v.context.clone(),
        secret_names: v.secrets.names(),
        topology: v.topology.clone(),
        controller_required: v.controller_publish,
        claims: v.claims.values().map(claim_view).collect(),
        usages,
        created_ms: v.created_ms,
    }
}
