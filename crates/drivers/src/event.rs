//! Task events: what drivers report about their tasks, and where they send it.

use std::{fmt, sync::Arc, time::SystemTime};

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::{router::Router, task::TaskId};

/// Something that happened to a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskEvent {
    /// The task.
    pub task_id: TaskId,
    /// The driver that reported it (empty for events made by the manager).
    pub driver: String,
    /// What happened.
    pub kind: TaskEventKind,
    /// A human-readable line about it.
    pub message: String,
    /// When.
    pub time: SystemTime,
}

impl TaskEvent {
    /// An event of `kind` about `task_id`, now.
    pub fn new(
        task_id: TaskId,
        driver: impl Into<String>,
        kind: TaskEventKind,
        message: impl Into<String>,
    ) -> Self {
        Self {
            task_id,
            driver: driver.into(),
            kind,
            message: message.into(),
            time: SystemTime::now(),
        }
    }
}

/// The kind of a [`TaskEvent`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum TaskEventKind {
    /// The task's process started.
    Started {
        /// Its pid.
        pid: u32,
    },
    /// The task was re-attached after an agent restart.
    Recovered {
        /// Its pid.
        pid: u32,
    },
    /// A signal was sent to the task.
    Signaled {
        /// The signal's number.
        signal: i32,
    },
    /// The task was sent `SIGKILL` (a stop timed out, or the task was destroyed).
    Killed,
    /// The task's main process exited; both `None` when that cannot be known (a recovered
    /// task is not the agent's child).
    Exited {
        /// Exit code.
        code: Option<i32>,
        /// Killing signal.
        signal: Option<i32>,
        /// Whether the OOM killer acted in the task's cgroup.
        oom_killed: bool,
    },
    /// A fact about how the driver set the task up that its events should show, one per
    /// event, in the event's message: a limit not applied, the device nodes it was given, the
    /// device access it is allowed. Sent right after `Started`.
    Note,
    /// Made by the manager: this many older events of the task were dropped because more
    /// were held back for it than the limit. Delivered in their place, before the rest.
    Dropped {
        /// How many.
        count: u64,
    },
}

impl fmt::Display for TaskEventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Started { .. } => "started",
            Self::Recovered { .. } => "recovered",
            Self::Signaled { .. } => "signaled",
            Self::Killed => "killed",
            Self::Exited { .. } => "exited",
            Self::Note => "note",
            Self::Dropped { .. } => "dropped",
        })
    }
}

/// Where a driver sends its task events: a [`DriverManager`](crate::DriverManager)'s router
/// (`DriverManagerBuilder::event_sink`), a plain channel, or nowhere. Cheap to clone;
/// [`emit`](Self::emit) never blocks.
#[derive(Clone)]
pub struct EventSink {
    inner: SinkInner,
}

#[derive(Clone)]
enum SinkInner {
    Discard,
    Channel(mpsc::UnboundedSender<TaskEvent>),
    Router(Arc<Router>),
}

impl EventSink {
    /// A sink that drops every event (a driver used on its own).
    pub fn discard() -> Self {
        Self {
            inner: SinkInner::Discard,
        }
    }

    /// A sink that sends every event to the returned receiver, in order.
    pub fn channel() -> (Self, mpsc::UnboundedReceiver<TaskEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            Self {
                inner: SinkInner::Channel(tx),
            },
            rx,
        )
    }

    pub(crate) fn router(router: Arc<Router>) -> Self {
        Self {
            inner: SinkInner::Router(router),
        }
    }

    /// Sends `event` on; never blocks.
    pub fn emit(&self, event: TaskEvent) {
        tracing::debug!(task_id = %event.task_id, driver = %event.driver, kind = %event.kind, message = %event.message, "task event");
        match &self.inner {
            SinkInner::Discard => {}
            SinkInner::Channel(tx) => {
                // A closed receiver means nobody listens any more.
                let _ = tx.send(event);
            }
            SinkInner::Router(router) => router.dispatch(event),
        }
    }
}

impl fmt::Debug for EventSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.inner {
            SinkInner::Discard => "EventSink::Discard",
            SinkInner::Channel(_) => "EventSink::Channel",
            SinkInner::Router(_) => "EventSink::Router",
        })
    }
}
