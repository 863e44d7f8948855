//! The fault switch: words from the `fault_file` (one per line) and from the environment
//! variable [`FAULT_VAR`] (comma- or space-separated), read again every list period and at
//! every call.

use std::{collections::BTreeSet, path::Path};

/// The environment variable holding faults for the plugin's whole life.
pub const FAULT_VAR: &str = "BERTH_NOMAD_DEVICE_FAULT";
/// Exit code of the `crash` fault.
pub const CRASH_EXIT: i32 = 2;

/// One fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// Exit with [`CRASH_EXIT`] at once.
    Crash,
    /// Every RPC and stream stops answering; the process stays.
    Hang,
    /// Every device is reported unhealthy.
    Unhealthy,
    /// The fingerprint stream ends with an Internal error.
    FingerprintError,
    /// Fingerprints carry a group with an empty vendor and an instance with an empty id.
    Invalid,
}

impl Fault {
    fn parse(word: &str) -> Option<Self> {
        Some(match word {
            "crash" => Self::Crash,
            "hang" => Self::Hang,
            "unhealthy" => Self::Unhealthy,
            "fingerprint-error" => Self::FingerprintError,
            "invalid" => Self::Invalid,
            _ => return None,
        })
    }
}

/// The faults in force now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Faults(BTreeSet<Fault>);

impl Faults {
    /// Reads the environment and `file` (when given; a missing file holds no fault).
    pub fn read(file: Option<&Path>) -> Self {
        let mut set = BTreeSet::new();
        let mut add = |word: &str, from: &str| {
            let word = word.trim();
            if word.is_empty() || word.starts_with('#') {
                return;
            }
            match Fault::parse(word) {
                Some(f) => {
                    set.insert(f);
                }
                None => tracing::warn!(fault = word, from, "unknown fault ignored"),
            }
        };
        if let Ok(env) = std::env::var(FAULT_VAR) {
            for word in env.split([',', ' ']) {
                add(word, FAULT_VAR);
            }
        }
        if let Some(file) = file
            && let Ok(text) = std::fs::read_to_string(file)
        {
            for line in text.lines() {
                add(line, "fault file");
            }
        }
        Self(set)
    }

    /// Whether `fault` is in force.
    pub fn has(&self, fault: Fault) -> bool {
        self.0.contains(&fault)
    }
}
