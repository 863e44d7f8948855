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
use berth_devices_nomad::{NomadPlugin, NomadPluginConfig};
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
}

/// The plugins and services checked by [`Devices::new`], for [`Devices::start`] to run.
#[derive(Debug)]
pub struct DevicePlugins {
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
    /// The agent's data dir (`<data_dir>/devices/` is the devices root, where the Nomad
    /// plugins' directories are: see [`berth_devices_nomad::layout`]).
    pub data_dir: PathBuf,
    /// Backoff of plugin restarts (Nomad plugins) and re-dials (Kubernetes plugins).
    pub restart: RestartPolicy,
    /// How long Kubernetes plugins that must register again (known from before a restart,
    /// or whose socket went) have before their devices are forgotten.
    pub kube_grace: Duration,
}

impl DevicesOptions {
    /// `<data_dir>/devices`: the root of the devices' files.
    fn devices_root(&self) -> PathBuf {
        self.data_dir.join("devices")
    }
}

impl Devices {
    /// Makes the device manager (with each plugin's last device list from the store) and
    /// checks everything [`start`](Self::start) runs, which it returns: each declared Nomad
    /// plugin (its binary in `plugin_dir`, its settings) and the Kubernetes registration
    /// service's directory. A problem stops the agent before anything runs.
    pub fn new(
        opts: &DevicesOptions,
        events: Arc<EventBus>,
        store: Arc<Store>,
    ) -> Result<(Self, DevicePlugins), AgentError> {
        let mut nomad = Vec::new();
        // The config refuses plugin blocks without plugin_dir.
        if let Some(plugin_dir) = &opts.config.plugin_dir {
            for decl in &opts.config.nomad_plugins {
                let command = binary(plugin_dir, decl)?;
                nomad.push(nomad_plugin(opts, decl, command, false)?);
            }
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
        Ok((Self { manager }, DevicePlugins { nomad, kube }))
    }

    /// The device manager.
    pub fn manager(&self) -> &Arc<DeviceManager> {
        &self.manager
    }

    /// Starts `plugins` (what [`new`](Self::new) returned): the declared Nomad plugins, every
    /// other executable in `plugin_dir` as a Nomad plugin
    /// [found there](NomadPluginConfig::found_in_plugin_dir) (one that is not a device plugin
    /// stops by itself, telling the manager nothing), and the Kubernetes registration service
    /// (restarted with backoff if it fails); every task stops with `shutdown`. Processes a
    /// killed agent left running for Nomad plugins neither configured nor in `plugin_dir` are
    /// stopped. A restored Nomad plugin no longer in the config or in `plugin_dir` is
    /// forgotten at once; a Kubernetes plugin that must register again, after
    /// [`DevicesOptions::kube_grace`] unless it did.
    pub fn start(
        &self,
        plugins: DevicePlugins,
        opts: &DevicesOptions,
        tasks: &TaskTracker,
        shutdown: &CancellationToken,
    ) {
        let sink: Arc<dyn PluginSink> = self.manager.clone();
        let mut known = BTreeSet::new();
        for plugin in plugins.nomad {
            known.insert(plugin.id().name.clone());
            tasks.spawn(plugin.run(Arc::clone(&sink), shutdown.clone()));
        }
        if let Some(plugin_dir) = &opts.config.plugin_dir {
            for (name, command) in undeclared_binaries(plugin_dir, &known) {
                let decl = NomadPluginDecl {
                    name: name.clone(),
                    args: Vec::new(),
                    config: serde_json::Value::Object(serde_json::Map::new()),
                };
                match nomad_plugin(opts, &decl, command, true) {
                    Ok(plugin) => {
                        known.insert(name);
                        tasks.spawn(plugin.run(Arc::clone(&sink), shutdown.clone()));
                    }
                    Err(e) => {
                        tracing::error!(plugin = %name, error = %e, "cannot run the plugin found in plugin_dir");
                    }
                }
            }
        }
        self.manager
            .forget_restored(|id| id.protocol != Protocol::Nomad || known.contains(&id.name));
        let root = opts.devices_root();
        let grace = opts.restart.stop_grace;
        tasks.spawn(async move { berth_devices_nomad::stop_leftovers(&root, &known, grace).await });
        match plugins.kube {
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

/// `<plugin_dir>/<name>`: it must be a file.
fn binary(plugin_dir: &Path, decl: &NomadPluginDecl) -> Result<PathBuf, AgentError> {
    let path = plugin_dir.join(&decl.name);
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

/// The Nomad plugin of `decl` run from `command`, in its directory under the devices root;
/// `found` when it was found in `plugin_dir` without a `plugin` block.
fn nomad_plugin(
    opts: &DevicesOptions,
    decl: &NomadPluginDecl,
    command: PathBuf,
    found: bool,
) -> Result<NomadPlugin, AgentError> {
    let mut cfg = NomadPluginConfig::new(
        decl.name.clone(),
        command,
        berth_devices_nomad::plugin_dir(&opts.devices_root(), &decl.name),
    );
    cfg.args.clone_from(&decl.args);
    cfg.config = decl.config.clone();
    cfg.stats_interval = opts.config.stats_interval;
    cfg.restart = opts.restart;
    cfg.found_in_plugin_dir = found;
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
        alloc_id: &'a str,
        _task: &'a str,
        assignments: &'a [DeviceAssignment],
    ) -> berth_allocrunner::BoxFuture<'a, Result<ContainerEdits, String>> {
        Box::pin(self.manager.reserve(alloc_id, assignments))
    }

    fn pre_start<'a>(
        &'a self,
        assignments: &'a [DeviceAssignment],
    ) -> berth_allocrunner::BoxFuture<'a, Result<Vec<String>, String>> {
        Box::pin(self.manager.pre_start(assignments))
    }

    fn restore(&self, alloc_id: &str, task: &str, assignments: &[DeviceAssignment]) {
        for conflict in self.manager.restore(alloc_id, assignments) {
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
