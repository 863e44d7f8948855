//! Releases in CSI order, and their background retries.

use super::*;

impl Volumes {
    /// The release steps once the claim is marked releasing: node unpublish (and unstage when
    /// last), unused usages released, then controller unpublish and the claim freed. The caller
    /// holds the alloc's lock.
    pub(super) async fn release_steps(
        &self,
        plugin: &NodePlugin,
        vol: &VolumeRecord,
        alloc_id: &str,
    ) -> Result<(), StepError> {
        plugin
            .manager
            .unmount(&vol.id, alloc_id)
            .await
            .map_err(StepError::Node)?;
        plugin
            .manager
            .release_unused(&vol.id)
            .await
            .map_err(StepError::Node)?;
        // The node's side durably done before ControllerUnpublishVolume: a crash after it
        // must not find the volume still staged here.
        self.sync_node_records(&vol.id).await?;
        self.cp
            .finish_release(&vol.id, alloc_id)
            .await
            .map_err(StepError::Cp)?;
        self.events.emit_volume(
            EventKind::VolumeReleased,
            &vol.plugin_id,
            &vol.id,
            Some(alloc_id),
            "unpublished and released",
        );
        Ok(())
    }

    /// Marks the claim releasing and runs the release; on failure the claim stays releasing and
    /// the release is retried in the background. No claim: whatever the node still publishes for
    /// the alloc is unmounted.
    pub(super) async fn release(
        self: &Arc<Self>,
        vol: &VolumeRecord,
        alloc_id: &str,
    ) -> ReleaseResponse {
        let volume_id = vol.id.as_str();
        let mut resp = ReleaseResponse {
            volume_id: volume_id.to_string(),
            alloc_id: alloc_id.to_string(),
            released: false,
            error: None,
        };
        let has_claim = vol.claims.contains_key(alloc_id);
        let plugin = if has_claim {
            self.node_plugin(&vol.plugin_id).await.map(Some)
        } else {
            self.node_plugin_for(vol).await
        };
        let plugin = match plugin {
            Ok(p) => p,
            Err(e) if has_claim => {
                // The node plugin is not there: the claim is kept, releasing, and retried.
                let text = self.scrubbed(volume_id, &StepError::Api(e));
                if self.cp.begin_release(volume_id, alloc_id).await.is_ok() {
                    self.note_failure(volume_id, alloc_id, &text).await;
                    self.release_in_background(
                        volume_id.to_string(),
                        alloc_id.to_string(),
                        RETRY_FIRST,
                    );
                }
                resp.error = Some(text);
                return resp;
            }
            Err(e) => {
                resp.error = Some(self.scrubbed(volume_id, &StepError::Api(e)));
                return resp;
            }
        };
        let _lock = self.alloc_locks.lock(&alloc_key(volume_id, alloc_id)).await;
        match self.cp.begin_release(volume_id, alloc_id).await {
            Ok(Some(_)) => {}
            Ok(None) => {
                // No claim (freed while this node was away, say): the node's side still goes,
                // the usage unstaged when no other alloc here uses it.
                if let Some(plugin) = plugin {
                    let done = match plugin.manager.unmount(volume_id, alloc_id).await {
                        Ok(()) => plugin.manager.release_unused(volume_id).await.map(drop),
                        Err(e) => Err(e),
                    };
                    if let Err(e) = done {
                        resp.error = Some(self.scrubbed(volume_id, &StepError::Node(e)));
                        return resp;
                    }
                }
                resp.released = true;
                return resp;
            }
            Err(e) => {
                resp.error = Some(self.scrubbed(volume_id, &StepError::Cp(e)));
                return resp;
            }
        }
        if let Some(h) = &self.hook {
            h.hit("release:persisted");
        }
        let Some(plugin) = plugin else {
            resp.error = Some("internal: no node plugin for a claimed volume".into());
            return resp;
        };
        match self.release_steps(&plugin, vol, alloc_id).await {
            Ok(()) => resp.released = true,
            Err(e) => {
                let text = self.scrubbed(volume_id, &e);
                self.note_failure(volume_id, alloc_id, &text).await;
                resp.error = Some(text);
                drop(_lock);
                self.release_in_background(
                    volume_id.to_string(),
                    alloc_id.to_string(),
                    RETRY_FIRST,
                );
            }
        }
        resp
    }

