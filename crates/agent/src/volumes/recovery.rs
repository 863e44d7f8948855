//! Recovery at start (and when a node plugin becomes usable): reconcile, then drive every claim
//! of this node to its end; background retries of interrupted claims and clean-ups.

use super::*;

impl Volumes {
    /// Starts the recovery of every node plugin that has volume state on this node: each one
    /// is reconciled as soon as it is healthy (retried until it is, or until shutdown).
    pub fn start(self: &Arc<Self>) {
        let mut plugins: std::collections::BTreeSet<String> = self
            .store
            .list::<berth_volumemgr::UsageRecord>(berth_state::Table::USAGES)
            .map(|l| l.into_iter().map(|(_, r)| r.plugin_id).collect())
            .unwrap_or_default();
        if let Ok(claims) = self.cp.node_claims(&self.node_id) {
            plugins.extend(claims.into_iter().map(|(v, _)| v.plugin_id));
        }
        for plugin_id in plugins {
            let this = Arc::clone(self);
            self.tasks.spawn(async move {
                let mut wait = RETRY_FIRST;
                loop {
                    match this.node_plugin(&plugin_id).await {
                        Ok(_) => return,
                        Err(e) => {
                            tracing::warn!(plugin = %plugin_id, error = %e, "volume recovery waits for the plugin");
                        }
                    }
                    if !this.pause(wait).await {
                        return;
                    }
                    wait = next_wait(wait);
                }
            });
        }
    }

