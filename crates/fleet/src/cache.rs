//! A directory of etcd keys mirrored in memory: listed once, then watched from the next
//! revision; listed again when the watch is cut (a compaction, a lost connection). Readers
//! never poll etcd.

use std::{
    collections::BTreeMap,
    marker::PhantomData,
    sync::{Arc, Mutex},
    time::Duration,
};

use etcd_client::{EventType, WatchOptions};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::etcd::{Etcd, Versioned, decode};

/// The first and the longest wait before a cut watch is set up again.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

#[derive(Debug)]
struct Entry<T> {
    /// `None`: deleted at `mod_revision` (kept so an older event cannot bring it back).
    value: Option<T>,
    mod_revision: i64,
}

#[derive(Debug)]
struct State<T> {
    entries: BTreeMap<String, Entry<T>>,
    synced: bool,
}

/// The mirror of one directory (`<prefix>/<dir>/`), keyed by the name after the directory.
#[derive(Debug)]
pub struct WatchedDir<T> {
    dir: String,
    state: Mutex<State<T>>,
    changes: watch::Sender<u64>,
    _t: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned + Clone + Send + Sync + 'static> WatchedDir<T> {
    /// An empty mirror of `dir` (a key prefix ending in `/`); filled by [`WatchedDir::run`].
    pub fn new(dir: String) -> Arc<Self> {
        Arc::new(Self {
            dir,
            state: Mutex::new(State {
                entries: BTreeMap::new(),
                synced: false,
            }),
            changes: watch::channel(0).0,
            _t: PhantomData,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.changes.send_modify(|g| *g += 1);
    }

    /// The value of `name` as last seen.
    pub fn get(&self, name: &str) -> Option<T> {
        self.lock().entries.get(name).and_then(|e| e.value.clone())
    }

    /// The value of `name` with its revision, as last seen.
    pub fn get_versioned(&self, name: &str) -> Option<Versioned<T>> {
        let s = self.lock();
        let e = s.entries.get(name)?;
        Some(Versioned {
            value: e.value.clone()?,
            mod_revision: e.mod_revision,
        })
    }

    /// Every value as last seen, by name.
    pub fn all(&self) -> Vec<(String, T)> {
        self.lock()
            .entries
            .iter()
            .filter_map(|(k, e)| Some((k.clone(), e.value.clone()?)))
            .collect()
    }

    /// Every value with its revision as last seen, by name.
    pub fn all_versioned(&self) -> Vec<(String, Versioned<T>)> {
        self.lock()
            .entries
            .iter()
            .filter_map(|(k, e)| {
                Some((
                    k.clone(),
                    Versioned {
                        value: e.value.clone()?,
                        mod_revision: e.mod_revision,
                    },
                ))
            })
            .collect()
    }

    /// Whether the first listing is in.
    pub fn synced(&self) -> bool {
        self.lock().synced
    }

    /// A receiver that changes whenever the mirror does.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Waits until the first listing is in, or `shutdown`.
    pub async fn wait_synced(&self, shutdown: &CancellationToken) {
        let mut rx = self.subscribe();
        while !self.synced() {
            tokio::select! {
                () = shutdown.cancelled() => return,
                r = rx.changed() => if r.is_err() { return },
            }
        }
    }

    /// Records this process's own write at `revision` (before its watch event arrives), so
    /// a read right after the write sees it.
    pub fn note(&self, name: &str, value: Option<T>, revision: i64) {
        let mut s = self.lock();
        let newer = s
            .entries
            .get(name)
            .is_none_or(|e| e.mod_revision < revision);
        if newer {
            s.entries.insert(
                name.to_string(),
                Entry {
                    value,
                    mod_revision: revision,
                },
            );
            drop(s);
            self.bump();
        }
    }

    fn name_of<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(self.dir.as_str())
    }

    fn replace(&self, items: Vec<(String, Versioned<T>)>, revision: i64) {
        let mut s = self.lock();
        let mut fresh: BTreeMap<String, Entry<T>> = BTreeMap::new();
        for (key, v) in items {
            if let Some(name) = self.name_of(&key) {
                fresh.insert(
                    name.to_string(),
                    Entry {
                        value: Some(v.value),
                        mod_revision: v.mod_revision,
                    },
                );
            }
        }
        // Own writes newer than the listing stay.
        for (name, e) in std::mem::take(&mut s.entries) {
            if e.mod_revision > revision {
                fresh.insert(name, e);
            }
        }
        s.entries = fresh;
        s.synced = true;
        drop(s);
        self.bump();
    }

    /// Lists, then watches, until `shutdown`; lists again whenever the watch is cut.
    pub async fn run(self: Arc<Self>, etcd: Etcd, shutdown: CancellationToken) {
        let mut wait = RETRY_FIRST;
        loop {
            match self.list_and_watch(&etcd, &shutdown).await {
                Ok(()) => return,
                Err(why) => {
                    tracing::warn!(dir = %self.dir, reason = %why, retry_in = ?wait, "etcd watch cut; listing again");
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
            wait = (wait * 2).min(RETRY_MAX);
        }
    }

    /// One listing and the watch after it; `Ok` only at shutdown.
    async fn list_and_watch(
        &self,
        etcd: &Etcd,
        shutdown: &CancellationToken,
    ) -> Result<(), String> {
        let (items, revision) = etcd.list::<T>(&self.dir).await.map_err(|e| e.to_string())?;
        self.replace(items, revision);
        let mut stream = etcd
            .client()
            .watch(
                self.dir.as_str(),
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(revision + 1)
                        .with_progress_notify(),
                ),
            )
            .await
            .map_err(|e| e.to_string())?;
        loop {
            let msg = tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                m = stream.message() => m,
            };
            let resp = match msg {
                Ok(Some(r)) => r,
                Ok(None) => return Err("the watch stream ended".into()),
                Err(e) => return Err(e.to_string()),
            };
            if resp.compact_revision() > 0 {
                return Err(format!(
                    "revision {} is compacted (now {})",
                    revision + 1,
                    resp.compact_revision()
                ));
            }
            if resp.canceled() {
                return Err(format!("watch canceled: {}", resp.cancel_reason()));
            }
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                let Some(name) = self.name_of(&key) else {
                    continue;
                };
                let value = match ev.event_type() {
                    EventType::Delete => None,
                    EventType::Put => match decode::<T>(&key, kv.value()) {
                        Ok(v) => Some(v),
                        Err(e) => {
                            tracing::warn!(error = %e, "skipping a record berth cannot read");
                            continue;
                        }
                    },
                };
                self.note(name, value, kv.mod_revision());
            }
        }
    }
}
