//! Finding processes by their environment, and killing them: how a restarted agent finds a
//! task process it started but never recorded.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

/// Pids of the processes (other than this one) whose environment holds every `NAME=value`
/// of `vars`, read from `/proc`. Processes that vanish or cannot be read are skipped.
pub fn pids_with_env(vars: &[(&str, &str)]) -> Vec<i32> {
    pids_with_env_in(Path::new("/proc"), vars)
}

fn pids_with_env_in(proc: &Path, vars: &[(&str, &str)]) -> Vec<i32> {
    let wanted: Vec<Vec<u8>> = vars
        .iter()
        .map(|(k, v)| format!("{k}={v}").into_bytes())
        .collect();
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir(proc) else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| u32::try_from(*pid).ok() != Some(me))
        .filter(|pid| {
            std::fs::read(proc.join(pid.to_string()).join("environ")).is_ok_and(|env| {
                let set: Vec<&[u8]> = env.split(|b| *b == 0).collect();
                wanted.iter().all(|w| set.contains(&w.as_slice()))
            })
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// Whether `pid` is a live process (not a zombie).
pub fn is_alive(pid: i32) -> bool {
    kill(Pid::from_raw(pid), None).is_ok()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, r)| r.starts_with(" Z")))
}

/// Sends `SIGKILL` to every pid, then polls until they are gone or `timeout` passed; returns
/// those still alive. A process that is not this one's child stays a zombie only until its
/// parent reaps it, and counts as gone.
pub async fn kill_and_wait(pids: &[i32], timeout: Duration) -> Vec<i32> {
    for pid in pids {
        let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
    }
    let deadline = Instant::now() + timeout;
    loop {
        let alive: Vec<i32> = pids.iter().copied().filter(|p| is_alive(*p)).collect();
        if alive.is_empty() || Instant::now() >= deadline {
            return alive;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_processes_by_every_variable_only() {
        let dir = tempfile::tempdir().unwrap();
        let write = |pid: &str, env: &[u8]| {
            std::fs::create_dir_all(dir.path().join(pid)).unwrap();
            std::fs::write(dir.path().join(pid).join("environ"), env).unwrap();
        };
        write("10", b"A=1\0B=2\0");
        write("11", b"A=1\0B=22\0");
        write("12", b"B=2\0A=1\0C=3\0");
        write("13", b"XA=1\0B=2\0");
        std::fs::create_dir_all(dir.path().join("self")).unwrap();
        assert_eq!(
            pids_with_env_in(dir.path(), &[("A", "1"), ("B", "2")]),
            [10, 12]
        );
        assert!(pids_with_env_in(dir.path(), &[("A", "2")]).is_empty());
    }

    #[tokio::test]
    async fn kills_a_live_process() {
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .env("BERTH_PROCS_TEST", std::process::id().to_string())
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let me = std::process::id().to_string();
        assert_eq!(pids_with_env(&[("BERTH_PROCS_TEST", &me)]), [pid]);
        // Our own child: reap it as it dies so it does not linger as a zombie.
        let reaper = std::thread::spawn(move || child.wait());
        assert!(
            kill_and_wait(&[pid], Duration::from_secs(10))
                .await
                .is_empty()
        );
        reaper.join().unwrap().unwrap();
        assert!(pids_with_env(&[("BERTH_PROCS_TEST", &me)]).is_empty());
    }
}
