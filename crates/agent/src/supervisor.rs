//! Runs a declared plugin that the agent starts itself: sets `CSI_ENDPOINT`, restarts the
//! process with exponential backoff when it exits, and stops it (SIGTERM, then SIGKILL after a
//! grace period) on shutdown. Starts and exits are events. One copy at most runs, even after
//! the agent was killed (see [`PluginSlot`]).
//!
//! Crash tests set [`CRASH_ENV`] to one of [`CLAIMED`], [`SPAWNED`], [`RECORDED`],
//! [`EXITED`], [`STOPPING`] to kill the agent at that moment of a plugin's start or stop.

use std::{collections::BTreeMap, path::PathBuf, sync::Arc, time::Duration};

use berth_api::EventKind;
use nix::{sys::signal::Signal, unistd::Pid};
use tokio::{process::Command, time::Instant};
use tokio_util::sync::CancellationToken;

use berth_drivers::{LogCollector, LogRotation, logs::CollectedLog};
use berth_sys::slot::PluginSlot;

use crate::{events::EventBus, volumes::CRASH_ENV};

pub use berth_sys::slot::RestartPolicy;

/// How a plugin's log is rotated: Nomad's defaults for a task, 10 files of 10 MiB.
pub const PLUGIN_LOG_ROTATION: LogRotation = LogRotation {
    max_files: 10,
    max_file_size_mb: 10,
};

/// One plugin process under supervision.
#[derive(Debug)]
pub struct Supervisor {
    /// Plugin id (for events and logs).
    pub id: String,
    /// The program.
    pub command: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment.
    pub env: BTreeMap<String, String>,
    /// The socket it must listen on (given as `CSI_ENDPOINT`).
    pub socket: PathBuf,
    /// The base of its log: its stdout and stderr go, together, through a log collector into
    /// `<log>.0`, `<log>.1`… (mode 0600, [`PLUGIN_LOG_ROTATION`]). Its pid file and lock file
    /// sit beside it.
    pub log: PathBuf,
    /// Backoff and grace.
    pub policy: RestartPolicy,
}

impl Supervisor {
    /// Runs the plugin until `shutdown`, restarting it whenever it exits; then stops it and
    /// whatever it left running. Before every start, whatever an earlier agent (killed at any
    /// moment) or the previous copy left in the plugin's slot is stopped, so one copy at most
    /// runs (see [`PluginSlot`]).
    pub async fn run(self, events: Arc<EventBus>, shutdown: CancellationToken) {
        // Before the first await: the health loop watches this directory for the socket, and
        // can only if it exists (spawn reports a failure to make it).
        if let Some(dir) = self.socket.parent() {
            let _ = berth_sys::create_private_dir(dir);
        }
        let crash = CrashHook::from_env();
        let mut slot = PluginSlot::new(&self.id, &self.log);
        let mut last_wait: Option<std::time::Duration> = None;
        while !shutdown.is_cancelled() {
            let start = tokio::select! {
                r = self.start(&mut slot, &crash) => r,
                () = shutdown.cancelled() => break,
            };
            let (mut child, pid) = match start {
                Ok(c) => c,
                Err(reason) => {
                    events.emit(EventKind::PluginProcessExited, &self.id, None, reason);
                    let wait = self.policy.next_wait(last_wait, std::time::Duration::ZERO);
                    last_wait = Some(wait);
                    if !sleep_or_shutdown(wait, &shutdown).await {
                        break;
                    }
                    continue;
                }
            };
            let started = Instant::now();
            events.emit(
                EventKind::PluginProcessStarted,
                &self.id,
                None,
                format!("started {} (pid {pid})", self.command.display()),
            );
            let status = tokio::select! {
                s = child.wait() => s,
                () = shutdown.cancelled() => {
                    self.stop(&mut child, pid, &crash).await;
                    events.emit(EventKind::PluginProcessExited, &self.id, None, "stopped: agent shutting down");
                    break;
                }
            };
            crash.at(EXITED);
            slot.forget();
            let ran = started.elapsed();
            let wait = self.policy.next_wait(last_wait, ran);
            last_wait = Some(wait);
            let how = match status {
                Ok(s) => s.to_string(),
                Err(e) => format!("cannot wait for it: {e}"),
            };
            events.emit(
                EventKind::PluginProcessExited,
                &self.id,
                None,
                format!(
                    "exited ({how}) after {}; restarting in {}",
                    berth_sys::short_duration(ran),
                    berth_sys::short_duration(wait)
                ),
            );
            if !sleep_or_shutdown(wait, &shutdown).await {
                break;
            }
        }
        let stuck = slot.release(self.policy.stop_grace).await;
        if !stuck.is_empty() {
            tracing::error!(plugin = %self.id, pids = ?stuck, "plugin processes survive SIGKILL");
        }
    }

