//! The plugin instance shared by the three CSI services, and what every RPC does first.

use std::{
    collections::HashMap,
    ffi::OsString,
    fmt::Debug,
    future::Future,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::Arc,
    task::Poll,
};

use berth_csi::Rpc;
use berth_sys::{MountEntry, Mounter, PathProbe};
use tokio::time::{Duration, Instant};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tonic::{Request, Response, Status, codegen::http};
use tracing::Instrument as _;

use crate::{
    Backing, Mode,
    calllog::CallLog,
    error::internal,
    faults::Faults,
    image,
    locks::KeyedLocks,
    nodestate::NodeState,
    state::{Capability, Store},
};

/// Topology key whose value is the node id.
pub const TOPOLOGY_KEY: &str = "topology.hostpath.csi.berth.dev/node";

/// Publish-context key whose value is the node a volume was published to.
pub const PUBLISH_CONTEXT_NODE_KEY: &str = "hostpath.csi.berth.dev/node";

/// Settings of a plugin instance, resolved from the [`Config`](crate::Config).
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub driver_name: String,
    pub node_id: String,
    pub statedir: PathBuf,
    pub capacity: Option<u64>,
    pub max_volume_size: Option<u64>,
    pub max_volumes_per_node: u32,
    pub stage: bool,
    pub attach: bool,
    /// What volumes are made of.
    pub backing: Backing,
    /// `--strict`: refuse requests where the CO skipped a duty of its own.
    pub strict: bool,
    /// `--shared`: the state directory is shared with copies serving other nodes.
    pub shared: bool,
    /// Which services are served (and advertised).
    pub mode: Mode,
}

#[derive(Debug)]
pub(crate) struct Plugin {
    pub settings: Settings,
    pub volumes_dir: PathBuf,
    pub snapshots_dir: PathBuf,
    /// How a volume directory shows as the root of a bind mount in mountinfo: this plus its id.
    pub volumes_fs_root: PathBuf,
    pub store: Store,
    /// The node's records of stagings and publications.
    pub node: NodeState,
    pub locks: KeyedLocks,
    pub mounter: Arc<dyn Mounter>,
    pub faults: Faults,
    /// Where every RPC is logged, with `--call-log`.
    pub call_log: Option<CallLog>,
    pub shutdown: CancellationToken,
    /// Every RPC body runs here; shutdown waits for them.
    pub tasks: TaskTracker,
}

/// When a request arrived, stamped by [`stamp_arrival`] before tonic's own deadline timer
/// starts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Arrival(Instant);

/// Records when a request arrived (used as a layer of the gRPC server).
pub(crate) fn stamp_arrival(
    mut request: http::Request<tonic::body::Body>,
) -> http::Request<tonic::body::Body> {
    request.extensions_mut().insert(Arrival(Instant::now()));
    request
}

/// The caller's deadline: arrival plus its `grpc-timeout`. Measured from arrival, it is never
/// later than tonic's own timer (which would answer `CANCELLED`), so callers get
/// `DEADLINE_EXCEEDED` as gRPC prescribes.
fn deadline<T>(request: &Request<T>) -> Option<Instant> {
    let timeout = request
        .metadata()
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout)?;
    let arrival = request
        .extensions()
        .get::<Arrival>()
        .map_or_else(Instant::now, |a| a.0);
    Some(arrival + timeout)
}

/// Parses a `grpc-timeout` header value: up to 8 digits and a unit (H, M, S, m, u, n).
pub(crate) fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let unit = value.chars().last()?;
    let digits = &value[..value.len() - unit.len_utf8()];
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        'H' => Duration::from_secs(n * 3600),
        'M' => Duration::from_secs(n * 60),
        'S' => Duration::from_secs(n),
        'm' => Duration::from_millis(n),
        'u' => Duration::from_micros(n),
        'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// What is mounted at a path, as far as one volume is concerned.
#[derive(Debug)]
pub(crate) enum MountAt {
    Nothing,
    /// The volume's directory (directly or through its staging mount).
    Volume,
    /// Something else.
    Other(MountEntry),
}

