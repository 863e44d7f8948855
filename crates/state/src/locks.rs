//! A keyed async mutex: one lock per key, created on demand, dropped when unused.
//!
//! Callers that act on one record (or one group of records) at a time take the lock of its key,
//! so operations on one key are serialized and different keys run in parallel.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// One async mutex per string key. Waiting on one key never blocks another; the map only
/// keeps keys that someone holds or waits for.
#[derive(Debug, Default)]
pub struct KeyedLocks {
    locks: Mutex<HashMap<String, Arc<AsyncMutex<()>>>>,
}

impl KeyedLocks {
    /// Waits for the lock of `key` and holds it until the guard is dropped. Different keys
    /// never wait for each other.
    pub async fn lock(&self, key: &str) -> OwnedMutexGuard<()> {
        let lock = {
            let mut map = self.locks.lock().unwrap_or_else(|p| p.into_inner());
            // Forget locks nobody holds or waits for, so the map stays small.
            map.retain(|_, l| Arc::strong_count(l) > 1);
            Arc::clone(map.entry(key.to_string()).or_default())
        };
        lock.lock_owned().await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn same_key_waits_other_key_does_not() {
        let locks = Arc::new(KeyedLocks::default());
        let held = locks.lock("a").await;
        // Another key is free.
        let other = tokio::time::timeout(Duration::from_secs(5), locks.lock("b")).await;
        assert!(other.is_ok());
        // The same key waits until the first guard is dropped.
        let l2 = Arc::clone(&locks);
        let waiter = tokio::spawn(async move {
            let _g = l2.lock("a").await;
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(held);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("waiter gets the lock")
            .expect("waiter task");
    }
}
