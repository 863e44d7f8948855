//! The slot of one plugin process the agent runs (a CSI plugin from its config, a device
//! plugin): what lets an agent find and stop every copy of the plugin an earlier agent
//! started, whatever moment that agent died at, so that two copies never run on one state dir
//! and socket. Also the restart policy every supervised plugin follows ([`RestartPolicy`]).
//!
//! - Every copy carries [`ID_VAR`] (the plugin id) and [`DIR_VAR`] (the slot's directory, the
//!   one holding the plugin's log) in its environment: from its `execve` on, `/proc` shows whose
//!   it is, and its children inherit the mark.
//! - Its stdin is the slot's lock file (empty: reads end at once, as from `/dev/null`), on which
//!   the agent holds an exclusive `flock`. The copy shares that lock from the moment it is
//!   forked, before it executes the plugin and carries the variables, and keeps it after the
//!   agent dies: while the lock cannot be taken, some copy may still run.
//! - The pid file records the running copy for people and tools. Nothing is ever signalled
//!   because of it: a pid may have been reused.
//!
//! [`PluginSlot::claim`] runs before every start: it stops what is left in the slot, takes the
//! lock, and only then lets the caller spawn.

use std::{
    fs::{File, OpenOptions},
    io,
    os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    time::Duration,
};

use crate::procs::{self, FileId, ProcessEntry, ProcessRef};
use nix::{
    errno::Errno,
    fcntl::{Flock, FlockArg},
};
use tokio::time::Instant;

/// The environment variable naming the plugin id, set in every copy.
pub const ID_VAR: &str = "BERTH_PLUGIN_ID";
/// The environment variable naming the slot's directory (canonical), set in every copy.
pub const DIR_VAR: &str = "BERTH_PLUGIN_SLOT_DIR";

/// How long a process left in the slot gets to die after SIGKILL.
const KILL_WAIT: Duration = Duration::from_secs(10);
/// How long a copy between fork and exec (it holds the lock but is not marked yet) is waited for.
const FORK_WAIT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(20);

/// How a supervised plugin process is restarted and stopped: exponential backoff between
/// starts, reset after a long enough run, and a grace period between SIGTERM and SIGKILL.
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

impl RestartPolicy {
    /// The wait after a start that ran for `ran`, when the previous wait was `previous`
    /// (`None` for the first failure): `initial` after a long run or the first failure, else
    /// twice `previous`, at most `max`.
    pub fn next_wait(&self, previous: Option<Duration>, ran: Duration) -> Duration {
        match previous {
            Some(p) if ran < self.reset_after => (p * 2).min(self.max).max(self.initial),
            _ => self.initial,
        }
    }
}

/// Why the slot cannot be claimed (or made).
#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    /// A file or directory of the slot cannot be made or used.
    #[error("plugin {id:?}: {}: {source}", path.display())]
    Io {
        /// The plugin.
        id: String,
        /// The file or directory.
        path: PathBuf,
        /// The failure.
        #[source]
        source: io::Error,
    },
    /// Processes left in the slot survive SIGKILL.
    #[error("plugin {id:?}: processes left by an earlier start survive SIGKILL: pids {pids:?}")]
    Stuck {
        /// The plugin.
        id: String,
        /// Those processes.
        pids: Vec<i32>,
    },
    /// The lock stayed held by processes that do not carry the plugin's mark.
    #[error(
        "plugin {id:?}: the lock {} is still held after {} (processes holding it open: {pids:?})",
        path.display(), crate::short_duration(*waited)
    )]
    Busy {
        /// The plugin.
        id: String,
        /// The lock file.
        path: PathBuf,
        /// The processes that have it open.
        pids: Vec<i32>,
        /// How long it was waited for.
        waited: Duration,
    },
}

/// The slot of one plugin: its lock, pid file and mark.
#[derive(Debug)]
pub struct PluginSlot {
    id: String,
    /// The slot's directory, as given (created 0700 when claimed).
    dir: PathBuf,
    lock_path: PathBuf,
    pid_path: PathBuf,
    /// The lock, held from the first claim until [`release`](Self::release).
    lock: Option<Flock<File>>,
    /// The value of [`DIR_VAR`]: the canonical directory, known once claimed.
    mark: Option<String>,
    kill_wait: Duration,
    fork_wait: Duration,
}

