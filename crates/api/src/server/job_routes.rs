//! The job and alloc routes over a [`super::JobView`]. A job or alloc id in a path may be a
//! unique prefix of one (an ambiguous prefix is refused with the candidates).

use std::sync::Arc;

use axum::{
    Json, Router,
    extract::{Path, RawQuery, Request, State, rejection::PathRejection},
    routing::{get, post},
};

use super::{
    AgentView, ApiError, Refusal,
    extract::{json_body, json_body_or_default, path_id, query, resolve_prefix},
};
use crate::jobs::{
    AllocActionRequest, AllocActionResponse, AllocStats, AllocStatus, JobList, JobPlan,
    JobRunRequest, JobSpecView, JobStatus,
};

/// The job routes; merged into [`super::router`].
pub(super) fn routes<V: AgentView>() -> Router<Arc<V>> {
    Router::new()
        .route("/v1/jobs", get(list::<V>).post(run::<V>))
        .route("/v1/jobs/plan", post(plan::<V>))
        .route("/v1/job/{id}", get(status::<V>).delete(stop::<V>))
        .route("/v1/job/{id}/spec", get(spec::<V>))
        .route("/v1/alloc/{id}", get(alloc::<V>))
        .route("/v1/alloc/{id}/stop", post(stop_alloc::<V>))
        .route("/v1/alloc/{id}/restart", post(restart_alloc::<V>))
        .route("/v1/alloc/{id}/signal", post(signal_alloc::<V>))
        .route("/v1/alloc/{id}/stats", get(alloc_stats::<V>))
}

type Id = Result<Path<String>, PathRejection>;

/// The whole id of the job `id` names (itself, or the one job it is a prefix of).
pub(super) fn job_id<V: AgentView>(view: &V, id: Id) -> Result<String, ApiError> {
    let id = path_id("job id", id)?;
    resolve_prefix("job", &id, view.job_ids())
}

/// The whole id of the alloc `id` names.
pub(super) fn alloc_id<V: AgentView>(view: &V, id: Id) -> Result<String, ApiError> {
    let id = path_id("alloc id", id)?;
    resolve_prefix("alloc", &id, view.alloc_ids())
}

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

async fn plan<V: AgentView>(
    State(view): State<Arc<V>>,
    req: Request,
) -> Result<Json<JobPlan>, Refusal> {
    let req: JobRunRequest = json_body(req).await?;
    Ok(Json(view.plan_job(req).await?))
}

async fn status<V: AgentView>(
    State(view): State<Arc<V>>,
    id: Id,
) -> Result<Json<JobStatus>, ApiError> {
    let id = job_id(&*view, id)?;
    view.job(&id).map(Json)
}

async fn spec<V: AgentView>(
    State(view): State<Arc<V>>,
    id: Id,
) -> Result<Json<JobSpecView>, ApiError> {
    let id = job_id(&*view, id)?;
    view.job_spec(&id).map(Json)
}

async fn stop<V: AgentView>(
    State(view): State<Arc<V>>,
    id: Id,
    RawQuery(raw): RawQuery,
) -> Result<Json<JobStatus>, ApiError> {
    let q = query(raw.as_deref(), &["purge"])?;
    let purge = match q.get("purge").map(String::as_str) {
        None | Some("false") => false,
        Some("true" | "") => true,
        Some(_) => {
            return Err(ApiError::BadRequest(
                "query parameter `purge`: expected true or false".into(),
            ));
        }
    };
    let id = job_id(&*view, id)?;
    let index = newest_event(&*view);
    let mut status = view.stop_job(&id, purge).await?;
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
    let id = alloc_id(&*view, id)?;
    view.alloc(&id).map(Json)
}

async fn stop_alloc<V: AgentView>(
    State(view): State<Arc<V>>,
    id: Id,
) -> Result<Json<AllocStatus>, ApiError> {
    let id = alloc_id(&*view, id)?;
    view.stop_alloc(&id).await.map(Json)
}

async fn restart_alloc<V: AgentView>(
    State(view): State<Arc<V>>,
    id: Id,
    req: Request,
) -> Result<Json<AllocActionResponse>, Refusal> {
    let id = alloc_id(&*view, id)?;
    let req: AllocActionRequest = json_body_or_default(req).await?;
    if req.signal.is_some() {
        return Err(ApiError::BadRequest("`signal` is for /signal, not /restart".into()).into());
    }
    Ok(Json(view.restart_alloc(&id, req.task.as_deref())?))
}

async fn signal_alloc<V: AgentView>(
    State(view): State<Arc<V>>,
    id: Id,
    req: Request,
) -> Result<Json<AllocActionResponse>, Refusal> {
    let id = alloc_id(&*view, id)?;
    let req: AllocActionRequest = json_body(req).await?;
    let signal = req
        .signal
        .as_deref()
        .ok_or_else(|| ApiError::BadRequest("`signal`: required, e.g. \"SIGHUP\"".into()))?;
    Ok(Json(view.signal_alloc(&id, req.task.as_deref(), signal)?))
}

async fn alloc_stats<V: AgentView>(
    State(view): State<Arc<V>>,
    id: Id,
) -> Result<Json<AllocStats>, ApiError> {
    let id = alloc_id(&*view, id)?;
    view.alloc_stats(&id).await.map(Json)
}
