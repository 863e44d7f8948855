//! Text from a plugin (its output, its error messages) made safe to put in an error, an
//! event or a log line: one line, no control characters, bounded.

/// How much of a plugin's message is kept.
pub(crate) const MAX_MESSAGE: usize = 512;

/// `text` with control characters escaped (`\n`, `\u{1b}`…) and cut to about `max` bytes
/// (a `…` marks the cut).
pub(crate) fn clean(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max) + 4);
    for c in text.chars() {
        if out.len() >= max {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// `text` cut to about `max` bytes (a `…` marks the cut), for quoting with `{:?}`, which
/// escapes it.
pub(crate) fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// A gRPC status as one clean line: its message (or its code's description when empty) and
/// its code.
pub(crate) fn status(status: &tonic::Status) -> String {
    let message = status.message().trim();
    if message.is_empty() {
        format!("{:?}: {}", status.code(), status.code().description())
    } else {
        format!("{:?}: {}", status.code(), clean(message, MAX_MESSAGE))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_cuts() {
        assert_eq!(clean("a\nb\u{1b}[0m", 100), "a\\nb\\u{1b}[0m");
        let long = "x".repeat(100);
        let cut = clean(&long, 10);
        assert_eq!(cut, format!("{}…", "x".repeat(10)));
        assert_eq!(
            status(&tonic::Status::not_found("no\ndevice")),
            "NotFound: no\\ndevice"
        );
    }
}
