//! The agent's files are private whatever the umask: the data dir and every directory in it
//! 0700; the store (volume secrets, mount flags), the plugin log, pid file and lock file 0600;
//! and files or directories found with wider modes are narrowed at start.

mod agent_support;

use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    time::Duration,
};

use agent_support::AgentProcess;
use nix::sys::stat::{Mode, umask};

const PLUGIN: &str = "hp";

/// A berth-hostpath the agent runs; its state dir is outside the data dir (its files are the
/// plugin's business).
fn config() -> String {
    agent_support::hostpath_config(PLUGIN, &[])
}

/// Starts an agent with umask 000: the agent inherits it from this process (the test binary
/// runs nothing else that cares), so any mode left to the umask comes out world-writable.
async fn start_with_open_umask() -> AgentProcess {
    umask(Mode::empty());
    let agent = AgentProcess::start(&config()).await;
    agent
        .wait_plugin(PLUGIN, Duration::from_secs(20), |p| p.health.healthy)
        .await;
    agent
}

/// Waits until the pid file names a live process other than `stale` (it is written right after
/// the spawn, which may be after the plugin already answers).
async fn wait_pid_recorded(agent: &AgentProcess, stale: &str) {
    let pid_file = logs(agent).join(format!("plugin-{PLUGIN}.pid"));
    berth_testkit::assert_eventually!(
        Duration::from_secs(20),
        || async {
            std::fs::read_to_string(&pid_file).is_ok_and(|t| {
                t.trim() != stale && t.trim().parse().is_ok_and(agent_support::alive)
            })
        },
        "the pid file {} names the running plugin",
        pid_file.display()
    );
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

fn logs(agent: &AgentProcess) -> PathBuf {
    agent.data_dir.join("logs")
}

/// The agent's own files that must be 0600.
fn private_files(agent: &AgentProcess) -> Vec<PathBuf> {
    vec![
        agent.data_dir.join("state.redb"),
        logs(agent).join(format!("plugin-{PLUGIN}.log.0")),
        logs(agent).join(format!(".plugin-{PLUGIN}.log.lock")),
        logs(agent).join(format!("plugin-{PLUGIN}.pid")),
        logs(agent).join(format!("plugin-{PLUGIN}.lock")),
    ]
}

/// Every directory (the data dir included) and every regular file under the data dir, with
/// its mode.
fn walk(dir: &Path, out: &mut Vec<(PathBuf, bool, u32)>) {
    out.push((dir.to_path_buf(), true, mode(dir)));
    for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let path = entry.path();
        let ty = entry.file_type().expect("file type");
        if ty.is_dir() {
            walk(&path, out);
        } else if ty.is_file() {
            out.push((path.clone(), false, mode(&path)));
        }
    }
}

fn assert_private(agent: &AgentProcess) {
    for file in private_files(agent) {
        assert_eq!(format!("{:o}", mode(&file)), "600", "{}", file.display());
    }
    let mut entries = Vec::new();
    walk(&agent.data_dir, &mut entries);
    assert!(entries.iter().filter(|(_, dir, _)| *dir).count() >= 4);
    for (path, dir, mode) in entries {
        let want = if dir { "700" } else { "600" };
        assert_eq!(format!("{mode:o}"), want, "{}", path.display());
    }
}

#[tokio::test]
async fn files_and_directories_are_private_under_an_open_umask() {
    let mut agent = start_with_open_umask().await;
    wait_pid_recorded(&agent, "").await;
    assert_private(&agent);
    let status = agent.terminate().await;
    assert!(status.success(), "{status}");
}

#[tokio::test]
async fn wider_modes_found_at_start_are_narrowed() {
    let mut agent = start_with_open_umask().await;
    let status = agent.terminate().await;
    assert!(status.success(), "{status}");

    let wide = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    };
    wide(&agent.data_dir, 0o755);
    wide(&logs(&agent), 0o755);
    wide(&agent.data_dir.join("state.redb"), 0o644);
    wide(&logs(&agent).join(format!("plugin-{PLUGIN}.log.0")), 0o644);
    wide(&logs(&agent).join(format!("plugin-{PLUGIN}.lock")), 0o666);
    // A pid file left by an agent that died, with a wide mode.
    std::fs::write(
        logs(&agent).join(format!("plugin-{PLUGIN}.pid")),
        "999999999\n",
    )
    .expect("pid file");
    wide(&logs(&agent).join(format!("plugin-{PLUGIN}.pid")), 0o644);

    agent.respawn();
    agent.wait_ready().await;
    agent
        .wait_plugin(PLUGIN, Duration::from_secs(20), |p| p.health.healthy)
        .await;
    wait_pid_recorded(&agent, "999999999").await;
    assert_private(&agent);
    let status = agent.terminate().await;
    assert!(status.success(), "{status}");
}
