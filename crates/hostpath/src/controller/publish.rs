//! ControllerPublishVolume and ControllerUnpublishVolume.

use berth_csi::pb;
use tonic::{Code, Status};

use crate::{
    caps,
    locks::volume_key,
    plugin::{PUBLISH_CONTEXT_NODE_KEY, Plugin},
    state::ControllerPublication,
    strict,
};

impl Plugin {
    pub(super) async fn controller_publish_volume(
        &self,
        req: &pb::ControllerPublishVolumeRequest,
    ) -> Result<pb::ControllerPublishVolumeResponse, Status> {
        if !self.settings.attach {
            return Err(Status::unimplemented(
                "ControllerPublishVolume is disabled (--enable-attach=false)",
            ));
        }
        // The volume first, then the node: unknown ones are NOT_FOUND whatever the other
        // fields hold.
        let id = caps::id(&req.volume_id, "volume_id")?;
        let _guard = self.locks.lock(&[volume_key(id)]).await;
        let v = self.volume(id).await?;
        let node = caps::required(&req.node_id, "node_id")?;
        self.require_known_node(node).await?;
        let capability = caps::required_capability(
            req.volume_capability.as_ref(),
            "volume_capability",
            Code::InvalidArgument,
        )?;
        self.check_fs_type(&capability, "volume_capability")?;
        if self.settings.strict {
            strict::controller_readonly(req.readonly)?;
            strict::volume_context(&req.volume_context)?;
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

    pub(super) async fn controller_unpublish_volume(
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
            .await?;
        if published && self.settings.strict {
            self.require_node_done(id, node)?;
        }
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

    /// Strict mode: the spec makes the CO finish NodeUnpublishVolume and NodeUnstageVolume
    /// before ControllerUnpublishVolume, so a volume still mounted on this node (the one node
    /// this plugin serves, or with `--shared` the one whose mounts it sees) is refused
    /// (`FAILED_PRECONDITION`).
    fn require_node_done(&self, id: &str, node: &str) -> Result<(), Status> {
        if !node.is_empty() && node != self.settings.node_id {
            return Ok(());
        }
        match self.volume_mounts(id)?.first() {
            None => Ok(()),
            Some(m) => Err(Status::failed_precondition(format!(
                "volume {id} is still mounted at {} on node {}: the CSI spec makes the CO \
                 finish NodeUnpublishVolume and NodeUnstageVolume before \
                 ControllerUnpublishVolume (refused in strict mode)",
                m.mount_point.display(),
                self.settings.node_id
            ))),
        }
    }
}
