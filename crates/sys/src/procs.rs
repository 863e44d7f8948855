//! Finding processes by what `/proc` shows of them (environment, open files), and stopping
//! them: how a restarted agent finds a task or plugin process it started but never recorded.
//! A process is named by its pid and start time ([`ProcessRef`]), so a reused pid is never
//! signalled.

use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::Duration,
};

use nix::{
    sys::signal::{Signal, kill, killpg},
    unistd::Pid,
};
use tokio::time::Instant;

/// How often the waits here look again.
const POLL: Duration = Duration::from_millis(10);

/// Pids of the processes (other than this one) whose environment holds every `NAME=value`
/// of `vars`, read from `/proc`. Processes that vanish or cannot be read are skipped.
pub fn pids_with_env(vars: &[(&str, &str)]) -> Vec<i32> {
    pids_with_env_in(Path::new("/proc"), vars)
}

fn pids_with_env_in(proc: &Path, vars: &[(&str, &str)]) -> Vec<i32> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir(proc) else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| u32::try_from(*pid).ok() != Some(me))
        .filter(|pid| {
            std::fs::read(proc.join(pid.to_string()).join("environ"))
                .is_ok_and(|env| env_holds(&env, vars))
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// Whether `pid` is a live process (not a zombie).
pub fn is_alive(pid: i32) -> bool {
    kill(Pid::from_raw(pid), None).is_ok()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, r)| r.starts_with(" Z")))
}

/// Sends `SIGKILL` to every pid, then polls until they are gone or `timeout` passed; returns
/// those still alive. A process that is not this one's child stays a zombie only until its
/// parent reaps it, and counts as gone.
pub async fn kill_and_wait(pids: &[i32], timeout: Duration) -> Vec<i32> {
    for pid in pids {
        let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
    }
    let deadline = Instant::now() + timeout;
    loop {
        let alive: Vec<i32> = pids.iter().copied().filter(|p| is_alive(*p)).collect();
        if alive.is_empty() || Instant::now() >= deadline {
            return alive;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// One process, named by its pid and its start time (clock ticks after boot), so that a pid the
/// kernel has since given to another process is never taken for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProcessRef {
    /// Its pid.
    pub pid: i32,
    /// Field 22 of `/proc/<pid>/stat`.
    pub start_ticks: u64,
}

/// The fields of `/proc/<pid>/stat` used here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    /// Field 3: `R`, `S`, `D`, `Z`…
    state: char,
    /// Field 5: the process group.
    pgid: i32,
    /// Field 22.
    start_ticks: u64,
}

impl Stat {
    fn exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Parses a `/proc/<pid>/stat` line; fields are counted after the last `)`, since the command
/// name (field 2) may hold spaces and parentheses.
fn parse_stat(line: &str) -> Option<Stat> {
    let (_, rest) = line.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).copied();
    Some(Stat {
        state: field(3)?.chars().next()?,
        pgid: field(5)?.parse().ok()?,
        start_ticks: field(22)?.parse().ok()?,
    })
}

fn read_stat(proc: &Path, pid: i32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(proc.join(pid.to_string()).join("stat")).ok()?)
}

impl ProcessRef {
    /// The process `pid`, if it runs (a zombie does not).
    pub fn of(pid: i32) -> Option<Self> {
        Self::of_in(Path::new("/proc"), pid)
    }

    fn of_in(proc: &Path, pid: i32) -> Option<Self> {
        let stat = read_stat(proc, pid).filter(|s| !s.exited())?;
        Some(Self {
            pid,
            start_ticks: stat.start_ticks,
        })
    }

    /// Whether this very process still runs: its pid names a live process (not a zombie) that
    /// started at the same time.
    pub fn is_running(&self) -> bool {
        self.stat().is_some()
    }

    fn stat(&self) -> Option<Stat> {
        read_stat(Path::new("/proc"), self.pid)
            .filter(|s| s.start_ticks == self.start_ticks && !s.exited())
    }

