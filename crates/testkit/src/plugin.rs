//! A real `berth-hostpath` process in its own private mount namespace.

use std::{
    ffi::{OsStr, OsString},
    io::Read as _,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::{Child, ExitStatus, Stdio},
    sync::{Arc, Mutex},
    thread::JoinHandle,
    time::Duration,
};

use berth_csi::Endpoint;
use berth_sys::MountEntry;
use tempfile::TempDir;
use tonic::transport::Channel;

use crate::{POLL_INTERVAL, bin_path};

/// Node id the plugin gets unless the builder sets another.
pub const DEFAULT_NODE_ID: &str = "berth-test-node";

/// How long [`HostpathPluginBuilder::spawn`] waits for the socket by default.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(10);

/// The plugin did not come up.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The process could not be started.
    #[error("starting berth-hostpath")]
    Start(#[source] std::io::Error),
    /// The process exited before its socket accepted a connection.
    #[error("berth-hostpath exited ({status}) before it was ready; stderr:\n{stderr}")]
    Exited {
        /// How it exited.
        status: ExitStatus,
        /// Everything it wrote to stderr.
        stderr: String,
    },
    /// The socket did not accept a connection in time.
    #[error(
        "berth-hostpath's socket did not accept a connection within {waited:?}; stderr:\n{stderr}"
    )]
    NotReady {
        /// How long was waited.
        waited: Duration,
        /// What it wrote to stderr so far.
        stderr: String,
    },
}

/// Options for a [`HostpathPlugin`]; `HostpathPlugin::builder()…spawn().await`.
#[derive(Debug, Clone)]
pub struct HostpathPluginBuilder {
    stage: Option<bool>,
    attach: Option<bool>,
    strict: Option<bool>,
    backing: Option<String>,
    faults: Vec<String>,
    nodeid: String,
    log_level: String,
    args: Vec<OsString>,
    envs: Vec<(OsString, OsString)>,
    ready_timeout: Duration,
    socket: Option<PathBuf>,
    statedir: Option<PathBuf>,
    call_log: Option<PathBuf>,
}

impl HostpathPluginBuilder {
    /// Listen on `path` instead of `tmp()/csi.sock` (e.g. a socket an agent already expects).
    /// The caller keeps the path short (≤ 107 bytes) and its directory existing.
    pub fn socket(mut self, path: impl Into<PathBuf>) -> Self {
        self.socket = Some(path.into());
        self
    }

    /// Use `path` as `--statedir` instead of `tmp()/statedir` (e.g. another plugin's, to see
    /// the second copy refused). The caller keeps it existing; it is not removed on drop.
    pub fn statedir(mut self, path: impl Into<PathBuf>) -> Self {
        self.statedir = Some(path.into());
        self
    }

    /// `--enable-stage=<on>` (the plugin's default is on).
    pub fn stage(mut self, on: bool) -> Self {
        self.stage = Some(on);
        self
    }

    /// `--enable-attach=<on>` (the plugin's default is on).
    pub fn attach(mut self, on: bool) -> Self {
        self.attach = Some(on);
        self
    }

    /// `--strict=<on>`: refuse requests where the CO skipped a duty the CSI spec puts on it
    /// (the plugin's default is off).
    pub fn strict(mut self, on: bool) -> Self {
        self.strict = Some(on);
        self
    }

    /// `--backing=<kind>`: `"dir"` (the plugin's default) or `"image"` (ext4 image files
    /// mounted through loop devices; needs staging). Loop devices are machine-wide: the
    /// handle detaches any still attached to its files when it is dropped (see
    /// [`HostpathPlugin::attached_loops`]).
    pub fn backing(mut self, kind: impl Into<String>) -> Self {
        self.backing = Some(kind.into());
        self
    }

    /// Adds `--fault <spec>` (repeatable).
    pub fn fault(mut self, spec: impl Into<String>) -> Self {
        self.faults.push(spec.into());
        self
    }

    /// `--call-log <path>`: the plugin appends a line per RPC to `path`; a relative path is
    /// taken inside [`HostpathPlugin::tmp`] (e.g. `"calls.log"`; removed with it). Read it with
    /// `berth_hostpath::calllog::read` on [`HostpathPlugin::call_log`].
    pub fn call_log(mut self, path: impl Into<PathBuf>) -> Self {
        self.call_log = Some(path.into());
        self
    }

    /// `--nodeid` (default [`DEFAULT_NODE_ID`]).
    pub fn nodeid(mut self, id: impl Into<String>) -> Self {
        self.nodeid = id.into();
        self
    }

