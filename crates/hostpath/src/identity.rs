//! The CSI Identity service.

use std::sync::Arc;

use berth_csi::{
    Rpc,
    pb::{
        self, PluginCapability,
        plugin_capability::{self, Service, VolumeExpansion, service, volume_expansion},
    },
};
use tonic::{Request, Response, Status};

use crate::plugin::Plugin;

#[derive(Debug, Clone)]
pub(crate) struct IdentityService(pub Arc<Plugin>);

/// The plugin capabilities this plugin advertises.
pub(crate) fn plugin_capabilities() -> Vec<PluginCapability> {
    let service = |t: service::Type| PluginCapability {
        r#type: Some(plugin_capability::Type::Service(Service {
            r#type: t as i32,
        })),
    };
    vec![
        service(service::Type::ControllerService),
        service(service::Type::VolumeAccessibilityConstraints),
        PluginCapability {
            r#type: Some(plugin_capability::Type::VolumeExpansion(VolumeExpansion {
                r#type: volume_expansion::Type::Online as i32,
            })),
        },
    ]
}

#[tonic::async_trait]
impl pb::identity_server::Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        request: Request<pb::GetPluginInfoRequest>,
    ) -> Result<Response<pb::GetPluginInfoResponse>, Status> {
        self.0
            .rpc(Rpc::GetPluginInfo, "", request, |p, req| async move {
                let _ = req;
                Ok(pb::GetPluginInfoResponse {
                    name: p.settings.driver_name.clone(),
                    vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
                    manifest: Default::default(),
                })
            })
            .await
    }

    async fn get_plugin_capabilities(
        &self,
        request: Request<pb::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<pb::GetPluginCapabilitiesResponse>, Status> {
        self.0
            .rpc(
                Rpc::GetPluginCapabilities,
                "",
                request,
                |p, req| async move {
                    let _ = (p, req);
                    Ok(pb::GetPluginCapabilitiesResponse {
                        capabilities: plugin_capabilities(),
                    })
                },
            )
            .await
    }

    async fn probe(
        &self,
        request: Request<pb::ProbeRequest>,
    ) -> Result<Response<pb::ProbeResponse>, Status> {
        self.0
            .rpc(Rpc::Probe, "", request, |p, req| async move {
                let _ = (p, req);
                Ok(pb::ProbeResponse { ready: Some(true) })
            })
            .await
    }
}
