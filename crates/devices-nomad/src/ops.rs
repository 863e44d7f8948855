//! What the device manager asks of one attached instance of a Nomad device plugin
//! ([`PluginOps`]): `Reserve` over the instance's connection, while it lives. What the plugin
//! says in a failure is scrubbed of its config values before the manager sees it.

use std::sync::{Arc, RwLock};

use berth_devices::{
    BoxFuture, grpc,
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

    /// The manager's view of a failed call through `client`: as every device plugin's
    /// ([`grpc::plugin_error`]); the message is already scrubbed by the client.
    fn error(&self, client: &NomadClient, e: CallError) -> PluginError {
        match e.failure {
            CallFailure::Timeout(after) => PluginError::Timeout {
                plugin: self.plugin.clone(),
                call: e.call.to_string(),
                after,
            },
            CallFailure::Status { code, message } => grpc::plugin_error(
                &self.plugin,
                e.call,
                client.timeout(),
                &tonic::Status::new(code, message),
            ),
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
                .map_err(|e| self.error(&client, e))?;
            // A path the plugin answered may hold a config value too.
            crate::convert::container_edits(&self.plugin, resp).map_err(|e| match e {
                PluginError::BadAnswer {
                    plugin,
                    call,
                    reason,
                } => PluginError::BadAnswer {
                    plugin,
                    call,
                    reason: client.secrets().scrub(&reason),
                },
                other => other,
            })
        })
    }
}
