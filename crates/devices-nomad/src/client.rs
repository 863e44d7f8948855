//! A client of one running Nomad device plugin: the BasePlugin calls (`PluginInfo`,
//! `ConfigSchema`, `SetConfig`), the DevicePlugin calls (`Fingerprint`, `Reserve`, `Stats`) and
//! go-plugin's `GRPCController.Shutdown`. Every unary call, and the opening of every stream,
//! has a deadline.

use std::{fmt, future::Future, time::Duration};

use berth_devices::grpc::{MAX_MESSAGE_CHARS, is_deadline};
use berth_input::{Quoted, quoted_list, shown_within};
use tonic::{Request, Response, Status, Streaming, transport::Channel};

use crate::{
    handshake::{DEVICE_API_VERSION, PluginAddress},
    proto::{
        base::{
            self, ConfigSchemaRequest, NomadConfig, NomadDriverConfig, PluginInfoRequest,
            SetConfigRequest, base_plugin_client::BasePluginClient,
        },
        controller::{self, grpc_controller_client::GrpcControllerClient},
        device::{
            FingerprintRequest, FingerprintResponse, ReserveRequest, ReserveResponse, StatsRequest,
            StatsResponse, device_plugin_client::DevicePluginClient,
        },
        hclspec::Spec,
    },
    text::Secrets,
};

/// How a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallFailure {
    /// The plugin (or the transport) answered with this status.
    Status {
        /// The gRPC code.
        code: tonic::Code,
        /// The message, escaped, cut and scrubbed of the plugin's config values.
        message: String,
    },
    /// No answer before the deadline (whoever noticed: the client's timer, tonic's, or the
    /// plugin answering `DeadlineExceeded`).
    Timeout(Duration),
}

impl fmt::Display for CallFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Status { code, message } if message.is_empty() => {
                write!(f, "{code:?}: {}", code.description())
            }
            Self::Status { code, message } => write!(f, "{code:?}: {message}"),
            Self::Timeout(after) => {
                write!(f, "no answer within {}", berth_sys::short_duration(*after))
            }
        }
    }
}

/// A call to a plugin failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("plugin {}: {call}: {failure}", Quoted(plugin))]
pub struct CallError {
    /// The plugin's configured name.
    pub plugin: String,
    /// The RPC (`PluginInfo`, `Reserve`…).
    pub call: &'static str,
    /// How it failed.
    pub failure: CallFailure,
}

impl CallError {
    fn status(plugin: &str, call: &'static str, status: &Status, secrets: &Secrets) -> Self {
        Self {
            plugin: plugin.to_string(),
            call,
            failure: CallFailure::Status {
                code: status.code(),
                message: secrets.scrub(&shown_within(status.message().trim(), MAX_MESSAGE_CHARS)),
            },
        }
    }

    /// The gRPC code, when the plugin or the transport answered.
    pub fn code(&self) -> Option<tonic::Code> {
        match self.failure {
            CallFailure::Status { code, .. } => Some(code),
            CallFailure::Timeout(_) => None,
        }
    }
}

/// The kind of plugin, from `PluginInfo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginKind {
    /// A device plugin: what berth runs.
    Device,
    /// A task driver plugin.
    Driver,
    /// Anything else (the raw enum value).
    Other(i32),
}

impl fmt::Display for PluginKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Device => f.write_str("device"),
            Self::Driver => f.write_str("driver"),
            Self::Other(n) => write!(f, "unknown-type ({n})"),
        }
    }
}

/// What a plugin says it is (`PluginInfo`). Its version and name are escaped and cut; the API
/// versions are as sent (compared, and quoted when shown).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginInfo {
    /// Its kind.
    pub kind: PluginKind,
    /// The plugin API versions it speaks.
    pub api_versions: Vec<String>,
    /// Its own version.
    pub version: String,
    /// The name it gives itself.
    pub name: String,
}

/// A plugin that berth cannot run as a device plugin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotADevicePlugin {
    /// It is another kind of plugin.
    #[error(
        "plugin {} is a {kind} plugin; berth runs device plugins only",
        Quoted(plugin)
    )]
    Kind {
        /// The configured name.
        plugin: String,
        /// What it is.
        kind: PluginKind,
    },
    /// It speaks none of the device plugin API versions berth speaks.
    #[error(
        "plugin {} speaks device plugin API versions [{}]; berth speaks {DEVICE_API_VERSION}",
        Quoted(plugin),
        quoted_list(versions.iter().map(String::as_str))
    )]
    ApiVersion {
        /// The configured name.
        plugin: String,
        /// What it speaks.
        versions: Vec<String>,
    },
}

