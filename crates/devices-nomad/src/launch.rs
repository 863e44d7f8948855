//! Starting a plugin binary as go-plugin's host does, inside berth's plugin slot: its own
//! process group, the slot's lock file as stdin and its marks in the environment, Nomad's
//! magic cookie and go-plugin's variables, stderr (and stdout after the handshake line)
//! appended to a private log file; then reading and checking the handshake line.
//!
//! A [`PluginProcess`] is the running copy: stopping it asks go-plugin's controller first,
//! then kills the whole group. Dropping it unstopped kills the group too.

use std::{
    collections::BTreeMap,
    io::{self, Read as _, Seek as _},
    os::unix::fs::FileTypeExt as _,
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    time::Duration,
};

use berth_input::shown_within;
use berth_sys::{
    MAX_SOCKET_PATH,
    slot::{PluginSlot, open_private_append},
};
use nix::{
    sys::signal::{Signal, killpg},
    unistd::Pid,
};
use tokio::{
    io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader},
    process::{Child, ChildStdout, Command},
    task::JoinHandle,
    time::Instant,
};
use tokio_util::sync::CancellationToken;

use crate::{
    client::NomadClient,
    handshake::{
        self, APP_PROTOCOL_VERSION, HandshakeError, MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE,
        MAX_PORT_VAR, MIN_PORT_VAR, NOT_RUN_DIRECTLY_NOTICE, PROTOCOL_VERSIONS_VAR, PluginAddress,
        UNIX_SOCKET_DIR_VAR,
    },
};

/// What go-plugin adds to the socket directory: `/plugin` and up to ten digits.
pub const SOCKET_NAME_LEN: usize = "/plugin".len() + 10;
/// The longest handshake line read; a longer one is garbage.
const MAX_LINE: u64 = 4096;
/// How many characters of what a failed plugin printed an error quotes, per stream.
const QUOTE: usize = 600;
/// How long the stdout drain may take to catch a stopped plugin's last words.
const DRAIN_GRACE: Duration = Duration::from_millis(500);
/// How long a SIGKILLed process may take to be reaped.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// What to start and how.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// The plugin's configured name (for errors and logs).
    pub name: String,
    /// The binary.
    pub command: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment (the host's environment is inherited, as go-plugin does).
    pub env: BTreeMap<String, String>,
    /// `PLUGIN_UNIX_SOCKET_DIR`: a directory only berth writes to (created 0700). Its path
    /// plus [`SOCKET_NAME_LEN`] must fit in [`MAX_SOCKET_PATH`].
    pub socket_dir: PathBuf,
    /// Where stderr and, after the handshake line, stdout are appended (created 0600).
    pub log: PathBuf,
    /// `PLUGIN_MIN_PORT` and `PLUGIN_MAX_PORT` (for plugins that listen on TCP).
    pub ports: (u16, u16),
    /// How long the handshake line may take.
    pub start_timeout: Duration,
}

/// Why a plugin could not be started. Output quoted from the plugin is escaped and cut.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The socket directory's path is too long for a unix socket in it.
    #[error(
        "plugin {plugin:?}: the socket directory {} is {len} bytes long; a unix socket path in it (plus {SOCKET_NAME_LEN} bytes) must fit in {MAX_SOCKET_PATH} bytes: use a shorter data dir",
        path.display()
    )]
    SocketDirTooLong {
        /// The plugin.
        plugin: String,
        /// The directory.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
    },
    /// A file or directory of the plugin cannot be made or used.
    #[error("plugin {plugin:?}: {}: {source}", path.display())]
    Io {
        /// The plugin.
        plugin: String,
        /// The file or directory.
        path: PathBuf,
        /// The failure.
        #[source]
        source: io::Error,
    },
    /// The slot's lock cannot be given to the plugin as its stdin (the slot is not claimed).
    #[error("plugin {plugin:?}: the plugin slot's lock cannot be its stdin: {source}")]
    Slot {
        /// The plugin.
        plugin: String,
        /// The failure.
        #[source]
        source: io::Error,
    },
    /// The binary cannot be executed.
    #[error("plugin {plugin:?}: cannot start {}: {source}", command.display())]
    Spawn {
        /// The plugin.
        plugin: String,
        /// The binary.
        command: PathBuf,
        /// The failure.
        #[source]
        source: io::Error,
    },
    /// The plugin printed go-plugin's "This binary is a plugin" notice: it expects another
    /// host's magic cookie, so it is some other program's plugin, not a Nomad plugin.
    #[error(
        "plugin {plugin:?}: {} printed go-plugin's \"This binary is a plugin\" notice: it is a go-plugin plugin of another program (it expects another magic cookie than Nomad's), not a Nomad device plugin; {output}",
        command.display()
    )]
    NotANomadPlugin {
        /// The plugin.
        plugin: String,
        /// The binary.
        command: PathBuf,
        /// What it printed.
        output: String,
    },
    /// The plugin exited (or closed its stdout) before printing a handshake line.
    #[error("plugin {plugin:?}: {} {how} before its handshake line; {output}", command.display())]
    Exited {
        /// The plugin.
        plugin: String,
        /// The binary.
        command: PathBuf,
        /// `exited (exit status: 1)`, `closed its stdout`…
        how: String,
        /// What it printed.
        output: String,
    },
    /// No handshake line within the start timeout.
    #[error(
        "plugin {plugin:?}: {} printed no handshake line within {}; {output}",
        command.display(), berth_sys::short_duration(*after)
    )]
    Timeout {
        /// The plugin.
        plugin: String,
        /// The binary.
        command: PathBuf,
        /// The start timeout.
        after: Duration,
        /// What it printed.
        output: String,
    },
    /// The handshake line is not acceptable.
    #[error("plugin {plugin:?}: {}: bad handshake: {source}; {output}", command.display())]
    Handshake {
        /// The plugin.
        plugin: String,
        /// The binary.
        command: PathBuf,
        /// What is wrong with it.
        #[source]
        source: HandshakeError,
        /// What it printed.
        output: String,
    },
    /// Cancelled while starting; the process was killed.
    #[error("plugin {plugin:?}: start cancelled")]
    Cancelled {
        /// The plugin.
        plugin: String,
    },
}

