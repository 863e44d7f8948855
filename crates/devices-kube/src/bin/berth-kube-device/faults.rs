//! The fault switch, for tests: words in `<state-dir>/faults` (one per line, re-read every
//! 200 ms and on every call) and in `BERTH_KUBE_DEVICE_FAULT` (comma or space separated).

use std::path::Path;

/// The environment variable holding faults that are always on.
pub const FAULT_ENV: &str = "BERTH_KUBE_DEVICE_FAULT";

/// The fault file's name in the state directory.
pub const FAULT_FILE: &str = "faults";

/// The faults that are on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// Exit at once with status 2.
    pub crash: bool,
    /// No RPC answers and no stream sends anything while it is on.
    pub hang: bool,
    /// Every device is reported `Unhealthy`.
    pub unhealthy: bool,
    /// `ListAndWatch` also lists a device with an empty id.
    pub invalid: bool,
    /// `Allocate` answers a relative mount path and `GetPreferredAllocation` an id that is not
    /// available: answers the agent must refuse.
    pub bad_answer: bool,
}

impl Faults {
    /// Parses words separated by white space or commas; `#` starts a comment to the end of
    /// the line. Returns the unknown words too.
    pub fn parse(text: &str) -> (Self, Vec<String>) {
        let mut faults = Self::default();
        let mut unknown = Vec::new();
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("");
            for word in line.split(|c: char| c == ',' || c.is_whitespace()) {
                match word {
                    "" => {}
                    "crash" => faults.crash = true,
                    "hang" => faults.hang = true,
                    "unhealthy" => faults.unhealthy = true,
                    "invalid" => faults.invalid = true,
                    "bad-answer" => faults.bad_answer = true,
                    other => unknown.push(other.to_string()),
                }
            }
        }
        (faults, unknown)
    }

    fn or(self, other: Self) -> Self {
        Self {
            crash: self.crash || other.crash,
            hang: self.hang || other.hang,
            unhealthy: self.unhealthy || other.unhealthy,
            invalid: self.invalid || other.invalid,
            bad_answer: self.bad_answer || other.bad_answer,
        }
    }

    /// The faults of `env` (already parsed) and of the file `path` (missing: none).
    pub fn read(path: &Path, env: Self) -> Self {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read the fault file");
                String::new()
            }
        };
        let (file, unknown) = Self::parse(&text);
        if !unknown.is_empty() {
            tracing::warn!(path = %path.display(), ?unknown, "unknown fault words ignored");
        }
        env.or(file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_lines_and_comments() {
        let (f, unknown) = Faults::parse("hang, unhealthy\n# crash\ninvalid bogus");
        assert!(f.hang && f.unhealthy && f.invalid && !f.crash && !f.bad_answer);
        assert_eq!(unknown, ["bogus"]);
    }
}