/// One request's view of what is mounted where, as far as volume `id` is concerned. A path is
/// looked up with one `statx` ([`Mounter::probe`]): nothing mounted there, or the volume's own
/// directory bound there, is known from that alone. The mount table, which costs far more to
/// read than any mount call, is read only when the probe cannot tell (another mount, a volume
/// directory removed since, image backing, a kernel that does not report mount roots), and then
/// once for the whole view. A view answers for the moment it is read: after a mount call,
/// take a new one.
pub(crate) struct MountView<'p> {
    plugin: &'p Plugin,
    id: &'p str,
    /// Device and inode of the volume's directory, once looked up (`None` inside: it is gone).
    volume_dir: Option<Option<(u64, u64)>>,
    table: Option<Vec<MountEntry>>,
}

impl<'p> MountView<'p> {
    /// The volume the view is for.
    pub fn id(&self) -> &'p str {
        self.id
    }

    /// What is mounted at `path`: the top-most mount there, as mount(2) and umount(2) see it.
    pub fn at(&mut self, path: &Path) -> Result<MountAt, Status> {
        match self.plugin.mounter.probe(path).map_err(|e| internal(&e))? {
            Some(PathProbe::Absent | PathProbe::Plain) => return Ok(MountAt::Nothing),
            Some(PathProbe::MountRoot { dev, ino })
                if self.plugin.settings.backing == Backing::Dir
                    && self.volume_dir()? == Some((dev, ino)) =>
            {
                return Ok(MountAt::Volume);
            }
            _ => {}
        }
        let (plugin, id) = (self.plugin, self.id);
        Ok(plugin.mount_in(self.table()?, path, id))
    }

    /// The whole mount table, read once per view.
    pub fn table(&mut self) -> Result<&[MountEntry], Status> {
        if self.table.is_none() {
            self.table = Some(self.plugin.mounts()?);
        }
        Ok(self.table.as_deref().unwrap_or_default())
    }

    /// Forgets the mount table read so far (after a mount call changed it); what the volume's
    /// directory is stays known.
    pub fn forget_table(&mut self) {
        self.table = None;
    }

    fn volume_dir(&mut self) -> Result<Option<(u64, u64)>, Status> {
        if let Some(known) = self.volume_dir {
            return Ok(known);
        }
        let path = self.plugin.volume_path(self.id);
        let known = match std::fs::symlink_metadata(&path) {
            Ok(m) => Some((m.dev(), m.ino())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => {
                return Err(internal(&crate::files::FsError {
                    action: "inspecting",
                    path,
                    source,
                }));
            }
        };
        self.volume_dir = Some(known);
        Ok(known)
    }
}

impl Plugin {
    /// Sets up the instance over an existing state directory `settings.statedir` (absolute).
    pub fn new(
        settings: Settings,
        store: Store,
        node: NodeState,
        mounter: Arc<dyn Mounter>,
        faults: Faults,
        shutdown: CancellationToken,
    ) -> Result<Self, berth_sys::MountError> {
        let volumes_dir = settings.statedir.join("volumes");
        let snapshots_dir = settings.statedir.join("snapshots");
        let mounts = mounter.mounts()?;
        let volumes_fs_root = fs_root_of(&mounts, &volumes_dir);
        Ok(Self {
            settings,
            volumes_dir,
            snapshots_dir,
            volumes_fs_root,
            store,
            node,
            locks: KeyedLocks::default(),
            mounter,
            faults,
            call_log: None,
            shutdown,
            tasks: TaskTracker::new(),
        })
    }

    /// Logs every RPC to `call_log`, if given.
    pub fn with_call_log(mut self, call_log: Option<CallLog>) -> Self {
        self.call_log = call_log;
        self
    }

