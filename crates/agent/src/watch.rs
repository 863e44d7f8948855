//! Wakes health loops when a plugin socket appears or disappears (inotify on the socket's
//! directory), so a plugin is checked the moment it starts, not at the next interval.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicBool, Ordering},
    },
};

use notify::{RecursiveMode, Watcher as _};
use tokio::sync::Notify;

/// One inotify instance for every socket the agent cares about.
pub struct SocketWatcher {
    inner: Arc<Mutex<Interest>>,
    watcher: Mutex<Option<notify::RecommendedWatcher>>,
}

impl std::fmt::Debug for SocketWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketWatcher").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Interest {
    by_path: HashMap<PathBuf, Vec<Weak<Notify>>>,
    /// Per directory: whether it is being watched. Shared with every [`SocketWatch`] on a
    /// socket in it, so that a loop asks without a lock.
    dirs: HashMap<PathBuf, Arc<AtomicBool>>,
}

/// One caller's interest in a socket: notified when the socket file is created or removed.
#[derive(Debug)]
pub struct SocketWatch {
    notify: Arc<Notify>,
    watching: Arc<AtomicBool>,
}

impl SocketWatch {
    /// Resolves at the next creation or removal of the socket file (or at once, if one
    /// happened since the last wake-up).
    pub async fn changed(&self) {
        self.notify.notified().await;
    }

    /// Whether the socket's directory is being watched now. Once it is not (it did not exist,
    /// or it went away), nothing is reported until [`SocketWatcher::watch`] is called again.
    pub fn is_watching(&self) -> bool {
        self.watching.load(Ordering::Acquire)
    }
}

impl Default for SocketWatcher {
    fn default() -> Self {
        Self::new()
    }
}

impl SocketWatcher {
    /// A watcher; if inotify is unavailable, health loops fall back to their interval.
    pub fn new() -> Self {
        let inner = Arc::new(Mutex::new(Interest::default()));
        let weak = Arc::downgrade(&inner);
        let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            let (Ok(event), Some(inner)) = (res, weak.upgrade()) else {
                return;
            };
            // Only a socket appearing or going away matters (not chmod, not writes).
            if !matches!(
                event.kind,
                notify::EventKind::Create(_) | notify::EventKind::Remove(_)
            ) {
                return;
            }
            let interest = inner.lock().unwrap_or_else(|p| p.into_inner());
            for path in &event.paths {
                // A watched directory that went away must be watched again once it is back.
                if let Some(watched) = interest.dirs.get(path) {
                    watched.store(false, Ordering::Release);
                }
                for n in interest
                    .by_path
                    .get(path)
                    .into_iter()
                    .flatten()
                    .filter_map(Weak::upgrade)
                {
                    n.notify_one();
                }
            }
        });
        let watcher = match watcher {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch plugin sockets; health checks run on their interval only");
                None
            }
        };
        Self {
            inner,
            watcher: Mutex::new(watcher),
        }
    }

    /// A handle that is notified whenever `socket` is created or removed. Keep it alive as long
    /// as you want the wake-ups. Call again with it (cheap) once it is not watching: the
    /// directory may have appeared since.
    pub fn watch(&self, socket: &Path, existing: Option<&SocketWatch>) -> SocketWatch {
        let notify = existing.map_or_else(Arc::default, |w| Arc::clone(&w.notify));
        let dir = socket.parent().map(Path::to_path_buf).unwrap_or_default();
        let watching = {
            let mut interest = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let entry = interest.by_path.entry(socket.to_path_buf()).or_default();
            entry.retain(|w| w.strong_count() > 0);
            if !entry
                .iter()
                .any(|w| w.upgrade().is_some_and(|n| Arc::ptr_eq(&n, &notify)))
            {
                entry.push(Arc::downgrade(&notify));
            }
            Arc::clone(interest.dirs.entry(dir.clone()).or_default())
        };
        // Not under the interest lock: adding a watch waits for notify's event thread, which
        // may be delivering an event to the callback, which takes that lock.
        if !watching.load(Ordering::Acquire) {
            let ok = self
                .watcher
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_mut()
                .is_some_and(|w| w.watch(&dir, RecursiveMode::NonRecursive).is_ok());
            watching.store(ok, Ordering::Release);
        }
        SocketWatch { notify, watching }
    }
}
