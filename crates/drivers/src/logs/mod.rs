//! Where a task's output goes ([`TaskLogs`]): appended to two files, discarded, or through
//! log collectors that rotate it (Nomad's logmon), and the driver's side of those collectors.
//!
//! With rotation, each stream (stdout, stderr) of a task is a FIFO read by a collector
//! process ([`collector_main`]) that writes `<base>.0`, `<base>.1`… Before the task starts, the
//! driver starts both collectors and waits until each says it reads its FIFO; only then is a
//! write end opened (without blocking: a FIFO without a reader would refuse it), so the task
//! never waits on its output and never finds it without a reader. A restarted task gets new
//! collectors, which append to the newest file. A collector found dead when a running task
//! is recovered is started again on the same FIFO ([`ensure_collectors`]).

mod collector;
mod files;

use std::{
    fs::{File, OpenOptions},
    io,
    os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use nix::{
    fcntl::{FcntlArg, OFlag, fcntl},
    libc,
    sys::stat::Mode,
};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncBufReadExt as _;

pub use collector::{CollectorArgs, collector_main};
pub use files::{collector_pid, fifo_path, lock_path, rotated_files, rotated_path};

use crate::{error::DriverError, task::TaskConfig};

/// How long a collector may take to say `ready`: its wait for a previous collector of the
/// stream to end (up to 7 s), plus room.
const READY_TIMEOUT: Duration = Duration::from_secs(15);

/// Nomad's default `logs.max_files`.
pub const DEFAULT_MAX_FILES: u32 = 10;

/// Nomad's default `logs.max_file_size`, in MiB.
pub const DEFAULT_MAX_FILE_SIZE_MB: u32 = 10;

/// The program the agent runs as a log collector: `program args… <collector arguments>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogCollector {
    /// The program.
    pub program: PathBuf,
    /// Its arguments before the collector's own (e.g. `logmon`).
    #[serde(default)]
    pub args: Vec<String>,
}

impl LogCollector {
    /// `berth logmon`, through `/proc/self/exe`: the binary of the process that starts the
    /// collector (the agent), even once it was replaced on disk.
    pub fn berth_subcommand() -> Self {
        Self {
            program: "/proc/self/exe".into(),
            args: vec!["logmon".into()],
        }
    }
}

/// Size limits of rotated output: Nomad's task `logs` block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogRotation {
    /// Most files kept per stream (at least 1); the oldest is deleted.
    pub max_files: u32,
    /// Size of one file, in MiB (at least 1).
    pub max_file_size_mb: u32,
}

impl Default for LogRotation {
    fn default() -> Self {
        Self {
            max_files: DEFAULT_MAX_FILES,
            max_file_size_mb: DEFAULT_MAX_FILE_SIZE_MB,
        }
    }
}

/// Where a task's stdout and stderr go.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum TaskLogs {
    /// Appended to [`TaskConfig::stdout_path`] and [`TaskConfig::stderr_path`] as they are.
    #[default]
    Files,
    /// Through collectors into `<stdout_path>.N` and `<stderr_path>.N`.
    Rotated {
        /// The collector program.
        collector: LogCollector,
        /// The limits.
        rotation: LogRotation,
    },
    /// Thrown away (`/dev/null`): Nomad's `logs { disabled = true }`.
    Discarded,
}

/// What a task's handle records about its rotated output, so that a later agent can restart
/// a collector that died.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RotatedOutput {
    /// The collector program.
    pub collector: LogCollector,
    /// The limits.
    pub rotation: LogRotation,
    /// Base path of stdout's files.
    pub stdout: PathBuf,
    /// Base path of stderr's files.
    pub stderr: PathBuf,
    /// Mode of the files.
    pub mode: u32,
}

/// Mode of a task's log files.
const TASK_LOG_MODE: u32 = 0o640;

/// One stream's end the task writes into, ready before the task starts.
#[derive(Debug)]
pub(crate) struct OutputEnd {
    /// An open write end (a file, the FIFO, or `/dev/null`): given to the task, or held by
    /// the driver until the task has opened `path` itself.
    pub file: File,
    /// What the task may open itself to write the stream.
    pub path: PathBuf,
}

/// A task's two output ends, and what its handle records about them.
#[derive(Debug)]
pub(crate) struct Outputs {
    pub stdout: OutputEnd,
    pub stderr: OutputEnd,
    pub rotated: Option<RotatedOutput>,
}

