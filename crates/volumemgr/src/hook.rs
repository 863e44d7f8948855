//! Step hooks: a callback at the points where a crash matters, for crash tests.
//!
//! Every stage, publish, unpublish and unstage the manager drives (from a call or from
//! [`reconcile`](crate::VolumeManager::reconcile)) has two such points: [`Phase::Before`], when
//! the intent is persisted and the RPC not yet sent, and [`Phase::After`], when the RPC
//! succeeded and its result is not yet persisted. A test hook may stop the process there.

use std::{fmt, str::FromStr};

/// The node RPC of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StepRpc {
    /// NodeStageVolume.
    NodeStageVolume,
    /// NodePublishVolume.
    NodePublishVolume,
    /// NodeUnpublishVolume.
    NodeUnpublishVolume,
    /// NodeUnstageVolume.
    NodeUnstageVolume,
}

impl StepRpc {
    /// Every step RPC, in lifecycle order.
    pub const ALL: [StepRpc; 4] = [
        Self::NodeStageVolume,
        Self::NodePublishVolume,
        Self::NodeUnpublishVolume,
        Self::NodeUnstageVolume,
    ];

    /// The RPC's name in the CSI spec, e.g. `NodeStageVolume`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NodeStageVolume => "NodeStageVolume",
            Self::NodePublishVolume => "NodePublishVolume",
            Self::NodeUnpublishVolume => "NodeUnpublishVolume",
            Self::NodeUnstageVolume => "NodeUnstageVolume",
        }
    }
}

impl fmt::Display for StepRpc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// The intent record is saved; the RPC is not yet sent.
    Before,
    /// The RPC succeeded (or was already done); its result is not yet saved.
    After,
}

impl Phase {
    /// `before` or `after`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Before => "before",
            Self::After => "after",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One point of one step: displayed and parsed as `<rpc>:<phase>`, e.g.
/// `NodeStageVolume:before` or `NodePublishVolume:after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Step {
    /// Which RPC.
    pub rpc: StepRpc,
    /// Before or after it.
    pub phase: Phase,
}

impl Step {
    /// `rpc` at `phase`.
    pub const fn new(rpc: StepRpc, phase: Phase) -> Self {
        Self { rpc, phase }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.rpc, self.phase)
    }
}

/// A string that is not `<rpc>:<phase>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a step (expected NodeStageVolume, NodePublishVolume, NodeUnpublishVolume or \
     NodeUnstageVolume, then :before or :after, e.g. NodeStageVolume:before)"
)]
pub struct ParseStepError(pub String);

impl FromStr for Step {
    type Err = ParseStepError;
    fn from_str(s: &str) -> Result<Self, ParseStepError> {
        let bad = || ParseStepError(s.chars().take(64).collect());
        let (rpc, phase) = s.split_once(':').ok_or_else(bad)?;
        let rpc = StepRpc::ALL
            .into_iter()
            .find(|r| r.as_str() == rpc)
            .ok_or_else(bad)?;
        let phase = [Phase::Before, Phase::After]
            .into_iter()
            .find(|p| p.as_str() == phase)
            .ok_or_else(bad)?;
        Ok(Self { rpc, phase })
    }
}

/// Called at every [`Step`] the manager passes, synchronously, on the task that drives the step
/// (with the volume's lock held: it must not call back into the manager).
pub trait StepHook: Send + Sync {
    /// The manager is at `step`.
    fn at(&self, step: Step);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_display_and_parse_the_same_spelling() {
        let mut seen = std::collections::BTreeSet::new();
        for rpc in StepRpc::ALL {
            for phase in [Phase::Before, Phase::After] {
                let step = Step::new(rpc, phase);
                let s = step.to_string();
                assert_eq!(s.parse::<Step>(), Ok(step), "{s}");
                assert!(seen.insert(s));
            }
        }
        assert_eq!(
            Step::new(StepRpc::NodeStageVolume, Phase::Before).to_string(),
            "NodeStageVolume:before"
        );
        assert_eq!(
            Step::new(StepRpc::NodePublishVolume, Phase::After).to_string(),
            "NodePublishVolume:after"
        );
        for bad in [
            "",
            ":",
            "NodeStageVolume",
            "NodeStageVolume:",
            "NodeStageVolume:Before",
            "nodestagevolume:before",
            "NodeStageVolume:during",
            "NodeGetVolumeStats:before",
            "NodeStageVolume:before:after",
            " NodeStageVolume:before",
        ] {
            let e = bad.parse::<Step>().expect_err(bad);
            assert!(e.to_string().contains("is not a step"), "{e}");
            assert!(e.to_string().contains("NodeStageVolume:before"), "{e}");
        }
    }
}
