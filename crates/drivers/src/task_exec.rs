//! Running a command inside a running task (`alloc exec`): what is asked
//! ([`ExecRequest`]), what comes back ([`ExecSession`]), and the pieces the drivers share: a
//! process spawned with pipes or on a pseudo-terminal, and what `/proc` tells about the
//! task's process (its user, environment, root and working directory).

use std::{
    collections::BTreeMap,
    ffi::OsString,
    fmt, io,
    os::{
        fd::{AsFd as _, OwnedFd},
        unix::{ffi::OsStringExt as _, process::ExitStatusExt as _},
    },
    path::{Path, PathBuf},
    pin::Pin,
    process::Stdio,
    sync::Arc,
    task::{Context, Poll, ready},
};

use nix::{
    sys::signal::{Signal, kill, killpg},
    unistd::Pid,
};
use serde::{Deserialize, Serialize};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    process::{Child, Command},
};

use crate::{error::DriverError, procfs, task::TaskId};

/// Most arguments of an exec'd command.
pub const MAX_EXEC_ARGS: usize = 256;

/// Longest argument of an exec'd command, in bytes.
pub const MAX_EXEC_ARG_BYTES: usize = 4096;

/// The size of a terminal, in characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminalSize {
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

/// A command to run inside a running task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// The program (looked up in the task's `PATH`) and its arguments.
    pub command: Vec<String>,
    /// Run it on a pseudo-terminal of this size (stdout and stderr then come together), or
    /// with pipes.
    pub tty: Option<TerminalSize>,
}

impl ExecRequest {
    /// Checks the command: 1 to [`MAX_EXEC_ARGS`] arguments of at most
    /// [`MAX_EXEC_ARG_BYTES`], without NUL, the program not empty. The error names the
    /// argument.
    pub fn validate(&self) -> Result<(), String> {
        if self.command.is_empty() {
            return Err("command: must name a program".into());
        }
        if self.command.len() > MAX_EXEC_ARGS {
            return Err(format!(
                "command: {} arguments; at most {MAX_EXEC_ARGS}",
                self.command.len()
            ));
        }
        if self.command[0].is_empty() {
            return Err("command[0]: the program must not be empty".into());
        }
        for (i, arg) in self.command.iter().enumerate() {
            if arg.len() > MAX_EXEC_ARG_BYTES {
                return Err(format!(
                    "command[{i}]: {} bytes; at most {MAX_EXEC_ARG_BYTES}",
                    arg.len()
                ));
            }
            if arg.contains('\0') {
                return Err(format!("command[{i}]: must not contain a NUL byte"));
            }
        }
        if let Some(size) = self.tty
            && (size.cols == 0 || size.rows == 0)
        {
            return Err("tty: a terminal needs at least one column and one row".into());
        }
        Ok(())
    }
}

/// A boxed reader of an exec'd command's output.
pub type ExecOutput = Box<dyn AsyncRead + Send + Unpin>;

/// A boxed writer of an exec'd command's input.
pub type ExecInput = Box<dyn AsyncWrite + Send + Unpin>;

/// A command running inside a task: its input and outputs, and the process itself. Dropping
/// it kills what the command left running.
pub struct ExecSession {
    /// Its standard input. Shutting it down closes it (a terminal's stays open: it also
    /// carries the output).
    pub stdin: ExecInput,
    /// Its standard output (on a terminal: the terminal's output).
    pub stdout: ExecOutput,
    /// Its standard error; `None` on a terminal.
    pub stderr: Option<ExecOutput>,
    /// The process.
    pub process: ExecProcess,
}

impl fmt::Debug for ExecSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecSession")
            .field("process", &self.process)
            .finish_non_exhaustive()
    }
}

/// The process of an [`ExecSession`]: the leader of a process group (and, on a terminal, of
/// a session) of its own.
#[derive(Debug)]
pub struct ExecProcess {
    child: Child,
    pgid: u32,
    /// The pseudo-terminal's master, to resize it.
    pty: Option<Arc<OwnedFd>>,
    reaped: bool,
}

