//! The volume routes over a [`VolumeView`].

use std::{collections::HashMap, sync::Arc};

use axum::{
    Json, Router,
    body::Bytes,
    extract::{
        Path, Query, State,
        rejection::{BytesRejection, PathRejection, QueryRejection},
    },
    http::StatusCode,
    routing::{get, post},
};
use serde::de::DeserializeOwned;

use super::{ApiError, VolumeView};
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

/// Parses a JSON body; the error names the field (or line and column) at fault.
pub(super) fn parse<T: DeserializeOwned>(
    what: &str,
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let body = body.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let bad = |m: String| ApiError::BadRequest(format!("invalid {what}: {m}"));
    let mut de = serde_json::Deserializer::from_slice(&body);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            bad(e.inner().to_string())
        } else {
            bad(format!("field `{path}`: {}", e.inner()))
        }
    })?;
    de.end().map_err(|e| bad(e.to_string()))?;
    Ok(value)
}

/// The `{id}` of a volume route, checked as a path segment.
fn volume_id(id: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(id) = id.map_err(super::routes::path_error)?;
    berth_sys::validate_path_segment("volume id", &id)
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    Ok(id)
}

async fn list<V: VolumeView>(State(view): State<Arc<V>>) -> Result<Json<VolumeList>, ApiError> {
    view.volumes().map(Json)
}

async fn register<V: VolumeView>(
    State(view): State<Arc<V>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<VolumeStatus>, ApiError> {
    let req: VolumeSpecRequest = parse("volume spec request", body)?;
    view.put_volume(SpecOp::Register, req).await.map(Json)
}

async fn create<V: VolumeView>(
    State(view): State<Arc<V>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<VolumeStatus>, ApiError> {
    let req: VolumeSpecRequest = parse("volume spec request", body)?;
    view.put_volume(SpecOp::Create, req).await.map(Json)
}

async fn status<V: VolumeView>(
    State(view): State<Arc<V>>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<VolumeStatus>, ApiError> {
    let id = volume_id(id)?;
    view.volume(&id).await.map(Json)
}

async fn deregister<V: VolumeView>(
    State(view): State<Arc<V>>,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Result<Json<DetachResponse>, ApiError> {
    let id = volume_id(id)?;
    let Query(query) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let force = match query.get("force").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "query `force`: expected true or false, not {other:?}"
            )));
        }
    };
    if let Some(k) = query.keys().find(|k| *k != "force") {
        return Err(ApiError::BadRequest(format!(
            "unknown query parameter {k:?}"
        )));
    }
    view.deregister_volume(&id, force).await.map(Json)
}

async fn delete<V: VolumeView>(
    State(view): State<Arc<V>>,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let id = volume_id(id)?;
    view.delete_volume(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn detach<V: VolumeView>(
    State(view): State<Arc<V>>,
    id: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<DetachResponse>, ApiError> {
    let id = volume_id(id)?;
    let req: DetachRequest = match body {
        Ok(b) if b.is_empty() => DetachRequest::default(),
        other => parse("detach request", other)?,
    };
    if let Some(node) = &req.node_id {
        berth_sys::validate_path_segment("node_id", node)
            .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    }
    view.detach_volume(&id, req).await.map(Json)
}

async fn expand<V: VolumeView>(
    State(view): State<Arc<V>>,
    id: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<ExpandResponse>, ApiError> {
    let id = volume_id(id)?;
    let req: ExpandRequest = parse("expand request", body)?;
    if let Some(max) = req.capacity_max
        && max < req.capacity_min
    {
        return Err(ApiError::BadRequest(
            "field `capacity_max`: below capacity_min".into(),
        ));
    }
    if req.capacity_min > i64::MAX as u64 || req.capacity_max.is_some_and(|m| m > i64::MAX as u64) {
        return Err(ApiError::BadRequest(
            "field `capacity_min`: too large".into(),
        ));
    }
    view.expand_volume(&id, req).await.map(Json)
}

async fn claim<V: VolumeView>(
    State(view): State<Arc<V>>,
    id: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<ClaimResponse>, ApiError> {
    let id = volume_id(id)?;
    let req: ClaimRequest = parse("claim request", body)?;
    berth_sys::validate_path_segment("alloc_id", &req.alloc_id)
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    view.claim_volume(&id, req).await.map(Json)
}

async fn release<V: VolumeView>(
    State(view): State<Arc<V>>,
    id: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<ReleaseResponse>, ApiError> {
    let id = volume_id(id)?;
    let req: ReleaseRequest = parse("release request", body)?;
    berth_sys::validate_path_segment("alloc_id", &req.alloc_id)
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    view.release_volume(&id, req).await.map(Json)
}

async fn create_snapshot<V: VolumeView>(
    State(view): State<Arc<V>>,
    id: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<SnapshotView>, ApiError> {
    let id = volume_id(id)?;
    let req: SnapshotCreateRequest = parse("snapshot request", body)?;
    if req.name.is_empty() {
        return Err(ApiError::BadRequest(
            "field `name`: must not be empty".into(),
        ));
    }
    view.create_snapshot(&id, req).await.map(Json)
}

async fn delete_snapshot<V: VolumeView>(
    State(view): State<Arc<V>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, ApiError> {
    let req: SnapshotDeleteRequest = parse("snapshot delete request", body)?;
    berth_sys::validate_path_segment("plugin_id", &req.plugin_id)
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    if req.snapshot_id.is_empty() {
        return Err(ApiError::BadRequest(
            "field `snapshot_id`: must not be empty".into(),
        ));
    }
    view.delete_snapshot(req).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list_snapshots<V: VolumeView>(
    State(view): State<Arc<V>>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Result<Json<SnapshotList>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let plugin = query
        .get("plugin_id")
        .ok_or_else(|| ApiError::BadRequest("query `plugin_id` is required".into()))?;
    berth_sys::validate_path_segment("plugin_id", plugin)
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    view.list_snapshots(plugin).await.map(Json)
}