    /// Runs one RPC: opens a span with its method and volume id, logs the call (the request at
    /// trace, through its redacting `Debug`), applies the fault switch, then runs `body`, and
    /// appends the outcome to the call log before answering. The answer honours the caller's
    /// deadline (`DEADLINE_EXCEEDED`), but the operation itself always runs to completion, even
    /// if the caller gives up or goes away, so no operation is left half done and a retry finds
    /// it finished.
    ///
    /// `body` is polled once right here: most operations finish without waiting (their locks
    /// are free, their system calls synchronous), and answer without a task switch or a timer.
    /// One that has to wait is handed, half done, to a tracked task that runs it to the end.
    pub async fn rpc<Req, T, Fut>(
        self: &Arc<Self>,
        method: Rpc,
        volume_id: &str,
        request: Request<Req>,
        body: impl FnOnce(Arc<Self>, Req) -> Fut,
    ) -> Result<Response<T>, Status>
    where
        Req: Debug,
        T: Send + 'static,
        Fut: Future<Output = Result<T, Status>> + Send + 'static,
    {
        let deadline = deadline(&request);
        let request = request.into_inner();
        // Written as CANCELLED if this future is dropped (the caller went away) before the end.
        let log_entry = self
            .call_log
            .as_ref()
            .map(|log| log.entry(method, volume_id));
        let span = tracing::debug_span!("rpc", method = %method, volume_id);
        let work = async {
            tracing::debug!("call");
            tracing::trace!(?request);
            self.faults.apply(method, &self.shutdown).await?;
            let mut operation = Box::pin(body(Arc::clone(self), request).in_current_span());
            // No await between this poll and the spawn: the caller cannot go away in between.
            let first = std::future::poll_fn(|cx| Poll::Ready(operation.as_mut().poll(cx))).await;
            if let Poll::Ready(result) = first {
                return result;
            }
            self.tasks
                .spawn(operation)
                .await
                .map_err(|e| Status::internal(format!("{method} failed: {e}")))?
        };
        let result = async {
            match deadline {
                None => work.await,
                Some(at) => tokio::select! {
                    biased;
                    result = work => result,
                    () = tokio::time::sleep_until(at) => Err(Status::deadline_exceeded(format!(
                        "{method} did not finish within the caller's deadline; it goes on, and \
                         a retry waits for it"
                    ))),
                },
            }
        }
        .instrument(span.clone())
        .await;
        if let Some(entry) = log_entry {
            entry.finish(
                result
                    .as_ref()
                    .map_or_else(Status::code, |_| tonic::Code::Ok),
            );
        }
        let _enter = span.enter();
        match &result {
            Ok(_) => tracing::debug!("ok"),
            Err(status) => {
                tracing::debug!(code = ?status.code(), message = status.message(), "failed");
            }
        }
        result.map(Response::new)
    }

    /// This node's topology segments.
    pub fn topology(&self) -> HashMap<String, String> {
        node_topology(&self.settings.node_id)
    }

    /// The name of volume or snapshot `id`'s directory or image file.
    pub fn entry_name(&self, id: &str) -> String {
        match self.settings.backing {
            Backing::Dir => id.to_owned(),
            Backing::Image => image::file_name(id),
        }
    }

    /// Volume `id`'s directory or image file.
    pub fn volume_path(&self, id: &str) -> PathBuf {
        self.volumes_dir.join(self.entry_name(id))
    }

    /// Snapshot `id`'s directory or image file.
    pub fn snapshot_path(&self, id: &str) -> PathBuf {
        self.snapshots_dir.join(self.entry_name(id))
    }

    /// Whether this plugin's volumes can have `cap`'s fs_type: directories take any (they have
    /// no filesystem of their own); images are ext4 (`""` means the plugin's choice).
    pub fn fs_type_supported(&self, cap: &Capability) -> bool {
        match self.settings.backing {
            Backing::Dir => true,
            Backing::Image => cap.fs_type.is_empty() || cap.fs_type == image::FS_TYPE,
        }
    }

    /// [`fs_type_supported`](Self::fs_type_supported), or `INVALID_ARGUMENT` naming `field`.
    pub fn check_fs_type(&self, cap: &Capability, field: &str) -> Result<(), Status> {
        if self.fs_type_supported(cap) {
            return Ok(());
        }
        Err(Status::invalid_argument(format!(
            "{field}.mount.fs_type {fs_type:?} is not supported: this plugin's volumes are \
             {ext4} filesystems (leave it empty or say {ext4:?})",
            fs_type = cap.fs_type,
            ext4 = image::FS_TYPE
        )))
    }

