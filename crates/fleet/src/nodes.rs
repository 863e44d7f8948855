//! Node registration: each agent keeps its node record at `<prefix>/nodes/<id>` (durable: a
//! node that is down is still listed, as down) and proves it is alive with
//! `<prefix>/alive/<id>`, a key on a lease it keeps alive every third of the lease's TTL.
//!
//! When a keepalive is not answered within the TTL (a partition, a paused process, an
//! expired lease), the node stops acting on cluster state at once (its [`Fence`] is gone, so
//! every fleet write it tries changes nothing), then registers again with a new lease.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use berth_api::nodes::{FleetNode, NodeState};
use serde::{Deserialize, Serialize};
use tokio::{sync::watch, time::MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::{
    cache::WatchedDir,
    etcd::{Etcd, Fence, FleetError, Outcome},
};

/// What a node's alive key holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alive {
    /// The lease the key is on.
    pub lease: i64,
    /// When this registration began (ms since the epoch).
    pub since_ms: u64,
}

/// What the agent reports of its node, read again at every keepalive; written to etcd when it
/// changed.
pub type Snapshot = Arc<dyn Fn() -> FleetNode + Send + Sync>;

/// First and longest wait between two registration attempts.
const RETRY_FIRST: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// The wait before a keepalive stream that could not be opened is tried again.
const STREAM_RETRY: Duration = Duration::from_millis(200);

/// This node's membership of the fleet, and the fleet's nodes as this node sees them.
pub struct Membership {
    etcd: Etcd,
    node_id: String,
    ttl: Duration,
    nodes: Arc<WatchedDir<FleetNode>>,
    alive: Arc<WatchedDir<Alive>>,
    lease: watch::Sender<Option<i64>>,
    written: Mutex<Option<FleetNode>>,
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("node_id", &self.node_id)
            .field("lease", &*self.lease.borrow())
            .finish_non_exhaustive()
    }
}

impl Membership {
    /// The membership of `node_id`; nothing happens until [`Membership::run`].
    pub fn new(etcd: Etcd, node_id: String, ttl: Duration) -> Arc<Self> {
        let nodes = WatchedDir::new(etcd.dir("nodes"));
        let alive = WatchedDir::new(etcd.dir("alive"));
        Arc::new(Self {
            etcd,
            node_id,
            ttl,
            nodes,
            alive,
            lease: watch::channel(None).0,
            written: Mutex::new(None),
        })
    }

    /// The mirror of the node records (run it with [`WatchedDir::run`]).
    pub fn node_dir(&self) -> &Arc<WatchedDir<FleetNode>> {
        &self.nodes
    }

    /// The mirror of the alive keys (run it with [`WatchedDir::run`]).
    pub fn alive_dir(&self) -> &Arc<WatchedDir<Alive>> {
        &self.alive
    }

    /// The fence of this node's writes, while it is registered.
    pub fn fence(&self) -> Option<Fence> {
        (*self.lease.borrow()).map(|lease| self.fence_of(lease))
    }

    fn fence_of(&self, lease: i64) -> Fence {
        Fence {
            key: self.alive_key(),
            lease,
        }
    }

    /// Changes whenever this node registers or its registration lapses.
    pub fn subscribe(&self) -> watch::Receiver<Option<i64>> {
        self.lease.subscribe()
    }

    /// Called when a write fenced on `fence` found the registration gone: the node stops
    /// acting now, and its run loop registers it again. A fence of an older lease than the
    /// one held now changes nothing.
    pub fn lapsed(&self, fence: &Fence) {
        self.lapse(fence.lease);
    }

    fn lapse(&self, lease: i64) {
        self.lease.send_if_modified(|held| {
            let ours = *held == Some(lease);
            if ours {
                *held = None;
            }
            ours
        });
    }

    fn alive_key(&self) -> String {
        self.etcd.key(&["alive", &self.node_id])
    }

    fn node_key(&self) -> String {
        self.etcd.key(&["nodes", &self.node_id])
    }

    /// Every node with its state now, by id.
    pub fn nodes(&self) -> Vec<FleetNode> {
        self.nodes
            .all()
            .into_iter()
            .map(|(_, n)| self.with_state(n))
            .collect()
    }

    /// One node with its state now.
    pub fn node(&self, id: &str) -> Option<FleetNode> {
        self.nodes.get(id).map(|n| self.with_state(n))
    }

    fn with_state(&self, mut n: FleetNode) -> FleetNode {
        n.status = match (self.alive.get(&n.id).is_some(), n.drain) {
            (false, _) => NodeState::Down,
            (true, true) => NodeState::Draining,
            (true, false) => NodeState::Ready,
        };
        n
    }

