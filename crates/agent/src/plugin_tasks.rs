//! The plugin supervisor: a task with a `csi_plugin` block is a CSI plugin the agent runs,
//! registers and watches.
//!
//! Before each start of the task ([`PluginTaskHook`]'s prestart), its socket directory
//! `<data_dir>/csi/plugins/<instance>/` is made (a stale `csi.sock` removed) and its root
//! `<data_dir>/csi/<type>/<plugin id>/` is made a shared mount. A driver that bind-mounts
//! (`exec`) gets the socket directory at `mount_dir` and the root at `stage_publish_base_dir`
//! with bidirectional propagation (the plugin's mounts there show on the host); the task's
//! `CSI_ENDPOINT` is `unix://<mount_dir>/csi.sock`, and the volume manager sends the plugin
//! paths as it sees them. A driver without bind mounts (`raw_exec`) gets the host paths.
//!
//! After the start (and after an agent restart re-attached the process), a watcher probes the
//! socket until the plugin answers ready, within `health_timeout`: then the instance is
//! registered (source `task`) and its health transitions become task events. A plugin not
//! ready in time gets a `plugin_not_ready` event and its task is stopped, so the restart
//! policy starts it again. When the task stops or exits the instance is deregistered; the
//! volumes it mounted stay as they are.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use berth_allocrunner::{BoxFuture, EventKind, HookError, TaskContext, TaskHook};
use berth_api::{PluginType, Source};
use berth_csi::{CsiClient, Endpoint, Rpc};
use berth_drivers::{DriverManager, ExitResult, Propagation, Signal, TaskConfig, TaskHandle};
use berth_job::CsiPluginSpec;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::{
    events::EventBus,
    registry::{Registration, Registry},
};

/// The hook's name (persisted in the task's prestart and poststart progress).
pub const HOOK: &str = "csi_plugin_supervisor";

/// Deadline of one readiness probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// First and longest wait between readiness probes.
const FIRST_WAIT: Duration = Duration::from_millis(10);
const MAX_WAIT: Duration = Duration::from_millis(500);

/// What the agent gives every plugin task hook.
#[derive(Debug, Clone)]
pub struct PluginTasks {
    /// The plugin registry.
    pub registry: Arc<Registry>,
    /// The agent's events (health transitions are read from it).
    pub events: Arc<EventBus>,
    /// The task drivers (to know whether one bind-mounts, and to stop a plugin not ready).
    pub drivers: DriverManager,
    /// The agent's data dir.
    pub data_dir: PathBuf,
    /// Where background watchers run.
    pub tasks: TaskTracker,
    /// The agent's shutdown.
    pub shutdown: CancellationToken,
}

/// Where one plugin task's pieces are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginPlan {
    /// The registry instance: `<alloc id>.<task>`, or a hash of both when that would not fit.
    pub instance: String,
    /// `<data_dir>/csi/plugins/<instance>`.
    pub socket_dir: PathBuf,
    /// `<socket_dir>/csi.sock`, as the agent reaches it.
    pub socket: PathBuf,
    /// `<data_dir>/csi/<type>/<plugin id>`: where its volumes are staged and published.
    pub root: PathBuf,
}

impl PluginPlan {
    /// The plan of task `task` of alloc `alloc_id`. Fails (naming the path) when the socket
    /// path cannot fit the unix limit even with a short instance name.
    pub fn new(
        data_dir: &Path,
        alloc_id: &str,
        task: &str,
        spec: &CsiPluginSpec,
    ) -> Result<Self, String> {
        let plugins = data_dir.join("csi").join("plugins");
        let fits = |instance: &str| {
            berth_sys::validate_path_segment("instance", instance).is_ok()
                && Endpoint::from_path(plugins.join(instance).join("csi.sock")).is_ok()
        };
        let readable = format!("{alloc_id}.{task}");
        let instance = if fits(&readable) {
            readable
        } else {
            format!("task-{:016x}", fnv(&readable))
        };
        let socket_dir = plugins.join(&instance);
        let socket = socket_dir.join("csi.sock");
        Endpoint::from_path(&socket).map_err(|e| format!("{e}: use a shorter data_dir"))?;
        let dir = berth_volume::PluginDir::from(spec.plugin_type);
        let root = berth_volume::PluginPaths::new(data_dir, dir, &spec.id)
            .map_err(|e| format!("csi_plugin.id: {e}"))?
            .root()
            .to_path_buf();
        Ok(Self {
            instance,
            socket_dir,
            socket,
            root,
        })
    }
}