impl ExecProcess {
    /// Waits until the command exits; its exit code, or 128 plus the signal that killed it
    /// (as a shell reports it). Then kills what it left running in its process group, so its
    /// outputs end.
    pub async fn wait(&mut self) -> io::Result<i32> {
        let status = self.child.wait().await?;
        self.reaped = true;
        self.kill_left();
        Ok(status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
    }

    /// Sets the size of its terminal (nothing without one).
    pub fn resize(&self, size: TerminalSize) -> io::Result<()> {
        self.resizer().resize(size)
    }

    /// What resizes its terminal, apart from the process (whose owner may be waiting on it).
    pub fn resizer(&self) -> Resizer {
        Resizer(self.pty.clone())
    }

    /// `SIGKILL` to the command and everything in its process group.
    pub fn kill(&mut self) {
        if self.pgid == 0 {
            // Never group 0 (ours): a child without a pid was reaped already.
            let _ = self.child.start_kill();
            return;
        }
        if self.reaped {
            self.kill_left();
        } else {
            // Not reaped: the group id is still this process's.
            let _ = killpg(Pid::from_raw(self.pgid as i32), Signal::SIGKILL);
            let _ = self.child.start_kill();
        }
    }

    /// Kills the group's members one by one (the leader is reaped: its id may be reused).
    fn kill_left(&self) {
        if self.pgid == 0 {
            return;
        }
        for pid in procfs::group_members(self.pgid).unwrap_or_default() {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    }
}

impl Drop for ExecProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Sets the size of an exec'd command's terminal.
#[derive(Debug, Clone)]
pub struct Resizer(Option<Arc<OwnedFd>>);

impl Resizer {
    /// Sets the size (nothing when the command has no terminal).
    pub fn resize(&self, size: TerminalSize) -> io::Result<()> {
        let Some(pty) = &self.0 else {
            return Ok(());
        };
        rustix::termios::tcsetwinsize(
            pty.as_fd(),
            rustix::termios::Winsize {
                ws_row: size.rows,
                ws_col: size.cols,
                ws_xpixel: 0,
                ws_ypixel: 0,
            },
        )
        .map_err(io::Error::from)
    }
}

/// What to run for an exec: the driver fills it from the task's process.
#[derive(Debug, Clone)]
pub(crate) struct ExecCommand {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// The whole environment.
    pub env: BTreeMap<OsString, OsString>,
    pub cwd: PathBuf,
    /// `(uid, gid)` to run as; `None`: the agent's.
    pub user: Option<(u32, u32)>,
}

/// Starts `cmd` for task `task_id`: on a pseudo-terminal of size `tty` (through `setsid -c`,
/// which makes it the command's controlling terminal), or with pipes, in a process group of
/// its own either way.
pub(crate) fn spawn_exec(
    task_id: &TaskId,
    cmd: ExecCommand,
    tty: Option<TerminalSize>,
) -> Result<ExecSession, DriverError> {
    let spawn_err = |program: &Path| {
        let task_id = task_id.clone();
        let program = program.display().to_string();
        move |source| DriverError::Spawn {
            task_id,
            program,
            source,
        }
    };
    let mut command = match tty {
        Some(_) => {
            let setsid = procfs::find_program("setsid").ok_or_else(|| DriverError::Setup {
                task_id: task_id.clone(),
                message: "a terminal needs util-linux's setsid, which is not in PATH".into(),
            })?;
            let mut c = Command::new(setsid);
            c.arg("-c").arg(&cmd.program);
            c
        }
        None => {
            let mut c = Command::new(&cmd.program);
            c.process_group(0);
            c
        }
    };
    command
        .args(&cmd.args)
        .env_clear()
        .envs(&cmd.env)
        .current_dir(&cmd.cwd)
        .kill_on_drop(true);
    if let Some((uid, gid)) = cmd.user {
        command.uid(uid).gid(gid);
    }
    match tty {
        None => {
            command
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let mut child = command.spawn().map_err(spawn_err(&cmd.program))?;
            let pgid = child.id().unwrap_or(0);
            let (Some(stdin), Some(stdout), Some(stderr)) =
                (child.stdin.take(), child.stdout.take(), child.stderr.take())
            else {
                return Err(DriverError::Setup {
                    task_id: task_id.clone(),
                    message: "the command's standard streams are not pipes".into(),
                });
            };
            Ok(ExecSession {
                stdin: Box::new(PipeInput(Some(stdin))),
                stdout: Box::new(stdout),
                stderr: Some(Box::new(stderr)),
                process: ExecProcess {
                    child,
                    pgid,
                    pty: None,
                    reaped: false,
                },
            })
        }
        Some(size) => {
            let io_err = |what: &'static str| {
                let task_id = task_id.clone();
                move |e: io::Error| DriverError::Io {
                    task_id,
                    what,
                    path: PathBuf::from("/dev/ptmx"),
                    source: e,
                }
            };
            let winsize = nix::pty::Winsize {
                ws_row: size.rows,
                ws_col: size.cols,
                ws_xpixel: 0,
                ws_ypixel: 0,
            };
            let pty = nix::pty::openpty(Some(&winsize), None)
                .map_err(|e| io_err("opening a pseudo-terminal on")(e.into()))?;
            let dup = |fd: &OwnedFd| {
                fd.try_clone()
                    .map_err(io_err("duplicating the terminal of"))
            };
            command
                .stdin(Stdio::from(dup(&pty.slave)?))
                .stdout(Stdio::from(dup(&pty.slave)?))
                .stderr(Stdio::from(pty.slave));
            let spawned = command.spawn();
            // The command holds the terminal's side from now on: once it and its children
            // close it, reads of the master end.
            drop(command);
            let child = spawned.map_err(spawn_err(&cmd.program))?;
            let pgid = child.id().unwrap_or(0);
            // Blocking reads and writes on pool threads (registering the descriptor with the
            // reactor is unsafe); a read in flight ends with EIO once the command is gone.
            let reader = std::fs::File::from(dup(&pty.master)?);
            let writer = std::fs::File::from(dup(&pty.master)?);
            Ok(ExecSession {
                stdin: Box::new(PtyInput(tokio::fs::File::from_std(writer))),
                stdout: Box::new(PtyOutput(tokio::fs::File::from_std(reader))),
                stderr: None,
                process: ExecProcess {
                    child,
                    pgid,
                    pty: Some(Arc::new(pty.master)),
                    reaped: false,
                },
            })
        }
    }
}

/// The output of a pseudo-terminal's master: its end (EIO once every process closed the
/// terminal) reads as end of file.
struct PtyOutput(tokio::fs::File);

impl AsyncRead for PtyOutput {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match ready!(Pin::new(&mut self.0).poll_read(cx, buf)) {
            Err(e) if e.raw_os_error() == Some(nix::libc::EIO) => Poll::Ready(Ok(())),
            other => Poll::Ready(other),
        }
    }
}