/// Makes the task's output ready as its [`TaskLogs`] says: the directory of the log files,
/// then the files (appended to, mode 0640 when created), `/dev/null`, or the FIFOs with a
/// running collector each. Creates the working directory first with `make_dir`.
pub(crate) async fn prepare_outputs(
    config: &TaskConfig,
    make_dir: bool,
) -> Result<Outputs, DriverError> {
    let io_err = |what, path: &Path| {
        let path = path.to_path_buf();
        let task_id = config.id.clone();
        move |source| DriverError::Io {
            task_id,
            what,
            path,
            source,
        }
    };
    if make_dir {
        std::fs::create_dir_all(&config.dir)
            .map_err(io_err("creating the working directory", &config.dir))?;
    }
    for path in [&config.stdout_path, &config.stderr_path] {
        if let Some(parent) = path.parent()
            && !matches!(config.logs, TaskLogs::Discarded)
        {
            std::fs::create_dir_all(parent)
                .map_err(io_err("creating the log directory", parent))?;
        }
    }
    match &config.logs {
        TaskLogs::Files => {
            let open = |path: &Path| -> Result<OutputEnd, DriverError> {
                let file = OpenOptions::new()
                    .append(true)
                    .create(true)
                    .mode(TASK_LOG_MODE)
                    .open(path)
                    .map_err(io_err("opening the log file", path))?;
                Ok(OutputEnd {
                    file,
                    path: path.to_path_buf(),
                })
            };
            Ok(Outputs {
                stdout: open(&config.stdout_path)?,
                stderr: open(&config.stderr_path)?,
                rotated: None,
            })
        }
        TaskLogs::Discarded => {
            let null = Path::new("/dev/null");
            let open = || -> Result<OutputEnd, DriverError> {
                let file = OpenOptions::new()
                    .write(true)
                    .open(null)
                    .map_err(io_err("opening", null))?;
                Ok(OutputEnd {
                    file,
                    path: null.to_path_buf(),
                })
            };
            Ok(Outputs {
                stdout: open()?,
                stderr: open()?,
                rotated: None,
            })
        }
        TaskLogs::Rotated {
            collector,
            rotation,
        } => {
            let rotated = RotatedOutput {
                collector: collector.clone(),
                rotation: *rotation,
                stdout: config.stdout_path.clone(),
                stderr: config.stderr_path.clone(),
                mode: TASK_LOG_MODE,
            };
            let logs_err = |base: &Path| {
                let task_id = config.id.clone();
                let path = base.to_path_buf();
                move |message| DriverError::Logs {
                    task_id,
                    path,
                    message,
                }
            };
            let stdout = start_stream(&rotated, &rotated.stdout)
                .await
                .map_err(logs_err(&rotated.stdout))?;
            let stderr = start_stream(&rotated, &rotated.stderr)
                .await
                .map_err(logs_err(&rotated.stderr))?;
            Ok(Outputs {
                stdout,
                stderr,
                rotated: Some(rotated),
            })
        }
    }
}

/// Starts the collector of the stream at `base` and opens a write end of its FIFO.
async fn start_stream(out: &RotatedOutput, base: &Path) -> Result<OutputEnd, String> {
    let fifo = fifo_path(base);
    make_fifo(&fifo)?;
    spawn_collector(out, base).await?;
    let file = open_write_end(&fifo).map_err(|e| format!("opening {}: {e}", fifo.display()))?;
    Ok(OutputEnd { file, path: fifo })
}

/// Makes the FIFO (mode 0600) unless it exists; something else at its path is an error.
fn make_fifo(fifo: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(fifo) {
        Ok(m) if m.file_type().is_fifo() => Ok(()),
        Ok(_) => Err(format!("{} exists and is not a FIFO", fifo.display())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            nix::unistd::mkfifo(fifo, Mode::from_bits_truncate(0o600))
                .map_err(|e| format!("making the FIFO {}: {e}", fifo.display()))
        }
        Err(e) => Err(format!("inspecting {}: {e}", fifo.display())),
    }
}

/// Opens the FIFO for writing without waiting (it fails when no collector reads it), then
/// makes the descriptor blocking again, as a task expects its output to be.
fn open_write_end(fifo: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(fifo)?;
    let flags = fcntl(&file, FcntlArg::F_GETFL)?;
    let flags = OFlag::from_bits_truncate(flags) - OFlag::O_NONBLOCK;
    fcntl(&file, FcntlArg::F_SETFL(flags))?;
    Ok(file)
}

