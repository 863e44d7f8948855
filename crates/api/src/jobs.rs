//! The JSON documents of the job routes (`/v1/jobs`, `/v1/job/{id}`, `/v1/alloc/{id}`).
//!
//! An alloc's status is the alloc runner's own document ([`AllocStatus`]): it holds no spec, so
//! no mount flag or secret.

use std::fmt;

use serde::{Deserialize, Serialize};

pub use berth_allocrunner::{
    AllocEvent, AllocStatus, ClientStatus, DesiredState, EventKind, TaskMountSummary, TaskRunState,
    TaskSummary,
};

use crate::volumes::SpecFormat;

/// `POST /v1/jobs`: a job spec as the user wrote it; the agent parses and places it.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobRunRequest {
    /// The spec text.
    pub spec: String,
    /// Its language.
    #[serde(default)]
    pub format: SpecFormat,
    /// The name errors use for it; `request body` when absent.
    #[serde(default)]
    pub file: Option<String>,
    /// Values of the spec's HCL2 variables (`berth job run -var name=value`), in order; a
    /// later one wins, and every one wins over `var_files`.
    #[serde(default)]
    pub vars: Vec<JobVar>,
    /// Variable files (`-var-file`), in order: HCL assignments, or a JSON object when the
    /// name ends in `.json`.
    #[serde(default)]
    pub var_files: Vec<VarFile>,
}

/// Most `vars` and `var_files` a request may carry, each.
pub const MAX_VARS: usize = 256;

/// One `-var name=value`. `Debug` hides the value (it may be a secret).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobVar {
    /// The variable's name.
    pub name: String,
    /// Its value as typed (a string, or HCL for variables of other types).
    pub value: String,
}

impl fmt::Debug for JobVar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}=<{} bytes>", self.name, self.value.len())
    }
}

/// One `-var-file`. `Debug` shows its name and size only.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VarFile {
    /// The name errors use for it (the path given).
    pub name: String,
    /// Its text.
    pub text: String,
}

impl fmt::Debug for VarFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: <{} bytes>", self.name, self.text.len())
    }
}

impl JobRunRequest {
    /// Checks what serde cannot: `spec` and each var file's text are at most
    /// [`crate::volumes::MAX_SPEC_BYTES`]; `file` and var file names are non-empty, at most
    /// [`crate::volumes::MAX_FILE_NAME_BYTES`] and free of control and bidirectional-text
    /// characters; at most [`MAX_VARS`] vars and var files; var names are printable and
    /// values at most 1 MiB.
    pub fn validate(&self) -> Result<(), crate::InvalidField> {
        crate::volumes::validate_spec(&self.spec, self.file.as_deref())?;
        for (field, n) in [
            ("vars", self.vars.len()),
            ("var_files", self.var_files.len()),
        ] {
            if n > MAX_VARS {
                return Err(crate::InvalidField {
                    field,
                    reason: format!("{n} entries: at most {MAX_VARS}"),
                });
            }
        }
        for v in &self.var_files {
            crate::volumes::validate_spec(&v.text, Some(&v.name)).map_err(|e| {
                crate::InvalidField {
                    field: "var_files",
                    reason: e.reason,
                }
            })?;
        }
        for v in &self.vars {
            crate::checks::printable("vars", &v.name, crate::volumes::MAX_FILE_NAME_BYTES)?;
            crate::checks::bounded("vars", &v.value, crate::volumes::MAX_SPEC_BYTES)?;
        }
        Ok(())
    }
}

impl fmt::Debug for JobRunRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobRunRequest")
            .field("spec", &format_args!("<{} bytes>", self.spec.len()))
            .field("format", &self.format)
            .field("file", &self.file)
            .field("vars", &self.vars)
            .field("var_files", &self.var_files)
            .finish()
    }
}

/// A job and its allocs on this node (`GET /v1/job/{id}`, and the answer to run and stop).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobStatus {
    /// The job's id.
    pub id: String,
    /// `service` or `batch`.
    pub job_type: String,
    /// Whether it was stopped.
    pub stopped: bool,
    /// Its allocs, by id.
    pub allocs: Vec<AllocStatus>,
    /// In a fleet: the job's version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    /// In a fleet: where each alloc was placed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placements: Vec<AllocPlacement>,
    /// In a fleet: why groups were not (wholly) placed, per node class.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<String>,
    /// In the answer to run and stop: the newest event index before the change, so a reader
    /// of the event stream from there sees every event the change causes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_index: Option<u64>,
}

