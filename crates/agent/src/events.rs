//! The agent's event bus: a broadcast that never blocks the sender (`GET /v1/events`), and
//! the persisted event stream (`GET /v1/event/stream`) every event also goes to.

use std::sync::atomic::{AtomicU64, Ordering};

use berth_api::{Event, EventKind, stream::Topic};
use serde_json::json;
use tokio::sync::broadcast;

use crate::event_log::{Draft, EventLog};

/// Emits events to any number of subscribers. A slow subscriber loses the oldest events (its
/// receiver reports the lag); it never slows the emitter.
#[derive(Debug)]
pub struct EventBus {
    tx: broadcast::Sender<Event>,
    seq: AtomicU64,
    stream: Option<EventLog>,
}

impl Default for EventBus {
    fn default() -> Self {
        Self::new()
    }
}

impl EventBus {
    /// An empty bus that feeds no event stream.
    pub fn new() -> Self {
        let (tx, _) = broadcast::channel(1024);
        Self {
            tx,
            seq: AtomicU64::new(0),
            stream: None,
        }
    }

    /// A bus that also publishes every event to `stream`.
    pub fn with_stream(stream: EventLog) -> Self {
        Self {
            stream: Some(stream),
            ..Self::new()
        }
    }

    /// The event stream, when the bus feeds one.
    pub fn stream(&self) -> Option<&EventLog> {
        self.stream.as_ref()
    }

    /// Publishes one event to the stream only (jobs, allocs, nodes). Its payload must hold no
    /// secret or mount flag.
    pub fn publish(
        &self,
        topic: Topic,
        kind: impl Into<String>,
        key: &str,
        filter_keys: Vec<String>,
        payload: serde_json::Value,
    ) {
        if let Some(stream) = &self.stream {
            stream.publish(Draft {
                topic,
                kind: kind.into(),
                key: key.to_owned(),
                filter_keys,
                payload,
            });
        }
    }

    /// Sends `event` to the live subscribers and the stream.
    fn send(&self, event: Event) {
        if let Some(stream) = &self.stream {
            stream.publish(stream_draft(&event));
        }
        // No receiver is fine.
        let _ = self.tx.send(event);
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
        self.send(event);
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
        self.send(event);
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
        self.send(event);
    }

    /// Live events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }
}

/// The stream's form of a bus event: plugin events under `CSIPlugin` (key: the plugin),
/// volume and claim events under `CSIVolume` (key: the volume; the plugin and the alloc are
/// filter keys), device events under `Device` (key: the device, else the plugin).
fn stream_draft(e: &Event) -> Draft {
    let kind = format!("{:?}", e.kind);
    let mut filter_keys = Vec::new();
    let (topic, key) = if let Some(volume) = &e.volume_id {
        filter_keys.push(e.plugin_id.clone());
        filter_keys.extend(e.alloc_id.clone());
        (Topic::CsiVolume, volume.clone())
    } else if kind.starts_with("Device") {
        match &e.device {
            Some(d) => {
                filter_keys.push(e.plugin_id.clone());
                (Topic::Device, d.clone())
            }
            None => (Topic::Device, e.plugin_id.clone()),
        }
    } else {
        filter_keys.extend(e.instance.clone());
        (Topic::CsiPlugin, e.plugin_id.clone())
    };
    Draft {
        topic,
        kind,
        key,
        filter_keys,
        payload: {
            let mut p = serde_json::Map::new();
            p.insert("Plugin".into(), json!(e.plugin_id));
            for (name, value) in [
                ("Instance", &e.instance),
                ("Volume", &e.volume_id),
                ("Alloc", &e.alloc_id),
                ("Device", &e.device),
            ] {
                if let Some(v) = value {
                    p.insert(name.into(), json!(v));
                }
            }
            p.insert("Message".into(), json!(e.reason));
            serde_json::Value::Object(p)
        },
    }
}