    /// Registers the node and keeps it registered until `shutdown` (then revokes the lease:
    /// the node is down at once). Registers again with a new lease whenever it lapses.
    pub async fn run(self: Arc<Self>, snapshot: Snapshot, shutdown: CancellationToken) {
        let mut wait = RETRY_FIRST;
        loop {
            let lapse = match self.register(&snapshot).await {
                Ok(lease) => {
                    wait = RETRY_FIRST;
                    self.keep(lease, &snapshot, &shutdown).await
                }
                Err(e) => e.to_string(),
            };
            self.lease.send_replace(None);
            if shutdown.is_cancelled() {
                return;
            }
            tracing::warn!(node_id = %self.node_id, reason = %lapse, retry_in = ?wait, "not registered with the fleet; registering again");
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
            wait = (wait * 2).min(RETRY_MAX);
        }
    }

    /// A new lease, the alive key on it, and the node record.
    async fn register(&self, snapshot: &Snapshot) -> Result<i64, FleetError> {
        let ttl = i64::try_from(self.ttl.as_secs()).unwrap_or(i64::MAX);
        let mut client = self.etcd.client();
        let lease = client
            .lease_grant(ttl, None)
            .await
            .map_err(|source| FleetError::Request {
                op: "lease grant",
                key: self.alive_key(),
                source,
            })?
            .id();
        let alive = Alive {
            lease,
            since_ms: berth_sys::now_ms(),
        };
        self.etcd
            .put(&self.alive_key(), &alive, Some(lease))
            .await?;
        *self.written.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.lease.send_replace(Some(lease));
        self.write_record(lease, snapshot, alive.since_ms).await?;
        tracing::info!(node_id = %self.node_id, lease, ttl_s = ttl, "registered with the fleet");
        Ok(lease)
    }

