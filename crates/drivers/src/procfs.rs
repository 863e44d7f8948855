//! The few `/proc` files the drivers read.

use std::{fs, io, path::Path, sync::OnceLock};

use nix::unistd::{SysconfVar, sysconf};

/// The fields of `/proc/<pid>/stat` the drivers use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcStat {
    /// Field 3: `R`, `S`, `D`, `Z`, `X`…
    pub state: char,
    /// Field 5.
    pub pgrp: u32,
    /// Field 14, clock ticks.
    pub utime: u64,
    /// Field 15, clock ticks.
    pub stime: u64,
    /// Field 22, clock ticks after boot.
    pub start_ticks: u64,
    /// Field 24, pages.
    pub rss_pages: u64,
}

impl ProcStat {
    /// Whether the process has exited (a zombie waiting to be reaped, or dead).
    pub fn exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Parses a `/proc/<pid>/stat` line. The command name (field 2) may hold spaces and
/// parentheses, so fields are counted after its last `)`.
pub(crate) fn parse_stat(line: &str) -> Option<ProcStat> {
    let after = &line[line.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // fields[0] is field 3.
    let field = |n: usize| fields.get(n - 3).copied();
    let num = |n: usize| field(n)?.parse::<u64>().ok();
    Some(ProcStat {
        state: field(3)?.chars().next()?,
        pgrp: field(5)?.parse().ok()?,
        utime: num(14)?,
        stime: num(15)?,
        start_ticks: num(22)?,
        rss_pages: num(24)?,
    })
}

/// Reads `/proc/<pid>/stat`; `Ok(None)` when there is no such process.
pub(crate) fn read_stat(pid: u32) -> io::Result<Option<ProcStat>> {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(line) => parse_stat(&line).map(Some).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unexpected /proc/{pid}/stat: {line:?}"),
            )
        }),
        // ESRCH shows up when the process exits while the file is read.
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc_esrch()) => {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn libc_esrch() -> i32 {
    nix::errno::Errno::ESRCH as i32
}

/// Whether `pid` is alive and is the process that started at `start_ticks`.
pub(crate) fn is_same_live_process(pid: u32, start_ticks: u64) -> bool {
    matches!(read_stat(pid), Ok(Some(s)) if s.start_ticks == start_ticks && !s.exited())
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`).
pub(crate) fn boot_id() -> io::Result<String> {
    Ok(fs::read_to_string("/proc/sys/kernel/random/boot_id")?
        .trim()
        .to_owned())
}

/// Clock ticks per second.
pub(crate) fn ticks_per_second() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    *TICKS.get_or_init(|| sysconf_or(SysconfVar::CLK_TCK, 100))
}

/// Bytes per page.
pub(crate) fn page_size() -> u64 {
    static PAGE: OnceLock<u64> = OnceLock::new();
    *PAGE.get_or_init(|| sysconf_or(SysconfVar::PAGE_SIZE, 4096))
}

fn sysconf_or(var: SysconfVar, default: u64) -> u64 {
    match sysconf(var) {
        Ok(Some(v)) if v > 0 => u64::try_from(v).unwrap_or(default),
        _ => default,
    }
}

/// Pids of the live processes in process group `pgid`.
pub(crate) fn group_members(pgid: u32) -> io::Result<Vec<u32>> {
    let mut pids = Vec::new();
    for entry in fs::read_dir("/proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Ok(Some(stat)) = read_stat(pid)
            && stat.pgrp == pgid
            && !stat.exited()
        {
            pids.push(pid);
        }
    }
    pids.sort_unstable();
    Ok(pids)
}

/// Pids listed in a cgroup's `cgroup.procs`.
pub(crate) fn cgroup_procs(cgroup: &Path) -> io::Result<Vec<u32>> {
    let text = fs::read_to_string(cgroup.join("cgroup.procs"))?;
    Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

/// CPU and memory of `pids` read now; a process that exits while it is read is skipped (so
/// the result's `pids` may be fewer, or none).
pub(crate) fn stats_of(pids: &[u32]) -> crate::task::TaskStats {
    let mut stats = crate::task::TaskStats {
        pids: Vec::with_capacity(pids.len()),
        cpu_user_ticks: 0,
        cpu_system_ticks: 0,
        ticks_per_second: ticks_per_second(),
        rss_bytes: 0,
        timestamp: std::time::SystemTime::now(),
    };
    for &pid in pids {
        let Ok(Some(stat)) = read_stat(pid) else {
            continue;
        };
        stats.pids.push(pid);
        stats.cpu_user_ticks += stat.utime;
        stats.cpu_system_ticks += stat.stime;
        stats.rss_bytes += stat.rss_pages * page_size();
    }
    stats
}

/// Looks `name` up in the agent's `PATH` (or takes it as is when it holds a `/`); only
/// executable regular files count.
pub(crate) fn find_program(name: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let is_exe = |p: &Path| {
        fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if name.contains('/') {
        let p = Path::new(name);
        return is_exe(p).then(|| p.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| is_exe(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_odd_command_names() {
        let line = "4242 (a) b) (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0 123456 \
                    1000 250 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        let s = parse_stat(line).expect("parses");
        assert_eq!(
            s,
            ProcStat {
                state: 'S',
                pgrp: 4242,
                utime: 7,
                stime: 3,
                start_ticks: 123456,
                rss_pages: 250,
            }
        );
        assert!(!s.exited());
        assert!(parse_stat("1 (x) S 1").is_none());
        assert!(parse_stat("garbage").is_none());
    }

    #[test]
    fn reads_own_stat() {
        let me = std::process::id();
        let s = read_stat(me).unwrap().expect("self");
        assert!(s.start_ticks > 0);
        assert!(is_same_live_process(me, s.start_ticks));
        assert!(!is_same_live_process(me, s.start_ticks + 1));
        assert_eq!(read_stat(u32::MAX).unwrap(), None);
        assert!(!boot_id().unwrap().is_empty());
        assert!(ticks_per_second() > 0);
        assert!(page_size() >= 4096);
        assert!(find_program("sh").is_some());
        assert!(find_program("berth-no-such-program").is_none());
    }
}