/// Starts `spec` in `slot` (which the caller has claimed) and waits for its handshake line.
/// On success the plugin listens at [`PluginProcess::address`]. On any failure, and on
/// `cancel`, the process group is killed and the process reaped before this returns: nothing
/// is left running (except what the slot's next claim or release stops: a process that left
/// the group).
pub async fn launch(
    spec: &LaunchSpec,
    slot: &PluginSlot,
    cancel: &CancellationToken,
) -> Result<PluginProcess, LaunchError> {
    let io_err = |path: &Path, source| LaunchError::Io {
        plugin: spec.name.clone(),
        path: path.to_path_buf(),
        source,
    };
    let socket_dir =
        std::path::absolute(&spec.socket_dir).map_err(|e| io_err(&spec.socket_dir, e))?;
    let len = socket_dir.as_os_str().len();
    if len + SOCKET_NAME_LEN > MAX_SOCKET_PATH {
        return Err(LaunchError::SocketDirTooLong {
            plugin: spec.name.clone(),
            path: socket_dir,
            len,
        });
    }
    berth_sys::create_private_dir(&socket_dir).map_err(|e| io_err(&socket_dir, e))?;
    remove_stale_sockets(&socket_dir);
    if let Some(dir) = spec.log.parent() {
        berth_sys::create_private_dir(dir).map_err(|e| io_err(dir, e))?;
    }
    let log = open_private_append(&spec.log).map_err(|e| io_err(&spec.log, e))?;
    let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
    let stdin = slot.stdin().map_err(|source| LaunchError::Slot {
        plugin: spec.name.clone(),
        source,
    })?;
    let stderr = log.try_clone().map_err(|e| io_err(&spec.log, e))?;

    let mut child = Command::new(&spec.command)
        .args(&spec.args)
        .envs(&spec.env)
        .env(MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE)
        .env(PROTOCOL_VERSIONS_VAR, APP_PROTOCOL_VERSION.to_string())
        .env(MIN_PORT_VAR, spec.ports.0.to_string())
        .env(MAX_PORT_VAR, spec.ports.1.to_string())
        .env(UNIX_SOCKET_DIR_VAR, &socket_dir)
        // Last, so the configured env cannot hide whose copy this is.
        .envs(slot.marks())
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(stderr)
        // Its own process group, so stopping it reaches the children it starts too.
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| LaunchError::Spawn {
            plugin: spec.name.clone(),
            command: spec.command.clone(),
            source,
        })?;
    let stdout = child.stdout.take();
    // tokio forgets the pid only once it has reaped the child, which it has not yet.
    let pid = child.id().unwrap_or_default();
    let mut process = PluginProcess {
        name: spec.name.clone(),
        child,
        pid,
        address: PluginAddress::Unix(PathBuf::new()),
        exit: None,
        drain: None,
    };
    let Some(stdout) = stdout else {
        process.kill().await;
        return Err(io_err(
            &spec.log,
            io::Error::other("no pipe to the plugin's stdout"),
        ));
    };
    let mut reader = BufReader::new(stdout);
    let mut line = Vec::new();
    let first = {
        let mut limited = (&mut reader).take(MAX_LINE);
        let read = limited.read_until(b'\n', &mut line);
        tokio::select! {
            biased;
            () = cancel.cancelled() => First::Cancelled,
            r = read => First::Line(r),
            r = process.child.wait() => First::Exited(r),
            () = tokio::time::sleep(spec.start_timeout) => First::Timeout,
        }
    };
    let how = match first {
        First::Line(Ok(n)) if n > 0 && (line.ends_with(b"\n") || (n as u64) < MAX_LINE) => None,
        First::Line(Ok(n)) if n > 0 => Some(Failed::Garbage),
        First::Line(r) => {
            // End of file (or a read error): the plugin closed its stdout, most likely exiting.
            let exited = tokio::time::timeout(DRAIN_GRACE, process.wait()).await;
            Some(Failed::Exited(match (exited, r) {
                (Ok(Ok(status)), _) => format!("exited ({status})"),
                (_, Err(e)) => format!("made its stdout unreadable ({e})"),
                _ => "closed its stdout".to_string(),
            }))
        }
        First::Exited(status) => {
            process.exit = status.as_ref().ok().copied();
            // Whatever it printed before exiting is still in the pipe.
            let mut limited = (&mut reader).take(MAX_LINE);
            let _ = tokio::time::timeout(DRAIN_GRACE, limited.read_until(b'\n', &mut line)).await;
            Some(Failed::Exited(match status {
                Ok(s) => format!("exited ({s})"),
                Err(e) => format!("exited (cannot wait for it: {e})"),
            }))
        }
        First::Timeout => Some(Failed::Timeout),
        First::Cancelled => Some(Failed::Cancelled),
    };
    let text_line = String::from_utf8_lossy(&line).into_owned();
    let parsed = match how {
        None => handshake::parse(&text_line).map_err(Failed::Handshake),
        Some(failed) => Err(failed),
    };
    let failed = match parsed {
        Ok(h) => {
            process.address = h.address;
            None
        }
        Err(failed) => Some(failed),
    };
    if let Some(failed) = failed {
        process.kill().await;
        return Err(launch_failure(spec, failed, &text_line, log_start));
    }
    // The rest of stdout goes to the log, as stderr does; draining keeps the plugin from
    // blocking on a full pipe.
    let log = tokio::fs::File::from_std(log);
    process.drain = Some(tokio::spawn(drain(reader, log)));
    Ok(process)
}

