//! The root of an `exec` task: its directory on the host laid out as Nomad's chroot, every mount
//! point made before anything is mounted, without following a symlink a task may have left.

use std::{
    collections::BTreeMap,
    fs, io,
    os::unix::fs::{DirBuilderExt as _, PermissionsExt as _},
    path::{Component, Path, PathBuf},
};

/// Directories of the root that get mounts of their own (`/alloc`, `/secrets`, `/proc`,
/// `/dev`, `/sys`) or are the task's (`/local`, `/tmp`).
pub(crate) const LAYOUT: [&str; 7] = ["alloc", "local", "secrets", "tmp", "proc", "dev", "sys"];

/// Who a task runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunAs {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// Resolves a user name (from the host's passwd) or a numeric uid.
pub(crate) fn resolve_user(user: &str) -> Result<RunAs, String> {
    use nix::unistd::{Gid, Uid, User};
    let found = match user.parse::<u32>() {
        Ok(uid) => User::from_uid(Uid::from_raw(uid)).map_err(|e| e.to_string())?,
        Err(_) => User::from_name(user).map_err(|e| e.to_string())?,
    };
    match found {
        Some(u) => {
            let name = std::ffi::CString::new(u.name.clone()).map_err(|e| e.to_string())?;
            let groups = nix::unistd::getgrouplist(&name, u.gid)
                .map(|g| g.into_iter().map(Gid::as_raw).collect())
                .unwrap_or_else(|_| vec![u.gid.as_raw()]);
            Ok(RunAs {
                uid: u.uid.as_raw(),
                gid: u.gid.as_raw(),
                groups,
            })
        }
        // A uid without a passwd entry runs with the same number as its group.
        None => match user.parse::<u32>() {
            Ok(uid) => Ok(RunAs {
                uid,
                gid: uid,
                groups: vec![uid],
            }),
            Err(_) => Err(format!("no user {user:?} on this host")),
        },
    }
}

/// `rel` (absolute, inside the root) as a path under `root`.
pub(crate) fn inside(root: &Path, rel: &Path) -> PathBuf {
    let mut out = root.to_path_buf();
    for c in rel.components() {
        if let Component::Normal(p) = c {
            out.push(p);
        }
    }
    out
}

/// Makes `rel` under `root` (a directory, or an empty file when `file`), and every missing
/// parent, refusing a symlink or a non-directory on the way: a task may have left anything in
/// its root, and a mount on a symlink would land outside it.
pub(crate) fn make_point(root: &Path, rel: &Path, file: bool) -> io::Result<PathBuf> {
    let parts: Vec<_> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(p) => Some(p.to_owned()),
            _ => None,
        })
        .collect();
    let mut at = root.to_path_buf();
    for (i, p) in parts.iter().enumerate() {
        at.push(p);
        let last = i + 1 == parts.len();
        match fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(io::Error::other(format!("{} is a symlink", at.display())));
            }
            Ok(m) if last && file => {
                if m.is_dir() {
                    return Err(io::Error::other(format!(
                        "{} is a directory, the source a file",
                        at.display()
                    )));
                }
            }
            Ok(m) if !m.is_dir() => {
                return Err(io::Error::other(format!(
                    "{} is not a directory",
                    at.display()
                )));
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if last && file {
                    fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(&at)?;
                } else {
                    fs::DirBuilder::new().mode(0o755).create(&at)?;
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(at)
}

/// Lays out the root: walkable by every user, `local/` owned by the task's user, `tmp/`
/// 1777, `secrets/` 0700, and the other mount points. `chroot_env` mount points are made for
/// the sources that exist; the entries kept are returned.
pub(crate) fn prepare(
    root: &Path,
    who: &RunAs,
    chroot_env: &BTreeMap<PathBuf, PathBuf>,
) -> io::Result<Vec<(PathBuf, PathBuf)>> {
    fs::create_dir_all(root)?;
    fs::set_permissions(root, fs::Permissions::from_mode(0o755))?;
    for d in LAYOUT {
        make_point(root, Path::new(d), false)?;
    }
    let local = root.join("local");
    std::os::unix::fs::lchown(&local, Some(who.uid), Some(who.gid))?;
    fs::set_permissions(root.join("tmp"), fs::Permissions::from_mode(0o1777))?;
    fs::set_permissions(root.join("secrets"), fs::Permissions::from_mode(0o700))?;
    let mut kept = Vec::new();
    for (src, dst) in chroot_env {
        let Ok(meta) = fs::metadata(src) else {
            continue;
        };
        make_point(root, dst, !meta.is_dir())?;
        kept.push((src.clone(), dst.clone()));
    }
    Ok(kept)
}

/// Where a path of the root will be on the host once `binds` (source, path in the root) are
/// mounted: under the deepest bind that holds it, else in the root's directory.
fn host_path(root: &Path, binds: &[(PathBuf, PathBuf)], p: &Path) -> PathBuf {
    binds
        .iter()
        .filter(|(_, dst)| p.starts_with(dst))
        .max_by_key(|(_, dst)| dst.components().count())
        .map(|(src, dst)| src.join(p.strip_prefix(dst).unwrap_or(p)))
        .unwrap_or_else(|| inside(root, p))
}

/// Whether `command` can be found in the root (with `binds` mounted): an absolute path, a path
/// relative to `workdir`, or a name in one of `path`'s directories.
pub(crate) fn command_exists(
    root: &Path,
    binds: &[(PathBuf, PathBuf)],
    command: &str,
    path: &str,
    workdir: &Path,
) -> bool {
    let is_exe = |p: &Path| {
        let p = host_path(root, binds, p);
        fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if command.starts_with('/') {
        return is_exe(Path::new(command));
    }
    if command.contains('/') {
        return is_exe(&workdir.join(command));
    }
    path.split(':')
        .filter(|d| d.starts_with('/'))
        .any(|d| is_exe(&Path::new(d).join(command)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_never_follow_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        fs::create_dir(&root).unwrap();
        let made = make_point(&root, Path::new("/a/b/c"), false).unwrap();
        assert!(made.is_dir());
        make_point(&root, Path::new("/etc/resolv.conf"), true).unwrap();
        assert!(root.join("etc/resolv.conf").is_file());
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        let e = make_point(&root, Path::new("/link/x"), false).unwrap_err();
        assert!(e.to_string().contains("is a symlink"), "{e}");
        assert!(!outside.join("x").exists());
        assert_eq!(inside(&root, Path::new("/a/./b")), root.join("a/b"));
    }

    #[test]
    fn users_resolve_by_name_and_number() {
        let root = resolve_user("root").unwrap();
        assert_eq!((root.uid, root.gid), (0, 0));
        assert_eq!(resolve_user("0").unwrap().uid, 0);
        assert!(resolve_user("no-such-user-here").is_err());
        assert_eq!(resolve_user("4242").unwrap().gid, 4242);
    }
}
