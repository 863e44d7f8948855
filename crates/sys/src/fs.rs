//! Crash-safe file writes and filesystem statistics.

use std::{
    fmt,
    fs::{self, File, OpenOptions},
    io::{self, Write as _},
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

use nix::sys::statvfs::statvfs;

/// A step of [`write_atomic`], named in its errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteStep {
    /// Creating the temporary file next to the target.
    CreateTemp,
    /// Writing the bytes.
    Write,
    /// Flushing the file to disk.
    SyncFile,
    /// Renaming the temporary file over the target.
    Rename,
    /// Flushing the directory entry to disk.
    SyncDir,
}

impl fmt::Display for WriteStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::CreateTemp => "creating the temporary file",
            Self::Write => "writing",
            Self::SyncFile => "syncing the file",
            Self::Rename => "renaming the temporary file into place",
            Self::SyncDir => "syncing the directory",
        })
    }
}

/// [`write_atomic`] failed at `step`; the target keeps its old content unless the step came
/// after the rename ([`WriteStep::SyncDir`]: then the new content is in place but may not survive
/// a crash; see [`AtomicWriteError::content_replaced`]).
#[derive(Debug, thiserror::Error)]
#[error(
    "writing {} atomically failed at step {step}{}",
    path.display(),
    if self.content_replaced() { " (the new content is in place)" } else { "" }
)]
pub struct AtomicWriteError {
    /// The file that was being written.
    pub path: PathBuf,
    /// The step that failed.
    pub step: WriteStep,
    /// The underlying error.
    #[source]
    pub source: io::Error,
}

impl AtomicWriteError {
    /// Whether the new content already replaced the old one when the write failed (the failure
    /// came after the rename): readers now see the new content, though it may not survive a
    /// crash.
    pub fn content_replaced(&self) -> bool {
        self.step == WriteStep::SyncDir
    }
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Replaces the content of `path` with `bytes` so that after a crash the file holds either the
/// old or the new content, never a mix: writes a temporary file in the same directory (mode
/// 0600), syncs it, renames it over `path`, then syncs the directory. The directory must exist.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), AtomicWriteError> {
    let err = |step| {
        move |source| AtomicWriteError {
            path: path.to_path_buf(),
            step,
            source,
        }
    };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))
        .map_err(err(WriteStep::CreateTemp))?;
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(format!(
        ".tmp-{}-{}",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let temp = dir.join(temp_name);

    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temp)
        .map_err(err(WriteStep::CreateTemp))?;
    let written = (|| {
        file.write_all(bytes).map_err(err(WriteStep::Write))?;
        file.sync_all().map_err(err(WriteStep::SyncFile))?;
        drop(file);
        fs::rename(&temp, path).map_err(err(WriteStep::Rename))
    })();
    if let Err(e) = written {
        // Best effort: the temporary file is garbage either way.
        let _ = fs::remove_file(&temp);
        return Err(e);
    }
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(err(WriteStep::SyncDir))
}

/// Size and inode counts of a filesystem, as `statvfs(3)` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStats {
    /// Size of the filesystem in bytes.
    pub total_bytes: u64,
    /// Bytes an unprivileged user may still allocate.
    pub available_bytes: u64,
    /// Total number of inodes.
    pub total_inodes: u64,
    /// Free inodes.
    pub free_inodes: u64,
    /// Inodes an unprivileged user may still allocate.
    pub available_inodes: u64,
}

/// `statvfs` on a path failed.
#[derive(Debug, thiserror::Error)]
#[error("reading filesystem statistics of {}", path.display())]
pub struct FsStatsError {
    /// The path that was asked about.
    pub path: PathBuf,
    /// The underlying error.
    #[source]
    pub source: io::Error,
}

/// Statistics of the filesystem that holds `path`.
// The statvfs field types are narrower than u64 on some targets.
#[allow(clippy::useless_conversion)]
pub fn fs_stats(path: &Path) -> Result<FsStats, FsStatsError> {
    let st = statvfs(path).map_err(|errno| FsStatsError {
        path: path.to_path_buf(),
        source: errno.into(),
    })?;
    let frag = u64::from(st.fragment_size());
    Ok(FsStats {
        total_bytes: u64::from(st.blocks()).saturating_mul(frag),
        available_bytes: u64::from(st.blocks_available()).saturating_mul(frag),
        total_inodes: u64::from(st.files()),
        free_inodes: u64::from(st.files_free()),
        available_inodes: u64::from(st.files_available()),
    })
}

/// This machine's host name.
pub fn hostname() -> io::Result<String> {
    let name = nix::unistd::gethostname()?;
    name.into_string()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "host name is not UTF-8"))
}

/// Creates `dir` and any missing parents with mode 0700, and makes `dir` itself 0700 if it
/// already existed with wider permissions.
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    create_dir_with_mode(dir, 0o700)
}

