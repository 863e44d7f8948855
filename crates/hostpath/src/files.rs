//! Directory trees: volume and snapshot directories, copies between them, usage walks.
//! Everything here blocks; callers run it on the blocking pool.

use std::{
    fs, io,
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

/// Mode of a volume's root directory: any workload user may write to it, as with other
/// hostpath drivers.
pub(crate) const VOLUME_DIR_MODE: u32 = 0o777;

/// A filesystem operation failed.
#[derive(Debug, thiserror::Error)]
#[error("{action} {}", path.display())]
pub(crate) struct FsError {
    pub action: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

/// Wraps an io error of `action` on `path`.
pub(crate) fn at<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> FsError + 'a {
    move |source| FsError {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// Creates `dir/<name>` with the content of `source` (if any), all or nothing: the tree is
/// built in `dir/.new-<name>` and renamed into place. A leftover `dir/<name>` (no record points
/// at it) is replaced.
pub(crate) fn create_tree(
    dir: &Path,
    name: &str,
    source: Option<&Path>,
    mode: u32,
) -> Result<(), FsError> {
    let temp = dir.join(format!(".new-{name}"));
    let target = dir.join(name);
    remove_tree(&temp)?;
    fs::create_dir(&temp).map_err(at("creating", &temp))?;
    if let Some(source) = source {
        copy_contents(source, &temp)?;
    }
    fs::set_permissions(&temp, fs::Permissions::from_mode(mode))
        .map_err(at("setting permissions of", &temp))?;
    remove_tree(&target)?;
    fs::rename(&temp, &target).map_err(at("renaming into place", &target))?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(at("syncing", dir))
}

/// Removes `dir/<name>` and its content, all or nothing as far as readers of `dir/<name>` can
/// tell: it is renamed to `dir/.del-<name>` first. Missing is fine.
pub(crate) fn delete_tree(dir: &Path, name: &str) -> Result<(), FsError> {
    let target = dir.join(name);
    let doomed = dir.join(format!(".del-{name}"));
    match fs::rename(&target, &doomed) {
        Ok(()) => remove_tree(&doomed),
        Err(e) if e.kind() == io::ErrorKind::NotFound => remove_tree(&doomed),
        Err(e) => Err(at("renaming for deletion", &target)(e)),
    }
}

/// Removes leftovers of interrupted [`create_tree`] and [`delete_tree`] calls (and of image
/// creations, named the same way) in `dir`.
pub(crate) fn remove_leftovers(dir: &Path) -> Result<(), FsError> {
    for entry in fs::read_dir(dir).map_err(at("listing", dir))? {
        let entry = entry.map_err(at("listing", dir))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(".new-") || name.starts_with(".del-") {
            tracing::info!(path = %entry.path().display(), "removing a leftover");
            remove_tree(&entry.path())?;
        }
    }
    Ok(())
}

/// `rm -rf`: removes a directory tree (not following symlinks) or a file; missing is fine.
pub(crate) fn remove_tree(path: &Path) -> Result<(), FsError> {
    let removed = match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) => Err(e),
    };
    match removed {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(at("removing", path)(e)),
        _ => Ok(()),
    }
}

/// Copies the content of directory `from` into the existing directory `to`: directories, files
/// (with their permissions) and symlinks (as links). Sockets, fifos and devices are skipped.
pub(crate) fn copy_contents(from: &Path, to: &Path) -> Result<(), FsError> {
    for entry in fs::read_dir(from).map_err(at("listing", from))? {
        let entry = entry.map_err(at("listing", from))?;
        let src = entry.path();
        let dst = to.join(entry.file_name());
        let kind = entry.file_type().map_err(at("inspecting", &src))?;
        if kind.is_dir() {
            fs::create_dir(&dst).map_err(at("creating", &dst))?;
            copy_contents(&src, &dst)?;
            let perms = fs::metadata(&src)
                .map_err(at("inspecting", &src))?
                .permissions();
            fs::set_permissions(&dst, perms).map_err(at("setting permissions of", &dst))?;
        } else if kind.is_file() {
            fs::copy(&src, &dst).map_err(at("copying", &src))?;
        } else if kind.is_symlink() {
            let link = fs::read_link(&src).map_err(at("reading link", &src))?;
            std::os::unix::fs::symlink(&link, &dst).map_err(at("creating link", &dst))?;
        }
    }
    Ok(())
}

/// Bytes in regular files and number of entries under `root` (itself included), not crossing
/// into other filesystems and not following symlinks.
pub(crate) fn tree_usage(root: &Path) -> Result<(u64, u64), FsError> {
    let dev = fs::symlink_metadata(root)
        .map_err(at("inspecting", root))?
        .dev();
    let mut bytes = 0;
    let mut inodes = 1;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).map_err(at("listing", &dir))? {
            let entry = entry.map_err(at("listing", &dir))?;
            let meta = match entry.metadata() {
                Ok(m) => m,
                // Removed while walking.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(at("inspecting", &entry.path())(e)),
            };
            if meta.dev() != dev {
                continue;
            }
            inodes += 1;
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() {
                bytes += meta.len();
            }
        }
    }
    Ok((bytes, inodes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_copy_usage_delete() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("src");
        fs::create_dir_all(src.join("sub")).expect("mkdir");
        fs::write(src.join("a"), b"hello").expect("write");
        fs::write(src.join("sub/b"), b"world!").expect("write");
        std::os::unix::fs::symlink("a", src.join("link")).expect("symlink");

        let vols = dir.path().join("volumes");
        fs::create_dir(&vols).expect("mkdir");
        create_tree(&vols, "v1", Some(&src), VOLUME_DIR_MODE).expect("create");
        let v1 = vols.join("v1");
        assert_eq!(fs::read(v1.join("sub/b")).expect("read"), b"world!");
        assert_eq!(
            fs::read_link(v1.join("link")).expect("link"),
            Path::new("a")
        );
        let mode = fs::metadata(&v1).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, VOLUME_DIR_MODE);
        assert_eq!(tree_usage(&v1).expect("usage"), (11, 5));

        // leftovers of interrupted creates are cleaned up, directories and files
        fs::create_dir(vols.join(".new-v2")).expect("mkdir");
        fs::write(vols.join(".new-v3.img"), b"x").expect("write");
        remove_leftovers(&vols).expect("cleanup");
        assert!(!vols.join(".new-v2").exists());
        assert!(!vols.join(".new-v3.img").exists());
        assert!(v1.exists());

        delete_tree(&vols, "v1").expect("delete");
        delete_tree(&vols, "v1").expect("delete again");
        assert_eq!(fs::read_dir(&vols).expect("list").count(), 0);
    }
}
