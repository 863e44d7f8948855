//! Routes task events to the handler registered for each task, holding events back (bounded,
//! in order) until one is registered or while it is full.

use std::{
    collections::{HashMap, VecDeque},
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
};

use tokio::sync::mpsc::{self, error::TrySendError};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::{
    event::{TaskEvent, TaskEventKind},
    task::TaskId,
};

#[derive(Debug)]
pub(crate) struct Router {
    slots: Mutex<HashMap<TaskId, Slot>>,
    /// Most events held back per task.
    capacity: usize,
    dropped_total: AtomicU64,
    tracker: TaskTracker,
    cancel: CancellationToken,
    runtime: tokio::runtime::Handle,
}

#[derive(Debug, Default)]
struct Slot {
    handler: Option<mpsc::Sender<TaskEvent>>,
    /// Events not delivered yet, oldest first.
    pending: VecDeque<TaskEvent>,
    /// Events dropped from the front of `pending` since the last delivery.
    dropped: u64,
    /// A flush task is waiting for room in the handler's channel.
    flushing: bool,
}

impl Slot {
    fn has_undelivered(&self) -> bool {
        self.dropped > 0 || !self.pending.is_empty()
    }

    /// The next event to deliver: a `Dropped` marker first when events were dropped.
    fn take_next(&mut self, id: &TaskId, capacity: usize) -> Option<TaskEvent> {
        if self.dropped > 0 {
            let count = std::mem::take(&mut self.dropped);
            return Some(TaskEvent::new(
                id.clone(),
                "",
                TaskEventKind::Dropped { count },
                format!("{count} older events were dropped: more than {capacity} were held back"),
            ));
        }
        self.pending.pop_front()
    }
}

impl Router {
    /// Must be called within a tokio runtime (flushes are spawned on it).
    pub fn new(capacity: usize, tracker: TaskTracker, cancel: CancellationToken) -> Self {
        Self {
            slots: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
            dropped_total: AtomicU64::new(0),
            tracker,
            cancel,
            runtime: tokio::runtime::Handle::current(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<TaskId, Slot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `event` behind the task's undelivered ones and delivers what the handler takes.
    pub fn dispatch(self: &Arc<Self>, event: TaskEvent) {
        let id = event.task_id.clone();
        let mut slots = self.lock();
        let slot = slots.entry(id.clone()).or_default();
        if slot.pending.len() >= self.capacity {
            slot.pending.pop_front();
            slot.dropped += 1;
            let total = self.dropped_total.fetch_add(1, Ordering::Relaxed) + 1;
            // Warn on the 1st, 2nd, 4th, 8th… drop of a task, not on every one.
            if slot.dropped.is_power_of_two() {
                tracing::warn!(task_id = %id, dropped = slot.dropped, dropped_total = total, held = self.capacity, "task event dropped: too many held back for the task (no handler registered, or it is not reading)");
            }
        }
        slot.pending.push_back(event);
        self.deliver(&id, slot);
    }

    /// Sets the task's handler (replacing any earlier one) and delivers the held-back events,
    /// in order.
    pub fn register(self: &Arc<Self>, id: &TaskId, handler: mpsc::Sender<TaskEvent>) {
        let mut slots = self.lock();
        let slot = slots.entry(id.clone()).or_default();
        slot.handler = Some(handler);
        self.deliver(id, slot);
    }

    /// Forgets the task's handler and any events still held for it (logged).
    pub fn deregister(&self, id: &TaskId) {
        if let Some(slot) = self.lock().remove(id)
            && slot.has_undelivered()
        {
            tracing::info!(task_id = %id, discarded = slot.pending.len() as u64 + slot.dropped, "handler deregistered with task events undelivered; discarding them");
        }
    }

    /// Events of the task waiting for delivery.
    pub fn held_back(&self, id: &TaskId) -> usize {
        self.lock().get(id).map_or(0, |s| s.pending.len())
    }

    /// Events dropped so far because too many were held back.
    pub fn dropped_total(&self) -> u64 {
        self.dropped_total.load(Ordering::Relaxed)
    }

    /// Delivers what the handler's channel has room for; when it is full, a flush task waits
    /// for room. Called with the slot locked, so deliveries stay in order.
    fn deliver(self: &Arc<Self>, id: &TaskId, slot: &mut Slot) {
        if slot.flushing {
            return;
        }
        while slot.has_undelivered() {
            let Some(handler) = slot.handler.clone() else {
                return;
            };
            match handler.try_reserve() {
                Ok(permit) => {
                    if let Some(event) = slot.take_next(id, self.capacity) {
                        permit.send(event);
                    }
                }
                Err(TrySendError::Full(())) => {
                    slot.flushing = true;
                    let router = Arc::clone(self);
                    let id = id.clone();
                    self.tracker
                        .spawn_on(async move { router.flush(id).await }, &self.runtime);
                    return;
                }
                Err(TrySendError::Closed(())) => {
                    tracing::warn!(task_id = %id, "task event handler went away; holding events back until another registers");
                    slot.handler = None;
                    return;
                }
            }
        }
    }

    /// Waits for room in the handler's channel and delivers, one event at a time, until
    /// nothing is held back.
    async fn flush(self: Arc<Self>, id: TaskId) {
        loop {
            let handler = {
                let mut slots = self.lock();
                let Some(slot) = slots.get_mut(&id) else {
                    return;
                };
                match &slot.handler {
                    Some(h) if slot.has_undelivered() => h.clone(),
                    _ => {
                        slot.flushing = false;
                        return;
                    }
                }
            };
            let permit = tokio::select! {
                permit = handler.reserve() => permit,
                () = self.cancel.cancelled() => return,
            };
            let mut slots = self.lock();
            let Some(slot) = slots.get_mut(&id) else {
                return;
            };
            let current = slot
                .handler
                .as_ref()
                .is_some_and(|h| h.same_channel(&handler));
            match permit {
                Ok(permit) if current => {
                    if let Some(event) = slot.take_next(&id, self.capacity) {
                        permit.send(event);
                    }
                }
                Ok(_) => {}
                Err(_) if current => {
                    tracing::warn!(task_id = %id, "task event handler went away; holding events back until another registers");
                    slot.handler = None;
                }
                Err(_) => {}
            }
        }
    }
}
