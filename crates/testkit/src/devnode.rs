//! Device nodes for tests (copies of harmless kernel devices, made with mknod).

use std::{os::unix::fs::PermissionsExt as _, path::Path};

use nix::sys::stat::{Mode, SFlag, makedev, mknod};

/// Makes a character device node `major:minor` at `path` (and its missing parent
/// directories), readable and writable by all (0666, whatever the umask). 1:9 is a copy of
/// `/dev/urandom`, 1:5 of `/dev/zero`, 1:3 of `/dev/null`.
///
/// # Panics
/// If any step fails (mknod needs root), naming the path.
pub fn mknod_char(path: &Path, major: u64, minor: u64) {
    make(path, SFlag::S_IFCHR, major, minor);
}

/// Makes a block device node `major:minor` at `path` (and its missing parent directories),
/// readable and writable by all (0666, whatever the umask). 7:N is loop device N.
///
/// # Panics
/// If any step fails (mknod needs root), naming the path.
pub fn mknod_block(path: &Path, major: u64, minor: u64) {
    make(path, SFlag::S_IFBLK, major, minor);
}

fn make(path: &Path, kind: SFlag, major: u64, minor: u64) {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .unwrap_or_else(|e| panic!("device node dir {}: {e}", dir.display()));
    }
    mknod(
        path,
        kind,
        Mode::from_bits_truncate(0o666),
        makedev(major, minor),
    )
    .unwrap_or_else(|e| panic!("mknod {} ({major}:{minor}): {e}", path.display()));
    // mknod honours the umask.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .unwrap_or_else(|e| panic!("chmod 0666 {}: {e}", path.display()));
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};

    use super::*;

    #[test]
    fn nodes_have_their_kind_numbers_and_mode() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: mknod needs root");
            return;
        }
        let tmp = tempfile::tempdir().expect("tmp");
        let chr = tmp.path().join("a/b/urandom");
        mknod_char(&chr, 1, 9);
        let meta = std::fs::metadata(&chr).expect("char node");
        assert!(meta.file_type().is_char_device());
        assert_eq!(meta.rdev(), makedev(1, 9));
        assert_eq!(meta.mode() & 0o7777, 0o666);
        let blk = tmp.path().join("loop0");
        mknod_block(&blk, 7, 0);
        let meta = std::fs::metadata(&blk).expect("block node");
        assert!(meta.file_type().is_block_device());
        assert_eq!(meta.rdev(), makedev(7, 0));
        assert_eq!(meta.mode() & 0o7777, 0o666);
    }
}
