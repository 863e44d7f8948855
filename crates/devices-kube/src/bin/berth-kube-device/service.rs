//! The `DevicePlugin` service, strict about the caller's duties: every id `Allocate` and
//! `GetPreferredAllocation` name must be healthy in the list `ListAndWatch` last sent on this
//! registration (none sent yet: `FailedPrecondition`), every id `PreStartContainer` names
//! healthy now; every request must make sense, and the optional calls may only come when the
//! plugin asked for them.

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    pin::Pin,
    sync::Arc,
};

use berth_devices_kube::proto::{
    HEALTHY,
    v1beta1::{
        AllocateRequest, AllocateResponse, CdiDevice, ContainerAllocateResponse,
        ContainerPreferredAllocationResponse, Device, DevicePluginOptions, DeviceSpec, Empty,
        ListAndWatchResponse, Mount, PreStartContainerRequest, PreStartContainerResponse,
        PreferredAllocationRequest, PreferredAllocationResponse,
        device_plugin_server::DevicePlugin,
    },
};
use futures::Stream;
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::{
    calllog::CallLog,
    prefer::prefer,
    state::{Snapshot, State},
};

/// What the service gives out, from the flags.
#[derive(Debug, Clone)]
pub struct Settings {
    pub options: DevicePluginOptions,
    /// The part of the resource name after `/` (`widget`).
    pub kind: String,
    /// `--cdi`: the CDI kind (`vendor.com/class`) of the names Allocate answers with.
    pub cdi: Option<String>,
    /// `--device-node`: the host node given for each device.
    pub device_node: Option<PathBuf>,
    pub state_dir: PathBuf,
}

impl Settings {
    /// `WIDGET`: the env prefix.
    fn env_prefix(&self) -> String {
        upper(&self.kind)
    }

    /// `widgets`: the directory (in the state dir and in the task) of per-device mounts.
    fn mount_dir(&self) -> String {
        format!("{}s", self.kind)
    }
}

/// Every id known and healthy by `health` (`None`: unknown), none twice; `when` says which
/// list the ids were checked against.
fn check_ids(
    what: &str,
    ids: &[String],
    when: &str,
    health: impl Fn(&str) -> Option<bool>,
) -> Result<(), Status> {
    let mut seen = HashSet::new();
    for id in ids {
        match health(id) {
            None => {
                return Err(Status::invalid_argument(format!(
                    "{what}: device {id:?} is unknown to this plugin ({when})"
                )));
            }
            Some(false) => {
                return Err(Status::invalid_argument(format!(
                    "{what}: device {id:?} is unhealthy {when}"
                )));
            }
            Some(true) => {}
        }
        if !seen.insert(id) {
            return Err(Status::invalid_argument(format!(
                "{what}: device {id:?} is named twice"
            )));
        }
    }
    Ok(())
}

