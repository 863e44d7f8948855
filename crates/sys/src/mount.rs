//! Bind mounts and the mount table, behind the [`Mounter`] trait.
//!
//! [`LinuxMounter`] makes the real syscalls; [`RecordingMounter`] records every call and keeps an
//! in-memory mount table, so code above it can be unit-tested without root.

use std::{
    collections::HashMap,
    fmt,
    os::unix::ffi::OsStringExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Mutex, MutexGuard},
};

use nix::{
    errno::Errno,
    mount::{MntFlags, MsFlags, mount, umount2},
};

use crate::mountinfo::{MountinfoError, read_mountinfo};

/// One line of a mountinfo file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Unique id of the mount.
    pub mount_id: u32,
    /// Id of the mount this one is mounted on.
    pub parent_id: u32,
    /// Path, inside the source filesystem, of the directory mounted here (a bind mount of
    /// `/data/v1` shows `/data/v1` if `/data` is on the same filesystem as `/`).
    pub root: PathBuf,
    /// Where it is mounted, relative to the reading process's root.
    pub mount_point: PathBuf,
    /// Whether the mount itself (not only the filesystem) is read-only.
    pub read_only: bool,
    /// Whether the mount is in a peer group (`shared:N`): mounts and unmounts under it
    /// propagate to its peers, and from them.
    pub shared: bool,
    /// Filesystem type, e.g. `ext4`.
    pub fs_type: String,
    /// Mount source, e.g. `/dev/sda1` or `tmpfs`.
    pub source: String,
    /// Options of the filesystem itself (its superblock), comma-separated as the kernel lists
    /// them, e.g. `rw,errors=remount-ro`; a cgroup v1 mount names its controllers here
    /// (`rw,devices`).
    pub super_options: String,
}

/// A mount operation failed.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// `mount(MS_BIND)` failed; nothing was mounted.
    #[error("bind-mounting {} onto {}", from.display(), target.display())]
    Bind {
        /// The directory that was to be bind-mounted.
        from: PathBuf,
        /// The mount point.
        target: PathBuf,
        /// The errno of the syscall.
        #[source]
        errno: Errno,
    },
    /// The bind mount worked but making it read-only did not; the bind mount was undone.
    #[error("making the bind mount at {} read-only", target.display())]
    RemountReadOnly {
        /// The mount point.
        target: PathBuf,
        /// The errno of the remount.
        #[source]
        errno: Errno,
    },
    /// Making the bind mount read-only failed, and so did undoing it (`umount2`, then
    /// `umount2(MNT_DETACH)`): a **writable** bind mount is left at `target`.
    #[error(
        "making the bind mount at {} read-only failed, and undoing it failed too (unmount: \
         {unmount_errno}; lazy unmount: {detach_errno}): a writable mount is left at {}",
        target.display(),
        target.display()
    )]
    LeftWritable {
        /// The mount point, where the writable mount is.
        target: PathBuf,
        /// The errno of the read-only remount.
        #[source]
        remount_errno: Errno,
        /// The errno of the plain `umount2`.
        unmount_errno: Errno,
        /// The errno of `umount2(MNT_DETACH)`.
        detach_errno: Errno,
    },
    /// `umount2` said `EINVAL`: nothing is mounted at `target`.
    #[error("{} is not a mount point", target.display())]
    NotMounted {
        /// The path that was to be unmounted.
        target: PathBuf,
    },
    /// `umount2` failed for another reason (`EBUSY`, `ENOENT`, `EPERM`…).
    #[error("unmounting {}", target.display())]
    Unmount {
        /// The path that was to be unmounted.
        target: PathBuf,
        /// The errno of the syscall.
        #[source]
        errno: Errno,
    },
    /// `statx` of a path failed (for another reason than its absence).
    #[error("inspecting {}", path.display())]
    Probe {
        /// The path.
        path: PathBuf,
        /// The errno of the syscall.
        #[source]
        errno: Errno,
    },
    /// The mount table could not be read.
    #[error("reading the mount table {}", path.display())]
    ReadMountinfo {
        /// The mountinfo file.
        path: PathBuf,
        /// The read error.
        #[source]
        source: std::io::Error,
    },
    /// Changing a mount's propagation (or binding a directory onto itself to make it a mount)
    /// failed.
    #[error("making {} a shared mount", target.display())]
    Propagation {
        /// The directory.
        target: PathBuf,
        /// The errno of the syscall.
        #[source]
        errno: Errno,
    },
    /// Mounting a filesystem image through a loop device (`mount -o loop`) failed; nothing
    /// was mounted. `detail` is mount(8)'s exit status and message, with every mount option
    /// of the call blanked out.
    #[error("mounting the image {} onto {}: {detail}", image.display(), target.display())]
    MountImage {
        /// The image file.
        image: PathBuf,
        /// The mount point.
        target: PathBuf,
        /// What mount(8) said, options removed.
        detail: String,
    },
    /// mount(8) could not be run.
    #[error("running mount(8) to mount {} onto {}", image.display(), target.display())]
    RunMount {
        /// The image file.
        image: PathBuf,
        /// The mount point.
        target: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The file behind a loop device could not be read from sysfs.
    #[error("reading the backing file of {device}")]
    LoopInfo {
        /// The loop device, e.g. `/dev/loop3`.
        device: String,
        /// The read error.
        #[source]
        source: std::io::Error,
    },
    /// The mount table did not parse.
    #[error("parsing the mount table {}", path.display())]
    ParseMountinfo {
        /// The mountinfo file.
        path: PathBuf,
        /// The line that failed.
        #[source]
        source: MountinfoError,
    },
}

impl MountError {
    /// Whether the error means "nothing was mounted there", which unmount callers usually treat
    /// as success.
    pub fn is_not_mounted(&self) -> bool {
        matches!(self, Self::NotMounted { .. })
    }

    /// Whether a [`Mounter::bind`] that failed with this error left a mount at its target (the
    /// only such case is [`MountError::LeftWritable`]).
    pub fn left_a_mount(&self) -> bool {
        matches!(self, Self::LeftWritable { .. })
    }
}

