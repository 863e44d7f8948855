//! Text from a plugin (its output, its error messages) made safe to put in an error, an
//! event or a log line: one line, no control characters, bounded.

/// What the user's `config` block holds that could be a credential: its string values of at
/// least 4 characters, but absolute paths (which diagnose most failures, and are no
/// secret). Longest first, so a value inside another is not half replaced.
pub(crate) fn config_secrets(config: &serde_json::Value) -> Vec<String> {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::String(s) if s.chars().count() >= 4 && !s.starts_with('/') => {
                out.push(s.clone());
            }
            serde_json::Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
            serde_json::Value::Object(map) => map.values().for_each(|i| walk(i, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(config, &mut out);
    out.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    out.dedup();
    out
}

/// `text` with every one of `secrets` replaced by `[REDACTED]`: what a plugin prints or
/// answers may repeat a value of its config.
pub(crate) fn scrub(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_string();
    for s in secrets {
        if out.contains(s.as_str()) {
            out = out.replace(s.as_str(), "[REDACTED]");
        }
    }
    out
}

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
    fn config_values_are_scrubbed_but_paths() {
        let secrets = config_secrets(&serde_json::json!({
            "token": "s3cr3t-value", "dir": "/var/lib/x", "n": 1234, "on": true,
            "nested": {"list": ["abc", "hunter2-long"]}
        }));
        assert_eq!(secrets, ["hunter2-long", "s3cr3t-value"]);
        assert_eq!(
            scrub(
                "bad token s3cr3t-value in /var/lib/x (hunter2-long)",
                &secrets
            ),
            "bad token [REDACTED] in /var/lib/x ([REDACTED])"
        );
    }

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
