//! The event stream's window: every event the agent publishes gets the next index, is written
//! to the journal (`events.redb` in the data dir) and only then becomes readable. So a reader
//! only ever sees events that survive a crash, and an index is never handed out twice: after a
//! restart the stream goes on from the journal's last index.
//!
//! Publishing never blocks: events queue for one writer task, which takes whatever has queued
//! while the previous batch was being committed and commits it as one transaction (events that
//! come together share one fsync).

use std::{
    collections::VecDeque,
    path::Path,
    sync::{Arc, RwLock},
};

use berth_api::stream::{EventSource, MissedRange, Published, StreamEvent, Topic, WindowRead};
use berth_state::{Journal, StateError};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// Events the window keeps unless the config says otherwise.
pub const DEFAULT_WINDOW: usize = 10_000;

/// Most events one journal transaction takes.
const MAX_BATCH: usize = 4096;

/// An event before it has an index.
#[derive(Debug)]
pub struct Draft {
    /// Its topic.
    pub topic: Topic,
    /// Its type.
    pub kind: String,
    /// Its key.
    pub key: String,
    /// Its filter keys.
    pub filter_keys: Vec<String>,
    /// Its payload (a JSON object holding no secret).
    pub payload: serde_json::Value,
}

/// The publishing side and the window, cheap to clone.
#[derive(Debug, Clone)]
pub struct EventLog {
    window: Arc<Window>,
    tx: mpsc::UnboundedSender<Draft>,
}

#[derive(Debug)]
struct Window {
    events: RwLock<VecDeque<Published>>,
    capacity: usize,
    last: watch::Sender<u64>,
}

/// The task that numbers, commits and then shows queued events; run it until shutdown.
pub struct Writer {
    window: Arc<Window>,
    journal: Arc<Journal>,
    rx: mpsc::UnboundedReceiver<Draft>,
    next: u64,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").field("next", &self.next).finish()
    }
}

impl EventLog {
    /// Opens the journal at `path`, loads the newest `capacity` events into the window, and
    /// returns the log with the writer task to run.
    pub fn open(path: &Path, capacity: usize) -> Result<(Self, Writer), StateError> {
        let capacity = capacity.max(1);
        let journal = Journal::open(path)?;
        let mut events = VecDeque::new();
        let mut last = 0;
        for (index, json) in journal.load()? {
            last = index;
            match Published::from_json(&json) {
                Ok(p) if p.index == index => events.push_back(p),
                // A record this build cannot read ends the readable window: the reader is told
                // these were missed rather than given a gap.
                _ => {
                    tracing::warn!(index, path = %path.display(), "an event in the journal cannot be read; the window starts after it");
                    events.clear();
                }
            }
        }
        while events.len() > capacity {
            events.pop_front();
        }
        let window = Arc::new(Window {
            events: RwLock::new(events),
            capacity,
            last: watch::channel(last).0,
        });
        let (tx, rx) = mpsc::unbounded_channel();
        Ok((
            Self {
                window: Arc::clone(&window),
                tx,
            },
            Writer {
                window,
                journal: Arc::new(journal),
                rx,
                next: last + 1,
            },
        ))
    }

    /// Queues `draft`; it is readable once committed. Never blocks.
    pub fn publish(&self, draft: Draft) {
        // The writer is gone only at shutdown.
        let _ = self.tx.send(draft);
    }

    /// The newest index that can be read.
    pub fn last_index(&self) -> u64 {
        *self.window.last.borrow()
    }
}

impl EventSource for EventLog {
    fn read_after(&self, after: u64, max: usize) -> WindowRead {
        let events = self.window.events.read().unwrap_or_else(|p| p.into_inner());
        let Some(first) = events.front().map(|e| e.index) else {
            let last = *self.window.last.borrow();
            return WindowRead {
                events: Vec::new(),
                missed: (after < last).then_some(MissedRange {
                    from: after + 1,
                    to: last,
                }),
            };
        };
        if after + 1 < first {
            return WindowRead {
                events: Vec::new(),
                missed: Some(MissedRange {
                    from: after + 1,
                    to: first - 1,
                }),
            };
        }
        // Indexes in the window are consecutive.
        let skip = usize::try_from(after + 1 - first).unwrap_or(usize::MAX);
        WindowRead {
            events: events.iter().skip(skip).take(max).cloned().collect(),
            missed: None,
        }
    }

    fn watch_last(&self) -> watch::Receiver<u64> {
        self.window.last.subscribe()
    }
}

