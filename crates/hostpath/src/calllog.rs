//! The call log (tests only): with `--call-log FILE` (or `BERTH_HOSTPATH_CALL_LOG=FILE`) the
//! plugin appends one line per RPC to `FILE`, so a test can check which RPCs it saw, in order:
//!
//! ```text
//! <RpcName> <volume_id or -> <CODE>
//! ```
//!
//! `RpcName` is the CSI method name (`NodeUnpublishVolume`), the volume id is the request's
//! volume field (`source_volume_id` for CreateSnapshot and ListSnapshots; `-` for methods
//! without one or when it is empty), and `CODE` is `OK` or the gRPC code the caller got, spelled
//! as the fault switch spells it (`UNAVAILABLE`, `DEADLINE_EXCEEDED`…). A call whose caller went
//! away before it finished is logged as `CANCELLED`; a call ended by an `exit` fault is not
//! logged. In a volume id, `%`, whitespace, control and non-ASCII bytes are written as `%XX`,
//! and an id that is exactly `-` as `%2D`; [`read`] decodes them.
//!
//! Each line is written with one `write` to a file opened with `O_APPEND` before the answer is
//! sent, so lines of concurrent calls never mix, and a test that got an answer finds its line.
//! Nothing else from the request (no paths, secrets or mount flags) is written.

use std::{
    fmt,
    fs::{File, OpenOptions},
    io::{self, Write as _},
    path::{Path, PathBuf},
    str::FromStr,
};

use berth_csi::Rpc;
use tonic::Code;

use crate::faults;

/// Written instead of a volume id for calls without one.
pub const NO_VOLUME: &str = "-";

/// One line of the call log.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Call {
    /// CSI method name, e.g. `NodeStageVolume`.
    pub rpc: String,
    /// The volume the call named, if any.
    pub volume_id: Option<String>,
    /// `OK`, or the gRPC code name the caller got, e.g. `UNAVAILABLE`.
    pub code: String,
}

impl Call {
    /// Whether the call succeeded.
    pub fn is_ok(&self) -> bool {
        self.code == "OK"
    }

    /// The gRPC code, if `code` is a known name.
    pub fn grpc_code(&self) -> Option<Code> {
        faults::code_from_name(&self.code)
    }
}

/// The line as written, without its newline.
impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let id = self.volume_id.as_deref().unwrap_or_default();
        write!(f, "{} {} {}", self.rpc, encode_id(id), self.code)
    }
}

/// A line of a call log that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("call log line {line}: {reason}")]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub reason: String,
}

impl FromStr for Call {
    type Err = String;

    fn from_str(line: &str) -> Result<Self, Self::Err> {
        let fields: Vec<&str> = line.split(' ').collect();
        let [rpc, id, code] = fields[..] else {
            return Err(format!(
                "expected \"<RpcName> <volume_id or -> <CODE>\", got {line:?}"
            ));
        };
        if rpc.is_empty() || code.is_empty() {
            return Err(format!("empty field in {line:?}"));
        }
        Ok(Self {
            rpc: rpc.to_owned(),
            volume_id: decode_id(id)?,
            code: code.to_owned(),
        })
    }
}

/// Parses the text of a call log. A last line without its newline is a write in progress and is
/// left out.
pub fn parse(text: &str) -> Result<Vec<Call>, ParseError> {
    let complete = match text.rfind('\n') {
        Some(end) => &text[..=end],
        None => "",
    };
    complete
        .lines()
        .enumerate()
        .map(|(i, line)| {
            line.parse().map_err(|reason| ParseError {
                line: i + 1,
                reason,
            })
        })
        .collect()
}

