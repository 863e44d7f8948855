//! The values of a plugin's `config` block that could be credentials, scrubbed from what the
//! plugin says before it enters berth (`Down` reasons, refused calls, log lines): a plugin
//! may repeat its config in its errors and its output.

use std::{fmt, sync::Arc};

/// What is replaced.
const REDACTED: &str = "[REDACTED]";

/// The shortest config string value that is scrubbed: shorter ones (`true`, `soon`, `eth0`,
/// `nvidia`) are settings the user needs to see in an error about them, and too common to
/// replace wherever they appear.
const MIN_SECRET_CHARS: usize = 8;

/// The config values to scrub. Cheap to clone; `Debug` shows how many, never what.
#[derive(Clone, Default)]
pub(crate) struct Secrets(Arc<[String]>);

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secrets({} values)", self.0.len())
    }
}

impl Secrets {
    /// The string values of `config` (at any depth) of at least [`MIN_SECRET_CHARS`]
    /// characters, but absolute paths and Go durations (settings that diagnose most failures,
    /// and no secret), each also as an error escapes it; longest first, so a value inside
    /// another is not half replaced.
    pub(crate) fn of_config(config: &serde_json::Value) -> Self {
        fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
            match v {
                serde_json::Value::String(s)
                    if s.chars().count() >= MIN_SECRET_CHARS
                        && !s.starts_with('/')
                        && !is_go_duration(s) =>
                {
                    // As it is, as `Shown`/`shown_within` escape it, as `Quoted`/`{:?}` do.
                    out.push(s.clone());
                    out.push(berth_input::shown_within(s, usize::MAX));
                    out.push(s.escape_debug().to_string());
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
        Self(out.into())
    }

    /// `text` with every value replaced by `[REDACTED]`.
    pub(crate) fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        for s in self.0.iter() {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), REDACTED);
            }
        }
        out
    }
}

/// Whether `s` is a Go duration as `time.ParseDuration` reads it: an optional sign, then `0`
/// or one or more decimal numbers each with a unit (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`):
/// `1h30m`, `-1.5s`, `100ms`.
fn is_go_duration(s: &str) -> bool {
    let mut rest = s.strip_prefix(['+', '-']).unwrap_or(s);
    if rest == "0" {
        return true;
    }
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number = &rest[..digits];
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return false;
        }
        rest = &rest[digits..];
        let Some(unit) = ["ns", "us", "\u{b5}s", "\u{3bc}s", "ms", "s", "m", "h"]
            .into_iter()
            .find(|u| {
                rest.strip_prefix(u)
                    .is_some_and(|after| !after.starts_with(|c: char| c.is_alphabetic()))
            })
        else {
            return false;
        };
        rest = &rest[unit.len()..];
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_values_are_scrubbed_but_paths_durations_and_short_settings() {
        let secrets = Secrets::of_config(&serde_json::json!({
            "token": "s3cr3t-value", "dir": "/var/lib/x", "n": 1234, "on": true,
            "period": "1h30m0s", "short": "soon",
            "nested": {"list": ["abc", "hunter2-long"], "tab": "ab\tcd-efgh"}
        }));
        assert_eq!(
            secrets
                .scrub("bad token s3cr3t-value in /var/lib/x (hunter2-long) every 1h30m0s, soon"),
            "bad token [REDACTED] in /var/lib/x ([REDACTED]) every 1h30m0s, soon"
        );
        // Escaped as an error shows it, it is still found.
        assert_eq!(secrets.scrub("got \"ab\\tcd-efgh\""), "got \"[REDACTED]\"");
        assert_eq!(secrets.scrub("ab\tcd-efgh"), "[REDACTED]");
        assert!(!format!("{secrets:?}").contains("s3cr3t"));
        assert_eq!(Secrets::default().scrub("as is"), "as is");
    }

    #[test]
    fn go_durations_are_recognised() {
        for d in [
            "0", "5s", "100ms", "1h30m0s", "-1.5h", "+2us", "3\u{b5}s", "1.s", ".5m",
        ] {
            assert!(is_go_duration(d), "{d:?}");
        }
        for d in [
            "",
            "s",
            "5",
            "5x",
            "1.2.3s",
            "1sec",
            "soon",
            "00",
            "--1s",
            "hunter2-long",
        ] {
            assert!(!is_go_duration(d), "{d:?}");
        }
    }
}