    /// Whether `entry` is a mount of volume `id` (even of one removed since): a bind mount of
    /// its directory, or a mount of the filesystem in its image (made from a loop device
    /// attached to the image file, directly or through a bind of such a mount).
    pub fn is_volume_mount(&self, entry: &MountEntry, id: &str) -> bool {
        match self.settings.backing {
            Backing::Dir => {
                let expected = self.volumes_fs_root.join(id);
                let mut deleted = OsString::from(expected.as_os_str());
                deleted.push("//deleted");
                entry.root == expected || entry.root.as_os_str() == deleted
            }
            Backing::Image => {
                let backing = match self.mounter.loop_backing_file(&entry.source) {
                    Ok(Some(file)) => file,
                    Ok(None) => return false,
                    Err(e) => {
                        tracing::warn!(error = %crate::error::chain(&e), "cannot read a loop device");
                        return false;
                    }
                };
                let expected = self.volume_path(id);
                let mut deleted = OsString::from(expected.as_os_str());
                deleted.push(" (deleted)");
                backing == expected || backing.as_os_str() == deleted
            }
        }
    }

    /// The real mount table of this plugin's mount namespace. Reading it costs more than any
    /// mount call: an RPC looks paths up through a [`MountView`], which reads it at most once.
    pub fn mounts(&self) -> Result<Vec<MountEntry>, Status> {
        self.mounter.mounts().map_err(|e| internal(&e))
    }

    /// A fresh view of what is mounted, for lookups concerning volume `id`.
    pub fn view<'p>(&'p self, id: &'p str) -> MountView<'p> {
        MountView {
            plugin: self,
            id,
            volume_dir: None,
            table: None,
        }
    }

    /// What `table` (from [`mounts`](Self::mounts)) has mounted at `path` (the top-most mount).
    fn mount_in(&self, table: &[MountEntry], path: &Path, id: &str) -> MountAt {
        match berth_sys::top_mount_at(table, path) {
            None => MountAt::Nothing,
            Some(e) if self.is_volume_mount(e, id) => MountAt::Volume,
            Some(e) => MountAt::Other(e.clone()),
        }
    }

    /// Every mount of volume `id` in this plugin's mount namespace.
    pub fn volume_mounts(&self, id: &str) -> Result<Vec<MountEntry>, Status> {
        let mounts = self.mounts()?;
        Ok(mounts
            .into_iter()
            .filter(|e| self.is_volume_mount(e, id))
            .collect())
    }
}

/// The topology segments of node `node_id`.
pub(crate) fn node_topology(node_id: &str) -> HashMap<String, String> {
    HashMap::from([(TOPOLOGY_KEY.to_owned(), node_id.to_owned())])
}

/// Runs blocking filesystem work on the blocking pool; its errors become `INTERNAL`.
pub(crate) async fn blocking<T, E>(
    work: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, Status>
where
    T: Send + 'static,
    E: std::error::Error + Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Status::internal(format!("filesystem task failed: {e}")))?
        .map_err(|e| internal(&e))
}

/// Where `dir` lives inside its filesystem, as mountinfo roots show it: the root of the mount
/// containing `dir`, joined with the rest of the path.
fn fs_root_of(mounts: &[MountEntry], dir: &Path) -> PathBuf {
    match berth_sys::containing_mount(mounts, dir) {
        Some(e) => e.root.join(dir.strip_prefix(&e.mount_point).unwrap_or(dir)),
        None => dir.to_path_buf(),
    }
}

/// A plugin over `dir` (state in `dir/state`) with the given mounter, for unit tests.
#[cfg(test)]
pub(crate) fn test_plugin(
    dir: &Path,
    mounter: Arc<dyn Mounter>,
    stage: bool,
    attach: bool,
) -> Arc<Plugin> {
    Arc::new(unshared_test_plugin(dir, mounter, stage, attach))
}

/// [`test_plugin`] with image backing (`--backing=image`), staging on, attach off.
#[cfg(test)]
pub(crate) fn image_test_plugin(dir: &Path, mounter: Arc<dyn Mounter>) -> Arc<Plugin> {
    let mut plugin = unshared_test_plugin(dir, mounter, true, false);
    plugin.settings.backing = Backing::Image;
    Arc::new(plugin)
}

/// [`test_plugin`] in strict mode (`--strict`).
#[cfg(test)]
pub(crate) fn strict_test_plugin(
    dir: &Path,
    mounter: Arc<dyn Mounter>,
    stage: bool,
    attach: bool,
) -> Arc<Plugin> {
    let mut plugin = unshared_test_plugin(dir, mounter, stage, attach);
    plugin.settings.strict = true;
    Arc::new(plugin)
}

