//! Hooks the agent adds: task hooks per task (e.g. the CSI plugin supervisor of a task with a
//! `csi_plugin` block), run around the built-in ones, and alloc hooks (e.g. the Consul token
//! hook), run around the whole alloc.

use std::{fmt, path::PathBuf, sync::Arc};

use berth_drivers::{ExitResult, TaskConfig, TaskHandle, TaskId};
use berth_job::{GroupSpec, TaskSpec};

use crate::{BoxFuture, record::EventKind, shared::Shared};

/// Adds events to one task's record, or to the alloc's own (persisted and shown in
/// `alloc status`). Cheap to clone; a hook may keep it for work it does in the background.
#[derive(Clone)]
pub struct TaskEvents {
    shared: Option<Arc<Shared>>,
    /// `None`: events of the alloc itself.
    task: Option<String>,
}

impl TaskEvents {
    pub(crate) fn new(shared: Arc<Shared>, task: &str) -> Self {
        Self {
            shared: Some(shared),
            task: Some(task.to_owned()),
        }
    }

    pub(crate) fn for_alloc(shared: Arc<Shared>) -> Self {
        Self {
            shared: Some(shared),
            task: None,
        }
    }

    /// A handle that drops every event (for hooks called outside a runner, in tests).
    pub fn discard(task: &str) -> Self {
        Self {
            shared: None,
            task: Some(task.to_owned()),
        }
    }

    /// Adds an event of the task (or the alloc). `message` must hold no secret or mount flag.
    pub fn emit(&self, kind: EventKind, message: impl Into<String>) {
        if let Some(shared) = &self.shared {
            shared.event(self.task.as_deref(), kind, message);
        }
    }
}

impl fmt::Debug for TaskEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskEvents")
            .field("task", &self.task)
            .finish_non_exhaustive()
    }
}

/// What a task hook knows of its task.
#[derive(Debug, Clone)]
pub struct TaskContext {
    /// The alloc.
    pub alloc_id: String,
    /// The job.
    pub job_id: String,
    /// The group.
    pub group: String,
    /// The task's spec.
    pub task: TaskSpec,
    /// The task's id in its driver.
    pub task_id: TaskId,
    /// The alloc's directory.
    pub alloc_dir: PathBuf,
    /// The task's working directory (`<alloc dir>/<task>`).
    pub task_dir: PathBuf,
    /// The task's events.
    pub events: TaskEvents,
}

/// A task hook failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct HookError {
    /// What went wrong; shown in the task's events, so without secrets or mount flags.
    pub message: String,
}

impl HookError {
    /// An error saying `message`.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

/// A hook around one task's life. Every method has a default that does nothing.
///
/// Hooks of a task run in the order they were added, after the built-in ones (task
/// directory, volume mounts). Which prestart and poststart hooks are done is persisted by
/// [`name`](Self::name): a task recovered after an agent restart runs only the poststart hooks
/// it had not finished.
pub trait TaskHook: Send + Sync + fmt::Debug {
    /// The hook's name, unique among the task's hooks.
    fn name(&self) -> &str;

    /// Before each start of the task's process; may change its config (add bind mounts,
    /// environment). An error fails this start, and the restart policy decides what follows.
    fn prestart<'a>(
        &'a self,
        ctx: &'a TaskContext,
        config: &'a mut TaskConfig,
    ) -> BoxFuture<'a, Result<(), HookError>> {
        let _ = (ctx, config);
        Box::pin(async { Ok(()) })
    }

    /// After the process started. An error becomes an event; the task keeps running.
    fn poststart<'a>(
        &'a self,
        ctx: &'a TaskContext,
        handle: &'a TaskHandle,
    ) -> BoxFuture<'a, Result<(), HookError>> {
        let _ = (ctx, handle);
        Box::pin(async { Ok(()) })
    }

    /// After the task's running process was re-attached (an agent restart); the poststart
    /// hooks it had finished are not run again, so a hook that watches the process in the
    /// background starts again here.
    fn recovered<'a>(&'a self, ctx: &'a TaskContext, handle: &'a TaskHandle) -> BoxFuture<'a, ()> {
        let _ = (ctx, handle);
        Box::pin(async {})
    }

    /// After the process exited, on its own or stopped.
    fn exited<'a>(&'a self, ctx: &'a TaskContext, exit: &'a ExitResult) -> BoxFuture<'a, ()> {
        let _ = (ctx, exit);
        Box::pin(async {})
    }

    /// Before a running task is stopped (the alloc stops, or another of its tasks failed).
    fn stop<'a>(&'a self, ctx: &'a TaskContext) -> BoxFuture<'a, ()> {
        let _ = ctx;
        Box::pin(async {})
    }
}

/// What an alloc hook knows of its alloc.
#[derive(Debug, Clone)]
pub struct AllocContext {
    /// The alloc.
    pub alloc_id: String,
    /// The job.
    pub job_id: String,
    /// The alloc's group.
    pub group: GroupSpec,
    /// Which copy of the group.
    pub index: u32,
    /// The alloc's directory.
    pub alloc_dir: PathBuf,
    /// The alloc's events.
    pub events: TaskEvents,
}

/// A hook around a whole alloc.
///
/// Alloc hooks run in the order they were added. `prerun` runs after the built-in prerun
/// hooks (upstream allocs, volume claims) and before any task starts; `postrun` runs once
/// every task is dead, before the volumes are released. Which are done is persisted by
/// [`name`](Self::name), so after an agent restart a hook runs only what it had not
/// finished: a prerun that was cut short (the agent stopped) runs again, and must pick up
/// what it had already done rather than do it twice.
pub trait AllocHook: Send + Sync + fmt::Debug {
    /// The hook's name, unique among the alloc's hooks and the built-in ones.
    fn name(&self) -> &str;

    /// Before any task starts. An error fails the alloc: no task starts, and `postrun` runs.
    /// The future is dropped when the agent shuts down or the alloc is asked to stop.
    fn prerun<'a>(&'a self, ctx: &'a AllocContext) -> BoxFuture<'a, Result<(), HookError>> {
        let _ = ctx;
        Box::pin(async { Ok(()) })
    }

    /// Once every task is dead, whether `prerun` succeeded, failed or never ran. Must end in
    /// bounded time; the future is dropped when the agent shuts down, and runs again (from
    /// the start) in the next agent.
    fn postrun<'a>(&'a self, ctx: &'a AllocContext) -> BoxFuture<'a, ()> {
        let _ = ctx;
        Box::pin(async {})
    }
}
