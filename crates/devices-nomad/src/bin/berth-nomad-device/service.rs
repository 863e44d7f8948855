//! The services: BasePlugin, DevicePlugin, go-plugin's GRPCController and the gRPC health
//! check, over one shared plugin state. Strict about what the host owes: no device call
//! before `SetConfig`, no `SetConfig` without every key or of an API version it does not
//! speak, no `Stats` without a positive collection interval, and no `Reserve` but of
//! distinct devices healthy in the list `Fingerprint` last sent.

use std::{
    collections::HashMap,
    pin::Pin,
    sync::{Arc, RwLock},
    time::{Duration, SystemTime},
};

use berth_devices_nomad::{
    DEVICE_API_VERSION,
    convert::attribute_to_proto,
    proto::{
        base::{self, base_plugin_server::BasePlugin},
        controller::{self, grpc_controller_server::GrpcController},
        device::{self as pb, device_plugin_server::DevicePlugin},
        health::{self, health_check_response::ServingStatus, health_server::Health},
        structs,
    },
};
use futures::Stream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::{
    config::{self, Settings},
    devices::{self, Device},
    faults::{CRASH_EXIT, Fault, Faults},
};

/// The environment variable that makes the plugin say it is a driver (`driver`), for tests
/// of hosts that must refuse it.
pub const TYPE_VAR: &str = "BERTH_NOMAD_DEVICE_TYPE";

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// One device as `Fingerprint` sent it: the device, whether healthy, why not.
type Sent = (Device, bool, String);

/// The plugin's state, shared by its services.
#[derive(Debug)]
pub struct Plugin {
    kind: base::PluginType,
    settings: RwLock<Option<Arc<Settings>>>,
    /// The device list `Fingerprint` last sent (by any stream); `None` before the first.
    sent: RwLock<Option<Arc<Vec<Sent>>>>,
    /// Cancelled by `GRPCController.Shutdown` or a signal: streams end, the server stops.
    pub shutdown: CancellationToken,
}

impl Plugin {
    pub fn new(shutdown: CancellationToken) -> Arc<Self> {
        let kind = match std::env::var(TYPE_VAR).as_deref() {
            Ok("driver") => base::PluginType::Driver,
            Ok("device") | Err(_) => base::PluginType::Device,
            Ok(other) => {
                tracing::warn!(value = other, "unknown {TYPE_VAR}; answering device");
                base::PluginType::Device
            }
        };
        Arc::new(Self {
            kind,
            settings: RwLock::new(None),
            sent: RwLock::new(None),
            shutdown,
        })
    }

