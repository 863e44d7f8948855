//! The leader's sweep of claims held by nodes that are down: once a node has been down for
//! the grace the operator set (`lost_claims { after }`), ControllerUnpublishVolume runs for it
//! and its claims are freed, so its volumes can be claimed elsewhere. A claim a missed event
//! left behind is found again at the next sweep; one that cannot be freed yet (no controller
//! answers) is tried again after a wait that doubles up to 30 s.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use berth_api::nodes::NodeState;
use berth_fleet::{Membership, settings::LostClaims};
use tokio_util::sync::CancellationToken;

use crate::volumes::Volumes;

/// How often the leader looks at the claims of down nodes.
const SWEEP: Duration = Duration::from_secs(1);
/// The longest wait before freeing a down node's claims is tried again after a failure (the
/// wait starts at [`SWEEP`] and doubles).
const MAX_RETRY: Duration = Duration::from_secs(30);

/// The sweep; runs while this agent leads.
#[derive(Debug)]
pub struct LostClaimSweep {
    volumes: Arc<Volumes>,
    membership: Arc<Membership>,
    policy: LostClaims,
}

impl LostClaimSweep {
    /// A sweep over `volumes` under `policy`.
    pub fn new(
        volumes: Arc<Volumes>,
        membership: Arc<Membership>,
        policy: LostClaims,
    ) -> Arc<Self> {
        Arc::new(Self {
            volumes,
            membership,
            policy,
        })
    }

    /// Sweeps when a node goes down or comes back, when a down node's grace ends, and every
    /// second (claims a missed event left behind), until `term` ends (the leadership). A node
    /// counts as down from the first sweep of this term that sees it down, so a new leader
    /// waits the whole grace again: late, never early.
    pub async fn run(self: Arc<Self>, term: CancellationToken) {
        let LostClaims::After(after) = self.policy else {
            return;
        };
        let mut down_since: HashMap<String, Instant> = HashMap::new();
        // (volume, node) → when to try again and the wait after that.
        let mut retry: HashMap<(String, String), (Instant, Duration)> = HashMap::new();
        let mut alive = self.membership.alive_dir().subscribe();
        loop {
            let now = Instant::now();
            // The next moment a tracked node's grace ends (the sweep wakes then, not later).
            let mut next = now + SWEEP;
            for (volume_id, nodes) in self.volumes.claims_of_other_nodes() {
                for node in nodes {
                    let down = self
                        .membership
                        .node(&node)
                        .is_none_or(|n| n.status == NodeState::Down);
                    if !down {
                        down_since.remove(&node);
                        retry.retain(|(_, n), _| *n != node);
                        continue;
                    }
                    let since = *down_since.entry(node.clone()).or_insert(now);
                    if now.duration_since(since) < after {
                        next = next.min(since + after);
                        continue;
                    }
                    let key = (volume_id.clone(), node.clone());
                    if let Some((at, _)) = retry.get(&key)
                        && now < *at
                    {
                        next = next.min(*at);
                        continue;
                    }
                    tracing::info!(volume_id, node_id = %node, down_for = ?now.duration_since(since), "freeing the claims of a down node");
                    let out = self.volumes.free_down_node(&volume_id, &node).await;
                    match out.releases.iter().find_map(|r| r.error.as_ref()) {
                        Some(e) => {
                            let wait = retry
                                .get(&key)
                                .map_or(SWEEP, |(_, w)| (*w * 2).min(MAX_RETRY));
                            tracing::warn!(volume_id, node_id = %node, error = %e, retry_in = ?wait, "claims of a down node not freed yet");
                            retry.insert(key, (Instant::now() + wait, wait));
                        }
                        None => {
                            retry.remove(&key);
                        }
                    }
                }
            }
            tokio::select! {
                () = term.cancelled() => return,
                // A node went down (or came back): look at once.
                r = alive.changed() => if r.is_err() { return },
                () = tokio::time::sleep_until(next.into()) => {}
            }
        }
    }
}