/// Runs the collector of the stream at `base` and waits (bounded) until it says `ready`.
async fn spawn_collector(out: &RotatedOutput, base: &Path) -> Result<(), String> {
    let args = CollectorArgs {
        base: base.to_path_buf(),
        max_files: out.rotation.max_files,
        max_file_size_mb: out.rotation.max_file_size_mb,
        mode: out.mode,
    };
    let program = &out.collector.program;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(&out.collector.args)
        .args(args.to_args())
        // Nothing of the agent's environment (it may hold credentials).
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        // It outlives the agent; tokio reaps it if it ends while the agent lives.
        .kill_on_drop(false);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("starting the log collector {}: {e}", program.display()))?;
    let Some(stdout) = child.stdout.take() else {
        return Err("the log collector's standard output is not a pipe".into());
    };
    let mut line = String::new();
    let mut reader = tokio::io::BufReader::new(stdout);
    let said = tokio::time::timeout(READY_TIMEOUT, reader.read_line(&mut line)).await;
    match said {
        Ok(Ok(_)) if line == "ready\n" => Ok(()),
        Ok(Ok(_)) => {
            let _ = child.start_kill();
            let reason = line.trim();
            let reason = reason.strip_prefix("error: ").unwrap_or(reason);
            if reason.is_empty() {
                Err("the log collector ended before it was ready".into())
            } else {
                Err(format!("the log collector failed: {reason}"))
            }
        }
        Ok(Err(e)) => {
            let _ = child.start_kill();
            Err(format!("reading the log collector's answer: {e}"))
        }
        Err(_) => {
            let _ = child.start_kill();
            Err(format!(
                "the log collector was not ready within {}",
                berth_sys::short_duration(READY_TIMEOUT)
            ))
        }
    }
}

/// For a running task being recovered: starts a collector for each stream whose collector is
/// gone (it was killed, or the machine's OOM killer took it), then opens and closes a write
/// end of its FIFO, so that the new collector sees the end of the stream as soon as the task
/// closes its output. What could not be done, one line each.
pub(crate) async fn ensure_collectors(out: &RotatedOutput) -> Vec<String> {
    let mut problems = Vec::new();
    for base in [&out.stdout, &out.stderr] {
        match collector_pid(base) {
            Ok(Some(_)) => continue,
            Ok(None) => {}
            Err(e) => {
                problems.push(format!(
                    "cannot tell whether the log collector of {} runs: {e}",
                    base.display()
                ));
                continue;
            }
        }
        match spawn_collector(out, base).await {
            Ok(()) => {
                drop(open_write_end(&fifo_path(base)));
                tracing::info!(stream = %base.display(), "restarted the log collector of a recovered task");
            }
            Err(e) => problems.push(format!(
                "the log collector of {} is gone and could not be restarted: {e}",
                base.display()
            )),
        }
    }
    problems
}

/// Waits (up to `timeout`) until the stream at `base` has no collector any more: every byte
/// written into its FIFO is in its files. `false` on timeout.
pub(crate) async fn wait_collector_gone(base: &Path, timeout: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if !matches!(collector_pid(base), Ok(Some(_))) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

impl RotatedOutput {
    /// `<base>.N` of the newest file of the stream at `base`, and its length now.
    pub(crate) fn newest(base: &Path) -> Option<(PathBuf, u64)> {
        let (_, path) = rotated_files(base).ok()?.pop()?;
        let len = std::fs::metadata(&path).ok()?.len();
        Some((path, len))
    }
}

/// The plugin supervisor's log: one stream (stdout and stderr together) of a process that is
/// not a task, through a collector into `<base>.N`, mode 0600.
#[derive(Debug)]
pub struct CollectedLog {
    /// The write end to give the process as its stdout and stderr.
    pub file: File,
}

impl CollectedLog {
    /// Starts the collector of the stream at `base` (limits `rotation`, files mode 0600) and
    /// opens a write end of its FIFO.
    pub async fn start(
        collector: &LogCollector,
        rotation: LogRotation,
        base: &Path,
    ) -> Result<Self, String> {
        if let Some(dir) = base.parent() {
            berth_sys::create_private_dir(dir)
                .map_err(|e| format!("creating {}: {e}", dir.display()))?;
        }
        let out = RotatedOutput {
            collector: collector.clone(),
            rotation,
            stdout: base.to_path_buf(),
            stderr: base.to_path_buf(),
            mode: 0o600,
        };
        let end = start_stream(&out, base).await?;
        Ok(Self { file: end.file })
    }
}
