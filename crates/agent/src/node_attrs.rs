//! The node's attributes, as Nomad's fingerprinters name them (`attr.*` in a job): found once
//! at start from `/proc` and `/etc/os-release`. Driver attributes (`driver.<name>`…) are added
//! when a job is placed, from the drivers' latest fingerprints.

use std::{collections::BTreeMap, path::Path};

/// `unique.hostname`, `kernel.name`, `kernel.version`, `cpu.arch`, `cpu.numcores`,
/// `memory.totalbytes`, `os.name`, `os.version`: those the machine tells; a fact it does not
/// tell is left out (a job naming it is refused with the attribute's name).
pub fn host_attributes(hostname: &str) -> BTreeMap<String, String> {
    let mut attrs = BTreeMap::new();
    let mut put = |k: &str, v: Option<String>| {
        if let Some(v) = v.filter(|v| !v.is_empty()) {
            attrs.insert(k.to_owned(), v);
        }
    };
    put("unique.hostname", Some(hostname.to_owned()));
    put(
        "kernel.name",
        read_trimmed("/proc/sys/kernel/ostype").map(|s| s.to_lowercase()),
    );
    put("kernel.version", read_trimmed("/proc/sys/kernel/osrelease"));
    put("cpu.arch", Some(go_arch(std::env::consts::ARCH).to_owned()));
    put(
        "cpu.numcores",
        std::thread::available_parallelism()
            .ok()
            .map(|n| n.to_string()),
    );
    put(
        "memory.totalbytes",
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| mem_total_bytes(&m))
            .map(|b| b.to_string()),
    );
    if let Some(release) = std::fs::read_to_string(Path::new("/etc/os-release"))
        .ok()
        .or_else(|| std::fs::read_to_string("/usr/lib/os-release").ok())
    {
        put("os.name", os_release(&release, "ID"));
        put("os.version", os_release(&release, "VERSION_ID"));
    }
    attrs
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

/// The architecture as Go names it (Nomad's `attr.cpu.arch` is Go's `GOARCH`).
fn go_arch(rust: &str) -> &str {
    match rust {
        "x86_64" => "amd64",
        "x86" => "386",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        "riscv64" => "riscv64",
        other => other,
    }
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn mem_total_bytes(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// A key of os-release(5), unquoted.
fn os_release(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches(['"', '\'']).to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers_read_what_linux_writes() {
        assert_eq!(
            mem_total_bytes("MemTotal:       24576000 kB\nMemFree: 1 kB\n"),
            Some(24_576_000 * 1024)
        );
        assert_eq!(mem_total_bytes("nothing"), None);
        let rel = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\nVERSION_ID=\"12\"\n";
        assert_eq!(os_release(rel, "ID").as_deref(), Some("debian"));
        assert_eq!(os_release(rel, "VERSION_ID").as_deref(), Some("12"));
        assert_eq!(os_release(rel, "NAME"), None);
        assert_eq!(go_arch("x86_64"), "amd64");
        assert_eq!(go_arch("aarch64"), "arm64");
    }

    #[test]
    fn this_machine_has_the_basics() {
        let a = host_attributes("h1");
        assert_eq!(a["unique.hostname"], "h1");
        assert_eq!(a["kernel.name"], "linux");
        assert!(
            a.contains_key("cpu.arch") && a.contains_key("kernel.version"),
            "{a:?}"
        );
    }
}
