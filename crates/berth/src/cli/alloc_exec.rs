//! `berth alloc exec [-t] [--task T] ALLOC [TASK] CMD ARGS…`: runs a command inside a running
//! task, with this terminal's input and outputs, and exits with its exit code.

use std::io::{Read as _, Write as _};

use anyhow::{Context as _, bail};
use berth_api::allocs::{ExecRequest, Frame};
use clap::Args;
use tokio::sync::mpsc;

use super::{UsageError, api_client, job::parse_id};

/// Bytes of standard input sent at a time.
const STDIN_CHUNK: usize = 16 * 1024;

/// The command's exit code when it is not 0: `berth` exits with it (without a message).
#[derive(Debug, thiserror::Error)]
#[error("the command exited with code {0}")]
pub struct RemoteExit(pub u8);

/// A command run inside a task. Nomad's single-dash `-task` and `-t` work too.
#[derive(Debug, Args)]
pub(super) struct ExecArgs {
    /// Run it on a terminal (a pseudo-terminal on the node; this terminal, when standard input
    /// is one, goes into raw mode until it ends).
    #[arg(short = 't', long)]
    tty: bool,
    /// The task (else the word after ALLOC when it names one of the alloc's tasks, else the
    /// alloc's only task).
    #[arg(long = "task", value_name = "TASK")]
    task: Option<String>,
    /// The alloc id.
    #[arg(value_parser = parse_id)]
    alloc: String,
    /// [TASK] CMD ARGS…: the command and its arguments, taken as they are.
    #[arg(
        required = true,
        num_args = 1..,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    command: Vec<String>,
}

/// Splits `[TASK] CMD ARGS…` given the alloc's task names: the first word is the task when
/// no `--task` was given, more words follow, and it names a task of the alloc.
fn split_task(
    flag: Option<String>,
    words: Vec<String>,
    tasks: &[String],
) -> (Option<String>, Vec<String>) {
    if flag.is_some() {
        return (flag, words);
    }
    if words.len() >= 2 && tasks.contains(&words[0]) {
        let mut words = words;
        let task = words.remove(0);
        return (Some(task), words);
    }
    (None, words)
}

/// Restores the terminal's settings when dropped.
struct RawMode {
    saved: rustix::termios::Termios,
}

impl RawMode {
    /// Puts standard input's terminal in raw mode (each key goes to the command as it is,
    /// `^C` included); `None` when standard input is no terminal.
    fn enter() -> anyhow::Result<Option<Self>> {
        let stdin = std::io::stdin();
        if !rustix::termios::isatty(&stdin) {
            return Ok(None);
        }
        let saved = rustix::termios::tcgetattr(&stdin).context("reading the terminal's mode")?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, &raw)
            .context("putting the terminal in raw mode")?;
        Ok(Some(Self { saved }))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(
            std::io::stdin(),
            rustix::termios::OptionalActions::Now,
            &self.saved,
        );
    }
}

/// This terminal's size (standard output's, else input's), or 80×24.
fn terminal_size() -> (u16, u16) {
    let size = rustix::termios::tcgetwinsize(std::io::stdout())
        .or_else(|_| rustix::termios::tcgetwinsize(std::io::stdin()));
    match size {
        Ok(w) if w.ws_col > 0 && w.ws_row > 0 => (w.ws_col, w.ws_row),
        _ => (80, 24),
    }
}

/// Reads standard input on a thread of its own (a blocking read that the process's exit
/// ends), chunk by chunk; `None` at its end.
fn read_stdin() -> mpsc::Receiver<Option<Vec<u8>>> {
    let (tx, rx) = mpsc::channel(4);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; STDIN_CHUNK];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => {
                    let _ = tx.blocking_send(None);
                    return;
                }
                Ok(n) => {
                    if tx.blocking_send(Some(buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    });
    rx
}

/// Runs the command; returns `Ok` when it exited with 0, [`RemoteExit`] with its code else.
pub(super) async fn run(address: &api_client::AgentAddress, args: ExecArgs) -> anyhow::Result<()> {
    let client = api_client::connect(address)?;
    // The alloc's tasks tell `ALLOC TASK CMD` from `ALLOC CMD` (and an unknown alloc fails
    // here, with the agent's words).
    let tasks: Vec<String> = if args.task.is_none() && args.command.len() >= 2 {
        client.alloc(&args.alloc).await?.tasks.into_keys().collect()
    } else {
        Vec::new()
    };
    let (task, command) = split_task(args.task, args.command, &tasks);
    if command.is_empty() {
        return Err(UsageError("give the command to run after ALLOC [TASK]".into()).into());
    }
    let req = ExecRequest {
        alloc_id: args.alloc,
        task,
        command,
        tty: args.tty.then(terminal_size),
    };
    let mut stream = client.alloc_exec(&req).await?;
    let raw = if args.tty { RawMode::enter()? } else { None };
    let code = pump(&mut stream, args.tty).await;
    drop(raw);
    match code? {
        0 => Ok(()),
        // As a shell reports it: the low byte.
        code => Err(RemoteExit((code & 0xff) as u8).into()),
    }
}

/// Carries standard input, resizes and the command's outputs until its exit code arrives.
async fn pump(stream: &mut berth_api::client::ExecStream, tty: bool) -> anyhow::Result<i32> {
    let mut stdin = read_stdin();
    let mut stdin_open = true;
    let mut winch = if tty {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).ok()
    } else {
        None
    };
    loop {
        tokio::select! {
            frame = stream.frames.next() => match frame? {
                Some(Frame::Stdout(data)) => {
                    let mut out = std::io::stdout().lock();
                    out.write_all(&data).and_then(|()| out.flush()).context("writing to standard output")?;
                }
                Some(Frame::Stderr(data)) => {
                    let mut err = std::io::stderr().lock();
                    let _ = err.write_all(&data).and_then(|()| err.flush());
                }
                Some(Frame::Exit(code)) => return Ok(code),
                Some(Frame::Error(message)) => bail!("the exec session broke: {message}"),
                Some(_) => {}
                None => bail!("the agent ended the exec session before the command exited (is it shutting down?)"),
            },
            chunk = stdin.recv(), if stdin_open => match chunk.flatten() {
                Some(data) => stream.input.send(&Frame::Stdin(data)).await?,
                None => {
                    stdin_open = false;
                    stream.input.send(&Frame::CloseStdin).await?;
                }
            },
            Some(()) = async { match winch.as_mut() {
                Some(w) => w.recv().await,
                None => std::future::pending().await,
            } } => {
                let (cols, rows) = terminal_size();
                stream.input.send(&Frame::Resize { cols, rows }).await?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_task_is_the_first_word_when_it_names_one() {
        let tasks = words(&["web", "ls"]);
        assert_eq!(
            split_task(None, words(&["web", "ls", "/"]), &tasks),
            (Some("web".into()), words(&["ls", "/"]))
        );
        // One word: the command.
        assert_eq!(
            split_task(None, words(&["web"]), &tasks),
            (None, words(&["web"]))
        );
        assert_eq!(
            split_task(None, words(&["cat", "x"]), &tasks),
            (None, words(&["cat", "x"]))
        );
        // --task wins: the words are the command.
        assert_eq!(
            split_task(Some("web".into()), words(&["ls", "/"]), &tasks),
            (Some("web".into()), words(&["ls", "/"]))
        );
    }
}
