//! The job calls (`/v1/jobs`, `/v1/job/{id}`, `/v1/alloc/{id}`). Reads use the client's
//! timeout; run and stop use its change timeout, as placing and starting a job (volume claims
//! included) or stopping it (tasks, then volume releases) can take a while. Ids are sent
//! percent-encoded, exactly as given: the agent refuses ids that are not valid.

use hyper::Method;

use super::{Client, ClientError, encode, encode_segment};
use crate::jobs::{
    AllocActionRequest, AllocActionResponse, AllocStats, AllocStatus, JobList, JobPlan,
    JobRunRequest, JobSpecView, JobStatus,
};

/// `/v1/job/{id}`.
fn job_path(id: &str) -> String {
    format!("/v1/job/{}", encode_segment(id))
}

/// `/v1/alloc/{id}`.
fn alloc_path(id: &str) -> String {
    format!("/v1/alloc/{}", encode_segment(id))
}

impl Client {
    /// `GET /v1/jobs`: every job, by id, with its allocs counted per status.
    pub async fn jobs(&self) -> Result<JobList, ClientError> {
        self.call_json(Method::GET, "/v1/jobs".into(), None).await
    }

    /// `GET /v1/job/{id}`: one job with its allocs on this node; 404 when there is no such job
    /// (see [`ClientError::is_not_found`]).
    pub async fn job(&self, id: &str) -> Result<JobStatus, ClientError> {
        self.call_json(Method::GET, job_path(id), None).await
    }

    /// `POST /v1/jobs`: the agent parses the spec, places the job's allocs and starts them; the
    /// answer is the job as placed. A spec the agent refuses is a 400 whose message names
    /// `file:line`.
    pub async fn run_job(&self, req: &JobRunRequest) -> Result<JobStatus, ClientError> {
        let path = "/v1/jobs".to_string();
        let body = encode(&Method::POST, &path, req)?;
        self.call_json_within(self.change_timeout, Method::POST, path, Some(body))
            .await
    }

    /// `DELETE /v1/job/{id}`: stops the job (its tasks stop, then its volumes are released);
    /// the answer is the job after the stop.
    pub async fn stop_job(&self, id: &str) -> Result<JobStatus, ClientError> {
        self.call_json_within(self.change_timeout, Method::DELETE, job_path(id), None)
            .await
    }

    /// `DELETE /v1/job/{id}?purge=true`: stops the job; the agent forgets it and its allocs
    /// once they have finished.
    pub async fn purge_job(&self, id: &str) -> Result<JobStatus, ClientError> {
        let path = format!("{}?purge=true", job_path(id));
        self.call_json_within(self.change_timeout, Method::DELETE, path, None)
            .await
    }

    /// `POST /v1/jobs/plan`: what a run of `req` would place, with nothing written.
    pub async fn plan_job(&self, req: &JobRunRequest) -> Result<JobPlan, ClientError> {
        let path = "/v1/jobs/plan".to_string();
        let body = encode(&Method::POST, &path, req)?;
        self.call_json_within(self.change_timeout, Method::POST, path, Some(body))
            .await
    }

    /// `GET /v1/job/{id}/spec`: the job as the agent keeps it, mount flags redacted.
    pub async fn job_spec(&self, id: &str) -> Result<JobSpecView, ClientError> {
        self.call_json(Method::GET, format!("{}/spec", job_path(id)), None)
            .await
    }

    /// `POST /v1/alloc/{id}/stop`.
    pub async fn stop_alloc(&self, id: &str) -> Result<AllocStatus, ClientError> {
        let path = format!("{}/stop", alloc_path(id));
        self.call_json_within(self.change_timeout, Method::POST, path, None)
            .await
    }

    /// `POST /v1/alloc/{id}/restart` (or `/signal` when `req.signal` is set).
    pub async fn alloc_action(
        &self,
        id: &str,
        req: &AllocActionRequest,
    ) -> Result<AllocActionResponse, ClientError> {
        let action = if req.signal.is_some() {
            "signal"
        } else {
            "restart"
        };
        let path = format!("{}/{action}", alloc_path(id));
        let body = encode(&Method::POST, &path, req)?;
        self.call_json_within(self.change_timeout, Method::POST, path, Some(body))
            .await
    }

    /// `GET /v1/alloc/{id}`: one alloc with its tasks, volumes and latest events; 404 when
    /// there is no such alloc.
    pub async fn alloc(&self, id: &str) -> Result<AllocStatus, ClientError> {
        self.call_json(Method::GET, alloc_path(id), None).await
    }

    /// `GET /v1/alloc/{id}/stats`: CPU time, resident memory and process count of each of the
    /// alloc's running tasks, read now.
    pub async fn alloc_stats(&self, id: &str) -> Result<AllocStats, ClientError> {
        self.call_json(Method::GET, format!("{}/stats", alloc_path(id)), None)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_stay_one_segment() {
        assert_eq!(job_path("web"), "/v1/job/web");
        assert_eq!(job_path(".."), "/v1/job/%2E%2E");
        assert_eq!(job_path("a/../b"), "/v1/job/a%2F..%2Fb");
        assert_eq!(alloc_path("a1"), "/v1/alloc/a1");
        assert_eq!(alloc_path("."), "/v1/alloc/%2E");
        assert_eq!(alloc_path("x?y=1"), "/v1/alloc/x%3Fy%3D1");
    }
}
