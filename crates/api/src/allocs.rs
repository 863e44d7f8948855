//! What `alloc logs` and `alloc exec` ask for over the API, and what the agent hands back: a
//! task's log as a byte stream ([`LogStream`]), a command running in a task ([`ExecSession`]).
//!
//! The exec route upgrades its HTTP/1.1 connection to [`EXEC_PROTOCOL`], a stream of frames
//! both ways ([`Frame`]): each is one byte of kind, four bytes of payload length (big-endian),
//! then the payload (at most [`MAX_FRAME_PAYLOAD`] bytes).
//!
//! | kind | direction | payload |
//! |---|---|---|
//! | `0x00` stdin | client → agent | bytes for the command's input |
//! | `0x01` stdin closed | client → agent | none: the input ends (ignored with a terminal, which stays open) |
//! | `0x02` resize | client → agent | columns, rows (two u16, big-endian) |
//! | `0x10` stdout | agent → client | bytes of its output (a terminal's, with `tty`) |
//! | `0x11` stderr | agent → client | bytes of its error output |
//! | `0x12` exit | agent → client | its exit code (i32, big-endian; 128 + n for signal n): the last frame |
//! | `0x13` error | agent → client | why the session broke (UTF-8): the last frame |
//!
//! The agent ends the session after `exit` or `error`; a client that closes the connection
//! before `exit` ends the command (it is killed).

use std::{collections::BTreeMap, fmt, future::Future, io, pin::Pin};

use futures::Stream;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite};

use crate::server::ApiError;

/// The protocol name of the exec route's upgrade (`Upgrade: berth-exec`).
pub const EXEC_PROTOCOL: &str = "berth-exec";

/// Most bytes in one frame's payload.
pub const MAX_FRAME_PAYLOAD: usize = 64 * 1024;

/// Most arguments of an exec'd command (the drivers' limit).
pub const MAX_EXEC_ARGS: usize = 256;

/// Longest argument of an exec'd command, in bytes.
pub const MAX_EXEC_ARG_BYTES: usize = 4096;

/// Which output of a task.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogType {
    /// Its standard output.
    #[default]
    Stdout,
    /// Its standard error.
    Stderr,
}

impl LogType {
    /// `stdout` or `stderr`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stdout => "stdout",
            Self::Stderr => "stderr",
        }
    }
}

/// Where `offset` counts from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogOrigin {
    /// The first byte still kept (of the oldest file).
    #[default]
    Start,
    /// The last byte written so far.
    End,
}

impl LogOrigin {
    /// `start` or `end`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Start => "start",
            Self::End => "end",
        }
    }
}

/// `GET /v1/client/fs/logs/{alloc_id}`: which bytes of which output of which task.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogsRequest {
    /// The alloc.
    pub alloc_id: String,
    /// The task; may be left out when the alloc has one task.
    pub task: Option<String>,
    /// Which output (`type`).
    pub log_type: LogType,
    /// Where `offset` counts from.
    pub origin: LogOrigin,
    /// Bytes from `origin` (towards the end from `start`, back from `end`).
    pub offset: u64,
    /// Keep sending what is written from then on, until the alloc is terminal and everything
    /// was sent (or the agent shuts down).
    pub follow: bool,
    /// Start at the beginning of the last `lines` lines instead (counted back from the end;
    /// `origin` and `offset` must then be left out).
    pub lines: Option<u64>,
}

impl LogsRequest {
    /// The query string the route reads (without `?`): only what differs from the defaults,
    /// `type` always.
    pub fn query(&self) -> String {
        let mut q = vec![format!("type={}", self.log_type.as_str())];
        if let Some(task) = &self.task {
            q.push(format!("task={}", crate::client::encode_component(task)));
        }
        if self.origin != LogOrigin::Start {
            q.push(format!("origin={}", self.origin.as_str()));
        }
        if self.offset != 0 {
            q.push(format!("offset={}", self.offset));
        }
        if self.follow {
            q.push("follow=true".into());
        }
        if let Some(n) = self.lines {
            q.push(format!("lines={n}"));
        }
        q.join("&")
    }