/// FNV-1a, for short stable names.
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The hook of one task with a `csi_plugin` block.
pub struct PluginTaskHook {
    deps: PluginTasks,
    spec: CsiPluginSpec,
    /// The running watcher, if any.
    watcher: Mutex<Option<CancellationToken>>,
}

impl std::fmt::Debug for PluginTaskHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginTaskHook")
            .field("plugin", &self.spec.id)
            .finish_non_exhaustive()
    }
}

impl PluginTaskHook {
    /// A hook for a task with `spec` as its `csi_plugin` block.
    pub fn new(deps: PluginTasks, spec: CsiPluginSpec) -> Self {
        Self {
            deps,
            spec,
            watcher: Mutex::new(None),
        }
    }

    fn plan(&self, ctx: &TaskContext) -> Result<PluginPlan, HookError> {
        PluginPlan::new(
            &self.deps.data_dir,
            &ctx.alloc_id,
            &ctx.task.name,
            &self.spec,
        )
        .map_err(HookError::new)
    }

    /// `mount_dir` and `stage_publish_base_dir` as the alloc's rendering left them.
    fn dirs(&self) -> Result<(PathBuf, PathBuf), HookError> {
        let literal = |t: &berth_job::Template, field: &str| {
            t.as_literal().map(PathBuf::from).ok_or_else(|| {
                HookError::new(format!(
                    "csi_plugin.{field} still holds a variable ({t}): the alloc was not rendered"
                ))
            })
        };
        Ok((
            literal(&self.spec.mount_dir, "mount_dir")?,
            literal(&self.spec.stage_publish_base_dir, "stage_publish_base_dir")?,
        ))
    }

    fn plugin_type(&self) -> PluginType {
        match self.spec.plugin_type {
            berth_job::CsiPluginType::Node => PluginType::Node,
            berth_job::CsiPluginType::Controller => PluginType::Controller,
            berth_job::CsiPluginType::Monolith => PluginType::Monolith,
        }
    }

    /// Whether the task's driver bind-mounts (then the plugin sees the task's paths).
    fn binds(&self, ctx: &TaskContext) -> bool {
        self.deps
            .drivers
            .driver(&ctx.task.driver)
            .is_some_and(|d| d.capabilities().bind_mounts)
    }

    /// Starts a watcher for the task's current process, replacing any earlier one.
    fn watch(&self, ctx: &TaskContext) {
        let plan = match self.plan(ctx) {
            Ok(p) => p,
            Err(e) => {
                ctx.events.emit(EventKind::HookFailed, e.message);
                return;
            }
        };
        let cancel = self.deps.shutdown.child_token();
        if let Some(old) = self
            .watcher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(cancel.clone())
        {
            old.cancel();
        }
        let watcher = Watcher {
            deps: self.deps.clone(),
            spec: self.spec.clone(),
            plugin_type: self.plugin_type(),
            plugin_view: self
                .binds(ctx)
                .then(|| self.dirs().map(|(_, stage)| stage).ok())
                .flatten(),
            ctx: ctx.clone(),
            plan,
        };
        self.deps.tasks.spawn(watcher.run(cancel));
    }

    /// Stops the watcher and deregisters the instance.
    async fn forget(&self, ctx: &TaskContext, reason: &str) {
        if let Some(w) = self
            .watcher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            w.cancel();
        }
        let Ok(plan) = self.plan(ctx) else { return };
        match self
            .deps
            .registry
            .deregister(&self.spec.id, &plan.instance, reason)
            .await
        {
            Ok(true) => ctx.events.emit(
                EventKind::PluginDeregistered,
                format!(
                    "plugin {} instance {} deregistered: {reason}",
                    self.spec.id, plan.instance
                ),
            ),
            Ok(false) => {}
            Err(e) => ctx.events.emit(
                EventKind::HookFailed,
                format!("deregistering plugin {}: {e}", self.spec.id),
            ),
        }
    }
}

impl TaskHook for PluginTaskHook {
    fn name(&self) -> &str {
        HOOK
    }

