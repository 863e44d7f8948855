//! Helpers shared by the driver tests.

#![allow(dead_code)]

pub mod exec;

use std::{
    fs,
    path::{Path, PathBuf},
    sync::Mutex,
    time::Duration,
};

use berth_drivers::{TaskConfig, TaskEvent, TaskEventKind, TaskHandle, TaskId};
use nix::{
    sys::signal::{Signal, killpg},
    unistd::Pid,
};
use tokio::sync::mpsc;

/// How long a polled condition may take.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Kills the process group of every task it tracks when dropped, so that no task outlives a
/// test, even a failing one.
#[derive(Debug, Default)]
pub struct Reaper {
    groups: Mutex<Vec<u32>>,
}

impl Reaper {
    pub fn track(&self, handle: &TaskHandle) {
        self.groups.lock().unwrap().push(handle.pid);
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        for pgid in self
            .groups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = killpg(Pid::from_raw(pgid as i32), Signal::SIGKILL);
        }
    }
}

/// A config for task `name` with its working directory and logs under `root/name`.
pub fn task(root: &Path, name: &str, command: &str, args: &[&str]) -> TaskConfig {
    let dir = root.join(name);
    let mut config = TaskConfig::new(
        TaskId::new(name).expect("task id"),
        command,
        &dir,
        dir.join("logs/stdout"),
        dir.join("logs/stderr"),
    );
    config.args = args.iter().map(|a| (*a).to_owned()).collect();
    config
}

/// `sh -c <script>`.
pub fn sh(root: &Path, name: &str, script: &str) -> TaskConfig {
    task(root, name, "sh", &["-c", script])
}

/// The content of a file, or empty.
pub fn read(path: impl AsRef<Path>) -> String {
    fs::read_to_string(path).unwrap_or_default()
}

/// Polls until `path` contains `needle`.
pub async fn wait_for_text(path: PathBuf, needle: &str) {
    let needle = needle.to_owned();
    berth_testkit::assert_eventually!(
        TIMEOUT,
        || {
            let path = path.clone();
            let needle = needle.clone();
            async move { read(&path).contains(&needle) }
        },
        "{} never contained {needle:?}; it holds {:?}",
        path.display(),
        read(&path)
    );
}

/// Whether `pid` is a live (not zombie) process.
pub fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        let state = s.rsplit_once(')').map(|(_, rest)| rest.trim_start());
        !matches!(state.and_then(|r| r.chars().next()), Some('Z' | 'X') | None)
    })
}

/// Field `n` (1-based) of `/proc/<pid>/stat`.
pub fn stat_field(pid: u32, n: usize) -> Option<String> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = s.rsplit_once(')')?;
    rest.split_whitespace().nth(n - 3).map(str::to_owned)
}

/// The next event, within [`TIMEOUT`].
pub async fn next_event(rx: &mut mpsc::UnboundedReceiver<TaskEvent>) -> TaskEvent {
    tokio::time::timeout(TIMEOUT, rx.recv())
        .await
        .expect("an event within the timeout")
        .expect("the sink is open")
}

/// Receives events until one matches `pred`; returns the kinds seen, that one last.
pub async fn events_until(
    rx: &mut mpsc::UnboundedReceiver<TaskEvent>,
    pred: impl Fn(&TaskEventKind) -> bool,
) -> Vec<TaskEventKind> {
    let mut kinds = Vec::new();
    loop {
        let event = next_event(rx).await;
        let done = pred(&event.kind);
        kinds.push(event.kind);
        if done {
            return kinds;
        }
    }
}