    /// The request from a route's query parameters (names already checked). The error names
    /// the parameter.
    pub(crate) fn from_query(
        alloc_id: String,
        q: &BTreeMap<&'static str, String>,
    ) -> Result<Self, ApiError> {
        let bad = |m: String| ApiError::BadRequest(m);
        let task = q.get("task").cloned();
        if let Some(t) = &task {
            berth_sys::validate_path_segment("task name", t)
                .map_err(|e| bad(format!("query parameter `task`: {e}")))?;
        }
        let log_type = match q.get("type").map(String::as_str) {
            None | Some("stdout") => LogType::Stdout,
            Some("stderr") => LogType::Stderr,
            Some(_) => {
                return Err(bad("query parameter `type` must be stdout or stderr".into()));
            }
        };
        let origin = match q.get("origin").map(String::as_str) {
            None | Some("start") => LogOrigin::Start,
            Some("end") => LogOrigin::End,
            Some(_) => {
                return Err(bad("query parameter `origin` must be start or end".into()));
            }
        };
        let number = |name: &str| -> Result<Option<u64>, ApiError> {
            q.get(name)
                .map(|v| {
                    v.parse::<u64>().map_err(|_| {
                        bad(format!(
                            "query parameter `{name}` must be a whole number of at most {}",
                            u64::MAX
                        ))
                    })
                })
                .transpose()
        };
        let offset = number("offset")?;
        let lines = number("lines")?;
        let follow = match q.get("follow").map(String::as_str) {
            None | Some("false") => false,
            Some("true") => true,
            Some(_) => {
                return Err(bad("query parameter `follow` must be true or false".into()));
            }
        };
        if lines.is_some() && (offset.is_some() || q.contains_key("origin")) {
            return Err(bad(
                "query parameter `lines` counts back from the end: leave out `origin` and \
                 `offset` with it"
                    .into(),
            ));
        }
        Ok(Self {
            alloc_id,
            task,
            log_type,
            origin,
            offset: offset.unwrap_or(0),
            follow,
            lines,
        })
    }
}

/// A task's log as the agent sends it: raw bytes, in order.
pub type LogStream = Pin<Box<dyn Stream<Item = io::Result<Vec<u8>>> + Send>>;

/// `POST /v1/client/allocation/{alloc_id}/exec`: a command to run in one of the alloc's
/// tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    /// The alloc.
    pub alloc_id: String,
    /// The task; may be left out when the alloc has one task.
    pub task: Option<String>,
    /// The program and its arguments.
    pub command: Vec<String>,
    /// Run it on a terminal of `(columns, rows)`.
    pub tty: Option<(u16, u16)>,
}

impl ExecRequest {
    /// The query string the route reads (without `?`).
    pub fn query(&self) -> String {
        let command = serde_json::to_string(&self.command).unwrap_or_default();
        let mut q = vec![format!(
            "command={}",
            crate::client::encode_component(&command)
        )];
        if let Some(task) = &self.task {
            q.push(format!("task={}", crate::client::encode_component(task)));
        }
        if let Some((cols, rows)) = self.tty {
            q.push(format!("tty=true&cols={cols}&rows={rows}"));
        }
        q.join("&")
    }

