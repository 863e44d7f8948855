//! The watcher: one loop owns what is known about the directory; registration work for each
//! socket runs in tracked tasks and reports back to it.

use std::{
    fs::{self, DirBuilder},
    io,
    os::unix::fs::{DirBuilderExt as _, MetadataExt as _},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use notify::{EventKind, RecursiveMode, Watcher as _};
use tokio::{
    sync::mpsc,
    time::{Instant, MissedTickBehavior},
};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::{
    DiscoveredPlugin, RegDirError, Sink,
    registrar::Registrar,
    slots::{Job, Outcome, Slots, socket_at},
};

/// Deadline of each registration RPC (connect + `GetInfo`, then `NotifyRegistrationStatus`)
/// unless [`RegistrationDir::rpc_timeout`] says otherwise.
pub const DEFAULT_RPC_TIMEOUT: Duration = Duration::from_secs(5);

/// The shortest rescan interval; shorter ones are raised to it.
pub const MIN_RESCAN_INTERVAL: Duration = Duration::from_millis(10);

/// Filesystem events waiting for the loop; beyond that, the next rescan covers them.
const EVENT_QUEUE: usize = 1024;

/// A kubelet-style plugin registration directory: registrars (such as `node-driver-registrar`)
/// place a unix socket in it, and berth registers the CSI plugin each one announces.
///
/// Build it with [`RegistrationDir::new`], then [`run`](RegistrationDir::run) it.
#[derive(Debug, Clone)]
pub struct RegistrationDir {
    dir: PathBuf,
    rescan_interval: Duration,
    rpc_timeout: Duration,
    inotify: bool,
}

impl RegistrationDir {
    /// Watches `dir` (made absolute against the current directory when `run` starts) with
    /// inotify, and lists it again every `rescan_interval` (at least [`MIN_RESCAN_INTERVAL`]) to
    /// catch anything the events missed.
    pub fn new(dir: PathBuf, rescan_interval: Duration) -> Self {
        Self {
            dir,
            rescan_interval: rescan_interval.max(MIN_RESCAN_INTERVAL),
            rpc_timeout: DEFAULT_RPC_TIMEOUT,
            inotify: true,
        }
    }

    /// Sets the deadline of each registration RPC (default [`DEFAULT_RPC_TIMEOUT`]). A socket
    /// that does not answer `GetInfo` in time is skipped until it changes.
    pub fn rpc_timeout(mut self, timeout: Duration) -> Self {
        self.rpc_timeout = timeout;
        self
    }

    /// With `false`, no inotify watch is set: changes are seen at the next rescan only (for
    /// filesystems where inotify sees nothing, or to bound the load). Default `true`.
    pub fn inotify(mut self, on: bool) -> Self {
        self.inotify = on;
        self
    }

    /// The directory, as given.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Creates the directory if it is missing (mode 0700, parents too; an existing directory
    /// keeps its mode), registers the sockets already in it, then follows it until `shutdown`
    /// is cancelled.
    ///
    /// For each socket whose name does not start with `.`: `GetInfo` within the RPC deadline,
    /// the checks of [`DiscoveredPlugin::from_info`], [`Sink::register`], then
    /// `NotifyRegistrationStatus` with the verdict (and the reason when refused). A socket that
    /// fails any step is logged with its path and the reason, and tried again only once it is
    /// replaced. When a registered socket is removed or replaced, [`Sink::deregister`] gets the
    /// same plugin. Anything that is not a socket (symlinks included) and subdirectories are
    /// ignored.
    ///
    /// Returns `Ok` after `shutdown`: RPCs in flight are abandoned at once, sink calls in flight
    /// are awaited, and no task is left behind. Registered plugins are not deregistered at
    /// shutdown. Errors only when the directory cannot be created, listed or watched at start.
    /// (Dropping the future instead of cancelling `shutdown` also abandons the RPCs, but does
    /// not wait for sink calls in flight.)
    pub async fn run<S: Sink>(
        self,
        sink: Arc<S>,
        shutdown: CancellationToken,
    ) -> Result<(), RegDirError> {
        let dir = std::path::absolute(&self.dir).map_err(|source| RegDirError::CreateDir {
            path: self.dir.clone(),
            source,
        })?;
        ensure_dir(&dir)?;

        let (hint_tx, mut hint_rx) = mpsc::channel(EVENT_QUEUE);
        let overflow = Arc::new(AtomicBool::new(false));
        let watcher = if self.inotify {
            Some(watch(&dir, hint_tx.clone(), Arc::clone(&overflow))?)
        } else {
            None
        };
        let watched = dir_id(&dir);
        // Listed after the watch is set, so nothing created in between is missed.
        let listed = list(&dir).map_err(|source| RegDirError::ReadDir {
            path: dir.clone(),
            source,
        })?;

        // Jobs stop with the token, and also if this future is dropped instead.
        let jobs_stop = shutdown.child_token();
        let _stop_jobs_on_drop = jobs_stop.clone().drop_guard();
        let (done_tx, mut done_rx) = mpsc::unbounded_channel();
        let mut owner = Owner {
            dir,
            watcher,
            watched,
            slots: Slots::default(),
            tracker: TaskTracker::new(),
            done: done_tx,
            sink,
            ctx: Arc::new(JobCtx {
                rpc_timeout: self.rpc_timeout,
                shutdown: jobs_stop,
            }),
        };
        tracing::info!(
            dir = %owner.dir.display(),
            entries = listed.len(),
            inotify = self.inotify,
            rescan_interval = ?self.rescan_interval,
            "watching plugin registration directory"
        );
        for path in listed {
            owner.reconcile(&path);
        }

        let mut ticker =
            tokio::time::interval_at(Instant::now() + self.rescan_interval, self.rescan_interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                Some((path, outcome)) = done_rx.recv() => {
                    owner.slots.complete(&path, outcome);
                    owner.reconcile(&path);
                }
                Some(hint) = hint_rx.recv() => {
                    if overflow.swap(false, Ordering::Relaxed) {
                        owner.rescan("too many filesystem events queued");
                    }
                    match hint {
                        Hint::Paths(paths) => owner.on_paths(paths),
                        Hint::Rescan(why) => owner.rescan(&why),
                    }
                }
                _ = ticker.tick() => owner.rescan(""),
            }
        }

        drop(owner.watcher.take());
        owner.tracker.close();
        owner.tracker.wait().await;
        tracing::info!(dir = %owner.dir.display(), "stopped watching plugin registration directory");
        Ok(())
    }
}