/// A pipe to the command's input; shutting it down closes it (the command reads its end).
struct PipeInput(Option<tokio::process::ChildStdin>);

impl AsyncWrite for PipeInput {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.0.as_mut() {
            Some(pipe) => Pin::new(pipe).poll_write(cx, data),
            None => Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.0.as_mut() {
            Some(pipe) => Pin::new(pipe).poll_flush(cx),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.0 = None;
        Poll::Ready(Ok(()))
    }
}

/// The input of a pseudo-terminal's master.
struct PtyInput(tokio::fs::File);

impl AsyncWrite for PtyInput {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    /// A terminal's input is not closed (its master carries the output too): the end of the
    /// client's input sends nothing, as with `docker exec -t`. A `^D` would reach a program
    /// that set the terminal raw as a byte (podman does).
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
}

/// What `/proc` says about a task's process, for running a command as it runs.
#[derive(Debug, Clone)]
pub(crate) struct ProcessView {
    pub uid: u32,
    pub gid: u32,
    pub env: BTreeMap<OsString, OsString>,
    pub cwd: PathBuf,
    pub root: PathBuf,
}

impl ProcessView {
    /// Reads `/proc/<pid>`: real uid and gid, environment (as it started), working directory
    /// and root (as this process sees them).
    pub fn read(pid: u32) -> io::Result<Self> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let id_of = |key: &str| -> io::Result<u32> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| io::Error::other(format!("/proc/{pid}/status has no {key}")))
        };
        let environ = std::fs::read(format!("/proc/{pid}/environ"))?;
        let env = environ
            .split(|b| *b == 0)
            .filter(|kv| !kv.is_empty())
            .filter_map(|kv| {
                let at = kv.iter().position(|b| *b == b'=')?;
                Some((
                    OsString::from_vec(kv[..at].to_vec()),
                    OsString::from_vec(kv[at + 1..].to_vec()),
                ))
            })
            .collect();
        Ok(Self {
            uid: id_of("Uid:")?,
            gid: id_of("Gid:")?,
            env,
            cwd: std::fs::read_link(format!("/proc/{pid}/cwd"))?,
            root: std::fs::read_link(format!("/proc/{pid}/root"))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_checked_by_argument() {
        let req = |command: &[&str]| ExecRequest {
            command: command.iter().map(|s| s.to_string()).collect(),
            tty: None,
        };
        assert!(req(&["ls", "/"]).validate().is_ok());
        assert_eq!(
            req(&[]).validate().unwrap_err(),
            "command: must name a program"
        );
        assert!(req(&[""]).validate().unwrap_err().starts_with("command[0]"));
        assert!(
            req(&["sh", "a\0b"])
                .validate()
                .unwrap_err()
                .starts_with("command[1]")
        );
        let long = "x".repeat(MAX_EXEC_ARG_BYTES + 1);
        assert!(
            req(&["sh", &long])
                .validate()
                .unwrap_err()
                .starts_with("command[1]")
        );
        let mut tty = req(&["sh"]);
        tty.tty = Some(TerminalSize { cols: 0, rows: 5 });
        assert!(tty.validate().unwrap_err().starts_with("tty"));
    }

    #[tokio::test]
    async fn a_process_view_reads_this_process() {
        let me = ProcessView::read(std::process::id()).unwrap();
        assert_eq!(me.uid, nix::unistd::getuid().as_raw());
        assert_eq!(me.cwd, std::env::current_dir().unwrap());
        assert_eq!(me.root, Path::new("/"));
    }
}