/// Where the fleet placed an alloc.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocPlacement {
    /// The alloc.
    pub alloc_id: String,
    /// The node it was placed on.
    pub node_id: String,
    /// That node's name.
    #[serde(default)]
    pub node_name: String,
    /// `run` or `stop`.
    pub desired: String,
    /// Why it was stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// Allocs it waits for (it preempted them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preempts: Vec<String>,
}

/// One line of `GET /v1/jobs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSummary {
    /// The job's id.
    pub id: String,
    /// `service` or `batch`.
    pub job_type: String,
    /// Whether it was stopped.
    pub stopped: bool,
    /// Allocs per client status (`pending`, `running`, `complete`, `failed`).
    pub allocs: std::collections::BTreeMap<String, usize>,
}

/// `GET /v1/jobs`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobList {
    /// By id.
    pub jobs: Vec<JobSummary>,
}

/// `POST /v1/jobs/plan`: what `POST /v1/jobs` would place for the same request, with nothing
/// written or started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobPlan {
    /// The job's id.
    pub job_id: String,
    /// `service`, `batch` or `system`.
    pub job_type: String,
    /// Whether a run would place every alloc.
    pub placeable: bool,
    /// The allocs a run would place (empty when it would place none).
    pub allocs: Vec<PlannedAlloc>,
    /// Why it would not be placed: every reason.
    #[serde(default)]
    pub failures: Vec<String>,
    /// Allocs of an earlier run of the job that still run (a run is refused until they stop).
    #[serde(default)]
    pub running: Vec<String>,
}

/// One alloc a plan would place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedAlloc {
    /// Its group.
    pub group: String,
    /// Its index in the group.
    pub index: u32,
    /// Its volumes: block name → volume id.
    #[serde(default)]
    pub volumes: std::collections::BTreeMap<String, String>,
}

/// `POST /v1/alloc/{id}/restart` and `/signal`: which task (all when absent), and for a
/// signal which one (`SIGHUP`, `HUP`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllocActionRequest {
    /// The task; every running task when absent.
    #[serde(default)]
    pub task: Option<String>,
    /// The signal to send (only for `/signal`).
    #[serde(default)]
    pub signal: Option<String>,
}

impl AllocActionRequest {
    /// Checks what serde cannot: `task` is a valid path segment, `signal` a short printable
    /// word.
    pub fn validate(&self) -> Result<(), crate::InvalidField> {
        if let Some(t) = &self.task {
            crate::checks::segment("task", "task name", t)?;
        }
        if let Some(s) = &self.signal {
            crate::checks::printable("signal", s, 32)?;
        }
        Ok(())
    }
}

/// The answer to an alloc restart or signal: the tasks it reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocActionResponse {
    /// The alloc.
    pub alloc_id: String,
    /// The running tasks that were restarted or signalled.
    pub tasks: Vec<String>,
}

/// `GET /v1/job/{id}/spec`: the job as the agent keeps it (parsed, variables filled), with
/// every mount flag shown as `[REDACTED]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpecView {
    /// The job's id.
    pub id: String,
    /// The spec.
    pub spec: serde_json::Value,
}

/// `GET /v1/alloc/{id}/stats`: resource use of the alloc's running tasks, read now.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AllocStats {
    /// The alloc.
    pub alloc_id: String,
    /// Each running task whose use could be read, by name (a task that is not running, or
    /// whose driver could not read it, is absent).
    pub tasks: std::collections::BTreeMap<String, TaskUsage>,
}

/// One task's resource use: what its driver reads from `/proc` for its processes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskUsage {
    /// User plus system CPU time of its processes, in seconds.
    pub cpu_seconds: f64,
    /// Resident memory of its processes, in bytes.
    pub rss_bytes: u64,
    /// How many processes were counted.
    pub pids: usize,
}
