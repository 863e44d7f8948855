//! The limit on open files.

use std::io;

use nix::sys::resource::{Resource, getrlimit, rlim_t, setrlimit};

/// Where Linux keeps the ceiling of `RLIMIT_NOFILE`.
const NR_OPEN: &str = "/proc/sys/fs/nr_open";

/// Raises this process's soft limit on open files (`RLIMIT_NOFILE`) to its hard limit, and
/// never above it: raising the hard limit needs `CAP_SYS_RESOURCE`. Returns the soft limit
/// before and after; when it already is the hard limit, nothing changes. Call it at start-up,
/// before threads that open files run: the limit is the whole process's.
pub fn raise_nofile_limit() -> io::Result<(u64, u64)> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    // The kernel refuses a limit above fs.nr_open, which an unlimited hard limit would be.
    let target = if hard == rlim_t::MAX {
        read_nr_open()?.min(hard)
    } else {
        hard
    };
    if soft >= target {
        return Ok((soft, soft));
    }
    setrlimit(Resource::RLIMIT_NOFILE, target, hard)?;
    Ok((soft, target))
}

fn read_nr_open() -> io::Result<u64> {
    let text = std::fs::read_to_string(NR_OPEN)?;
    text.trim().parse().map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{NR_OPEN}: {text:?}: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raises_the_soft_limit_to_the_hard_one() {
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        let low = 256.min(hard);
        setrlimit(Resource::RLIMIT_NOFILE, low, hard).unwrap();
        let (before, after) = raise_nofile_limit().unwrap();
        assert_eq!(before, low);
        let (soft, hard_now) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        assert_eq!(after, soft, "the returned limit is the one in force");
        assert_eq!(hard_now, hard, "the hard limit is untouched");
        if hard != rlim_t::MAX {
            assert_eq!(soft, hard);
        }
        // Once raised, a second call changes nothing.
        assert_eq!(raise_nofile_limit().unwrap(), (soft, soft));
        assert_eq!(getrlimit(Resource::RLIMIT_NOFILE).unwrap(), (soft, hard));
    }
}