    /// Claims the slot, starts a copy and records its pid; the reason, for the event, when it
    /// cannot.
    async fn start(
        &self,
        slot: &mut PluginSlot,
        crash: &CrashHook,
    ) -> Result<(tokio::process::Child, u32), String> {
        slot.claim(self.policy.stop_grace)
            .await
            .map_err(|e| format!("cannot start {}: {e}", self.command.display()))?;
        crash.at(CLAIMED);
        let child = self
            .spawn(slot)
            .await
            .map_err(|e| format!("cannot start {}: {e}", self.command.display()))?;
        // tokio forgets the pid only once it has reaped the child, which it has not yet.
        let pid = child
            .id()
            .ok_or_else(|| format!("{} exited at once", self.command.display()))?;
        crash.at(SPAWNED);
        if let Err(e) = slot.record(pid) {
            // The copy is marked and holds the lock: the next agent finds it without the file.
            tracing::warn!(plugin = %self.id, error = %e, "cannot write the plugin's pid file");
        }
        crash.at(RECORDED);
        Ok((child, pid))
    }

    async fn spawn(&self, slot: &PluginSlot) -> std::io::Result<tokio::process::Child> {
        if let Some(dir) = self.socket.parent() {
            berth_sys::create_private_dir(dir)?;
        }
        // A stale socket from a previous run would make the plugin fail to bind.
        if std::fs::symlink_metadata(&self.socket)
            .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
        {
            std::fs::remove_file(&self.socket)?;
        }
        // A collector of its own session writes the log: it outlives the agent, so a copy
        // left running by a killed agent never writes into a FIFO without a reader.
        let log = CollectedLog::start(
            &LogCollector::berth_subcommand(),
            PLUGIN_LOG_ROTATION,
            &self.log,
        )
        .await
        .map_err(std::io::Error::other)?
        .file;
        Command::new(&self.command)
            .args(&self.args)
            .envs(&self.env)
            .env("CSI_ENDPOINT", format!("unix://{}", self.socket.display()))
            // Last, so the config's env cannot hide whose copy this is.
            .envs(slot.marks())
            .stdin(slot.stdin()?)
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own process group, so stopping it reaches the children it starts too.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
    }

    async fn stop(&self, child: &mut tokio::process::Child, pid: u32, crash: &CrashHook) {
        // Our own child, not yet reaped: its pid cannot have been reused.
        let group = i32::try_from(pid).ok().map(Pid::from_raw);
        if let Some(g) = group {
            let _ = nix::sys::signal::killpg(g, Signal::SIGTERM);
        }
        crash.at(STOPPING);
        if tokio::time::timeout(self.policy.stop_grace, child.wait())
            .await
            .is_err()
        {
            tracing::warn!(plugin = %self.id, grace = ?self.policy.stop_grace, "plugin ignored SIGTERM; killing it");
            if let Some(g) = group {
                let _ = nix::sys::signal::killpg(g, Signal::SIGKILL);
            }
            let _ = child.kill().await;
        }
    }
}

/// Crash-test step: the slot is claimed (nothing left of earlier copies, the lock held);
/// nothing is started.
pub const CLAIMED: &str = "plugin:claimed";
/// Crash-test step: the copy runs; nothing recorded (no pid file, no event).
pub const SPAWNED: &str = "plugin:spawned";
/// Crash-test step: its pid file is written.
pub const RECORDED: &str = "plugin:recorded";
/// Crash-test step: the copy exited and was reaped; the restart is pending.
pub const EXITED: &str = "plugin:exited";
/// Crash-test step: shutting down, SIGTERM sent to the copy, which may still run.
pub const STOPPING: &str = "plugin:stopping";

/// Kills the agent (SIGKILL) at the step named by [`CRASH_ENV`], for crash tests.
#[derive(Debug, Default)]
struct CrashHook {
    at: Option<String>,
}

impl CrashHook {
    fn from_env() -> Self {
        Self {
            at: std::env::var(CRASH_ENV)
                .ok()
                .filter(|s| s.starts_with("plugin:")),
        }
    }

    fn at(&self, step: &str) {
        if self.at.as_deref() == Some(step) {
            tracing::error!(step, "crash hook: killing the agent");
            let _ = nix::sys::signal::raise(Signal::SIGKILL);
        }
    }
}

/// Waits `d`; `false` if shutdown came first.
async fn sleep_or_shutdown(d: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        () = tokio::time::sleep(d) => true,
        () = shutdown.cancelled() => false,
    }
}
