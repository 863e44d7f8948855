//! The CSI Identity service.

use std::sync::Arc;

use berth_csi::pb::{
    self, PluginCapability,
    plugin_capability::{self, Service, VolumeExpansion, service, volume_expansion},
};

use crate::{config::Mode, plugin::Plugin};

#[derive(Debug, Clone)]
pub(crate) struct IdentityService(pub Arc<Plugin>);

/// The plugin capabilities this plugin advertises in `mode` (CONTROLLER_SERVICE only when it
/// serves the Controller service).
pub(crate) fn plugin_capabilities(mode: Mode) -> Vec<PluginCapability> {
    let service = |t: service::Type| PluginCapability {
        r#type: Some(plugin_capability::Type::Service(Service {
            r#type: t as i32,
        })),
    };
    let controller = mode
        .serves_controller()
        .then(|| service(service::Type::ControllerService));
    controller
        .into_iter()
        .chain([
            service(service::Type::VolumeAccessibilityConstraints),
            PluginCapability {
                r#type: Some(plugin_capability::Type::VolumeExpansion(VolumeExpansion {
                    r#type: volume_expansion::Type::Online as i32,
                })),
            },
        ])
        .collect()
}

csi_service!(IdentityService: pb::identity_server::Identity {
    get_plugin_info(pb::GetPluginInfoRequest)
        -> pb::GetPluginInfoResponse = GetPluginInfo
        |p, _| Ok(pb::GetPluginInfoResponse {
            name: p.settings.driver_name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
            manifest: Default::default(),
        });
    get_plugin_capabilities(pb::GetPluginCapabilitiesRequest)
        -> pb::GetPluginCapabilitiesResponse = GetPluginCapabilities
        |p, _| Ok(pb::GetPluginCapabilitiesResponse {
            capabilities: plugin_capabilities(p.settings.mode),
        });
    probe(pb::ProbeRequest)
        -> pb::ProbeResponse = Probe
        |_, _| Ok(pb::ProbeResponse { ready: Some(true) });
});
