//! A volume's status: the catalog's record, this node's usages, and stats.

use super::*;

/// How long a volume status waits, in all, for the NodeGetVolumeStats of its targets (asked
/// at once): a status answers promptly even when the plugin hangs.
pub(super) const STATS_BUDGET: Duration = Duration::from_millis(500);

impl Volumes {
    /// `GET /v1/volume/csi/{id}`: the catalog's record and this node's usages as persisted
    /// (whether or not the node plugin is back after a restart), with stats from the live
    /// node instance when it answers within [`STATS_BUDGET`]. Never waits for an operation on
    /// the volume: a stage or publish in flight shows as `staging` / `publishing`.
    pub async fn status(self: &Arc<Self>, id: &str) -> Result<VolumeStatus, ApiError> {
        let vol = self
            .cp
            .volume(id)
            .map_err(cp_error)?
            .ok_or_else(|| ApiError::NotFound(format!("no volume {id:?}")))?;
        let records = berth_volumemgr::volume_records(&self.store, &vol.plugin_id, id)
            .map_err(|e| vol_error(&e))?;
        if records.is_empty() {
            return Ok(status_of(&vol, Vec::new()));
        }
        let paths = self.plugin_paths(&vol.plugin_id);
        // Stats only from the instance that serves now.
        let live = self
            .existing_node_plugin(&vol.plugin_id)
            .filter(|p| self.active_node_socket(&vol.plugin_id).as_ref() == Some(&p.socket));
        let deadline = tokio::time::Instant::now() + STATS_BUDGET;
        let mut usages = Vec::new();
        for rec in records {
            let asks = rec.allocs.iter().map(|(alloc_id, state)| {
                let live = live.as_ref().filter(|_| *state == PublishState::Published);
                async move {
                    let plugin = live?;
                    tokio::time::timeout_at(deadline, plugin.manager.stats(id, alloc_id))
                        .await
                        .ok()
                        .and_then(|r| r.ok().flatten())
                }
            });
            let stats = futures::future::join_all(asks).await;
            let allocs = rec
                .allocs
                .iter()
                .zip(stats)
                .map(|((alloc_id, state), stats)| PublishedView {
                    alloc_id: alloc_id.clone(),
                    state: publish_state(*state).into(),
                    target: paths
                        .as_ref()
                        .and_then(|p| p.publish(id, alloc_id, rec.usage).ok())
                        .unwrap_or_default(),
                    stats,
                })
                .collect();
            usages.push(UsageView {
                usage: rec.usage.dir_name(),
                mount_options: options_view(&rec.full_usage().mount_options),
                staging: rec.staging.map(|s| stage_state(s).to_string()),
                allocs,
            });
        }
        Ok(status_of(&vol, usages))
    }

    /// Where the plugin's staging and publish paths are on this node: from its registered
    /// node instance's type, else (the plugin is gone, its volumes still mounted) from the
    /// directory its type left under the data dir.
    fn plugin_paths(&self, plugin_id: &str) -> Option<PluginPaths> {
        let registered = self
            .registry
            .instances(plugin_id)
            .into_iter()
            .find(|r| r.plugin_type.is_node())
            .and_then(|r| r.plugin_type.as_str().parse::<PluginDir>().ok());
        let dir = registered.or_else(|| {
            [PluginDir::Monolith, PluginDir::Node]
                .into_iter()
                .find(|d| {
                    PluginPaths::new(&self.data_dir, *d, plugin_id).is_ok_and(|p| p.root().is_dir())
                })
        })?;
        PluginPaths::new(&self.data_dir, dir, plugin_id).ok()
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
        warnings: Vec::new(),
    }
}