/// What the filesystem watcher tells the loop.
#[derive(Debug)]
enum Hint {
    /// These paths may have changed.
    Paths(Vec<PathBuf>),
    /// Events were lost or the watch broke: list the directory again.
    Rescan(String),
}

/// What a job needs besides the sink.
#[derive(Debug)]
struct JobCtx {
    rpc_timeout: Duration,
    shutdown: CancellationToken,
}

/// The loop's state; the only writer of `slots`.
struct Owner<S> {
    dir: PathBuf,
    /// The inotify watch, unless disabled.
    watcher: Option<notify::RecommendedWatcher>,
    /// The directory (device, inode) the watch was set on.
    watched: Option<(u64, u64)>,
    slots: Slots,
    tracker: TaskTracker,
    done: mpsc::UnboundedSender<(PathBuf, Outcome)>,
    sink: Arc<S>,
    ctx: Arc<JobCtx>,
}

impl<S: Sink> Owner<S> {
    /// Looks at one path again and starts its job if one is due.
    fn reconcile(&mut self, path: &Path) {
        let Some(job) = self.slots.reconcile(path, socket_at(path)) else {
            return;
        };
        let (sink, ctx, done) = (
            Arc::clone(&self.sink),
            Arc::clone(&self.ctx),
            self.done.clone(),
        );
        let path = path.to_path_buf();
        self.tracker.spawn(async move {
            let outcome = run_job(&ctx, &*sink, &path, job).await;
            // The loop is gone only at shutdown, when the outcome no longer matters.
            let _ = done.send((path, outcome));
        });
    }

    fn on_paths(&mut self, paths: Vec<PathBuf>) {
        for path in paths {
            if path == self.dir {
                // Removed, moved or changed: the watch may be gone with it (notify drops the
                // watch after a removal event, so this runs after that).
                self.watched = None;
                self.rescan("the directory itself changed");
            } else if path.parent() == Some(self.dir.as_path()) {
                self.reconcile(&path);
            }
        }
    }

    /// Looks at every listed and every known path again. A missing directory is created again,
    /// and a directory that is not the one watched is watched again.
    fn rescan(&mut self, why: &str) {
        if !why.is_empty() {
            tracing::debug!(dir = %self.dir.display(), why, "rescanning");
        }
        if dir_id(&self.dir).is_none() {
            tracing::warn!(dir = %self.dir.display(), "the registration directory is gone; creating it again");
            if let Err(e) = ensure_dir(&self.dir) {
                tracing::warn!(error = %e, "registration directory unusable; trying again at the next rescan");
            }
        }
        let now = dir_id(&self.dir);
        if now.is_some() && now != self.watched {
            self.rewatch(now);
        }
        let listed = list(&self.dir).unwrap_or_else(|e| {
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot list the registration directory");
            Vec::new()
        });
        let mut paths: Vec<PathBuf> = self.slots.paths().map(Path::to_path_buf).collect();
        paths.extend(listed);
        paths.sort();
        paths.dedup();
        for path in paths {
            self.reconcile(&path);
        }
    }

    /// Sets the inotify watch again, on the directory now at the path (`id`).
    fn rewatch(&mut self, id: Option<(u64, u64)>) {
        let Some(watcher) = &mut self.watcher else {
            return;
        };
        // Gone already when the old directory was removed; that error means nothing.
        let _ = watcher.unwatch(&self.dir);
        match watcher.watch(&self.dir, RecursiveMode::NonRecursive) {
            Ok(()) => {
                tracing::info!(dir = %self.dir.display(), "watching the registration directory again");
                self.watched = id;
            }
            Err(e) => tracing::warn!(
                dir = %self.dir.display(),
                error = %e,
                "cannot watch the registration directory; relying on rescans"
            ),
        }
    }
}