impl PluginInfo {
    fn from_proto(info: base::PluginInfoResponse) -> Self {
        let kind = match base::PluginType::try_from(info.r#type) {
            Ok(base::PluginType::Device) => PluginKind::Device,
            Ok(base::PluginType::Driver) => PluginKind::Driver,
            _ => PluginKind::Other(info.r#type),
        };
        Self {
            kind,
            api_versions: info.plugin_api_versions,
            version: shown_within(&info.plugin_version, 64),
            name: shown_within(&info.name, 128),
        }
    }

    /// Ok when it is a device plugin that speaks [`DEVICE_API_VERSION`]; `plugin` is its
    /// configured name, for the error.
    pub fn check_device(&self, plugin: &str) -> Result<(), NotADevicePlugin> {
        if self.kind != PluginKind::Device {
            return Err(NotADevicePlugin::Kind {
                plugin: plugin.to_string(),
                kind: self.kind,
            });
        }
        if !self.api_versions.iter().any(|v| v == DEVICE_API_VERSION) {
            return Err(NotADevicePlugin::ApiVersion {
                plugin: plugin.to_string(),
                versions: self.api_versions.clone(),
            });
        }
        Ok(())
    }
}

/// A client of one plugin process. Cheap to clone; every clone shares the connection, which
/// is made on the first call.
#[derive(Debug, Clone)]
pub struct NomadClient {
    plugin: String,
    base: BasePluginClient<Channel>,
    device: DevicePluginClient<Channel>,
    controller: GrpcControllerClient<Channel>,
    timeout: Duration,
    /// Scrubbed from the messages of failed calls.
    secrets: Secrets,
}

impl NomadClient {
    /// A client of the plugin `plugin` (its configured name, for errors) listening at
    /// `address`; every call gets `timeout` unless it takes its own. Nothing is dialed yet.
    pub fn new(plugin: &str, address: &PluginAddress, timeout: Duration) -> Self {
        let channel = match address {
            PluginAddress::Unix(path) => berth_devices::grpc::unix_channel(path),
            PluginAddress::Tcp(addr) => {
                tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                    .expect("a socket address makes a valid URI")
                    .connect_lazy()
            }
        };
        Self {
            plugin: plugin.to_string(),
            base: BasePluginClient::new(channel.clone()),
            device: DevicePluginClient::new(channel.clone()),
            controller: GrpcControllerClient::new(channel),
            timeout,
            secrets: Secrets::default(),
        }
    }

    /// This client with the values of `secrets` scrubbed from the messages of failed calls.
    pub(crate) fn scrubbing(mut self, secrets: Secrets) -> Self {
        self.secrets = secrets;
        self
    }

    /// What is scrubbed from what this plugin says.
    pub(crate) fn secrets(&self) -> &Secrets {
        &self.secrets
    }

    /// The default deadline of a call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// `PluginInfo` with the default deadline.
    pub async fn plugin_info(&self) -> Result<PluginInfo, CallError> {
        self.plugin_info_within(self.timeout).await
    }

    /// `PluginInfo` with deadline `deadline` (the liveness check uses a short one).
    pub async fn plugin_info_within(&self, deadline: Duration) -> Result<PluginInfo, CallError> {
        let mut client = self.base.clone();
        let info = self
            .unary(
                "PluginInfo",
                deadline,
                PluginInfoRequest {},
                |r| async move { client.plugin_info(r).await },
            )
            .await?;
        Ok(PluginInfo::from_proto(info))
    }

    /// `ConfigSchema`: the plugin's configuration schema; `None` when it has none.
    pub async fn config_schema(&self) -> Result<Option<Spec>, CallError> {
        let mut client = self.base.clone();
        let resp = self
            .unary(
                "ConfigSchema",
                self.timeout,
                ConfigSchemaRequest {},
                |r| async move { client.config_schema(r).await },
            )
            .await?;
        Ok(resp.spec.filter(|s| s.block.is_some()))
    }

