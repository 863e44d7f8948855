//! Parser for `/proc/<pid>/mountinfo` (see `proc_pid_mountinfo(5)`).

use std::{
    ffi::OsString,
    fs,
    os::unix::ffi::OsStringExt as _,
    path::{Path, PathBuf},
};

use crate::mount::{MountEntry, MountError};

/// A line of a mountinfo file that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct MountinfoError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// Reads and parses a mountinfo file, e.g. `/proc/self/mountinfo` or `/proc/<pid>/mountinfo`.
pub fn read_mountinfo(path: &Path) -> Result<Vec<MountEntry>, MountError> {
    let data = fs::read(path).map_err(|source| MountError::ReadMountinfo {
        path: path.to_path_buf(),
        source,
    })?;
    parse_mountinfo(&data).map_err(|source| MountError::ParseMountinfo {
        path: path.to_path_buf(),
        source,
    })
}

/// Parses the content of a mountinfo file, in file order (a mount stacked on another comes
/// after it). Octal escapes (`\040` for a space, `\134` for a backslash…) are decoded.
pub fn parse_mountinfo(data: &[u8]) -> Result<Vec<MountEntry>, MountinfoError> {
    data.split(|&b| b == b'\n')
        .enumerate()
        .filter(|(_, line)| !line.is_empty())
        .map(|(i, line)| {
            parse_line(line).map_err(|reason| MountinfoError {
                line: i + 1,
                reason,
            })
        })
        .collect()
}

fn parse_line(line: &[u8]) -> Result<MountEntry, &'static str> {
    // id parent major:minor root mount-point options [optional…] - fstype source super-options
    let mut fields = line.split(|&b| b == b' ');
    let mut next = |what: &'static str| fields.next().ok_or(what);
    let mount_id = parse_u32(next("missing mount id")?).ok_or("mount id is not a number")?;
    let parent_id = parse_u32(next("missing parent id")?).ok_or("parent id is not a number")?;
    let _dev = next("missing major:minor")?;
    let root = path(next("missing root")?)?;
    let mount_point = path(next("missing mount point")?)?;
    let options = next("missing mount options")?;
    let read_only = options.split(|&b| b == b',').any(|o| o == b"ro");
    let mut shared = false;
    loop {
        // Optional fields (shared:N, master:N…) end at a lone "-".
        let field = next("missing '-' separator")?;
        if field == b"-" {
            break;
        }
        shared |= field.starts_with(b"shared:");
    }
    let fs_type = text(next("missing filesystem type")?)?;
    let source = text(next("missing mount source")?)?;
    let super_options = text(next("missing super options")?)?;
    Ok(MountEntry {
        mount_id,
        parent_id,
        root,
        mount_point,
        read_only,
        shared,
        fs_type,
        source,
        super_options,
    })
}

fn parse_u32(field: &[u8]) -> Option<u32> {
    std::str::from_utf8(field).ok()?.parse().ok()
}

fn path(field: &[u8]) -> Result<PathBuf, &'static str> {
    if field.is_empty() {
        return Err("empty path");
    }
    Ok(PathBuf::from(OsString::from_vec(unescape(field)?)))
}

fn text(field: &[u8]) -> Result<String, &'static str> {
    Ok(String::from_utf8_lossy(&unescape(field)?).into_owned())
}

