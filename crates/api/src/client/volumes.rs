//! The volume calls (`/v1/volumes`, `/v1/volume/csi/{id}`). Reads use the client's timeout;
//! changes and snapshot lists use its change timeout ([`super::CHANGE_TIMEOUT`]), as the agent
//! retries CSI calls before it answers. Ids are
//! sent percent-encoded, exactly as given: the agent refuses ids that are not valid.

use hyper::Method;

use super::{Client, ClientError, encode, encode_segment};
use crate::volumes::{
    ClaimRequest, ClaimResponse, DetachRequest, DetachResponse, ExpandRequest, ExpandResponse,
    ReleaseRequest, ReleaseResponse, SnapshotCreateRequest, SnapshotDeleteRequest, SnapshotList,
    SnapshotView, VolumeList, VolumeSpecRequest, VolumeStatus,
};

/// `/v1/volume/csi/{id}` followed by `rest`.
fn volume_path(id: &str, rest: &str) -> String {
    format!("/v1/volume/csi/{}{rest}", encode_segment(id))
}

impl Client {
    /// `GET /v1/volumes`: every volume in the catalog, by id.
    pub async fn volumes(&self) -> Result<VolumeList, ClientError> {
        self.call_json(Method::GET, "/v1/volumes".into(), None)
            .await
    }

    /// `GET /v1/volume/csi/{id}`: one volume with its claims and its usages on this node; 404
    /// when there is no such volume (see [`ClientError::is_not_found`]).
    pub async fn volume(&self, id: &str) -> Result<VolumeStatus, ClientError> {
        self.call_json(Method::GET, volume_path(id, ""), None).await
    }

    /// `POST /v1/volumes/register`: adds a volume that exists at the provider.
    pub async fn register_volume(
        &self,
        req: &VolumeSpecRequest,
    ) -> Result<VolumeStatus, ClientError> {
        self.change_json(Method::POST, "/v1/volumes/register".into(), Some(req))
            .await
    }

    /// `POST /v1/volumes/create`: creates a volume at the provider (CreateVolume) and adds it.
    pub async fn create_volume(
        &self,
        req: &VolumeSpecRequest,
    ) -> Result<VolumeStatus, ClientError> {
        self.change_json(Method::POST, "/v1/volumes/create".into(), Some(req))
            .await
    }

    /// `DELETE /v1/volume/csi/{id}[?force=true]`: removes a volume from the catalog (not from
    /// the provider). With `force`, every claim is released first; the answer lists them.
    pub async fn deregister_volume(
        &self,
        id: &str,
        force: bool,
    ) -> Result<DetachResponse, ClientError> {
        let query = if force { "?force=true" } else { "" };
        self.change_json::<(), _>(Method::DELETE, volume_path(id, query), None)
            .await
    }

    /// `POST /v1/volume/csi/{id}/delete`: deletes the volume at the provider and from the
    /// catalog.
    pub async fn delete_volume(&self, id: &str) -> Result<(), ClientError> {
        self.call_within(
            self.change_timeout,
            Method::POST,
            volume_path(id, "/delete"),
            None,
        )
        .await
        .map(drop)
    }

    /// `POST /v1/volume/csi/{id}/detach`: releases every claim of one node (this node when
    /// `req.node_id` is `None`).
    pub async fn detach_volume(
        &self,
        id: &str,
        req: &DetachRequest,
    ) -> Result<DetachResponse, ClientError> {
        self.change_json(Method::POST, volume_path(id, "/detach"), Some(req))
            .await
    }

    /// `POST /v1/volume/csi/{id}/expand`: grows the volume.
    pub async fn expand_volume(
        &self,
        id: &str,
        req: &ExpandRequest,
    ) -> Result<ExpandResponse, ClientError> {
        self.change_json(Method::POST, volume_path(id, "/expand"), Some(req))
            .await
    }

    /// `POST /v1/volume/csi/{id}/claim`: claims and mounts the volume for an alloc on this
    /// node; the answer says where it is mounted.
    pub async fn claim_volume(
        &self,
        id: &str,
        req: &ClaimRequest,
    ) -> Result<ClaimResponse, ClientError> {
        self.change_json(Method::POST, volume_path(id, "/claim"), Some(req))
            .await
    }

    /// `POST /v1/volume/csi/{id}/release`: unmounts and releases an alloc's claim. An answer
    /// with `released: false` is not an error: the agent keeps retrying in the background.
    pub async fn release_volume(
        &self,
        id: &str,
        req: &ReleaseRequest,
    ) -> Result<ReleaseResponse, ClientError> {
        self.change_json(Method::POST, volume_path(id, "/release"), Some(req))
            .await
    }

    /// `POST /v1/volume/csi/{id}/snapshot`: snapshots the volume.
    pub async fn create_snapshot(
        &self,
        id: &str,
        req: &SnapshotCreateRequest,
    ) -> Result<SnapshotView, ClientError> {
        self.change_json(Method::POST, volume_path(id, "/snapshot"), Some(req))
            .await
    }

    /// `POST /v1/volumes/snapshot/delete`: deletes a snapshot at the provider.
    pub async fn delete_snapshot(&self, req: &SnapshotDeleteRequest) -> Result<(), ClientError> {
        let path = "/v1/volumes/snapshot/delete".to_string();
        let body = encode(&Method::POST, &path, req)?;
        self.call_within(self.change_timeout, Method::POST, path, Some(body))
            .await
            .map(drop)
    }

    /// `GET /v1/volumes/snapshots?plugin_id=…`: the snapshots a controller plugin lists.
    /// Within the change timeout: the agent waits on ListSnapshots, whose deadline is longer
    /// than the read timeout.
    pub async fn list_snapshots(&self, plugin_id: &str) -> Result<SnapshotList, ClientError> {
        let path = format!(
            "/v1/volumes/snapshots?plugin_id={}",
            encode_segment(plugin_id)
        );
        self.call_json_within(self.change_timeout, Method::GET, path, None)
            .await
    }

    /// A volume change within the change timeout, with an optional JSON body.
    async fn change_json<B: serde::Serialize, T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: String,
        body: Option<&B>,
    ) -> Result<T, ClientError> {
        let body = body.map(|b| encode(&method, &path, b)).transpose()?;
        self.call_json_within(self.change_timeout, method, path, body)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_stay_one_segment() {
        assert_eq!(volume_path("vol-1", ""), "/v1/volume/csi/vol-1");
        assert_eq!(volume_path("..", "/claim"), "/v1/volume/csi/%2E%2E/claim");
        assert_eq!(
            volume_path("a/b?force=true", ""),
            "/v1/volume/csi/a%2Fb%3Fforce%3Dtrue"
        );
    }
}
