//! A typed CSI client over a unix socket, with the retry policy of [`crate::retry`].
//!
//! The client connects lazily: creating one never touches the socket, and a plugin that
//! restarts behind the same socket is reconnected to on the next attempt.

use std::{fmt, io, sync::Arc, time::Duration};

use hyper_util::rt::TokioIo;
use tokio::{net::UnixStream, time::Instant};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status, transport::Channel};
use tracing::{Instrument as _, debug, trace};

use crate::{
    endpoint::{Endpoint, EndpointError},
    error::{CsiError, sanitize},
    model::{
        ControllerCapabilities, ExternalId, ModelError, NodeCapabilities, NodeInfo,
        PluginCapabilities, PluginInfo, Secrets, Snapshot, Volume, VolumeCapability, VolumeStats,
    },
    pb,
    requests::{
        CapacityRange, ContentSource, ControllerPublish, CreateVolume, NodeExpand, NodePublish,
        NodeStage, model_map, opt_path_str, path_str, sensitive, wire_map,
    },
    retry::{RetryPolicy, Rpc},
    transport::PluginChannel,
};

/// A lazily connecting, reconnecting tonic `Channel` to the socket, for bare generated stubs
/// that should use tonic's own transport. The client sends on a [`PluginChannel`].
pub fn channel(endpoint: &Endpoint) -> Channel {
    let ep = endpoint.clone();
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let ep = ep.clone();
        async move {
            match UnixStream::connect(ep.path()).await {
                Ok(stream) => Ok(TokioIo::new(stream)),
                Err(e) => Err(io::Error::other(ep.classify(e))),
            }
        }
    });
    // The URI is required by the API and unused: the connector ignores it.
    tonic::transport::Endpoint::from_static("http://csi.invalid")
        .connect_with_connector_lazy(connector)
}

/// A CSI request: the RPC it is, and the message its answer carries.
trait Answered: prost::Message + fmt::Debug {
    const RPC: Rpc;
    type Answer: prost::Message + Default;
}

macro_rules! answered {
    ($($rpc:ident: $request:ident => $answer:ident),+ $(,)?) => {
        $(impl Answered for pb::$request {
            const RPC: Rpc = Rpc::$rpc;
            type Answer = pb::$answer;
        })+
    };
}

answered!(
    GetPluginInfo: GetPluginInfoRequest => GetPluginInfoResponse,
    GetPluginCapabilities: GetPluginCapabilitiesRequest => GetPluginCapabilitiesResponse,
    Probe: ProbeRequest => ProbeResponse,
    CreateVolume: CreateVolumeRequest => CreateVolumeResponse,
    DeleteVolume: DeleteVolumeRequest => DeleteVolumeResponse,
    ControllerPublishVolume: ControllerPublishVolumeRequest => ControllerPublishVolumeResponse,
    ControllerUnpublishVolume: ControllerUnpublishVolumeRequest => ControllerUnpublishVolumeResponse,
    ValidateVolumeCapabilities: ValidateVolumeCapabilitiesRequest => ValidateVolumeCapabilitiesResponse,
    ListVolumes: ListVolumesRequest => ListVolumesResponse,
    GetCapacity: GetCapacityRequest => GetCapacityResponse,
    ControllerGetCapabilities: ControllerGetCapabilitiesRequest => ControllerGetCapabilitiesResponse,
    CreateSnapshot: CreateSnapshotRequest => CreateSnapshotResponse,
    DeleteSnapshot: DeleteSnapshotRequest => DeleteSnapshotResponse,
    ListSnapshots: ListSnapshotsRequest => ListSnapshotsResponse,
    GetSnapshot: GetSnapshotRequest => GetSnapshotResponse,
    ControllerExpandVolume: ControllerExpandVolumeRequest => ControllerExpandVolumeResponse,
    ControllerGetVolume: ControllerGetVolumeRequest => ControllerGetVolumeResponse,
    ControllerModifyVolume: ControllerModifyVolumeRequest => ControllerModifyVolumeResponse,
    NodeStageVolume: NodeStageVolumeRequest => NodeStageVolumeResponse,
    NodeUnstageVolume: NodeUnstageVolumeRequest => NodeUnstageVolumeResponse,
    NodePublishVolume: NodePublishVolumeRequest => NodePublishVolumeResponse,
    NodeUnpublishVolume: NodeUnpublishVolumeRequest => NodeUnpublishVolumeResponse,
    NodeGetVolumeStats: NodeGetVolumeStatsRequest => NodeGetVolumeStatsResponse,
    NodeExpandVolume: NodeExpandVolumeRequest => NodeExpandVolumeResponse,
    NodeGetCapabilities: NodeGetCapabilitiesRequest => NodeGetCapabilitiesResponse,
    NodeGetInfo: NodeGetInfoRequest => NodeGetInfoResponse,
);

