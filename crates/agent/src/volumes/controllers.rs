//! The controller side of plugins as the control plane sees it, and the shared CSI clients.

use super::*;

/// The controller side of plugins, from the registry and the health loops.
pub struct AgentControllers {
    pub(super) registry: Arc<Registry>,
    pub(super) manager: Arc<Manager>,
    pub(super) clients: Arc<ClientCache>,
    /// Controllers on other nodes of a fleet, asked when this node has no healthy one.
    pub(super) remote: Option<Arc<dyn Controllers>>,
}

impl std::fmt::Debug for AgentControllers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentControllers")
            .field("remote", &self.remote.is_some())
            .finish_non_exhaustive()
    }
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
    /// This node's healthy controller; else another node's (in a fleet); else why there is none
    /// (an unhealthy one anywhere wins over "node only", which wins over "unknown").
    fn controller(&self, plugin_id: &str) -> ControllerAccess {
        let local = self.local(plugin_id);
        let Some(remote) = &self.remote else {
            return local;
        };
        if matches!(local, ControllerAccess::Healthy(_)) {
            return local;
        }
        match (local, remote.controller(plugin_id)) {
            (_, h @ ControllerAccess::Healthy(_)) => h,
            (u @ ControllerAccess::Unhealthy(_), _) => u,
            (ControllerAccess::NodeOnly, _) | (_, ControllerAccess::NodeOnly) => {
                ControllerAccess::NodeOnly
            }
            _ => ControllerAccess::UnknownPlugin,
        }
    }
}

impl AgentControllers {
    /// The controller side of `plugin_id` on this node only.
    pub fn local(&self, plugin_id: &str) -> ControllerAccess {
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
                            client: Arc::new(client),
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