    /// Sends `signal` to this process (and to its process group when it leads one) if it still
    /// runs; returns whether it did. Between the check and the signal the process could only be
    /// replaced by one that got the same pid after the kernel went round every other pid.
    pub fn signal(&self, signal: Signal) -> bool {
        let Some(stat) = self.stat() else {
            return false;
        };
        let pid = Pid::from_raw(self.pid);
        if stat.pgid == self.pid {
            // Its group holds the children it started (unless they left it).
            let _ = killpg(pid, signal);
        }
        kill(pid, signal).is_ok()
    }
}

/// A file's identity: device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId {
    /// Device.
    pub dev: u64,
    /// Inode.
    pub ino: u64,
}

impl FileId {
    /// The identity of the file `meta` describes.
    pub fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }
}

/// One process as [`find_processes`] offers it to its selector.
#[derive(Debug)]
pub struct ProcessEntry {
    dir: PathBuf,
    pid: i32,
}

impl ProcessEntry {
    /// Its pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Whether its environment (as it was when it executed its program) holds every
    /// `NAME=value` of `vars`. False when it cannot be read.
    pub fn env_has(&self, vars: &[(&str, &str)]) -> bool {
        std::fs::read(self.dir.join("environ")).is_ok_and(|env| env_holds(&env, vars))
    }

    /// Whether its file descriptor `fd` is open on the file `file`. False when it cannot be
    /// read.
    pub fn fd_is(&self, fd: u32, file: FileId) -> bool {
        std::fs::metadata(self.dir.join("fd").join(fd.to_string()))
            .is_ok_and(|m| FileId::of(&m) == file)
    }

    /// Whether any of its file descriptors is open on the file `file`. False when they cannot
    /// be read.
    pub fn has_open(&self, file: FileId) -> bool {
        std::fs::read_dir(self.dir.join("fd")).is_ok_and(|fds| {
            fds.flatten()
                .any(|fd| std::fs::metadata(fd.path()).is_ok_and(|m| FileId::of(&m) == file))
        })
    }
}

fn env_holds(env: &[u8], vars: &[(&str, &str)]) -> bool {
    let set: Vec<&[u8]> = env.split(|b| *b == 0).collect();
    vars.iter().all(|(k, v)| {
        let want = format!("{k}={v}");
        set.contains(&want.as_bytes())
    })
}

/// The running processes (not this one, no zombies) that `select` picks, read from `/proc`, in
/// pid order. Processes that vanish meanwhile are skipped.
pub fn find_processes(select: impl FnMut(&ProcessEntry) -> bool) -> Vec<ProcessRef> {
    find_processes_in(Path::new("/proc"), select)
}

fn find_processes_in(
    proc: &Path,
    mut select: impl FnMut(&ProcessEntry) -> bool,
) -> Vec<ProcessRef> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir(proc) else {
        return Vec::new();
    };
    let mut found: Vec<ProcessRef> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| u32::try_from(*pid).ok() != Some(me))
        .filter(|pid| {
            select(&ProcessEntry {
                dir: proc.join(pid.to_string()),
                pid: *pid,
            })
        })
        .filter_map(|pid| ProcessRef::of_in(proc, pid))
        .collect();
    found.sort_unstable_by_key(|p| p.pid);
    found
}

/// Stops `procs`: SIGTERM (to each one's process group too when it leads one), up to `grace`
/// for them to exit, then SIGKILL to those still running and up to `kill_wait` for them to go.
/// Returns those still running at the end (none, unless a process is stuck in the kernel). A
/// process whose pid now names another process is never signalled. A process that is not this
/// one's child stays a zombie only until its parent reaps it, and counts as gone.
pub async fn stop_processes(
    procs: &[ProcessRef],
    grace: Duration,
    kill_wait: Duration,
) -> Vec<ProcessRef> {
    for p in procs {
        p.signal(Signal::SIGTERM);
    }
    let left = wait_gone(procs, grace).await;
    for p in &left {
        p.signal(Signal::SIGKILL);
    }
    wait_gone(&left, kill_wait).await
}