    fn settings(&self) -> Option<Arc<Settings>> {
        self.settings
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Reads the faults (the fault file of `settings`, or of the settings in force):
    /// `crash` exits at once; `hang` never answers (until shutdown, then `Unavailable`).
    async fn gate(&self, settings: Option<&Settings>) -> Result<Faults, Status> {
        let current = self.settings();
        let file = settings
            .or(current.as_deref())
            .and_then(|s| s.fault_file.as_deref());
        let faults = Faults::read(file);
        if faults.has(Fault::Crash) {
            tracing::error!("fault: crash");
            std::process::exit(CRASH_EXIT);
        }
        if faults.has(Fault::Hang) {
            tracing::warn!("fault: hang");
            self.shutdown.cancelled().await;
            return Err(Status::unavailable("shutting down"));
        }
        Ok(faults)
    }

    /// The settings, or `FailedPrecondition` before `SetConfig`.
    fn configured(&self) -> Result<Arc<Settings>, Status> {
        self.settings().ok_or_else(|| {
            Status::failed_precondition(
                "SetConfig has not been called: the plugin is not configured",
            )
        })
    }
}

/// The devices now, with their health under `faults`.
fn current(settings: &Settings, faults: &Faults) -> Result<Vec<Sent>, Status> {
    let listed = devices::list(&settings.dir)
        .map_err(|e| Status::internal(format!("cannot list {}: {e}", settings.dir.display())))?;
    Ok(listed
        .into_iter()
        .map(|d| {
            if faults.has(Fault::Unhealthy) {
                (d, false, "injected fault: unhealthy".to_string())
            } else if d.perm == settings.unhealthy_perm {
                let why = format!("Device has bad permissions {:?}", settings.unhealthy_perm);
                (d, false, why)
            } else {
                (d, true, String::new())
            }
        })
        .collect())
}

/// The message `Fingerprint` sends, and the devices it lists.
fn fingerprint(
    settings: &Settings,
    faults: &Faults,
) -> Result<(pb::FingerprintResponse, Vec<Sent>), Status> {
    let devices = current(settings, faults)?;
    let mut groups = Vec::new();
    if !devices.is_empty() {
        groups.push(pb::DeviceGroup {
            vendor: settings.vendor.clone(),
            device_type: settings.device_type.clone(),
            device_name: settings.name.clone(),
            devices: devices
                .iter()
                .map(|(d, healthy, why)| pb::DetectedDevice {
                    id: d.id.clone(),
                    healthy: *healthy,
                    health_description: why.clone(),
                    hw_locality: None,
                })
                .collect(),
            attributes: settings
                .attributes
                .iter()
                .map(|(k, a)| (k.clone(), attribute_to_proto(a)))
                .collect(),
        });
    }
    if faults.has(Fault::Invalid) {
        groups.push(pb::DeviceGroup {
            vendor: String::new(),
            device_type: settings.device_type.clone(),
            device_name: settings.name.clone(),
            devices: vec![pb::DetectedDevice {
                id: String::new(),
                healthy: true,
                health_description: String::new(),
                hw_locality: None,
            }],
            attributes: HashMap::new(),
        });
    }
    Ok((
        pb::FingerprintResponse {
            device_group: groups,
        },
        devices,
    ))
}

fn stats(settings: &Settings, faults: &Faults) -> Result<pb::StatsResponse, Status> {
    let devices = current(settings, faults)?;
    if devices.is_empty() {
        return Ok(pb::StatsResponse { groups: Vec::new() });
    }
    let now = prost_types::Timestamp::from(SystemTime::now());
    let size = |d: &Device| structs::StatValue {
        int_numerator_val: Some(i64::try_from(d.size).unwrap_or(i64::MAX)),
        unit: "bytes".into(),
        desc: "File size in bytes".into(),
        ..Default::default()
    };
    let instance_stats = devices
        .into_iter()
        .map(|(d, ..)| {
            let stats = pb::DeviceStats {
                summary: Some(size(&d)),
                stats: Some(structs::StatObject {
                    nested: HashMap::new(),
                    attributes: HashMap::from([
                        ("size".to_string(), size(&d)),
                        (
                            "mode".to_string(),
                            structs::StatValue {
                                string_val: Some(d.mode.clone()),
                                desc: "File mode".into(),
                                ..Default::default()
                            },
                        ),
                    ]),
                }),
                timestamp: Some(now),
            };
            (d.id, stats)
        })
        .collect();
    Ok(pb::StatsResponse {
        groups: vec![pb::DeviceGroupStats {
            vendor: settings.vendor.clone(),
            r#type: settings.device_type.clone(),
            name: settings.name.clone(),
            instance_stats,
        }],
    })
}

/// The name of the environment variable for device `id`: `BERTH_DEVICE_<ID>`, upper case,
/// anything but letters and digits as `_`.
fn env_name(id: &str) -> String {
    let id: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("BERTH_DEVICE_{id}")
}

/// The services over one [`Plugin`].
#[derive(Debug, Clone)]
pub struct Services(pub Arc<Plugin>);

#[tonic::async_trait]
impl BasePlugin for Services {
    async fn plugin_info(
        &self,
        _: Request<base::PluginInfoRequest>,
    ) -> Result<Response<base::PluginInfoResponse>, Status> {
        self.0.gate(None).await?;
        Ok(Response::new(base::PluginInfoResponse {
            r#type: self.0.kind as i32,
            plugin_api_versions: vec![DEVICE_API_VERSION.to_string()],
            plugin_version: env!("CARGO_PKG_VERSION").to_string(),
            name: "berth-nomad-device".to_string(),
        }))
    }

