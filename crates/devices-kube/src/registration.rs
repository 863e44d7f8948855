//! The registration server: berth's side of kubelet's `Registration` service on
//! `<dir>/kubelet.sock`, and the owner of one [`Instance`] task per registered plugin.

use std::{
    collections::HashMap,
    io,
    os::unix::{ffi::OsStrExt as _, fs::FileTypeExt as _},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use berth_devices::plugin::{PluginEvent, PluginId, PluginSink};
use berth_sys::slot::RestartPolicy;
use tokio::{net::UnixListener, sync::mpsc};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tonic::{Request, Response, Status};

use crate::{
    error::KubeError,
    instance::{Instance, Shared, options_text},
    proto::{
        KUBELET_SOCKET, PRE_START_TIMEOUT,
        v1beta1::{
            Empty, RegisterRequest,
            registration_server::{Registration as RegistrationRpc, RegistrationServer},
        },
    },
    validate::{MAX_SOCKET_PATH, Registration, check_register},
};

/// How long the registration server may take to finish the `Register` calls in flight at
/// shutdown.
const SERVER_GRACE: Duration = Duration::from_secs(5);

/// How many accepted `Register`s may wait for the owner.
const REGISTER_QUEUE: usize = 64;

/// How the registration server runs.
#[derive(Debug, Clone)]
pub struct KubeConfig {
    /// The device plugin directory: `kubelet.sock` is served there and plugins' sockets live
    /// there. Created (0700) if missing; an existing directory keeps its mode.
    pub dir: PathBuf,
    /// The backoff between re-dials of a plugin whose connection failed (`initial`, `max`,
    /// `reset_after`; `stop_grace` is unused: berth does not run these plugins).
    pub restart: RestartPolicy,
    /// Deadline of `GetDevicePluginOptions` when dialing, of opening `ListAndWatch`, and of
    /// `Allocate` and `GetPreferredAllocation`.
    pub call_timeout: Duration,
    /// How often a connected plugin is asked `GetDevicePluginOptions` to check it still
    /// answers.
    pub liveness_interval: Duration,
    /// How long that check waits for the answer.
    pub liveness_timeout: Duration,
    /// Deadline of `PreStartContainer` (kubelet's is 30 s).
    pub pre_start_timeout: Duration,
}

impl KubeConfig {
    /// Defaults for the directory `dir`: the default restart policy, 10 s calls, a liveness
    /// check every 5 s with a 2 s deadline, and kubelet's 30 s for `PreStartContainer`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            restart: RestartPolicy::default(),
            call_timeout: Duration::from_secs(10),
            liveness_interval: Duration::from_secs(5),
            liveness_timeout: Duration::from_secs(2),
            pre_start_timeout: PRE_START_TIMEOUT,
        }
    }
}

impl Default for KubeConfig {
    /// [`KubeConfig::new`] for kubelet's directory, `/var/lib/kubelet/device-plugins`.
    fn default() -> Self {
        Self::new(crate::proto::DEFAULT_DIR)
    }
}

/// Kubernetes device plugins on this node: serves kubelet's registration socket and follows
/// every plugin that registers there, telling a [`PluginSink`] what it learns.
#[derive(Debug)]
pub struct KubeDevices {
    config: KubeConfig,
    socket: PathBuf,
}

impl KubeDevices {
    /// Checks `config`: positive timings, and a registration socket path (`<dir>/kubelet.sock`,
    /// made absolute) that fits in a unix socket address (107 bytes). Touches nothing.
    pub fn new(mut config: KubeConfig) -> Result<Self, KubeError> {
        let positive = [
            ("call_timeout", config.call_timeout),
            ("liveness_interval", config.liveness_interval),
            ("liveness_timeout", config.liveness_timeout),
            ("pre_start_timeout", config.pre_start_timeout),
            ("restart.initial", config.restart.initial),
        ];
        if let Some((field, _)) = positive.iter().find(|(_, d)| d.is_zero()) {
            return Err(KubeError::Config {
                field,
                reason: "must be longer than zero".into(),
            });
        }
        if config.restart.max < config.restart.initial {
            return Err(KubeError::Config {
                field: "restart.max",
                reason: "must be at least restart.initial".into(),
            });
        }
        if config.dir.as_os_str().is_empty() {
            return Err(KubeError::Config {
                field: "dir",
                reason: "must not be empty".into(),
            });
        }
        config.dir = std::path::absolute(&config.dir).map_err(|source| KubeError::Dir {
            path: config.dir.clone(),
            source,
        })?;
        let socket = config.dir.join(KUBELET_SOCKET);
        let len = socket.as_os_str().as_bytes().len();
        if len > MAX_SOCKET_PATH {
            return Err(KubeError::SocketPathTooLong { path: socket, len });
        }
        Ok(Self { config, socket })
    }

