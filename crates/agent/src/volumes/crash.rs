//! The crash hook of crash tests: the agent kills itself at a named step.

use super::*;

/// The env var that names a step at which the agent kills itself (SIGKILL), for crash tests:
/// `NodeStageVolume:before`, `ControllerPublishVolume:after`, … (`<Rpc>:before|after`), or
/// `claim:persisted` / `release:persisted`.
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