    /// The request from a route's query parameters (names already checked). The error names
    /// the parameter (and the argument of `command`), never repeats a value.
    pub(crate) fn from_query(
        alloc_id: String,
        q: &BTreeMap<&'static str, String>,
    ) -> Result<Self, ApiError> {
        let bad = |m: String| ApiError::BadRequest(m);
        let task = q.get("task").cloned();
        if let Some(t) = &task {
            berth_sys::validate_path_segment("task name", t)
                .map_err(|e| bad(format!("query parameter `task`: {e}")))?;
        }
        let Some(text) = q.get("command") else {
            return Err(bad(
                "query parameter `command` is required: a JSON array of strings, the program \
                 first"
                    .into(),
            ));
        };
        let command: Vec<String> = serde_json::from_str(text)
            .map_err(|_| bad("query parameter `command` must be a JSON array of strings".into()))?;
        check_command(&command).map_err(|m| bad(format!("query parameter `command`: {m}")))?;
        let size = |name: &str| -> Result<Option<u16>, ApiError> {
            q.get(name)
                .map(|v| {
                    v.parse::<u16>().ok().filter(|n| *n > 0).ok_or_else(|| {
                        bad(format!(
                            "query parameter `{name}` must be a whole number from 1 to 65535"
                        ))
                    })
                })
                .transpose()
        };
        let tty = match q.get("tty").map(String::as_str) {
            None | Some("false") => None,
            Some("true") => Some((size("cols")?.unwrap_or(80), size("rows")?.unwrap_or(24))),
            Some(_) => return Err(bad("query parameter `tty` must be true or false".into())),
        };
        if tty.is_none() && (q.contains_key("cols") || q.contains_key("rows")) {
            return Err(bad(
                "query parameters `cols` and `rows` size a terminal: give them with tty=true"
                    .into(),
            ));
        }
        Ok(Self {
            alloc_id,
            task,
            command,
            tty,
        })
    }
}

/// Checks an exec'd command: 1 to [`MAX_EXEC_ARGS`] arguments of at most
/// [`MAX_EXEC_ARG_BYTES`], without NUL, the program not empty.
pub fn check_command(command: &[String]) -> Result<(), String> {
    if command.is_empty() || command[0].is_empty() {
        return Err("must name a program".into());
    }
    if command.len() > MAX_EXEC_ARGS {
        return Err(format!(
            "{} arguments; at most {MAX_EXEC_ARGS}",
            command.len()
        ));
    }
    for (i, arg) in command.iter().enumerate() {
        if arg.len() > MAX_EXEC_ARG_BYTES {
            return Err(format!(
                "argument {i} has {} bytes; at most {MAX_EXEC_ARG_BYTES}",
                arg.len()
            ));
        }
        if arg.contains('\0') {
            return Err(format!("argument {i} holds a NUL byte"));
        }
    }
    Ok(())
}

/// A boxed reader of a command's output.
pub type ExecReader = Pin<Box<dyn AsyncRead + Send>>;

/// A boxed writer of a command's input.
pub type ExecWriter = Pin<Box<dyn AsyncWrite + Send>>;

/// Sets the size of a command's terminal (nothing without one).
pub type Resize = Box<dyn Fn(u16, u16) -> io::Result<()> + Send + Sync>;

/// How the command ended: its exit code (128 + n when killed by signal n). Dropping it
/// before it resolves kills the command.
pub type ExecExit = Pin<Box<dyn Future<Output = io::Result<i32>> + Send>>;

/// A command running in a task, as the agent hands it to the route.
pub struct ExecSession {
    /// Its input; shutting it down ends the input.
    pub stdin: ExecWriter,
    /// Its output (the terminal's, with a terminal).
    pub stdout: ExecReader,
    /// Its error output; `None` with a terminal.
    pub stderr: Option<ExecReader>,
    /// Resizes its terminal.
    pub resize: Resize,
    /// Resolves when it has exited and what it left running is gone.
    pub exit: ExecExit,
}

impl fmt::Debug for ExecSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecSession")
            .field("tty", &self.stderr.is_none())
            .finish_non_exhaustive()
    }
}

/// One frame of the exec stream (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Input for the command.
    Stdin(Vec<u8>),
    /// The input ends.
    CloseStdin,
    /// The client's terminal has a new size.
    Resize {
        /// Columns.
        cols: u16,
        /// Rows.
        rows: u16,
    },
    /// Output of the command.
    Stdout(Vec<u8>),
    /// Error output of the command.
    Stderr(Vec<u8>),
    /// The command exited with this code.
    Exit(i32),
    /// The session broke.
    Error(String),
}

const STDIN: u8 = 0x00;
const CLOSE_STDIN: u8 = 0x01;
const RESIZE: u8 = 0x02;
const STDOUT: u8 = 0x10;
const STDERR: u8 = 0x11;
const EXIT: u8 = 0x12;
const ERROR: u8 = 0x13;