    /// Writes the node record when it differs from the last one written, keeping what an
    /// operator set on it (`drain`). The write is fenced on `lease`: once that lease is gone it
    /// writes nothing and marks the registration lapsed.
    async fn write_record(
        &self,
        lease: i64,
        snapshot: &Snapshot,
        since_ms: u64,
    ) -> Result<(), FleetError> {
        let mut rec = snapshot();
        rec.id.clone_from(&self.node_id);
        rec.status = NodeState::Ready;
        if self
            .written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            == Some(&rec)
        {
            return Ok(());
        }
        for _ in 0..8 {
            let current = self.etcd.get::<FleetNode>(&self.node_key()).await?;
            let mut next = rec.clone();
            next.drain = current.as_ref().is_some_and(|c| c.value.drain);
            next.registered_ms = if since_ms > 0 {
                since_ms
            } else {
                current.as_ref().map_or(0, |c| c.value.registered_ms)
            };
            let expected = current.map_or(0, |c| c.mod_revision);
            match self
                .etcd
                .put_if(
                    &self.node_key(),
                    &next,
                    expected,
                    Some(&self.fence_of(lease)),
                )
                .await?
            {
                Outcome::Done(revision) => {
                    self.nodes.note(&self.node_id, Some(next), revision);
                    *self.written.lock().unwrap_or_else(|p| p.into_inner()) = Some(rec);
                    return Ok(());
                }
                Outcome::Changed => continue,
                Outcome::Fenced => {
                    self.lapse(lease);
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Keeps `lease` alive until it lapses (returns why) or `shutdown` (revokes it). A
    /// keepalive stream that breaks (the etcd member it went to died) is opened again, on
    /// whichever member answers, for the same lease: the registration lapses only when no
    /// keepalive was answered for a whole TTL, or etcd says the lease expired.
    async fn keep(&self, lease: i64, snapshot: &Snapshot, shutdown: &CancellationToken) -> String {
        let mut client = self.etcd.client();
        let mut lapsed = self.subscribe();
        // A write may have found the lease gone while it was being registered, before this
        // subscription: that lapse must not wait for a keepalive to notice it.
        if *lapsed.borrow_and_update() != Some(lease) {
            return "a write found the registration gone".into();
        }
        let mut tick = tokio::time::interval(self.ttl / 3);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut last_answer = Instant::now();
        let mut stream = None;
        loop {
            // A pause longer than the TTL (SIGSTOP, a frozen VM), or a TTL without an answer,
            // means the lease may be gone already: stop acting before anything else.
            if last_answer.elapsed() >= self.ttl {
                self.lease.send_replace(None);
                return format!("no keepalive answer for {:?}", last_answer.elapsed());
            }
            let (keeper, answers) = match &mut stream {
                Some(s) => s,
                None => {
                    let left = self.ttl.saturating_sub(last_answer.elapsed());
                    match tokio::time::timeout(left, client.lease_keep_alive(lease)).await {
                        Ok(Ok((mut keeper, answers))) => {
                            if let Err(e) = keeper.keep_alive().await {
                                tracing::warn!(error = %e, "keepalive stream broke at once; opening it again");
                                continue;
                            }
                            stream.insert((keeper, answers))
                        }
                        Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) => {
                            // etcd answered the stream's first keepalive: no such lease.
                            self.lease.send_replace(None);
                            return "the lease expired".into();
                        }
                        Ok(Err(e)) => {
                            tracing::warn!(error = %e, "cannot open the keepalive stream; trying again");
                            tokio::select! {
                                () = shutdown.cancelled() => return "stopping".into(),
                                () = tokio::time::sleep(STREAM_RETRY) => {}
                            }
                            continue;
                        }
                        Err(_) => continue,
                    }
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => {
                    // Stopping: the node is down now, not a TTL later.
                    let revoke = client.lease_revoke(lease);
                    if let Ok(Err(e)) = tokio::time::timeout(Duration::from_secs(2), revoke).await {
                        tracing::warn!(error = %e, "cannot revoke the fleet lease; it expires by itself");
                    }
                    return "stopping".into();
                }
                _ = lapsed.changed() => {
                    if *lapsed.borrow_and_update() != Some(lease) {
                        return "a write found the registration gone".into();
                    }
                }
                _ = tick.tick() => {
                    if last_answer.elapsed() >= self.ttl {
                        continue;
                    }
                    if let Err(e) = keeper.keep_alive().await {
                        tracing::warn!(error = %e, "keepalive stream broke; opening it again");
                        stream = None;
                        continue;
                    }
                    if let Err(e) = self.write_record(lease, snapshot, 0).await {
                        tracing::warn!(error = %e, "cannot update the node record");
                    }
                }
                msg = answers.message() => match msg {
                    Ok(Some(r)) if r.ttl() > 0 => last_answer = Instant::now(),
                    Ok(Some(_)) => {
                        self.lease.send_replace(None);
                        return "the lease expired".into();
                    }
                    Ok(None) => {
                        tracing::warn!("keepalive stream ended; opening it again");
                        stream = None;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "keepalive answers broke; opening the stream again");
                        stream = None;
                    }
                },
            }
        }
    }

    /// Sets or clears `drain` on a node's record (an operator's command).
    pub async fn set_drain(
        &self,
        node_id: &str,
        drain: bool,
    ) -> Result<Option<FleetNode>, FleetError> {
        let key = self.etcd.key(&["nodes", node_id]);
        for _ in 0..8 {
            let Some(current) = self.etcd.get::<FleetNode>(&key).await? else {
                return Ok(None);
            };
            let mut next = current.value;
            next.drain = drain;
            match self
                .etcd
                .put_if(&key, &next, current.mod_revision, None)
                .await?
            {
                Outcome::Done(revision) => {
                    self.nodes.note(node_id, Some(next.clone()), revision);
                    return Ok(Some(self.with_state(next)));
                }
                Outcome::Changed | Outcome::Fenced => continue,
            }
        }
        Ok(self.node(node_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EtcdSettings;
    use berth_testkit::EtcdCluster;

    /// A membership holding a fresh lease, as `register` leaves it, without a run loop.
    async fn holding_a_lease(cluster: &EtcdCluster) -> (Arc<Membership>, i64, Snapshot) {
        let settings = EtcdSettings::new(cluster.endpoints()).unwrap();
        let etcd = Etcd::connect(&settings).await.unwrap();
        let m = Membership::new(etcd, "node-a".into(), settings.lease_ttl);
        let snapshot: Snapshot = Arc::new(FleetNode::default);
        let lease = m.register(&snapshot).await.unwrap();
        assert_eq!(*m.subscribe().borrow(), Some(lease));
        (m, lease, snapshot)
    }

    /// Well under the ten-second TTL: a lapse is seen from what etcd says, not from a TTL
    /// without answers.
    const PROMPT: Duration = Duration::from_secs(4);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lapse_before_the_keepalive_starts_is_not_lost() {
        let cluster = EtcdCluster::single().expect("etcd");
        let (m, lease, snapshot) = holding_a_lease(&cluster).await;
        m.lapsed(&m.fence_of(lease));
        let why = tokio::time::timeout(PROMPT, m.keep(lease, &snapshot, &CancellationToken::new()))
            .await
            .expect("keep returned at once");
        assert!(why.contains("registration gone"), "{why}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_revoked_before_the_keepalive_starts_ends_it_at_once() {
        let cluster = EtcdCluster::single().expect("etcd");
        let (m, lease, snapshot) = holding_a_lease(&cluster).await;
        m.etcd.client().lease_revoke(lease).await.unwrap();
        let why = tokio::time::timeout(PROMPT, m.keep(lease, &snapshot, &CancellationToken::new()))
            .await
            .expect("keep returned well before the TTL");
        assert!(why.contains("expired"), "{why}");
        assert_eq!(*m.subscribe().borrow(), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_fenced_on_an_older_lease_leaves_the_new_one() {
        let cluster = EtcdCluster::single().expect("etcd");
        let (m, old, snapshot) = holding_a_lease(&cluster).await;
        let new = m.register(&snapshot).await.unwrap();
        assert_ne!(old, new);
        m.lapsed(&m.fence_of(old));
        assert_eq!(*m.subscribe().borrow(), Some(new));
        m.lapsed(&m.fence_of(new));
        assert_eq!(*m.subscribe().borrow(), None);
    }
}