    /// Reconciles the plugin's records with the mount table, then drives every claim of this
    /// node on its volumes to its end (`claiming` and `claimed` → mounted, `releasing` →
    /// released), unmounts allocs published without a claim and releases unused usages.
    /// Runs inside the plugin's initialization: it uses `plugin` directly, never
    /// [`Volumes::node_plugin`].
    pub(super) async fn recover(self: &Arc<Self>, plugin_id: &str, plugin: &Arc<NodePlugin>) {
        let cp = &self.cp;
        let secrets = |volume_id: &str| {
            cp.volume(volume_id)
                .ok()
                .flatten()
                .map(|v| v.secrets.to_secrets())
                .unwrap_or_default()
        };
        let started = std::time::Instant::now();
        // The claims first: an alloc whose claim is being released (or gone) is unpublished by
        // the reconcile, never published again. Unreadable claims: every recorded alloc is
        // mounted as recorded, and nothing is driven.
        let claims = self.cp.node_claims(&self.node_id);
        let held: Option<HashSet<(String, String)>> = claims.as_ref().ok().map(|claims| {
            claims
                .iter()
                .flat_map(|(v, recs)| {
                    recs.iter()
                        .filter(|c| c.state != ClaimState::Releasing)
                        .map(|c| (v.id.clone(), c.claim.alloc_id.clone()))
                })
                .collect()
        });
        let leaving = |volume_id: &str, alloc_id: &str| {
            held.as_ref()
                .is_some_and(|h| !h.contains(&(volume_id.to_string(), alloc_id.to_string())))
        };
        let report = plugin.manager.reconcile(&secrets, &leaving).await;
        // Allocs the node still publishes, mounted, as recorded: their claims need nothing.
        let mut kept: HashSet<(String, String)> = HashSet::new();
        for a in &report.actions {
            match a {
                berth_volumemgr::ReconcileAction::Kept {
                    volume_id,
                    alloc_id,
                    ..
                } => {
                    tracing::debug!(plugin = plugin_id, action = ?a, "reconciled");
                    kept.insert((volume_id.clone(), alloc_id.clone()));
                }
                _ => tracing::info!(plugin = plugin_id, action = ?a, "reconciled"),
            }
        }
        for e in &report.errors {
            tracing::warn!(plugin = plugin_id, error = %error_chain(e), "reconcile failed for a record");
        }
        let claims = match claims {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the claims of this node");
                return;
            }
        };
        let mut claimed: HashSet<(String, String)> = HashSet::new();
        let (mut driven, mut releasing) = (0usize, 0usize);
        for (vol, recs) in claims.into_iter().filter(|(v, _)| v.plugin_id == plugin_id) {
            for c in recs {
                let alloc_id = c.claim.alloc_id.clone();
                let key = (vol.id.clone(), alloc_id.clone());
                claimed.insert(key.clone());
                match c.state {
                    // Claimed and mounted as recorded: the claim is at its end already.
                    ClaimState::Claimed if kept.contains(&key) => {}
                    ClaimState::Claiming | ClaimState::Claimed => {
                        driven += 1;
                        let _lock = self.alloc_locks.lock(&alloc_key(&vol.id, &alloc_id)).await;
                        if let Err(e) = self.drive_claim(plugin, &vol.id, &c).await {
                            let text = self.scrubbed(&vol.id, &e);
                            tracing::warn!(volume_id = %vol.id, alloc_id, error = %text, "cannot finish an interrupted claim; retrying");
                            self.note_failure(&vol.id, &alloc_id, &text).await;
                            self.drive_in_background(vol.id.clone(), alloc_id);
                        }
                    }
                    ClaimState::Releasing => {
                        releasing += 1;
                        self.release_in_background(vol.id.clone(), alloc_id, Duration::ZERO);
                    }
                }
            }
        }
        let volumes: std::collections::BTreeSet<String> = plugin
            .manager
            .records()
            .map(|r| r.into_iter().map(|r| r.volume_id).collect())
            .unwrap_or_default();
        for volume_id in volumes {
            if let Err(e) = self.clean_node(plugin, &volume_id, &claimed).await {
                tracing::warn!(volume_id, error = %error_chain(&e), "cannot clean up the node's usages; retrying");
                self.clean_in_background(plugin_id.to_string(), volume_id);
            }
        }
        let reason = format!(
            "{} allocs kept mounted, {} steps done again, {} records failed (retrying); {} claims driven, {} releases resumed; in {} ms",
            kept.len(),
            report.actions.len() - kept.len(),
            report.errors.len(),
            driven,
            releasing,
            started.elapsed().as_millis()
        );
        self.events
            .emit(EventKind::PluginVolumesRecovered, plugin_id, None, reason);
    }

    /// Unmounts the allocs of the volume that the node publishes without a claim, and releases
    /// the usages no alloc uses.
    pub(super) async fn clean_node(
        &self,
        plugin: &NodePlugin,
        volume_id: &str,
        claimed: &HashSet<(String, String)>,
    ) -> Result<(), VolumeError> {
        for alloc_id in plugin.manager.allocs_of(volume_id)? {
            if !claimed.contains(&(volume_id.to_string(), alloc_id.clone())) {
                tracing::info!(volume_id, alloc_id, "unmounting an alloc without a claim");
                plugin.manager.unmount(volume_id, &alloc_id).await?;
            }
        }
        plugin.manager.release_unused(volume_id).await.map(drop)
    }

    /// Retries [`Volumes::clean_node`] with backoff until it succeeds or the agent stops.
    pub(super) fn clean_in_background(self: &Arc<Self>, plugin_id: String, volume_id: String) {
        let this = Arc::clone(self);
        self.tasks.spawn(async move {
            let mut wait = RETRY_FIRST;
            loop {
                if !this.pause(wait).await {
                    return;
                }
                wait = next_wait(wait);
                let Ok(plugin) = this.node_plugin(&plugin_id).await else {
                    continue;
                };
                let claimed: HashSet<(String, String)> = this
                    .cp
                    .volume(&volume_id)
                    .ok()
                    .flatten()
                    .map(|v| {
                        v.claims
                            .into_values()
                            .map(|c| (volume_id.clone(), c.claim.alloc_id))
                            .collect()
                    })
                    .unwrap_or_default();
                match this.clean_node(&plugin, &volume_id, &claimed).await {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::warn!(volume_id, error = %error_chain(&e), "node clean-up failed; retrying");
                    }
                }
            }
        });
    }

    /// Retries an interrupted claim until it is mounted, the claim is gone or released, or the
    /// agent stops. A claim that was never mounted (`claiming`) and fails for good is released.
    pub(super) fn drive_in_background(self: &Arc<Self>, volume_id: String, alloc_id: String) {
        let this = Arc::clone(self);
        self.tasks.spawn(async move {
            let mut wait = RETRY_FIRST;
            loop {
                if !this.pause(wait).await {
                    return;
                }
                wait = next_wait(wait);
                let Ok(Some(vol)) = this.cp.volume(&volume_id) else {
                    return;
                };
                let Ok(plugin) = this.node_plugin(&vol.plugin_id).await else {
                    continue;
                };
                let _lock = this.alloc_locks.lock(&alloc_key(&volume_id, &alloc_id)).await;
                let claim = match this.cp.volume(&volume_id) {
                    Ok(Some(v)) => v.claims.get(&alloc_id).cloned(),
                    _ => None,
                };
                let Some(claim) = claim.filter(|c| c.state != ClaimState::Releasing) else {
                    return;
                };
                match this.drive_claim(&plugin, &volume_id, &claim).await {
                    Ok(_) => {
                        tracing::info!(volume_id, alloc_id, "interrupted claim finished");
                        return;
                    }
                    Err(e) => {
                        let text = this.scrubbed(&volume_id, &e);
                        if claim.state == ClaimState::Claiming && !e.is_retryable() {
                            tracing::warn!(volume_id, alloc_id, error = %text, "interrupted claim failed for good; releasing it");
                            let _ = this.cp.begin_release(&volume_id, &alloc_id).await;
                            drop(_lock);
                            this.release_in_background(volume_id, alloc_id, Duration::ZERO);
                            return;
                        }
                        this.note_failure(&volume_id, &alloc_id, &text).await;
                    }
                }
            }
        });
    }
}
