//! The plugin registry: every registered instance of every CSI plugin, persisted in the store
//! before it is visible, with the newest instance of each plugin active.
//!
//! Registration is idempotent: registering the same (plugin, instance) again with the same
//! socket and type keeps its original registration time, so a rescan never makes an old
//! instance "newest". Changes are announced on a broadcast channel; nothing is sent while a
//! lock is held.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{Arc, Mutex},
};

use berth_api::{EventKind, PluginType, Source};
use berth_state::{Store, Table};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::events::EventBus;

/// One registered plugin instance, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginRecord {
    /// Plugin id.
    pub id: String,
    /// Instance name, unique within the plugin.
    pub instance: String,
    /// What it does.
    pub plugin_type: PluginType,
    /// Where the registration came from.
    pub source: Source,
    /// Its CSI socket.
    pub socket: PathBuf,
    /// Where the plugin sees its staging and publish root, when elsewhere than the agent (a
    /// plugin run as a task with the root bind-mounted into it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin_view: Option<PathBuf>,
    /// Registration time, ms since the epoch.
    pub registered_ms: u64,
    /// Registration order, to break ties between equal times.
    pub order: u64,
}

impl PluginRecord {
    fn key(&self) -> String {
        key(&self.id, &self.instance)
    }
}

fn key(id: &str, instance: &str) -> String {
    format!("{id}/{instance}")
}

/// What to register.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// Plugin id.
    pub id: String,
    /// Instance name.
    pub instance: String,
    /// What it does.
    pub plugin_type: PluginType,
    /// Where it came from.
    pub source: Source,
    /// Its CSI socket.
    pub socket: PathBuf,
    /// See [`PluginRecord::plugin_view`].
    pub plugin_view: Option<PathBuf>,
}

/// A change in the registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Added, or replaced with another socket or type.
    Registered(PluginRecord),
    /// Removed.
    Deregistered(PluginRecord),
}

/// A registry failure.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// An id or instance that cannot be used.
    #[error("invalid registration: {0}")]
    Invalid(String),
    /// The store failed; nothing changed.
    #[error(transparent)]
    State(#[from] berth_state::StateError),
    /// The blocking store task did not finish.
    #[error("store task failed: {0}")]
    Task(String),
}

/// The registry. Share it behind an `Arc`.
#[derive(Debug)]
pub struct Registry {
    store: Arc<Store>,
    events: Arc<EventBus>,
    entries: Mutex<BTreeMap<String, PluginRecord>>,
    changes: broadcast::Sender<Change>,
    // Serializes writers so store and memory change in the same order.
    write: tokio::sync::Mutex<()>,
}

impl Registry {
    /// Loads every persisted entry. Blocking (reads the store).
    pub fn load(store: Arc<Store>, events: Arc<EventBus>) -> Result<Self, RegistryError> {
        let entries: BTreeMap<String, PluginRecord> = store
            .list::<PluginRecord>(Table::PLUGINS)?
            .into_iter()
            .collect();
        let (changes, _) = broadcast::channel(1024);
        Ok(Self {
            store,
            events,
            entries: Mutex::new(entries),
            changes,
            write: tokio::sync::Mutex::new(()),
        })
    }

    /// Changes from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    /// Every instance, by plugin id then instance.
    pub fn list(&self) -> Vec<PluginRecord> {
        self.lock().values().cloned().collect()
    }

    /// Every instance of `id`, newest first.
    pub fn instances(&self, id: &str) -> Vec<PluginRecord> {
        let mut v: Vec<PluginRecord> = self
            .lock()
            .values()
            .filter(|r| r.id == id)
            .cloned()
            .collect();
        // By registration order, not wall-clock time: a clock step never changes which is newest.
        v.sort_by_key(|r| std::cmp::Reverse(r.order));
        v
    }

    /// The active (newest) instance of `id`.
    pub fn active(&self, id: &str) -> Option<PluginRecord> {
        self.instances(id).into_iter().next()
    }

    /// Registers an instance, persisting it first. Returns the stored record. The change runs
    /// in its own task, so a caller that goes away mid-way cannot leave store and memory apart.
    pub async fn register(
        self: &Arc<Self>,
        reg: Registration,
    ) -> Result<PluginRecord, RegistryError> {
        let this = Arc::clone(self);
        tokio::spawn(async move { this.register_now(reg).await })
            .await
            .map_err(|e| RegistryError::Task(e.to_string()))?
    }