    /// Retries the release of one claim that is marked releasing, first after `first_delay`,
    /// then with doubling waits, until it is freed, the claim is gone or no longer releasing
    /// (a newer claim by the alloc is never touched), or the agent stops. One task per claim.
    pub(super) fn release_in_background(
        self: &Arc<Self>,
        volume_id: String,
        alloc_id: String,
        first_delay: Duration,
    ) {
        {
            let mut set = self.retrying.lock().unwrap_or_else(|p| p.into_inner());
            if !set.insert((volume_id.clone(), alloc_id.clone())) {
                return;
            }
        }
        let this = Arc::clone(self);
        self.tasks.spawn(async move {
            let mut delay = first_delay;
            let mut wait = RETRY_FIRST;
            loop {
                if !this.pause(delay).await {
                    break;
                }
                delay = wait;
                wait = next_wait(wait);
                let Ok(Some(vol)) = this.cp.volume(&volume_id) else {
                    break;
                };
                let plugin = match this.node_plugin(&vol.plugin_id).await {
                    Ok(p) => p,
                    Err(e) => {
                        let text = this.scrubbed(&volume_id, &StepError::Api(e));
                        this.note_failure(&volume_id, &alloc_id, &text).await;
                        continue;
                    }
                };
                let _lock = this.alloc_locks.lock(&alloc_key(&volume_id, &alloc_id)).await;
                let Ok(Some(vol)) = this.cp.volume(&volume_id) else {
                    break;
                };
                if vol.claims.get(&alloc_id).is_none_or(|c| c.state != ClaimState::Releasing) {
                    break;
                }
                match this.release_steps(&plugin, &vol, &alloc_id).await {
                    Ok(()) => {
                        tracing::info!(volume_id, alloc_id, "background release done");
                        break;
                    }
                    Err(e) => {
                        let text = this.scrubbed(&volume_id, &e);
                        tracing::warn!(volume_id, alloc_id, error = %text, retry_in = ?delay, "release failed; retrying");
                        this.note_failure(&volume_id, &alloc_id, &text).await;
                    }
                }
            }
            this.retrying
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&(volume_id, alloc_id));
        });
    }

    /// `POST /v1/volume/csi/{id}/release`.
    pub async fn release_api(
        self: &Arc<Self>,
        id: &str,
        req: ReleaseRequest,
    ) -> Result<ReleaseResponse, ApiError> {
        let vol = self
            .cp
            .volume(id)
            .map_err(cp_error)?
            .ok_or_else(|| ApiError::NotFound(format!("no volume {id:?}")))?;
        Ok(self.release(&vol, &req.alloc_id).await)
    }

    /// `POST /v1/volume/csi/{id}/detach`: releases every claim of this node, in order.
    pub async fn detach(
        self: &Arc<Self>,
        id: &str,
        req: DetachRequest,
    ) -> Result<DetachResponse, ApiError> {
        let node = req.node_id.unwrap_or_else(|| self.node_id.clone());
        if node != self.node_id {
            return Err(ApiError::BadRequest(format!(
                "node_id: {node:?} is not this agent's node ({:?}); claims are released on their node",
                self.node_id
            )));
        }
        let vol = self
            .cp
            .volume(id)
            .map_err(cp_error)?
            .ok_or_else(|| ApiError::NotFound(format!("no volume {id:?}")))?;
        let mut out = DetachResponse::default();
        for c in vol.claims.values().filter(|c| c.claim.node_id == node) {
            out.releases
                .push(self.release(&vol, &c.claim.alloc_id).await);
        }
        Ok(out)
    }
}
