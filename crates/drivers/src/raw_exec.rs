//! `raw_exec`: a plain process on the host, without isolation.

use std::{process::Stdio, time::Duration};

use nix::{
    sys::signal::Signal,
    unistd::{getegid, geteuid},
};
use tokio::process::Command;

use crate::{
    driver::{Capabilities, Driver, DriverFuture, Fingerprint, FsIsolation, Health},
    error::DriverError,
    event::EventSink,
    logs::prepare_outputs,
    supervisor::{Isolation, ProcessConfig, Supervisor, task_env},
    task::{ExitResult, TaskConfig, TaskHandle, TaskId, TaskStats, TaskStatus},
    task_exec::{ExecCommand, ExecRequest, ExecSession, ProcessView, spawn_exec},
};

/// The driver's name.
pub const RAW_EXEC: &str = "raw_exec";

/// Runs a task as a plain process of the host, as the agent's user, in its own process group
/// (so signals to the agent's group never reach it, and stop reaches all of the task's
/// processes), with stdin from `/dev/null` and stdout/stderr going where its
/// [`TaskLogs`](crate::TaskLogs) say.
///
/// The environment is exactly the task's `env` plus the agent's `PATH` if `env` has none:
/// unlike Nomad, the agent's own environment (which may hold credentials) is not passed on.
///
/// It has no root of its own, so it cannot give a task device nodes: a config with
/// [`devices`](crate::TaskConfig::devices) is refused (use `exec`).
///
/// The process does not die with the agent (no parent-death signal): it is recovered by the
/// next agent from its [`TaskHandle`].
#[derive(Debug)]
pub struct RawExecDriver {
    sup: Supervisor,
}

impl RawExecDriver {
    /// A driver sending its task events to `events`.
    pub fn new(events: EventSink, config: ProcessConfig) -> Self {
        Self {
            sup: Supervisor::new(RAW_EXEC, events, config),
        }
    }

    async fn start_task(&self, config: TaskConfig) -> Result<TaskHandle, DriverError> {
        config.validate()?;
        config.refuse_container(RAW_EXEC)?;
        if !config.devices.is_empty() {
            return Err(DriverError::InvalidConfig {
                task_id: config.id,
                field: "devices".into(),
                reason: "raw_exec runs tasks on the host without isolation: it cannot give a task device nodes; use exec".into(),
            });
        }
        if !config.mounts.is_empty() {
            return Err(DriverError::Unsupported {
                task_id: config.id,
                driver: RAW_EXEC.into(),
                what: "bind mounts",
            });
        }
        let who =
            match &config.user {
                Some(u) => Some(crate::root::resolve_user(u).map_err(|reason| {
                    DriverError::InvalidConfig {
                        task_id: config.id.clone(),
                        field: "user".into(),
                        reason,
                    }
                })?),
                None => None,
            };
        let reservation = self.sup.reserve(&config.id)?;
        let outputs = prepare_outputs(&config, true).await?;
        let mut cmd = Command::new(&config.command);
        if let Some(who) = who {
            cmd.uid(who.uid).gid(who.gid);
        }
        cmd.args(&config.args)
            .env_clear()
            .envs(task_env(&config, self.sup.process_config()))
            .current_dir(&config.dir)
            .stdin(Stdio::null())
            .stdout(outputs.stdout.file)
            .stderr(outputs.stderr.file)
            .process_group(0)
            .kill_on_drop(false);
        let child = cmd.spawn().map_err(|source| DriverError::Spawn {
            task_id: config.id.clone(),
            program: config.command.clone(),
            source,
        })?;
        reservation
            .commit_child(child, Isolation::default(), Vec::new(), outputs.rotated)
            .await
    }
}

impl Driver for RawExecDriver {
    fn name(&self) -> &str {
        RAW_EXEC
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fs_isolation: FsIsolation::None,
            send_signals: true,
            exec: true,
            bind_mounts: false,
            resource_limits: false,
            device_nodes: false,
        }
    }

    fn fingerprint(&self) -> DriverFuture<'_, Fingerprint> {
        Box::pin(async {
            let mut fp = Fingerprint::new(Health::Healthy, "runs plain processes");
            fp.attributes
                .insert(format!("driver.{RAW_EXEC}"), "1".into());
            fp
        })
    }

    fn start(&self, config: TaskConfig) -> DriverFuture<'_, Result<TaskHandle, DriverError>> {
        Box::pin(self.start_task(config))
    }

    fn wait<'a>(
        &'a self,
        task_id: &'a TaskId,
    ) -> DriverFuture<'a, Result<ExitResult, DriverError>> {
        Box::pin(self.sup.wait(task_id))
    }

    fn stop<'a>(
        &'a self,
        task_id: &'a TaskId,
        timeout: Duration,
        signal: Signal,
    ) -> DriverFuture<'a, Result<(), DriverError>> {
        Box::pin(self.sup.stop(task_id, timeout, signal))
    }

    fn destroy<'a>(&'a self, task_id: &'a TaskId) -> DriverFuture<'a, Result<(), DriverError>> {
        Box::pin(self.sup.destroy(task_id))
    }

    fn inspect(&self, task_id: &TaskId) -> Result<TaskStatus, DriverError> {
        self.sup.inspect(task_id)
    }

    fn signal(&self, task_id: &TaskId, signal: Signal) -> Result<(), DriverError> {
        self.sup.signal(task_id, signal)
    }

    fn stats<'a>(
        &'a self,
        task_id: &'a TaskId,
    ) -> DriverFuture<'a, Result<TaskStats, DriverError>> {
        Box::pin(async move { self.sup.stats(task_id) })
    }

    fn recover(&self, handle: TaskHandle) -> DriverFuture<'_, Result<(), DriverError>> {
        Box::pin(async move {
            let logs = handle.logs.clone();
            let id = handle.task_id.clone();
            self.sup.recover(handle, None)?;
            self.sup.ensure_collectors(&id, logs.as_ref()).await;
            Ok(())
        })
    }

    fn exec<'a>(
        &'a self,
        task_id: &'a TaskId,
        request: ExecRequest,
    ) -> DriverFuture<'a, Result<ExecSession, DriverError>> {
        Box::pin(async move {
            request
                .validate()
                .map_err(|reason| DriverError::InvalidConfig {
                    task_id: task_id.clone(),
                    field: "exec".into(),
                    reason,
                })?;
            let target = self.sup.exec_target(task_id)?;
            let view = ProcessView::read(target.pid).map_err(|source| DriverError::Proc {
                task_id: task_id.clone(),
                pid: target.pid,
                source,
            })?;
            let (uid, gid) = (geteuid().as_raw(), getegid().as_raw());
            let user = (view.uid != uid || view.gid != gid).then_some((view.uid, view.gid));
            let mut command = request.command.into_iter();
            let program = command.next().unwrap_or_default();
            let cmd = ExecCommand {
                program: program.into(),
                args: command.map(Into::into).collect(),
                env: view.env,
                cwd: view.cwd,
                user,
            };
            spawn_exec(task_id, cmd, request.tty)
        })
    }

    fn shutdown(&self) -> DriverFuture<'_, ()> {
        Box::pin(self.sup.shutdown())
    }
}