/// Upper-cased, every character other than a letter or a digit as `_`.
fn upper(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

#[derive(Debug, Clone)]
pub struct Service {
    pub settings: Arc<Settings>,
    pub state: Arc<State>,
    pub log: Arc<CallLog>,
    pub shutdown: CancellationToken,
}

type ListStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

impl Service {
    /// The latest snapshot, after waiting out a `hang` fault (until it is lifted or the plugin
    /// stops). Exits on `crash`.
    async fn begin(&self, call: &str) -> Result<Snapshot, Status> {
        let snap = self.state.refresh_faults();
        if !snap.faults.hang {
            return Ok(snap);
        }
        tracing::warn!(call, "fault hang: not answering");
        let mut rx = self.state.subscribe();
        tokio::select! {
            r = rx.wait_for(|s| !s.faults.hang) => {
                r.map_err(|_| Status::unavailable("the plugin is stopping"))?;
            }
            () = self.shutdown.cancelled() => return Err(Status::unavailable("the plugin is stopping")),
        }
        Ok(self.state.refresh_faults())
    }

    fn record(&self, mut entry: serde_json::Value, result: &Result<(), Status>) {
        if let Some(map) = entry.as_object_mut() {
            map.insert("ok".into(), json!(result.is_ok()));
            if let Err(s) = result {
                map.insert("error".into(), json!(s.message()));
            }
        }
        self.log.record(&entry);
    }

    /// Every id healthy in the current snapshot, none twice (`PreStartContainer`).
    fn check_current(snap: &Snapshot, what: &str, ids: &[String]) -> Result<(), Status> {
        check_ids(what, ids, "now", |id| snap.healthy(id))
    }

    /// Every id healthy in the list `ListAndWatch` last sent on this registration, none twice
    /// (`Allocate`, `GetPreferredAllocation`): the caller may only name what it was told.
    fn check_sent(&self, what: &str, ids: &[String]) -> Result<(), Status> {
        let Some(list) = self.state.last_sent() else {
            return Err(Status::failed_precondition(format!(
                "{what}: no device list was sent on ListAndWatch since this plugin registered: \
                 there is no device to name yet"
            )));
        };
        check_ids(what, ids, "in the list last sent on ListAndWatch", |id| {
            list.iter()
                .find(|d| d.id == id)
                .map(|d| d.health == HEALTHY)
        })
    }

    fn allocate_one(
        &self,
        snap: &Snapshot,
        i: usize,
        ids: &[String],
    ) -> Result<ContainerAllocateResponse, Status> {
        let what = format!("container_requests[{i}]");
        if ids.is_empty() {
            return Err(Status::invalid_argument(format!(
                "{what}: names no devices"
            )));
        }
        self.check_sent(&what, ids)?;
        let s = &self.settings;
        let prefix = s.env_prefix();
        let mut envs = HashMap::from([(format!("{prefix}_IDS"), ids.join(","))]);
        let mut mounts = Vec::new();
        let mut devices = Vec::new();
        let mut cdi_devices = Vec::new();
        for id in ids {
            envs.insert(format!("{prefix}_{}", upper(id)), "present".into());
            let host = s.state_dir.join(s.mount_dir()).join(id);
            std::fs::create_dir_all(&host)
                .map_err(|e| Status::internal(format!("cannot make {}: {e}", host.display())))?;
            let task = if snap.faults.bad_answer {
                format!("{}/{id}", s.mount_dir())
            } else {
                format!("/{}/{id}", s.mount_dir())
            };
            mounts.push(Mount {
                container_path: task,
                host_path: host.display().to_string(),
                read_only: true,
            });
            if let Some(kind) = &s.cdi {
                cdi_devices.push(CdiDevice {
                    name: format!("{kind}={id}"),
                });
            } else if let Some(node) = &s.device_node {
                devices.push(DeviceSpec {
                    container_path: format!("/dev/{id}"),
                    host_path: node.display().to_string(),
                    permissions: "rw".into(),
                });
            }
        }
        Ok(ContainerAllocateResponse {
            envs,
            mounts,
            devices,
            annotations: HashMap::new(),
            cdi_devices,
        })
    }
}

#[tonic::async_trait]
impl DevicePlugin for Service {
    async fn get_device_plugin_options(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        self.begin("GetDevicePluginOptions").await?;
        self.log.record(&json!({"call": "GetDevicePluginOptions"}));
        Ok(Response::new(self.settings.options))
    }

    type ListAndWatchStream = ListStream;

    async fn list_and_watch(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<ListStream>, Status> {
        self.begin("ListAndWatch").await?;
        self.log
            .record(&json!({"call": "ListAndWatch", "event": "start"}));
        let stream = Watch {
            rx: self.state.subscribe(),
            state: Arc::clone(&self.state),
            registration: self.state.registration(),
            last: None,
            shutdown: self.shutdown.clone(),
            log: Arc::clone(&self.log),
        };
        Ok(Response::new(Box::pin(futures::stream::unfold(
            stream,
            Watch::next,
        ))))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let snap = self.begin("GetPreferredAllocation").await?;
        let req = request.into_inner();
        let requests: Vec<serde_json::Value> = req
            .container_requests
            .iter()
            .map(|r| {
                json!({
                    "available": r.available_device_i_ds,
                    "must_include": r.must_include_device_i_ds,
                    "size": r.allocation_size,
                })
            })
            .collect();
        let answer = (|| {
            if !self.settings.options.get_preferred_allocation_available {
                return Err(Status::failed_precondition(
                    "GetPreferredAllocation called although this plugin does not offer it",
                ));
            }
            let mut responses = Vec::new();
            for (i, r) in req.container_requests.iter().enumerate() {
                let what = format!("container_requests[{i}]");
                let available = &r.available_device_i_ds;
                let must = &r.must_include_device_i_ds;
                self.check_sent(&format!("{what}.available_deviceIDs"), available)?;
                let size = usize::try_from(r.allocation_size)
                    .ok()
                    .filter(|s| *s > 0)
                    .ok_or_else(|| {
                        Status::invalid_argument(format!(
                            "{what}: allocation_size {} must be positive",
                            r.allocation_size
                        ))
                    })?;
                if size > available.len() {
                    return Err(Status::invalid_argument(format!(
                        "{what}: allocation_size {size} is more than the {} devices available",
                        available.len()
                    )));
                }
                if let Some(m) = must.iter().find(|m| !available.contains(m)) {
                    return Err(Status::invalid_argument(format!(
                        "{what}: must_include device {m:?} is not among those available"
                    )));
                }
                if must.len() > size {
                    return Err(Status::invalid_argument(format!(
                        "{what}: {} devices must be included in an allocation of {size}",
                        must.len()
                    )));
                }
                let mut ids = prefer(available, must, size, |id| snap.numa_of(id));
                if snap.faults.bad_answer {
                    ids.push("not-available".into());
                }
                responses.push(ContainerPreferredAllocationResponse { device_i_ds: ids });
            }
            Ok(responses)
        })();
        let mut entry = json!({"call": "GetPreferredAllocation", "requests": requests});
        if let Ok(responses) = &answer {
            let ids: Vec<&Vec<String>> = responses.iter().map(|r| &r.device_i_ds).collect();
            entry["answer"] = json!(ids);
        }
        self.record(entry, &answer.as_ref().map(|_| ()).map_err(Clone::clone));
        Ok(Response::new(PreferredAllocationResponse {
            container_responses: answer?,
        }))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let snap = self.begin("Allocate").await?;
        let req = request.into_inner();
        let containers: Vec<&Vec<String>> = req
            .container_requests
            .iter()
            .map(|r| &r.devices_ids)
            .collect();
        let answer: Result<Vec<ContainerAllocateResponse>, Status> = if containers.is_empty() {
            Err(Status::invalid_argument("no container requests"))
        } else {
            containers
                .iter()
                .enumerate()
                .map(|(i, ids)| self.allocate_one(&snap, i, ids))
                .collect()
        };
        self.record(
            json!({"call": "Allocate", "containers": containers}),
            &answer.as_ref().map(|_| ()).map_err(Clone::clone),
        );
        Ok(Response::new(AllocateResponse {
            container_responses: answer?,
        }))
    }

    async fn pre_start_container(
        &self,
        request: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        let snap = self.begin("PreStartContainer").await?;
        let req = request.into_inner();
        let result = if self.settings.options.pre_start_required {
            if req.devices_ids.is_empty() {
                Err(Status::invalid_argument("devices_ids: names no devices"))
            } else {
                Self::check_current(&snap, "devices_ids", &req.devices_ids)
            }
        } else {
            Err(Status::failed_precondition(
                "PreStartContainer called although this plugin did not ask for it",
            ))
        };
        self.record(
            json!({"call": "PreStartContainer", "devices": req.devices_ids}),
            &result,
        );
        result?;
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

/// One `ListAndWatch` stream: the full list at once, then on every change; nothing while
/// `hang` is on; ends at shutdown. What it sends is what calls on its registration are checked
/// against. Its end is recorded in the call log.
struct Watch {
    rx: watch::Receiver<Snapshot>,
    state: Arc<State>,
    /// The registration it was opened on.
    registration: u64,
    last: Option<Vec<Device>>,
    shutdown: CancellationToken,
    log: Arc<CallLog>,
}

impl Watch {
    async fn next(mut self) -> Option<(Result<ListAndWatchResponse, Status>, Self)> {
        loop {
            let (hang, list) = {
                let snap = self.rx.borrow_and_update();
                (snap.faults.hang, snap.reported())
            };
            if !hang && self.last.as_ref() != Some(&list) {
                self.state.record_sent(self.registration, &list);
                self.last = Some(list.clone());
                self.log.record(
                    &json!({"call": "ListAndWatch", "event": "send", "devices": list.len()}),
                );
                return Some((Ok(ListAndWatchResponse { devices: list }), self));
            }
            tokio::select! {
                () = self.shutdown.cancelled() => return None,
                r = self.rx.changed() => if r.is_err() { return None },
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.log
            .record(&json!({"call": "ListAndWatch", "event": "end"}));
    }
}
