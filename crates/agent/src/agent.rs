//! Wires the agent together: data dir, store, registry, health loops, declared plugins, the
//! registration directory and the API; and shuts it all down in order.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use berth_allocrunner::NodeVars;
use berth_api::{
    Instance, NodePlugin, NodeStatus, PluginStatus, RegisterRequest, Source,
    server::{AgentView, ApiError},
    stream::Topic,
};
use berth_regdir::{DiscoveredPlugin, RegistrationDir};
use berth_state::{Store, Table};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::{
    config::{
        Config, DEFAULT_RESCAN_INTERVAL, DevicesConfig, HealthConfig, NodeConfig, PluginDecl,
        PluginRun,
    },
    devices::{Devices, DevicesOptions, KUBE_RESTORE_GRACE},
    event_log::EventLog,
    events::EventBus,
    jobs::Jobs,
    manager::Manager,
    metrics::Metrics,
    registry::{Registration, Registry, RegistryError},
    supervisor::{RestartPolicy, Supervisor},
    volumes::Volumes,
    watch::SocketWatcher,
};

/// Everything the agent needs to start; built from the config file and flags.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// The data dir (created 0700 if missing).
    pub data_dir: PathBuf,
    /// API socket; default `<data_dir>/berth.sock`.
    pub api_socket: Option<PathBuf>,
    /// Extra TCP listener (loopback, or any address with `api_tls` and `acl`).
    pub api_address: Option<SocketAddr>,
    /// HTTPS on the TCP listener.
    pub api_tls: Option<crate::config::ApiTls>,
    /// The group that may open the API socket (mode 0660).
    pub api_socket_group: Option<crate::config::SocketGroup>,
    /// Whether API requests need an ACL token.
    pub acl: bool,
    /// Registration dir; default `<data_dir>/plugins_registry`.
    pub registry_dir: Option<PathBuf>,
    /// Registration dir rescan interval.
    pub rescan_interval: Duration,
    /// Health checking.
    pub health: HealthConfig,
    /// Declared plugins.
    pub plugins: Vec<PluginDecl>,
    /// Restart policy of plugins the agent runs.
    pub restart: RestartPolicy,
    /// `PATH` of tasks whose `env` sets none; `None`: the agent's own.
    pub task_path: Option<String>,
    /// The node as jobs see it.
    pub node: NodeConfig,
    /// What `exec` tasks' roots hold (host path → path in the task); `None`: Nomad's defaults.
    pub chroot_env: Option<BTreeMap<PathBuf, PathBuf>>,
    /// Device plugins and device settings.
    pub devices: DevicesConfig,
    /// A fleet on etcd; `None`: the embedded control plane.
    pub etcd: Option<berth_fleet::EtcdSettings>,
    /// Where Consul is, for the tokens of services with a workload identity.
    pub consul: berth_consul::ConsulConfig,
    /// When the workload identity signing key is replaced.
    pub identity_rotation: berth_identity::Rotation,
    /// The `docker` driver's settings.
    pub docker: berth_drivers::DockerConfig,
    /// How many events the event stream's window keeps.
    pub event_window: usize,
}

impl AgentOptions {
    /// Options from a config with `data_dir` settled.
    pub fn from_config(config: Config, data_dir: PathBuf) -> Self {
        Self {
            data_dir,
            api_socket: config.api_socket,
            api_address: config.api_address,
            api_tls: config.api_tls,
            api_socket_group: config.api_socket_group,
            acl: config.acl_enabled,
            registry_dir: config.registry_dir,
            rescan_interval: config.rescan_interval.unwrap_or(DEFAULT_RESCAN_INTERVAL),
            health: config.health,
            plugins: config.plugins,
            restart: RestartPolicy::default(),
            task_path: None,
            node: config.node,
            chroot_env: config.chroot_env,
            devices: config.devices,
            etcd: config.etcd,
            consul: config.consul,
            identity_rotation: berth_identity::Rotation::default(),
            docker: config.docker,
            event_window: config
                .event_window
                .unwrap_or(crate::event_log::DEFAULT_WINDOW),
        }
    }

    /// The API socket path.
    pub fn api_socket(&self) -> PathBuf {
        self.api_socket
            .clone()
            .unwrap_or_else(|| self.data_dir.join(berth_api::SOCKET_NAME))
    }

    /// The socket of a plugin the agent runs: `<data_dir>/csi/plugins/<id>/csi.sock`.
    pub fn managed_socket(&self, id: &str) -> PathBuf {
        self.data_dir
            .join("csi")
            .join("plugins")
            .join(id)
            .join("csi.sock")
    }
}

