//! The JSON documents of the job routes (`/v1/jobs`, `/v1/job/{id}`, `/v1/alloc/{id}`).
//!
//! An alloc's status is the alloc runner's own document ([`AllocStatus`]): it holds no spec, so
//! no mount flag or secret.

use std::fmt;

use serde::{Deserialize, Serialize};

pub use berth_allocrunner::{AllocEvent, AllocStatus, ClientStatus, DesiredState, EventKind};

use crate::volumes::SpecFormat;

/// `POST /v1/jobs`: a job spec as the user wrote it; the agent parses and places it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
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
}

impl JobRunRequest {
    /// Checks what serde cannot: `spec` is at most [`crate::volumes::MAX_SPEC_BYTES`], `file`
    /// (when given) is non-empty, at most [`crate::volumes::MAX_FILE_NAME_BYTES`] and free of
    /// control and bidirectional-text characters.
    pub fn validate(&self) -> Result<(), crate::InvalidField> {
        crate::volumes::validate_spec(&self.spec, self.file.as_deref())
    }
}

impl fmt::Debug for JobRunRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobRunRequest")
            .field("spec", &format_args!("<{} bytes>", self.spec.len()))
            .field("format", &self.format)
            .field("file", &self.file)
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