/// A plugin with `--shared` over `dir/state`, as node `node_id` (recorded in the state), with
/// staging and attach on, for unit tests. Several of them share one state directory.
#[cfg(test)]
pub(crate) async fn shared_test_plugin(
    dir: &Path,
    node_id: &str,
    mounter: Arc<dyn Mounter>,
) -> Arc<Plugin> {
    let statedir = dir.join("state");
    let node_dir = crate::shared::create_node_dir(&statedir, node_id).expect("node dir");
    for sub in ["volumes", "snapshots"] {
        std::fs::create_dir_all(statedir.join(sub)).expect("state dirs");
    }
    let settings = Settings {
        driver_name: "test.csi.berth.dev".to_owned(),
        node_id: node_id.to_owned(),
        statedir: statedir.clone(),
        capacity: None,
        max_volume_size: None,
        max_volumes_per_node: 0,
        stage: true,
        attach: true,
        backing: Backing::Dir,
        strict: false,
        shared: true,
        mode: Mode::All,
    };
    let store = Store::load_shared(
        &statedir.join("state.json"),
        &statedir.join(crate::state::STATE_LOCK_FILE),
    )
    .expect("store");
    crate::shared::register_node(&store, node_id)
        .await
        .expect("register");
    let faults = Faults::load(Vec::new(), &node_dir).expect("faults");
    let node = test_node_state(&node_dir, &store).await;
    let plugin = Plugin::new(
        settings,
        store,
        node,
        mounter,
        faults,
        CancellationToken::new(),
    );
    Arc::new(plugin.expect("plugin"))
}

#[cfg(test)]
fn unshared_test_plugin(
    dir: &Path,
    mounter: Arc<dyn Mounter>,
    stage: bool,
    attach: bool,
) -> Plugin {
    let statedir = dir.join("state");
    for sub in ["volumes", "snapshots"] {
        std::fs::create_dir_all(statedir.join(sub)).expect("state dirs");
    }
    let settings = Settings {
        driver_name: "test.csi.berth.dev".to_owned(),
        node_id: "node-1".to_owned(),
        statedir: statedir.clone(),
        capacity: None,
        max_volume_size: None,
        max_volumes_per_node: 0,
        stage,
        attach,
        backing: Backing::Dir,
        strict: false,
        shared: false,
        mode: Mode::All,
    };
    let store = Store::load(&statedir.join("state.json")).expect("store");
    let faults = Faults::load(Vec::new(), &statedir).expect("faults");
    let node = NodeState::load(
        &statedir.join(crate::nodestate::NODE_FILE),
        Default::default(),
        |_| true,
    )
    .expect("node records");
    let plugin = Plugin::new(
        settings,
        store,
        node,
        mounter,
        faults,
        CancellationToken::new(),
    );
    plugin.expect("plugin")
}

