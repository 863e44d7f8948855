//! The leader compacts etcd's history: every interval it compacts at the revision it saw one
//! interval before, so at least one interval of history stays for watches that fell behind
//! (they list again when theirs is gone; see [`crate::cache`]).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::etcd::Etcd;

/// How often the leader compacts, by default (and how much history it keeps).
pub const DEFAULT_COMPACT_EVERY: Duration = Duration::from_secs(300);

/// The leader's compaction loop.
#[derive(Debug, Clone)]
pub struct Compactor {
    etcd: Etcd,
    every: Duration,
}

impl Compactor {
    /// Compacts `etcd` every `every`.
    pub fn new(etcd: Etcd, every: Duration) -> Self {
        Self { etcd, every }
    }

    /// Runs until `term` ends (the leadership). The first compaction comes two intervals in:
    /// the revision seen at the first tick is kept for one interval.
    pub async fn run(self, term: CancellationToken) {
        let mut seen: Option<i64> = None;
        loop {
            tokio::select! {
                () = term.cancelled() => return,
                () = tokio::time::sleep(self.every) => {}
            }
            if let Some(rev) = seen {
                match self.etcd.compact(rev).await {
                    Ok(()) => tracing::info!(revision = rev, "compacted etcd history"),
                    Err(e) => {
                        tracing::warn!(revision = rev, error = %e, "etcd compaction failed; trying again at the next interval")
                    }
                }
            }
            match self.etcd.revision().await {
                Ok(rev) => seen = Some(rev),
                Err(e) => tracing::warn!(error = %e, "cannot read etcd's revision"),
            }
        }
    }
}
