//! The job routes over a [`JobView`].

use std::sync::Arc;

use axum::{
    Json, Router,
    body::Bytes,
    extract::{
        Path, State,
        rejection::{BytesRejection, PathRejection},
    },
    routing::get,
};

use super::{ApiError, JobView, volume_routes::parse};
use crate::jobs::{AllocStatus, JobList, JobRunRequest, JobStatus};

/// The job routes; merged into [`super::router`].
pub(super) fn routes<V: JobView>() -> Router<Arc<V>> {
    Router::new()
        .route("/v1/jobs", get(list::<V>).post(run::<V>))
        .route("/v1/job/{id}", get(status::<V>).delete(stop::<V>))
        .route("/v1/alloc/{id}", get(alloc::<V>))
}

fn segment(
    what: &'static str,
    id: Result<Path<String>, PathRejection>,
) -> Result<String, ApiError> {
    let Path(id) = id.map_err(super::routes::path_error)?;
    berth_sys::validate_path_segment(what, &id).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    Ok(id)
}

async fn list<V: JobView>(State(view): State<Arc<V>>) -> Result<Json<JobList>, ApiError> {
    view.jobs().map(Json)
}

async fn run<V: JobView>(
    State(view): State<Arc<V>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<JobStatus>, ApiError> {
    let req: JobRunRequest = parse("job run request", body)?;
    view.run_job(req).await.map(Json)
}

async fn status<V: JobView>(
    State(view): State<Arc<V>>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<JobStatus>, ApiError> {
    let id = segment("job id", id)?;
    view.job(&id).map(Json)
}

async fn stop<V: JobView>(
    State(view): State<Arc<V>>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<JobStatus>, ApiError> {
    let id = segment("job id", id)?;
    view.stop_job(&id).await.map(Json)
}

async fn alloc<V: JobView>(
    State(view): State<Arc<V>>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<AllocStatus>, ApiError> {
    let id = segment("alloc id", id)?;
    view.alloc(&id).map(Json)
}