/// Sees every attempt of every call: for metrics, and for tests that count attempts.
pub trait CallObserver: Send + Sync + 'static {
    /// Attempt number `attempt` (1-based) of `rpc` ended with `outcome` after `latency`.
    fn on_attempt(&self, rpc: Rpc, attempt: u32, outcome: Result<(), Code>, latency: Duration);
}

/// Builds a [`CsiClient`] with non-default policies, a cancellation token or an observer.
pub struct ClientBuilder {
    endpoint: Endpoint,
    overrides: Vec<(Rpc, RetryPolicy)>,
    cancel: Option<CancellationToken>,
    observer: Option<Arc<dyn CallObserver>>,
}

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl ClientBuilder {
    /// Uses `policy` for `rpc` instead of the table's.
    pub fn policy(mut self, rpc: Rpc, policy: RetryPolicy) -> Self {
        self.overrides.retain(|(r, _)| *r != rpc);
        self.overrides.push((rpc, policy));
        self
    }

    /// Calls end with [`CsiError::Cancelled`] once `token` is cancelled.
    pub fn cancellation(mut self, token: CancellationToken) -> Self {
        self.cancel = Some(token);
        self
    }

    /// Reports every attempt to `observer`.
    pub fn observer(mut self, observer: Arc<dyn CallObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Creates the client; nothing connects yet.
    pub fn build(self) -> CsiClient {
        CsiClient {
            inner: Arc::new(Inner {
                channel: PluginChannel::new(self.endpoint),
                overrides: self.overrides,
                cancel: self.cancel,
                observer: self.observer,
            }),
        }
    }
}

/// A client of one CSI plugin socket. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct CsiClient {
    inner: Arc<Inner>,
}

struct Inner {
    channel: PluginChannel,
    /// A few entries at most: a scan beats hashing.
    overrides: Vec<(Rpc, RetryPolicy)>,
    /// None when nothing can cancel the calls (no token given): no waiter to register per call.
    cancel: Option<CancellationToken>,
    observer: Option<Arc<dyn CallObserver>>,
}

impl fmt::Debug for CsiClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CsiClient")
            .field("endpoint", self.endpoint())
            .finish_non_exhaustive()
    }
}

/// The outcome of ValidateVolumeCapabilities.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Validation {
    /// The plugin confirmed the capabilities.
    Confirmed,
    /// It did not; its message says why.
    NotConfirmed(String),
}

/// A volume as ListVolumes reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedVolume {
    /// The volume.
    pub volume: Volume,
    /// Nodes it is published to, when the plugin reports them.
    pub published_node_ids: Vec<String>,
    /// `Some(message)` when the plugin reports it abnormal.
    pub abnormal: Option<String>,
}

/// One page of a list call, and the token of the next one (empty at the end).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    /// The entries.
    pub entries: Vec<T>,
    /// Pass it to get the next page; empty when there is none.
    pub next_token: String,
}

