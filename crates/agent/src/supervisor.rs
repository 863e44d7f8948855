//! Runs a declared plugin that the agent starts itself: sets `CSI_ENDPOINT`, restarts the
//! process with exponential backoff when it exits, and stops it (SIGTERM, then SIGKILL after a
//! grace period) on shutdown. Starts and exits are events.

use std::{collections::BTreeMap, path::PathBuf, process::Stdio, sync::Arc, time::Duration};

use berth_api::EventKind;
use nix::{sys::signal::Signal, unistd::Pid};
use tokio::{process::Command, time::Instant};
use tokio_util::sync::CancellationToken;

use crate::events::EventBus;

/// Restart backoff and stop grace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartPolicy {
    /// First wait after an exit.
    pub initial: Duration,
    /// Longest wait.
    pub max: Duration,
    /// A run at least this long resets the wait to `initial`.
    pub reset_after: Duration,
    /// How long a stopping plugin gets after SIGTERM before SIGKILL.
    pub stop_grace: Duration,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(60),
            reset_after: Duration::from_secs(30),
            stop_grace: Duration::from_secs(5),
        }
    }
}

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
    /// Where its stdout and stderr go (appended).
    pub log: PathBuf,
    /// Backoff and grace.
    pub policy: RestartPolicy,
}

impl Supervisor {
    /// Where the running plugin's pid is kept, so an agent killed with SIGKILL can stop the
    /// orphan it left when it starts again.
    fn pid_file(&self) -> PathBuf {
        self.log.with_extension("pid")
    }

    /// Stops a plugin process left running by an agent that died without stopping it: the pid
    /// from the pid file, if that process still runs the same program.
    async fn stop_orphan(&self) {
        let Some(pid) = std::fs::read_to_string(self.pid_file())
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        else {
            return;
        };
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
        let ours = std::fs::canonicalize(&self.command).ok();
        if exe.is_none() || exe != ours {
            return;
        }
        tracing::warn!(plugin = %self.id, pid, "stopping the plugin process a previous agent left running");
        let _ = nix::sys::signal::killpg(Pid::from_raw(pid), Signal::SIGTERM);
        let deadline = Instant::now() + self.policy.stop_grace;
        while std::path::Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = nix::sys::signal::killpg(Pid::from_raw(pid), Signal::SIGKILL);
    }

    /// Runs the plugin until `shutdown`, restarting it whenever it exits; then stops it.
    pub async fn run(self, events: Arc<EventBus>, shutdown: CancellationToken) {
        self.stop_orphan().await;
        let mut wait = self.policy.initial;
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            let started = Instant::now();
            let mut child = match self.spawn() {
                Ok(c) => c,
                Err(e) => {
                    let reason = format!("cannot start {}: {e}", self.command.display());
                    events.emit(EventKind::PluginProcessExited, &self.id, None, reason);
                    if !sleep_or_shutdown(wait, &shutdown).await {
                        return;
                    }
                    wait = (wait * 2).min(self.policy.max);
                    continue;
                }
            };
            let pid = child.id();
            if let Some(p) = pid
                && let Err(e) = std::fs::write(self.pid_file(), p.to_string())
            {
                tracing::warn!(plugin = %self.id, error = %e, "cannot write the plugin's pid file");
            }
            events.emit(
                EventKind::PluginProcessStarted,
                &self.id,
                None,
                format!(
                    "started {} (pid {})",
                    self.command.display(),
                    pid.map_or("?".into(), |p| p.to_string())
                ),
            );
            let status = tokio::select! {
                s = child.wait() => s,
                () = shutdown.cancelled() => {
                    self.stop(&mut child, pid).await;
                    events.emit(EventKind::PluginProcessExited, &self.id, None, "stopped: agent shutting down");
                    return;
                }
            };
            let ran = started.elapsed();
            if ran >= self.policy.reset_after {
                wait = self.policy.initial;
            }
            let how = match status {
                Ok(s) => s.to_string(),
                Err(e) => format!("cannot wait for it: {e}"),
            };
            events.emit(
                EventKind::PluginProcessExited,
                &self.id,
                None,
                format!(
                    "exited ({how}) after {:.1}s; restarting in {wait:?}",
                    ran.as_secs_f64()
                ),
            );
            if !sleep_or_shutdown(wait, &shutdown).await {
                return;
            }
            wait = (wait * 2).min(self.policy.max);
        }
    }

    fn spawn(&self) -> std::io::Result<tokio::process::Child> {
        if let Some(dir) = self.socket.parent() {
            berth_sys::create_private_dir(dir)?;
        }
        if let Some(dir) = self.log.parent() {
            berth_sys::create_private_dir(dir)?;
        }
        // A stale socket from a previous run would make the plugin fail to bind.
        if std::fs::symlink_metadata(&self.socket)
            .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
        {
            std::fs::remove_file(&self.socket)?;
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        Command::new(&self.command)
            .args(&self.args)
            .envs(&self.env)
            .env("CSI_ENDPOINT", format!("unix://{}", self.socket.display()))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own process group, so stopping it reaches the children it starts too.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
    }

    async fn stop(&self, child: &mut tokio::process::Child, pid: Option<u32>) {
        let group = pid.and_then(|p| i32::try_from(p).ok()).map(Pid::from_raw);
        if let Some(g) = group {
            let _ = nix::sys::signal::killpg(g, Signal::SIGTERM);
        }
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
        let _ = std::fs::remove_file(self.pid_file());
    }
}

/// Waits `d`; `false` if shutdown came first.
async fn sleep_or_shutdown(d: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        () = tokio::time::sleep(d) => true,
        () = shutdown.cancelled() => false,
    }
}
