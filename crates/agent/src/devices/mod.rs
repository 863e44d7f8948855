//! The agent's devices: the device manager, the Nomad device plugins it launches (declared in
//! the config, or found in `plugin_dir`), the Kubernetes device-plugin registration service,
//! the store that keeps each plugin's last device list, and the device side the alloc runners
//! use.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

pub mod metrics;

use berth_allocrunner::DeviceHost;
use berth_devices::{
    assignment::DeviceAssignment,
    manager::{DeviceManager, DeviceObserver, DeviceRecords, ManagerConfig},
    model::{ContainerEdits, DeviceGroup},
    plugin::{PluginId, PluginSink, Protocol},
    view::DeviceEvent,
};
use berth_devices_kube::{KubeConfig, KubeDevices};
use berth_devices_nomad::{NomadPlugin, NomadPluginConfig, PluginKind};
use berth_state::{Store, Table};
use berth_sys::slot::RestartPolicy;
use serde::{Deserialize, Serialize};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::{
    agent::AgentError,
    config::{DevicesConfig, NomadPluginDecl},
    events::EventBus,
};

/// How long a Kubernetes plugin known from before a restart has to register again before its
/// devices are forgotten (kubelet's grace for a stopped endpoint).
pub const KUBE_RESTORE_GRACE: Duration = Duration::from_secs(5 * 60);

/// Where device events go: the agent's event bus.
#[derive(Debug)]
struct BusObserver(Arc<EventBus>);

impl DeviceObserver for BusObserver {
    fn on_event(&self, event: DeviceEvent) {
        self.0.emit_device(event);
    }
}

/// A plugin's last device list, as stored (`Table::DEVICES`).
#[derive(Debug, Serialize, Deserialize)]
struct StoredDevices {
    plugin: PluginId,
    groups: Vec<DeviceGroup>,
}

/// Each plugin's last device list in the agent's store.
#[derive(Debug)]
struct StoreRecords(Arc<Store>);

impl DeviceRecords for StoreRecords {
    fn load(&self) -> Vec<(PluginId, Vec<DeviceGroup>)> {
        match self.0.list::<StoredDevices>(Table::DEVICES) {
            Ok(list) => list
                .into_iter()
                .map(|(_, s)| (s.plugin, s.groups))
                .collect(),
            Err(e) => {
                tracing::error!(error = %e, "cannot read the stored device lists");
                Vec::new()
            }
        }
    }

    fn save(&self, plugin: &PluginId, groups: &[DeviceGroup]) {
        let record = StoredDevices {
            plugin: plugin.clone(),
            groups: groups.to_vec(),
        };
        if let Err(e) = self.0.put(Table::DEVICES, &plugin.to_string(), &record) {
            tracing::error!(%plugin, error = %e, "cannot store the device list");
        }
    }

    fn remove(&self, plugin: &PluginId) {
        if let Err(e) = self.0.delete(Table::DEVICES, &plugin.to_string()) {
            tracing::error!(%plugin, error = %e, "cannot forget the device list");
        }
    }
}

/// The agent's device side.
#[derive(Debug)]
pub struct Devices {
    manager: Arc<DeviceManager>,
    /// What [`start`](Self::start) runs, checked by [`new`](Self::new).
    prepared: std::sync::Mutex<Option<Prepared>>,
}

/// The plugins and services checked at [`Devices::new`], run by [`Devices::start`].
#[derive(Debug)]
struct Prepared {
    /// The declared Nomad plugins.
    nomad: Vec<NomadPlugin>,
    /// The Kubernetes registration service's config, when enabled.
    kube: Option<KubeConfig>,
}

/// What starting the device side needs.
#[derive(Debug, Clone)]
pub struct DevicesOptions {
    /// The device settings of the config.
    pub config: DevicesConfig,
    /// The agent's data dir (`<data_dir>/devices/` holds the Nomad plugins' directories).
    pub data_dir: PathBuf,
    /// Backoff of plugin restarts (Nomad plugins) and re-dials (Kubernetes plugins).
    pub restart: RestartPolicy,
    /// How long Kubernetes plugins that must register again (known from before a restart,
    /// or whose socket went) have before their devices are forgotten.
    pub kube_grace: Duration,
}