impl CsiClient {
    /// A client with the default policies. Never fails and never connects.
    pub fn new(endpoint: Endpoint) -> Self {
        Self::builder(endpoint).build()
    }

    /// A builder for a client with other policies or a cancellation token.
    pub fn builder(endpoint: Endpoint) -> ClientBuilder {
        ClientBuilder {
            endpoint,
            overrides: Vec::new(),
            cancel: None,
            observer: None,
        }
    }

    /// The socket this client talks to.
    pub fn endpoint(&self) -> &Endpoint {
        self.inner.channel.endpoint()
    }

    /// How many connections this client has opened: a change means the last one ended (the
    /// plugin may have restarted) and a call opened another.
    pub fn connections(&self) -> u64 {
        self.inner.channel.connections()
    }

    /// The channel this client sends on (a clone shares its connection): for bare generated
    /// stubs that should take the same path, as benchmarks comparing the two do.
    pub fn channel(&self) -> PluginChannel {
        self.inner.channel.clone()
    }

    /// The policy in force for `rpc`.
    pub fn policy(&self, rpc: Rpc) -> RetryPolicy {
        self.inner
            .overrides
            .iter()
            .find(|(r, _)| *r == rpc)
            .map_or_else(|| rpc.policy(), |(_, p)| *p)
    }

    fn observe(&self, rpc: Rpc, attempt: u32, outcome: Result<(), Code>, sent_at: Instant) {
        if let Some(o) = &self.inner.observer {
            o.on_attempt(rpc, attempt, outcome, sent_at.elapsed());
        }
    }

    /// Sends `req` until it succeeds, fails for good, runs out of time or is cancelled.
    async fn call<Req: Answered>(
        &self,
        req: Req,
        sensitive: &[String],
    ) -> Result<Req::Answer, CsiError> {
        let rpc = Req::RPC;
        let policy = self.policy(rpc);
        let cancel = self.inner.cancel.as_ref();
        let span = tracing::debug_span!("csi", %rpc, endpoint = %self.endpoint().path().display());
        async move {
            let start = Instant::now();
            let deadline = start + policy.overall_timeout;
            let mut attempts = 0u32;
            loop {
                attempts += 1;
                let remaining = deadline.saturating_duration_since(Instant::now());
                let attempt_timeout = policy.attempt_timeout.min(remaining);
                trace!(attempt = attempts, request = ?req, "sending");
                let sent_at = Instant::now();
                // The plugin gets the deadline as `grpc-timeout`; this timer is the only one
                // that bounds the attempt on this side.
                let sent = tokio::select! {
                    biased;
                    () = cancelled(cancel) => {
                        self.observe(rpc, attempts, Err(Code::Cancelled), sent_at);
                        return Err(CsiError::Cancelled { rpc, attempts });
                    }
                    r = tokio::time::timeout(
                        attempt_timeout,
                        self.inner.channel.unary(rpc.path(), &req, attempt_timeout),
                    ) => r,
                };
                let status = match sent {
                    Ok(Ok(resp)) => {
                        trace!(attempt = attempts, "ok");
                        self.observe(rpc, attempts, Ok(()), sent_at);
                        return Ok(resp);
                    }
                    Ok(Err(status)) => status,
                    Err(_) => attempt_deadline_exceeded(attempt_timeout),
                };
                let socket = endpoint_error(&status);
                let code = status.code();
                self.observe(rpc, attempts, Err(code), sent_at);
                let message = match &socket {
                    Some(e) => e.to_string(),
                    None => sanitize(status.message(), sensitive),
                };
                if let Some(e) = socket.clone().filter(|e| !e.is_transient()) {
                    debug!(attempt = attempts, error = %e, "socket unusable");
                    return Err(CsiError::Endpoint { rpc, source: e });
                }
                if !policy.retries(code) {
                    debug!(attempt = attempts, ?code, %message, "failed");
                    let already_done = code == Code::NotFound && policy.not_found_is_done;
                    return Err(CsiError::Rpc {
                        rpc,
                        code,
                        message,
                        attempts,
                        already_done,
                    });
                }
                let wait = policy.backoff(attempts);
                if Instant::now() + wait >= deadline {
                    debug!(attempt = attempts, ?code, %message, "giving up");
                    if let Some(e) = socket {
                        return Err(CsiError::Endpoint { rpc, source: e });
                    }
                    return Err(CsiError::Exhausted {
                        rpc,
                        code,
                        message,
                        attempts,
                        elapsed: start.elapsed(),
                        deadline: policy.overall_timeout,
                    });
                }
                debug!(attempt = attempts, ?code, %message, ?wait, "retrying");
                tokio::select! {
                    biased;
                    () = cancelled(cancel) => return Err(CsiError::Cancelled { rpc, attempts }),
                    () = tokio::time::sleep(wait) => {}
                }
            }
        }
        .instrument(span)
        .await
    }

