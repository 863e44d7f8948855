//! The fleet's leader: one agent at a time holds `<prefix>/leader`, a key on its own
//! registration lease, created only when absent (an etcd election). The cluster-wide work
//! runs while it holds the key; every write of that work is fenced on the key still being on
//! the holder's lease, so a leader that lost its lease (a pause, a partition) writes nothing.

use std::{future::Future, sync::Arc, time::Duration};

use etcd_client::{Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, WatchOptions};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::{
    etcd::{Etcd, Fence, FleetError},
    nodes::Membership,
};

/// What the leader key holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderRecord {
    /// The leader's node id.
    pub node_id: String,
    /// When it was elected (ms since the epoch).
    pub since_ms: u64,
}

/// This agent's part in the election.
pub struct Election {
    etcd: Etcd,
    membership: Arc<Membership>,
    node_id: String,
    leader: watch::Sender<Option<LeaderRecord>>,
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("node_id", &self.node_id)
            .field("leader", &*self.leader.borrow())
            .finish_non_exhaustive()
    }
}

const RETRY: Duration = Duration::from_millis(500);

impl Election {
    /// The election of `membership`'s node.
    pub fn new(etcd: Etcd, membership: Arc<Membership>, node_id: String) -> Arc<Self> {
        Arc::new(Self {
            etcd,
            membership,
            node_id,
            leader: watch::channel(None).0,
        })
    }

    fn key(&self) -> String {
        self.etcd.key(&["leader"])
    }

    /// The leader as last seen (`None`: none, or not known yet).
    pub fn leader(&self) -> Option<LeaderRecord> {
        self.leader.borrow().clone()
    }

    /// Campaigns whenever the key is free and this node is registered; while it leads, runs
    /// `work(fence, term)`: `term` is cancelled when leadership ends (the key is gone or on
    /// another lease, the registration lapsed, or `shutdown`). Returns at `shutdown`.
    pub async fn run<F, Fut>(self: Arc<Self>, work: F, shutdown: CancellationToken)
    where
        F: Fn(Fence, CancellationToken) -> Fut,
        Fut: Future<Output = ()>,
    {
        let mut lease_rx = self.membership.subscribe();
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            let Some(lease) = *lease_rx.borrow_and_update() else {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = lease_rx.changed() => continue,
                }
            };
            match self.campaign(lease).await {
                Ok(true) => {
                    let term = shutdown.child_token();
                    let fence = Fence {
                        key: self.key(),
                        lease,
                    };
                    tracing::info!(node_id = %self.node_id, lease, "elected fleet leader");
                    {
                        let watcher = self.watch_until_lost(lease, &mut lease_rx, &term);
                        let worker = work(fence, term.clone());
                        tokio::pin!(watcher, worker);
                        tokio::select! {
                            _ = &mut watcher => {}
                            () = &mut worker => {}
                        }
                        term.cancel();
                        // The work winds down before anything else is tried.
                        worker.await;
                    }
                    tracing::info!(node_id = %self.node_id, "no longer the fleet leader");
                    if shutdown.is_cancelled() {
                        // Let another agent take over at once.
                        let _ = self.etcd.delete_if_lease(&self.key(), lease).await;
                        return;
                    }
                }
                Ok(false) => {
                    let stop = shutdown.child_token();
                    if !self.watch_until_lost(lease, &mut lease_rx, &stop).await {
                        // etcd did not answer the watch: do not campaign in a tight loop.
                        tokio::select! {
                            () = shutdown.cancelled() => return,
                            () = tokio::time::sleep(RETRY) => {}
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "fleet election");
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(RETRY) => {}
                    }
                }
            }
        }
    }

    /// Creates the key on `lease` when it is absent; whether this node leads now.
    async fn campaign(&self, lease: i64) -> Result<bool, FleetError> {
        let key = self.key();
        let rec = LeaderRecord {
            node_id: self.node_id.clone(),
            since_ms: berth_sys::now_ms(),
        };
        let bytes = serde_json::to_vec(&rec).map_err(|source| FleetError::Decode {
            key: key.clone(),
            source,
        })?;
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                bytes,
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let resp = self
            .etcd
            .client()
            .txn(txn)
            .await
            .map_err(|source| FleetError::Request {
                op: "txn campaign",
                key: key.clone(),
                source,
            })?;
        if resp.succeeded() {
            self.leader.send_replace(Some(rec));
            return Ok(true);
        }
        for r in resp.op_responses() {
            if let etcd_client::TxnOpResponse::Get(g) = r
                && let Some(kv) = g.kvs().first()
            {
                let current: LeaderRecord = crate::etcd::decode(&key, kv.value())?;
                // This node's own key from before (same lease): it still leads.
                let mine = kv.lease() == lease;
                self.leader.send_replace(Some(current));
                return Ok(mine);
            }
        }
        Ok(false)
    }

    /// Returns when the key is deleted or no longer on `lease` while this node holds it
    /// (or someone else's key goes away), the registration changes, or `stop`: `true`; or
    /// `false` when etcd could not be read or watched.
    async fn watch_until_lost(
        &self,
        lease: i64,
        lease_rx: &mut watch::Receiver<Option<i64>>,
        stop: &CancellationToken,
    ) -> bool {
        let key = self.key();
        let mut client = self.etcd.client();
        let current = match client.get(key.as_str(), None).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "reading the fleet leader");
                return false;
            }
        };
        let revision = current.header().map_or(0, |h| h.revision());
        match current.kvs().first() {
            None => return true,
            Some(kv) => {
                if let Ok(rec) = crate::etcd::decode::<LeaderRecord>(&key, kv.value()) {
                    self.leader.send_replace(Some(rec));
                }
            }
        }
        let mut stream = match client
            .watch(
                key.as_str(),
                Some(WatchOptions::new().with_start_revision(revision + 1)),
            )
            .await
        {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "watching the fleet leader");
                return false;
            }
        };
        loop {
            tokio::select! {
                () = stop.cancelled() => return true,
                r = lease_rx.changed() => {
                    if r.is_err() || *lease_rx.borrow() != Some(lease) {
                        return true;
                    }
                }
                msg = stream.message() => match msg {
                    Ok(Some(resp)) => {
                        if resp.canceled() || resp.compact_revision() > 0 {
                            return false;
                        }
                        for ev in resp.events() {
                            if ev.event_type() == EventType::Delete {
                                self.leader.send_replace(None);
                                return true;
                            }
                            if let Some(kv) = ev.kv() {
                                if let Ok(rec) = crate::etcd::decode::<LeaderRecord>(&key, kv.value()) {
                                    self.leader.send_replace(Some(rec));
                                }
                                if kv.lease() != lease && self.leader().is_some_and(|l| l.node_id == self.node_id) {
                                    return true;
                                }
                            }
                        }
                    }
                    _ => return false,
                },
            }
        }
    }
}

impl Etcd {
    /// Deletes `key` if it is on `lease` (a leader stepping down).
    pub async fn delete_if_lease(&self, key: &str, lease: i64) -> Result<bool, FleetError> {
        let txn = Txn::new()
            .when([Compare::lease(key, CompareOp::Equal, lease)])
            .and_then([TxnOp::delete(key, None)]);
        let resp = self
            .client()
            .txn(txn)
            .await
            .map_err(|source| FleetError::Request {
                op: "txn resign",
                key: key.to_string(),
                source,
            })?;
        Ok(resp.succeeded())
    }
}
