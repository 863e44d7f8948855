//! The syscalls berth makes, behind small traits so the logic above them can be tested without
//! root: bind mounts and the mount table ([`mount`]), ids that become path segments ([`ids`]),
//! crash-safe file writes and filesystem statistics ([`fs`]).
//!
//! Everything here is safe Rust over `nix`; the crate forbids `unsafe`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod duration;
pub mod fs;
pub mod ids;
pub mod mount;
mod mountinfo;
pub mod procs;
mod rlimit;
pub mod slot;

pub use duration::{now_ms, short_duration};
pub use fs::{
    AtomicWriteError, FsStats, FsStatsError, Removal, WriteStep, create_dir_with_mode,
    create_private_dir, fs_stats, hostname, remove_empty_unmounted, write_atomic,
    write_file_beneath,
};
pub use ids::{IdRule, InvalidId, MAX_SEGMENT_LEN, is_unprintable, validate_path_segment};
pub use mount::{
    LinuxMounter, MountCall, MountEntry, MountError, Mounter, PathProbe, RecordingMounter,
    containing_mount, ensure_shared_mount, top_mount_at, unmount_all_under,
};
pub use mountinfo::{MountinfoError, parse_mountinfo, read_mountinfo};
/// The errno type of mount errors, re-exported so callers need not depend on `nix`.
pub use nix::errno::Errno;
pub use rlimit::raise_nofile_limit;

/// The longest unix socket path the kernel takes, in bytes (`sun_path` holds 108 with the
/// NUL). Every socket berth binds or dials is checked against it first, so a path that does
/// not fit is refused with a message instead of failing (or being cut) in the kernel.
pub const MAX_SOCKET_PATH: usize = 107;