    fn prestart<'a>(
        &'a self,
        ctx: &'a TaskContext,
        config: &'a mut TaskConfig,
    ) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async move {
            let plan = self.plan(ctx)?;
            let io = |what: &str, path: &Path, e: &dyn std::fmt::Display| {
                HookError::new(format!("{what} {}: {e}", path.display()))
            };
            berth_sys::create_private_dir(&plan.socket_dir)
                .map_err(|e| io("creating the socket directory", &plan.socket_dir, &e))?;
            match std::fs::remove_file(&plan.socket) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("removing the old socket", &plan.socket, &e)),
            }
            berth_sys::create_private_dir(&plan.root)
                .map_err(|e| io("creating the plugin's root", &plan.root, &e))?;
            // A plugin mounts volumes and reaches devices: it runs as root (unless its task
            // names a user) and sees the host's /dev and /sys.
            config.privileged = true;
            config.user.get_or_insert_with(|| "root".into());
            let endpoint = if self.binds(ctx) {
                let (mount_dir, stage_dir) = self.dirs()?;
                berth_sys::ensure_shared_mount(&plan.root)
                    .map_err(|e| io("sharing the plugin's root", &plan.root, &e))?;
                config.mounts.push(berth_drivers::BindMount {
                    source: plan.socket_dir.clone(),
                    destination: mount_dir.clone(),
                    read_only: false,
                    propagation: Propagation::HostToTask,
                });
                config.mounts.push(berth_drivers::BindMount {
                    source: plan.root.clone(),
                    destination: stage_dir,
                    read_only: false,
                    propagation: Propagation::Bidirectional,
                });
                mount_dir.join("csi.sock")
            } else {
                plan.socket.clone()
            };
            config.env.insert(
                "CSI_ENDPOINT".into(),
                format!("unix://{}", endpoint.display()),
            );
            Ok(())
        })
    }

    fn poststart<'a>(
        &'a self,
        ctx: &'a TaskContext,
        _handle: &'a TaskHandle,
    ) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async move {
            self.watch(ctx);
            Ok(())
        })
    }

    fn recovered<'a>(&'a self, ctx: &'a TaskContext, _handle: &'a TaskHandle) -> BoxFuture<'a, ()> {
        Box::pin(async move { self.watch(ctx) })
    }

    fn exited<'a>(&'a self, ctx: &'a TaskContext, exit: &'a ExitResult) -> BoxFuture<'a, ()> {
        Box::pin(async move { self.forget(ctx, &format!("the task exited ({exit})")).await })
    }

    fn stop<'a>(&'a self, ctx: &'a TaskContext) -> BoxFuture<'a, ()> {
        Box::pin(async move { self.forget(ctx, "the task is stopping").await })
    }
}

/// Watches one process of a plugin task.
struct Watcher {
    deps: PluginTasks,
    spec: CsiPluginSpec,
    plugin_type: PluginType,
    plugin_view: Option<PathBuf>,
    ctx: TaskContext,
    plan: PluginPlan,
}

impl Watcher {
    async fn run(self, cancel: CancellationToken) {
        let Some(ready) = self.until_ready(&cancel).await else {
            return;
        };
        if let Err(reason) = ready {
            self.not_ready(&reason).await;
            return;
        }
        // Subscribe before registering: the first health transition follows the registration.
        let mut health = self.deps.events.subscribe();
        let reg = Registration {
            id: self.spec.id.clone(),
            instance: self.plan.instance.clone(),
            plugin_type: self.plugin_type,
            source: Source::Task,
            socket: self.plan.socket.clone(),
            plugin_view: self.plugin_view.clone(),
        };
        match self.deps.registry.register(reg).await {
            Ok(_) => self.ctx.events.emit(
                EventKind::PluginRegistered,
                format!(
                    "plugin {} ({}) ready; registered as instance {}",
                    self.spec.id,
                    self.plugin_type.as_str(),
                    self.plan.instance
                ),
            ),
            Err(e) => {
                self.ctx.events.emit(
                    EventKind::HookFailed,
                    format!("registering plugin {}: {e}", self.spec.id),
                );
                return;
            }
        }
        loop {
            let event = tokio::select! {
                biased;
                () = cancel.cancelled() => return,
                e = health.recv() => e,
            };
            let event = match event {
                Ok(e) => e,
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => return,
            };
            if event.plugin_id != self.spec.id
                || event.instance.as_deref() != Some(&self.plan.instance)
            {
                continue;
            }
            let kind = match event.kind {
                berth_api::EventKind::PluginHealthy => EventKind::PluginHealthy,
                berth_api::EventKind::PluginUnhealthy => EventKind::PluginUnhealthy,
                _ => continue,
            };
            self.ctx.events.emit(kind, event.reason);
        }
    }

