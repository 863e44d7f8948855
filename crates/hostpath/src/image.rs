//! Image files of `--backing=image`: a volume is a sparse file holding an ext4 filesystem,
//! made with e2fsprogs (`mkfs.ext4`, `dumpe2fs`, `e2fsck`, `resize2fs`) and copied sparsely
//! (`cp --sparse=always`). Everything here blocks; callers run it on the blocking pool.

use std::{
    fs::{self, File, OpenOptions},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use crate::files::{self, FsError, at};

/// Suffix of image file names: `<id>.img`.
pub(crate) const SUFFIX: &str = ".img";

/// The only filesystem type image-backed volumes have.
pub(crate) const FS_TYPE: &str = "ext4";

/// Mode of an image file.
const IMAGE_MODE: u32 = 0o600;

/// Most of a tool's message kept in an error.
const MAX_MESSAGE: usize = 1024;

/// An image operation failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ImageError {
    #[error(transparent)]
    Fs(#[from] FsError),
    /// A tool could not be run, or failed.
    #[error("{tool} on {}: {detail}", path.display())]
    Tool {
        tool: &'static str,
        path: PathBuf,
        detail: String,
    },
}

/// The file name of an image: `<id>.img`.
pub(crate) fn file_name(id: &str) -> String {
    format!("{id}{SUFFIX}")
}

/// Runs `tool` with `args` then `path`; its failure (exit status and stderr) as an error.
fn run(tool: &'static str, args: &[&str], path: &Path) -> Result<(), ImageError> {
    let failed = |detail| ImageError::Tool {
        tool,
        path: path.to_path_buf(),
        detail,
    };
    let out = Command::new(tool)
        .args(args)
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| failed(format!("cannot run it: {e} (is it installed?)")))?;
    if out.status.success() {
        return Ok(());
    }
    Err(failed(format!("{}: {}", out.status, message(&out.stderr))))
}

/// A tool's stderr, trimmed and bounded.
fn message(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let text = text.trim();
    match text.char_indices().nth(MAX_MESSAGE) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// Creates the image `dir/<name>` of `capacity` bytes, all or nothing: a copy of the image
/// `source` grown to `capacity` (its filesystem grows when it is next staged), or a new sparse
/// file with a fresh ext4 filesystem (no reserved blocks: all of it is the volume's). Built as
/// `dir/.new-<name>` and renamed into place; a leftover `dir/<name>` is replaced.
pub(crate) fn create(
    dir: &Path,
    name: &str,
    source: Option<&Path>,
    capacity: u64,
) -> Result<(), ImageError> {
    let temp = dir.join(format!(".new-{name}"));
    let target = dir.join(name);
    files::remove_tree(&temp)?;
    match source {
        Some(source) => copy_sparse(source, &temp)?,
        None => {
            File::create(&temp).map_err(at("creating", &temp))?;
        }
    }
    grow(&temp, capacity)?;
    if source.is_none() {
        run(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-m",
                "0",
                "-E",
                "lazy_itable_init=1,lazy_journal_init=1",
            ],
            &temp,
        )?;
    }
    fs::set_permissions(&temp, fs::Permissions::from_mode(IMAGE_MODE))
        .map_err(at("setting permissions of", &temp))?;
    File::open(&temp)
        .and_then(|f| f.sync_all())
        .map_err(at("syncing", &temp))?;
    files::remove_tree(&target)?;
    fs::rename(&temp, &target).map_err(at("renaming into place", &target))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(at("syncing", dir))?;
    Ok(())
}

/// Copies the image `from` to `to` (which must not exist), keeping holes.
fn copy_sparse(from: &Path, to: &Path) -> Result<(), ImageError> {
    let out = Command::new("cp")
        .arg("--sparse=always")
        .arg("--")
        .arg(from)
        .arg(to)
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(ImageError::Tool {
            tool: "cp",
            path: from.to_path_buf(),
            detail: format!("{}: {}", out.status, message(&out.stderr)),
        }),
        Err(e) => Err(ImageError::Tool {
            tool: "cp",
            path: from.to_path_buf(),
            detail: format!("cannot run it: {e}"),
        }),
    }
}

/// Makes the image file `path` at least `capacity` bytes long (the new part is a hole).
pub(crate) fn grow(path: &Path, capacity: u64) -> Result<(), ImageError> {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(at("opening", path))?;
    let len = file.metadata().map_err(at("inspecting", path))?.len();
    if len < capacity {
        file.set_len(capacity).map_err(at("growing", path))?;
        file.sync_all().map_err(at("syncing", path))?;
    }
    Ok(())
}