/// Mounts and unmounts, in the mount namespace of the calling process.
pub trait Mounter: Send + Sync + fmt::Debug {
    /// Bind-mounts the directory `source` onto `target` (both must exist). With `read_only`, the
    /// new mount is remounted read-only before this returns; if that fails the bind is undone
    /// (lazily if need be), so on error nothing new is left mounted, except after
    /// [`MountError::LeftWritable`] (see [`MountError::left_a_mount`]).
    fn bind(&self, source: &Path, target: &Path, read_only: bool) -> Result<(), MountError>;

    /// Mounts the filesystem (of type `fs_type`) in the image file `image` onto the existing
    /// directory `target` through a loop device that the kernel frees when the filesystem's
    /// last mount goes (autoclear). `options` are the filesystem's mount options; they never
    /// appear in an error. With `read_only`, the mount (and the loop device) is read-only. On
    /// error nothing is mounted.
    fn mount_image(
        &self,
        image: &Path,
        target: &Path,
        fs_type: &str,
        options: &[String],
        read_only: bool,
    ) -> Result<(), MountError>;

    /// If `source` (a mount's source) is an attached loop device, the file behind it, as the
    /// kernel reports it (a file removed since ends in ` (deleted)`).
    fn loop_backing_file(&self, source: &str) -> Result<Option<PathBuf>, MountError>;

    /// Unmounts the top-most mount at `target` (no lazy detach, no force). Returns
    /// [`MountError::NotMounted`] if `target` is not a mount point.
    fn unmount(&self, target: &Path) -> Result<(), MountError>;

    /// The current mount table, in mountinfo order.
    fn mounts(&self) -> Result<Vec<MountEntry>, MountError>;

    /// The top-most mount whose mount point is `path` (compared component-wise, without
    /// resolving symlinks), if any.
    fn mount_at(&self, path: &Path) -> Result<Option<MountEntry>, MountError> {
        Ok(top_mount_at(&self.mounts()?, path).cloned())
    }

    /// What path resolution finds at `path` (a final symlink is not followed), from one
    /// `statx` and without the mount table; `None` when this mounter or the kernel cannot
    /// tell whether it is the root of a mount (callers then read the table). The answer is
    /// the one mount(2) and umount(2) act on: the top-most mount at `path`, reached through
    /// the mounts and symlinks of its parents.
    fn probe(&self, _path: &Path) -> Result<Option<PathProbe>, MountError> {
        Ok(None)
    }
}

/// What is at a path, as [`Mounter::probe`] finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathProbe {
    /// Nothing is there.
    Absent,
    /// Something that is not the root of a mount.
    Plain,
    /// The root of a mount: the top-most one mounted there, whose root is the file `ino` on the
    /// device `dev` (for a bind mount, the directory that was bound).
    MountRoot {
        /// Device of the mount's filesystem, as `st_dev`.
        dev: u64,
        /// Inode of the mount's root, as `st_ino`.
        ino: u64,
    },
}

/// The top-most entry of `entries` mounted at `path`: of the entries whose mount point equals
/// `path`, the one no other of them is mounted on.
pub fn top_mount_at<'a>(entries: &'a [MountEntry], path: &Path) -> Option<&'a MountEntry> {
    let at: Vec<&MountEntry> = entries.iter().filter(|e| e.mount_point == path).collect();
    at.iter()
        .rev()
        .find(|e| !at.iter().any(|o| o.parent_id == e.mount_id))
        .or(at.last())
        .copied()
}

/// `loopN` if `source` is `/dev/loopN`.
fn loop_device_name(source: &str) -> Option<&str> {
    let name = source.strip_prefix("/dev/")?;
    let digits = name.strip_prefix("loop")?;
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())).then_some(name)
}

/// `text` with every mount option of `options` blanked out where it stands as a word of its
/// own (not inside a longer word), and for `key=value` options the key and the value too, as
/// some tools name them apart.
fn redact_options(text: &str, options: &[String]) -> String {
    let mut words: Vec<&str> = Vec::new();
    for option in options {
        words.push(option);
        if let Some((key, value)) = option.split_once('=') {
            words.extend([key, value]);
        }
    }
    // Longest first, so that a word inside another one is not cut out of it first.
    words.retain(|w| !w.is_empty());
    words.sort_by_key(|w| std::cmp::Reverse(w.len()));
    let mut text = text.to_owned();
    for word in words {
        let mut out = String::with_capacity(text.len());
        let mut rest = text.as_str();
        while let Some(at) = rest.find(word) {
            let before = rest[..at].chars().next_back();
            let after = rest[at + word.len()..].chars().next();
            let inside = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
            out.push_str(&rest[..at]);
            if inside(before) || inside(after) {
                out.push_str(word);
            } else {
                out.push_str("[REDACTED]");
            }
            rest = &rest[at + word.len()..];
        }
        out.push_str(rest);
        text = out;
    }
    text
}

/// The real thing: `mount(2)` and `umount2(2)` through `nix`, `/proc/self/mountinfo`.
#[derive(Debug, Default, Clone, Copy)]
pub struct LinuxMounter;

impl LinuxMounter {
    const MOUNTINFO: &'static str = "/proc/self/mountinfo";
}

impl Mounter for LinuxMounter {
    fn bind(&self, source: &Path, target: &Path, read_only: bool) -> Result<(), MountError> {
        mount(
            Some(source),
            target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|errno| MountError::Bind {
            from: source.to_path_buf(),
            target: target.to_path_buf(),
            errno,
        })?;
        if read_only {
            let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
            if let Err(errno) = mount(None::<&str>, target, None::<&str>, flags, None::<&str>) {
                // Never leave a writable mount behind when a read-only one was asked for.
                return Err(undo_bind(target, errno, |flags| umount2(target, flags)));
            }
        }
        Ok(())
    }

