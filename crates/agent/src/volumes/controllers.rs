//! The controller side of plugins as the control plane sees it, and the shared CSI clients.

use super::*;

/// The controller side of plugins, from the registry and the health loops.
#[derive(Debug)]
pub struct AgentControllers {
    pub(super) registry: Arc<Registry>,
    pub(super) manager: Arc<Manager>,
    pub(super) clients: Arc<ClientCache>,
}

/// One CSI client per socket, shared by every volume operation (so connections are reused).
#[derive(Debug)]
pub struct ClientCache {
    pub(super) clients: Mutex<HashMap<PathBuf, CsiClient>>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) cancel: CancellationToken,
}

impl ClientCache {
    pub(super) fn get(&self, plugin_id: &str, socket: &std::path::Path) -> Option<CsiClient> {
        let mut map = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = map.get(socket) {
            return Some(c.clone());
        }
        let endpoint = Endpoint::from_path(socket).ok()?;
        let client = CsiClient::builder(endpoint)
            .cancellation(self.cancel.clone())
            .observer(self.metrics.observer(plugin_id))
            .build();
        map.insert(socket.to_path_buf(), client.clone());
        Some(client)
    }
}

impl Controllers for AgentControllers {
    fn controller(&self, plugin_id: &str) -> ControllerAccess {
        let records = self.registry.instances(plugin_id);
        if records.is_empty() {
            return ControllerAccess::UnknownPlugin;
        }
        let mut why = None;
        for r in records.iter().filter(|r| r.plugin_type.is_controller()) {
            let state = self.manager.state(&r.id, &r.instance);
            match state {
                Some(s) if s.health.healthy => {
                    if let (Some(caps), Some(client)) = (
                        s.fingerprint.and_then(|f| f.controller_capabilities),
                        self.clients.get(plugin_id, &r.socket),
                    ) {
                        return ControllerAccess::Healthy(ControllerHandle {
                            instance: r.instance.clone(),
                            client,
                            capabilities: caps,
                        });
                    }
                }
                Some(s) => {
                    why.get_or_insert(format!("instance {}: {}", r.instance, s.health.description));
                }
                None => {
                    why.get_or_insert(format!("instance {}: not checked yet", r.instance));
                }
            }
        }
        match why {
            None if !records.iter().any(|r| r.plugin_type.is_controller()) => {
                ControllerAccess::NodeOnly
            }
            None => ControllerAccess::Unhealthy("no fingerprint yet".into()),
            Some(w) => ControllerAccess::Unhealthy(w),
        }
    }
}
