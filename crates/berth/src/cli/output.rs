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
}
