//! The job routes over a [`JobView`].

use std::sync::Arc;

use axum::{
    Json, Router,
    extract::{Path, Request, State, rejection::PathRejection},
    routing::get,
};

use super::{
    ApiError, JobView, Refusal,
    extract::{json_body, path_id},
};
use crate::jobs::{AllocStatus, JobList, JobRunRequest, JobStatus};

/// The job routes; merged into [`super::router`].
pub(super) fn routes<V: JobView>() -> Router<Arc<V>> {
    Router::new()
        .route("/v1/jobs", get(list::<V>).post(run::<V>))
        .route("/v1/job/{id}", get(status::<V>).delete(stop::<V>))
        .route("/v1/alloc/{id}", get(alloc::<V>))
}

type Id = Result<Path<String>, PathRejection>;

async fn list<V: JobView>(State(view): State<Arc<V>>) -> Result<Json<JobList>, ApiError> {
    view.jobs().map(Json)
}

async fn run<V: JobView>(
    State(view): State<Arc<V>>,
    req: Request,
) -> Result<Json<JobStatus>, Refusal> {
    let req: JobRunRequest = json_body(req).await?;
    Ok(Json(view.run_job(req).await?))
}

async fn status<V: JobView>(
    State(view): State<Arc<V>>,
    id: Id,
) -> Result<Json<JobStatus>, ApiError> {
    let id = path_id("job id", id)?;
    view.job(&id).map(Json)
}

async fn stop<V: JobView>(State(view): State<Arc<V>>, id: Id) -> Result<Json<JobStatus>, ApiError> {
    let id = path_id("job id", id)?;
    view.stop_job(&id).await.map(Json)
}

async fn alloc<V: JobView>(
    State(view): State<Arc<V>>,
    id: Id,
) -> Result<Json<AllocStatus>, ApiError> {
    let id = path_id("alloc id", id)?;
    view.alloc(&id).map(Json)
}