/// Creates `dir` and every missing parent with `mode` (whatever the umask), and gives `dir`
/// itself exactly `mode` if it already existed. Refuses (`NotADirectory`) when something other
/// than a directory is at `dir` (a symlink to a directory counts as one).
pub fn create_dir_with_mode(dir: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{} exists and is not a directory", dir.display()),
            ));
        }
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty())
                && !parent.exists()
            {
                create_dir_with_mode(parent, mode)?;
            }
            match std::fs::DirBuilder::new().mode(mode).create(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => {}
                Err(e) => return Err(e),
            }
        }
        Err(e) => return Err(e),
    }
    let meta = std::fs::metadata(dir)?;
    if meta.permissions().mode() & 0o7777 != mode {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// What [`remove_empty_unmounted`] did with a path.
#[derive(Debug)]
pub enum Removal {
    /// It was removed, or was not there.
    Gone,
    /// Something of this mount namespace is mounted on it: it stays, with its mount.
    Mounted,
    /// It stays: it is not an empty directory or an empty file, or removing it failed.
    Kept(io::Error),
}

/// Removes `path` when it is an empty directory or an empty regular file and nothing of the
/// caller's mount namespace is mounted on it. No mount table is read: the kernel refuses to
/// remove a mount point of the caller's namespace (EBUSY). A mount of another namespace on
/// it is no protection (the kernel detaches such mounts): a caller that must respect those
/// has to look at that namespace's table first.
pub fn remove_empty_unmounted(path: &Path) -> Removal {
    let removed = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
        Ok(m) if m.is_dir() => std::fs::remove_dir(path),
        Ok(m) if m.is_file() && m.len() == 0 => std::fs::remove_file(path),
        Ok(_) => Err(io::Error::other("not an empty file or directory")),
    };
    match removed {
        Ok(()) => Removal::Gone,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Removal::Gone,
        Err(e) if e.kind() == io::ErrorKind::ResourceBusy => Removal::Mounted,
        Err(e) => Removal::Kept(e),
    }
}

