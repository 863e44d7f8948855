//! What the event stream says of allocs: every event an alloc runner records becomes one
//! `Allocation` event (`Task<Kind>` for a task's, `Alloc<Kind>` for the alloc's own), and every
//! change of client or desired status an `AllocationUpdated`, and every change of a task's
//! state (pending, starting, running, dead) a `TaskStateChanged`. They are taken from the records
//! as they are written, so the stream says exactly what the store holds.

use std::{collections::HashMap, sync::Mutex};

use std::collections::BTreeMap;

use berth_allocrunner::{AllocEvent, AllocRecord, ClientStatus, DesiredState, TaskRunState};
use berth_api::stream::Topic;
use serde_json::json;

use crate::events::EventBus;

/// Where the stream stands for one alloc.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    /// Events recorded so far (kept and dropped).
    total: u64,
    client: ClientStatus,
    desired: DesiredState,
    tasks: BTreeMap<String, TaskRunState>,
}

impl Seen {
    fn of(record: &AllocRecord) -> Self {
        Self {
            total: record.events_dropped + record.events.len() as u64,
            client: record.client_status,
            desired: record.desired,
            tasks: record
                .tasks
                .iter()
                .map(|(name, t)| (name.clone(), t.state))
                .collect(),
        }
    }
}

/// Turns written alloc records into stream events.
#[derive(Debug, Default)]
pub struct AllocEvents {
    seen: Mutex<HashMap<String, Seen>>,
}

impl AllocEvents {
    /// Starts from `records` (what the store holds now: their events were streamed before).
    pub fn new(records: &[AllocRecord]) -> Self {
        Self {
            seen: Mutex::new(
                records
                    .iter()
                    .map(|r| (r.alloc_id.clone(), Seen::of(r)))
                    .collect(),
            ),
        }
    }

    /// Publishes what `record` adds to the one written before it.
    pub fn written(&self, bus: &EventBus, record: &AllocRecord) {
        let now = Seen::of(record);
        // Held while publishing, so two writers of one alloc publish in the order of their
        // records; a record older than one already seen (fewer events) adds nothing.
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen
            .get(&record.alloc_id)
            .is_some_and(|b| b.total > now.total)
        {
            return;
        }
        let before = seen.insert(record.alloc_id.clone(), now.clone());
        for (task, state) in &now.tasks {
            if before
                .as_ref()
                .is_some_and(|b| b.tasks.get(task) != Some(state))
            {
                bus.publish(
                    Topic::Allocation,
                    "TaskStateChanged",
                    &record.alloc_id,
                    vec![record.job_id.clone(), task.clone()],
                    json!({ "Alloc": alloc_payload(record), "Task": task, "State": state.to_string() }),
                );
            }
        }
        let new_events = match &before {
            Some(b) => now.total.saturating_sub(b.total),
            None => now.total,
        };
        let kept = record.events.len();
        let start = kept.saturating_sub(usize::try_from(new_events).unwrap_or(usize::MAX));
        for e in record.events.iter().skip(start) {
            publish_event(bus, record, e);
        }
        if before.is_none_or(|b| b.client != now.client || b.desired != now.desired) {
            bus.publish(
                Topic::Allocation,
                "AllocationUpdated",
                &record.alloc_id,
                vec![record.job_id.clone()],
                json!({ "Alloc": alloc_payload(record) }),
            );
        }
    }

    /// Publishes that the alloc's record is gone.
    pub fn deleted(&self, bus: &EventBus, alloc_id: &str) {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(alloc_id);
        bus.publish(
            Topic::Allocation,
            "AllocationDeleted",
            alloc_id,
            Vec::new(),
            json!({ "Alloc": { "ID": alloc_id } }),
        );
    }
}

/// What an alloc event's payload says of its alloc: ids and statuses, never its spec.
fn alloc_payload(r: &AllocRecord) -> serde_json::Value {
    json!({
        "ID": r.alloc_id,
        "JobID": r.job_id,
        "TaskGroup": r.group.name,
        "Index": r.index,
        "ClientStatus": r.client_status,
        "DesiredStatus": r.desired,
        "Failure": r.failure,
    })
}

fn publish_event(bus: &EventBus, record: &AllocRecord, e: &AllocEvent) {
    let kind = match &e.task {
        Some(_) => format!("Task{:?}", e.kind),
        None => format!("Alloc{:?}", e.kind),
    };
    let mut filter_keys = vec![record.job_id.clone()];
    filter_keys.extend(e.task.clone());
    bus.publish(
        Topic::Allocation,
        kind,
        &record.alloc_id,
        filter_keys,
        json!({
            "Alloc": alloc_payload(record),
            "Task": e.task,
            "Message": e.message,
            "Time": e.time.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0),
        }),
    );
}