/// How the handshake failed, before the output is quoted.
enum Failed {
    Garbage,
    Exited(String),
    Timeout,
    Cancelled,
    Handshake(HandshakeError),
}

/// The error for `failed`, quoting what the plugin printed: `stdout` (what was read of it) and
/// what it appended to the log (its stderr) since `log_start`.
fn launch_failure(spec: &LaunchSpec, failed: Failed, stdout: &str, log_start: u64) -> LaunchError {
    let stderr = read_log_since(&spec.log, log_start);
    let output = format!(
        "it printed on stdout: \"{}\"; on stderr: \"{}\"",
        shown_within(stdout.trim_end(), QUOTE),
        shown_within(stderr.trim_end(), QUOTE)
    );
    let plugin = spec.name.clone();
    let command = spec.command.clone();
    if !matches!(failed, Failed::Cancelled)
        && (stdout.contains(NOT_RUN_DIRECTLY_NOTICE) || stderr.contains(NOT_RUN_DIRECTLY_NOTICE))
    {
        return LaunchError::NotANomadPlugin {
            plugin,
            command,
            output,
        };
    }
    match failed {
        Failed::Garbage => LaunchError::Handshake {
            plugin,
            command,
            source: HandshakeError::NoNewline {
                max: MAX_LINE,
                start: stdout.to_string(),
            },
            output,
        },
        Failed::Exited(how) => LaunchError::Exited {
            plugin,
            command,
            how,
            output,
        },
        Failed::Timeout => LaunchError::Timeout {
            plugin,
            command,
            after: spec.start_timeout,
            output,
        },
        Failed::Cancelled => LaunchError::Cancelled { plugin },
        Failed::Handshake(source) => LaunchError::Handshake {
            plugin,
            command,
            source,
            output,
        },
    }
}

enum First {
    Line(io::Result<usize>),
    Exited(io::Result<ExitStatus>),
    Timeout,
    Cancelled,
}

async fn drain(mut from: BufReader<ChildStdout>, mut to: tokio::fs::File) {
    let _ = tokio::io::copy_buf(&mut from, &mut to).await;
}