impl PluginSlot {
    /// The slot of plugin `id` whose output goes to `log`: the lock file and the pid file sit
    /// beside it (`.lock`, `.pid`). Touches nothing yet.
    pub fn new(id: &str, log: &Path) -> Self {
        Self {
            id: id.to_string(),
            dir: log
                .parent()
                .map_or_else(|| PathBuf::from("."), Path::to_path_buf),
            lock_path: log.with_extension("lock"),
            pid_path: log.with_extension("pid"),
            lock: None,
            mark: None,
            kill_wait: KILL_WAIT,
            fork_wait: FORK_WAIT,
        }
    }

    /// The pid file.
    pub fn pid_file(&self) -> &Path {
        &self.pid_path
    }

    /// The variables a copy must carry. Legal after a successful [`claim`](Self::claim).
    pub fn marks(&self) -> [(&'static str, &str); 2] {
        [
            (ID_VAR, self.id.as_str()),
            (DIR_VAR, self.mark.as_deref().unwrap_or_default()),
        ]
    }

    /// A new descriptor of the locked lock file, to be the stdin of the copy about to start, so
    /// the copy shares the lock. Legal after a successful [`claim`](Self::claim).
    pub fn stdin(&self) -> io::Result<File> {
        match &self.lock {
            Some(lock) => lock.try_clone(),
            None => Err(io::Error::other("the plugin slot is not claimed")),
        }
    }

    /// Makes the slot free for a new copy: stops every process left in it (those with the
    /// plugin's mark, or with the lock file as stdin: SIGTERM, up to `grace`, then SIGKILL),
    /// waits (bounded) for copies still between fork and exec, and takes the lock. When it
    /// returns `Ok`, no earlier copy runs and none can appear: every copy from now on is
    /// started by this agent. Call it before every start; it keeps the lock between starts.
    pub async fn claim(&mut self, grace: Duration) -> Result<(), SlotError> {
        self.prepare()?;
        let started = Instant::now();
        let deadline = started + grace + self.kill_wait + self.fork_wait;
        loop {
            let left = self.leftovers();
            if !left.is_empty() {
                let pids: Vec<i32> = left.iter().map(|p| p.pid).collect();
                tracing::warn!(plugin = %self.id, ?pids, "stopping plugin processes left running (by an earlier agent, or by the copy that exited)");
                let stuck = procs::stop_processes(&left, grace, self.kill_wait).await;
                if !stuck.is_empty() {
                    return Err(SlotError::Stuck {
                        id: self.id.clone(),
                        pids: stuck.iter().map(|p| p.pid).collect(),
                    });
                }
            } else if self.try_lock()? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let pids = self.lock_id().map_or_else(Vec::new, |id| {
                    procs::find_processes(|p| p.has_open(id))
                        .iter()
                        .map(|p| p.pid)
                        .collect()
                });
                return Err(SlotError::Busy {
                    id: self.id.clone(),
                    path: self.lock_path.clone(),
                    pids,
                    waited: started.elapsed(),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Records the pid of the copy just started (written atomically, mode 0600).
    pub fn record(&self, pid: u32) -> Result<(), crate::AtomicWriteError> {
        crate::write_atomic(&self.pid_path, format!("{pid}\n").as_bytes())
    }

    /// Removes the pid file (the copy it named has exited).
    pub fn forget(&self) {
        if let Err(e) = std::fs::remove_file(&self.pid_path)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(plugin = %self.id, path = %self.pid_path.display(), error = %e, "cannot remove the plugin's pid file");
        }
    }

    /// After the last copy was stopped: stops what it left running (as
    /// [`claim`](Self::claim) does), removes the pid file and releases the lock. Returns the
    /// pids that survive SIGKILL, if any (the lock is kept then, so no other agent starts a
    /// copy beside them).
    pub async fn release(mut self, grace: Duration) -> Vec<i32> {
        let left = self.leftovers();
        let stuck = procs::stop_processes(&left, grace, self.kill_wait).await;
        self.forget();
        if !stuck.is_empty() {
            // They may share the lock: keep the descriptor (until the agent exits) rather than
            // unlock it under them.
            if let Some(lock) = self.lock.take() {
                std::mem::forget(lock);
            }
        }
        stuck.iter().map(|p| p.pid).collect()
    }

    /// Creates the directory (0700) and the lock file (0600), and learns the mark.
    fn prepare(&mut self) -> Result<(), SlotError> {
        if self.mark.is_some() {
            return Ok(());
        }
        crate::create_private_dir(&self.dir).map_err(|e| self.io_err(&self.dir, e))?;
        let dir = std::fs::canonicalize(&self.dir).map_err(|e| self.io_err(&self.dir, e))?;
        create_private_file(&self.lock_path).map_err(|e| self.io_err(&self.lock_path, e))?;
        // Compared with what /proc shows, so a path that is not UTF-8 is marked lossily too.
        self.mark = Some(dir.to_string_lossy().into_owned());
        Ok(())
    }

    /// Takes the lock if it is free; `Ok(true)` once held.
    fn try_lock(&mut self) -> Result<bool, SlotError> {
        if self.lock.is_some() {
            return Ok(true);
        }
        // Read-only: it becomes the stdin of every copy.
        let file = File::open(&self.lock_path).map_err(|e| self.io_err(&self.lock_path, e))?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => {
                self.lock = Some(lock);
                Ok(true)
            }
            Err((_, Errno::EWOULDBLOCK)) => Ok(false),
            Err((_, errno)) => Err(self.io_err(&self.lock_path, errno.into())),
        }
    }

    fn lock_id(&self) -> Option<FileId> {
        std::fs::metadata(&self.lock_path)
            .ok()
            .map(|m| FileId::of(&m))
    }

    /// The running processes of this slot other than this agent: those carrying the mark, and
    /// those whose stdin is the lock file (a copy that cleared its environment).
    fn leftovers(&self) -> Vec<ProcessRef> {
        if self.mark.is_none() {
            return Vec::new();
        }
        let marks = self.marks();
        let lock = self.lock_id();
        procs::find_processes(|p: &ProcessEntry| {
            p.env_has(&marks) || lock.is_some_and(|id| p.fd_is(0, id))
        })
    }

    fn io_err(&self, path: &Path, source: io::Error) -> SlotError {
        SlotError::Io {
            id: self.id.clone(),
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Opens `path` for appending, creating it with mode 0600; an existing file with another mode
/// is set to 0600 (whatever the umask).
pub fn open_private_append(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)?;
    narrow_to_0600(&file)?;
    Ok(file)
}

/// Creates `path` (empty) with mode 0600 if missing; sets an existing file to 0600.
fn create_private_file(path: &Path) -> io::Result<()> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)?;
    narrow_to_0600(&file)
}

fn narrow_to_0600(file: &File) -> io::Result<()> {
    if file.metadata()?.permissions().mode() & 0o7777 != 0o600 {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::process::{Child, Command, Stdio};

    use super::*;

    const GRACE: Duration = Duration::from_secs(5);

    /// A child process, killed and reaped when dropped.
    struct Proc(Child);

    impl Proc {
        fn spawn(cmd: &mut Command) -> Self {
            Self(cmd.spawn().expect("spawn"))
        }

        fn pid(&self) -> i32 {
            i32::try_from(self.0.id()).unwrap()
        }

        /// Whether it still runs (reaps it once it exited).
        fn running(&mut self) -> bool {
            self.0.try_wait().unwrap().is_none()
        }

        /// Waits (bounded) until `ready` holds for its pid.
        async fn wait_until(&self, ready: impl Fn(i32) -> bool) {
            for _ in 0..500 {
                if ready(self.pid()) {
                    return;
                }
                tokio::time::sleep(POLL).await;
            }
            panic!("process {} never got ready", self.pid());
        }
    }

    impl Drop for Proc {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// Reaps `p` on a thread, so a process the slot kills does not linger as a zombie.
    fn reaped(p: Proc) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let mut p = p;
            let _ = p.0.wait();
        })
    }

    fn comm_is(pid: i32, name: &str) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == name)
    }

