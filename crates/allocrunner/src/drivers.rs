//! Where the runner finds task drivers: a [`DriverManager`] (task events included) or a plain
//! map of drivers.

use std::{collections::BTreeMap, fmt, sync::Arc};

use berth_drivers::{Driver, DriverManager, TaskEvent, TaskId};
use tokio::sync::mpsc;

/// The task drivers of the node, by name.
pub trait TaskDrivers: Send + Sync + fmt::Debug {
    /// The driver called `name`.
    fn driver(&self, name: &str) -> Option<Arc<dyn Driver>>;

    /// Sends the driver events of `task_id` to `handler` (dropped when events are not
    /// routed).
    fn register_handler(&self, task_id: &TaskId, handler: mpsc::Sender<TaskEvent>) {
        let _ = (task_id, handler);
    }

    /// Stops sending the events of `task_id`.
    fn deregister_handler(&self, task_id: &TaskId) {
        let _ = task_id;
    }
}

impl TaskDrivers for DriverManager {
    fn driver(&self, name: &str) -> Option<Arc<dyn Driver>> {
        DriverManager::driver(self, name)
    }

    fn register_handler(&self, task_id: &TaskId, handler: mpsc::Sender<TaskEvent>) {
        DriverManager::register_handler(self, task_id, handler);
    }

    fn deregister_handler(&self, task_id: &TaskId) {
        DriverManager::deregister_handler(self, task_id);
    }
}

/// Drivers by name, without event routing (driver events are not shown in the alloc's
/// events).
impl TaskDrivers for BTreeMap<String, Arc<dyn Driver>> {
    fn driver(&self, name: &str) -> Option<Arc<dyn Driver>> {
        self.get(name).cloned()
    }
}
