//! The call log: one JSON object per line in `<state-dir>/calls.jsonl`, one per call the plugin
//! gets (and per `Register` it makes), so tests can see what the agent asked.

use std::{
    fs::{File, OpenOptions},
    io::Write as _,
    path::{Path, PathBuf},
    sync::Mutex,
};

use anyhow::Context as _;

/// The file name of the call log in the state directory.
pub const CALL_LOG: &str = "calls.jsonl";

#[derive(Debug)]
pub struct CallLog {
    path: PathBuf,
    file: Mutex<File>,
}

impl CallLog {
    pub fn open(state_dir: &Path) -> anyhow::Result<Self> {
        let path = state_dir.join(CALL_LOG);
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening the call log {}", path.display()))?;
        Ok(Self {
            path,
            file: Mutex::new(file),
        })
    }

    /// Appends `entry` as one line. A failed write is logged, never fatal.
    pub fn record(&self, entry: &serde_json::Value) {
        let mut line = entry.to_string();
        line.push('\n');
        let mut file = self
            .file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(e) = file.write_all(line.as_bytes()) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot write the call log");
        }
    }
}