impl Frame {
    /// The frame's bytes. Data longer than [`MAX_FRAME_PAYLOAD`] must be split by the caller
    /// (see [`Frame::data`]).
    pub fn encode(&self) -> Vec<u8> {
        let (kind, payload): (u8, Vec<u8>) = match self {
            Self::Stdin(d) => (STDIN, d.clone()),
            Self::CloseStdin => (CLOSE_STDIN, Vec::new()),
            Self::Resize { cols, rows } => {
                let mut p = cols.to_be_bytes().to_vec();
                p.extend_from_slice(&rows.to_be_bytes());
                (RESIZE, p)
            }
            Self::Stdout(d) => (STDOUT, d.clone()),
            Self::Stderr(d) => (STDERR, d.clone()),
            Self::Exit(code) => (EXIT, code.to_be_bytes().to_vec()),
            Self::Error(m) => (ERROR, m.as_bytes().to_vec()),
        };
        let mut out = Vec::with_capacity(5 + payload.len());
        out.push(kind);
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(&payload);
        out
    }

    /// `data` as frames made by `make`, each at most [`MAX_FRAME_PAYLOAD`] bytes.
    pub fn data(data: &[u8], make: fn(Vec<u8>) -> Frame) -> Vec<Frame> {
        data.chunks(MAX_FRAME_PAYLOAD)
            .map(|c| make(c.to_vec()))
            .collect()
    }

