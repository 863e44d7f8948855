//! The crash hook of crash tests: the agent kills itself at a named step.

use berth_state::{CommitGroup, CommitPoint};

use super::*;

/// The env var that names a step at which the agent kills itself (SIGKILL), for crash tests:
/// `NodeStageVolume:before`, `ControllerPublishVolume:after`, … (`<Rpc>:before|after`),
/// `claim:persisted` / `release:persisted`, or `commit:coalesced:before|after`: in the store's
/// commit thread, with a transaction that several writers share and that changes volumes or
/// usages, before it commits (none of them durable) or after (all durable, none answered).
pub const CRASH_ENV: &str = "BERTH_TEST_CRASH_AT";

/// Kills the process at the named step.
#[derive(Debug, Clone)]
pub struct CrashHook {
    at: String,
}

impl CrashHook {
    /// From [`CRASH_ENV`], if set.
    pub fn from_env() -> Option<Arc<Self>> {
        let at = std::env::var(CRASH_ENV).ok().filter(|s| !s.is_empty())?;
        tracing::warn!(step = %at, "crash hook armed: the agent will kill itself at this step");
        Some(Arc::new(Self { at }))
    }

    /// The store's commit hook, when the step is a `commit:` one.
    pub fn commit_hook(&self) -> Option<berth_state::CommitHook> {
        let point = match self.at.as_str() {
            "commit:coalesced:before" => CommitPoint::Before,
            "commit:coalesced:after" => CommitPoint::After,
            _ => return None,
        };
        let this = self.clone();
        Some(Arc::new(move |at: CommitPoint, group: &CommitGroup| {
            let ours = group
                .tables
                .iter()
                .any(|t| *t == Table::USAGES || *t == Table::VOLUMES);
            if at == point && group.batches >= 2 && ours {
                tracing::error!(
                    batches = group.batches,
                    "crash hook: inside a coalesced commit"
                );
                this.hit(&this.at);
            }
        }))
    }

    pub(super) fn hit(&self, step: &str) {
        if step == self.at {
            tracing::error!(step, "crash hook: killing the agent");
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        }
    }
}

impl StepHook for CrashHook {
    fn at(&self, step: Step) {
        self.hit(&step.to_string());
    }
}
