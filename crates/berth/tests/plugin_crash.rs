//! A plugin the agent runs, with the agent killed (SIGKILL) at each moment of the plugin's start
//! and stop: the next agent on the same data dir stops whatever the dead one left, exactly one
//! berth-hostpath runs on the plugin's state dir, its socket answers, and none is left once the
//! agent stops. A stale pid file never gets an unrelated process killed.

mod agent_support;

use std::{
    os::unix::process::{CommandExt as _, ExitStatusExt as _},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use agent_support::AgentProcess;
use berth_agent::{supervisor, volumes::CRASH_ENV};
use berth_csi::{CsiClient, Endpoint};

const PLUGIN: &str = "hp";
const WAIT: Duration = Duration::from_secs(30);

/// A monolith berth-hostpath the agent runs, its state in `@TMP@/hp`.
fn config() -> String {
    agent_support::hostpath_config(PLUGIN, &["--enable-stage", "--enable-attach"])
}

fn statedir(agent: &AgentProcess) -> PathBuf {
    agent.tmp.path().join("hp")
}

fn socket(agent: &AgentProcess) -> PathBuf {
    agent
        .data_dir
        .join("csi")
        .join("plugins")
        .join(PLUGIN)
        .join("csi.sock")
}

fn pid_file(agent: &AgentProcess) -> PathBuf {
    agent
        .data_dir
        .join("logs")
        .join(format!("plugin-{PLUGIN}.pid"))
}

/// Pids of the live (not zombie) berth-hostpath processes whose `--statedir` is `dir`.
fn hostpaths_on(dir: &Path) -> Vec<i32> {
    let mut pids: Vec<i32> = std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| agent_support::alive(*pid))
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let is_hostpath = args
                .first()
                .and_then(|a| Path::new(std::str::from_utf8(a).ok()?).file_name())
                .is_some_and(|n| n == "berth-hostpath");
            is_hostpath
                && args
                    .windows(2)
                    .any(|w| w[0] == b"--statedir" && w[1] == dir.as_os_str().as_encoded_bytes())
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// Samples the number of berth-hostpath processes on a state dir until dropped, keeping the
/// largest count seen: two copies side by side, even briefly, show up as 2.
struct CopyCounter {
    max: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CopyCounter {
    fn start(dir: PathBuf) -> Self {
        let max = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (max, stop) = (Arc::clone(&max), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    max.fetch_max(hostpaths_on(&dir).len(), Ordering::Relaxed);
                    // Sampling, not synchronizing: a pause keeps the scan off a whole core.
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        Self {
            max,
            stop,
            thread: Some(thread),
        }
    }

    fn max(&self) -> usize {
        self.max.load(Ordering::Relaxed)
    }
}

impl Drop for CopyCounter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Kills every berth-hostpath on the state dir when dropped (a failed test leaves none).
struct KillHostpaths(PathBuf);

impl Drop for KillHostpaths {
    fn drop(&mut self) {
        for pid in hostpaths_on(&self.0) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

async fn socket_answers(socket: &Path) -> bool {
    let Ok(endpoint) = Endpoint::from_path(socket) else {
        return false;
    };
    let client = CsiClient::new(endpoint);
    tokio::time::timeout(Duration::from_secs(5), client.plugin_info())
        .await
        .is_ok_and(|r| r.is_ok())
}

/// Waits until exactly one berth-hostpath runs on the state dir, not one of `old`, and is
/// healthy; returns its pid.
async fn wait_one_new_copy(agent: &AgentProcess, old: &[i32]) -> i32 {
    let dir = statedir(agent);
    berth_testkit::assert_eventually!(
        WAIT,
        || async { matches!(hostpaths_on(&dir).as_slice(), [p] if !old.contains(p)) },
        "one new berth-hostpath on {} (old: {old:?}; now: {:?})\nagent log:\n{}",
        dir.display(),
        hostpaths_on(&dir),
        agent.log()
    );
    let [pid] = hostpaths_on(&dir)[..] else {
        panic!("more than one copy: {:?}", hostpaths_on(&dir));
    };
    agent.wait_plugin(PLUGIN, WAIT, |p| p.health.healthy).await;
    pid
}

/// How the test makes the agent reach the crash step once it runs with the hook armed.
#[derive(Debug, Clone, Copy)]
enum Reach {
    /// The step comes while the agent starts the plugin.
    Start,
    /// The test kills the plugin; the step comes when the agent sees it exit.
    KillPlugin,
    /// The test stops the agent (SIGTERM); the step comes while it stops the plugin.
    Terminate,
}

/// Starts an agent (its plugin then outlives a kill -9), kills it, starts one armed to die at
/// `step`, lets it die there, then starts a clean one: it must end up with exactly one copy,
/// answering, and leave none when stopped; two copies never run at once meanwhile.
async fn crash_at(step: &str, reach: Reach) {
    let mut agent = AgentProcess::start_in_namespace(&config()).await;
    let dir = statedir(&agent);
    let _cleanup = KillHostpaths(dir.clone());
    let counter = CopyCounter::start(dir.clone());
    let first = wait_one_new_copy(&agent, &[]).await;

    // The first copy is orphaned; the armed agent stops it and dies at `step`.
    agent.kill9();
    agent.set_env(CRASH_ENV, Some(step));
    agent.respawn();
    let status = match reach {
        Reach::Start => agent.wait_exit(WAIT).await,
        Reach::KillPlugin => {
            agent.wait_ready().await;
            let second = wait_one_new_copy(&agent, &[first]).await;
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(second),
                nix::sys::signal::Signal::SIGKILL,
            )
            .expect("kill the plugin");
            agent.wait_exit(WAIT).await
        }
        Reach::Terminate => {
            agent.wait_ready().await;
            wait_one_new_copy(&agent, &[first]).await;
            agent.terminate().await
        }
    };
    assert_eq!(
        status.signal(),
        Some(nix::sys::signal::Signal::SIGKILL as i32),
        "the agent dies at {step} ({status})\n{}",
        agent.log()
    );
    let left = hostpaths_on(&dir);
    assert!(!left.contains(&first), "the armed agent stopped the orphan");

    agent.set_env(CRASH_ENV, None);
    agent.respawn();
    agent.wait_ready().await;
    let last = wait_one_new_copy(&agent, &left).await;
    assert!(
        socket_answers(&socket(&agent)).await,
        "the socket of the copy that runs answers"
    );
    // Written right after the spawn, which may be after the copy already answers.
    let pid_path = pid_file(&agent);
    berth_testkit::assert_eventually!(
        WAIT,
        || async { std::fs::read_to_string(&pid_path).is_ok_and(|t| t.trim() == last.to_string()) },
        "the pid file names {last}"
    );
    assert_eq!(counter.max(), 1, "two copies ran side by side");

    let status = agent.terminate().await;
    assert!(status.success(), "{status}\n{}", agent.log());
    assert_eq!(
        hostpaths_on(&dir),
        Vec::<i32>::new(),
        "a copy outlives the agent"
    );
    assert!(
        !pid_file(&agent).exists(),
        "the pid file of a stopped plugin"
    );
    assert_eq!(counter.max(), 1, "two copies ran side by side");
}

#[tokio::test]
async fn killed_once_the_slot_is_claimed() {
    crash_at(supervisor::CLAIMED, Reach::Start).await;
}

#[tokio::test]
async fn killed_between_spawn_and_record() {
    crash_at(supervisor::SPAWNED, Reach::Start).await;
}

#[tokio::test]
async fn killed_once_the_pid_is_recorded() {
    crash_at(supervisor::RECORDED, Reach::Start).await;
}

#[tokio::test]
async fn killed_when_the_plugin_exited() {
    crash_at(supervisor::EXITED, Reach::KillPlugin).await;
}

#[tokio::test]
async fn killed_while_stopping_the_plugin() {
    crash_at(supervisor::STOPPING, Reach::Terminate).await;
}

/// A process that must survive: killed and reaped when dropped.
struct Bystander(std::process::Child);

impl Bystander {
    fn pid(&self) -> i32 {
        i32::try_from(self.0.id()).expect("pid")
    }

    fn running(&mut self) -> bool {
        self.0.try_wait().expect("try_wait").is_none()
    }
}

impl Drop for Bystander {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn a_stale_pid_file_never_gets_another_process_killed() {
    // A group leader, so that signalling "its" group would reach it too.
    let mut sleeper = Bystander(
        std::process::Command::new("sleep")
            .arg("600")
            .process_group(0)
            .spawn()
            .expect("sleep"),
    );
    // Another berth-hostpath (the same program as the agent's) on its own state dir.
    let mut foreign = berth_testkit::HostpathPlugin::builder().spawn().await;

    let mut agent = AgentProcess::start_in_namespace(&config()).await;
    let dir = statedir(&agent);
    let _cleanup = KillHostpaths(dir.clone());
    let first = wait_one_new_copy(&agent, &[]).await;
    for stale in [sleeper.pid(), i32::try_from(foreign.pid()).expect("pid")] {
        agent.kill9();
        let orphan = hostpaths_on(&dir);
        std::fs::write(pid_file(&agent), format!("{stale}\n")).expect("write pid file");
        agent.respawn();
        agent.wait_ready().await;
        wait_one_new_copy(&agent, &orphan).await;
    }
    assert!(!hostpaths_on(&dir).contains(&first));
    assert!(
        sleeper.running(),
        "the process a stale pid file named was killed"
    );
    assert!(
        foreign.is_running(),
        "the berth-hostpath a stale pid file named was killed"
    );
    let status = agent.terminate().await;
    assert!(status.success(), "{status}");
    assert!(sleeper.running());
    assert!(foreign.is_running());
    assert!(socket_answers(foreign.socket()).await);
}
