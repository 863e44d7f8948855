//! What the fleet stores of jobs and allocs (`<prefix>/jobs/<id>`, `<prefix>/allocs/<id>`),
//! and what a node reports of an alloc it runs.

use std::collections::BTreeMap;

use berth_job::JobSpec;
use serde::{Deserialize, Serialize};

/// A job as submitted to the fleet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetJob {
    /// The checked spec.
    pub spec: JobSpec,
    /// 1 for the first submission; each submission of a different spec adds 1.
    pub version: u64,
    /// Stopped by an operator: every alloc stops.
    pub stopped: bool,
    /// When this version was submitted (ms since the epoch).
    pub submitted_ms: u64,
}

/// What an alloc should do; only the leader changes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Desired {
    /// Run on its node.
    Run,
    /// Stop (and release its volumes); see [`FleetAlloc::stop_reason`].
    Stop,
}

/// Why the leader stopped an alloc.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum StopReason {
    /// The job was stopped.
    JobStopped,
    /// A new version of the job replaces it.
    Updated,
    /// The group's count went down.
    ScaledDown,
    /// Its node is draining.
    Drained,
    /// Its node is no longer eligible (a system job).
    Ineligible,
    /// Its node was down longer than the grace: the alloc is lost and replaced.
    NodeLost,
    /// A job of higher priority needed its room.
    Preempted {
        /// The alloc that takes its place.
        by: String,
    },
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::JobStopped => f.write_str("the job was stopped"),
            Self::Updated => f.write_str("a new version of the job replaces it"),
            Self::ScaledDown => f.write_str("the group's count went down"),
            Self::Drained => f.write_str("its node is draining"),
            Self::Ineligible => f.write_str("its node is no longer eligible"),
            Self::NodeLost => f.write_str("its node was lost"),
            Self::Preempted { by } => write!(f, "preempted by alloc {by}"),
        }
    }
}

/// CPU and memory an alloc asks for (its tasks' `resources`, added up).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ask {
    /// MHz.
    pub cpu_mhz: u64,
    /// MB.
    pub memory_mb: u64,
}

impl Ask {
    /// What `group`'s tasks ask for together.
    pub fn of_group(group: &berth_job::GroupSpec) -> Self {
        group.tasks.iter().fold(Self::default(), |a, t| Self {
            cpu_mhz: a.cpu_mhz + u64::from(t.resources.cpu_mhz),
            memory_mb: a.memory_mb + u64::from(t.resources.memory_mb),
        })
    }

    /// `self + other`.
    pub fn plus(self, other: Self) -> Self {
        Self {
            cpu_mhz: self.cpu_mhz + other.cpu_mhz,
            memory_mb: self.memory_mb + other.memory_mb,
        }
    }

    /// `self - other`, at least 0.
    pub fn minus(self, other: Self) -> Self {
        Self {
            cpu_mhz: self.cpu_mhz.saturating_sub(other.cpu_mhz),
            memory_mb: self.memory_mb.saturating_sub(other.memory_mb),
        }
    }
}

/// An alloc placed by the leader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetAlloc {
    /// Its id (a path segment).
    pub id: String,
    /// Its job.
    pub job_id: String,
    /// The job's version it runs.
    pub job_version: u64,
    /// Its group.
    pub group: String,
    /// Which copy of the group.
    pub index: u32,
    /// The node it runs on.
    pub node_id: String,
    /// What it should do.
    pub desired: Desired,
    /// Why it was stopped, when it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<StopReason>,
    /// Its job's priority.
    pub priority: u8,
    /// What it takes of its node.
    pub ask: Ask,
    /// Devices it takes, by request name, counted.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub devices: BTreeMap<String, u64>,
    /// Volume block name → volume id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub volumes: BTreeMap<String, String>,
    /// Allocs stopped to make room for this one: it starts only once they have stopped and
    /// released their volumes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preempts: Vec<String>,
    /// When it was placed (ms since the epoch).
    pub created_ms: u64,
}

impl FleetAlloc {
    /// Whether it should run.
    pub fn wants_run(&self) -> bool {
        self.desired == Desired::Run
    }
}

/// How an alloc is doing, as its node last reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reported {
    /// Not started yet.
    Pending,
    /// Its tasks run.
    Running,
    /// Every task finished successfully.
    Complete,
    /// It failed for good.
    Failed,
}

impl Reported {
    /// Complete or failed.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Complete | Self::Failed)
    }
}