    /// `--log-level` (default `debug`, so failing tests show every RPC).
    pub fn log_level(mut self, level: impl Into<String>) -> Self {
        self.log_level = level.into();
        self
    }

    /// Appends a raw argument to the plugin's command line.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_os_string());
        self
    }

    /// Sets an environment variable for the plugin.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.envs
            .push((key.as_ref().to_os_string(), value.as_ref().to_os_string()));
        self
    }

    /// How long to wait for the socket (default [`DEFAULT_READY_TIMEOUT`]).
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// Starts the plugin and waits until its socket accepts a connection.
    ///
    /// # Panics
    /// If it does not come up; the message holds its stderr.
    pub async fn spawn(self) -> HostpathPlugin {
        match self.try_spawn().await {
            Ok(plugin) => plugin,
            Err(e) => panic!("{e}: {:?}", std::error::Error::source(&e)),
        }
    }

    /// Starts the plugin and waits until its socket accepts a connection, or reports why not.
    /// The temporary directory is removed on error.
    pub async fn try_spawn(self) -> Result<HostpathPlugin, SpawnError> {
        // A short path under /tmp keeps socket paths well under the 107-byte limit.
        let tmp = tempfile::Builder::new()
            .prefix("bh")
            .tempdir_in("/tmp")
            .map_err(SpawnError::Start)?;
        let statedir = self
            .statedir
            .clone()
            .unwrap_or_else(|| tmp.path().join("statedir"));
        let socket = self
            .socket
            .clone()
            .unwrap_or_else(|| tmp.path().join("csi.sock"));
        let mut args: Vec<OsString> = vec![
            format!("--endpoint=unix://{}", socket.display()).into(),
            "--statedir".into(),
            statedir.clone().into(),
            "--nodeid".into(),
            self.nodeid.clone().into(),
            "--log-level".into(),
            self.log_level.clone().into(),
        ];
        if let Some(on) = self.stage {
            args.push(format!("--enable-stage={on}").into());
        }
        if let Some(on) = self.attach {
            args.push(format!("--enable-attach={on}").into());
        }
        if let Some(on) = self.strict {
            args.push(format!("--strict={on}").into());
        }
        if let Some(kind) = &self.backing {
            args.push(format!("--backing={kind}").into());
        }
        for spec in &self.faults {
            args.push("--fault".into());
            args.push(spec.into());
        }
        let call_log = self.call_log.as_ref().map(|p| tmp.path().join(p));
        if let Some(path) = &call_log {
            args.push("--call-log".into());
            args.push(path.into());
        }
        args.extend(self.args.iter().cloned());

        let mut plugin = HostpathPlugin {
            tmp,
            socket,
            statedir,
            nodeid: self.nodeid.clone(),
            call_log,
            args,
            envs: self.envs.clone(),
            ready_timeout: self.ready_timeout,
            running: None,
            last_pid: 0,
            stderr: Arc::new(Mutex::new(Vec::new())),
        };
        plugin.start().await?;
        Ok(plugin)
    }
}

/// A running `berth-hostpath`, started as
/// `setpriv --pdeathsig KILL -- unshare -m --propagation private -- berth-hostpath …`: every
/// mount it makes lives in its own mount namespace and vanishes with it, and it dies with the
/// thread that started it. Dropping the handle kills and reaps it and removes its directory.
///
/// Layout: `tmp()/statedir/` (its `--statedir`), `tmp()/csi.sock`; tests put staging and target
/// paths under `tmp()`.
#[derive(Debug)]
pub struct HostpathPlugin {
    tmp: TempDir,
    socket: PathBuf,
    statedir: PathBuf,
    nodeid: String,
    call_log: Option<PathBuf>,
    args: Vec<OsString>,
    envs: Vec<(OsString, OsString)>,
    ready_timeout: Duration,
    running: Option<Running>,
    last_pid: u32,
    stderr: Arc<Mutex<Vec<u8>>>,
}

#[derive(Debug)]
struct Running {
    child: Child,
    reader: Option<JoinHandle<()>>,
}

impl Running {
    /// Kills (SIGKILL) and reaps the child, then waits for its stderr to be drained.
    fn kill(mut self) -> Option<ExitStatus> {
        // Errors mean it has already been reaped; wait() then reports the status.
        let _ = self.child.kill();
        let status = self.child.wait().ok();
        self.join_reader();
        status
    }