    /// Probes until the plugin answers ready: `Some(Ok)`, `Some(Err(why))` when
    /// `health_timeout` passed first, `None` when cancelled.
    async fn until_ready(&self, cancel: &CancellationToken) -> Option<Result<(), String>> {
        let deadline = tokio::time::Instant::now() + self.spec.health_timeout;
        let mut wait = FIRST_WAIT;
        let mut client: Option<CsiClient> = None;
        loop {
            let why = if self.plan.socket.exists() {
                let c = match &client {
                    Some(c) => c,
                    None => match self.client() {
                        Ok(c) => client.insert(c),
                        Err(e) => return Some(Err(e)),
                    },
                };
                match c.probe().await {
                    Ok(true) => return Some(Ok(())),
                    Ok(false) => "it says it is not ready (Probe ready = false)".to_owned(),
                    Err(e) => e.to_string(),
                }
            } else {
                format!("no socket at {} yet", self.plan.socket.display())
            };
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Some(Err(why));
            }
            let pause = wait.min(deadline - now);
            tokio::select! {
                biased;
                () = cancel.cancelled() => return None,
                () = tokio::time::sleep(pause) => {}
            }
            wait = (wait * 2).min(MAX_WAIT);
        }
    }

    fn client(&self) -> Result<CsiClient, String> {
        let once = Rpc::Probe.policy().single_attempt(PROBE_TIMEOUT);
        let endpoint = Endpoint::from_path(&self.plan.socket).map_err(|e| e.to_string())?;
        Ok(CsiClient::builder(endpoint)
            .policy(Rpc::Probe, once)
            .cancellation(self.deps.shutdown.clone())
            .build())
    }

    /// The plugin missed its `health_timeout`: an event, then the task is stopped so that its
    /// restart policy decides what follows.
    async fn not_ready(&self, why: &str) {
        self.ctx.events.emit(
            EventKind::PluginNotReady,
            format!(
                "plugin {} not ready within {}: {why}; restarting the task",
                self.spec.id,
                berth_sys::short_duration(self.spec.health_timeout)
            ),
        );
        let Some(driver) = self.deps.drivers.driver(&self.ctx.task.driver) else {
            return;
        };
        if let Err(e) = driver
            .stop(
                &self.ctx.task_id,
                self.ctx.task.kill_timeout,
                Signal::SIGTERM,
            )
            .await
        {
            self.ctx.events.emit(
                EventKind::StopFailed,
                format!("stopping the plugin that was not ready: {e}"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> CsiPluginSpec {
        CsiPluginSpec {
            id: "hostpath".into(),
            plugin_type: berth_job::CsiPluginType::Monolith,
            mount_dir: berth_job::Template::literal("/csi"),
            stage_publish_base_dir: berth_job::Template::literal("/local/csi"),
            health_timeout: Duration::from_secs(30),
        }
    }

    #[test]
    fn plans_name_the_instance_after_alloc_and_task_while_the_socket_fits() {
        let p =
            PluginPlan::new(Path::new("/var/lib/berth"), "plug-0-ab12", "node", &spec()).unwrap();
        assert_eq!(p.instance, "plug-0-ab12.node");
        assert_eq!(
            p.socket,
            Path::new("/var/lib/berth/csi/plugins/plug-0-ab12.node/csi.sock")
        );
        assert_eq!(p.root, Path::new("/var/lib/berth/csi/monolith/hostpath"));

        // Too long for a socket path: a short stable name instead.
        let long = "a".repeat(90);
        let p = PluginPlan::new(Path::new("/var/lib/berth"), &long, "node", &spec()).unwrap();
        assert!(p.instance.starts_with("task-"), "{}", p.instance);
        assert_eq!(
            p,
            PluginPlan::new(Path::new("/var/lib/berth"), &long, "node", &spec()).unwrap()
        );
        assert!(p.socket.as_os_str().len() <= berth_csi::MAX_SOCKET_PATH);

        // A data dir so long that nothing fits: refused, naming the path.
        let deep = PathBuf::from(format!("/{}", "d".repeat(100)));
        let err = PluginPlan::new(&deep, "a", "node", &spec()).unwrap_err();
        assert!(
            err.contains(&deep.display().to_string()) && err.contains("must fit in 107 bytes"),
            "{err}"
        );
    }
}