/// Writes `bytes` as `dir/name` with exactly `mode`, where `dir` is a path relative to `root`
/// that must resolve beneath it without a symlink or `..` in it (a missing last component of
/// `dir` is made, 0700, never through a symlink): a file a task could tamper
/// with (its own directory) cannot send the write elsewhere on the host. The file is written
/// under a temporary name and renamed into place, so a symlink already at `name` is replaced,
/// never followed, and a reader never sees half a file. Not synced: for files rewritten at
/// every start (secrets on a tmpfs).
pub fn write_file_beneath(
    root: &Path,
    dir: &Path,
    name: &str,
    bytes: &[u8],
    mode: u32,
) -> io::Result<()> {
    use std::os::fd::{AsFd as _, OwnedFd};

    use nix::{
        fcntl::{OFlag, OpenHow, ResolveFlag, openat, openat2, renameat},
        sys::stat::{Mode, fchmod},
    };
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a file name"),
        ));
    }
    // A directory beneath `root`, reached without a symlink or `..`.
    let beneath = |root: &File, path: &Path| {
        openat2(
            root.as_fd(),
            path,
            OpenHow::new()
                .flags(OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC)
                .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS),
        )
    };
    let root_fd = File::open(root)?;
    if let Some(parent) = dir.parent() {
        let parent_fd = if parent.as_os_str().is_empty() {
            None
        } else {
            Some(beneath(&root_fd, parent)?)
        };
        if let Some(last) = dir.file_name() {
            let at = parent_fd.as_ref().map_or(root_fd.as_fd(), |f| f.as_fd());
            match nix::sys::stat::mkdirat(at, last, Mode::from_bits_truncate(0o700)) {
                Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    let dir_fd: OwnedFd = beneath(&root_fd, dir).map_err(|e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!(
                "{} is not a directory beneath {} reached without a symlink ({e})",
                dir.display(),
                root.display()
            ),
        )
    })?;
    let tmp = format!(".{name}.tmp-{}", std::process::id());
    let fd = openat(
        dir_fd.as_fd(),
        tmp.as_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )?;
    let written = (|| {
        let mut f = File::from(fd);
        f.write_all(bytes)?;
        fchmod(f.as_fd(), Mode::from_bits_truncate(mode))?;
        renameat(dir_fd.as_fd(), tmp.as_str(), dir_fd.as_fd(), name)?;
        Ok::<(), io::Error>(())
    })();
    if written.is_err() {
        let _ = nix::unistd::unlinkat(
            dir_fd.as_fd(),
            tmp.as_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
    }
    written
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).expect("stat").permissions().mode() & 0o7777
    }

    #[test]
    fn create_dir_with_mode_sets_every_created_dir_and_the_leaf() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o711)).expect("chmod");
        let leaf = dir.path().join("a/b/c");
        create_dir_with_mode(&leaf, 0o750).expect("create");
        for p in ["a", "a/b", "a/b/c"] {
            assert_eq!(mode(&dir.path().join(p)), 0o750, "{p}");
        }
        assert_eq!(mode(dir.path()), 0o711, "an existing parent is left alone");
        fs::set_permissions(&leaf, fs::Permissions::from_mode(0o777)).expect("chmod");
        create_dir_with_mode(&leaf, 0o750).expect("again");
        assert_eq!(mode(&leaf), 0o750, "an existing leaf gets the mode");
        let file = dir.path().join("f");
        fs::write(&file, b"x").expect("file");
        let err = create_dir_with_mode(&file, 0o750).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotADirectory);
        let err = create_dir_with_mode(&file.join("below"), 0o750).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotADirectory, "{err}");
    }

    #[test]
    fn write_atomic_replaces_content_and_leaves_no_temp() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.json");
        write_atomic(&path, b"first").expect("first write");
        write_atomic(&path, b"second").expect("second write");
        assert_eq!(fs::read(&path).expect("read"), b"second");
        let names: Vec<_> = fs::read_dir(dir.path())
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("state.json")]);
        let mode = fs::metadata(&path).expect("metadata").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn write_atomic_names_path_and_step() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("missing-dir").join("f");
        let err = write_atomic(&path, b"x").unwrap_err();
        assert_eq!(err.step, WriteStep::CreateTemp);
        assert!(!err.content_replaced());
        assert_eq!(err.path, path);
        assert!(
            err.to_string()
                .ends_with("missing-dir/f atomically failed at step creating the temporary file"),
            "{err}"
        );
        let after_rename = AtomicWriteError {
            path: path.clone(),
            step: WriteStep::SyncDir,
            source: io::Error::from(io::ErrorKind::Other),
        };
        assert!(after_rename.content_replaced());
        assert!(
            after_rename
                .to_string()
                .ends_with("failed at step syncing the directory (the new content is in place)"),
            "{after_rename}"
        );
    }

    #[test]
    fn write_atomic_failed_rename_keeps_old_content() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("target");
        fs::create_dir(&path).expect("mkdir");
        fs::write(path.join("inside"), b"x").expect("write");
        let err = write_atomic(&path, b"new").unwrap_err();
        assert_eq!(err.step, WriteStep::Rename);
        assert!(!err.content_replaced());
        assert_eq!(fs::read_dir(dir.path()).expect("read_dir").count(), 1);
    }

    #[test]
    fn fs_stats_reports_a_filesystem() {
        let dir = tempfile::tempdir().expect("tempdir");
        let st = fs_stats(dir.path()).expect("statvfs");
        assert!(st.total_bytes > 0);
        assert!(st.available_bytes <= st.total_bytes);
        let err = fs_stats(&dir.path().join("nope")).unwrap_err();
        assert_eq!(err.source.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn write_file_beneath_writes_with_the_mode_and_never_follows_a_symlink() {
        use std::os::unix::fs::{PermissionsExt as _, symlink};
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("task");
        let outside = tmp.path().join("outside");
        fs::create_dir_all(root.join("secrets")).unwrap();
        fs::create_dir_all(&outside).unwrap();

        write_file_beneath(&root, Path::new("secrets"), "token", b"abc", 0o440).unwrap();
        let file = root.join("secrets/token");
        assert_eq!(fs::read(&file).unwrap(), b"abc");
        assert_eq!(
            fs::metadata(&file).unwrap().permissions().mode() & 0o7777,
            0o440
        );
        // A second write replaces a read-only file.
        write_file_beneath(&root, Path::new("secrets"), "token", b"de", 0o440).unwrap();
        assert_eq!(fs::read(&file).unwrap(), b"de");

        // A symlink at the file's name is replaced, not followed.
        fs::remove_file(&file).unwrap();
        symlink(outside.join("victim"), &file).unwrap();
        write_file_beneath(&root, Path::new("secrets"), "token", b"x", 0o440).unwrap();
        assert!(!outside.join("victim").exists());
        assert!(fs::symlink_metadata(&file).unwrap().is_file());

        // A directory swapped for a symlink, or a path out of the root, is refused.
        fs::remove_dir_all(root.join("secrets")).unwrap();
        symlink(&outside, root.join("secrets")).unwrap();
        let err =
            write_file_beneath(&root, Path::new("secrets"), "token", b"x", 0o440).unwrap_err();
        assert!(err.to_string().contains("without a symlink"), "{err}");
        assert!(write_file_beneath(&root, Path::new("../outside"), "t", b"x", 0o440).is_err());
        assert!(write_file_beneath(&root, Path::new("/tmp"), "t", b"x", 0o440).is_err());
        assert_eq!(
            fs::read_dir(&outside).unwrap().count(),
            0,
            "nothing written outside"
        );
        assert!(write_file_beneath(&root, Path::new("."), "../x", b"x", 0o440).is_err());

        // A missing directory is made, private.
        write_file_beneath(&root, Path::new("fresh"), "t", b"x", 0o440).unwrap();
        let mode = fs::metadata(root.join("fresh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
    }
}