    async fn config_schema(
        &self,
        _: Request<base::ConfigSchemaRequest>,
    ) -> Result<Response<base::ConfigSchemaResponse>, Status> {
        self.0.gate(None).await?;
        Ok(Response::new(base::ConfigSchemaResponse {
            spec: Some(config::schema()),
        }))
    }

    async fn set_config(
        &self,
        request: Request<base::SetConfigRequest>,
    ) -> Result<Response<base::SetConfigResponse>, Status> {
        self.0.gate(None).await?;
        let request = request.into_inner();
        if request.plugin_api_version != DEVICE_API_VERSION {
            return Err(Status::invalid_argument(format!(
                "plugin_api_version {:?} is not supported; this plugin speaks {DEVICE_API_VERSION}",
                request.plugin_api_version
            )));
        }
        let settings = config::decode(&request.msgpack_config).map_err(|e| {
            tracing::warn!(error = %e, "SetConfig refused");
            Status::invalid_argument(e)
        })?;
        // A fault file named by the new configuration counts from now on.
        self.0.gate(Some(&settings)).await?;
        tracing::info!(?settings, "configured");
        *self.0.settings.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(settings));
        Ok(Response::new(base::SetConfigResponse {}))
    }
}

struct Follow {
    plugin: Arc<Plugin>,
    settings: Arc<Settings>,
    period: Duration,
    first: bool,
    done: bool,
    last: Option<pb::FingerprintResponse>,
}

impl Follow {
    /// Waits for the next round (none before the first); `false` at shutdown.
    async fn tick(&mut self) -> bool {
        if std::mem::take(&mut self.first) {
            return !self.plugin.shutdown.is_cancelled();
        }
        tokio::select! {
            () = tokio::time::sleep(self.period) => true,
            () = self.plugin.shutdown.cancelled() => false,
        }
    }
}

#[tonic::async_trait]
impl DevicePlugin for Services {
    type FingerprintStream = BoxStream<pb::FingerprintResponse>;
    type StatsStream = BoxStream<pb::StatsResponse>;

