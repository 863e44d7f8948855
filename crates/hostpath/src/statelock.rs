//! Who may use a state directory, decided by `flock`s taken before the plugin touches its state
//! or its socket and held until the process ends (the kernel drops them when the process dies,
//! however it dies). Every lock is non-blocking: a copy that is refused exits at once.
//!
//! - One copy per state directory (the default): an exclusive lock on `<statedir>/lock`
//!   (mode 0600). The holder writes its pid into the file, so a refused copy can name it.
//! - Several copies with `--shared`, one per node: each holds a *shared* lock on
//!   `<statedir>/lock` (which then says `shared` instead of a pid), so a copy without
//!   `--shared` is refused while any of them runs and the other way round, and an exclusive one
//!   on `<statedir>/lock.<nodeid>`, which holds its pid, so two copies never serve one node.
//!   The first shared copy of a directory holds `<statedir>/lock` exclusively until it has
//!   cleaned up (see [`StateLock::is_exclusive`]); one that starts meanwhile waits for it, for
//!   at most [`CLEANUP_WAIT`].

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Read as _, Seek as _, Write as _},
    os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use nix::{
    errno::Errno,
    fcntl::{Flock, FlockArg, OFlag},
};

/// Name of the lock file in the state directory.
pub const LOCK_FILE: &str = "lock";

/// What copies with `--shared` write into [`LOCK_FILE`] instead of a pid.
pub const SHARED_MARK: &str = "shared";

/// Exit code of `berth-hostpath` when another copy holds its state directory (or, with
/// `--shared`, its node).
pub const EXIT_STATEDIR_IN_USE: u8 = 73;

/// How long a copy with `--shared` waits for another one that holds the state directory alone
/// while it cleans up.
pub const CLEANUP_WAIT: Duration = Duration::from_secs(30);

/// How often a waiting copy tries again.
const RETRY_INTERVAL: Duration = Duration::from_millis(20);

/// The name of node `node_id`'s lock file in a shared state directory: `lock.<nodeid>`.
pub fn node_lock_file(node_id: &str) -> String {
    format!("{LOCK_FILE}.{node_id}")
}

/// Who holds what a refused copy wanted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// Another copy without `--shared`; this copy has no `--shared` either.
    Copy,
    /// A copy without `--shared`; this copy has `--shared`.
    UnsharedCopy,
    /// Copies with `--shared`; this copy has none.
    SharedCopies,
    /// Another copy with `--shared` and this node id.
    Node(String),
}

/// The state directory cannot be locked.
#[derive(Debug, thiserror::Error)]
pub enum StateLockError {
    /// Another process holds the lock: two copies of the plugin must never share a state
    /// directory, unless each has `--shared` and its own node id.
    #[error("{}", in_use_message(statedir, *holder, by))]
    InUse {
        /// The state directory.
        statedir: PathBuf,
        /// The pid the holder wrote into the lock file, if it could be read.
        holder: Option<u32>,
        /// Who holds it.
        by: Holder,
    },
    /// Opening, locking or writing the lock file failed.
    #[error("{action} the lock file {}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The lock file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

fn in_use_message(statedir: &Path, holder: Option<u32>, by: &Holder) -> String {
    let dir = statedir.display();
    let pid = holder.map_or_else(
        || "its pid is unknown".to_owned(),
        |pid| format!("pid {pid}"),
    );
    match by {
        Holder::Copy => format!(
            "the state directory {dir} is in use by another berth-hostpath ({pid}); two copies \
             must never share one --statedir"
        ),
        Holder::UnsharedCopy => format!(
            "the state directory {dir} is in use by a berth-hostpath without --shared ({pid}); \
             copies with --shared cannot use it while that copy runs"
        ),
        Holder::SharedCopies => format!(
            "the state directory {dir} is in use by berth-hostpath copies running with \
             --shared; a copy without --shared must never share one --statedir with them"
        ),
        Holder::Node(node) => format!(
            "node {node:?} of the shared state directory {dir} is in use by another \
             berth-hostpath ({pid}); every copy sharing one --statedir needs its own --nodeid"
        ),
    }
}

/// The held locks; dropping them releases them.
#[derive(Debug)]
pub struct StateLock {
    dir: Flock<File>,
    dir_path: PathBuf,
    /// With `--shared`: `lock.<nodeid>`.
    node: Option<Flock<File>>,
    exclusive: bool,
}

impl StateLock {
    /// Whether this copy holds the state directory alone for now: always without `--shared`;
    /// with it, only a copy that found no other running, until [`share`](Self::share). Only
    /// then may it remove leftovers of interrupted operations, which another copy could be in
    /// the middle of.
    pub fn is_exclusive(&self) -> bool {
        self.exclusive
    }