    /// The device plugin directory (absolute).
    pub fn dir(&self) -> &Path {
        &self.config.dir
    }

    /// `<dir>/kubelet.sock`.
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// Serves until `shutdown` is cancelled. At start: creates the directory if missing,
    /// refuses to run if another server answers on `kubelet.sock`, removes every socket left
    /// in the directory (other files stay; running plugins see their socket go, re-create it
    /// and register again, as they do when kubelet restarts), then serves `Registration`.
    ///
    /// Every valid `Register` is answered at once, then followed in a task of its own (see
    /// the crate documentation); an invalid one gets `InvalidArgument` naming the field, and
    /// one whose endpoint socket does not exist (yet) `Unavailable` (a plugin retries that);
    /// neither changes anything. A second `Register` of a resource replaces the first: the old
    /// instance is stopped before the new one attaches.
    ///
    /// At shutdown: stops serving, stops every instance and waits for them, removes
    /// `kubelet.sock`, and sends `Removed` for every plugin ever attached. Fails before
    /// serving if the directory or the socket cannot be used.
    pub async fn run(
        self,
        sink: Arc<dyn PluginSink>,
        shutdown: CancellationToken,
    ) -> Result<(), KubeError> {
        let dir = self.config.dir.clone();
        prepare_dir(&dir)?;
        check_registration_socket(&self.socket)?;
        remove_stale_sockets(&dir)?;
        let listener = UnixListener::bind(&self.socket).map_err(|source| KubeError::Bind {
            path: self.socket.clone(),
            source,
        })?;

        let (register_tx, mut register_rx) = mpsc::channel(REGISTER_QUEUE);
        let server_stop = CancellationToken::new();
        let server = tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(RegistrationService {
                dir: dir.clone(),
                queue: register_tx,
            }))
            .serve_with_incoming_shutdown(
                UnixListenerStream::new(listener),
                server_stop.clone().cancelled_owned(),
            );
        let mut server = std::pin::pin!(server);
        tracing::info!(
            socket = %self.socket.display(),
            "serving Kubernetes device plugin registration"
        );

        // Instances stop with the token, and also if this future is dropped.
        let instances_stop = CancellationToken::new();
        let _stop_on_drop = instances_stop.clone().drop_guard();
        let (done_tx, mut done_rx) = mpsc::unbounded_channel();
        let mut owner = Owner {
            shared: Arc::new(Shared::new(
                Arc::clone(&sink),
                self.config.restart,
                self.config.call_timeout,
                self.config.liveness_interval,
                self.config.liveness_timeout,
                self.config.pre_start_timeout,
            )),
            instances: HashMap::new(),
            tracker: TaskTracker::new(),
            stop: instances_stop.clone(),
            done: done_tx,
            seq: 0,
        };

        let mut server_ended = false;
        let result = loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break Ok(()),
                r = &mut server, if !server_ended => {
                    server_ended = true;
                    break r.map_err(|source| KubeError::Serve {
                        path: self.socket.clone(),
                        source,
                    });
                }
                Some(reg) = register_rx.recv() => owner.register(reg),
                Some((resource, seq)) = done_rx.recv() => owner.finished(&resource, seq),
            }
        };

        // Register calls from now on fail at once (the agent is shutting down).
        drop(register_rx);
        server_stop.cancel();
        if !server_ended
            && tokio::time::timeout(SERVER_GRACE, &mut server)
                .await
                .is_err()
        {
            tracing::warn!("Register calls still in flight at shutdown; stopping anyway");
        }
        instances_stop.cancel();
        owner.tracker.close();
        owner.tracker.wait().await;
        remove_socket(&self.socket);
        for (resource, generation) in owner.shared.all_generations() {
            sink.event(
                &PluginId::kubernetes(resource),
                generation,
                PluginEvent::Removed {
                    reason: "the device plugin registration server stopped".into(),
                },
            );
        }
        tracing::info!(socket = %self.socket.display(), "device plugin registration stopped");
        result
    }
}

/// The `Registration` service: checks each `Register` and queues the valid ones for the owner.
#[derive(Debug)]
struct RegistrationService {
    dir: PathBuf,
    queue: mpsc::Sender<Registration>,
}

