//! Human tables and JSON for command output.

use std::io::{self, Write as _};

use serde::Serialize;

/// Prints `value` as pretty JSON on stdout.
pub fn json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}

/// Prints `key  value` lines, keys aligned.
pub fn fields(rows: &[(&str, String)]) -> anyhow::Result<()> {
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out = io::stdout().lock();
    for (k, v) in rows {
        writeln!(out, "{k:<width$}  {v}")?;
    }
    Ok(())
}

/// Prints a table with a header row, columns aligned.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> anyhow::Result<()> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = io::stdout().lock();
    let line = |cells: Vec<&str>| -> String {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(cell);
            } else {
                s.push_str(&format!("{cell:<w$}  "));
            }
        }
        s.trim_end().to_string()
    };
    writeln!(out, "{}", line(header.to_vec()))?;
    for row in rows {
        writeln!(out, "{}", line(row.iter().map(String::as_str).collect()))?;
    }
    Ok(())
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
