//! `POST /v1/client/allocation/{alloc_id}/exec`: a command run in one of an alloc's running
//! tasks, through the task's driver ([`berth_drivers::Driver::exec`]).

use std::sync::Arc;

use berth_allocrunner::TaskRunState;
use berth_api::{
    allocs::{ExecRequest, ExecSession},
    server::ApiError,
};
use berth_drivers::{DriverError, TaskId, TerminalSize};

use super::{Jobs, alloc_logs::pick_task};

impl Jobs {
    /// Starts `req`'s command in its task. 404 for an alloc or task this node does not have,
    /// 400 for a task left out of an alloc with several (or a command the driver refuses),
    /// 409 when the task does not run or its driver cannot exec.
    pub async fn exec(self: &Arc<Self>, req: ExecRequest) -> Result<ExecSession, ApiError> {
        let status = self.alloc_status(&req.alloc_id).ok_or_else(|| {
            ApiError::NotFound(format!("no alloc {:?} on this node", req.alloc_id))
        })?;
        let task = pick_task(&status, req.task.as_deref())?;
        let summary = &status.tasks[task];
        if summary.state != TaskRunState::Running {
            return Err(ApiError::Conflict(format!(
                "task {task:?} of alloc {:?} is {}, not running",
                req.alloc_id, summary.state
            )));
        }
        let driver = self.drivers.driver(&summary.driver).ok_or_else(|| {
            ApiError::Conflict(format!(
                "task {task:?} runs on driver {:?}, which this node does not have",
                summary.driver
            ))
        })?;
        let id = TaskId::for_alloc(&req.alloc_id, task)
            .map_err(|e| ApiError::BadRequest(e.to_string()))?;
        let request = berth_drivers::ExecRequest {
            command: req.command,
            tty: req.tty.map(|(cols, rows)| TerminalSize { cols, rows }),
        };
        let session = driver.exec(&id, request).await.map_err(|e| match e {
            DriverError::NotRunning { .. } | DriverError::NotFound { .. } => ApiError::Conflict(
                format!("task {task:?} of alloc {:?} is not running", req.alloc_id),
            ),
            DriverError::Unsupported { .. } => ApiError::Conflict(e.to_string()),
            DriverError::InvalidConfig { reason, .. } => ApiError::BadRequest(reason),
            other => ApiError::Internal(other.to_string()),
        })?;
        tracing::info!(alloc_id = %req.alloc_id, task, "exec session started");
        let mut process = session.process;
        let resizer = process.resizer();
        Ok(ExecSession {
            stdin: Box::into_pin(session.stdin as Box<dyn tokio::io::AsyncWrite + Send>),
            stdout: Box::into_pin(session.stdout as Box<dyn tokio::io::AsyncRead + Send>),
            stderr: session
                .stderr
                .map(|e| Box::into_pin(e as Box<dyn tokio::io::AsyncRead + Send>)),
            resize: Box::new(move |cols, rows| resizer.resize(TerminalSize { cols, rows })),
            // Dropped before the end, it drops the process: that kills the command.
            exit: Box::pin(async move { process.wait().await }),
        })
    }
}
