//! Human tables and JSON for command output, and the words they are written in.
//!
//! Everything a command prints on standard output goes through here: a closed standard output
//! (`berth … | head -1`) becomes [`StdoutClosed`], which ends the command quietly with success,
//! and every value printed in a table or a line is [`escape`]d, so text that came from the
//! agent or a plugin can neither forge a line nor reach the terminal as a control sequence.
//! A task's own output (`alloc logs`, `alloc exec`) is the exception: it is written as the
//! task wrote it ([`raw`]), as `cat` or Nomad's `alloc logs` would.

use std::{
    borrow::Cow,
    fmt::{self, Write as _},
    io::{self, Write as _},
};

use serde::Serialize;

/// Standard output was closed by the reader (`| head`): the command stops quietly, with
/// success.
#[derive(Debug, thiserror::Error)]
#[error("standard output is closed")]
pub struct StdoutClosed;

/// A write to standard output that failed for another reason than a closed pipe.
#[derive(Debug, thiserror::Error)]
#[error("cannot write to standard output")]
pub struct StdoutError(#[source] io::Error);

fn stdout_error(e: io::Error) -> anyhow::Error {
    if e.kind() == io::ErrorKind::BrokenPipe {
        StdoutClosed.into()
    } else {
        StdoutError(e).into()
    }
}

/// Writes `text` to standard output and flushes it.
fn write_out(text: &str) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes()).map_err(stdout_error)?;
    out.flush().map_err(stdout_error)
}

/// Writes `bytes` to standard output as they are and flushes them: a task's own output
/// (`alloc logs`, `alloc exec`), shown unchanged as `cat` would show it, not a value of a
/// table.
pub fn raw(bytes: &[u8]) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(bytes).map_err(stdout_error)?;
    out.flush().map_err(stdout_error)
}

/// Prints one line on standard output, as it is: the caller escapes what came from elsewhere
/// (see [`escape`]). Use through [`say!`](crate::say).
pub fn line(args: fmt::Arguments<'_>) -> anyhow::Result<()> {
    let mut text = args.to_string();
    text.push('\n');
    write_out(&text)
}

/// `println!` that returns an error instead of panicking, and [`StdoutClosed`] when the reader
/// went away.
#[macro_export]
macro_rules! say {
    () => {
        $crate::cli::output::line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::cli::output::line(format_args!($($arg)*))
    };
}

/// Prints `value` as pretty JSON on stdout (JSON escapes control characters itself).
pub fn json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    let mut text = serde_json::to_string_pretty(value)?;
    text.push('\n');
    write_out(&text)
}

/// Prints `key  value` lines, keys aligned; values escaped.
pub fn fields(rows: &[(&str, String)]) -> anyhow::Result<()> {
    write_out(&render_fields(rows))
}

fn render_fields(rows: &[(&str, String)]) -> String {
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut text = String::new();
    for (k, v) in rows {
        let _ = writeln!(text, "{k:<width$}  {}", escape(v));
    }
    text
}

/// Prints a table with a header row, columns aligned; cells escaped.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> anyhow::Result<()> {
    write_out(&render_table(header, rows))
}

fn render_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<Cow<'_, str>>> = rows
        .iter()
        .map(|row| row.iter().map(|c| escape(c)).collect())
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    let mut line = |cells: &[&str]| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(cell);
            } else {
                let _ = write!(s, "{cell:<w$}  ");
            }
        }
        text.push_str(s.trim_end());
        text.push('\n');
    };
    line(header);
    for row in &rows {
        line(&row.iter().map(AsRef::as_ref).collect::<Vec<&str>>());
    }
    text
}

/// `s` with every control character (newline, tab, ESC…) and bidirectional-text control
/// written as an escape (`\n`, `\t`, `\u{1b}`, `\u{202e}`), so it stays on one line and cannot
/// drive the terminal. Other text is left as it is.
pub fn escape(s: &str) -> Cow<'_, str> {
    escape_except(s, None)
}

/// Like [`escape`], but `\n` stays a line break: for error messages that may span lines.
pub fn escape_keeping_lines(s: &str) -> Cow<'_, str> {
    escape_except(s, Some('\n'))
}

fn escape_except(s: &str, keep: Option<char>) -> Cow<'_, str> {
    let unsafe_char = |c: char| berth_sys::is_unprintable(c) && Some(c) != keep;
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            c if !unsafe_char(c) => out.push(c),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
        }
    }
    Cow::Owned(out)
}

