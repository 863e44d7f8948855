//! Killing what an agent left running, found by the mark it carries in its environment
//! (never by a pid file: a pid may have been reused by an unrelated process).

use std::{
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

/// The environment variable holding a task's alloc dir (a host path), set by the agent in
/// every task it starts.
pub const ALLOC_DIR_VAR: &str = "BERTH_ALLOC_DIR";

/// How long [`kill_marked`] waits for the processes it signalled to die.
pub const KILL_WAIT: Duration = Duration::from_secs(10);

/// SIGKILLs every process but this one whose environment sets `var` to `dir` or to a path
/// under it, as `dir` is given or canonicalized, and waits (at most [`KILL_WAIT`]) until each
/// is dead (gone or a zombie), so none of them writes anything once it returns; returns how
/// many were signalled. This finds what an agent marked as its own and which outlives a killed
/// agent on purpose: plugins carry their slot's directory in `berth_sys::slot::DIR_VAR`, tasks
/// their alloc dir in [`ALLOC_DIR_VAR`]. The environment read is the one of each process's
/// `execve`, which its children inherit.
///
/// # Panics
/// If `var` is empty or contains `=`.
pub fn kill_marked(var: &str, dir: &Path) -> usize {
    assert!(
        !var.is_empty() && !var.contains('='),
        "not an environment variable name: {var:?}"
    );
    let marks: Vec<Mark> = dir_forms(dir).iter().map(|d| Mark::new(var, d)).collect();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let me = std::process::id();
    let mut killed = Vec::new();
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
            .filter(|&p| u32::try_from(p).is_ok_and(|p| p != me))
        else {
            continue;
        };
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if !env
            .split(|b| *b == 0)
            .any(|v| marks.iter().any(|m| m.matches(v)))
        {
            continue;
        }
        // Read before the signal: a later process with the same pid is not waited for.
        let started = start_time(pid);
        if kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
            killed.push((pid, started));
        }
    }
    let deadline = Instant::now() + KILL_WAIT;
    while killed.iter().any(|&(pid, started)| alive(pid, started)) && Instant::now() < deadline {
        std::thread::sleep(crate::POLL_INTERVAL);
    }
    killed.len()
}

/// The start time of process `pid` (field 22 of `/proc/<pid>/stat`), and its state letter.
fn stat(pid: i32) -> Option<(u64, char)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, in parentheses, may hold anything: fields count from its end.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let started = fields.get(19)?.parse().ok()?;
    Some((started, state))
}

fn start_time(pid: i32) -> Option<u64> {
    stat(pid).map(|(started, _)| started)
}

/// Whether the process `pid` that started at `started` still runs (not gone, not a zombie).
fn alive(pid: i32, started: Option<u64>) -> bool {
    match stat(pid) {
        None => false,
        Some((now, state)) => started.is_none_or(|s| s == now) && !matches!(state, 'Z' | 'X' | 'x'),
    }
}

/// SIGKILLs every process whose environment has [`ALLOC_DIR_VAR`] under `allocs_dir`: the
/// tasks an agent with that allocs dir started, which outlive a killed agent on purpose
/// ([`kill_marked`] with that variable). Then removes the task cgroups of those allocs, which
/// a killed task's supervisor could not. For test and bench clean-up.
pub fn kill_tasks_under(allocs_dir: &Path) {
    kill_marked(ALLOC_DIR_VAR, allocs_dir);
    remove_task_cgroups(allocs_dir);
}

/// Removes the empty task cgroups (`<alloc id>.<task>`) of the allocs under `allocs_dir` from
/// where an agent's `exec` driver makes them by default: `berth` under each cgroup v2
/// hierarchy, and under this process's cgroup v1 `devices` cgroup, which the agents it starts
/// inherit. One still holding processes, or busy for longer than [`KILL_WAIT`], stays.
fn remove_task_cgroups(allocs_dir: &Path) {
    let allocs: Vec<String> = std::fs::read_dir(allocs_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(|n| format!("{n}.")))
        .collect();
    if allocs.is_empty() {
        return;
    }
    let mut parents: Vec<PathBuf> = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .iter()
        .map(|h| Path::new(h).join("berth"))
        .collect();
    parents.extend(own_devices_cgroup().map(|d| d.join("berth")));
    let deadline = Instant::now() + KILL_WAIT;
    for parent in parents {
        for entry in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
            let name = entry.file_name();
            let ours = name
                .to_str()
                .is_some_and(|n| allocs.iter().any(|a| n.starts_with(a.as_str())));
            if !ours {
                continue;
            }
            // A cgroup emptied by SIGKILL may be busy for a moment.
            while std::fs::remove_dir(entry.path())
                .is_err_and(|e| e.raw_os_error() == Some(nix::libc::EBUSY))
                && Instant::now() < deadline
            {
                std::thread::sleep(crate::POLL_INTERVAL);
            }
        }
    }
}

