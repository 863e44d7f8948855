//! The claims of a node that is down: freed without the node's own steps (it cannot run them),
//! after ControllerUnpublishVolume for it.

use std::collections::BTreeSet;

use super::*;

impl Volumes {
    /// Frees every claim node `node_id` holds on volume `id`. The caller has checked that the
    /// node is down (a node that is only cut off may still hold the mount). Returns one entry
    /// per alloc; on error the claims stay releasing and the text says why.
    pub async fn free_down_node(&self, id: &str, node_id: &str) -> DetachResponse {
        let vol = self.cp.volume(id).ok().flatten();
        let plugin_id = vol
            .as_ref()
            .map(|v| v.plugin_id.clone())
            .unwrap_or_default();
        let claimed: Vec<String> = vol
            .map(|v| {
                v.claims
                    .values()
                    .filter(|c| c.claim.node_id == node_id)
                    .map(|c| c.claim.alloc_id.clone())
                    .collect()
            })
            .unwrap_or_default();
        let entry = |alloc_id: &str, error: Option<String>| ReleaseResponse {
            volume_id: id.to_string(),
            alloc_id: alloc_id.to_string(),
            released: error.is_none(),
            error,
        };
        match self.cp.free_node(id, node_id).await {
            Ok(freed) => {
                for a in &freed {
                    self.events.emit_volume(
                        EventKind::VolumeReleased,
                        &plugin_id,
                        id,
                        Some(a),
                        format!("freed: node {node_id} is down (controller unpublished first)"),
                    );
                }
                DetachResponse {
                    releases: freed.iter().map(|a| entry(a, None)).collect(),
                }
            }
            Err(e) => {
                // The caller shows it (the operator's detach, or the sweep's log).
                let text = e.to_string();
                DetachResponse {
                    releases: claimed
                        .iter()
                        .map(|a| entry(a, Some(text.clone())))
                        .collect(),
                }
            }
        }
    }

    /// Every volume with a claim held by a node other than this one, with those nodes.
    pub fn claims_of_other_nodes(&self) -> Vec<(String, BTreeSet<String>)> {
        self.cp
            .list()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|v| {
                let nodes: BTreeSet<String> = v
                    .claims
                    .values()
                    .map(|c| c.claim.node_id.clone())
                    .chain(v.publications.keys().cloned())
                    .filter(|n| *n != self.node_id)
                    .collect();
                (!nodes.is_empty()).then_some((v.id, nodes))
            })
            .collect()
    }
}