    /// With `--shared`: lets the other copies in (the lock on `<statedir>/lock` becomes a
    /// shared one). Does nothing without `--shared`, or when already shared.
    pub fn share(&mut self) -> Result<(), StateLockError> {
        if self.node.is_none() || !self.exclusive {
            return Ok(());
        }
        // Not atomic: a copy without --shared may take the lock in between.
        match self.dir.relock(FlockArg::LockSharedNonblock) {
            Ok(()) => {
                self.exclusive = false;
                Ok(())
            }
            Err(Errno::EWOULDBLOCK) => Err(StateLockError::InUse {
                statedir: self.statedir(),
                holder: read_pid(&mut self.dir),
                by: Holder::UnsharedCopy,
            }),
            Err(errno) => Err(io_error("locking", &self.dir_path)(errno.into())),
        }
    }

    fn statedir(&self) -> PathBuf {
        self.dir_path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default()
    }
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> StateLockError {
    let path = path.to_path_buf();
    move |source| StateLockError::Io {
        action,
        path,
        source,
    }
}

/// Opens (creating it, mode 0600) a lock file, never through a symlink.
fn open_lock_file(path: &Path) -> Result<File, StateLockError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(OFlag::O_NOFOLLOW.bits())
        .open(path)
        .map_err(io_error("opening", path))
}

/// Replaces the content of the held lock file `path` by `text`, mode 0600.
fn write_lock_file(file: &mut Flock<File>, path: &Path, text: &str) -> Result<(), StateLockError> {
    file.set_permissions(fs::Permissions::from_mode(0o600))
        .map_err(io_error("setting permissions of", path))?;
    file.set_len(0).map_err(io_error("writing", path))?;
    file.rewind().map_err(io_error("writing", path))?;
    writeln!(file, "{text}").map_err(io_error("writing", path))
}

/// Takes the lock of `statedir` (which must exist) without waiting, and writes this process's
/// pid into it. Fails with [`StateLockError::InUse`] at once if another process holds it, or
/// copies with `--shared` use the directory.
pub fn acquire(statedir: &Path) -> Result<StateLock, StateLockError> {
    let path = statedir.join(LOCK_FILE);
    let file = open_lock_file(&path)?;
    let mut file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(locked) => locked,
        Err((mut file, Errno::EWOULDBLOCK)) => {
            let (holder, by) = match read_text(&mut file).as_deref().map(str::trim) {
                Some(SHARED_MARK) => (None, Holder::SharedCopies),
                text => (text.and_then(parse_pid), Holder::Copy),
            };
            return Err(StateLockError::InUse {
                statedir: statedir.to_path_buf(),
                holder,
                by,
            });
        }
        Err((_, errno)) => return Err(io_error("locking", &path)(errno.into())),
    };
    write_lock_file(&mut file, &path, &std::process::id().to_string())?;
    Ok(StateLock {
        dir: file,
        dir_path: path,
        node: None,
        exclusive: true,
    })
}