/// This process's cgroup v1 `devices` cgroup directory, on hosts that mount that controller.
fn own_devices_cgroup() -> Option<PathBuf> {
    let mounts = berth_sys::read_mountinfo(Path::new("/proc/self/mountinfo")).ok()?;
    let mount = mounts
        .into_iter()
        .find(|m| m.fs_type == "cgroup" && m.super_options.split(',').any(|o| o == "devices"))?;
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|l| {
        let mut fields = l.splitn(3, ':');
        let controllers = fields.nth(1)?;
        controllers
            .split(',')
            .any(|c| c == "devices")
            .then(|| fields.next())
            .flatten()
    })?;
    Some(mount.mount_point.join(path.trim_start_matches('/')))
}

/// `dir` without a trailing `/`, and its canonical form when that differs.
fn dir_forms(dir: &Path) -> Vec<PathBuf> {
    let given: PathBuf = dir.components().collect();
    let mut forms = vec![given];
    if let Ok(canonical) = std::fs::canonicalize(dir)
        && canonical != forms[0]
    {
        forms.push(canonical);
    }
    forms
}

/// One `var=dir` environment entry to look for, exactly or with more path after it.
struct Mark {
    exact: Vec<u8>,
    under: Vec<u8>,
}

impl Mark {
    fn new(var: &str, dir: &Path) -> Self {
        let mut exact = var.as_bytes().to_vec();
        exact.push(b'=');
        exact.extend_from_slice(dir.as_os_str().as_bytes());
        let mut under = exact.clone();
        if !under.ends_with(b"/") {
            under.push(b'/');
        }
        Self { exact, under }
    }

    /// Whether the environment entry `entry` sets the variable to the dir or under it.
    fn matches(&self, entry: &[u8]) -> bool {
        entry == self.exact.as_slice() || entry.starts_with(&self.under)
    }
}

#[cfg(test)]
mod tests {
    use std::process::{Child, Command};

    use super::*;

    /// A child killed and reaped when dropped.
    struct Reap(Child);

    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn a_mark_matches_the_dir_and_what_is_under_it_only() {
        let m = Mark::new("V", Path::new("/a/b"));
        assert!(m.matches(b"V=/a/b"));
        assert!(m.matches(b"V=/a/b/c"));
        assert!(!m.matches(b"V=/a/bc"));
        assert!(!m.matches(b"V=/a"));
        assert!(!m.matches(b"W=/a/b"));
        assert!(!m.matches(b"XV=/a/b"));
        let root = Mark::new("V", Path::new("/"));
        assert!(root.matches(b"V=/x"));
        assert!(!root.matches(b"W=/x"));
    }

    #[test]
    fn a_trailing_slash_is_ignored() {
        assert_eq!(
            dir_forms(Path::new("/no/such/dir/")),
            [PathBuf::from("/no/such/dir")]
        );
    }

    #[test]
    fn only_marked_processes_are_killed() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join("slot");
        std::fs::create_dir(&dir).expect("slot dir");
        let sleep = |value: &Path| {
            Reap(
                Command::new("sleep")
                    .arg("600")
                    .env("BERTH_TESTKIT_MARK", value)
                    .spawn()
                    .expect("sleep"),
            )
        };
        let mut inside = sleep(&dir.join("x"));
        let mut sibling = sleep(&tmp.path().join("slot2"));
        // `spawn` returns once the child has begun its exec, which may be before the kernel
        // has laid out its new environment: until then `environ` reads empty.
        for child in [&inside, &sibling] {
            let environ = format!("/proc/{}/environ", child.0.id());
            let deadline = Instant::now() + KILL_WAIT;
            while std::fs::read(&environ).is_ok_and(|e| e.is_empty()) {
                assert!(Instant::now() < deadline, "{environ} stayed empty");
                std::thread::sleep(crate::POLL_INTERVAL);
            }
        }
        assert_eq!(kill_marked("BERTH_TESTKIT_MARK", &dir), 1);
        // Dead on return: a zombie until reaped here.
        assert!(
            !alive(i32::try_from(inside.0.id()).expect("pid"), None),
            "the marked process is dead once kill_marked returns"
        );
        assert!(inside.0.try_wait().expect("wait").is_some());
        assert!(
            sibling.0.try_wait().expect("wait").is_none(),
            "a dir that only shares a prefix is not under it"
        );
    }
}
