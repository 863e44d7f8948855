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
    list_of(values, |v| Quoted(v).to_string())
}

/// `a, b, c`: as [`quoted_list`], each value [`Shown`] (escaped and cut, without quotes).
pub fn shown_list<'a>(values: impl ExactSizeIterator<Item = &'a str>) -> String {
    list_of(values, |v| Shown(v).to_string())
}

fn list_of<'a>(
    values: impl ExactSizeIterator<Item = &'a str>,
    show: impl Fn(&str) -> String,
) -> String {
    let total = values.len();
    let listed: Vec<String> = values.take(MAX_LISTED).map(show).collect();
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

/// `value` as [`Shown`] writes it, cut to its first `max_chars` characters (`…` after a cut)
/// instead of [`MAX_SHOWN_CHARS`]: for longer text a plugin or a process sends (an error
/// message, a health description).
pub fn shown_within(value: &str, max_chars: usize) -> String {
    struct Within<'a>(&'a str, usize);
    impl fmt::Display for Within<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write_cut_at(f, self.0, false, self.1)
        }
    }
    Within(value, max_chars).to_string()
}

/// serde's message about user input without the value it quotes: `invalid type: string
/// "…", expected a map` becomes `invalid type: string, expected a map` (a value of the wrong
/// type may be a credential); the key of `unknown field`, `unknown variant`, `duplicate field`
/// and `missing field` is kept, escaped and cut; a Rust type name (`expected struct X`) reads
/// `expected an object`. One line; anything else is shown whole, escaped and cut.
pub fn serde_message(msg: &str) -> String {
    fn one_line(s: &str) -> String {
        s.split_whitespace().collect::<Vec<_>>().join(" ")
    }
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = msg.strip_prefix(prefix) {
            // The expectation is berth's own text; the value comes before it.
            let (unexpected, expected) = rest
                .rfind(", expected ")
                .map_or((rest, ""), |at| rest.split_at(at));
            let kind = unexpected
                .split(['`', '"'])
                .next()
                .unwrap_or_default()
                .trim();
            let expected = if expected.starts_with(", expected struct ") {
                ", expected an object"
            } else {
                expected
            };
            return one_line(&format!("{prefix}{}{expected}", Shown(kind)));
        }
    }
    for prefix in [
        "unknown field `",
        "unknown variant `",
        "duplicate field `",
        "missing field `",
    ] {
        if let Some(rest) = msg.strip_prefix(prefix) {
            let end = ["`, expected", "`, there are no"]
                .iter()
                .filter_map(|m| rest.rfind(m))
                .max()
                .or_else(|| rest.rfind('`'))
                .unwrap_or(rest.len());
            let (key, tail) = rest.split_at(end);
            // What follows the key (the fields expected) is berth's own text.
            return format!("{prefix}{}{}", Shown(key), one_line(tail));
        }
    }
    Shown(&one_line(msg)).to_string()
}

fn write_cut(f: &mut fmt::Formatter<'_>, value: &str, quotes: bool) -> fmt::Result {
    write_cut_at(f, value, quotes, MAX_SHOWN_CHARS)
}

fn write_cut_at(
    f: &mut fmt::Formatter<'_>,
    value: &str,
    quotes: bool,
    max_chars: usize,
) -> fmt::Result {
    let mut chars = value.chars();
    if quotes {
        f.write_char('"')?;
    }
    for c in chars.by_ref().take(max_chars) {
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
    fn longer_text_is_cut_where_asked_and_serde_values_never_show() {
        assert_eq!(shown_within("a\nb\u{202e}c", 100), "a\\nb\\u{202e}c");
        assert_eq!(shown_within("abcdef", 3), "abc…");
        assert_eq!(shown_within(&"x".repeat(1000), 512).chars().count(), 513);
        assert_eq!(
            serde_message("invalid type: string \"s3cret\", expected a map"),
            "invalid type: string, expected a map"
        );
        assert_eq!(
            serde_message("invalid type: map, expected struct CdiSpec"),
            "invalid type: map, expected an object"
        );
        assert_eq!(
            serde_message("unknown field `bogus`, expected one of `a`, `b`"),
            "unknown field `bogus`, expected one of `a`, `b`"
        );
        assert_eq!(
            serde_message("missing field `kind`"),
            "missing field `kind`"
        );
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