    fn mount_image(
        &self,
        image: &Path,
        target: &Path,
        fs_type: &str,
        options: &[String],
        read_only: bool,
    ) -> Result<(), MountError> {
        let mut all = vec!["loop".to_owned()];
        if read_only {
            all.push("ro".to_owned());
        }
        all.extend(options.iter().cloned());
        // util-linux's mount sets the loop device up with autoclear.
        let out = Command::new("mount")
            .arg("--no-mtab")
            .args(["-t", fs_type, "-o", &all.join(",")])
            .arg(image)
            .arg(target)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| MountError::RunMount {
                image: image.to_path_buf(),
                target: target.to_path_buf(),
                source,
            })?;
        if out.status.success() {
            return Ok(());
        }
        let said = String::from_utf8_lossy(&out.stderr);
        Err(MountError::MountImage {
            image: image.to_path_buf(),
            target: target.to_path_buf(),
            detail: format!(
                "mount(8) {}: {}",
                out.status,
                redact_options(said.trim(), options)
            ),
        })
    }

    fn loop_backing_file(&self, source: &str) -> Result<Option<PathBuf>, MountError> {
        let Some(name) = loop_device_name(source) else {
            return Ok(None);
        };
        let path = Path::new("/sys/block").join(name).join("loop/backing_file");
        match std::fs::read(&path) {
            Ok(mut bytes) => {
                if bytes.last() == Some(&b'\n') {
                    bytes.pop();
                }
                Ok(Some(PathBuf::from(std::ffi::OsString::from_vec(bytes))))
            }
            // Not attached (any more).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source_err) => Err(MountError::LoopInfo {
                device: source.to_owned(),
                source: source_err,
            }),
        }
    }

    fn unmount(&self, target: &Path) -> Result<(), MountError> {
        umount2(target, MntFlags::empty()).map_err(|errno| match errno {
            Errno::EINVAL => MountError::NotMounted {
                target: target.to_path_buf(),
            },
            errno => MountError::Unmount {
                target: target.to_path_buf(),
                errno,
            },
        })
    }

    fn mounts(&self) -> Result<Vec<MountEntry>, MountError> {
        read_mountinfo(Path::new(Self::MOUNTINFO))
    }

    fn probe(&self, path: &Path) -> Result<Option<PathProbe>, MountError> {
        use rustix::fs::{AtFlags, CWD, StatxAttributes, StatxFlags, makedev, statx};
        let st = match statx(CWD, path, AtFlags::SYMLINK_NOFOLLOW, StatxFlags::INO) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => {
                return Ok(Some(PathProbe::Absent));
            }
            Err(e) => {
                return Err(MountError::Probe {
                    path: path.to_path_buf(),
                    errno: Errno::from_raw(e.raw_os_error()),
                });
            }
        };
        if !st.stx_attributes_mask.contains(StatxAttributes::MOUNT_ROOT) {
            return Ok(None);
        }
        if !st.stx_attributes.contains(StatxAttributes::MOUNT_ROOT) {
            return Ok(Some(PathProbe::Plain));
        }
        Ok(Some(PathProbe::MountRoot {
            dev: makedev(st.stx_dev_major, st.stx_dev_minor),
            ino: st.stx_ino,
        }))
    }
}

/// Makes the directory `dir` a shared mount (its own peer group) in the calling process's
/// mount namespace, so that mounts made under it in another namespace holding a peer of it
/// show here, and the reverse. A directory that is not a mount point yet is first bound onto
/// itself, recursively (mounts already under it stay visible). Idempotent: a shared mount is
/// left as it is. Returns whether anything changed.
pub fn ensure_shared_mount(dir: &Path) -> Result<bool, MountError> {
    let mountinfo = Path::new(LinuxMounter::MOUNTINFO);
    let table = read_mountinfo(mountinfo)?;
    let fail = |errno| MountError::Propagation {
        target: dir.to_path_buf(),
        errno,
    };
    match top_mount_at(&table, dir) {
        Some(e) if e.shared => return Ok(false),
        Some(_) => {}
        None => mount(
            Some(dir),
            dir,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(fail)?,
    }
    mount(
        None::<&str>,
        dir,
        None::<&str>,
        MsFlags::MS_SHARED,
        None::<&str>,
    )
    .map_err(fail)?;
    Ok(true)
}

/// Unmounts every mount at or under `dir`, deepest first (lazily, `MNT_DETACH`, when a plain
/// unmount fails), and returns the mount points still there afterwards. For tearing down a
/// directory tree the agent mounted into (`--dev`'s data dir).
pub fn unmount_all_under(dir: &Path) -> Result<Vec<PathBuf>, MountError> {
    let mountinfo = Path::new(LinuxMounter::MOUNTINFO);
    let under = |table: Vec<MountEntry>| -> Vec<PathBuf> {
        table
            .into_iter()
            .map(|e| e.mount_point)
            .filter(|p| p.starts_with(dir))
            .collect()
    };
    // Later mounts stack on earlier ones: undo them in reverse order.
    for target in under(read_mountinfo(mountinfo)?).iter().rev() {
        if umount2(target, MntFlags::empty()).is_err() {
            let _ = umount2(target, MntFlags::MNT_DETACH);
        }
    }
    Ok(under(read_mountinfo(mountinfo)?))
}

/// Undoes the bind mount at `target` after its read-only remount failed with `remount_errno`:
/// unmounts it with `umount`, lazily (`MNT_DETACH`) if a plain unmount fails. The error to
/// report: [`MountError::RemountReadOnly`] if the bind is gone, [`MountError::LeftWritable`] if
/// it is still there.
fn undo_bind(
    target: &Path,
    remount_errno: Errno,
    mut umount: impl FnMut(MntFlags) -> Result<(), Errno>,
) -> MountError {
    let unmount_errno = match umount(MntFlags::empty()) {
        Ok(()) => {
            return MountError::RemountReadOnly {
                target: target.to_path_buf(),
                errno: remount_errno,
            };
        }
        Err(errno) => errno,
    };
    match umount(MntFlags::MNT_DETACH) {
        Ok(()) => MountError::RemountReadOnly {
            target: target.to_path_buf(),
            errno: remount_errno,
        },
        Err(detach_errno) => MountError::LeftWritable {
            target: target.to_path_buf(),
            remount_errno,
            unmount_errno,
            detach_errno,
        },
    }
}

/// A call made to a [`RecordingMounter`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountCall {
    /// [`Mounter::bind`].
    Bind {
        /// Directory bind-mounted.
        source: PathBuf,
        /// Mount point.
        target: PathBuf,
        /// Whether a read-only mount was asked for.
        read_only: bool,
    },
    /// [`Mounter::mount_image`].
    MountImage {
        /// The image file.
        image: PathBuf,
        /// Mount point.
        target: PathBuf,
        /// Filesystem type.
        fs_type: String,
        /// Mount options.
        options: Vec<String>,
        /// Whether a read-only mount was asked for.
        read_only: bool,
    },
    /// [`Mounter::unmount`].
    Unmount {
        /// Path unmounted.
        target: PathBuf,
    },
}

