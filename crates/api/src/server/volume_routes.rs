//! The volume routes over a [`VolumeView`].

use std::sync::Arc;

use axum::{
    Json, Router,
    extract::{Path, RawQuery, Request, State, rejection::PathRejection},
    http::StatusCode,
    routing::{get, post},
};

use super::{
    ApiError, Refusal, VolumeView,
    extract::{json_body, json_body_or_default, path_id, query, segment},
};
use crate::volumes::{
    ClaimRequest, ClaimResponse, DetachRequest, DetachResponse, ExpandRequest, ExpandResponse,
    ReleaseRequest, ReleaseResponse, SnapshotCreateRequest, SnapshotDeleteRequest, SnapshotList,
    SnapshotView, VolumeList, VolumeSpecRequest, VolumeStatus,
};

/// Whether a spec registers or creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecOp {
    /// `POST /v1/volumes/register`.
    Register,
    /// `POST /v1/volumes/create`.
    Create,
}

/// The volume routes; merged into [`super::router`].
pub(super) fn routes<V: VolumeView>() -> Router<Arc<V>> {
    Router::new()
        .route("/v1/volumes", get(list::<V>))
        .route("/v1/volumes/register", post(register::<V>))
        .route("/v1/volumes/create", post(create::<V>))
        .route("/v1/volumes/snapshots", get(list_snapshots::<V>))
        .route("/v1/volumes/snapshot/delete", post(delete_snapshot::<V>))
        .route(
            "/v1/volume/csi/{id}",
            get(status::<V>).delete(deregister::<V>),
        )
        .route("/v1/volume/csi/{id}/delete", post(delete::<V>))
        .route("/v1/volume/csi/{id}/detach", post(detach::<V>))
        .route("/v1/volume/csi/{id}/expand", post(expand::<V>))
        .route("/v1/volume/csi/{id}/claim", post(claim::<V>))
        .route("/v1/volume/csi/{id}/release", post(release::<V>))
        .route("/v1/volume/csi/{id}/snapshot", post(create_snapshot::<V>))
}

type Id = Result<Path<String>, PathRejection>;

/// The `{id}` of an operator's volume route: the volume it is, or the one it is a prefix of.
/// Claim and release take the whole id: they are on the claim path, where a listing of the
/// catalog per call is not worth it.
fn volume_id<V: VolumeView>(view: &V, id: Id) -> Result<String, ApiError> {
    let id = path_id("volume id", id)?;
    super::extract::resolve_prefix("volume", &id, view.volume_ids())
}

async fn list<V: VolumeView>(State(view): State<Arc<V>>) -> Result<Json<VolumeList>, ApiError> {
    view.volumes().map(Json)
}

async fn register<V: VolumeView>(
    State(view): State<Arc<V>>,
    req: Request,
) -> Result<Json<VolumeStatus>, Refusal> {
    let req: VolumeSpecRequest = json_body(req).await?;
    Ok(Json(view.put_volume(SpecOp::Register, req).await?))
}

async fn create<V: VolumeView>(
    State(view): State<Arc<V>>,
    req: Request,
) -> Result<Json<VolumeStatus>, Refusal> {
    let req: VolumeSpecRequest = json_body(req).await?;
    Ok(Json(view.put_volume(SpecOp::Create, req).await?))
}

async fn status<V: VolumeView>(
    State(view): State<Arc<V>>,
    id: Id,
) -> Result<Json<VolumeStatus>, ApiError> {
    let id = volume_id(&*view, id)?;
    view.volume(&id).await.map(Json)
}

async fn deregister<V: VolumeView>(
    State(view): State<Arc<V>>,
    id: Id,
    RawQuery(params): RawQuery,
) -> Result<Json<DetachResponse>, ApiError> {
    let id = volume_id(&*view, id)?;
    let params = query(params.as_deref(), &["force"])?;
    let force = match params.get("force").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => {
            return Err(ApiError::BadRequest(
                "query `force`: expected true or false".into(),
            ));
        }
    };
    view.deregister_volume(&id, force).await.map(Json)
}

async fn delete<V: VolumeView>(State(view): State<Arc<V>>, id: Id) -> Result<StatusCode, ApiError> {
    let id = volume_id(&*view, id)?;
    view.delete_volume(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn detach<V: VolumeView>(
    State(view): State<Arc<V>>,
    id: Id,
    req: Request,
) -> Result<Json<DetachResponse>, Refusal> {
    let id = volume_id(&*view, id)?;
    let req: DetachRequest = json_body_or_default(req).await?;
    Ok(Json(view.detach_volume(&id, req).await?))
}

async fn expand<V: VolumeView>(
    State(view): State<Arc<V>>,
    id: Id,
    req: Request,
) -> Result<Json<ExpandResponse>, Refusal> {
    let id = volume_id(&*view, id)?;
    let req: ExpandRequest = json_body(req).await?;
    Ok(Json(view.expand_volume(&id, req).await?))
}

async fn claim<V: VolumeView>(
    State(view): State<Arc<V>>,
    id: Id,
    req: Request,
) -> Result<Json<ClaimResponse>, Refusal> {
    let id = path_id("volume id", id)?;
    let req: ClaimRequest = json_body(req).await?;
    Ok(Json(view.claim_volume(&id, req).await?))
}

async fn release<V: VolumeView>(
    State(view): State<Arc<V>>,
    id: Id,
    req: Request,
) -> Result<Json<ReleaseResponse>, Refusal> {
    let id = path_id("volume id", id)?;
    let req: ReleaseRequest = json_body(req).await?;
    Ok(Json(view.release_volume(&id, req).await?))
}

async fn create_snapshot<V: VolumeView>(
    State(view): State<Arc<V>>,
    id: Id,
    req: Request,
) -> Result<Json<SnapshotView>, Refusal> {
    let id = volume_id(&*view, id)?;
    let req: SnapshotCreateRequest = json_body(req).await?;
    Ok(Json(view.create_snapshot(&id, req).await?))
}

async fn delete_snapshot<V: VolumeView>(
    State(view): State<Arc<V>>,
    req: Request,
) -> Result<StatusCode, Refusal> {
    let req: SnapshotDeleteRequest = json_body(req).await?;
    view.delete_snapshot(req).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list_snapshots<V: VolumeView>(
    State(view): State<Arc<V>>,
    RawQuery(params): RawQuery,
) -> Result<Json<SnapshotList>, ApiError> {
    let params = query(params.as_deref(), &["plugin_id"])?;
    let plugin = params
        .get("plugin_id")
        .ok_or_else(|| ApiError::BadRequest("query `plugin_id` is required".into()))?;
    segment("plugin id", plugin)?;
    view.list_snapshots(plugin).await.map(Json)
}