    async fn fingerprint(
        &self,
        _: Request<pb::FingerprintRequest>,
    ) -> Result<Response<Self::FingerprintStream>, Status> {
        self.0.gate(None).await?;
        let settings = self.0.configured()?;
        let state = Follow {
            plugin: Arc::clone(&self.0),
            period: settings.list_period,
            settings,
            first: true,
            done: false,
            last: None,
        };
        // The whole list at once, then again whenever it changes (checked every list period).
        let stream = futures::stream::unfold(state, |mut st| async move {
            if st.done {
                return None;
            }
            loop {
                if !st.tick().await {
                    return None;
                }
                let faults = match st.plugin.gate(Some(&st.settings)).await {
                    Ok(f) => f,
                    Err(_) => return None,
                };
                if faults.has(Fault::FingerprintError) {
                    st.done = true;
                    let status = Status::internal("injected fault: fingerprint-error");
                    return Some((Err(status), st));
                }
                let (msg, devices) = match fingerprint(&st.settings, &faults) {
                    Ok(found) => found,
                    Err(status) => {
                        st.done = true;
                        return Some((Err(status), st));
                    }
                };
                if st.last.as_ref() != Some(&msg) {
                    st.last = Some(msg.clone());
                    // What the host may name in Reserve from now on.
                    *st.plugin.sent.write().unwrap_or_else(|p| p.into_inner()) =
                        Some(Arc::new(devices));
                    return Some((Ok(msg), st));
                }
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn reserve(
        &self,
        request: Request<pb::ReserveRequest>,
    ) -> Result<Response<pb::ReserveResponse>, Status> {
        self.0.gate(None).await?;
        self.0.configured()?;
        let ids = request.into_inner().device_ids;
        if ids.is_empty() {
            return Err(Status::invalid_argument("no device ids given"));
        }
        // The host may only name what it was told: the list last sent, not a fresh listing.
        let Some(devices) = self
            .0
            .sent
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        else {
            return Err(Status::failed_precondition(
                "no device list was sent on Fingerprint yet: there is no device to reserve",
            ));
        };
        let mut res = pb::ContainerReservation::default();
        for (i, id) in ids.iter().enumerate() {
            if ids[..i].contains(id) {
                return Err(Status::invalid_argument(format!(
                    "device {id:?} is named twice"
                )));
            }
            let Some((d, healthy, why)) = devices.iter().find(|(d, ..)| &d.id == id) else {
                return Err(Status::not_found(format!(
                    "unknown device {id:?} (not in the list last sent on Fingerprint)"
                )));
            };
            if !healthy {
                return Err(Status::failed_precondition(format!(
                    "device {id:?} is unhealthy in the list last sent on Fingerprint: {why}"
                )));
            }
            let host = d.path.display().to_string();
            res.envs.insert(env_name(id), host.clone());
            res.mounts.push(pb::Mount {
                task_path: format!("/device/{id}"),
                host_path: host.clone(),
                read_only: true,
            });
            if d.node {
                res.devices.push(pb::DeviceSpec {
                    task_path: format!("/dev/{id}"),
                    host_path: host,
                    permissions: "rw".into(),
                });
            }
        }
        res.envs.insert("BERTH_DEVICE_IDS".into(), ids.join(","));
        Ok(Response::new(pb::ReserveResponse {
            container_res: Some(res),
        }))
    }

    async fn stats(
        &self,
        request: Request<pb::StatsRequest>,
    ) -> Result<Response<Self::StatsStream>, Status> {
        self.0.gate(None).await?;
        let settings = self.0.configured()?;
        // The host owes the interval it wants: Nomad's client always sends one.
        let interval = match request.into_inner().collection_interval {
            None => {
                return Err(Status::invalid_argument(
                    "collection_interval is missing: the host must say how often to collect",
                ));
            }
            Some(d) => Duration::try_from(d)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    Status::invalid_argument(format!("collection_interval {d} must be positive"))
                })?,
        };
        let state = Follow {
            plugin: Arc::clone(&self.0),
            period: interval,
            settings,
            first: true,
            done: false,
            last: None,
        };
        let stream = futures::stream::unfold(state, |mut st| async move {
            if st.done || !st.tick().await {
                return None;
            }
            let faults = st.plugin.gate(Some(&st.settings)).await.ok()?;
            let msg = stats(&st.settings, &faults);
            st.done = msg.is_err();
            Some((msg, st))
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

#[tonic::async_trait]
impl GrpcController for Services {
    async fn shutdown(
        &self,
        _: Request<controller::Empty>,
    ) -> Result<Response<controller::Empty>, Status> {
        self.0.gate(None).await?;
        tracing::info!("GRPCController.Shutdown: stopping");
        self.0.shutdown.cancel();
        Ok(Response::new(controller::Empty {}))
    }
}

#[tonic::async_trait]
impl Health for Services {
    async fn check(
        &self,
        request: Request<health::HealthCheckRequest>,
    ) -> Result<Response<health::HealthCheckResponse>, Status> {
        self.0.gate(None).await?;
        match request.into_inner().service.as_str() {
            "" | "plugin" => Ok(Response::new(health::HealthCheckResponse {
                status: ServingStatus::Serving as i32,
            })),
            other => Err(Status::not_found(format!("unknown service {other:?}"))),
        }
    }
}