/// The size in bytes of the ext4 filesystem in `path` (an image or a device), from its
/// superblock.
fn fs_size(path: &Path) -> Result<u64, ImageError> {
    let out = Command::new("dumpe2fs")
        .arg("-h")
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| ImageError::Tool {
            tool: "dumpe2fs",
            path: path.to_path_buf(),
            detail: format!("cannot run it: {e} (is it installed?)"),
        })?;
    let failed = |detail: String| ImageError::Tool {
        tool: "dumpe2fs",
        path: path.to_path_buf(),
        detail,
    };
    if !out.status.success() {
        return Err(failed(format!("{}: {}", out.status, message(&out.stderr))));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    match (field("Block count:"), field("Block size:")) {
        (Some(count), Some(size)) => Ok(count.saturating_mul(size)),
        _ => Err(failed(
            "no block count or block size in its output".to_owned(),
        )),
    }
}

/// Grows the filesystem in the unmounted image `path` to fill the file, if it is smaller (after
/// ControllerExpandVolume, or in a volume made from a smaller source). Returns whether it grew.
pub(crate) fn fill_offline(path: &Path) -> Result<bool, ImageError> {
    let len = fs::metadata(path).map_err(at("inspecting", path))?.len();
    if fs_size(path)? >= len {
        return Ok(false);
    }
    // resize2fs wants a checked filesystem; e2fsck exits 1 when it fixed something.
    let checked = Command::new("e2fsck")
        .args(["-f", "-y"])
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| ImageError::Tool {
            tool: "e2fsck",
            path: path.to_path_buf(),
            detail: format!("cannot run it: {e} (is it installed?)"),
        })?;
    if !matches!(checked.status.code(), Some(0 | 1)) {
        return Err(ImageError::Tool {
            tool: "e2fsck",
            path: path.to_path_buf(),
            detail: format!("{}: {}", checked.status, message(&checked.stdout)),
        });
    }
    run("resize2fs", &[], path)?;
    Ok(true)
}

/// How growing a mounted filesystem went.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Online {
    /// It fills its device now (it may have already).
    Done,
    /// It needs growing, but the kernel only lets a process with CAP_SYS_RESOURCE grow a
    /// mounted ext4 filesystem, and this one does not have it.
    NotPermitted,
}

/// Grows the mounted filesystem on the loop device `device` to the size of its image: makes
/// the loop device take the file's new size (`losetup -c`), then runs `resize2fs` on it.
pub(crate) fn fill_online(device: &Path) -> Result<Online, ImageError> {
    run("losetup", &["-c"], device)?;
    let size = fs::read_to_string(sys_block(device).join("size"))
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(|sectors| sectors * 512);
    let Some(size) = size else {
        return Err(ImageError::Tool {
            tool: "losetup",
            path: device.to_path_buf(),
            detail: "the loop device's size cannot be read from sysfs".to_owned(),
        });
    };
    if fs_size(device)? >= size {
        return Ok(Online::Done);
    }
    if !has_cap_sys_resource() {
        return Ok(Online::NotPermitted);
    }
    run("resize2fs", &[], device)?;
    Ok(Online::Done)
}

/// `/sys/block/<name>` of a device path `/dev/<name>`.
fn sys_block(device: &Path) -> PathBuf {
    let name = device.file_name().unwrap_or(device.as_os_str());
    Path::new("/sys/block").join(name)
}

/// Whether this process has CAP_SYS_RESOURCE (capability 24) in its effective set.
fn has_cap_sys_resource() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_RESOURCE) != 0)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;

    use super::*;

    #[test]
    fn images_are_sparse_ext4_files_that_copies_and_growth_keep_sparse() {
        let dir = tempfile::tempdir().expect("tempdir");
        let capacity = 64 << 20;
        create(dir.path(), "a.img", None, capacity).expect("create");
        let a = dir.path().join("a.img");
        let meta = fs::metadata(&a).expect("stat");
        assert_eq!(meta.len(), capacity);
        assert!(
            meta.blocks() * 512 < capacity / 4,
            "sparse: {}",
            meta.blocks()
        );
        assert_eq!(meta.permissions().mode() & 0o777, IMAGE_MODE);
        assert_eq!(fs_size(&a).expect("dumpe2fs"), capacity);
        assert!(!fill_offline(&a).expect("nothing to do"));

        // A copy, bigger than its source: the filesystem grows to fill it when asked.
        create(dir.path(), "b.img", Some(&a), 2 * capacity).expect("copy");
        let b = dir.path().join("b.img");
        assert_eq!(fs::metadata(&b).expect("stat").len(), 2 * capacity);
        assert!(fs::metadata(&b).expect("stat").blocks() * 512 < capacity / 4);
        assert_eq!(fs_size(&b).expect("dumpe2fs"), capacity);
        assert!(fill_offline(&b).expect("grow"));
        assert_eq!(fs_size(&b).expect("dumpe2fs"), 2 * capacity);

        let names: Vec<_> = fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names.len(), 2, "no temporary file is left: {names:?}");
    }

    #[test]
    fn a_failing_tool_is_named_in_the_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let not_ext4 = dir.path().join("x.img");
        fs::write(&not_ext4, vec![0u8; 4096]).expect("write");
        let err = fill_offline(&not_ext4).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("dumpe2fs on ") && text.contains("x.img"),
            "{text}"
        );
    }
}
