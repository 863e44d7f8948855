//! The one owner of an alloc's record: every change goes through [`Shared::update`], which
//! persists the whole record after it.

use std::{
    fmt,
    sync::{Arc, Mutex, MutexGuard},
};

use crate::{
    record::{AllocEvent, AllocRecord, EventKind},
    store::{AllocStore, AllocStoreError},
};

pub(crate) struct Shared {
    pub alloc_id: String,
    state: Mutex<Versioned>,
    /// The sequence number of the last record written; held while writing, so writes reach
    /// the store in order and an older snapshot never replaces a newer one.
    written: Mutex<u64>,
    /// The record as last written to the store: what the API shows, so nothing is reported
    /// (a task's pid, say) that a restarted agent would not recover.
    durable: Mutex<AllocRecord>,
    store: Arc<dyn AllocStore>,
    max_events: usize,
}

struct Versioned {
    record: AllocRecord,
    seq: u64,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("alloc_id", &self.alloc_id)
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl Shared {
    pub fn new(record: AllocRecord, store: Arc<dyn AllocStore>, max_events: usize) -> Self {
        Self {
            alloc_id: record.alloc_id.clone(),
            durable: Mutex::new(record.clone()),
            state: Mutex::new(Versioned { record, seq: 0 }),
            written: Mutex::new(0),
            store,
            max_events,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Versioned> {
        // Updates are plain field writes: a panic in one leaves a usable record.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the record (with changes not yet persisted: for the alloc's own runners).
    pub fn read<R>(&self, f: impl FnOnce(&AllocRecord) -> R) -> R {
        f(&self.lock().record)
    }

    /// Reads the record as last persisted (what status and the API show).
    pub fn read_durable<R>(&self, f: impl FnOnce(&AllocRecord) -> R) -> R {
        f(&self.durable.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Changes the record, then persists it. The change stays in memory when the write fails
    /// (logged; the next write carries it).
    pub fn update(&self, f: impl FnOnce(&mut AllocRecord)) -> Result<(), AllocStoreError> {
        self.commit(Vec::new(), f)
    }

    /// Changes the record and adds `event` to it, in one write.
    pub fn update_with(
        &self,
        event: AllocEvent,
        f: impl FnOnce(&mut AllocRecord),
    ) -> Result<(), AllocStoreError> {
        self.commit(vec![event], f)
    }

    /// Adds an event.
    pub fn event(&self, task: Option<&str>, kind: EventKind, message: impl Into<String>) {
        let _ = self.commit(vec![AllocEvent::new(task, kind, message)], |_| {});
    }

    /// Adds events made elsewhere (the driver's).
    pub fn events(&self, events: Vec<AllocEvent>) {
        let _ = self.commit(events, |_| {});
    }

    fn commit(
        &self,
        events: Vec<AllocEvent>,
        f: impl FnOnce(&mut AllocRecord),
    ) -> Result<(), AllocStoreError> {
        for e in &events {
            tracing::info!(alloc_id = %self.alloc_id, task = e.task.as_deref().unwrap_or(""), kind = ?e.kind, "{}", e.message);
        }
        let (snapshot, seq) = {
            let mut state = self.lock();
            f(&mut state.record);
            for e in events {
                state.record.push_event(e, self.max_events);
            }
            state.seq += 1;
            (state.record.clone(), state.seq)
        };
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        if *written >= seq {
            return Ok(());
        }
        match self.store.put(&snapshot) {
            Ok(()) => {
                *written = seq;
                *self.durable.lock().unwrap_or_else(|e| e.into_inner()) = snapshot;
                Ok(())
            }
            Err(e) => {
                tracing::error!(alloc_id = %self.alloc_id, error = %e, "persisting the alloc record failed");
                Err(e)
            }
        }
    }
}