impl Devices {
    /// Makes the device manager (with each plugin's last device list from the store) and
    /// checks everything [`start`](Self::start) runs: each declared Nomad plugin (its binary
    /// in `plugin_dir`, its settings) and the Kubernetes registration service's directory. A
    /// problem stops the agent before anything runs.
    pub fn new(
        opts: &DevicesOptions,
        events: Arc<EventBus>,
        store: Arc<Store>,
    ) -> Result<Self, AgentError> {
        let mut nomad = Vec::new();
        for decl in &opts.config.nomad_plugins {
            let command = binary(&opts.config, decl)?;
            nomad.push(nomad_plugin(opts, decl, command)?);
        }
        let kube = if opts.config.kubernetes {
            let mut kube = KubeConfig::new(opts.config.kubelet_dir(&opts.data_dir));
            kube.restart = opts.restart;
            // Checks the config (timings, the socket path's length) and touches nothing.
            KubeDevices::new(kube.clone()).map_err(|e| AgentError::Devices(e.to_string()))?;
            Some(kube)
        } else {
            None
        };
        let manager = Arc::new(DeviceManager::new(
            ManagerConfig {
                cdi_dirs: opts.config.cdi_spec_dirs.clone(),
            },
            Arc::new(BusObserver(events)),
            Arc::new(StoreRecords(store)),
        ));
        Ok(Self {
            manager,
            prepared: std::sync::Mutex::new(Some(Prepared { nomad, kube })),
        })
    }

    /// The device manager.
    pub fn manager(&self) -> &Arc<DeviceManager> {
        &self.manager
    }

    /// Starts (once) the declared Nomad plugins, the other device plugins found in
    /// `plugin_dir`, and the Kubernetes registration service (restarted with backoff if it
    /// fails); every task stops with `shutdown`. Processes left running by a killed agent for
    /// Nomad plugins that are no longer configured are stopped. A restored Nomad plugin no
    /// longer in the config or in `plugin_dir` is forgotten at once; a Kubernetes plugin that
    /// must register again, after [`DevicesOptions::kube_grace`] unless it did.
    pub fn start(&self, opts: &DevicesOptions, tasks: &TaskTracker, shutdown: &CancellationToken) {
        let Some(prepared) = self
            .prepared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return;
        };
        let cfg = &opts.config;
        let sink: Arc<dyn PluginSink> = self.manager.clone();
        let mut launched = BTreeSet::new();
        for plugin in prepared.nomad {
            launched.insert(plugin.id().name.clone());
            tasks.spawn(plugin.run(Arc::clone(&sink), shutdown.clone()));
        }
        let others = cfg
            .plugin_dir
            .as_deref()
            .map(|dir| undeclared_binaries(dir, &launched))
            .unwrap_or_default();
        let known: BTreeSet<String> = launched
            .iter()
            .cloned()
            .chain(others.iter().map(|(name, _)| name.clone()))
            .collect();
        self.manager
            .forget_restored(|id| id.protocol != Protocol::Nomad || known.contains(&id.name));
        tasks.spawn(stop_leftovers(
            opts.data_dir.clone(),
            known,
            opts.restart.stop_grace,
        ));
        if !others.is_empty() {
            let opts = opts.clone();
            let sink = Arc::clone(&sink);
            let shutdown_inner = shutdown.clone();
            let inner_tasks = tasks.clone();
            tasks.spawn(async move {
                for (name, command) in others {
                    run_if_device_plugin(
                        &opts,
                        name,
                        command,
                        &sink,
                        &inner_tasks,
                        &shutdown_inner,
                    )
                    .await;
                }
            });
        }
        match prepared.kube {
            Some(kube) => {
                tasks.spawn(serve_registration(
                    kube,
                    Arc::clone(&sink),
                    opts.restart,
                    shutdown.clone(),
                ));
                let manager = Arc::clone(&self.manager);
                let grace = opts.kube_grace;
                let token = shutdown.clone();
                // Checked a few times per grace period, so a plugin goes at most a tenth of
                // it late.
                let every = (grace / 10).max(Duration::from_millis(100));
                tasks.spawn(async move {
                    loop {
                        tokio::select! {
                            () = tokio::time::sleep(every) => manager.expire_unregistered(grace),
                            () = token.cancelled() => return,
                        }
                    }
                });
            }
            None => self
                .manager
                .forget_restored(|id| id.protocol != Protocol::Kubernetes),
        }
    }
}