/// Deregisters, then registers, as the job says.
async fn run_job<S: Sink>(ctx: &JobCtx, sink: &S, path: &Path, job: Job) -> Outcome {
    if let Some(plugin) = &job.deregister {
        sink.deregister(plugin).await;
        tracing::info!(
            socket = %path.display(),
            plugin = %plugin.name,
            "plugin deregistered: its registration socket was removed or replaced"
        );
    }
    let Some(id) = job.register else {
        return Outcome::Gone;
    };
    match register(ctx, sink, path).await {
        Some(plugin) => Outcome::Registered { id, plugin },
        None => Outcome::Skipped { id },
    }
}

/// GetInfo, checks, sink, NotifyRegistrationStatus. `Some` when the sink took the plugin.
async fn register<S: Sink>(ctx: &JobCtx, sink: &S, path: &Path) -> Option<DiscoveredPlugin> {
    let asked = tokio::select! {
        () = ctx.shutdown.cancelled() => return None,
        asked = Registrar::get_info(path, ctx.rpc_timeout) => asked,
    };
    let (mut registrar, info) = match asked {
        Ok(asked) => asked,
        Err(e) => {
            tracing::warn!(
                socket = %path.display(),
                reason = %e,
                "skipping socket: no usable registrar on it; tried again once it is replaced"
            );
            return None;
        }
    };
    let (registered, verdict) = match DiscoveredPlugin::from_info(&info, path) {
        Err(e) => {
            tracing::warn!(
                socket = %path.display(),
                plugin = ?info.name.chars().take(64).collect::<String>(),
                reason = %e,
                "plugin refused: it fails berth's checks"
            );
            (None, Err(e.to_string()))
        }
        Ok(plugin) => match sink.register(&plugin).await {
            Ok(()) => {
                tracing::info!(
                    socket = %path.display(),
                    plugin = %plugin.name,
                    endpoint = %plugin.endpoint.display(),
                    versions = ?plugin.versions,
                    "plugin registered"
                );
                (Some(plugin), Ok(()))
            }
            Err(reason) => {
                tracing::warn!(
                    socket = %path.display(),
                    plugin = %plugin.name,
                    reason = %reason,
                    "plugin refused by the agent"
                );
                (None, Err(reason))
            }
        },
    };
    let (ok, error) = match verdict {
        Ok(()) => (true, String::new()),
        Err(reason) => (false, reason),
    };
    let notified = tokio::select! {
        () = ctx.shutdown.cancelled() => return registered,
        notified = registrar.notify(ok, error) => notified,
    };
    if let Err(e) = notified {
        tracing::warn!(
            socket = %path.display(),
            error = %e,
            "could not tell the registrar its registration status"
        );
    }
    registered
}

/// Creates `dir` (and its parents) with mode 0700 if missing; checks it is a directory.
fn ensure_dir(dir: &Path) -> Result<(), RegDirError> {
    let err = |source| RegDirError::CreateDir {
        path: dir.to_path_buf(),
        source,
    };
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(err)?;
    if !fs::metadata(dir).map_err(err)?.is_dir() {
        return Err(err(io::Error::from(io::ErrorKind::NotADirectory)));
    }
    Ok(())
}

/// The (device, inode) of the directory at `dir`, if one is there.
fn dir_id(dir: &Path) -> Option<(u64, u64)> {
    fs::metadata(dir)
        .ok()
        .filter(fs::Metadata::is_dir)
        .map(|m| (m.dev(), m.ino()))
}

/// Every entry of `dir` (filtered later, by [`socket_at`]).
fn list(dir: &Path) -> io::Result<Vec<PathBuf>> {
    fs::read_dir(dir)?
        .map(|entry| entry.map(|e| e.path()))
        .collect()
}

/// Watches `dir` (not its subdirectories); events become hints for the loop. When the queue
/// is full, `overflow` is raised and the loop rescans.
fn watch(
    dir: &Path,
    hints: mpsc::Sender<Hint>,
    overflow: Arc<AtomicBool>,
) -> Result<notify::RecommendedWatcher, RegDirError> {
    let err = |source| RegDirError::Watch {
        path: dir.to_path_buf(),
        source,
    };
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let hint = match event {
            Ok(event) if event.need_rescan() => Hint::Rescan("the kernel dropped events".into()),
            // Opening and closing files changes nothing here.
            Ok(event) if matches!(event.kind, EventKind::Access(_)) => return,
            Ok(event) => Hint::Paths(event.paths),
            Err(e) => Hint::Rescan(format!("watch error: {e}")),
        };
        if let Err(mpsc::error::TrySendError::Full(_)) = hints.try_send(hint) {
            overflow.store(true, Ordering::Relaxed);
        }
    })
    .map_err(err)?;
    watcher
        .watch(dir, RecursiveMode::NonRecursive)
        .map_err(err)?;
    Ok(watcher)
}