/// Decodes `\ooo` octal escapes, which the kernel uses for space, tab, newline and backslash.
fn unescape(field: &[u8]) -> Result<Vec<u8>, &'static str> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        if field[i] == b'\\' {
            let digits = field.get(i + 1..i + 4).ok_or("truncated octal escape")?;
            let mut value: u32 = 0;
            for &d in digits {
                if !(b'0'..=b'7').contains(&d) {
                    return Err("bad octal escape");
                }
                value = value * 8 + u32::from(d - b'0');
            }
            out.push(u8::try_from(value).map_err(|_| "octal escape out of range")?);
            i += 4;
        } else {
            out.push(field[i]);
            i += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro
35 22 0:30 / /proc rw,nosuid,nodev,noexec,relatime shared:13 - proc proc rw
36 22 0:31 / /tmp rw,nosuid,nodev master:2 propagate_from:1 - tmpfs tmpfs rw,size=1024k
40 36 8:1 /var/lib/data\\040dir/vol /tmp/my\\040target ro,relatime - ext4 /dev/sda1 rw
41 22 0:32 /a\\134b\\011c\\012d /mnt rw - tmpfs my\\040src rw
";

    #[test]
    fn parses_fields_and_optional_fields() {
        let entries = parse_mountinfo(SAMPLE.as_bytes()).expect("parses");
        assert_eq!(entries.len(), 5);
        let root = &entries[0];
        assert_eq!((root.mount_id, root.parent_id), (22, 1));
        assert_eq!(root.root, Path::new("/"));
        assert_eq!(root.mount_point, Path::new("/"));
        assert!(!root.read_only);
        assert_eq!(root.fs_type, "ext4");
        assert_eq!(root.source, "/dev/sda1");
        assert_eq!(root.super_options, "rw,errors=remount-ro");
        assert_eq!(entries[2].super_options, "rw,size=1024k");
        // two optional fields before the separator
        assert_eq!(entries[2].fs_type, "tmpfs");
        assert_eq!(entries[2].mount_point, Path::new("/tmp"));
        // shared:N makes a peer; master:N alone (a slave) does not
        let shared: Vec<bool> = entries.iter().map(|e| e.shared).collect();
        assert_eq!(shared, [true, true, false, false, false]);
    }

    #[test]
    fn decodes_octal_escapes() {
        let entries = parse_mountinfo(SAMPLE.as_bytes()).expect("parses");
        let bind = &entries[3];
        assert_eq!(bind.root, Path::new("/var/lib/data dir/vol"));
        assert_eq!(bind.mount_point, Path::new("/tmp/my target"));
        assert!(bind.read_only, "ro in per-mount options");
        let odd = &entries[4];
        assert_eq!(odd.root, Path::new("/a\\b\tc\nd"));
        assert_eq!(odd.source, "my src");
    }

    #[test]
    fn read_only_comes_from_per_mount_options_only() {
        let line = b"50 22 0:40 / /x rw,relatime - ext4 /dev/sdb ro\n";
        let entries = parse_mountinfo(line).expect("parses");
        assert!(!entries[0].read_only);
    }

    #[test]
    fn rejects_malformed_lines_with_line_number() {
        let bad = "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n23 x 8:1 / /y rw - ext4 /dev/sda1 rw\n";
        let err = parse_mountinfo(bad.as_bytes()).unwrap_err();
        assert_eq!(
            err,
            MountinfoError {
                line: 2,
                reason: "parent id is not a number"
            }
        );

        let no_sep = b"22 1 8:1 / / rw shared:1 ext4 /dev/sda1 rw\n";
        assert_eq!(
            parse_mountinfo(no_sep).unwrap_err().reason,
            "missing '-' separator"
        );

        let bad_escape = b"22 1 8:1 /a\\091 / rw - ext4 /dev/sda1 rw\n";
        assert_eq!(
            parse_mountinfo(bad_escape).unwrap_err().reason,
            "bad octal escape"
        );

        let short_escape = b"22 1 8:1 /a\\04 / rw - ext4 /dev/sda1 rw\n";
        let err = parse_mountinfo(short_escape).unwrap_err();
        assert_eq!(err.reason, "truncated octal escape");

        let no_super = b"22 1 8:1 / / rw - ext4 /dev/sda1\n";
        assert_eq!(
            parse_mountinfo(no_super).unwrap_err().reason,
            "missing super options"
        );
    }

    #[test]
    fn reads_this_process_mountinfo() {
        let entries = read_mountinfo(Path::new("/proc/self/mountinfo")).expect("reads");
        assert!(entries.iter().any(|e| e.mount_point == Path::new("/")));
    }

    #[test]
    fn read_error_names_the_path() {
        let err = read_mountinfo(Path::new("/proc/self/no-such-file")).unwrap_err();
        assert!(err.to_string().contains("/proc/self/no-such-file"), "{err}");
    }
}