/// The node records of a plugin over `store`, in `dir`, as [`crate::run`] loads them.
#[cfg(test)]
async fn test_node_state(dir: &Path, store: &Store) -> NodeState {
    let (seed, volumes) = store
        .read(crate::nodestate::seed_and_volumes)
        .await
        .expect("state");
    NodeState::load(&dir.join(crate::nodestate::NODE_FILE), seed, |id| {
        volumes.contains(id)
    })
    .expect("node records")
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use berth_csi::pb;
    use berth_sys::RecordingMounter;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_answer_honours_the_deadline_and_the_operation_still_completes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = test_plugin(dir.path(), Arc::new(RecordingMounter::new()), true, true);
        let done = Arc::new(AtomicBool::new(false));
        let mut request = Request::new(pb::ProbeRequest {});
        request
            .metadata_mut()
            .insert("grpc-timeout", "100m".parse().expect("ascii"));
        let finished = Arc::clone(&done);
        let start = Instant::now();
        let answer = p
            .rpc(Rpc::Probe, "", request, move |_, _| async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                finished.store(true, Ordering::SeqCst);
                Ok(())
            })
            .await;
        assert_eq!(
            answer.map(|_| ()).unwrap_err().code(),
            tonic::Code::DeadlineExceeded
        );
        assert_eq!(start.elapsed(), Duration::from_millis(100));
        assert!(!done.load(Ordering::SeqCst));
        p.tasks.close();
        p.tasks.wait().await;
        assert!(
            done.load(Ordering::SeqCst),
            "the operation ran to completion"
        );
    }

    #[tokio::test]
    async fn an_operation_that_does_not_wait_needs_no_task_and_one_that_waits_outlives_its_caller()
    {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = test_plugin(dir.path(), Arc::new(RecordingMounter::new()), true, true);
        let answer = p
            .rpc(
                Rpc::Probe,
                "",
                Request::new(pb::ProbeRequest {}),
                |_, _| async { Ok(7) },
            )
            .await
            .expect("answer");
        assert_eq!(answer.into_inner(), 7);
        assert!(p.tasks.is_empty(), "answered without a task");

        // An operation that has to wait: its caller goes away after the first poll.
        let gate = Arc::new(tokio::sync::Notify::new());
        let done = Arc::new(AtomicBool::new(false));
        let (opened, finished) = (Arc::clone(&gate), Arc::clone(&done));
        let mut call = Box::pin(p.rpc(
            Rpc::NodeStageVolume,
            "v1",
            Request::new(pb::ProbeRequest {}),
            move |_, _| async move {
                opened.notified().await;
                finished.store(true, Ordering::SeqCst);
                Ok(())
            },
        ));
        assert!(futures::poll!(&mut call).is_pending());
        assert_eq!(p.tasks.len(), 1, "handed to a tracked task");
        drop(call);
        gate.notify_one();
        p.tasks.close();
        p.tasks.wait().await;
        assert!(
            done.load(Ordering::SeqCst),
            "the operation ran to completion"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_call_log_gets_the_code_the_caller_gets() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log_path = dir.path().join("calls");
        let log = CallLog::open(&log_path).expect("call log");
        let p = Arc::new(
            unshared_test_plugin(dir.path(), Arc::new(RecordingMounter::new()), true, true)
                .with_call_log(Some(log)),
        );
        let mut request = Request::new(pb::ProbeRequest {});
        request
            .metadata_mut()
            .insert("grpc-timeout", "100m".parse().expect("ascii"));
        let late = p
            .rpc(Rpc::Probe, "", request, |_, _| async {
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok(())
            })
            .await;
        assert!(late.is_err());
        let request = Request::new(pb::ProbeRequest {});
        let failed: Result<Response<()>, Status> = p
            .rpc(Rpc::NodeStageVolume, "v1", request, |_, _| async {
                Err(Status::not_found("no"))
            })
            .await;
        assert!(failed.is_err());
        let lines = std::fs::read_to_string(&log_path).expect("read");
        assert_eq!(
            lines,
            "Probe - DEADLINE_EXCEEDED\nNodeStageVolume v1 NOT_FOUND\n"
        );
    }

    #[test]
    fn grpc_timeouts() {
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(
            parse_grpc_timeout("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        for bad in ["", "m", "123456789S", "12x", "-1S", "1.5S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    fn entry(id: u32, parent: u32, root: &str, point: &str) -> MountEntry {
        MountEntry {
            mount_id: id,
            parent_id: parent,
            root: root.into(),
            mount_point: point.into(),
            read_only: false,
            shared: false,
            fs_type: "ext4".into(),
            source: "/dev/x".into(),
            super_options: "rw".into(),
        }
    }

    #[test]
    fn volume_dirs_are_found_inside_bind_mounted_filesystems() {
        let mounts = vec![
            entry(1, 0, "/", "/"),
            entry(2, 1, "/", "/tmp"),
            entry(3, 2, "/srv/state", "/tmp/state"),
        ];
        assert_eq!(
            fs_root_of(&mounts, Path::new("/var/lib/x/volumes")),
            Path::new("/var/lib/x/volumes")
        );
        assert_eq!(
            fs_root_of(&mounts, Path::new("/tmp/a/volumes")),
            Path::new("/a/volumes")
        );
        assert_eq!(
            fs_root_of(&mounts, Path::new("/tmp/state/volumes")),
            Path::new("/srv/state/volumes")
        );
    }
}
