//! What the fleet's tests share: a node's own controller over a real berth-hostpath.

use std::sync::Arc;

use berth_controlplane::{ControllerAccess, ControllerHandle, Controllers};
use berth_csi::{CsiClient, Endpoint, model::ControllerCapabilities};
use berth_testkit::{HostpathPlugin, HostpathPluginBuilder};

/// This node's own controller: a client of a real plugin.
pub struct Local {
    pub client: CsiClient,
    pub caps: ControllerCapabilities,
}

impl Controllers for Local {
    fn controller(&self, _plugin_id: &str) -> ControllerAccess {
        ControllerAccess::Healthy(ControllerHandle {
            instance: "hp-1".into(),
            client: Arc::new(self.client.clone()),
            capabilities: self.caps.clone(),
        })
    }
}

/// berth-hostpath as `builder` sets it up, strict about the caller's duties, and the
/// controller over it.
pub async fn local(builder: HostpathPluginBuilder) -> (HostpathPlugin, Local) {
    let hp = builder.strict(true).spawn().await;
    let client = CsiClient::new(Endpoint::from_path(hp.socket()).unwrap());
    let caps = client.controller_capabilities().await.unwrap();
    (hp, Local { client, caps })
}
