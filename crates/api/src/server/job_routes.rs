//! The job routes over a [`JobView`].

use std::sync::Arc;

use axum::{
    Json, Router,
    extract::{Path, Request, State, rejection::PathRejection},
    routing::get,
};

use super::{
    AgentView, ApiError, Refusal,
    extract::{json_body, path_id},
};
use crate::jobs::{AllocStatus, JobList, JobRunRequest, JobStatus};

/// The job routes; merged into [`super::router`].
pub(super) fn routes<V: AgentView>() -> Router<Arc<V>> {
    Router::new()
        .route("/v1/jobs", get(list::<V>).post(run::<V>))
        .route("/v1/job/{id}", get(status::<V>).delete(stop::<V>))
        .route("/v1/alloc/{id}", get(alloc::<V>))
}

type Id = Result<Path<String>, PathRejection>;

async fn list<V: AgentView>(State(view): State<Arc<V>>) -> Result<Json<JobList>, ApiError> {
    view.jobs().map(Json)
}

async fn run<V: AgentView>(
    State(view): State<Arc<V>>,
    req: Request,
) -> Result<Json<JobStatus>, Refusal> {
    let req: JobRunRequest = json_body(req).await?;
    let index = newest_event(&*view);
    let mut status = view.run_job(req).await?;
    status.event_index = index;
    Ok(Json(status))
}

async fn status<V: AgentView>(
    State(view): State<Arc<V>>,
    id: Id,
) -> Result<Json<JobStatus>, ApiError> {
    let id = path_id("job id", id)?;
    view.job(&id).map(Json)
}

async fn stop<V: AgentView>(
    State(view): State<Arc<V>>,
    id: Id,
) -> Result<Json<JobStatus>, ApiError> {
    let id = path_id("job id", id)?;
    let index = newest_event(&*view);
    let mut status = view.stop_job(&id).await?;
    status.event_index = index;
    Ok(Json(status))
}

/// The newest index of the event stream now, when the agent keeps one.
fn newest_event<V: AgentView>(view: &V) -> Option<u64> {
    view.event_source().map(|s| *s.watch_last().borrow())
}

async fn alloc<V: AgentView>(
    State(view): State<Arc<V>>,
    id: Id,
) -> Result<Json<AllocStatus>, ApiError> {
    let id = path_id("alloc id", id)?;
    view.alloc(&id).map(Json)
}