/// Polls until none of `procs` runs or `timeout` passed; returns those still running.
async fn wait_gone(procs: &[ProcessRef], timeout: Duration) -> Vec<ProcessRef> {
    let deadline = Instant::now() + timeout;
    loop {
        let running: Vec<ProcessRef> = procs
            .iter()
            .copied()
            .filter(ProcessRef::is_running)
            .collect();
        if running.is_empty() || Instant::now() >= deadline {
            return running;
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};

    use super::*;

    #[test]
    fn finds_processes_by_every_variable_only() {
        let dir = tempfile::tempdir().unwrap();
        let write = |pid: &str, env: &[u8]| {
            std::fs::create_dir_all(dir.path().join(pid)).unwrap();
            std::fs::write(dir.path().join(pid).join("environ"), env).unwrap();
        };
        write("10", b"A=1\0B=2\0");
        write("11", b"A=1\0B=22\0");
        write("12", b"B=2\0A=1\0C=3\0");
        write("13", b"XA=1\0B=2\0");
        std::fs::create_dir_all(dir.path().join("self")).unwrap();
        assert_eq!(
            pids_with_env_in(dir.path(), &[("A", "1"), ("B", "2")]),
            [10, 12]
        );
        assert!(pids_with_env_in(dir.path(), &[("A", "2")]).is_empty());
    }

    #[tokio::test]
    async fn kills_a_live_process() {
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .env("BERTH_PROCS_TEST", std::process::id().to_string())
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let me = std::process::id().to_string();
        assert_eq!(pids_with_env(&[("BERTH_PROCS_TEST", &me)]), [pid]);
        // Our own child: reap it as it dies so it does not linger as a zombie.
        let reaper = std::thread::spawn(move || child.wait());
        assert!(
            kill_and_wait(&[pid], Duration::from_secs(10))
                .await
                .is_empty()
        );
        reaper.join().unwrap().unwrap();
        assert!(pids_with_env(&[("BERTH_PROCS_TEST", &me)]).is_empty());
    }

    #[test]
    fn stat_fields_are_counted_after_the_last_parenthesis() {
        let line = "4242 (a) b (c d) S 1 4240 4240 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 \
                    1000 10 18446744073709551615";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                state: 'S',
                pgid: 4240,
                start_ticks: 987_654
            })
        );
        assert_eq!(parse_stat("4242 (a) S 1"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    /// A fake `/proc/<pid>` with `environ` and a `stat` in `state`, started at `start`.
    fn fake_process(proc: &Path, pid: i32, env: &[u8], state: char, start: u64) {
        let dir = proc.join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("environ"), env).unwrap();
        let stat =
            format!("{pid} (x) {state} 1 {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0");
        std::fs::write(dir.join("stat"), stat).unwrap();
    }

    #[test]
    fn finds_running_processes_the_selector_picks() {
        let dir = tempfile::tempdir().unwrap();
        let proc = dir.path();
        fake_process(proc, 20, b"M=1\0", 'S', 500);
        fake_process(proc, 21, b"M=2\0", 'S', 501);
        fake_process(proc, 22, b"M=1\0", 'Z', 502);
        fake_process(proc, 23, b"N=0\0M=1\0", 'R', 503);
        let me = i32::try_from(std::process::id()).unwrap();
        fake_process(proc, me, b"M=1\0", 'R', 504);
        std::fs::create_dir_all(proc.join("self")).unwrap();
        let found = find_processes_in(proc, |p| p.env_has(&[("M", "1")]));
        assert_eq!(
            found,
            [
                ProcessRef {
                    pid: 20,
                    start_ticks: 500
                },
                ProcessRef {
                    pid: 23,
                    start_ticks: 503
                }
            ]
        );
        assert!(find_processes_in(proc, |p| p.env_has(&[("M", "3")])).is_empty());
        assert!(
            find_processes_in(proc, |p| p.pid() == 22).is_empty(),
            "a zombie does not run"
        );
    }

    /// Reaps `child` on a thread so it does not linger as a zombie once killed.
    fn reap(mut child: std::process::Child) -> std::thread::JoinHandle<std::process::ExitStatus> {
        std::thread::spawn(move || child.wait().unwrap())
    }

    fn process_ref(child: &std::process::Child) -> ProcessRef {
        ProcessRef::of(i32::try_from(child.id()).unwrap()).unwrap()
    }

    #[tokio::test]
    async fn finds_a_process_by_an_open_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marker");
        std::fs::write(&path, b"").unwrap();
        let child = std::process::Command::new("sleep")
            .arg("600")
            .stdin(std::fs::File::open(&path).unwrap())
            .spawn()
            .unwrap();
        let me = process_ref(&child);
        let id = FileId::of(&std::fs::metadata(&path).unwrap());
        assert_eq!(find_processes(|p| p.fd_is(0, id)), [me]);
        assert!(find_processes(|p| p.fd_is(1, id)).is_empty());
        assert_eq!(find_processes(|p| p.has_open(id)), [me]);
        let reaper = reap(child);
        assert!(
            stop_processes(&[me], Duration::from_secs(10), Duration::from_secs(10))
                .await
                .is_empty()
        );
        reaper.join().unwrap();
        assert!(find_processes(|p| p.fd_is(0, id)).is_empty());
    }

    #[tokio::test]
    async fn stops_with_sigterm_then_sigkill() {
        let polite = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        // `trap ""` ignores SIGTERM, and the ignored disposition survives the exec.
        let stubborn = std::process::Command::new("sh")
            .args(["-c", "trap '' TERM; exec sleep 600"])
            .spawn()
            .unwrap();
        let (p, s) = (process_ref(&polite), process_ref(&stubborn));
        // Past the trap only once sh has become sleep.
        let comm = format!("/proc/{}/comm", s.pid);
        for _ in 0..500 {
            if std::fs::read_to_string(&comm).is_ok_and(|c| c.trim() == "sleep") {
                break;
            }
            tokio::time::sleep(POLL).await;
        }
        let (polite, stubborn) = (reap(polite), reap(stubborn));
        let left =
            stop_processes(&[p, s], Duration::from_millis(300), Duration::from_secs(10)).await;
        assert!(left.is_empty(), "{left:?}");
        assert_eq!(
            polite.join().unwrap().signal(),
            Some(Signal::SIGTERM as i32)
        );
        assert_eq!(
            stubborn.join().unwrap().signal(),
            Some(Signal::SIGKILL as i32)
        );
    }

    #[tokio::test]
    async fn stopping_a_group_leader_stops_its_group() {
        let me = std::process::id().to_string();
        let leader = std::process::Command::new("sh")
            .args(["-c", "sleep 600 & wait"])
            .env("BERTH_PROCS_GROUP_TEST", &me)
            .process_group(0)
            .spawn()
            .unwrap();
        let lead = process_ref(&leader);
        let reaper = reap(leader);
        let mut member = Vec::new();
        for _ in 0..500 {
            member = find_processes(|p| {
                p.env_has(&[("BERTH_PROCS_GROUP_TEST", &me)]) && p.pid() != lead.pid
            });
            if !member.is_empty() {
                break;
            }
            tokio::time::sleep(POLL).await;
        }
        assert_eq!(member.len(), 1, "the leader's child");
        assert!(
            stop_processes(&[lead], Duration::from_secs(10), Duration::from_secs(10))
                .await
                .is_empty()
        );
        reaper.join().unwrap();
        assert!(
            wait_gone(&member, Duration::from_secs(10)).await.is_empty(),
            "the child in the leader's group got the signal too"
        );
    }

    #[tokio::test]
    async fn a_reused_pid_is_never_signalled() {
        let child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        let real = process_ref(&child);
        // The same pid, but a process that started at another time: not this one.
        let stale = ProcessRef {
            pid: real.pid,
            start_ticks: real.start_ticks + 1,
        };
        assert!(!stale.is_running());
        assert!(!stale.signal(Signal::SIGKILL));
        assert!(
            stop_processes(
                &[stale],
                Duration::from_millis(50),
                Duration::from_millis(50)
            )
            .await
            .is_empty()
        );
        assert!(real.is_running(), "the live process was left alone");
        let reaper = reap(child);
        assert!(real.signal(Signal::SIGKILL));
        reaper.join().unwrap();
        assert!(!real.is_running());
    }
}
