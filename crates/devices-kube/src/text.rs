//! Text a plugin sends, made safe to keep and print: escaped and cut.

/// Most bytes of a plugin's error message kept in a [`PluginError`](berth_devices::plugin::PluginError).
pub(crate) const MAX_MESSAGE: usize = 512;

/// Most bytes of a device's health string kept as its health description.
pub(crate) const MAX_HEALTH: usize = 128;

/// `text` with control and bidirectional-text characters escaped (`\n`, `\u{202e}`), cut to at
/// most `max` bytes (escapes included) on a character boundary, ending in `…` when cut.
pub(crate) fn escape_cut(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max));
    let mut piece = String::new();
    for c in text.chars() {
        piece.clear();
        match c {
            '\n' => piece.push_str("\\n"),
            '\r' => piece.push_str("\\r"),
            '\t' => piece.push_str("\\t"),
            '\0' => piece.push_str("\\0"),
            c if berth_sys::is_unprintable(c) => {
                piece.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
            }
            c => piece.push(c),
        }
        if out.len() + piece.len() > max {
            out.push('…');
            return out;
        }
        out.push_str(&piece);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_cuts() {
        assert_eq!(escape_cut("plain", 10), "plain");
        assert_eq!(escape_cut("a\nb\u{202e}c", 100), "a\\nb\\u{202e}c");
        assert_eq!(escape_cut("abcdef", 3), "abc…");
        // Never cuts inside a character or an escape.
        assert_eq!(escape_cut("ééé", 5), "éé…");
        assert_eq!(escape_cut("a\nb", 2), "a…");
        assert!(escape_cut(&"x".repeat(10_000), MAX_MESSAGE).len() <= MAX_MESSAGE + 3);
    }
}