/// `--shared`: takes `statedir`'s lock as one of several copies, and the lock of node
/// `node_id` (a valid file name segment), which holds this process's pid. Fails with
/// [`StateLockError::InUse`] at once if a copy without `--shared` runs, or another copy with
/// this node id; waits (at most [`CLEANUP_WAIT`]) while the first shared copy cleans up.
///
/// The directory lock is exclusive if no other copy runs (see
/// [`StateLock::is_exclusive`]); call [`StateLock::share`] once done with what needs it.
pub fn acquire_shared(statedir: &Path, node_id: &str) -> Result<StateLock, StateLockError> {
    let path = statedir.join(LOCK_FILE);
    let mut file = open_lock_file(&path)?;
    let deadline = Instant::now() + CLEANUP_WAIT;
    let (mut dir, exclusive) = loop {
        file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(locked) => break (locked, true),
            Err((file, Errno::EWOULDBLOCK)) => file,
            Err((_, errno)) => return Err(io_error("locking", &path)(errno.into())),
        };
        file = match Flock::lock(file, FlockArg::LockSharedNonblock) {
            Ok(locked) => break (locked, false),
            Err((file, Errno::EWOULDBLOCK)) => file,
            Err((_, errno)) => return Err(io_error("locking", &path)(errno.into())),
        };
        // Held exclusively: by a copy without --shared (its pid is in the file, or soon
        // will be), or by the first shared copy while it cleans up.
        let text = read_text(&mut file);
        if text.as_deref().map(str::trim) != Some(SHARED_MARK) || Instant::now() >= deadline {
            return Err(StateLockError::InUse {
                statedir: statedir.to_path_buf(),
                holder: text.as_deref().and_then(parse_pid),
                by: Holder::UnsharedCopy,
            });
        }
        std::thread::sleep(RETRY_INTERVAL);
    };
    if exclusive {
        write_lock_file(&mut dir, &path, SHARED_MARK)?;
    }

    let node_path = statedir.join(node_lock_file(node_id));
    let node_file = open_lock_file(&node_path)?;
    let mut node = match Flock::lock(node_file, FlockArg::LockExclusiveNonblock) {
        Ok(locked) => locked,
        Err((mut file, Errno::EWOULDBLOCK)) => {
            return Err(StateLockError::InUse {
                statedir: statedir.to_path_buf(),
                holder: read_pid(&mut file),
                by: Holder::Node(node_id.to_owned()),
            });
        }
        Err((_, errno)) => return Err(io_error("locking", &node_path)(errno.into())),
    };
    write_lock_file(&mut node, &node_path, &std::process::id().to_string())?;
    Ok(StateLock {
        dir,
        dir_path: path,
        node: Some(node),
        exclusive,
    })
}

/// The content of a lock file, if it can be read.
fn read_text(file: &mut File) -> Option<String> {
    let mut text = String::new();
    file.rewind().ok()?;
    file.read_to_string(&mut text).ok()?;
    Some(text)
}

fn parse_pid(text: &str) -> Option<u32> {
    text.trim().parse().ok().filter(|&pid| pid > 0)
}

