//! What the device manager asks of one attached instance of a Nomad device plugin
//! ([`PluginOps`]): `Reserve` over the instance's connection, while it lives.

use std::sync::{Arc, RwLock};

use berth_devices::{
    BoxFuture,
    model::ContainerEdits,
    plugin::{PluginError, PluginId, PluginOps},
};

use crate::client::{CallError, CallFailure, NomadClient};

/// The [`PluginOps`] of one attachment: calls go to its plugin process until it is
/// disconnected (the process stopped or failed), then fail as
/// [`PluginError::Unavailable`]. A restarted plugin gets a new one.
#[derive(Debug)]
pub struct NomadOps {
    plugin: PluginId,
    client: RwLock<Option<NomadClient>>,
    /// Why it is disconnected, once it is.
    gone: RwLock<String>,
}

impl NomadOps {
    /// Ops over `client` (each call with the client's deadline).
    pub fn new(plugin: PluginId, client: NomadClient) -> Arc<Self> {
        Arc::new(Self {
            plugin,
            client: RwLock::new(Some(client)),
            gone: RwLock::new(String::new()),
        })
    }

    /// Ops with no connection: every call is [`PluginError::Unavailable`] for `reason`.
    pub fn disconnected(plugin: PluginId, reason: &str) -> Arc<Self> {
        Arc::new(Self {
            plugin,
            client: RwLock::new(None),
            gone: RwLock::new(reason.to_string()),
        })
    }

    /// From now on every call fails as unavailable, for `reason`.
    pub fn disconnect(&self, reason: &str) {
        *self.gone.write().unwrap_or_else(|p| p.into_inner()) = reason.to_string();
        *self.client.write().unwrap_or_else(|p| p.into_inner()) = None;
    }

    fn client(&self) -> Result<NomadClient, PluginError> {
        let client = self.client.read().unwrap_or_else(|p| p.into_inner());
        client.clone().ok_or_else(|| PluginError::Unavailable {
            plugin: self.plugin.clone(),
            reason: self.gone.read().unwrap_or_else(|p| p.into_inner()).clone(),
        })
    }

    fn error(&self, e: CallError) -> PluginError {
        match e.failure {
            CallFailure::Timeout(after) => PluginError::Timeout {
                plugin: self.plugin.clone(),
                call: e.call.to_string(),
                after,
            },
            // The transport's codes: the plugin cannot be reached.
            CallFailure::Status {
                code: tonic::Code::Unavailable | tonic::Code::Cancelled,
                message,
            } => PluginError::Unavailable {
                plugin: self.plugin.clone(),
                reason: format!("{} failed: {message}", e.call),
            },
            CallFailure::Status { code, message } => PluginError::Refused {
                plugin: self.plugin.clone(),
                call: e.call.to_string(),
                message: if message.is_empty() {
                    format!("{code:?}")
                } else {
                    format!("{message} ({code:?})")
                },
            },
        }
    }
}

impl PluginOps for NomadOps {
    fn reserve<'a>(
        &'a self,
        device_ids: &'a [String],
    ) -> BoxFuture<'a, Result<ContainerEdits, PluginError>> {
        Box::pin(async move {
            let client = self.client()?;
            let resp = client
                .reserve(device_ids)
                .await
                .map_err(|e| self.error(e))?;
            crate::convert::container_edits(&self.plugin, resp)
        })
    }
}