    // ---- Identity ----

    /// GetPluginInfo: the plugin's name and version.
    pub async fn plugin_info(&self) -> Result<PluginInfo, CsiError> {
        let rpc = Rpc::GetPluginInfo;
        let r = self.call(pb::GetPluginInfoRequest {}, &[]).await?;
        if r.name.is_empty() {
            return Err(CsiError::InvalidResponse {
                rpc,
                source: ModelError::Missing { field: "name" },
            });
        }
        Ok(PluginInfo {
            name: r.name,
            vendor_version: r.vendor_version,
            manifest: model_map(&r.manifest),
        })
    }

    /// GetPluginCapabilities.
    pub async fn plugin_capabilities(&self) -> Result<PluginCapabilities, CsiError> {
        let r = self.call(pb::GetPluginCapabilitiesRequest {}, &[]).await?;
        Ok(PluginCapabilities::from_pb(&r.capabilities))
    }

    /// Probe: whether the plugin is ready. An absent `ready` means ready.
    pub async fn probe(&self) -> Result<bool, CsiError> {
        let r = self.call(pb::ProbeRequest {}, &[]).await?;
        Ok(r.ready.is_none_or(|b| b))
    }

    // ---- Controller ----

    /// ControllerGetCapabilities.
    pub async fn controller_capabilities(&self) -> Result<ControllerCapabilities, CsiError> {
        let r = self
            .call(pb::ControllerGetCapabilitiesRequest {}, &[])
            .await?;
        Ok(ControllerCapabilities::from_pb(&r.capabilities))
    }

