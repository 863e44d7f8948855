//! The agent's event bus: a broadcast that never blocks the sender.

use std::sync::atomic::{AtomicU64, Ordering};

use berth_api::{Event, EventKind};
use tokio::sync::broadcast;

/// Emits events to any number of subscribers. A slow subscriber loses the oldest events (its
/// receiver reports the lag); it never slows the emitter.
#[derive(Debug)]
pub struct EventBus {
    tx: broadcast::Sender<Event>,
    seq: AtomicU64,
}

impl Default for EventBus {
    fn default() -> Self {
        Self::new()
    }
}

impl EventBus {
    /// An empty bus.
    pub fn new() -> Self {
        let (tx, _) = broadcast::channel(1024);
        Self {
            tx,
            seq: AtomicU64::new(0),
        }
    }

    /// Emits one event and logs it.
    pub fn emit(
        &self,
        kind: EventKind,
        plugin_id: &str,
        instance: Option<&str>,
        reason: impl Into<String>,
    ) {
        let event = Event {
            seq: self.seq.fetch_add(1, Ordering::SeqCst) + 1,
            time_ms: crate::now_ms(),
            kind,
            plugin_id: plugin_id.to_string(),
            instance: instance.map(str::to_string),
            volume_id: None,
            alloc_id: None,
            device: None,
            reason: reason.into(),
        };
        tracing::info!(plugin = %event.plugin_id, instance = ?event.instance, kind = ?event.kind, reason = %event.reason, "event");
        // No receiver is fine.
        let _ = self.tx.send(event);
    }

    /// Emits one volume event and logs it. `reason` must hold no secret or mount flag.
    pub fn emit_volume(
        &self,
        kind: EventKind,
        plugin_id: &str,
        volume_id: &str,
        alloc_id: Option<&str>,
        reason: impl Into<String>,
    ) {
        let event = Event {
            seq: self.seq.fetch_add(1, Ordering::SeqCst) + 1,
            time_ms: crate::now_ms(),
            kind,
            plugin_id: plugin_id.to_string(),
            instance: None,
            volume_id: Some(volume_id.to_string()),
            alloc_id: alloc_id.map(str::to_string),
            device: None,
            reason: reason.into(),
        };
        tracing::info!(plugin = %event.plugin_id, volume_id, alloc_id, kind = ?event.kind, reason = %event.reason, "event");
        let _ = self.tx.send(event);
    }

    /// Emits one device event (the device manager logs it).
    pub fn emit_device(&self, e: berth_devices::view::DeviceEvent) {
        let event = Event {
            seq: self.seq.fetch_add(1, Ordering::SeqCst) + 1,
            time_ms: crate::now_ms(),
            kind: e.kind.into(),
            plugin_id: e.plugin.to_string(),
            instance: None,
            volume_id: None,
            alloc_id: None,
            device: e.device,
            reason: e.message,
        };
        let _ = self.tx.send(event);
    }

    /// Live events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }
}