    /// `SetConfig` with `msgpack_config` (the schema-decoded configuration, see
    /// [`crate::msgpack`]), API version [`DEVICE_API_VERSION`] and a Nomad config with zero
    /// driver settings (device plugins have none).
    pub async fn set_config(&self, msgpack_config: Vec<u8>) -> Result<(), CallError> {
        self.set_config_raw(SetConfigRequest {
            msgpack_config,
            nomad_config: Some(NomadConfig {
                driver: Some(NomadDriverConfig::default()),
            }),
            plugin_api_version: DEVICE_API_VERSION.to_string(),
        })
        .await
    }

    /// `SetConfig` with a request as given (tests use it to send what berth never would).
    pub async fn set_config_raw(&self, request: SetConfigRequest) -> Result<(), CallError> {
        let mut client = self.base.clone();
        self.unary("SetConfig", self.timeout, request, |r| async move {
            client.set_config(r).await
        })
        .await
        .map(|_| ())
    }

    /// Opens the `Fingerprint` stream (the opening has the default deadline; messages then
    /// come as the plugin sends them).
    pub async fn fingerprint(&self) -> Result<Streaming<FingerprintResponse>, CallError> {
        let mut client = self.device.clone();
        self.unary(
            "Fingerprint",
            self.timeout,
            FingerprintRequest {},
            |r| async move { client.fingerprint(r).await },
        )
        .await
    }

    /// `Reserve` of `device_ids`.
    pub async fn reserve(&self, device_ids: &[String]) -> Result<ReserveResponse, CallError> {
        let mut client = self.device.clone();
        let request = ReserveRequest {
            device_ids: device_ids.to_vec(),
        };
        self.unary("Reserve", self.timeout, request, |r| async move {
            client.reserve(r).await
        })
        .await
    }

    /// Opens the `Stats` stream with collection interval `interval`.
    pub async fn stats(&self, interval: Duration) -> Result<Streaming<StatsResponse>, CallError> {
        let mut client = self.device.clone();
        let request = StatsRequest {
            collection_interval: prost_types::Duration::try_from(interval).ok(),
        };
        self.unary("Stats", self.timeout, request, |r| async move {
            client.stats(r).await
        })
        .await
    }

    /// go-plugin's `GRPCController.Shutdown` with deadline `deadline`: the plugin stops
    /// serving and exits.
    pub async fn shutdown(&self, deadline: Duration) -> Result<(), CallError> {
        let mut client = self.controller.clone();
        self.unary("Shutdown", deadline, controller::Empty {}, |r| async move {
            client.shutdown(r).await
        })
        .await
        .map(|_| ())
    }

    async fn unary<Req, Resp, F, Fut>(
        &self,
        call: &'static str,
        deadline: Duration,
        message: Req,
        send: F,
    ) -> Result<Resp, CallError>
    where
        F: FnOnce(Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let mut request = Request::new(message);
        request.set_timeout(deadline);
        match tokio::time::timeout(deadline, send(request)).await {
            Ok(Ok(resp)) => Ok(resp.into_inner()),
            Ok(Err(status)) if !is_deadline(&status) => Err(CallError::status(
                &self.plugin,
                call,
                &status,
                &self.secrets,
            )),
            // tonic enforces the request's deadline too, and may notice first.
            Ok(Err(_)) | Err(_) => Err(CallError {
                plugin: self.plugin.clone(),
                call,
                failure: CallFailure::Timeout(deadline),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(kind: i32, versions: &[&str]) -> PluginInfo {
        PluginInfo::from_proto(base::PluginInfoResponse {
            r#type: kind,
            plugin_api_versions: versions.iter().map(|v| (*v).to_string()).collect(),
            plugin_version: "0.1.0".into(),
            name: "x".into(),
        })
    }

    #[test]
    fn only_device_plugins_of_our_api_version_pass() {
        assert!(info(3, &["v0.1.0"]).check_device("gpu").is_ok());
        assert_eq!(
            info(2, &["v0.1.0"])
                .check_device("gpu")
                .unwrap_err()
                .to_string(),
            "plugin \"gpu\" is a driver plugin; berth runs device plugins only"
        );
        assert!(
            info(7, &[])
                .check_device("gpu")
                .unwrap_err()
                .to_string()
                .contains("unknown-type (7) plugin")
        );
        assert!(
            info(3, &["v0.2.0"])
                .check_device("gpu")
                .unwrap_err()
                .to_string()
                .contains("speaks device plugin API versions [\"v0.2.0\"]; berth speaks v0.1.0")
        );
    }
}