/// `s` in double quotes, escaped (quotes and backslashes too): for an id in a sentence.
pub fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in escape(s).chars() {
        if c == '"' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// `k=v, k=v` for a map; `-` when empty.
pub fn map<'a>(m: impl IntoIterator<Item = (&'a String, &'a String)>) -> String {
    let s: Vec<String> = m.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
    if s.is_empty() {
        "-".into()
    } else {
        s.join(", ")
    }
}

/// A capacity for people (see [`size`]); `-` for 0 (unknown).
pub fn capacity(bytes: i64) -> String {
    if bytes == 0 { "-".into() } else { size(bytes) }
}

/// A byte count for people: `512B`, `1GiB`, `1.5GiB` (binary units, one decimal at most);
/// `-` for a negative count.
pub fn size(bytes: i64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 0 {
        return "-".into();
    }
    if bytes < 1024 {
        return format!("{bytes}B");
    }
    let mut unit = 0;
    let mut scale: i64 = 1024;
    while unit + 1 < UNITS.len() && bytes / scale >= 1024 {
        unit += 1;
        scale *= 1024;
    }
    if bytes % scale == 0 {
        return format!("{}{}", bytes / scale, UNITS[unit]);
    }
    // Tenths, rounded; may round up to a whole number.
    let tenths = (i128::from(bytes) * 10 + i128::from(scale) / 2) / i128::from(scale);
    if tenths % 10 == 0 {
        format!("{}{}", tenths / 10, UNITS[unit])
    } else {
        format!("{}.{}{}", tenths / 10, tenths % 10, UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(size(0), "0B");
        assert_eq!(capacity(0), "-");
        assert_eq!(capacity(2048), "2KiB");
        assert_eq!(size(-1), "-");
        assert_eq!(size(1), "1B");
        assert_eq!(size(1023), "1023B");
        assert_eq!(size(1024), "1KiB");
        assert_eq!(size(1536), "1.5KiB");
        assert_eq!(size(1 << 30), "1GiB");
        assert_eq!(size(500_000_000), "476.8MiB");
        assert_eq!(size((1 << 20) - 1), "1024KiB");
        assert_eq!(size(3 << 40), "3TiB");
        assert_eq!(size(i64::MAX), "8EiB");
    }

    #[test]
    fn a_closed_pipe_is_told_apart_from_other_write_errors() {
        let closed = stdout_error(io::Error::from(io::ErrorKind::BrokenPipe));
        assert!(closed.is::<StdoutClosed>());
        let full = stdout_error(io::Error::from(io::ErrorKind::StorageFull));
        assert!(!full.is::<StdoutClosed>());
        assert_eq!(full.to_string(), "cannot write to standard output");
    }

    #[test]
    fn text_from_the_agent_cannot_forge_rows_or_reach_the_terminal() {
        let forged = "web-0\nweb-1  fake  0  running";
        let table = render_table(
            &["ID", "GROUP", "INDEX", "STATUS"],
            &[
                vec![forged.into(), "g".into(), "0".into(), "running".into()],
                vec![
                    "x\u{1b}[2J".into(),
                    "g".into(),
                    "1".into(),
                    "pending".into(),
                ],
            ],
        );
        assert_eq!(
            table,
            "ID                              GROUP  INDEX  STATUS\n\
             web-0\\nweb-1  fake  0  running  g      0      running\n\
             x\\u{1b}[2J                      g      1      pending\n"
        );
        let fields = render_fields(&[("id", "a\rb".into()), ("description", "ok".into())]);
        assert_eq!(fields, "id           a\\rb\ndescription  ok\n");
    }

    #[test]
    fn control_characters_are_escaped() {
        assert!(matches!(escape("plain id-1 é ✓"), Cow::Borrowed(_)));
        assert_eq!(escape("a\nb"), "a\\nb");
        assert_eq!(escape("x\u{1b}[31mred\r\t"), "x\\u{1b}[31mred\\r\\t");
        assert_eq!(
            escape("evil\u{202e}txt\u{7f}\u{85}"),
            "evil\\u{202e}txt\\u{7f}\\u{85}"
        );
        assert_eq!(escape_keeping_lines("a\nb\u{1b}"), "a\nb\\u{1b}");
        assert_eq!(quoted("a\"b\nc"), "\"a\\\"b\\nc\"");
    }
}