/// Removes unix sockets left in `dir` by earlier copies (go-plugin removes its socket only
/// when it exits cleanly).
fn remove_stale_sockets(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_socket()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The end of what was appended to `log` from byte `start` on (at most a few KiB).
fn read_log_since(log: &Path, start: u64) -> String {
    let Ok(mut file) = std::fs::File::open(log) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let from = start.max(len.saturating_sub(4 * QUOTE as u64));
    if file.seek(io::SeekFrom::Start(from)).is_err() {
        return String::new();
    }
    let mut bytes = Vec::new();
    let _ = file.take(8 * QUOTE as u64).read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// How a [`PluginProcess::stop`] went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stopped {
    /// How it exited (`None`: it could not be waited for).
    pub status: Option<ExitStatus>,
    /// It answered `GRPCController.Shutdown`.
    pub answered_shutdown: bool,
    /// It had to be killed (SIGKILL to its group).
    pub killed: bool,
}

/// A started plugin process (the leader of its own process group), not yet reaped while
/// this lives. Dropping it kills the group.
#[derive(Debug)]
pub struct PluginProcess {
    name: String,
    child: Child,
    pid: u32,
    address: PluginAddress,
    exit: Option<ExitStatus>,
    drain: Option<JoinHandle<()>>,
}

impl PluginProcess {
    /// Its pid (and process group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Where it listens.
    pub fn address(&self) -> &PluginAddress {
        &self.address
    }

    /// Waits until it exits and reaps it. Cancel-safe; once it exited, returns at once.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(status) = self.exit {
            return Ok(status);
        }
        let status = self.child.wait().await?;
        self.exit = Some(status);
        Ok(status)
    }

    /// Its exit status if it has exited (reaping it), else `None`.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().ok().flatten();
        }
        self.exit
    }

    /// Stops it: asks it to exit through go-plugin's controller (`Shutdown`, with deadline
    /// `call_timeout`, at most half of `grace`) when `client` is given, else (or when that
    /// fails) sends SIGTERM to its group; waits until `grace` has passed since the start of
    /// the stop for it to exit; then SIGKILLs the group. Returns once it is reaped (or could
    /// not be, 10 s after SIGKILL).
    pub async fn stop(
        mut self,
        client: Option<&NomadClient>,
        call_timeout: Duration,
        grace: Duration,
    ) -> Stopped {
        let started = Instant::now();
        let mut answered = false;
        if self.try_exit().is_none() {
            if let Some(client) = client {
                match client.shutdown(call_timeout.min(grace / 2)).await {
                    Ok(()) => answered = true,
                    Err(e) => {
                        tracing::warn!(plugin = %self.name, error = %e, "the plugin did not take GRPCController.Shutdown; sending SIGTERM");
                    }
                }
            }
            if !answered {
                self.signal_group(Signal::SIGTERM);
            }
        }
        let left = grace.saturating_sub(started.elapsed());
        let mut killed = false;
        if tokio::time::timeout(left, self.wait()).await.is_err() {
            tracing::warn!(plugin = %self.name, grace = %berth_sys::short_duration(grace), "the plugin did not exit in time; killing its process group");
            killed = true;
            self.signal_group(Signal::SIGKILL);
            let _ = tokio::time::timeout(KILL_WAIT, self.wait()).await;
        }
        self.finish_drain().await;
        Stopped {
            status: self.exit,
            answered_shutdown: answered,
            killed,
        }
    }

    /// SIGKILLs its group at once and reaps it; its exit status, if it could be reaped.
    pub async fn kill(&mut self) -> Option<ExitStatus> {
        if self.try_exit().is_none() {
            self.signal_group(Signal::SIGKILL);
            let _ = tokio::time::timeout(KILL_WAIT, self.wait()).await;
        }
        self.finish_drain().await;
        self.exit
    }

    /// Signals the group, only while the leader is not reaped (its pid cannot be reused then).
    fn signal_group(&self, signal: Signal) {
        if self.exit.is_none()
            && let Ok(pid) = i32::try_from(self.pid)
            && pid > 0
        {
            let _ = killpg(Pid::from_raw(pid), signal);
        }
    }

    async fn finish_drain(&mut self) {
        if let Some(mut drain) = self.drain.take()
            && tokio::time::timeout(DRAIN_GRACE, &mut drain).await.is_err()
        {
            drain.abort();
        }
    }
}

impl Drop for PluginProcess {
    fn drop(&mut self) {
        if self.exit.is_none() && self.child.try_wait().ok().flatten().is_none() {
            self.signal_group(Signal::SIGKILL);
        }
        if let Some(drain) = self.drain.take() {
            drain.abort();
        }
    }
}
