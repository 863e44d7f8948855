//! Where a rotated stream lives on disk: its numbered files (`<base>.0`, `<base>.1`…, Nomad's
//! names), the FIFO its collector reads (`.<name>.fifo`) and the lock file a live collector
//! holds (`.<name>.lock`), all in the base's directory.

use std::{
    ffi::OsString,
    fs::{File, OpenOptions},
    io,
    os::fd::AsFd,
    path::{Path, PathBuf},
};

use nix::{
    fcntl::{FcntlArg, fcntl},
    libc,
};

/// `<dir>/.<name><suffix>` for base `<dir>/<name>`.
fn hidden(base: &Path, suffix: &str) -> PathBuf {
    let mut name = OsString::from(".");
    name.push(base.file_name().unwrap_or_default());
    name.push(suffix);
    base.with_file_name(name)
}

/// The FIFO the task writes the stream into and its collector reads.
pub fn fifo_path(base: &Path) -> PathBuf {
    hidden(base, ".fifo")
}

/// The lock file the stream's live collector holds a write lock on.
pub fn lock_path(base: &Path) -> PathBuf {
    hidden(base, ".lock")
}

/// The path of file `index` of the stream.
pub fn rotated_path(base: &Path, index: u64) -> PathBuf {
    let mut name = base.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{index}"));
    base.with_file_name(name)
}

/// The stream's files, oldest (lowest index) first: every `<base>.<n>` with `n` in decimal
/// digits only. A missing directory has none.
pub fn rotated_files(base: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let Some(dir) = base.parent() else {
        return Ok(Vec::new());
    };
    let Some(prefix) = base.file_name().and_then(|n| n.to_str()) else {
        return Ok(Vec::new());
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some(index) = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix))
            .and_then(|n| n.strip_prefix('.'))
            .filter(|n| !n.is_empty() && n.len() <= 19 && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        out.push((index, entry.path()));
    }
    out.sort_unstable_by_key(|(i, _)| *i);
    Ok(out)
}

/// A whole-file write lock, as `fcntl(F_SETLK)` and `F_GETLK` take it.
fn whole_file(kind: libc::c_int) -> libc::flock {
    libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    }
}

/// Takes the collector's write lock on `file` without waiting; `Ok(false)` when another
/// process holds it. A POSIX record lock: it goes with the process (released when it exits,
/// never inherited), and [`holder`] tells who holds it.
pub(crate) fn try_lock(file: &File) -> io::Result<bool> {
    let lock = whole_file(libc::F_WRLCK);
    match fcntl(file.as_fd(), FcntlArg::F_SETLK(&lock)) {
        Ok(_) => Ok(true),
        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The pid of the process holding the collector's lock of the stream at `base`; `None` when
/// no collector runs (or none ever ran). Takes no lock itself.
pub fn collector_pid(base: &Path) -> io::Result<Option<u32>> {
    let file = match OpenOptions::new().read(true).open(lock_path(base)) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    holder(&file)
}

/// Who holds the write lock of `file` (`F_GETLK`).
pub(crate) fn holder(file: &File) -> io::Result<Option<u32>> {
    let mut probe = whole_file(libc::F_WRLCK);
    fcntl(file.as_fd(), FcntlArg::F_GETLK(&mut probe))?;
    if probe.l_type == libc::F_UNLCK as libc::c_short {
        return Ok(None);
    }
    Ok(u32::try_from(probe.l_pid).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_nomad() {
        let base = Path::new("/a/logs/web.stdout");
        assert_eq!(fifo_path(base), Path::new("/a/logs/.web.stdout.fifo"));
        assert_eq!(lock_path(base), Path::new("/a/logs/.web.stdout.lock"));
        assert_eq!(rotated_path(base, 7), Path::new("/a/logs/web.stdout.7"));
    }

    #[test]
    fn only_numbered_files_of_the_stream_count() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "web.stdout.0",
            "web.stdout.10",
            "web.stdout.2",
            "web.stdout.x",
            "web.stdout.",
            "web.stdout.+1",
            "web.stdout.1.tmp",
            "web.stderr.3",
            "webx.stdout.4",
            ".web.stdout.fifo",
        ] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        let found: Vec<u64> = rotated_files(&dir.path().join("web.stdout"))
            .unwrap()
            .into_iter()
            .map(|(i, _)| i)
            .collect();
        assert_eq!(found, [0, 2, 10]);
        assert!(
            rotated_files(&dir.path().join("missing/web.stdout"))
                .unwrap()
                .is_empty()
        );
    }
}