/// Why the agent could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The data dir cannot be made.
    #[error("data dir {path}: {source}")]
    DataDir {
        /// The dir.
        path: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The store cannot be opened.
    #[error(transparent)]
    State(#[from] berth_state::StateError),
    /// The registry refused a declared plugin.
    #[error("plugin {id:?} from the config: {source}")]
    Declared {
        /// The plugin.
        id: String,
        /// Why.
        #[source]
        source: RegistryError,
    },
    /// The registry cannot be loaded.
    #[error("plugin registry: {0}")]
    Registry(#[from] RegistryError),
    /// The API cannot listen.
    #[error(transparent)]
    Listen(#[from] berth_api::server::ServeError),
    /// The API's TLS files cannot be used.
    #[error("api.tls.{}", .0)]
    ApiTls(#[from] berth_api::server::TlsError),
    /// A TCP address beyond loopback without ACLs (the config refuses it too).
    #[error(
        "api.address: {0} is not a loopback address: serving the API beyond this host needs ACLs on"
    )]
    OpenWithoutAcl(SocketAddr),
    /// A blocking task failed.
    #[error("internal task failed: {0}")]
    Task(String),
    /// The fleet's etcd cannot be reached.
    #[error("control plane: {0}")]
    Fleet(#[from] berth_fleet::FleetError),
    /// The device settings or a device plugin cannot be used.
    #[error("devices: {0}")]
    Devices(String),
    /// The workload identity keys cannot be loaded or made.
    #[error("workload identity keys: {0}")]
    Identity(#[from] berth_identity::IdentityError),
    /// The `consul` settings cannot be used.
    #[error("consul: {0}")]
    Consul(#[from] berth_consul::ConsulError),
    /// A `chroot_env` entry would show tasks the agent's data dir.
    #[error(
        "client.chroot_env: {} would show tasks the data dir {}; list directories that neither hold it nor lie in it",
        source_dir.display(),
        data_dir.display()
    )]
    ChrootEnv {
        /// The entry's host path.
        source_dir: PathBuf,
        /// The data dir.
        data_dir: PathBuf,
    },
}

/// Refuses a `chroot_env` whose host paths hold the data dir or lie in it (symlinks resolved),
/// so no task can read `state.redb`, other allocs' directories or volumes.
fn check_chroot_env(env: &BTreeMap<PathBuf, PathBuf>, data_dir: &Path) -> Result<(), AgentError> {
    let data = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    for source in env.keys() {
        let Ok(real) = std::fs::canonicalize(source) else {
            // Missing entries are skipped by the driver.
            continue;
        };
        if data.starts_with(&real) || real.starts_with(&data) {
            return Err(AgentError::ChrootEnv {
                source_dir: source.clone(),
                data_dir: data_dir.to_path_buf(),
            });
        }
    }
    Ok(())
}

/// The running agent's shared state: what the API shows.
#[derive(Debug)]
pub struct Agent {
    node_id: String,
    hostname: String,
    registry: Arc<Registry>,
    manager: Arc<Manager>,
    events: Arc<EventBus>,
    metrics: Arc<Metrics>,
    volumes: Arc<Volumes>,
    jobs: Arc<Jobs>,
    devices: Arc<Devices>,
    /// This node's membership of a fleet (`None`: the embedded control plane).
    fleet: Option<Arc<berth_fleet::Membership>>,
    /// The fleet's jobs on this node.
    fleet_jobs: Option<Arc<crate::fleet_jobs::FleetJobs>>,
    /// The fleet's leader election.
    election: Option<Arc<berth_fleet::Election>>,
    /// Signs workload identities; its public keys are the API's JWKS.
    signer: berth_identity::Signer,
    /// The API's ACL tokens, when ACLs are on.
    acl: Option<Arc<crate::acl::AclTokens>>,
}

/// A started agent: its shared state, and the handle that runs it to the end.
#[derive(Debug)]
pub struct Running {
    /// The shared state.
    pub agent: Arc<Agent>,
    /// Where the API listens.
    pub api_socket: PathBuf,
    tasks: TaskTracker,
}

impl Running {
    /// Waits until every part has stopped (after the shutdown token is cancelled).
    pub async fn wait(self) {
        self.tasks.close();
        self.tasks.wait().await;
    }
}

impl Agent {
    /// Starts the agent: by the time this returns the registry is loaded from the store, the
    /// drivers have fingerprinted once and the API is listening, so the first API answer
    /// already lists every persisted plugin and the node's driver attributes. Every
    /// part stops when `shutdown` is cancelled; [`Running::wait`] waits for that.
    pub async fn start(
        opts: AgentOptions,
        shutdown: CancellationToken,
    ) -> Result<Running, AgentError> {
        let data_dir = opts.data_dir.clone();
        let dir_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| AgentError::DataDir { path, source }
        };
        berth_sys::create_private_dir(&data_dir).map_err(dir_err(&data_dir))?;
        let plugins_dir = data_dir.join("csi").join("plugins");
        berth_sys::create_private_dir(&plugins_dir).map_err(dir_err(&plugins_dir))?;

        let store_path = data_dir.join("state.redb");
        let commit_hook = crate::volumes::CrashHook::from_env().and_then(|h| h.commit_hook());
        let store =
            tokio::task::spawn_blocking(move || Store::open_with_hook(store_path, commit_hook))
                .await
                .map_err(|e| AgentError::Task(e.to_string()))??;
        let store = Arc::new(store);
        let node_id = node_id(&store)?;
        let signer = {
            let store = Arc::clone(&store);
            let rotation = opts.identity_rotation;
            tokio::task::spawn_blocking(move || crate::identity::open_signer(store, rotation))
                .await
                .map_err(|e| AgentError::Task(e.to_string()))??
        };
        let consul = Arc::new(crate::consul::ConsulTokens::new(
            berth_consul::Client::new(&opts.consul)?,
            signer.clone(),
            Arc::clone(&store),
            &node_id,
            &opts.node.region,
        ));
        let hostname = berth_sys::hostname().unwrap_or_else(|_| "localhost".into());
        let chroot_env = opts
            .chroot_env
            .clone()
            .unwrap_or_else(|| berth_drivers::ExecConfig::default().chroot_env);
        check_chroot_env(&chroot_env, &data_dir)?;
        let node = NodeVars {
            id: node_id.clone(),
            name: opts.node.name.clone().unwrap_or_else(|| hostname.clone()),
            datacenter: opts.node.datacenter.clone(),
            region: opts.node.region.clone(),
            class: opts.node.node_class.clone(),
            attrs: {
                let mut a = crate::node_attrs::host_attributes(&hostname);
                if let Some(mhz) = opts.node.cpu_total_compute {
                    a.insert("cpu.totalcompute".into(), mhz.to_string());
                }
                if let Some(mb) = opts.node.memory_total_mb {
                    a.insert("memory.totalbytes".into(), (mb * 1024 * 1024).to_string());
                }
                a
            },
            meta: opts.node.meta.clone(),
        };
        let node_name = node.name.clone();

        let (event_log, event_writer) = {
            let path = data_dir.join("events.redb");
            let window = opts.event_window;
            tokio::task::spawn_blocking(move || EventLog::open(&path, window))
                .await
                .map_err(|e| AgentError::Task(e.to_string()))??
        };
        let events = Arc::new(EventBus::with_stream(event_log));
        let device_opts = DevicesOptions {
            config: opts.devices.clone(),
            data_dir: data_dir.clone(),
            restart: opts.restart,
            kube_grace: KUBE_RESTORE_GRACE,
        };
        let (devices, device_plugins) =
            Devices::new(&device_opts, Arc::clone(&events), Arc::clone(&store))?;
        let devices = Arc::new(devices);
        let metrics = Arc::new(Metrics::with_devices(Some(Arc::clone(devices.manager()))));
        let registry = Arc::new(Registry::load(Arc::clone(&store), Arc::clone(&events))?);
        tracing::info!(plugins = registry.list().len(), data_dir = %data_dir.display(), "registry loaded");

        let api_socket = opts.api_socket();
        let (listeners, acl) = crate::acl::listen(&opts, &api_socket, &store)?;

        let manager = Arc::new(Manager::new(
            Arc::clone(&registry),
            Arc::clone(&events),
            Arc::clone(&metrics),
            Arc::new(SocketWatcher::new()),
            Arc::clone(&store),
            opts.health,
        ));
        let tasks = TaskTracker::new();
        let (catalog, joined) = match &opts.etcd {
            None => (
                Arc::new(berth_controlplane::backend::StoreCatalog::new(Arc::clone(
                    &store,
                ))) as Arc<dyn berth_controlplane::backend::CatalogBackend>,
                None,
            ),
            Some(settings) => {
                let j = join_fleet(settings, &node_id, &tasks, &shutdown).await?;
                (Arc::clone(&j.catalog), Some(j))
            }
        };
        // In a fleet, recovered tasks wait until the node has synced with it.
        let gate = tokio::sync::watch::channel(joined.is_none()).0;
        let hooks = joined.as_ref().map(|j| crate::jobs::FleetHooks {
            servers_contacted: gate.subscribe(),
            upstream: Arc::new(crate::fleet_jobs::PreemptedWatcher::new(Arc::clone(
                &j.fleet,
            ))),
        });
        let volumes = Arc::new(Volumes::new(
            Arc::clone(&store),
            catalog,
            node_id.clone(),
            data_dir.clone(),
            Arc::clone(&registry),
            Arc::clone(&manager),
            Arc::clone(&events),
            Arc::clone(&metrics),
            joined
                .as_ref()
                .map(|j| Arc::new(j.router.clone()) as Arc<dyn berth_controlplane::Controllers>),
            tasks.clone(),
            shutdown.clone(),
        ));
        let drivers = {
            let mut b = berth_drivers::DriverManager::builder(
                berth_drivers::ManagerConfig::default(),
                &shutdown,
            );
            let sink = b.event_sink();
            let process = berth_drivers::ProcessConfig {
                task_path: opts.task_path.clone(),
                ..Default::default()
            };
            let raw = berth_drivers::RawExecDriver::new(sink.clone(), process.clone());
            // Tasks see their own root only: the chroot_env (checked above to stay clear of
            // the data dir), their directories and their volumes.
            let docker = berth_drivers::DockerDriver::new(sink.clone(), opts.docker.clone());
            let exec = berth_drivers::ExecDriver::new(
                sink,
                berth_drivers::ExecConfig {
                    chroot_env,
                    process,
                    ..Default::default()
                },
            );
            for d in [
                Arc::new(raw) as Arc<dyn berth_drivers::Driver>,
                Arc::new(exec) as Arc<dyn berth_drivers::Driver>,
                Arc::new(docker) as Arc<dyn berth_drivers::Driver>,
            ] {
                if let Err(e) = b.add(d) {
                    return Err(AgentError::Task(e.to_string()));
                }
            }
            b.start()
        };
        let jobs = Arc::new(Jobs::new(
            Arc::clone(&store),
            drivers,
            Arc::clone(devices.manager()),
            Arc::clone(&registry),
            Arc::clone(&manager),
            Arc::clone(&volumes),
            Arc::clone(&events),
            node,
            &data_dir,
            tasks.clone(),
            shutdown.clone(),
            hooks,
            consul,
        ));
        let fleet_jobs = joined.as_ref().map(|j| {
            crate::fleet_jobs::FleetJobs::new(
                Arc::clone(&j.fleet),
                Arc::clone(&j.membership),
                Arc::clone(&jobs),
                node_id.clone(),
                gate.clone(),
            )
        });
        let election = joined.as_ref().map(|j| {
            berth_fleet::Election::new(
                j.fleet.etcd().clone(),
                Arc::clone(&j.membership),
                node_id.clone(),
            )
        });
        let agent = Arc::new(Agent {
            node_id,
            hostname,
            registry,
            manager,
            events,
            metrics,
            volumes,
            jobs,
            devices,
            fleet: joined.as_ref().map(|j| Arc::clone(&j.membership)),
            fleet_jobs,
            election,
            signer,
            acl,
        });
        tasks.spawn(event_writer.run(shutdown.clone()));
        agent.events.publish(
            Topic::Node,
            "NodeRegistration",
            &agent.node_id,
            Vec::new(),
            serde_json::json!({ "Node": { "ID": agent.node_id, "Name": node_name, "Status": "ready" } }),
        );
        // The plugins this agent runs itself start afresh (left-over copies are stopped): what
        // was kept of their last fingerprint is not theirs.
        let restarted: Vec<(String, String)> = opts
            .plugins
            .iter()
            .filter(|p| matches!(p.run, PluginRun::Command { .. }))
            .map(|p| (p.id.clone(), "config".to_string()))
            .collect();
        agent.manager.drop_stale_fingerprints(&restarted).await;
        tasks.spawn(Arc::clone(&agent.manager).run(shutdown.clone()));
        tasks.spawn(crate::identity::rotate(
            agent.signer.clone(),
            crate::identity::ROTATION_CHECK,
            shutdown.clone(),
        ));
        if let Some(m) = &agent.fleet {
            let me = Arc::clone(&agent);
            let snapshot: berth_fleet::Snapshot = Arc::new(move || me.fleet_node());
            tasks.spawn(Arc::clone(m).run(snapshot, shutdown.clone()));
            // Claims are fenced by the registration: recovery writes nothing before it.
            let mut registered = m.subscribe();
            tokio::select! {
                () = shutdown.cancelled() => {}
                _ = registered.wait_for(Option::is_some) => {}
            }
        }

        if let Some(j) = &joined {
            // Other nodes' controller RPCs run on this node's own controllers only.
            tasks.spawn(j.router.clone().serve(
                Arc::new(agent.volumes.local_controllers()),
                tasks.clone(),
                shutdown.clone(),
            ));
        }
        agent.apply_declared(&opts, &tasks, &shutdown).await?;
        agent
            .devices
            .start(device_plugins, &device_opts, &tasks, &shutdown);
        agent.volumes.start();
        agent.jobs.recover().await;
        if let (Some(fj), Some(el), Some(j)) = (&agent.fleet_jobs, &agent.election, &joined) {
            // Allocs moved away while the node was gone stop before anything else runs.
            fj.sync().await;
            tasks.spawn(Arc::clone(fj).run(shutdown.clone()));
            let fleet = Arc::clone(&j.fleet);
            let sweep = crate::fleet_claims::LostClaimSweep::new(
                Arc::clone(&agent.volumes),
                Arc::clone(&j.membership),
                j.lost_claims,
            );
            let compactor = berth_fleet::Compactor::new(j.fleet.etcd().clone(), j.compact_every);
            tasks.spawn(Arc::clone(el).run(
                move |fence, term| {
                    let lead = Arc::clone(&fleet).lead(fence, term.clone());
                    let sweep = Arc::clone(&sweep).run(term.clone());
                    let compact = compactor.clone().run(term);
                    async move {
                        tokio::join!(lead, sweep, compact);
                    }
                },
                shutdown.clone(),
            ));
        }

        let regdir = opts
            .registry_dir
            .clone()
            .unwrap_or_else(|| data_dir.join("plugins_registry"));
        agent.forget_vanished_registrations(&regdir).await?;
        let sink = Arc::new(RegDirSink {
            agent: Arc::clone(&agent),
        });
        let watcher = RegistrationDir::new(regdir, opts.rescan_interval);
        let token = shutdown.clone();
        tasks.spawn(async move {
            if let Err(e) = watcher.run(sink, token).await {
                tracing::error!(error = %e, "registration directory watcher stopped");
            }
        });

        // The node's attributes (and so its computed class) are whole in the first answer.
        agent.jobs.drivers_ready().await;
        let router = berth_api::server::router(Arc::clone(&agent));
        tasks.spawn(listeners.serve(router, shutdown.clone()));
        tracing::info!(api = %api_socket.display(), node_id = %agent.node_id, "agent started");
        Ok(Running {
            agent,
            api_socket,
            tasks,
        })
    }

    /// Registers the config's plugins, forgets config plugins no longer declared, and starts
    /// the processes of those the agent runs.
    async fn apply_declared(
        self: &Arc<Self>,
        opts: &AgentOptions,
        tasks: &TaskTracker,
        shutdown: &CancellationToken,
    ) -> Result<(), AgentError> {
        let declared: Vec<&str> = opts.plugins.iter().map(|p| p.id.as_str()).collect();
        for stale in self
            .registry
            .list()
            .into_iter()
            .filter(|r| r.source == Source::Config)
        {
            if !declared.contains(&stale.id.as_str()) {
                self.registry
                    .deregister(&stale.id, &stale.instance, "no longer in the config")
                    .await
                    .map_err(|source| AgentError::Declared {
                        id: stale.id.clone(),
                        source,
                    })?;
            }
        }
        for decl in &opts.plugins {
            let socket = match &decl.run {
                PluginRun::External { socket } => socket.clone(),
                PluginRun::Command { command, args, env } => {
                    let socket = opts.managed_socket(&decl.id);
                    // Logs live outside the watched socket dir: writes never wake health loops.
                    let dir = opts.data_dir.join("logs");
                    let sup = Supervisor {
                        id: decl.id.clone(),
                        command: command.clone(),
                        args: args.clone(),
                        env: env.clone(),
                        log: dir.join(format!("plugin-{}.log", decl.id)),
                        socket: socket.clone(),
                        policy: opts.restart,
                    };
                    berth_sys::create_private_dir(&dir).map_err(|source| AgentError::DataDir {
                        path: dir.clone(),
                        source,
                    })?;
                    tasks.spawn(sup.run(Arc::clone(&self.events), shutdown.clone()));
                    socket
                }
            };
            let reg = Registration {
                id: decl.id.clone(),
                instance: "config".into(),
                plugin_type: decl.plugin_type,
                source: Source::Config,
                socket,
                plugin_view: None,
            };
            self.registry
                .register(reg)
                .await
                .map_err(|source| AgentError::Declared {
                    id: decl.id.clone(),
                    source,
                })?;
        }
        Ok(())
    }

    /// Deregisters registration-dir entries whose registration socket vanished while the
    /// agent was down (the watcher registers again those still there).
    async fn forget_vanished_registrations(&self, regdir: &Path) -> Result<(), AgentError> {
        for r in self
            .registry
            .list()
            .into_iter()
            .filter(|r| r.source == Source::RegistrationDir)
        {
            if !regdir.join(&r.instance).exists() {
                self.registry
                    .deregister(
                        &r.id,
                        &r.instance,
                        "registration socket gone while the agent was down",
                    )
                    .await?;
            }
        }
        Ok(())
    }

    fn status(&self, id: &str) -> Option<PluginStatus> {
        let records = self.registry.instances(id);
        let active = records.first()?.clone();
        let instances: Vec<Instance> = records
            .iter()
            .map(|r| {
                let state = self.manager.state(&r.id, &r.instance);
                Instance {
                    instance: r.instance.clone(),
                    source: r.source,
                    socket: r.socket.clone(),
                    registered_ms: r.registered_ms,
                    active: r.instance == active.instance,
                    health: state.map(|s| s.health).unwrap_or_else(pending),
                }
            })
            .collect();
        let state = self.manager.state(&active.id, &active.instance);
        Some(PluginStatus {
            id: id.to_string(),
            plugin_type: active.plugin_type,
            health: state
                .as_ref()
                .map(|s| s.health.clone())
                .unwrap_or_else(pending),
            fingerprint: state.and_then(|s| s.fingerprint),
            instances,
        })
    }
}

/// What joining a fleet gives the agent.
struct Joined {
    catalog: Arc<dyn berth_controlplane::backend::CatalogBackend>,
    membership: Arc<berth_fleet::Membership>,
    fleet: Arc<berth_fleet::Fleet>,
    router: berth_fleet::Router,
    lost_claims: berth_fleet::settings::LostClaims,
    compact_every: Duration,
}

/// Connects to the fleet's etcd (waiting for it while it does not answer) and starts the
/// mirrors of its volumes, nodes, alive keys, jobs, allocs and reports; returns once each has
/// its first listing, so nothing reads an empty catalog.
async fn join_fleet(
    settings: &berth_fleet::EtcdSettings,
    node_id: &str,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) -> Result<Joined, AgentError> {
    // etcd may come up after the agent (started together, or restarting): wait for it, as a
    // client waits for its servers. Settings that cannot work fail at once.
    let mut wait = Duration::from_millis(200);
    let etcd = loop {
        match berth_fleet::Etcd::connect(settings).await {
            Ok(etcd) => break etcd,
            Err(e @ berth_fleet::FleetError::Connect { .. }) => {
                tracing::warn!(error = %e, retry_in = ?wait, "the fleet's etcd does not answer; trying again");
                tokio::select! {
                    () = shutdown.cancelled() => return Err(e.into()),
                    () = tokio::time::sleep(wait) => {}
                }
                wait = (wait * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e.into()),
        }
    };
    // Requests stop going to a member that died (and go back when it answers again).
    tasks.spawn(etcd.clone().watch_endpoints(shutdown.clone()));
    let membership =
        berth_fleet::Membership::new(etcd.clone(), node_id.to_string(), settings.lease_ttl);
    let volumes = berth_fleet::WatchedDir::new(berth_fleet::EtcdCatalog::dir(&etcd));
    tasks.spawn(Arc::clone(&volumes).run(etcd.clone(), shutdown.clone()));
    tasks.spawn(Arc::clone(membership.node_dir()).run(etcd.clone(), shutdown.clone()));
    tasks.spawn(Arc::clone(membership.alive_dir()).run(etcd.clone(), shutdown.clone()));
    let fleet = berth_fleet::Fleet::new(
        etcd.clone(),
        Arc::clone(&membership),
        Arc::clone(&volumes),
        berth_fleet::LeaderSettings {
            lost_after: settings.lost_after,
            gc_after: settings.gc_after,
        },
    );
    fleet.mirrors(tasks, shutdown);
    volumes.wait_synced(shutdown).await;
    membership.node_dir().wait_synced(shutdown).await;
    membership.alive_dir().wait_synced(shutdown).await;
    fleet.synced(shutdown).await;
    tracing::info!(endpoints = %settings.endpoints.join(","), prefix = %settings.prefix, "joined the fleet's etcd");
    let router =
        berth_fleet::Router::new(etcd.clone(), Arc::clone(&membership), node_id.to_string());
    router.mirrors(tasks, shutdown);
    let catalog = berth_fleet::EtcdCatalog::new(etcd, volumes, Arc::clone(&membership));
    Ok(Joined {
        catalog: Arc::new(catalog),
        membership,
        fleet,
        router,
        lost_claims: settings.lost_claims,
        compact_every: settings.compact_every,
    })
}

fn pending() -> berth_api::Health {
    crate::manager::InstanceState::pending().health
}

/// This node's id: made once, kept in the store.
fn node_id(store: &Store) -> Result<String, AgentError> {
    if let Some(id) = store.get::<String>(Table::NODE, "id")? {
        return Ok(id);
    }
    let id = format!("{:032x}", rand::random::<u128>());
    store.put(Table::NODE, "id", &id)?;
    Ok(id)
}

impl Agent {
    /// This node as the fleet sees it: its own view, its drivers and its healthy controllers.
    fn fleet_node(&self) -> berth_api::nodes::FleetNode {
        let mut n = berth_api::nodes::FleetNode::from_status(&self.node());
        n.drivers = self.jobs.driver_states();
        let local = self.volumes.local_controllers();
        n.csi_controllers = self
            .plugins()
            .into_iter()
            .filter(|p| p.plugin_type.is_controller() && p.health.healthy)
            .filter_map(|p| match local.local(&p.id) {
                berth_controlplane::ControllerAccess::Healthy(h) => {
                    Some(berth_api::nodes::NodeController {
                        plugin_id: p.id,
                        instance: h.instance,
                        capabilities: h.capabilities,
                    })
                }
                _ => None,
            })
            .collect();
        n
    }

    /// Stops every job and waits up to `timeout` for their allocs to finish (see
    /// [`Jobs::stop_all`]).
    pub async fn stop_all_jobs(&self, timeout: Duration) -> bool {
        self.jobs.stop_all(timeout).await
    }
}

impl berth_api::JobView for Agent {
    fn jobs(&self) -> Result<berth_api::jobs::JobList, ApiError> {
        match &self.fleet_jobs {
            Some(f) => Ok(f.list()),
            None => self.jobs.list(),
        }
    }

    fn job(&self, id: &str) -> Result<berth_api::jobs::JobStatus, ApiError> {
        match &self.fleet_jobs {
            Some(f) => f.status(id),
            None => self.jobs.status(id),
        }
    }

    fn alloc(&self, id: &str) -> Result<berth_api::jobs::AllocStatus, ApiError> {
        match &self.fleet_jobs {
            Some(f) => f.alloc(id),
            None => self.jobs.alloc(id),
        }
    }

    async fn run_job(
        &self,
        req: berth_api::jobs::JobRunRequest,
    ) -> Result<berth_api::jobs::JobStatus, ApiError> {
        if let Some(f) = &self.fleet_jobs {
            let f = Arc::clone(f);
            return self
                .volumes
                .detached(move |_| async move { f.submit(req).await })
                .await;
        }
        let jobs = Arc::clone(&self.jobs);
        self.volumes
            .detached(move |_| async move { jobs.run(req).await })
            .await
    }

    async fn stop_job(
        &self,
        id: &str,
        purge: bool,
    ) -> Result<berth_api::jobs::JobStatus, ApiError> {
        let id = id.to_string();
        if let Some(f) = &self.fleet_jobs {
            if purge {
                return Err(fleet_only_not(
                    "job stop -purge (the leader collects stopped jobs after gc_after)",
                ));
            }
            let f = Arc::clone(f);
            return self
                .volumes
                .detached(move |_| async move { f.stop(&id).await })
                .await;
        }
        let jobs = Arc::clone(&self.jobs);
        self.volumes
            .detached(move |_| async move {
                let status = jobs.stop(&id).await?;
                if purge {
                    jobs.purge_when_finished(&id);
                }
                Ok(status)
            })
            .await
    }

    fn alloc_ids(&self) -> Vec<String> {
        self.jobs.alloc_ids()
    }

    fn job_ids(&self) -> Vec<String> {
        match &self.fleet_jobs {
            Some(f) => f.list().jobs.into_iter().map(|j| j.id).collect(),
            None => self.jobs.job_ids(),
        }
    }

    async fn plan_job(
        &self,
        req: berth_api::jobs::JobRunRequest,
    ) -> Result<berth_api::jobs::JobPlan, ApiError> {
        if self.fleet_jobs.is_some() {
            return Err(fleet_only_not("job plan"));
        }
        self.jobs.plan(req).await
    }

    fn job_spec(&self, id: &str) -> Result<berth_api::jobs::JobSpecView, ApiError> {
        if self.fleet_jobs.is_some() {
            return Err(fleet_only_not("job inspect"));
        }
        self.jobs.spec_view(id)
    }

    async fn stop_alloc(&self, id: &str) -> Result<berth_api::jobs::AllocStatus, ApiError> {
        if self.fleet_jobs.is_some() {
            return Err(fleet_only_not(
                "alloc stop (stop the job, or drain the node)",
            ));
        }
        self.jobs.stop_one(id)
    }

    fn restart_alloc(
        &self,
        id: &str,
        task: Option<&str>,
    ) -> Result<berth_api::jobs::AllocActionResponse, ApiError> {
        self.jobs.restart_one(id, task)
    }

    fn signal_alloc(
        &self,
        id: &str,
        task: Option<&str>,
        signal: &str,
    ) -> Result<berth_api::jobs::AllocActionResponse, ApiError> {
        self.jobs.signal_one(id, task, signal)
    }

    async fn alloc_logs(
        &self,
        req: berth_api::allocs::LogsRequest,
    ) -> Result<berth_api::allocs::LogStream, ApiError> {
        self.jobs.logs(req).await
    }

    async fn alloc_exec(
        &self,
        req: berth_api::allocs::ExecRequest,
    ) -> Result<berth_api::allocs::ExecSession, ApiError> {
        self.jobs.exec(req).await
    }

    async fn alloc_stats(&self, id: &str) -> Result<berth_api::jobs::AllocStats, ApiError> {
        self.jobs.alloc_stats(id).await
    }
}

/// What an agent in a fleet answers for a call built for the embedded control plane only.
fn fleet_only_not(what: &str) -> ApiError {
    ApiError::Conflict(format!(
        "{what} is not available when the agent is part of an etcd fleet"
    ))
}

impl berth_api::VolumeView for Agent {
    fn volumes(&self) -> Result<berth_api::volumes::VolumeList, ApiError> {
        self.volumes.list()
    }

    fn volume_ids(&self) -> Vec<String> {
        self.volumes
            .list()
            .map(|l| l.volumes.into_iter().map(|v| v.id).collect())
            .unwrap_or_default()
    }

    async fn volume(&self, id: &str) -> Result<berth_api::volumes::VolumeStatus, ApiError> {
        self.volumes.status(id).await
    }

    async fn put_volume(
        &self,
        op: berth_api::SpecOp,
        req: berth_api::volumes::VolumeSpecRequest,
    ) -> Result<berth_api::volumes::VolumeStatus, ApiError> {
        self.volumes
            .detached(move |v| async move { v.put(op, req).await })
            .await
    }

    async fn deregister_volume(
        &self,
        id: &str,
        force: bool,
    ) -> Result<berth_api::volumes::DetachResponse, ApiError> {
        let id = id.to_string();
        self.volumes
            .detached(move |v| async move { v.deregister(&id, force).await })
            .await
    }

    async fn delete_volume(&self, id: &str) -> Result<(), ApiError> {
        let id = id.to_string();
        self.volumes
            .detached(move |v| async move { v.delete(&id).await })
            .await
    }

    async fn detach_volume(
        &self,
        id: &str,
        req: berth_api::volumes::DetachRequest,
    ) -> Result<berth_api::volumes::DetachResponse, ApiError> {
        let id = id.to_string();
        if let (Some(m), Some(asked)) = (&self.fleet, &req.node_id)
            && *asked != self.node_id
        {
            // Another node's claims (by id or name): freed here only when that node is down.
            let Some(n) = m
                .node(asked)
                .or_else(|| m.nodes().into_iter().find(|n| n.name == *asked))
            else {
                return Err(ApiError::NotFound(format!(
                    "node_id: no node {asked:?} in the fleet"
                )));
            };
            if n.id == self.node_id {
                let req = berth_api::volumes::DetachRequest { node_id: None };
                return self
                    .volumes
                    .detached(move |v| async move { v.detach(&id, req).await })
                    .await;
            }
            if n.status != berth_api::nodes::NodeState::Down {
                return Err(ApiError::BadRequest(format!(
                    "node_id: node {asked:?} is {}; its claims are released on it (stop its allocs, or detach there)",
                    n.status.as_str()
                )));
            }
            let node = n.id;
            return self
                .volumes
                .detached(move |v| async move {
                    if v.catalog_volume(&id).is_none() {
                        return Err(ApiError::NotFound(format!("no volume {id:?}")));
                    }
                    Ok(v.free_down_node(&id, &node).await)
                })
                .await;
        }
        self.volumes
            .detached(move |v| async move { v.detach(&id, req).await })
            .await
    }

    async fn expand_volume(
        &self,
        id: &str,
        req: berth_api::volumes::ExpandRequest,
    ) -> Result<berth_api::volumes::ExpandResponse, ApiError> {
        let id = id.to_string();
        self.volumes
            .detached(move |v| async move { v.expand(&id, req).await })
            .await
    }

    async fn claim_volume(
        &self,
        id: &str,
        req: berth_api::volumes::ClaimRequest,
    ) -> Result<berth_api::volumes::ClaimResponse, ApiError> {
        let id = id.to_string();
        self.volumes
            .detached(move |v| async move { v.claim(&id, req).await })
            .await
    }

    async fn release_volume(
        &self,
        id: &str,
        req: berth_api::volumes::ReleaseRequest,
    ) -> Result<berth_api::volumes::ReleaseResponse, ApiError> {
        let id = id.to_string();
        self.volumes
            .detached(move |v| async move { v.release_api(&id, req).await })
            .await
    }

    async fn create_snapshot(
        &self,
        id: &str,
        req: berth_api::volumes::SnapshotCreateRequest,
    ) -> Result<berth_api::volumes::SnapshotView, ApiError> {
        let id = id.to_string();
        self.volumes
            .detached(move |v| async move { v.create_snapshot(&id, req).await })
            .await
    }

    async fn delete_snapshot(
        &self,
        req: berth_api::volumes::SnapshotDeleteRequest,
    ) -> Result<(), ApiError> {
        self.volumes
            .detached(move |v| async move { v.delete_snapshot(req).await })
            .await
    }

    async fn list_snapshots(
        &self,
        plugin_id: &str,
    ) -> Result<berth_api::volumes::SnapshotList, ApiError> {
        self.volumes.list_snapshots(plugin_id).await
    }
}

impl AgentView for Agent {
    fn plugins(&self) -> Vec<PluginStatus> {
        let ids: std::collections::BTreeSet<String> =
            self.registry.list().into_iter().map(|r| r.id).collect();
        ids.iter().filter_map(|id| self.status(id)).collect()
    }

    fn plugin(&self, id: &str) -> Option<PluginStatus> {
        self.status(id)
    }

    fn node(&self) -> NodeStatus {
        let csi_plugins = self
            .plugins()
            .into_iter()
            .filter(|p| p.plugin_type.is_node())
            .map(|p| {
                let info = p.fingerprint.and_then(|f| f.node_info);
                NodePlugin {
                    plugin_id: p.id,
                    healthy: p.health.healthy,
                    csi_node_id: info.as_ref().map(|i| i.node_id.clone()),
                    max_volumes: info.as_ref().map_or(0, |i| i.max_volumes_per_node),
                    topology: info.and_then(|i| i.accessible_topology).unwrap_or_default(),
                }
            })
            .collect();
        let node = self.jobs.node_vars();
        let manager = self.devices.manager();
        let groups = manager.groups();
        let computed_class =
            berth_devices::class::computed_class(&berth_devices::class::ClassInput {
                datacenter: &node.datacenter,
                node_class: &node.class,
                node_pool: "default",
                attributes: &node.attrs,
                meta: &node.meta,
                devices: &groups,
            });
        NodeStatus {
            id: self.node_id.clone(),
            hostname: self.hostname.clone(),
            csi_plugins,
            name: node.name,
            datacenter: node.datacenter,
            region: node.region,
            node_class: node.class,
            attributes: node.attrs,
            meta: node.meta,
            computed_class,
            devices: manager.view_with_cdi(),
        }
    }

    fn nodes(&self) -> berth_api::nodes::NodeList {
        match &self.fleet {
            Some(m) => berth_api::nodes::NodeList {
                fleet: true,
                nodes: m.nodes(),
            },
            None => berth_api::nodes::NodeList {
                fleet: false,
                nodes: vec![self.fleet_node()],
            },
        }
    }

    async fn set_drain(
        &self,
        id: &str,
        enable: bool,
    ) -> Result<berth_api::nodes::FleetNode, ApiError> {
        let Some(m) = &self.fleet else {
            return Err(ApiError::Conflict(
                "drain is a fleet operation; this agent has no etcd control plane".into(),
            ));
        };
        match m.set_drain(id, enable).await {
            Ok(Some(n)) => {
                self.events.publish(
                    Topic::Node,
                    "NodeDrain",
                    &n.id,
                    vec![n.name.clone()],
                    serde_json::json!({ "Node": { "ID": n.id, "Name": n.name, "Drain": enable } }),
                );
                Ok(n)
            }
            Ok(None) => Err(ApiError::NotFound(format!("no node {id:?}"))),
            Err(e) => Err(ApiError::Unavailable(e.to_string())),
        }
    }

    fn event_source(&self) -> Option<Arc<dyn berth_api::stream::EventSource>> {
        self.events
            .stream()
            .map(|s| Arc::new(s.clone()) as Arc<dyn berth_api::stream::EventSource>)
    }

    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<berth_api::Event> {
        self.events.subscribe()
    }

    fn acl(&self) -> Option<Arc<dyn berth_api::server::AclStore>> {
        self.acl
            .clone()
            .map(|a| a as Arc<dyn berth_api::server::AclStore>)
    }

    fn jwks(&self) -> Option<serde_json::Value> {
        Some(self.signer.jwks_json())
    }

    fn metrics(&self) -> String {
        self.metrics.render()
    }

    async fn register(&self, req: RegisterRequest) -> Result<PluginStatus, ApiError> {
        let instance = req
            .instance
            .clone()
            .unwrap_or_else(|| instance_for_socket(&req.socket));
        if let Some(existing) = self.registry.get(&req.id, &instance)
            && existing.source != Source::Api
        {
            return Err(ApiError::Conflict(format!(
                "instance {instance:?} of plugin {:?} comes from the {}; the API cannot replace it",
                req.id,
                existing.source.as_str()
            )));
        }
        let reg = Registration {
            id: req.id.clone(),
            instance,
            plugin_type: req.plugin_type,
            source: Source::Api,
            socket: req.socket,
            plugin_view: None,
        };
        match self.registry.register(reg).await {
            Ok(_) => self
                .status(&req.id)
                .ok_or_else(|| ApiError::Internal("registered plugin vanished".into())),
            Err(RegistryError::Invalid(m)) => Err(ApiError::BadRequest(m)),
            Err(e) => Err(ApiError::Internal(e.to_string())),
        }
    }

    async fn deregister(&self, id: &str, instance: &str) -> Result<(), ApiError> {
        if let Some(existing) = self.registry.get(id, instance)
            && existing.source != Source::Api
        {
            return Err(ApiError::Conflict(format!(
                "instance {instance:?} of plugin {id:?} comes from the {}; remove it there",
                existing.source.as_str()
            )));
        }
        match self
            .registry
            .deregister(id, instance, "deregistered through the API")
            .await
        {
            Ok(true) => Ok(()),
            Ok(false) => Err(ApiError::NotFound(format!(
                "no instance {instance:?} of plugin {id:?}"
            ))),
            Err(e) => Err(ApiError::Internal(e.to_string())),
        }
    }
}

/// A stable instance name for an API registration without one: derived from the socket path.
fn instance_for_socket(socket: &Path) -> String {
    let hash = socket
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
    format!("api-{hash:016x}")
}

/// Plugins found in the registration directory become registry entries: the plugin id is the
/// driver name, the instance the registration socket's file name.
struct RegDirSink {
    agent: Arc<Agent>,
}

impl RegDirSink {
    fn instance(p: &DiscoveredPlugin) -> String {
        p.registration_socket
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "registration".into())
    }
}

impl berth_regdir::Sink for RegDirSink {
    async fn register(&self, p: &DiscoveredPlugin) -> Result<(), String> {
        let reg = Registration {
            id: p.name.clone(),
            instance: Self::instance(p),
            plugin_type: berth_api::PluginType::Node,
            source: Source::RegistrationDir,
            socket: p.endpoint.clone(),
            plugin_view: None,
        };
        self.agent
            .registry
            .register(reg)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }

    async fn deregister(&self, p: &DiscoveredPlugin) {
        let instance = Self::instance(p);
        if let Err(e) = self
            .agent
            .registry
            .deregister(&p.name, &instance, "registration socket removed")
            .await
        {
            tracing::warn!(plugin = %p.name, error = %e, "cannot deregister");
        }
    }
}