    /// CreateVolume. Idempotent by name.
    pub async fn create_volume(&self, req: &CreateVolume) -> Result<Volume, CsiError> {
        let rpc = Rpc::CreateVolume;
        let invalid = |source| CsiError::InvalidRequest { rpc, source };
        if req.name.is_empty() {
            return Err(invalid(ModelError::Missing { field: "name" }));
        }
        if req.capabilities.is_empty() {
            return Err(invalid(ModelError::Missing {
                field: "volume_capabilities",
            }));
        }
        use pb::volume_content_source::{SnapshotSource, Type, VolumeSource};
        let source = req.source.as_ref().map(|s| pb::VolumeContentSource {
            r#type: Some(match s {
                ContentSource::Snapshot(id) => Type::Snapshot(SnapshotSource {
                    snapshot_id: id.clone(),
                }),
                ContentSource::Volume(id) => Type::Volume(VolumeSource {
                    volume_id: id.as_str().into(),
                }),
            }),
        });
        let wire = pb::CreateVolumeRequest {
            name: req.name.clone(),
            capacity_range: req.capacity.to_pb(),
            volume_capabilities: req
                .capabilities
                .iter()
                .map(VolumeCapability::to_pb)
                .collect(),
            parameters: wire_map(&req.parameters),
            secrets: req.secrets.to_wire(),
            volume_content_source: source,
            accessibility_requirements: req.accessibility_requirements.clone(),
            mutable_parameters: Default::default(),
        };
        let hidden = sensitive(&req.secrets, &req.capabilities);
        let r = self.call(wire, &hidden).await?;
        let v = r.volume.ok_or(CsiError::InvalidResponse {
            rpc,
            source: ModelError::Missing { field: "volume" },
        })?;
        Volume::from_pb(&v).map_err(|source| CsiError::InvalidResponse { rpc, source })
    }

    /// DeleteVolume. `NOT_FOUND` from the plugin is reported as already done.
    pub async fn delete_volume(&self, id: &ExternalId, secrets: &Secrets) -> Result<(), CsiError> {
        let wire = pb::DeleteVolumeRequest {
            volume_id: id.as_str().into(),
            secrets: secrets.to_wire(),
        };
        self.call(wire, &sensitive(secrets, [])).await.map(drop)
    }

    /// ControllerPublishVolume: returns the publish context for the node calls.
    pub async fn controller_publish(
        &self,
        req: &ControllerPublish,
    ) -> Result<std::collections::BTreeMap<String, String>, CsiError> {
        let rpc = Rpc::ControllerPublishVolume;
        if req.node_id.is_empty() {
            return Err(CsiError::InvalidRequest {
                rpc,
                source: ModelError::Missing { field: "node_id" },
            });
        }
        let wire = pb::ControllerPublishVolumeRequest {
            volume_id: req.external_id.as_str().into(),
            node_id: req.node_id.clone(),
            volume_capability: Some(req.capability.to_pb()),
            readonly: req.read_only,
            secrets: req.secrets.to_wire(),
            volume_context: wire_map(&req.volume_context),
        };
        let r = self
            .call(wire, &sensitive(&req.secrets, [&req.capability]))
            .await?;
        Ok(model_map(&r.publish_context))
    }

    /// ControllerUnpublishVolume. `NOT_FOUND` is reported as already done.
    pub async fn controller_unpublish(
        &self,
        id: &ExternalId,
        node_id: &str,
        secrets: &Secrets,
    ) -> Result<(), CsiError> {
        let wire = pb::ControllerUnpublishVolumeRequest {
            volume_id: id.as_str().into(),
            node_id: node_id.into(),
            secrets: secrets.to_wire(),
        };
        self.call(wire, &sensitive(secrets, [])).await.map(drop)
    }

    /// ValidateVolumeCapabilities.
    pub async fn validate_capabilities(
        &self,
        id: &ExternalId,
        capabilities: &[VolumeCapability],
        volume_context: &std::collections::BTreeMap<String, String>,
        parameters: &std::collections::BTreeMap<String, String>,
        secrets: &Secrets,
    ) -> Result<Validation, CsiError> {
        let rpc = Rpc::ValidateVolumeCapabilities;
        if capabilities.is_empty() {
            return Err(CsiError::InvalidRequest {
                rpc,
                source: ModelError::Missing {
                    field: "volume_capabilities",
                },
            });
        }
        let wire = pb::ValidateVolumeCapabilitiesRequest {
            volume_id: id.as_str().into(),
            volume_context: wire_map(volume_context),
            volume_capabilities: capabilities.iter().map(VolumeCapability::to_pb).collect(),
            parameters: wire_map(parameters),
            secrets: secrets.to_wire(),
            mutable_parameters: Default::default(),
        };
        let hidden = sensitive(secrets, capabilities);
        let r = self.call(wire, &hidden).await?;
        Ok(match r.confirmed {
            Some(_) => Validation::Confirmed,
            None => Validation::NotConfirmed(sanitize(&r.message, &hidden)),
        })
    }

    /// ListVolumes: one page.
    pub async fn list_volumes(
        &self,
        max_entries: i32,
        starting_token: &str,
    ) -> Result<Page<ListedVolume>, CsiError> {
        let rpc = Rpc::ListVolumes;
        let wire = pb::ListVolumesRequest {
            max_entries,
            starting_token: starting_token.into(),
        };
        let r = self.call(wire, &[]).await?;
        let mut entries = Vec::with_capacity(r.entries.len());
        for e in &r.entries {
            let v = e.volume.as_ref().ok_or(CsiError::InvalidResponse {
                rpc,
                source: ModelError::Missing {
                    field: "entries.volume",
                },
            })?;
            let status = e.status.as_ref();
            entries.push(ListedVolume {
                volume: Volume::from_pb(v)
                    .map_err(|source| CsiError::InvalidResponse { rpc, source })?,
                published_node_ids: status
                    .map(|s| s.published_node_ids.clone())
                    .unwrap_or_default(),
                abnormal: status
                    .and_then(|s| s.volume_condition.as_ref())
                    .filter(|c| c.abnormal)
                    .map(|c| c.message.clone()),
            });
        }
        Ok(Page {
            entries,
            next_token: r.next_token,
        })
    }

    /// GetCapacity: bytes available for volumes with these capabilities and parameters.
    pub async fn get_capacity(
        &self,
        capabilities: &[VolumeCapability],
        parameters: &std::collections::BTreeMap<String, String>,
        topology: Option<&std::collections::BTreeMap<String, String>>,
    ) -> Result<i64, CsiError> {
        let wire = pb::GetCapacityRequest {
            volume_capabilities: capabilities.iter().map(VolumeCapability::to_pb).collect(),
            parameters: wire_map(parameters),
            accessible_topology: topology.map(|t| pb::Topology {
                segments: wire_map(t),
            }),
        };
        let hidden = sensitive(&Secrets::default(), capabilities);
        let r = self.call(wire, &hidden).await?;
        Ok(r.available_capacity)
    }

    /// CreateSnapshot. Idempotent by name.
    pub async fn create_snapshot(
        &self,
        source: &ExternalId,
        name: &str,
        parameters: &std::collections::BTreeMap<String, String>,
        secrets: &Secrets,
    ) -> Result<Snapshot, CsiError> {
        let rpc = Rpc::CreateSnapshot;
        if name.is_empty() {
            return Err(CsiError::InvalidRequest {
                rpc,
                source: ModelError::Missing { field: "name" },
            });
        }
        let wire = pb::CreateSnapshotRequest {
            source_volume_id: source.as_str().into(),
            name: name.into(),
            secrets: secrets.to_wire(),
            parameters: wire_map(parameters),
        };
        let r = self.call(wire, &sensitive(secrets, [])).await?;
        let s = r.snapshot.ok_or(CsiError::InvalidResponse {
            rpc,
            source: ModelError::Missing { field: "snapshot" },
        })?;
        Ok(Snapshot::from(&s))
    }

    /// DeleteSnapshot. `NOT_FOUND` is reported as already done.
    pub async fn delete_snapshot(
        &self,
        snapshot_id: &str,
        secrets: &Secrets,
    ) -> Result<(), CsiError> {
        let rpc = Rpc::DeleteSnapshot;
        if snapshot_id.is_empty() {
            return Err(CsiError::InvalidRequest {
                rpc,
                source: ModelError::Missing {
                    field: "snapshot_id",
                },
            });
        }
        let wire = pb::DeleteSnapshotRequest {
            snapshot_id: snapshot_id.into(),
            secrets: secrets.to_wire(),
        };
        self.call(wire, &sensitive(secrets, [])).await.map(drop)
    }

    /// ListSnapshots: one page, optionally filtered by source volume or snapshot id.
    pub async fn list_snapshots(
        &self,
        source: Option<&ExternalId>,
        snapshot_id: Option<&str>,
        max_entries: i32,
        starting_token: &str,
        secrets: &Secrets,
    ) -> Result<Page<Snapshot>, CsiError> {
        let wire = pb::ListSnapshotsRequest {
            max_entries,
            starting_token: starting_token.into(),
            source_volume_id: source.map(|s| s.as_str().to_string()).unwrap_or_default(),
            snapshot_id: snapshot_id.unwrap_or_default().into(),
            secrets: secrets.to_wire(),
        };
        let r = self.call(wire, &sensitive(secrets, [])).await?;
        Ok(Page {
            entries: r
                .entries
                .iter()
                .filter_map(|e| e.snapshot.as_ref())
                .map(Snapshot::from)
                .collect(),
            next_token: r.next_token,
        })
    }

    /// ControllerExpandVolume: the new size, and whether NodeExpandVolume must follow.
    pub async fn controller_expand(
        &self,
        id: &ExternalId,
        capacity: CapacityRange,
        capability: Option<&VolumeCapability>,
        secrets: &Secrets,
    ) -> Result<(i64, bool), CsiError> {
        let wire = pb::ControllerExpandVolumeRequest {
            volume_id: id.as_str().into(),
            capacity_range: capacity.to_pb(),
            secrets: secrets.to_wire(),
            volume_capability: capability.map(VolumeCapability::to_pb),
        };
        let r = self.call(wire, &sensitive(secrets, capability)).await?;
        Ok((r.capacity_bytes, r.node_expansion_required))
    }

    // ---- Node ----

    /// NodeGetCapabilities.
    pub async fn node_capabilities(&self) -> Result<NodeCapabilities, CsiError> {
        let r = self.call(pb::NodeGetCapabilitiesRequest {}, &[]).await?;
        Ok(NodeCapabilities::from_pb(&r.capabilities))
    }

    /// NodeGetInfo.
    pub async fn node_info(&self) -> Result<NodeInfo, CsiError> {
        let rpc = Rpc::NodeGetInfo;
        let r = self.call(pb::NodeGetInfoRequest {}, &[]).await?;
        if r.node_id.is_empty() {
            return Err(CsiError::InvalidResponse {
                rpc,
                source: ModelError::Missing { field: "node_id" },
            });
        }
        Ok(NodeInfo {
            node_id: r.node_id,
            max_volumes_per_node: r.max_volumes_per_node,
            accessible_topology: r.accessible_topology.map(|t| model_map(&t.segments)),
        })
    }

    /// NodeStageVolume.
    pub async fn node_stage(&self, req: &NodeStage) -> Result<(), CsiError> {
        let rpc = Rpc::NodeStageVolume;
        let wire = pb::NodeStageVolumeRequest {
            volume_id: req.external_id.as_str().into(),
            publish_context: wire_map(&req.publish_context),
            staging_target_path: path_str("staging_target_path", &req.staging_path)
                .map_err(|source| CsiError::InvalidRequest { rpc, source })?,
            volume_capability: Some(req.capability.to_pb()),
            secrets: req.secrets.to_wire(),
            volume_context: wire_map(&req.volume_context),
        };
        self.call(wire, &sensitive(&req.secrets, [&req.capability]))
            .await
            .map(drop)
    }

    /// NodeUnstageVolume. `NOT_FOUND` is reported as already done.
    pub async fn node_unstage(
        &self,
        id: &ExternalId,
        staging_path: &std::path::Path,
    ) -> Result<(), CsiError> {
        let rpc = Rpc::NodeUnstageVolume;
        let wire = pb::NodeUnstageVolumeRequest {
            volume_id: id.as_str().into(),
            staging_target_path: path_str("staging_target_path", staging_path)
                .map_err(|source| CsiError::InvalidRequest { rpc, source })?,
        };
        self.call(wire, &[]).await.map(drop)
    }

    /// NodePublishVolume.
    pub async fn node_publish(&self, req: &NodePublish) -> Result<(), CsiError> {
        let rpc = Rpc::NodePublishVolume;
        let invalid = |source| CsiError::InvalidRequest { rpc, source };
        let wire = pb::NodePublishVolumeRequest {
            volume_id: req.external_id.as_str().into(),
            publish_context: wire_map(&req.publish_context),
            staging_target_path: opt_path_str("staging_target_path", req.staging_path.as_deref())
                .map_err(invalid)?,
            target_path: path_str("target_path", &req.target_path).map_err(invalid)?,
            volume_capability: Some(req.capability.to_pb()),
            readonly: req.read_only,
            secrets: req.secrets.to_wire(),
            volume_context: wire_map(&req.volume_context),
        };
        self.call(wire, &sensitive(&req.secrets, [&req.capability]))
            .await
            .map(drop)
    }

    /// NodeUnpublishVolume. `NOT_FOUND` is reported as already done.
    pub async fn node_unpublish(
        &self,
        id: &ExternalId,
        target_path: &std::path::Path,
    ) -> Result<(), CsiError> {
        let rpc = Rpc::NodeUnpublishVolume;
        let wire = pb::NodeUnpublishVolumeRequest {
            volume_id: id.as_str().into(),
            target_path: path_str("target_path", target_path)
                .map_err(|source| CsiError::InvalidRequest { rpc, source })?,
        };
        self.call(wire, &[]).await.map(drop)
    }

    /// NodeGetVolumeStats for a path where the volume is published (or staged).
    pub async fn node_volume_stats(
        &self,
        id: &ExternalId,
        volume_path: &std::path::Path,
        staging_path: Option<&std::path::Path>,
    ) -> Result<VolumeStats, CsiError> {
        let rpc = Rpc::NodeGetVolumeStats;
        let invalid = |source| CsiError::InvalidRequest { rpc, source };
        let wire = pb::NodeGetVolumeStatsRequest {
            volume_id: id.as_str().into(),
            volume_path: path_str("volume_path", volume_path).map_err(invalid)?,
            staging_target_path: opt_path_str("staging_target_path", staging_path)
                .map_err(invalid)?,
        };
        let r = self.call(wire, &[]).await?;
        Ok(VolumeStats::from(&r))
    }

    /// NodeExpandVolume: the new size the plugin reports.
    pub async fn node_expand(&self, req: &NodeExpand) -> Result<i64, CsiError> {
        let rpc = Rpc::NodeExpandVolume;
        let invalid = |source| CsiError::InvalidRequest { rpc, source };
        let wire = pb::NodeExpandVolumeRequest {
            volume_id: req.external_id.as_str().into(),
            volume_path: path_str("volume_path", &req.volume_path).map_err(invalid)?,
            capacity_range: req.capacity.to_pb(),
            staging_target_path: opt_path_str("staging_target_path", req.staging_path.as_deref())
                .map_err(invalid)?,
            volume_capability: req.capability.as_ref().map(VolumeCapability::to_pb),
            secrets: req.secrets.to_wire(),
        };
        let r = self
            .call(wire, &sensitive(&req.secrets, req.capability.as_ref()))
            .await?;
        Ok(r.capacity_bytes)
    }
}

/// Resolves once `token` is cancelled; never without a token.
async fn cancelled(token: Option<&CancellationToken>) {
    match token {
        Some(token) => token.cancelled().await,
        None => std::future::pending().await,
    }
}

fn attempt_deadline_exceeded(limit: Duration) -> Status {
    Status::deadline_exceeded(format!(
        "no answer within the attempt deadline of {limit:?}"
    ))
}

/// The socket problem behind a transport failure, if that is what it was.
fn endpoint_error(status: &Status) -> Option<EndpointError> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(err) = cur {
        if let Some(e) = err.downcast_ref::<EndpointError>() {
            return Some(e.clone());
        }
        if let Some(e) = err
            .downcast_ref::<io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|e| e.downcast_ref::<EndpointError>())
        {
            return Some(e.clone());
        }
        cur = err.source();
    }
    None
}