    async fn register_now(&self, reg: Registration) -> Result<PluginRecord, RegistryError> {
        for (what, v) in [("plugin id", &reg.id), ("instance", &reg.instance)] {
            berth_sys::validate_path_segment(what, v)
                .map_err(|e| RegistryError::Invalid(e.to_string()))?;
        }
        berth_csi::Endpoint::from_path(&reg.socket)
            .map_err(|e| RegistryError::Invalid(e.to_string()))?;
        let _w = self.write.lock().await;
        let k = key(&reg.id, &reg.instance);
        let existing = self.lock().get(&k).cloned();
        if let Some(e) = &existing
            && e.socket == reg.socket
            && e.plugin_type == reg.plugin_type
            && e.source == reg.source
            && e.plugin_view == reg.plugin_view
        {
            return Ok(e.clone());
        }
        let order = self.lock().values().map(|r| r.order).max().unwrap_or(0) + 1;
        let record = PluginRecord {
            id: reg.id,
            instance: reg.instance,
            plugin_type: reg.plugin_type,
            source: reg.source,
            socket: reg.socket,
            plugin_view: reg.plugin_view,
            registered_ms: crate::now_ms(),
            order,
        };
        let store = Arc::clone(&self.store);
        let stored = record.clone();
        tokio::task::spawn_blocking(move || store.put(Table::PLUGINS, &stored.key(), &stored))
            .await
            .map_err(|e| RegistryError::Task(e.to_string()))??;
        self.lock().insert(k, record.clone());
        self.events.emit(
            EventKind::PluginRegistered,
            &record.id,
            Some(&record.instance),
            format!(
                "{} plugin from {} at {}",
                record.plugin_type.as_str(),
                record.source.as_str(),
                record.socket.display()
            ),
        );
        let _ = self.changes.send(Change::Registered(record.clone()));
        Ok(record)
    }

    /// Removes an instance; `false` if it was not registered. Other instances are untouched.
    /// Like [`Registry::register`], the change runs in its own task.
    pub async fn deregister(
        self: &Arc<Self>,
        id: &str,
        instance: &str,
        reason: &str,
    ) -> Result<bool, RegistryError> {
        let this = Arc::clone(self);
        let (id, instance, reason) = (id.to_string(), instance.to_string(), reason.to_string());
        tokio::spawn(async move { this.deregister_now(&id, &instance, &reason).await })
            .await
            .map_err(|e| RegistryError::Task(e.to_string()))?
    }

    /// The record of one instance.
    pub fn get(&self, id: &str, instance: &str) -> Option<PluginRecord> {
        self.lock().get(&key(id, instance)).cloned()
    }

    async fn deregister_now(
        &self,
        id: &str,
        instance: &str,
        reason: &str,
    ) -> Result<bool, RegistryError> {
        let _w = self.write.lock().await;
        let k = key(id, instance);
        let Some(record) = self.lock().get(&k).cloned() else {
            return Ok(false);
        };
        let store = Arc::clone(&self.store);
        let dk = k.clone();
        tokio::task::spawn_blocking(move || store.delete(Table::PLUGINS, &dk))
            .await
            .map_err(|e| RegistryError::Task(e.to_string()))??;
        self.lock().remove(&k);
        self.events
            .emit(EventKind::PluginDeregistered, id, Some(instance), reason);
        let _ = self.changes.send(Change::Deregistered(record));
        Ok(true)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, PluginRecord>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(id: &str, instance: &str, socket: &str) -> Registration {
        Registration {
            id: id.into(),
            instance: instance.into(),
            plugin_type: PluginType::Node,
            source: Source::Api,
            socket: socket.into(),
            plugin_view: None,
        }
    }

    #[tokio::test]
    async fn newest_is_active_and_removing_the_old_one_leaves_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path().join("s.redb")).unwrap());
        let r = Arc::new(Registry::load(Arc::clone(&store), Arc::new(EventBus::new())).unwrap());
        r.register(reg("p", "old", "/run/old.sock")).await.unwrap();
        r.register(reg("p", "new", "/run/new.sock")).await.unwrap();
        assert_eq!(r.active("p").unwrap().instance, "new");
        // Re-registering the old one (a rescan) does not make it newest.
        r.register(reg("p", "old", "/run/old.sock")).await.unwrap();
        assert_eq!(r.active("p").unwrap().instance, "new");
        assert!(r.deregister("p", "old", "gone").await.unwrap());
        assert!(!r.deregister("p", "old", "gone").await.unwrap());
        assert_eq!(r.active("p").unwrap().instance, "new");
        // Persisted: a fresh load sees the same.
        let again = Registry::load(store, Arc::new(EventBus::new())).unwrap();
        assert_eq!(again.list(), r.list());
    }

    #[tokio::test]
    async fn bad_registrations_change_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path().join("s.redb")).unwrap());
        let r = Arc::new(Registry::load(Arc::clone(&store), Arc::new(EventBus::new())).unwrap());
        for bad in [
            reg("", "i", "/s.sock"),
            reg("a/b", "i", "/s.sock"),
            reg("p", "..", "/s.sock"),
            reg("p", "i", "rel.sock"),
        ] {
            assert!(r.register(bad).await.is_err());
        }
        assert!(r.list().is_empty());
        assert!(
            store
                .list::<PluginRecord>(Table::PLUGINS)
                .unwrap()
                .is_empty()
        );
    }
}