impl Writer {
    /// Commits batches until `shutdown` (then commits what has queued) or until every
    /// [`EventLog`] is dropped.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut drafts = Vec::new();
        loop {
            tokio::select! {
                n = self.rx.recv_many(&mut drafts, MAX_BATCH) => {
                    if n == 0 {
                        return;
                    }
                    self.commit(std::mem::take(&mut drafts)).await;
                }
                () = shutdown.cancelled() => break,
            }
        }
        while let Ok(d) = self.rx.try_recv() {
            drafts.push(d);
        }
        self.commit(drafts).await;
    }

    async fn commit(&mut self, drafts: Vec<Draft>) {
        let now = crate::now_ms();
        let mut batch = Vec::with_capacity(drafts.len());
        for d in drafts {
            let event = StreamEvent {
                topic: d.topic,
                kind: d.kind,
                key: d.key,
                filter_keys: d.filter_keys,
                index: self.next,
                time_ms: now,
                payload: d.payload,
            };
            match Published::new(&event) {
                Ok(p) => {
                    batch.push(p);
                    self.next += 1;
                }
                Err(e) => {
                    tracing::warn!(topic = %event.topic, kind = %event.kind, error = %e, "an event cannot be encoded; dropped")
                }
            }
        }
        let Some(newest) = batch.last().map(|p| p.index) else {
            return;
        };
        let keep_from = (newest + 1).saturating_sub(self.window.capacity as u64);
        let journal = Arc::clone(&self.journal);
        let rows: Vec<(u64, Arc<[u8]>)> = batch
            .iter()
            .map(|p| (p.index, Arc::clone(&p.json)))
            .collect();
        let written = tokio::task::spawn_blocking(move || {
            let rows: Vec<(u64, &[u8])> = rows.iter().map(|(i, j)| (*i, &j[..])).collect();
            journal.append(&rows, keep_from)
        })
        .await;
        match written {
            Ok(Ok(())) => {}
            // The events are still shown: a reader gets them now, but a restarted agent would
            // not have them. Say so.
            Ok(Err(e)) => {
                tracing::error!(error = %e, events = batch.len(), "events could not be written to the journal")
            }
            Err(e) => tracing::error!(error = %e, "the journal writer failed"),
        }
        {
            let mut events = self
                .window
                .events
                .write()
                .unwrap_or_else(|p| p.into_inner());
            events.extend(batch);
            while events.len() > self.window.capacity {
                events.pop_front();
            }
        }
        self.window.last.send_replace(newest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draft(key: &str) -> Draft {
        Draft {
            topic: Topic::Job,
            kind: "JobRegistered".into(),
            key: key.into(),
            filter_keys: Vec::new(),
            payload: serde_json::json!({"Job": key}),
        }
    }

    async fn wait_for_index(log: &EventLog, index: u64) {
        let mut w = log.watch_last();
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            w.wait_for(|i| *i >= index),
        )
        .await
        .expect("events committed in time")
        .expect("writer alive");
    }

    #[tokio::test]
    async fn events_are_numbered_kept_and_resumed_after_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.redb");
        let (log, writer) = EventLog::open(&path, 3).unwrap();
        let task = tokio::spawn(writer.run(CancellationToken::new()));
        for k in ["a", "b", "c", "d"] {
            log.publish(draft(k));
        }
        wait_for_index(&log, 4).await;
        let read = log.read_after(0, 10);
        assert_eq!(
            read.missed,
            Some(MissedRange { from: 1, to: 1 }),
            "the window holds 3"
        );
        let read = log.read_after(1, 10);
        assert_eq!(
            read.events.iter().map(|e| e.index).collect::<Vec<_>>(),
            [2, 3, 4]
        );
        assert_eq!(log.read_after(3, 1).events[0].key, "d");
        assert!(log.read_after(4, 10).events.is_empty());
        drop(log);
        task.await.unwrap();

        let (log, writer) = EventLog::open(&path, 3).unwrap();
        assert_eq!(log.last_index(), 4);
        let task = tokio::spawn(writer.run(CancellationToken::new()));
        log.publish(draft("e"));
        wait_for_index(&log, 5).await;
        let read = log.read_after(2, 10);
        assert_eq!(
            read.events
                .iter()
                .map(|e| (e.index, e.key.as_str()))
                .collect::<Vec<_>>(),
            [(3, "c"), (4, "d"), (5, "e")]
        );
        drop(log);
        task.await.unwrap();
    }
}