/// Serves kubelet's registration service until `shutdown`; when it fails (its socket taken,
/// its directory replaced), says why and starts it again after the restart policy's backoff.
async fn serve_registration(
    kube: KubeConfig,
    sink: Arc<dyn PluginSink>,
    policy: RestartPolicy,
    shutdown: CancellationToken,
) {
    let mut wait: Option<Duration> = None;
    loop {
        let started = tokio::time::Instant::now();
        let result = match KubeDevices::new(kube.clone()) {
            Ok(server) => server.run(Arc::clone(&sink), shutdown.clone()).await,
            Err(e) => Err(e),
        };
        if shutdown.is_cancelled() {
            return;
        }
        let next = policy.next_wait(wait, started.elapsed());
        wait = Some(next);
        match result {
            Ok(()) => tracing::warn!(
                retry_in = %berth_sys::short_duration(next),
                "the Kubernetes device plugin registration service stopped; starting it again"
            ),
            Err(e) => tracing::error!(
                error = %e,
                retry_in = %berth_sys::short_duration(next),
                "the Kubernetes device plugin registration service failed; starting it again"
            ),
        }
        tokio::select! {
            () = tokio::time::sleep(next) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// Stops what a killed agent left running in the slots of Nomad plugins not run now (no
/// longer configured or in `plugin_dir`), and of probes of binaries no longer there.
async fn stop_leftovers(data_dir: PathBuf, known: BTreeSet<String>, grace: Duration) {
    for (kind, log) in [
        ("nomad", berth_devices_nomad::instance::LOG_FILE),
        ("inspect", berth_devices_nomad::inspect::INSPECT_LOG),
    ] {
        let Ok(entries) = std::fs::read_dir(data_dir.join("devices").join(kind)) else {
            continue;
        };
        for e in entries.flatten() {
            let Some(name) = e.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if known.contains(&name) || !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let id = if kind == "nomad" {
                PluginId::nomad(name.clone()).to_string()
            } else {
                format!("nomad-inspect:{name}")
            };
            let mut slot = berth_sys::slot::PluginSlot::new(&id, &e.path().join(log));
            match slot.claim(grace).await {
                Ok(()) => {
                    let stuck = slot.release(grace).await;
                    if !stuck.is_empty() {
                        tracing::error!(plugin = %name, pids = ?stuck, "processes of a plugin no longer run survive SIGKILL");
                    }
                }
                Err(e) => {
                    tracing::warn!(plugin = %name, error = %e, "cannot stop what is left of a plugin no longer run")
                }
            }
        }
    }
}

/// `<plugin_dir>/<name>`: it must be a file.
fn binary(cfg: &DevicesConfig, decl: &NomadPluginDecl) -> Result<PathBuf, AgentError> {
    let dir = cfg.plugin_dir.as_deref().ok_or_else(|| {
        AgentError::Devices(format!(
            "plugin {:?}: a plugin without type is a Nomad device plugin: set plugin_dir",
            decl.name
        ))
    })?;
    let path = dir.join(&decl.name);
    match std::fs::metadata(&path) {
        Ok(m) if m.is_file() => Ok(path),
        Ok(_) => Err(AgentError::Devices(format!(
            "plugin {:?}: {} is not a file",
            decl.name,
            path.display()
        ))),
        Err(e) => Err(AgentError::Devices(format!(
            "plugin {:?}: no plugin binary {} in plugin_dir: {e}",
            decl.name,
            path.display()
        ))),
    }
}

/// The private directory of Nomad plugin `name`.
fn plugin_dir_of(data_dir: &Path, name: &str) -> PathBuf {
    data_dir.join("devices").join("nomad").join(name)
}

fn nomad_plugin(
    opts: &DevicesOptions,
    decl: &NomadPluginDecl,
    command: PathBuf,
) -> Result<NomadPlugin, AgentError> {
    let mut cfg = NomadPluginConfig::new(
        decl.name.clone(),
        command,
        plugin_dir_of(&opts.data_dir, &decl.name),
    );
    cfg.args.clone_from(&decl.args);
    cfg.config = decl.config.clone();
    cfg.stats_interval = opts.config.stats_interval;
    cfg.restart = opts.restart;
    NomadPlugin::new(cfg).map_err(|e| AgentError::Devices(e.to_string()))
}

/// Executable files in `dir` without a `plugin` block (Nomad runs every plugin in its
/// `plugin_dir`), by name.
fn undeclared_binaries(dir: &Path, declared: &BTreeSet<String>) -> Vec<(String, PathBuf)> {
    use std::os::unix::fs::PermissionsExt as _;
    let Ok(entries) = std::fs::read_dir(dir) else {
        tracing::warn!(dir = %dir.display(), "plugin_dir cannot be read");
        return Vec::new();
    };
    let mut out: Vec<(String, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            let meta = std::fs::metadata(e.path()).ok()?;
            (meta.is_file()
                && meta.permissions().mode() & 0o111 != 0
                && !declared.contains(&name)
                && berth_sys::validate_path_segment("plugin name", &name).is_ok())
            .then(|| (name, e.path()))
        })
        .collect();
    out.sort();
    out
}

/// Asks `command` what it is; runs it with an empty config when it is a device plugin.
async fn run_if_device_plugin(
    opts: &DevicesOptions,
    name: String,
    command: PathBuf,
    sink: &Arc<dyn PluginSink>,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) {
    let probe_dir = opts.data_dir.join("devices").join("inspect").join(&name);
    let info = tokio::select! {
        r = berth_devices_nomad::inspect(&command, &[], &probe_dir) => r,
        () = shutdown.cancelled() => return,
    };
    match info {
        Ok(info) if info.kind == PluginKind::Device => {
            let decl = NomadPluginDecl {
                name: name.clone(),
                args: Vec::new(),
                config: serde_json::Value::Object(serde_json::Map::new()),
            };
            match nomad_plugin(opts, &decl, command) {
                Ok(plugin) => {
                    tracing::info!(plugin = %name, "device plugin found in plugin_dir");
                    tasks.spawn(plugin.run(Arc::clone(sink), shutdown.clone()));
                }
                Err(e) => {
                    tracing::error!(plugin = %name, error = %e, "cannot run the device plugin")
                }
            }
        }
        Ok(info) => {
            tracing::info!(plugin = %name, kind = ?info.kind, "plugin_dir holds a plugin that is not a device plugin: berth runs device plugins only")
        }
        Err(e) => {
            tracing::warn!(plugin = %name, error = %e, "plugin_dir holds a file that is not a Nomad plugin")
        }
    }
}

/// The device side as alloc runners see it.
#[derive(Debug)]
pub struct AgentDeviceHost {
    manager: Arc<DeviceManager>,
}

impl AgentDeviceHost {
    /// Over `manager`.
    pub fn new(manager: Arc<DeviceManager>) -> Self {
        Self { manager }
    }
}

impl DeviceHost for AgentDeviceHost {
    fn reserve<'a>(
        &'a self,
        _alloc_id: &'a str,
        _task: &'a str,
        assignments: &'a [DeviceAssignment],
    ) -> berth_allocrunner::BoxFuture<'a, Result<ContainerEdits, String>> {
        Box::pin(self.manager.reserve(assignments))
    }

    fn pre_start<'a>(
        &'a self,
        assignments: &'a [DeviceAssignment],
    ) -> berth_allocrunner::BoxFuture<'a, Result<Vec<String>, String>> {
        Box::pin(self.manager.pre_start(assignments))
    }

    fn restore(&self, alloc_id: &str, task: &str, assignments: &[DeviceAssignment]) {
        for conflict in self.manager.restore(alloc_id, task, assignments) {
            tracing::error!(
                alloc_id,
                task,
                conflict,
                "a restored device reservation conflicts"
            );
        }
    }

    fn release(&self, alloc_id: &str) {
        self.manager.release(alloc_id);
    }
}
