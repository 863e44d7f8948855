//! The devices: the files directly in the configured directory (dot files and directories
//! left out), their health by permission string, as Go prints file modes; and Nomad's
//! attribute syntax (`4 GiB`, `true`, `1.5`).

use std::{
    os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

use berth_devices::attribute::Attribute;

/// One device: a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// Its id: the file name.
    pub id: String,
    /// The file.
    pub path: PathBuf,
    /// The file's permissions as Go prints them (`-rw-r--r--`).
    pub perm: String,
    /// The file's whole mode as Go prints it (`Dcrw-rw-rw-` for a character device).
    pub mode: String,
    /// Its size in bytes.
    pub size: u64,
    /// A character or block device node.
    pub node: bool,
}

/// The devices in `dir`, sorted by id.
pub fn list(dir: &Path) -> std::io::Result<Vec<Device>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let Some(id) = entry.file_name().to_str().map(str::to_string) else {
            tracing::warn!(file = ?entry.file_name(), "a file name that is not UTF-8 is not a device");
            continue;
        };
        if id.starts_with('.') {
            continue;
        }
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
            // Removed meanwhile.
            continue;
        };
        if meta.is_dir() {
            continue;
        }
        let ft = meta.file_type();
        out.push(Device {
            path: std::path::absolute(entry.path())?,
            perm: perm_string(meta.permissions().mode()),
            mode: mode_string(&meta),
            size: meta.size(),
            node: ft.is_char_device() || ft.is_block_device(),
            id,
        });
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

/// Go's `FileMode.Perm().String()`: `-` and the nine permission bits.
pub fn perm_string(mode: u32) -> String {
    let mut s = String::from("-");
    push_rwx(&mut s, mode);
    s
}

fn push_rwx(s: &mut String, mode: u32) {
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if mode & (1 << (8 - i)) != 0 { c } else { '-' });
    }
}

/// Go's `FileMode.String()`: type and special letters (in Go's order `dalTLDpSugct?`, or `-`),
/// then the permission bits.
pub fn mode_string(meta: &std::fs::Metadata) -> String {
    let ft = meta.file_type();
    let mode = meta.mode();
    let mut s = String::new();
    let flags = [
        ('d', ft.is_dir()),
        ('L', ft.is_symlink()),
        ('D', ft.is_char_device() || ft.is_block_device()),
        ('p', ft.is_fifo()),
        ('S', ft.is_socket()),
        ('u', mode & 0o4000 != 0),
        ('g', mode & 0o2000 != 0),
        ('c', ft.is_char_device()),
        ('t', mode & 0o1000 != 0),
    ];
    for (c, on) in flags {
        if on {
            s.push(c);
        }
    }
    if s.is_empty() {
        s.push('-');
    }
    push_rwx(&mut s, mode);
    s
}

/// The units Nomad knows, longest first (so `KiB/s` wins over `s`-less ones).
const UNITS: &[&str] = &[
    "KiB/s", "MiB/s", "GiB/s", "TiB/s", "PiB/s", "EiB/s", "kB/s", "KB/s", "MB/s", "GB/s", "TB/s",
    "PB/s", "EB/s", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "MHz", "GHz", "kB", "KB", "MB", "GB",
    "TB", "PB", "EB", "mW", "kW", "MW", "GW", "W",
];

/// Parses a value as Nomad parses attributes: a number with an optional known unit suffix
/// (`4 GiB` → int 4 GiB, `1.5GHz` → float), else a bool (`true`, `F`…), else the string.
pub fn parse_attribute(input: &str) -> Attribute {
    if input.is_empty() {
        return Attribute::string("");
    }
    let mut unit = "";
    let mut numeric = input;
    if input.chars().last().is_some_and(char::is_alphabetic)
        && let Some(u) = UNITS.iter().find(|u| input.ends_with(*u))
    {
        unit = u;
        numeric = input[..input.len() - u.len()].trim();
    }
    if let Ok(i) = numeric.parse::<i64>() {
        return Attribute::int(i, unit);
    }
    if let Ok(x) = numeric.parse::<f64>() {
        return Attribute::float(x, unit);
    }
    match input {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Attribute::bool(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Attribute::bool(false),
        _ => Attribute::string(input),
    }
}

/// Parses a Go duration (`5s`, `100ms`, `1m30s`, `1.5h`); `None` when it is not one or is
/// not positive.
pub fn parse_go_duration(s: &str) -> Option<std::time::Duration> {
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    if rest == "0" {
        return None;
    }
    if rest.is_empty() {
        return None;
    }
    let mut nanos = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, after) = rest.split_at(num_len);
        if num.is_empty() || num == "." {
            return None;
        }
        let value: f64 = num.parse().ok()?;
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let scale = match unit {
            "ns" => 1.0,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        nanos += value * scale;
        rest = next;
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    (1.0..1e19)
        .contains(&nanos)
        .then(|| std::time::Duration::from_nanos(nanos as u64))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn attributes_parse_as_nomad_does() {
        assert_eq!(parse_attribute("4 GiB"), Attribute::int(4, "GiB"));
        assert_eq!(parse_attribute("1.5GHz"), Attribute::float(1.5, "GHz"));
        assert_eq!(parse_attribute("10 MB/s"), Attribute::int(10, "MB/s"));
        assert_eq!(parse_attribute("250W"), Attribute::int(250, "W"));
        assert_eq!(parse_attribute("true"), Attribute::bool(true));
        assert_eq!(parse_attribute("1.5"), Attribute::float(1.5, ""));
        assert_eq!(parse_attribute("7"), Attribute::int(7, ""));
        assert_eq!(parse_attribute("Tesla K80"), Attribute::string("Tesla K80"));
        assert_eq!(parse_attribute("4 apples"), Attribute::string("4 apples"));
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("5s"), Some(Duration::from_secs(5)));
        assert_eq!(parse_go_duration("100ms"), Some(Duration::from_millis(100)));
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("1.5h"), Some(Duration::from_secs(5400)));
        for bad in ["", "0", "5", "s", "5x", "-1s", "1.2.3s"] {
            assert_eq!(parse_go_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn modes_print_as_go_prints_them() {
        assert_eq!(perm_string(0o777), "-rwxrwxrwx");
        assert_eq!(perm_string(0o100644), "-rw-r--r--");
        let null = std::fs::metadata("/dev/null").unwrap();
        assert_eq!(mode_string(&null), "Dcrw-rw-rw-");
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, b"abc").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert_eq!(mode_string(&std::fs::metadata(&f).unwrap()), "-rw-r-----");
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join(".hidden"), b"").unwrap();
        let listed = list(dir.path()).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].id, "f");
        assert_eq!(listed[0].size, 3);
        assert!(!listed[0].node);
    }
}
