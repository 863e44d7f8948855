//! The plugin's own socket. Connections from every socket it has bound go to one gRPC server,
//! so the socket can be re-created (after kubelet removed it) without stopping the service.

use std::{
    io,
    os::unix::fs::{FileTypeExt as _, MetadataExt as _},
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use tokio::{
    net::{UnixListener, UnixStream},
    sync::mpsc,
};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

/// `(device, inode)` of a file: tells a re-created file from the one seen before.
pub type FileId = (u64, u64);

/// The id of the socket at `path`, if a socket is there.
pub fn socket_id(path: &Path) -> Option<FileId> {
    std::fs::symlink_metadata(path)
        .ok()
        .filter(|m| m.file_type().is_socket())
        .map(|m| (m.dev(), m.ino()))
}

#[derive(Debug)]
pub struct Listener {
    path: PathBuf,
    conns: mpsc::Sender<io::Result<UnixStream>>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
    /// The acceptor of the socket bound last, and that socket's id.
    current: Option<(CancellationToken, FileId)>,
}

impl Listener {
    pub fn new(
        path: PathBuf,
        conns: mpsc::Sender<io::Result<UnixStream>>,
        tracker: TaskTracker,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            path,
            conns,
            tracker,
            shutdown,
            current: None,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the socket at the path is still the one bound last.
    pub fn is_current(&self) -> bool {
        self.current
            .as_ref()
            .is_some_and(|(_, id)| socket_id(&self.path) == Some(*id))
    }

    /// (Re-)creates the socket: stops accepting on the previous one, removes whatever socket
    /// is at the path (never another kind of file), binds and accepts.
    pub fn bind(&mut self) -> anyhow::Result<()> {
        if let Some((stop, _)) = self.current.take() {
            stop.cancel();
        }
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) if m.file_type().is_socket() => std::fs::remove_file(&self.path)
                .with_context(|| format!("removing the old socket {}", self.path.display()))?,
            Ok(_) => anyhow::bail!("{} exists and is not a socket", self.path.display()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(e).with_context(|| format!("inspecting {}", self.path.display()));
            }
        }
        let listener = UnixListener::bind(&self.path)
            .with_context(|| format!("binding {}", self.path.display()))?;
        let id = socket_id(&self.path)
            .with_context(|| format!("{} vanished right after bind", self.path.display()))?;
        let stop = self.shutdown.child_token();
        self.current = Some((stop.clone(), id));
        let conns = self.conns.clone();
        self.tracker.spawn(async move {
            loop {
                let conn = tokio::select! {
                    () = stop.cancelled() => return,
                    c = listener.accept() => c.map(|(s, _)| s),
                };
                if conns.send(conn).await.is_err() {
                    return;
                }
            }
        });
        tracing::info!(socket = %self.path.display(), "serving DevicePlugin");
        Ok(())
    }

    /// Stops accepting and removes the socket if it is still the one bound last.
    pub fn close(&mut self) {
        if self.is_current() {
            let _ = std::fs::remove_file(&self.path);
        }
        if let Some((stop, _)) = self.current.take() {
            stop.cancel();
        }
    }
}