/// A fake [`Mounter`]: records every call and keeps an in-memory mount table that starts with
/// one root mount (id 1, `/`). [`fail_next`](Self::fail_next) makes the next call fail. Images
/// are "mounted" from fake loop devices `/dev/loopN`, forgotten when their last mount goes.
#[derive(Debug)]
pub struct RecordingMounter {
    inner: Mutex<Recording>,
}

#[derive(Debug)]
struct Recording {
    calls: Vec<MountCall>,
    table: Vec<MountEntry>,
    next_id: u32,
    fail_next: Option<Errno>,
    /// Fake loop devices (`/dev/loopN`) and their image files.
    loops: HashMap<String, PathBuf>,
    next_loop: u32,
}

impl Default for RecordingMounter {
    fn default() -> Self {
        Self::new()
    }
}

impl RecordingMounter {
    /// A fake whose table holds only the root mount.
    pub fn new() -> Self {
        let root = MountEntry {
            mount_id: 1,
            parent_id: 0,
            root: PathBuf::from("/"),
            mount_point: PathBuf::from("/"),
            read_only: false,
            shared: false,
            fs_type: "rootfs".to_owned(),
            source: "rootfs".to_owned(),
            super_options: "rw".to_owned(),
        };
        Self {
            inner: Mutex::new(Recording {
                calls: Vec::new(),
                table: vec![root],
                next_id: 100,
                fail_next: None,
                loops: HashMap::new(),
                next_loop: 0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Recording> {
        // A panic while holding the lock cannot leave the recording half-updated.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every call made so far, in order.
    pub fn calls(&self) -> Vec<MountCall> {
        self.lock().calls.clone()
    }

    /// Returns the calls made so far and forgets them.
    pub fn take_calls(&self) -> Vec<MountCall> {
        std::mem::take(&mut self.lock().calls)
    }

    /// Makes the next `bind`, `mount_image` or `unmount` fail with `errno` (recorded, table unchanged; an
    /// `unmount` failing with `EINVAL` reports [`MountError::NotMounted`]).
    pub fn fail_next(&self, errno: Errno) {
        self.lock().fail_next = Some(errno);
    }
}

impl Mounter for RecordingMounter {
    fn mount_image(
        &self,
        image: &Path,
        target: &Path,
        fs_type: &str,
        options: &[String],
        read_only: bool,
    ) -> Result<(), MountError> {
        let mut rec = self.lock();
        rec.calls.push(MountCall::MountImage {
            image: image.to_path_buf(),
            target: target.to_path_buf(),
            fs_type: fs_type.to_owned(),
            options: options.to_vec(),
            read_only,
        });
        if let Some(errno) = rec.fail_next.take() {
            return Err(MountError::MountImage {
                image: image.to_path_buf(),
                target: target.to_path_buf(),
                detail: format!("injected failure: {errno}"),
            });
        }
        let device = format!("/dev/loop{}", rec.next_loop);
        rec.next_loop += 1;
        rec.loops.insert(device.clone(), image.to_path_buf());
        let parent_id = containing_mount(&rec.table, target).map_or(1, |e| e.mount_id);
        let mount_id = rec.next_id;
        rec.next_id += 1;
        rec.table.push(MountEntry {
            mount_id,
            parent_id,
            root: PathBuf::from("/"),
            mount_point: target.to_path_buf(),
            read_only,
            shared: false,
            fs_type: fs_type.to_owned(),
            source: device,
            super_options: if read_only { "ro" } else { "rw" }.to_owned(),
        });
        Ok(())
    }

    fn loop_backing_file(&self, source: &str) -> Result<Option<PathBuf>, MountError> {
        Ok(self.lock().loops.get(source).cloned())
    }

    fn bind(&self, source: &Path, target: &Path, read_only: bool) -> Result<(), MountError> {
        let mut rec = self.lock();
        rec.calls.push(MountCall::Bind {
            source: source.to_path_buf(),
            target: target.to_path_buf(),
            read_only,
        });
        if let Some(errno) = rec.fail_next.take() {
            return Err(MountError::Bind {
                from: source.to_path_buf(),
                target: target.to_path_buf(),
                errno,
            });
        }
        let parent_id = containing_mount(&rec.table, target).map_or(1, |e| e.mount_id);
        // As the kernel does, the root is the source's path inside its own filesystem: a bind of
        // a bind mount shows the first mount's root.
        let (root, fs_type, src, super_options) = match containing_mount(&rec.table, source) {
            Some(e) => (
                e.root
                    .join(source.strip_prefix(&e.mount_point).unwrap_or(source)),
                e.fs_type.clone(),
                e.source.clone(),
                e.super_options.clone(),
            ),
            None => (
                source.to_path_buf(),
                "none".to_owned(),
                "none".to_owned(),
                "rw".to_owned(),
            ),
        };
        let mount_id = rec.next_id;
        rec.next_id += 1;
        rec.table.push(MountEntry {
            mount_id,
            parent_id,
            root,
            mount_point: target.to_path_buf(),
            read_only,
            shared: false,
            fs_type,
            source: src,
            super_options,
        });
        Ok(())
    }

    fn unmount(&self, target: &Path) -> Result<(), MountError> {
        let mut rec = self.lock();
        rec.calls.push(MountCall::Unmount {
            target: target.to_path_buf(),
        });
        let not_mounted = || MountError::NotMounted {
            target: target.to_path_buf(),
        };
        match rec.fail_next.take() {
            Some(Errno::EINVAL) => return Err(not_mounted()),
            Some(errno) => {
                return Err(MountError::Unmount {
                    target: target.to_path_buf(),
                    errno,
                });
            }
            None => {}
        }
        let (id, source) = top_mount_at(&rec.table, target)
            .map(|e| (e.mount_id, e.source.clone()))
            .ok_or_else(not_mounted)?;
        rec.table.retain(|e| e.mount_id != id);
        // Autoclear: a loop device goes with the last mount of its filesystem.
        if !rec.table.iter().any(|e| e.source == source) {
            rec.loops.remove(&source);
        }
        Ok(())
    }

    fn mounts(&self) -> Result<Vec<MountEntry>, MountError> {
        Ok(self.lock().table.clone())
    }
}

/// The mount `path` lives on: the top-most mount whose mount point is the longest prefix of
/// `path` (compared component-wise, without resolving symlinks).
pub fn containing_mount<'a>(table: &'a [MountEntry], path: &Path) -> Option<&'a MountEntry> {
    let longest = table
        .iter()
        .filter(|e| path.starts_with(&e.mount_point))
        .map(|e| e.mount_point.components().count())
        .max()?;
    let point = table
        .iter()
        .find(|e| {
            path.starts_with(&e.mount_point) && e.mount_point.components().count() == longest
        })?
        .mount_point
        .clone();
    top_mount_at(table, &point)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(mount_id: u32, parent_id: u32, mount_point: &str) -> MountEntry {
        MountEntry {
            mount_id,
            parent_id,
            root: PathBuf::from("/"),
            mount_point: PathBuf::from(mount_point),
            read_only: false,
            shared: false,
            fs_type: "ext4".into(),
            source: "/dev/sda".into(),
            super_options: "rw".into(),
        }
    }

    #[test]
    fn top_mount_at_picks_the_stacked_one() {
        let table = vec![
            entry(1, 0, "/"),
            entry(10, 1, "/mnt"),
            entry(12, 11, "/other"),
            entry(11, 10, "/mnt"),
        ];
        assert_eq!(
            top_mount_at(&table, Path::new("/mnt")).map(|e| e.mount_id),
            Some(11)
        );
        assert_eq!(
            top_mount_at(&table, Path::new("/mnt/")).map(|e| e.mount_id),
            Some(11)
        );
        assert_eq!(top_mount_at(&table, Path::new("/mnt/x")), None);
        assert_eq!(
            top_mount_at(&table, Path::new("/")).map(|e| e.mount_id),
            Some(1)
        );
    }

    #[test]
    fn containing_mount_is_the_top_of_the_longest_prefix() {
        let table = vec![
            entry(1, 0, "/"),
            entry(2, 1, "/tmp"),
            entry(3, 2, "/tmp/state"),
            entry(4, 2, "/tmp"),
        ];
        let at = |p: &str| containing_mount(&table, Path::new(p)).map(|e| e.mount_id);
        assert_eq!(at("/var/lib"), Some(1));
        assert_eq!(at("/tmp/a/volumes"), Some(4));
        assert_eq!(at("/tmp/statement"), Some(4));
        assert_eq!(at("/tmp/state/volumes"), Some(3));
        assert_eq!(at("/tmp/state"), Some(3));
        assert_eq!(containing_mount(&[], Path::new("/x")), None);
    }

    #[test]
    fn recording_mounter_records_exact_calls() {
        let m = RecordingMounter::new();
        m.bind(Path::new("/data/v1"), Path::new("/stage/v1"), false)
            .expect("bind");
        m.bind(Path::new("/stage/v1"), Path::new("/pub/a"), true)
            .expect("ro bind");
        m.unmount(Path::new("/pub/a")).expect("unmount");
        assert_eq!(
            m.take_calls(),
            vec![
                MountCall::Bind {
                    source: "/data/v1".into(),
                    target: "/stage/v1".into(),
                    read_only: false
                },
                MountCall::Bind {
                    source: "/stage/v1".into(),
                    target: "/pub/a".into(),
                    read_only: true
                },
                MountCall::Unmount {
                    target: "/pub/a".into()
                },
            ]
        );
        assert!(m.calls().is_empty());
    }

    #[test]
    fn recording_mounter_keeps_a_table() {
        let m = RecordingMounter::new();
        m.bind(Path::new("/data/v1"), Path::new("/t"), false)
            .expect("bind");
        m.bind(Path::new("/data/v2"), Path::new("/t"), true)
            .expect("stacked bind");
        let top = m
            .mount_at(Path::new("/t"))
            .expect("table")
            .expect("mounted");
        assert_eq!(top.root, Path::new("/data/v2"));
        assert!(top.read_only);

        m.unmount(Path::new("/t")).expect("unmount top");
        let top = m
            .mount_at(Path::new("/t"))
            .expect("table")
            .expect("still mounted");
        assert_eq!(top.root, Path::new("/data/v1"));
        m.unmount(Path::new("/t")).expect("unmount bottom");
        assert_eq!(m.mount_at(Path::new("/t")).expect("table"), None);

        let err = m.unmount(Path::new("/t")).unwrap_err();
        assert!(err.is_not_mounted(), "{err:?}");
        assert_eq!(m.mounts().expect("table").len(), 1);
    }

    #[test]
    fn recording_mounter_binds_of_binds_keep_the_first_root() {
        let m = RecordingMounter::new();
        m.bind(Path::new("/data/v1"), Path::new("/stage"), false)
            .expect("bind");
        m.bind(Path::new("/stage/sub"), Path::new("/pub"), true)
            .expect("bind of a bind");
        let e = m
            .mount_at(Path::new("/pub"))
            .expect("table")
            .expect("mounted");
        assert_eq!(e.root, Path::new("/data/v1/sub"));
    }

    #[test]
    fn recording_mounter_injects_failures() {
        let m = RecordingMounter::new();
        m.fail_next(Errno::EPERM);
        let err = m.bind(Path::new("/a"), Path::new("/b"), false).unwrap_err();
        assert!(
            matches!(
                err,
                MountError::Bind {
                    errno: Errno::EPERM,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(m.mount_at(Path::new("/b")).expect("table"), None);

        m.bind(Path::new("/a"), Path::new("/b"), false)
            .expect("bind");
        m.fail_next(Errno::EBUSY);
        let err = m.unmount(Path::new("/b")).unwrap_err();
        assert!(
            matches!(
                err,
                MountError::Unmount {
                    errno: Errno::EBUSY,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(m.mount_at(Path::new("/b")).expect("table").is_some());
        assert_eq!(m.calls().len(), 3);
    }

    #[test]
    fn a_failed_read_only_remount_is_undone_lazily_if_need_be() {
        let target = Path::new("/t");
        let mut tried = Vec::new();
        let err = undo_bind(target, Errno::EPERM, |flags| {
            tried.push(flags);
            Ok(())
        });
        assert!(
            matches!(
                err,
                MountError::RemountReadOnly {
                    errno: Errno::EPERM,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(!err.left_a_mount());
        assert_eq!(tried, [MntFlags::empty()]);

        tried.clear();
        let err = undo_bind(target, Errno::EPERM, |flags| {
            tried.push(flags);
            if flags.contains(MntFlags::MNT_DETACH) {
                Ok(())
            } else {
                Err(Errno::EBUSY)
            }
        });
        assert!(matches!(err, MountError::RemountReadOnly { .. }), "{err:?}");
        assert_eq!(tried, [MntFlags::empty(), MntFlags::MNT_DETACH]);
    }

    #[test]
    fn a_bind_that_cannot_be_undone_is_reported_as_left_writable() {
        let err = undo_bind(Path::new("/mnt/t"), Errno::EPERM, |flags| {
            Err(if flags.contains(MntFlags::MNT_DETACH) {
                Errno::EINVAL
            } else {
                Errno::EBUSY
            })
        });
        assert!(
            matches!(
                err,
                MountError::LeftWritable {
                    remount_errno: Errno::EPERM,
                    unmount_errno: Errno::EBUSY,
                    detach_errno: Errno::EINVAL,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.left_a_mount());
        let text = err.to_string();
        assert!(
            text.contains("a writable mount is left at /mnt/t")
                && text.contains("EBUSY")
                && text.contains("EINVAL"),
            "{text}"
        );
        let source = std::error::Error::source(&err).map(ToString::to_string);
        assert_eq!(source.as_deref(), Some("EPERM: Operation not permitted"));
    }

    #[test]
    fn loop_devices_are_recognised_by_name() {
        assert_eq!(loop_device_name("/dev/loop0"), Some("loop0"));
        assert_eq!(loop_device_name("/dev/loop12"), Some("loop12"));
        for other in [
            "/dev/loop",
            "/dev/loop1p1",
            "/dev/sda",
            "tmpfs",
            "/dev/loopx",
        ] {
            assert_eq!(loop_device_name(other), None, "{other}");
        }
    }

    #[test]
    fn mount_options_are_blanked_out_of_messages() {
        let options = ["ro".to_owned(), "secret=hunter2".to_owned()];
        let said = "mount: /m: wrong fs type, bad option 'secret=hunter2' (ro)\n\
                    fsconfig: Unknown parameter 'secret'; value hunter2";
        let text = redact_options(said, &options);
        assert!(
            !text.contains("hunter2") && !text.contains("'secret"),
            "{text}"
        );
        assert!(
            text.contains("wrong fs type"),
            "words that hold an option stay: {text}"
        );
        assert_eq!(
            text,
            "mount: /m: wrong fs type, bad option '[REDACTED]' ([REDACTED])\n\
             fsconfig: Unknown parameter '[REDACTED]'; value [REDACTED]"
        );
    }

    #[test]
    fn recording_mounter_mounts_images_from_loop_devices_that_go_with_their_last_mount() {
        let m = RecordingMounter::new();
        let flags = vec!["noexec".to_owned()];
        m.mount_image(
            Path::new("/v/a.img"),
            Path::new("/stage"),
            "ext4",
            &flags,
            false,
        )
        .expect("mount");
        let staged = m
            .mount_at(Path::new("/stage"))
            .expect("table")
            .expect("mounted");
        assert_eq!(staged.root, Path::new("/"));
        assert_eq!(staged.fs_type, "ext4");
        assert_eq!(
            m.loop_backing_file(&staged.source).expect("loop"),
            Some(PathBuf::from("/v/a.img"))
        );
        m.bind(Path::new("/stage"), Path::new("/pub"), true)
            .expect("bind");
        let published = m
            .mount_at(Path::new("/pub"))
            .expect("table")
            .expect("mounted");
        assert_eq!(published.source, staged.source, "a bind shares the device");
        m.unmount(Path::new("/stage")).expect("unmount");
        assert!(m.loop_backing_file(&staged.source).expect("loop").is_some());
        m.unmount(Path::new("/pub")).expect("unmount");
        assert_eq!(m.loop_backing_file(&staged.source).expect("loop"), None);
        assert_eq!(
            m.take_calls()[0],
            MountCall::MountImage {
                image: "/v/a.img".into(),
                target: "/stage".into(),
                fs_type: "ext4".into(),
                options: flags,
                read_only: false,
            }
        );
        m.fail_next(Errno::EIO);
        let err = m
            .mount_image(
                Path::new("/v/a.img"),
                Path::new("/stage"),
                "ext4",
                &[],
                true,
            )
            .unwrap_err();
        assert!(matches!(err, MountError::MountImage { .. }), "{err:?}");
        assert_eq!(m.mount_at(Path::new("/stage")).expect("table"), None);
    }

    #[test]
    fn bind_error_names_both_paths() {
        let err = MountError::Bind {
            from: "/src dir".into(),
            target: "/dst".into(),
            errno: Errno::ENOENT,
        };
        assert_eq!(err.to_string(), "bind-mounting /src dir onto /dst");
        let source = std::error::Error::source(&err).map(ToString::to_string);
        assert_eq!(source.as_deref(), Some("ENOENT: No such file or directory"));
    }
}

/// Real mounts, made by this test binary re-run inside `unshare -m` (a private mount namespace
/// that vanishes with the child), so nothing leaks into the host.
#[cfg(test)]
mod linux_tests {
    use std::{fs, process::Command};

    use super::*;

    const IN_NS: &str = "BERTH_SYS_TEST_IN_PRIVATE_MOUNT_NS";

    /// Runs the test named `name` of this binary again inside a private mount namespace.
    fn rerun_in_private_ns(name: &str) {
        let exe = std::env::current_exe().expect("current_exe");
        let out = Command::new("unshare")
            .args(["-m", "--propagation", "private", "--"])
            .arg(exe)
            .args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env(IN_NS, "1")
            .output()
            .expect("running unshare (util-linux) as root");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "inner test failed:\n{text}");
        assert!(text.contains("1 passed"), "inner test did not run:\n{text}");
    }

    #[test]
    fn linux_mounter_binds_read_only_and_unmounts() {
        const NAME: &str = "mount::linux_tests::linux_mounter_binds_read_only_and_unmounts";
        if std::env::var_os(IN_NS).is_none() {
            return rerun_in_private_ns(NAME);
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("src dir");
        let rw = dir.path().join("rw");
        let ro = dir.path().join("ro");
        for d in [&src, &rw, &ro] {
            fs::create_dir(d).expect("mkdir");
        }
        fs::write(src.join("f"), b"data").expect("write");
        let m = LinuxMounter;

        m.bind(&src, &rw, false).expect("bind");
        let e = m.mount_at(&rw).expect("mountinfo").expect("mounted");
        assert!(e.root.ends_with("src dir"), "{e:?}");
        assert!(!e.read_only);
        fs::write(rw.join("g"), b"through rw").expect("write through rw bind");

        m.bind(&src, &ro, true).expect("read-only bind");
        let e = m.mount_at(&ro).expect("mountinfo").expect("mounted");
        assert!(e.read_only, "{e:?}");
        assert_eq!(
            fs::read(ro.join("g")).expect("read through ro bind"),
            b"through rw"
        );
        let err = fs::write(ro.join("h"), b"x").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(Errno::EROFS as i32));

        m.unmount(&ro).expect("unmount ro");
        m.unmount(&rw).expect("unmount rw");
        assert_eq!(m.mount_at(&rw).expect("mountinfo"), None);
        let err = m.unmount(&rw).unwrap_err();
        assert!(err.is_not_mounted(), "{err:?}");

        let err = m.bind(&dir.path().join("missing"), &rw, false).unwrap_err();
        assert!(
            matches!(
                err,
                MountError::Bind {
                    errno: Errno::ENOENT,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn probe_sees_the_top_mount_at_a_path_without_the_table() {
        const NAME: &str =
            "mount::linux_tests::probe_sees_the_top_mount_at_a_path_without_the_table";
        if std::env::var_os(IN_NS).is_none() {
            return rerun_in_private_ns(NAME);
        }
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let (a, b, at) = (
            dir.path().join("a"),
            dir.path().join("b"),
            dir.path().join("at"),
        );
        for d in [&a, &b, &at] {
            fs::create_dir(d).expect("mkdir");
        }
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&at, &link).expect("symlink");
        let root_of = |p: &Path| {
            let m = fs::metadata(p).expect("stat");
            Some(PathProbe::MountRoot {
                dev: m.dev(),
                ino: m.ino(),
            })
        };
        let (root_a, root_b) = (root_of(&a), root_of(&b));
        let m = LinuxMounter;

        assert_eq!(m.probe(&at).expect("probe"), Some(PathProbe::Plain));
        assert_eq!(
            m.probe(&dir.path().join("missing/x")).expect("probe"),
            Some(PathProbe::Absent)
        );
        m.bind(&a, &at, false).expect("bind a");
        assert_eq!(m.probe(&at).expect("probe"), root_a);
        // A final symlink is not followed: the link itself is no mount.
        assert_eq!(m.probe(&link).expect("probe"), Some(PathProbe::Plain));
        // Stacked: the top-most mount is the one seen, as umount(2) would take it.
        m.bind(&b, &at, true).expect("bind b");
        assert_eq!(m.probe(&at).expect("probe"), root_b);
        m.unmount(&at).expect("unmount b");
        assert_eq!(m.probe(&at).expect("probe"), root_a);
        // The table agrees with each answer.
        let top = m.mount_at(&at).expect("table").expect("mounted");
        assert!(top.root.ends_with("a"), "{top:?}");
        m.unmount(&at).expect("unmount a");
        assert_eq!(m.probe(&at).expect("probe"), Some(PathProbe::Plain));
        assert_eq!(m.mount_at(&at).expect("table"), None);
        // The fake cannot tell: its callers read its table.
        assert_eq!(RecordingMounter::new().probe(&at).expect("probe"), None);
    }

    #[test]
    fn a_mount_point_of_this_namespace_is_never_removed() {
        const NAME: &str = "mount::linux_tests::a_mount_point_of_this_namespace_is_never_removed";
        if std::env::var_os(IN_NS).is_none() {
            return rerun_in_private_ns(NAME);
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("src");
        let target = dir.path().join("target");
        let file_src = dir.path().join("file-src");
        let file_target = dir.path().join("file-target");
        fs::create_dir(&src).expect("mkdir");
        fs::create_dir(&target).expect("mkdir");
        fs::write(&file_src, b"").expect("write");
        fs::write(&file_target, b"").expect("write");
        let m = LinuxMounter;
        m.bind(&src, &target, false).expect("bind a directory");
        m.bind(&file_src, &file_target, false).expect("bind a file");

        // Both look removable (an empty directory, an empty file); the kernel refuses.
        for path in [&target, &file_target] {
            let r = crate::remove_empty_unmounted(path);
            assert!(
                matches!(r, crate::Removal::Mounted),
                "{}: {r:?}",
                path.display()
            );
            assert!(path.exists(), "{}", path.display());
            assert!(m.mount_at(path).expect("mountinfo").is_some());
        }

        // Unmounted, they go; absent, they are gone already; with data, a path stays.
        m.unmount(&target).expect("unmount");
        m.unmount(&file_target).expect("unmount");
        for path in [&target, &file_target] {
            let r = crate::remove_empty_unmounted(path);
            assert!(
                matches!(r, crate::Removal::Gone),
                "{}: {r:?}",
                path.display()
            );
            assert!(!path.exists(), "{}", path.display());
            let again = crate::remove_empty_unmounted(path);
            assert!(matches!(again, crate::Removal::Gone), "{again:?}");
        }
        fs::write(src.join("data"), b"x").expect("write");
        let r = crate::remove_empty_unmounted(&src);
        assert!(matches!(r, crate::Removal::Kept(_)), "{r:?}");
        let r = crate::remove_empty_unmounted(&src.join("data"));
        assert!(matches!(r, crate::Removal::Kept(_)), "{r:?}");
        assert!(src.join("data").exists());
    }

    /// The loop devices whose backing file is under `dir`.
    fn loops_under(dir: &Path) -> Vec<PathBuf> {
        let Ok(entries) = fs::read_dir("/sys/block") else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| fs::read_to_string(e.path().join("loop/backing_file")).ok())
            .map(|f| PathBuf::from(f.trim_end()))
            .filter(|f| f.starts_with(dir))
            .collect()
    }

    #[test]
    fn linux_mounter_mounts_images_through_autoclear_loop_devices() {
        const NAME: &str =
            "mount::linux_tests::linux_mounter_mounts_images_through_autoclear_loop_devices";
        if std::env::var_os(IN_NS).is_none() {
            return rerun_in_private_ns(NAME);
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let image = dir.path().join("fs.img");
        let target = dir.path().join("mnt");
        fs::create_dir(&target).expect("mkdir");
        fs::File::create(&image)
            .and_then(|f| f.set_len(16 << 20))
            .expect("sparse file");
        let made = Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(&image)
            .status()
            .expect("mkfs.ext4 (e2fsprogs)");
        assert!(made.success());
        let m = LinuxMounter;

        // A bad option fails, mounts nothing, and is not repeated in the error.
        let secret = vec!["secretopt=hunter2".to_owned()];
        let err = m
            .mount_image(&image, &target, "ext4", &secret, false)
            .unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, MountError::MountImage { .. }), "{err:?}");
        assert!(
            !text.contains("hunter2") && !text.contains("secretopt"),
            "{text}"
        );
        assert_eq!(m.mount_at(&target).expect("mountinfo"), None);

        m.mount_image(&image, &target, "ext4", &["noexec".to_owned()], false)
            .expect("mount");
        let e = m.mount_at(&target).expect("mountinfo").expect("mounted");
        assert_eq!(e.fs_type, "ext4");
        assert_eq!(
            m.loop_backing_file(&e.source).expect("sysfs"),
            Some(image.clone())
        );
        assert_eq!(loops_under(dir.path()), vec![image.clone()]);
        let line = fs::read_to_string("/proc/self/mountinfo")
            .expect("mountinfo")
            .lines()
            .find(|l| l.contains(&format!(" {} ", target.display())))
            .map(str::to_owned)
            .expect("line");
        assert!(line.contains("noexec"), "{line}");
        fs::write(target.join("f"), b"data").expect("write");

        m.unmount(&target).expect("unmount");
        assert!(!target.join("f").exists());
        // Autoclear frees the device once the filesystem is gone (the kernel may take a moment).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !loops_under(dir.path()).is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(loops_under(dir.path()), Vec::<PathBuf>::new());
        assert_eq!(m.loop_backing_file(&e.source).expect("sysfs"), None);

        m.mount_image(&image, &target, "ext4", &[], true)
            .expect("read-only mount");
        let e = m.mount_at(&target).expect("mountinfo").expect("mounted");
        assert!(e.read_only);
        assert_eq!(
            fs::read(target.join("f")).expect("the data is in the image"),
            b"data"
        );
        m.unmount(&target).expect("unmount");
    }

    #[test]
    fn unmount_all_under_leaves_nothing_mounted_there_and_the_rest_alone() {
        const NAME: &str =
            "mount::linux_tests::unmount_all_under_leaves_nothing_mounted_there_and_the_rest_alone";
        if std::env::var_os(IN_NS).is_none() {
            return rerun_in_private_ns(NAME);
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let (tree, src, outside) = (
            dir.path().join("tree"),
            dir.path().join("src"),
            dir.path().join("outside"),
        );
        for d in [&tree, &src, &outside] {
            fs::create_dir(d).expect("mkdir");
        }
        let m = LinuxMounter;
        // A shared root with a mount under it and one stacked on it, and one elsewhere.
        assert!(ensure_shared_mount(&tree).expect("shared"));
        fs::create_dir(tree.join("a")).expect("mkdir a");
        m.bind(&src, &tree.join("a"), false).expect("bind a");
        m.bind(&src, &tree.join("a"), true).expect("bind a again");
        m.bind(&src, &outside, false).expect("bind outside");
        let left = unmount_all_under(&tree).expect("unmount");
        assert!(left.is_empty(), "{left:?}");
        let points: Vec<PathBuf> = m
            .mounts()
            .expect("mounts")
            .into_iter()
            .map(|e| e.mount_point)
            .collect();
        assert!(!points.iter().any(|p| p.starts_with(&tree)), "{points:?}");
        assert!(points.contains(&outside), "{points:?}");
        fs::remove_dir_all(&tree).expect("the tree can go");
        m.unmount(&outside).expect("unmount outside");
    }

    #[test]
    fn ensure_shared_mount_keeps_submounts_and_propagates_to_peers() {
        const NAME: &str =
            "mount::linux_tests::ensure_shared_mount_keeps_submounts_and_propagates_to_peers";
        if std::env::var_os(IN_NS).is_none() {
            return rerun_in_private_ns(NAME);
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let (root, src, peer) = (
            dir.path().join("root"),
            dir.path().join("src"),
            dir.path().join("peer"),
        );
        for d in [&root, &root.join("old"), &root.join("new"), &src, &peer] {
            fs::create_dir(d).expect("mkdir");
        }
        fs::write(src.join("f"), b"data").expect("write");
        let m = LinuxMounter;
        // A mount made before the directory became shared stays visible under it.
        m.bind(&src, &root.join("old"), false).expect("bind old");
        assert!(ensure_shared_mount(&root).expect("shared"));
        let e = m
            .mount_at(&root)
            .expect("mountinfo")
            .expect("root is a mount");
        assert!(e.shared, "{e:?}");
        assert!(root.join("old/f").exists());
        // Done once: a second call changes nothing.
        assert!(!ensure_shared_mount(&root).expect("again"));

        // A bind of a shared mount is its peer: mounts made under either show under the other.
        mount(
            Some(&root),
            &peer,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .expect("bind peer");
        m.bind(&src, &peer.join("new"), false)
            .expect("bind under the peer");
        assert_eq!(fs::read(root.join("new/f")).expect("seen at root"), b"data");
        m.unmount(&root.join("new")).expect("unmount at root");
        assert!(!peer.join("new/f").exists(), "the unmount reached the peer");
    }
}
