//! One plugin per state directory: an exclusive, non-blocking `flock` on `<statedir>/lock`
//! (mode 0600), taken before the plugin touches its state or its socket and held until the
//! process ends (the kernel drops it when the process dies, however it dies). The holder writes
//! its pid into the file, so a refused copy can name it.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Read as _, Seek as _, Write as _},
    os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

use nix::{
    errno::Errno,
    fcntl::{Flock, FlockArg, OFlag},
};

/// Name of the lock file in the state directory.
pub const LOCK_FILE: &str = "lock";

/// Exit code of `berth-hostpath` when another copy holds its state directory.
pub const EXIT_STATEDIR_IN_USE: u8 = 73;

/// The state directory cannot be locked.
#[derive(Debug, thiserror::Error)]
pub enum StateLockError {
    /// Another process holds the lock: two copies of the plugin must never share a state
    /// directory.
    #[error(
        "the state directory {} is in use by another berth-hostpath ({}); two copies must never \
         share one --statedir",
        statedir.display(),
        holder.map_or_else(|| "its pid is unknown".to_owned(), |pid| format!("pid {pid}"))
    )]
    InUse {
        /// The state directory.
        statedir: PathBuf,
        /// The pid the holder wrote into the lock file, if it could be read.
        holder: Option<u32>,
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

/// The held lock; dropping it releases it.
#[derive(Debug)]
pub struct StateLock {
    _file: Flock<File>,
}

/// Takes the lock of `statedir` (which must exist) without waiting, and writes this process's
/// pid into it. Fails with [`StateLockError::InUse`] at once if another process holds it.
pub fn acquire(statedir: &Path) -> Result<StateLock, StateLockError> {
    let path = statedir.join(LOCK_FILE);
    let io_err = |action| {
        let path = path.clone();
        move |source| StateLockError::Io {
            action,
            path,
            source,
        }
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(OFlag::O_NOFOLLOW.bits())
        .open(&path)
        .map_err(io_err("opening"))?;
    let mut file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(locked) => locked,
        Err((mut file, Errno::EWOULDBLOCK)) => {
            return Err(StateLockError::InUse {
                statedir: statedir.to_path_buf(),
                holder: read_pid(&mut file),
            });
        }
        Err((_, errno)) => return Err(io_err("locking")(errno.into())),
    };
    file.set_permissions(fs::Permissions::from_mode(0o600))
        .map_err(io_err("setting permissions of"))?;
    file.set_len(0).map_err(io_err("writing"))?;
    file.rewind().map_err(io_err("writing"))?;
    writeln!(file, "{}", std::process::id()).map_err(io_err("writing"))?;
    Ok(StateLock { _file: file })
}

/// The pid written in the lock file, if there is a valid one.
fn read_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok().filter(|&pid| pid > 0)
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
        let StateLockError::InUse { statedir, holder } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(statedir, dir.path());
        assert_eq!(*holder, Some(std::process::id()));
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
    }
}