/// Reads and parses the call log at `path`, in the order the calls ended. A malformed line is
/// an [`io::ErrorKind::InvalidData`] error holding a [`ParseError`].
pub fn read(path: impl AsRef<Path>) -> io::Result<Vec<Call>> {
    let text = std::fs::read_to_string(path)?;
    parse(&text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

fn encode_id(id: &str) -> String {
    if id.is_empty() {
        return NO_VOLUME.to_owned();
    }
    if id == NO_VOLUME {
        return "%2D".to_owned();
    }
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        if b.is_ascii_graphic() && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn decode_id(field: &str) -> Result<Option<String>, String> {
    if field == NO_VOLUME {
        return Ok(None);
    }
    let bad = || format!("bad volume id field {field:?}");
    let mut bytes = Vec::with_capacity(field.len());
    let mut rest = field.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'%' {
            let hex = tail.get(..2).ok_or_else(bad)?;
            let hex = std::str::from_utf8(hex).map_err(|_| bad())?;
            bytes.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
            rest = &tail[2..];
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    let id = String::from_utf8(bytes).map_err(|_| bad())?;
    if id.is_empty() {
        return Err(bad());
    }
    Ok(Some(id))
}

/// The open call log of a plugin instance.
#[derive(Debug)]
pub(crate) struct CallLog {
    path: PathBuf,
    file: File,
}

impl CallLog {
    /// Opens (creates) `path` for appending.
    pub(crate) fn open(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new().append(true).create(true).open(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
        })
    }

    /// Starts the entry of a call; it is written by [`Entry::finish`], or as `CANCELLED` if
    /// the entry is dropped unfinished (the caller went away).
    pub(crate) fn entry<'a>(&'a self, rpc: Rpc, volume_id: &'a str) -> Entry<'a> {
        Entry {
            log: self,
            rpc,
            volume_id,
            done: false,
        }
    }

    fn append(&self, rpc: Rpc, volume_id: &str, code: Code) {
        let call = Call {
            rpc: rpc.to_string(),
            volume_id: Some(volume_id.to_owned()),
            code: faults::code_name(code).to_owned(),
        };
        let line = format!("{call}\n");
        // One write(2) on an O_APPEND file: the line lands whole, after every earlier one.
        let result = (&self.file).write(line.as_bytes()).and_then(|n| {
            if n == line.len() {
                Ok(())
            } else {
                Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!("short write ({n} of {} bytes)", line.len()),
                ))
            }
        });
        if let Err(e) = result {
            tracing::warn!(path = %self.path.display(), error = %e, "could not write the call log");
        }
    }
}

/// A call not yet logged; see [`CallLog::entry`].
#[derive(Debug)]
pub(crate) struct Entry<'a> {
    log: &'a CallLog,
    rpc: Rpc,
    volume_id: &'a str,
    done: bool,
}

impl Entry<'_> {
    /// Logs the call with the code its caller gets.
    pub(crate) fn finish(mut self, code: Code) {
        self.done = true;
        self.log.append(self.rpc, self.volume_id, code);
    }
}

impl Drop for Entry<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.log.append(self.rpc, self.volume_id, Code::Cancelled);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(rpc: &str, id: Option<&str>, code: &str) -> Call {
        Call {
            rpc: rpc.to_owned(),
            volume_id: id.map(str::to_owned),
            code: code.to_owned(),
        }
    }

    #[test]
    fn lines_round_trip() {
        for id in [
            None,
            Some("v1"),
            Some("-"),
            Some("a b\tc\nd"),
            Some("100%"),
            Some("vol-é"),
            Some("--"),
        ] {
            let c = call("NodeStageVolume", id, "OK");
            let line = c.to_string();
            assert_eq!(line.split(' ').count(), 3, "{line:?}");
            assert!(!line.contains('\n'));
            assert_eq!(line.parse::<Call>(), Ok(c), "{line:?}");
        }
        assert_eq!(
            call("Probe", None, "UNAVAILABLE").to_string(),
            "Probe - UNAVAILABLE"
        );
        assert_eq!(call("X", Some("-"), "OK").to_string(), "X %2D OK");
    }

    #[test]
    fn parse_skips_a_partial_last_line_and_names_bad_lines() {
        let calls = parse("Probe - OK\nNodeStageVolume v1 UNAVAILABLE\nNodeSt").expect("parses");
        assert_eq!(
            calls,
            [
                call("Probe", None, "OK"),
                call("NodeStageVolume", Some("v1"), "UNAVAILABLE")
            ]
        );
        assert!(calls[0].is_ok() && !calls[1].is_ok());
        assert_eq!(calls[1].grpc_code(), Some(Code::Unavailable));
        assert_eq!(parse(""), Ok(Vec::new()));

        for bad in [
            "Probe OK\n",
            "Probe - OK extra\n",
            "Probe %4 OK\n",
            "Probe %FF OK\n",
        ] {
            let e = parse(&format!("Probe - OK\n{bad}")).unwrap_err();
            assert_eq!(e.line, 2, "{bad:?}: {e}");
        }
    }

    #[test]
    fn entries_append_whole_lines_and_dropped_ones_are_cancelled() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("calls");
        std::fs::write(&path, "Probe - OK\n").expect("earlier content");
        let log = CallLog::open(&path).expect("open");
        log.entry(Rpc::NodeStageVolume, "v 1")
            .finish(Code::Unavailable);
        log.entry(Rpc::NodeGetInfo, "").finish(Code::Ok);
        drop(log.entry(Rpc::NodeUnstageVolume, "v2"));
        assert_eq!(
            read(&path).expect("read"),
            [
                call("Probe", None, "OK"),
                call("NodeStageVolume", Some("v 1"), "UNAVAILABLE"),
                call("NodeGetInfo", None, "OK"),
                call("NodeUnstageVolume", Some("v2"), "CANCELLED"),
            ]
        );
    }

    #[test]
    fn concurrent_writers_never_mix_lines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("calls");
        let log = CallLog::open(&path).expect("open");
        let id = "x".repeat(200);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..200 {
                        log.entry(Rpc::NodePublishVolume, &id).finish(Code::Ok);
                    }
                });
            }
        });
        let calls = read(&path).expect("read");
        assert_eq!(calls.len(), 1600);
        assert!(
            calls
                .iter()
                .all(|c| c.volume_id.as_deref() == Some(id.as_str()))
        );
    }
}