    /// Reads the next frame; `Ok(None)` at a clean end of the stream (between frames). A
    /// stream cut inside a frame, an unknown kind, a payload over the limit or of the wrong
    /// size for its kind is an `InvalidData` error.
    pub async fn read<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Option<Frame>> {
        let mut head = [0u8; 5];
        let mut got = 0;
        while got < head.len() {
            match r.read(&mut head[got..]).await? {
                0 if got == 0 => return Ok(None),
                0 => return Err(invalid("the stream ended inside a frame")),
                n => got += n,
            }
        }
        let kind = head[0];
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        if len > MAX_FRAME_PAYLOAD {
            return Err(invalid("a frame is larger than the limit"));
        }
        let mut payload = vec![0u8; len];
        r.read_exact(&mut payload).await.map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                invalid("the stream ended inside a frame")
            } else {
                e
            }
        })?;
        let sized = |n: usize| {
            if payload.len() == n {
                Ok(())
            } else {
                Err(invalid("a frame has the wrong size for its kind"))
            }
        };
        Ok(Some(match kind {
            STDIN => Self::Stdin(payload),
            CLOSE_STDIN => {
                sized(0)?;
                Self::CloseStdin
            }
            RESIZE => {
                sized(4)?;
                Self::Resize {
                    cols: u16::from_be_bytes([payload[0], payload[1]]),
                    rows: u16::from_be_bytes([payload[2], payload[3]]),
                }
            }
            STDOUT => Self::Stdout(payload),
            STDERR => Self::Stderr(payload),
            EXIT => {
                sized(4)?;
                Self::Exit(i32::from_be_bytes([
                    payload[0], payload[1], payload[2], payload[3],
                ]))
            }
            ERROR => Self::Error(String::from_utf8_lossy(&payload).into_owned()),
            _ => return Err(invalid("a frame has an unknown kind")),
        }))
    }
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_and_bad_ones_are_refused() {
        let frames = [
            Frame::Stdin(b"abc".to_vec()),
            Frame::CloseStdin,
            Frame::Resize {
                cols: 120,
                rows: 40,
            },
            Frame::Stdout(vec![0, 255, 10]),
            Frame::Stderr(Vec::new()),
            Frame::Exit(-3),
            Frame::Error("gone".into()),
        ];
        let bytes: Vec<u8> = frames.iter().flat_map(Frame::encode).collect();
        let mut r = &bytes[..];
        for f in &frames {
            assert_eq!(Frame::read(&mut r).await.unwrap().as_ref(), Some(f));
        }
        assert_eq!(Frame::read(&mut r).await.unwrap(), None);

        let refused = |bytes: Vec<u8>| async move {
            let mut r = &bytes[..];
            Frame::read(&mut r).await.unwrap_err().kind()
        };
        assert_eq!(
            refused(vec![0x7f, 0, 0, 0, 0]).await,
            io::ErrorKind::InvalidData
        );
        assert_eq!(
            refused(vec![STDOUT, 0, 0, 0, 5, 1]).await,
            io::ErrorKind::InvalidData
        );
        assert_eq!(
            refused(vec![STDOUT, 0, 0]).await,
            io::ErrorKind::InvalidData
        );
        assert_eq!(
            refused(vec![EXIT, 0, 0, 0, 1, 1]).await,
            io::ErrorKind::InvalidData
        );
        assert_eq!(
            refused(vec![STDIN, 0, 2, 0, 1]).await,
            io::ErrorKind::InvalidData,
            "over the limit"
        );
        let split = Frame::data(&vec![7u8; MAX_FRAME_PAYLOAD + 1], Frame::Stdout);
        assert_eq!(split.len(), 2);
    }

    fn q(pairs: &[(&'static str, &str)]) -> BTreeMap<&'static str, String> {
        pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
    }

    #[test]
    fn log_queries_are_checked_by_parameter() {
        let ok = LogsRequest::from_query(
            "a".into(),
            &q(&[
                ("task", "web"),
                ("type", "stderr"),
                ("follow", "true"),
                ("lines", "5"),
            ]),
        )
        .unwrap();
        assert_eq!(ok.task.as_deref(), Some("web"));
        assert_eq!(ok.log_type, LogType::Stderr);
        assert!(ok.follow);
        assert_eq!(ok.lines, Some(5));
        for (pairs, names) in [
            (vec![("task", "../x")], "`task`"),
            (vec![("type", "both")], "`type`"),
            (vec![("origin", "middle")], "`origin`"),
            (vec![("offset", "-1")], "`offset`"),
            (vec![("follow", "yes")], "`follow`"),
            (vec![("lines", "3"), ("origin", "end")], "`lines`"),
        ] {
            let e = LogsRequest::from_query("a".into(), &q(&pairs)).unwrap_err();
            assert!(e.to_string().contains(names), "{pairs:?}: {e}");
        }
        let r = LogsRequest {
            alloc_id: "a".into(),
            task: Some("my task".into()),
            log_type: LogType::Stdout,
            origin: LogOrigin::End,
            offset: 10,
            follow: true,
            lines: None,
        };
        assert_eq!(
            r.query(),
            "type=stdout&task=my%20task&origin=end&offset=10&follow=true"
        );
    }

    #[test]
    fn exec_queries_are_checked_by_parameter() {
        let ok = ExecRequest::from_query(
            "a".into(),
            &q(&[
                ("command", r#"["sh","-c","exit 3"]"#),
                ("tty", "true"),
                ("cols", "100"),
            ]),
        )
        .unwrap();
        assert_eq!(ok.command, ["sh", "-c", "exit 3"]);
        assert_eq!(ok.tty, Some((100, 24)));
        for (pairs, names) in [
            (vec![], "`command` is required"),
            (vec![("command", "ls")], "JSON array"),
            (vec![("command", "[]")], "must name a program"),
            (vec![("command", r#"["a\u0000"]"#)], "NUL"),
            (vec![("command", r#"["ls"]"#), ("tty", "maybe")], "`tty`"),
            (vec![("command", r#"["ls"]"#), ("cols", "80")], "tty=true"),
            (
                vec![("command", r#"["ls"]"#), ("tty", "true"), ("rows", "0")],
                "`rows`",
            ),
            (vec![("command", r#"["ls"]"#), ("task", "a/b")], "`task`"),
        ] {
            let e = ExecRequest::from_query("a".into(), &q(&pairs)).unwrap_err();
            assert!(e.to_string().contains(names), "{pairs:?}: {e}");
        }
        let r = ExecRequest {
            alloc_id: "a".into(),
            task: None,
            command: vec!["ls".into(), "/".into()],
            tty: Some((80, 24)),
        };
        let q = r.query();
        assert!(q.starts_with("command=%5B%22ls%22%2C%22%2F%22%5D"), "{q}");
        assert!(q.ends_with("tty=true&cols=80&rows=24"), "{q}");
    }
}
