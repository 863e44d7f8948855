//! User text as an error message repeats it: escaped, so it cannot forge lines or reorder the
//! text around it, and cut, so a megabyte of input does not become a megabyte of error.

use std::fmt::{self, Write as _};

/// Most characters of one user value (or file name) an error repeats; longer ones are cut and
/// end in `…`.
pub const MAX_SHOWN_CHARS: usize = 128;

/// `value` in double quotes, as Rust's `{:?}` writes a string (`"`, `\`, control characters
/// and other unprintable ones escaped; bidirectional-text controls as `\u{202e}`), cut to its
/// first [`MAX_SHOWN_CHARS`] characters with `…` after the closing quote when cut.
#[derive(Debug, Clone, Copy)]
pub struct Quoted<'a>(pub &'a str);

/// `value` without quotes, for names shown bare (the file in `file:line: …`): control and
/// bidirectional-text characters escaped (`\n`, `\u{202e}`), everything else as is, cut like
/// [`Quoted`].
#[derive(Debug, Clone, Copy)]
pub struct Shown<'a>(pub &'a str);

/// Most values [`quoted_list`] lists.
pub const MAX_LISTED: usize = 8;

/// [`Quoted`] as a `String`.
pub fn quoted(value: &str) -> String {
    Quoted(value).to_string()
}

/// `"a", "b", "c"`: the first [`MAX_LISTED`] values, each [`Quoted`], then ` and N more` when
/// there are more.
pub fn quoted_list<'a>(values: impl ExactSizeIterator<Item = &'a str>) -> String {
    let total = values.len();
    let listed: Vec<String> = values
        .take(MAX_LISTED)
        .map(|v| Quoted(v).to_string())
        .collect();
    match total - listed.len() {
        0 => listed.join(", "),
        n => format!("{} and {n} more", listed.join(", ")),
    }
}

fn escape(f: &mut fmt::Formatter<'_>, c: char, quotes: bool) -> fmt::Result {
    match c {
        '\n' => f.write_str("\\n"),
        '\r' => f.write_str("\\r"),
        '\t' => f.write_str("\\t"),
        '\0' => f.write_str("\\0"),
        c if berth_sys::is_unprintable(c) => write!(f, "\\u{{{:x}}}", u32::from(c)),
        '"' | '\\' if quotes => write!(f, "\\{c}"),
        c if quotes => write!(f, "{}", c.escape_debug()),
        c => f.write_char(c),
    }
}

fn write_cut(f: &mut fmt::Formatter<'_>, value: &str, quotes: bool) -> fmt::Result {
    let mut chars = value.chars();
    if quotes {
        f.write_char('"')?;
    }
    for c in chars.by_ref().take(MAX_SHOWN_CHARS) {
        escape(f, c, quotes)?;
    }
    if quotes {
        f.write_char('"')?;
    }
    if chars.next().is_some() {
        f.write_char('…')?;
    }
    Ok(())
}

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_cut(f, self.0, true)
    }
}

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_cut(f, self.0, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_values_look_like_debug() {
        for s in ["", "ext4", "a \"b\" \\c", "tab\there", "é ü 中"] {
            assert_eq!(quoted(s), format!("{s:?}"));
        }
    }

    #[test]
    fn control_and_bidi_characters_are_escaped() {
        let q = quoted("a\nb\r\u{1b}[31m\u{202e}c\u{0}\u{85}");
        assert_eq!(q, "\"a\\nb\\r\\u{1b}[31m\\u{202e}c\\0\\u{85}\"");
        let s = Shown("dir/x\ny: fake\u{2066}.hcl").to_string();
        assert_eq!(s, "dir/x\\ny: fake\\u{2066}.hcl");
        assert!(!s.chars().any(berth_sys::is_unprintable), "{s}");
    }

    #[test]
    fn lists_are_cut() {
        let few = ["a", "b\n"];
        assert_eq!(quoted_list(few.iter().copied()), "\"a\", \"b\\n\"");
        let many: Vec<String> = (0..100_000).map(|i| format!("k{i}")).collect();
        let shown = quoted_list(many.iter().map(String::as_str));
        assert!(shown.ends_with("\"k7\" and 99992 more"), "{shown}");
        assert_eq!(quoted_list(std::iter::empty()), "");
    }

    #[test]
    fn long_values_are_cut() {
        let long = "x".repeat(1 << 20);
        let q = quoted(&long);
        assert_eq!(q, format!("\"{}\"…", "x".repeat(MAX_SHOWN_CHARS)));
        let s = Shown(&long).to_string();
        assert_eq!(s, format!("{}…", "x".repeat(MAX_SHOWN_CHARS)));
        // Exactly the limit is not cut; characters, not bytes, are counted.
        let at = "é".repeat(MAX_SHOWN_CHARS);
        assert_eq!(quoted(&at), format!("\"{at}\""));
        // Escapes make a value longer, but never unbounded.
        let newlines = "\n".repeat(10_000);
        assert!(quoted(&newlines).len() <= 2 * MAX_SHOWN_CHARS + 5);
    }
}
