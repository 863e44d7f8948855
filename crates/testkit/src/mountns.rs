//! A private mount namespace that outlives the processes run in it.

use std::{
    fs,
    io::{self, Read as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use berth_sys::MountEntry;

use crate::POLL_INTERVAL;

/// How long [`MountNamespace::new`] waits for the namespace to be set up.
pub const NAMESPACE_TIMEOUT: Duration = Duration::from_secs(10);

/// A private mount namespace held open by a holder process (`cat` reading a pipe that is never
/// written), so that mounts made in it survive the processes that made them: a test can
/// `kill -9` a process that mounted something, start another in the same namespace, and find the
/// mounts still there. Mounts made in it never show in the test's own namespace (propagation is
/// private).
///
/// The holder is started as `setpriv --pdeathsig KILL -- unshare -m --propagation private --
/// cat`, so it dies with the thread that created the namespace. Dropping the handle kills and
/// reaps the holder; the namespace and its mounts go away once no process runs in it any more
/// (processes started with [`command`](Self::command) keep it alive until they exit).
///
/// Needs root and util-linux's `unshare`, `nsenter` and `setpriv`.
#[derive(Debug)]
pub struct MountNamespace {
    holder: Child,
}

impl MountNamespace {
    /// Starts the holder and waits (at most [`NAMESPACE_TIMEOUT`]) until the namespace is set up:
    /// the holder is in a mount namespace other than this process's and `unshare` has made its
    /// mounts private and executed `cat`.
    pub fn new() -> io::Result<Self> {
        let mut cmd = crate::private_ns_command(Path::new("cat"));
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut ns = Self {
            holder: cmd.spawn()?,
        };
        let own = fs::read_link("/proc/self/ns/mnt")?;
        let deadline = Instant::now() + NAMESPACE_TIMEOUT;
        loop {
            if let Some(status) = ns.holder.try_wait()? {
                let mut stderr = String::new();
                if let Some(mut pipe) = ns.holder.stderr.take() {
                    let _ = pipe.read_to_string(&mut stderr);
                }
                return Err(io::Error::other(format!(
                    "the mount namespace holder exited ({status}): {}",
                    stderr.trim()
                )));
            }
            if ns.is_ready(&own) {
                return Ok(ns);
            }
            if Instant::now() >= deadline {
                // Drop kills and reaps the holder.
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the mount namespace holder (pid {}) did not set up its namespace \
                         within {NAMESPACE_TIMEOUT:?}",
                        ns.pid()
                    ),
                ));
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// Whether the holder is in its own namespace and past `unshare` (which executes `cat` only
    /// once the propagation is private). Errors mean it is not there yet.
    fn is_ready(&self, own: &Path) -> bool {
        let proc = self.proc_dir();
        let other_ns = fs::read_link(proc.join("ns/mnt")).is_ok_and(|ns| ns != own);
        other_ns && fs::read_to_string(proc.join("comm")).is_ok_and(|comm| comm.trim() == "cat")
    }

    fn proc_dir(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}", self.pid()))
    }

    /// Process id of the holder.
    pub fn pid(&self) -> u32 {
        self.holder.id()
    }

    /// The namespace's identity, e.g. `mnt:[4026532745]` (the link `/proc/<pid>/ns/mnt`).
    pub fn id(&self) -> io::Result<PathBuf> {
        fs::read_link(self.proc_dir().join("ns/mnt"))
    }

    /// A command that runs `program` inside the namespace:
    /// `setpriv --pdeathsig KILL -- nsenter --target <pid> --mount -- <program>`. `nsenter`
    /// executes `program` (no fork), so the child's pid is `program`'s, and it is killed when
    /// the thread that spawned it dies.
    pub fn command(&self, program: impl AsRef<Path>) -> Command {
        let mut cmd = Command::new("setpriv");
        cmd.args(["--pdeathsig", "KILL", "--", "nsenter", "--target"])
            .arg(self.pid().to_string())
            .args(["--mount", "--"])
            .arg(program.as_ref());
        cmd
    }

    /// `path` as seen inside the namespace, reachable from outside: `/proc/<pid>/root/<path>`.
    pub fn in_ns(&self, path: impl AsRef<Path>) -> PathBuf {
        let path = path.as_ref();
        self.proc_dir()
            .join("root")
            .join(path.strip_prefix("/").unwrap_or(path))
    }

    /// The namespace's mount table, read from `/proc/<holder pid>/mountinfo`.
    pub fn mountinfo(&self) -> io::Result<Vec<MountEntry>> {
        let data = fs::read(self.proc_dir().join("mountinfo"))?;
        berth_sys::parse_mountinfo(&data).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// The top-most mount at `path` in the namespace, if any.
    ///
    /// # Panics
    /// If the mount table cannot be read.
    pub fn mount_at(&self, path: impl AsRef<Path>) -> Option<MountEntry> {
        let mounts = self
            .mountinfo()
            .unwrap_or_else(|e| panic!("mount table of namespace holder {}: {e}", self.pid()));
        berth_sys::top_mount_at(&mounts, path.as_ref()).cloned()
    }
}

impl Drop for MountNamespace {
    fn drop(&mut self) {
        // An error means it has already exited; wait() reaps it either way.
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

#[cfg(test)]
mod tests {
    use std::process::ExitStatus;

    use super::*;

    fn own_mount_at(path: &Path) -> Option<MountEntry> {
        let mounts = berth_sys::read_mountinfo(Path::new("/proc/self/mountinfo")).expect("own");
        berth_sys::top_mount_at(&mounts, path).cloned()
    }

    fn run(mut cmd: Command) -> ExitStatus {
        cmd.stdin(Stdio::null()).status().expect("runs")
    }

    /// Pids of the processes in the mount namespace `id`.
    fn processes_in(id: &Path) -> Vec<String> {
        fs::read_dir("/proc")
            .expect("/proc")
            .filter_map(Result::ok)
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .bytes()
                    .all(|b| b.is_ascii_digit())
            })
            .filter(|e| fs::read_link(e.path().join("ns/mnt")).is_ok_and(|ns| ns == id))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn mounts_outlive_the_process_that_made_them_and_go_with_the_namespace() {
        let ns = MountNamespace::new().expect("namespace");
        let id = ns.id().expect("namespace id");
        assert_ne!(
            id,
            fs::read_link("/proc/self/ns/mnt").expect("own namespace")
        );
        let dir = tempfile::tempdir().expect("tempdir");

        let mut mount = ns.command("mount");
        mount
            .args(["-t", "tmpfs", "berth-testkit-ns"])
            .arg(dir.path());
        assert!(run(mount).success());

        let entry = ns.mount_at(dir.path()).expect("the tmpfs outlives `mount`");
        assert_eq!(entry.fs_type, "tmpfs");
        assert_eq!(entry.source, "berth-testkit-ns");
        assert!(
            ns.mountinfo()
                .expect("mountinfo")
                .iter()
                .any(|e| e.mount_point == dir.path())
        );
        assert_eq!(own_mount_at(dir.path()), None, "the mount stays private");
        let mut check = ns.command("mountpoint");
        check.arg("-q").arg(dir.path());
        assert!(run(check).success(), "a later process sees it too");

        drop(ns);
        assert_eq!(processes_in(&id), Vec::<String>::new(), "namespace is gone");
        assert_eq!(own_mount_at(dir.path()), None);
        dir.close().expect("the directory is not busy");
    }

    #[test]
    fn a_killed_process_leaves_its_mounts_for_the_next_one() {
        let ns = MountNamespace::new().expect("namespace");
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cmd = ns.command("sh");
        cmd.arg("-c")
            .arg(format!(
                "mount -t tmpfs berth-testkit-kill '{}' && exec cat",
                dir.path().display()
            ))
            .stdin(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn");
        let deadline = Instant::now() + Duration::from_secs(10);
        while ns.mount_at(dir.path()).is_none() {
            assert!(Instant::now() < deadline, "the tmpfs did not appear");
            assert!(child.try_wait().expect("try_wait").is_none(), "sh exited");
            std::thread::sleep(POLL_INTERVAL);
        }
        child.kill().expect("kill -9");
        child.wait().expect("reap");

        assert_eq!(
            ns.mount_at(dir.path()).map(|e| e.source),
            Some("berth-testkit-kill".to_owned())
        );
        let mut findmnt = ns.command("findmnt");
        findmnt
            .args(["-n", "-o", "SOURCE", "--mountpoint"])
            .arg(dir.path());
        let out = findmnt.stdin(Stdio::null()).output().expect("findmnt");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "berth-testkit-kill"
        );
        assert_eq!(own_mount_at(dir.path()), None);
    }
}