    fn join_reader(&mut self) {
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

impl HostpathPlugin {
    /// A builder with the plugin's defaults, node id [`DEFAULT_NODE_ID`] and log level debug.
    pub fn builder() -> HostpathPluginBuilder {
        HostpathPluginBuilder {
            stage: None,
            attach: None,
            strict: None,
            backing: None,
            faults: Vec::new(),
            nodeid: DEFAULT_NODE_ID.to_owned(),
            log_level: "debug".to_owned(),
            args: Vec::new(),
            envs: Vec::new(),
            ready_timeout: DEFAULT_READY_TIMEOUT,
            socket: None,
            statedir: None,
            call_log: None,
        }
    }

    async fn start(&mut self) -> Result<(), SpawnError> {
        let mut cmd = crate::private_ns_command(&bin_path("berth-hostpath"));
        cmd.args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(SpawnError::Start)?;
        self.last_pid = child.id();
        let reader = child.stderr.take().map(|mut pipe| {
            let buf = Arc::clone(&self.stderr);
            std::thread::spawn(move || {
                let mut chunk = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    lock(&buf).extend_from_slice(&chunk[..n]);
                }
            })
        });
        let mut running = Running { child, reader };

        let deadline = tokio::time::Instant::now() + self.ready_timeout;
        loop {
            if let Ok(Some(status)) = running.child.try_wait() {
                running.join_reader();
                return Err(SpawnError::Exited {
                    status,
                    stderr: self.stderr_text(),
                });
            }
            if UnixStream::connect(&self.socket).is_ok() {
                self.running = Some(running);
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                running.kill();
                return Err(SpawnError::NotReady {
                    waited: self.ready_timeout,
                    stderr: self.stderr_text(),
                });
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// The plugin's unix socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// `unix://<socket>`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// A gRPC channel to the plugin's socket, for raw generated clients: [`berth_csi::channel`],
    /// which connects on first use and reconnects after a restart.
    ///
    /// # Panics
    /// If the socket path is not a valid endpoint (it always is: testkit keeps it short).
    pub fn channel(&self) -> Channel {
        let endpoint = Endpoint::from_path(&self.socket)
            .unwrap_or_else(|e| panic!("plugin socket as an endpoint: {e}"));
        berth_csi::channel(&endpoint)
    }

    /// The plugin's `--statedir`.
    pub fn statedir(&self) -> &Path {
        &self.statedir
    }

    /// The plugin's `--nodeid`.
    pub fn nodeid(&self) -> &str {
        &self.nodeid
    }

    /// The plugin's `--call-log` file (absolute), if the builder set one.
    pub fn call_log(&self) -> Option<&Path> {
        self.call_log.as_deref()
    }

    /// Process id of the plugin (of the last one started, if it has died).
    pub fn pid(&self) -> u32 {
        self.last_pid
    }

    /// A command that runs `program` in the plugin's mount namespace
    /// (`nsenter --target <pid> --mount -- <program>`). Only valid while the plugin runs.
    pub fn command_in_ns(&self, program: impl AsRef<Path>) -> std::process::Command {
        let mut cmd = std::process::Command::new("nsenter");
        cmd.arg("--target")
            .arg(self.last_pid.to_string())
            .args(["--mount", "--"])
            .arg(program.as_ref());
        cmd
    }

    /// The temporary directory that holds the socket and the state directory; removed on drop.
    pub fn tmp(&self) -> &Path {
        self.tmp.path()
    }

    /// `path` as the plugin sees it, reachable from outside its mount namespace:
    /// `/proc/<pid>/root/<path>`. Only valid while the plugin runs.
    pub fn in_ns(&self, path: impl AsRef<Path>) -> PathBuf {
        let path = path.as_ref();
        let relative = path.strip_prefix("/").unwrap_or(path);
        PathBuf::from(format!("/proc/{}/root", self.last_pid)).join(relative)
    }

    /// The plugin's mount table (`/proc/<pid>/mountinfo`).
    ///
    /// # Panics
    /// If it cannot be read (the plugin is not running).
    pub fn mountinfo(&self) -> Vec<MountEntry> {
        let path = PathBuf::from(format!("/proc/{}/mountinfo", self.last_pid));
        berth_sys::read_mountinfo(&path).unwrap_or_else(|e| {
            panic!(
                "plugin mount table: {e}: {:?}",
                std::error::Error::source(&e)
            )
        })
    }

    /// The top-most mount at `path` in the plugin's namespace, if any.
    pub fn mount_at(&self, path: impl AsRef<Path>) -> Option<MountEntry> {
        berth_sys::top_mount_at(&self.mountinfo(), path.as_ref()).cloned()
    }

    /// Everything the plugin (all its runs) wrote to stderr so far.
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&lock(&self.stderr)).into_owned()
    }

    /// Whether the plugin process is still running (reaps it if it has exited).
    pub fn is_running(&mut self) -> bool {
        self.running
            .as_mut()
            .is_some_and(|r| matches!(r.child.try_wait(), Ok(None)))
    }

    /// Waits up to `timeout` for the plugin to exit on its own; its exit status if it did.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let running = self.running.as_mut()?;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = running.child.try_wait() {
                running.join_reader();
                return Some(status);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Kills the plugin with SIGKILL and reaps it; its mounts vanish with its namespace. Returns
    /// its exit status, or `None` if it was not running.
    pub fn kill(&mut self) -> Option<ExitStatus> {
        self.running.take().and_then(Running::kill)
    }

    /// Kills the plugin (if running) and starts it again with the same arguments, socket and
    /// state directory, in a fresh mount namespace.
    ///
    /// # Panics
    /// If it does not come up again.
    pub async fn restart(&mut self) {
        if let Err(e) = self.try_restart().await {
            panic!("{e}: {:?}", std::error::Error::source(&e));
        }
    }

    /// Like [`restart`](Self::restart), reporting failure instead of panicking.
    pub async fn try_restart(&mut self) -> Result<(), SpawnError> {
        self.kill();
        lock(&self.stderr).extend_from_slice(b"--- testkit: restarting berth-hostpath ---\n");
        self.start().await
    }

    /// The loop devices attached to files in this plugin's state directory or temporary
    /// directory, as `(device, file)` (read from `/sys/block/loop*/loop/backing_file`). Loop
    /// devices are a machine-wide resource: tests of image-backed volumes check this is empty
    /// once they are done.
    pub fn attached_loops(&self) -> Vec<(PathBuf, PathBuf)> {
        attached_loops_under(&[self.statedir.as_path(), self.tmp.path()])
    }

    /// Waits up to `timeout` for [`attached_loops`](Self::attached_loops) to be empty (the
    /// kernel frees an autoclear loop device a moment after its last unmount); what is still
    /// attached then.
    pub async fn wait_loops_detached(&self, timeout: Duration) -> Vec<(PathBuf, PathBuf)> {
        crate::eventually(timeout, || async { self.attached_loops().is_empty() }).await;
        self.attached_loops()
    }

    /// Replaces the fault control file `<statedir>/faults` (one spec per line; written
    /// atomically, read by the plugin on its next RPC). An empty slice clears all file faults.
    ///
    /// # Panics
    /// If the file cannot be written.
    pub fn set_faults(&self, specs: &[&str]) {
        let mut text = specs.join("\n");
        text.push('\n');
        let path = self.statedir.join("faults");
        if let Err(e) = berth_sys::write_atomic(&path, text.as_bytes()) {
            panic!("{e}: {:?}", std::error::Error::source(&e));
        }
    }
}

impl Drop for HostpathPlugin {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "--- berth-hostpath stderr ---\n{}--- end ---",
                self.stderr_text()
            );
        }
        // The plugin's mounts went with its namespace, and with them its autoclear loop
        // devices, a moment later; detach any that stay, whatever happened in the test.
        let deadline = std::time::Instant::now() + LOOP_DETACH_TIMEOUT;
        let mut left = self.attached_loops();
        while !left.is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(POLL_INTERVAL);
            left = self.attached_loops();
        }
        for (device, file) in left {
            eprintln!(
                "testkit: detaching {} (still attached to {})",
                device.display(),
                file.display()
            );
            let _ = std::process::Command::new("losetup")
                .arg("-d")
                .arg(&device)
                .status();
        }
    }
}

/// How long a dropped [`HostpathPlugin`] waits for its loop devices to go before it detaches
/// them.
const LOOP_DETACH_TIMEOUT: Duration = Duration::from_secs(10);

/// The loop devices whose backing file is under one of `dirs`, as `(device, file)`.
/// Every loop device whose backing file lies under one of `dirs`: `(device, backing file)`.
pub fn attached_loops_under(dirs: &[&Path]) -> Vec<(PathBuf, PathBuf)> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Ok(file) = std::fs::read_to_string(entry.path().join("loop/backing_file")) else {
            continue;
        };
        let file = PathBuf::from(file.trim_end_matches('\n'));
        if dirs.iter().any(|d| file.starts_with(d)) {
            found.push((Path::new("/dev").join(entry.file_name()), file));
        }
    }
    found.sort();
    found
}

fn lock(buf: &Mutex<Vec<u8>>) -> std::sync::MutexGuard<'_, Vec<u8>> {
    buf.lock().unwrap_or_else(|p| p.into_inner())
}