    fn slot(dir: &Path) -> PluginSlot {
        let mut slot = PluginSlot::new("p1", &dir.join("logs").join("plugin-p1.log"));
        slot.kill_wait = Duration::from_millis(500);
        slot.fork_wait = Duration::from_millis(300);
        slot
    }

    #[test]
    fn the_wait_doubles_up_to_the_max_and_resets_after_a_long_run() {
        let p = RestartPolicy {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(2),
            reset_after: Duration::from_secs(30),
            stop_grace: Duration::from_secs(5),
        };
        let short = Duration::from_secs(1);
        let mut last = None;
        let waits: Vec<u64> = (0..5)
            .map(|_| {
                let w = p.next_wait(last, short);
                last = Some(w);
                u64::try_from(w.as_millis()).unwrap()
            })
            .collect();
        assert_eq!(waits, [500, 1000, 2000, 2000, 2000]);
        assert_eq!(p.next_wait(last, Duration::from_secs(30)), p.initial);
    }

    #[tokio::test]
    async fn claim_stops_marked_processes_and_spares_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let mut slot = slot(dir.path());
        slot.claim(GRACE).await.expect("an empty slot");
        let marks: Vec<(String, String)> = slot
            .marks()
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect();
        assert!(marks[1].1.ends_with("/logs"), "{marks:?}");
        let copy = Proc::spawn(Command::new("sleep").arg("600").envs(marks.clone()));
        // Same id, another agent's slot: not ours.
        let mut other = Proc::spawn(
            Command::new("sleep")
                .arg("600")
                .env(ID_VAR, "p1")
                .env(DIR_VAR, "/elsewhere/logs"),
        );
        copy.wait_until(|p| comm_is(p, "sleep")).await;
        other.wait_until(|p| comm_is(p, "sleep")).await;
        let copy_pid = copy.pid();
        let reaper = reaped(copy);
        slot.claim(GRACE).await.expect("claimed");
        reaper.join().unwrap();
        assert!(
            ProcessRef::of(copy_pid).is_none(),
            "the marked copy was stopped"
        );
        assert!(other.running(), "another slot's process was left alone");
        assert!(slot.release(GRACE).await.is_empty());
    }

    #[tokio::test]
    async fn a_copy_holding_the_lock_as_stdin_is_stopped_even_unmarked() {
        let dir = tempfile::tempdir().unwrap();
        let mut slot = slot(dir.path());
        // Made (files only) but not locked: as after the agent that locked it died.
        slot.prepare().unwrap();
        // A copy that cleared its environment: the lock as stdin, locked through it.
        let copy = Proc::spawn(
            Command::new("sh")
                .args(["-c", "flock -x -n 0 && exec sleep 600"])
                .env_clear()
                .env("PATH", std::env::var("PATH").unwrap_or_default())
                .stdin(File::open(&slot.lock_path).unwrap()),
        );
        copy.wait_until(|p| comm_is(p, "sleep")).await;
        let copy_pid = copy.pid();
        let reaper = reaped(copy);
        slot.claim(GRACE).await.expect("claimed");
        reaper.join().unwrap();
        assert!(ProcessRef::of(copy_pid).is_none());
        assert!(slot.lock.is_some());
        assert!(slot.release(GRACE).await.is_empty());
    }

    #[tokio::test]
    async fn an_unmarked_holder_of_the_lock_is_reported_not_killed() {
        let dir = tempfile::tempdir().unwrap();
        let mut slot = slot(dir.path());
        slot.prepare().unwrap();
        // Holds the lock on a descriptor other than stdin (flock executes sleep without
        // forking), and carries no mark.
        let mut holder = Proc::spawn(
            Command::new("flock")
                .args(["-x", "-n", "-F"])
                .arg(&slot.lock_path)
                .args(["sleep", "600"])
                .stdin(Stdio::null()),
        );
        holder.wait_until(|p| comm_is(p, "sleep")).await;
        let err = slot.claim(Duration::from_millis(100)).await.unwrap_err();
        match &err {
            SlotError::Busy { pids, path, .. } => {
                assert!(pids.contains(&holder.pid()), "{err}");
                assert_eq!(path, &slot.lock_path);
            }
            other => panic!("not busy: {other}"),
        }
        assert!(err.to_string().contains("plugin-p1.lock"), "{err}");
        assert!(
            holder.running(),
            "a process without the mark is never killed"
        );
        assert!(slot.lock.is_none());
    }

    #[tokio::test]
    async fn the_pid_file_and_lock_file_are_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let mut slot = slot(dir.path());
        std::fs::create_dir_all(dir.path().join("logs")).unwrap();
        std::fs::write(&slot.lock_path, b"").unwrap();
        std::fs::set_permissions(&slot.lock_path, std::fs::Permissions::from_mode(0o644)).unwrap();
        slot.claim(GRACE).await.unwrap();
        slot.record(4242).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&slot.lock_path), 0o600);
        assert_eq!(mode(&slot.pid_path), 0o600);
        assert_eq!(mode(&dir.path().join("logs")), 0o700);
        assert_eq!(std::fs::read_to_string(&slot.pid_path).unwrap(), "4242\n");
        let pid_path = slot.pid_path.clone();
        assert!(slot.release(GRACE).await.is_empty());
        assert!(!pid_path.exists(), "release forgets the pid");
        let log = dir.path().join("logs").join("plugin-p1.log");
        std::fs::write(&log, b"old\n").unwrap();
        std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o666)).unwrap();
        drop(open_private_append(&log).unwrap());
        assert_eq!(mode(&log), 0o600);
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "old\n",
            "appended, not truncated"
        );
    }
}
