//! Per-key async locks: operations on one volume or snapshot run one at a time, operations on
//! different ones run in parallel.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

type Table = Mutex<HashMap<String, Arc<AsyncMutex<()>>>>;

#[derive(Debug, Default)]
pub(crate) struct KeyedLocks {
    table: Arc<Table>,
}

/// Holds the locks of some keys; releases them on drop.
#[derive(Debug)]
pub(crate) struct KeyGuard {
    held: Vec<(String, OwnedMutexGuard<()>)>,
    table: Arc<Table>,
}

impl KeyedLocks {
    /// Locks every key of `keys`, in sorted order so two callers never deadlock.
    pub async fn lock(&self, keys: &[String]) -> KeyGuard {
        let mut keys = keys.to_vec();
        keys.sort();
        keys.dedup();
        let mut held = Vec::with_capacity(keys.len());
        for key in keys {
            let mutex = {
                let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
                Arc::clone(table.entry(key.clone()).or_default())
            };
            held.push((key, mutex.lock_owned().await));
        }
        KeyGuard {
            held,
            table: Arc::clone(&self.table),
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.table.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Drop for KeyGuard {
    fn drop(&mut self) {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        for (key, guard) in self.held.drain(..) {
            drop(guard);
            // Forget the entry when no one else holds or waits for it: clones are only made
            // under the table lock, so the count cannot grow behind our back.
            if table.get(&key).is_some_and(|m| Arc::strong_count(m) == 1) {
                table.remove(&key);
            }
        }
    }
}

/// Lock key of a volume id.
pub(crate) fn volume_key(id: &str) -> String {
    format!("volume/{id}")
}

/// Lock key of a snapshot id.
pub(crate) fn snapshot_key(id: &str) -> String {
    format!("snapshot/{id}")
}

/// Lock key of a volume name (CreateVolume).
pub(crate) fn volume_name_key(name: &str) -> String {
    format!("volume-name/{name}")
}

/// Lock key of a snapshot name (CreateSnapshot).
pub(crate) fn snapshot_name_key(name: &str) -> String {
    format!("snapshot-name/{name}")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn same_key_waits_other_keys_do_not() {
        let locks = Arc::new(KeyedLocks::default());
        let a = locks.lock(&["a".into()]).await;
        let _b = locks.lock(&["b".into()]).await;

        let locks2 = Arc::clone(&locks);
        let waiter = tokio::spawn(async move {
            let _g = locks2.lock(&["c".into(), "a".into()]).await;
        });
        // On this single-threaded runtime the waiter runs until it blocks on 'a'.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiter.is_finished(), "second locker of 'a' must wait");
        drop(a);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("released")
            .expect("task");
        assert_eq!(locks.len(), 1, "only 'b' is still held");
    }
}