/// The pid written in the lock file, if there is a valid one.
fn read_pid(file: &mut File) -> Option<u32> {
    read_text(file).as_deref().and_then(parse_pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_at_once_and_names_the_holder() {
        let dir = tempfile::tempdir().expect("tempdir");
        let held = acquire(dir.path()).expect("first");
        let path = dir.path().join(LOCK_FILE);
        let text = fs::read_to_string(&path).expect("lock file");
        assert_eq!(text, format!("{}\n", std::process::id()));
        let mode = fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);

        // flock locks belong to the open file: a second open conflicts even in one process.
        let err = acquire(dir.path()).unwrap_err();
        let StateLockError::InUse {
            statedir,
            holder,
            by,
        } = &err
        else {
            panic!("{err:?}");
        };
        assert_eq!(statedir, dir.path());
        assert_eq!(*holder, Some(std::process::id()));
        assert_eq!(*by, Holder::Copy);
        let text = err.to_string();
        assert!(
            text.contains(&dir.path().display().to_string())
                && text.contains(&format!("pid {}", std::process::id())),
            "{text}"
        );

        drop(held);
        let _again = acquire(dir.path()).expect("free once released");
    }

    #[test]
    fn a_symlink_in_place_of_the_lock_file_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let elsewhere = dir.path().join("elsewhere");
        fs::write(&elsewhere, b"").expect("write");
        std::os::unix::fs::symlink(&elsewhere, dir.path().join(LOCK_FILE)).expect("symlink");
        let err = acquire(dir.path()).unwrap_err();
        assert!(matches!(err, StateLockError::Io { .. }), "{err:?}");
        assert_eq!(fs::read(&elsewhere).expect("read"), b"", "left alone");
        let err = acquire_shared(dir.path(), "n1").unwrap_err();
        assert!(matches!(err, StateLockError::Io { .. }), "{err:?}");
        assert_eq!(fs::read(&elsewhere).expect("read"), b"", "left alone");
    }

    fn in_use_by(result: Result<StateLock, StateLockError>) -> (Option<u32>, Holder, String) {
        match result {
            Err(err @ StateLockError::InUse { .. }) => {
                let text = err.to_string();
                let StateLockError::InUse { holder, by, .. } = err else {
                    unreachable!()
                };
                (holder, by, text)
            }
            other => panic!("expected InUse, got {other:?}"),
        }
    }

    #[test]
    fn shared_copies_exclude_one_node_twice_and_unshared_copies() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut a = acquire_shared(dir.path(), "a").expect("first shared copy");
        assert!(a.is_exclusive(), "alone");
        assert_eq!(
            fs::read_to_string(dir.path().join(LOCK_FILE)).expect("lock"),
            format!("{SHARED_MARK}\n")
        );
        assert_eq!(
            fs::read_to_string(dir.path().join("lock.a")).expect("node lock"),
            format!("{}\n", std::process::id())
        );
        // While it is alone, a copy without --shared is refused.
        let (holder, by, text) = in_use_by(acquire(dir.path()));
        assert_eq!((holder, by), (None, Holder::SharedCopies));
        assert!(text.contains("--shared"), "{text}");

        a.share().expect("share");
        assert!(!a.is_exclusive());
        let b = acquire_shared(dir.path(), "b").expect("second shared copy");
        assert!(!b.is_exclusive(), "a runs");

        let (holder, by, text) = in_use_by(acquire_shared(dir.path(), "b"));
        assert_eq!(holder, Some(std::process::id()));
        assert_eq!(by, Holder::Node("b".to_owned()));
        assert!(
            text.contains("\"b\"") && text.contains("--nodeid"),
            "{text}"
        );

        let (_, by, _) = in_use_by(acquire(dir.path()));
        assert_eq!(by, Holder::SharedCopies);

        drop(a);
        drop(b);
        let unshared = acquire(dir.path()).expect("free once the shared copies are gone");
        let (holder, by, text) = in_use_by(acquire_shared(dir.path(), "a"));
        assert_eq!(holder, Some(std::process::id()));
        assert_eq!(by, Holder::UnsharedCopy);
        assert!(text.contains("without --shared"), "{text}");
        drop(unshared);
        let again = acquire_shared(dir.path(), "a").expect("free again");
        assert!(again.is_exclusive());
    }

    #[test]
    fn a_shared_copy_waits_while_the_first_one_holds_the_directory_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut first = acquire_shared(dir.path(), "a").expect("first");
        assert!(first.is_exclusive());
        let path = dir.path().to_path_buf();
        let second = std::thread::spawn(move || acquire_shared(&path, "b"));
        first.share().expect("share");
        let second = second.join().expect("thread").expect("second copy gets in");
        assert!(!second.is_exclusive());
    }
}