#[tonic::async_trait]
impl RegistrationRpc for RegistrationService {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let req = request.into_inner();
        let reg = match check_register(&self.dir, &req) {
            Ok(reg) => reg,
            Err(e) if e.is_transient() => {
                tracing::info!(
                    field = e.field(),
                    "a device plugin registered before its socket exists; it may try again: {e}"
                );
                return Err(Status::unavailable(e.to_string()));
            }
            Err(e) => {
                tracing::warn!(
                    field = e.field(),
                    "refused a device plugin registration: {e}"
                );
                return Err(Status::invalid_argument(e.to_string()));
            }
        };
        tracing::info!(
            resource = %reg.resource,
            endpoint = %reg.endpoint,
            options = %reg.options.as_ref().map_or_else(|| "none".into(), options_text),
            "device plugin registered"
        );
        self.queue
            .send(reg)
            .await
            .map_err(|_| Status::unavailable("the agent is shutting down"))?;
        Ok(Response::new(Empty {}))
    }
}

/// A running instance, as its owner knows it.
#[derive(Debug)]
struct Handle {
    seq: u64,
    stop: CancellationToken,
    finished: CancellationToken,
}

/// The one owner of the instance table.
#[derive(Debug)]
struct Owner {
    shared: Arc<Shared>,
    instances: HashMap<String, Handle>,
    tracker: TaskTracker,
    stop: CancellationToken,
    done: mpsc::UnboundedSender<(String, u64)>,
    seq: u64,
}

impl Owner {
    /// Starts following `reg`, replacing (and first stopping) the resource's instance.
    fn register(&mut self, reg: Registration) {
        let resource = reg.resource.as_str().to_string();
        let previous = self.instances.remove(&resource);
        if let Some(old) = &previous {
            tracing::info!(resource = %resource, "a new registration replaces the running instance");
            old.stop.cancel();
        }
        self.seq += 1;
        let handle = Handle {
            seq: self.seq,
            stop: self.stop.child_token(),
            finished: CancellationToken::new(),
        };
        let instance = Instance {
            shared: Arc::clone(&self.shared),
            plugin: PluginId::kubernetes(resource.clone()),
            reg,
            stop: handle.stop.clone(),
            previous: previous.map(|p| p.finished),
            finished: handle.finished.clone(),
            done: self.done.clone(),
            seq: handle.seq,
        };
        self.tracker.spawn(instance.run());
        self.instances.insert(resource, handle);
    }

    /// The instance `seq` of `resource` has ended.
    fn finished(&mut self, resource: &str, seq: u64) {
        if self.instances.get(resource).is_some_and(|h| h.seq == seq) {
            self.instances.remove(resource);
        }
    }
}

/// Creates `dir` (0700) when it is missing; refuses a non-directory.
fn prepare_dir(dir: &Path) -> Result<(), KubeError> {
    let err = |source| KubeError::Dir {
        path: dir.to_path_buf(),
        source,
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(err(io::Error::new(
            io::ErrorKind::NotADirectory,
            "exists and is not a directory",
        ))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            berth_sys::create_private_dir(dir).map_err(err)
        }
        Err(e) => Err(err(e)),
    }
}

/// Refuses to take over a registration socket another server answers on, or a non-socket.
fn check_registration_socket(socket: &Path) -> Result<(), KubeError> {
    match std::fs::symlink_metadata(socket) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(socket).is_ok() {
                return Err(KubeError::InUse {
                    path: socket.to_path_buf(),
                });
            }
            Ok(())
        }
        Ok(_) => Err(KubeError::NotASocket {
            path: socket.to_path_buf(),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(KubeError::Dir {
            path: socket.to_path_buf(),
            source,
        }),
    }
}

/// Removes every socket directly in `dir` (never anything else) and says which.
fn remove_stale_sockets(dir: &Path) -> Result<(), KubeError> {
    let entries = std::fs::read_dir(dir).map_err(|source| KubeError::Dir {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut removed = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| KubeError::Dir {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = entry.path();
        let is_socket = std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_socket());
        if !is_socket {
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => removed.push(entry.file_name().to_string_lossy().into_owned()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(KubeError::RemoveStale { path, source }),
        }
    }
    removed.sort();
    if removed.is_empty() {
        tracing::info!(dir = %dir.display(), "no stale sockets in the device plugin directory");
    } else {
        tracing::info!(
            dir = %dir.display(),
            removed = %berth_input::quoted_list(removed.iter().map(String::as_str)),
            "removed stale sockets from the device plugin directory (running plugins register \
             again when they see kubelet.sock)"
        );
    }
    Ok(())
}

/// Removes `path` if it is (still) a socket.
fn remove_socket(path: &Path) {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
        && let Err(e) = std::fs::remove_file(path)
    {
        tracing::warn!(path = %path.display(), error = %e, "could not remove the registration socket");
    }
}
