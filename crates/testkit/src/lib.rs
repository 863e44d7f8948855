//! Helpers for berth's integration tests and benches: binaries built by this workspace
//! ([`bin_path`]), a real `berth-hostpath` plugin running in its own private mount namespace
//! ([`HostpathPlugin`], with a gRPC channel to it: [`HostpathPlugin::channel`]), a private mount
//! namespace that outlives the processes run in it ([`MountNamespace`]), bounded polling
//! ([`eventually`], [`assert_eventually!`]) instead of sleeps, clean-up of what an agent left
//! running, found by the mark in its environment ([`kill_marked`]), and device nodes
//! ([`mknod_char`], [`mknod_block`]).
//! Real etcd clusters on 127.0.0.1 (Debian's `etcd-server`, etcd 3.4): [`EtcdCluster`].
//! Container images built offline into a podman storage of a test's own: [`TestPodman`].
//! A fake Consul agent's ACL API (login with a JWT, token/self, logout): [`FakeConsul`].
//! A headless Chromium over WebDriver, for the web UI's tests: [`Browser`].
//!
//! Needs Linux, root, and util-linux's `unshare`, `nsenter` and `setpriv` on `PATH`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod browser;
mod consul;
mod devnode;
mod etcd;
mod images;
mod marks;
mod mountns;
mod plugin;

use std::{
    future::Future,
    path::{Path, PathBuf},
    time::Duration,
};

pub use browser::{BROWSER_SETUP_HINT, Browser, BrowserError, SeenRequest};
pub use consul::{
    CONSUL_AUDIENCE, CONSUL_AUTH_METHOD, FakeConsul, FakeConsulConfig, IssuedToken, JwksSource,
    LoginOutcome, LoginRecord, LogoutRecord,
};
pub use devnode::{mknod_block, mknod_char};
pub use etcd::{ETCD_READY_TIMEOUT, EtcdCluster, EtcdError, EtcdTls};
pub use images::{BUSYBOX, TestPodman};
pub use marks::{ALLOC_DIR_VAR, KILL_WAIT, kill_marked, kill_tasks_under};
pub use mountns::{MountNamespace, NAMESPACE_TIMEOUT};
pub use plugin::{HostpathPlugin, HostpathPluginBuilder, SpawnError, attached_loops_under};

/// How often [`eventually`] re-checks its condition.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// A command that runs `program` in its own private mount namespace
/// (`unshare -m --propagation private`), killed when the thread that spawned it dies
/// (`setpriv --pdeathsig KILL`). `unshare` execs, so the child's pid is `program`'s. Every mount
/// it makes lives and dies with it.
pub fn private_ns_command(program: &Path) -> std::process::Command {
    let mut cmd = std::process::Command::new("setpriv");
    cmd.args([
        "--pdeathsig",
        "KILL",
        "--",
        "unshare",
        "-m",
        "--propagation",
        "private",
        "--",
    ])
    .arg(program);
    cmd
}

/// Path of the binary `name` built by this workspace: `NEXTEST_BIN_EXE_<name>` (or
/// `CARGO_BIN_EXE_<name>`) when set, else the file next to the running test's directory
/// (`target/<profile>/deps/<test>` → `target/<profile>/<name>`).
///
/// # Panics
/// If the binary does not exist; the message says how to build it.
pub fn bin_path(name: &str) -> PathBuf {
    let underscored = name.replace('-', "_");
    for var in [
        format!("NEXTEST_BIN_EXE_{name}"),
        format!("NEXTEST_BIN_EXE_{underscored}"),
        format!("CARGO_BIN_EXE_{name}"),
    ] {
        if let Some(path) = std::env::var_os(&var) {
            return PathBuf::from(path);
        }
    }
    let exe = std::env::current_exe().expect("the path of the running test binary");
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "binary {name:?} not found at {}: build it first (`cargo build -p <its package>`), or \
         run the tests with cargo-nextest, which sets NEXTEST_BIN_EXE_{name}",
        path.display()
    );
    path
}

/// Polls `check` every [`POLL_INTERVAL`] until it returns true (then true) or `timeout` has
/// passed (then false). `check` runs at least once, and once more at the deadline.
pub async fn eventually<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return false;
        }
        tokio::time::sleep(POLL_INTERVAL.min(deadline - now)).await;
    }
}

/// Set in the copy of a test that [`in_own_mount_namespace`] runs.
const IN_OWN_NS: &str = "BERTH_TEST_IN_OWN_MOUNT_NS";

/// For a test that changes mount propagation in its own namespace: returns true when the test
/// already runs in a private mount namespace of its own. Otherwise runs the test named `name`
/// (its path in the test binary) again in one (`unshare -m --propagation private`, which
/// vanishes with it), fails unless that copy ran and passed, and returns false: the caller
/// then returns at once.
pub fn in_own_mount_namespace(name: &str) -> bool {
    if std::env::var_os(IN_OWN_NS).is_some() {
        return true;
    }
    let exe = std::env::current_exe().expect("current_exe");
    let out = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "--"])
        .arg(exe)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(IN_OWN_NS, "1")
        .output()
        .expect("running unshare (util-linux) as root");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "inner test failed:\n{text}");
    assert!(text.contains("1 passed"), "inner test did not run:\n{text}");
    false
}

/// Panics unless the async condition becomes true within the timeout:
/// `assert_eventually!(Duration::from_secs(5), || async { cond().await }, "what {}", x)`.
#[macro_export]
macro_rules! assert_eventually {
    ($timeout:expr, $check:expr $(,)?) => {
        $crate::assert_eventually!($timeout, $check, "condition")
    };
    ($timeout:expr, $check:expr, $($msg:tt)+) => {{
        let timeout: ::std::time::Duration = $timeout;
        if !$crate::eventually(timeout, $check).await {
            panic!("not true within {:?}: {}", timeout, format_args!($($msg)+));
        }
    }};
}

/// Size of the stack [`on_small_stack`] gives: a parser that recursed once per nesting level
/// would overflow it long before a depth of 200,000 (and abort the test).
pub const SMALL_STACK: usize = 256 * 1024;

/// Runs `f` on a thread with a [`SMALL_STACK`] and returns what it returns (a panic in it
/// fails the caller).
pub fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(SMALL_STACK)
        .spawn(f)
        .expect("thread")
        .join()
        .expect("no panic on the small stack")
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test]
    async fn eventually_stops_when_true_and_gives_up_at_deadline() {
        let calls = AtomicU32::new(0);
        let ok = eventually(Duration::from_secs(5), || async {
            calls.fetch_add(1, Ordering::SeqCst) >= 2
        })
        .await;
        assert!(ok);
        assert_eq!(calls.load(Ordering::SeqCst), 3);

        let start = tokio::time::Instant::now();
        assert!(!eventually(Duration::from_millis(50), || async { false }).await);
        assert!(start.elapsed() >= Duration::from_millis(50));
    }

    #[tokio::test]
    #[should_panic(expected = "not true within 30ms: flag 7")]
    async fn assert_eventually_panics_with_message() {
        assert_eventually!(Duration::from_millis(30), || async { false }, "flag {}", 7);
    }
}
