//! Test support (always compiled, for other crates' tests too): an in-process registrar that
//! drops a registration socket into a directory, as `node-driver-registrar` would.
//!
//! Not for production use: it panics on setup failures.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::{
    CSI_PLUGIN_TYPE, pb,
    pb::registration_server::{Registration, RegistrationServer},
};

/// How long [`FakeRegistrar::remove`] waits for in-flight calls before stopping the server.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// What a [`FakeRegistrar`] answers to `GetInfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginInfoSpec {
    /// `PluginInfo.type` (`"CSIPlugin"` for a CSI driver).
    pub plugin_type: String,
    /// `PluginInfo.name`, the CSI driver name.
    pub name: String,
    /// `PluginInfo.endpoint`, the CSI socket (`/abs/path` or `unix:///abs/path`).
    pub endpoint: String,
    /// `PluginInfo.supported_versions`.
    pub versions: Vec<String>,
}

impl PluginInfoSpec {
    /// A CSI driver `name` at `endpoint`, speaking CSI `1.0.0`: what node-driver-registrar sends.
    pub fn csi(name: impl Into<String>, endpoint: impl Into<String>) -> Self {
        Self {
            plugin_type: CSI_PLUGIN_TYPE.into(),
            name: name.into(),
            endpoint: endpoint.into(),
            versions: vec!["1.0.0".into()],
        }
    }
}

/// What the fake has been asked.
#[derive(Debug, Default)]
struct Recorded {
    info_calls: AtomicUsize,
    statuses: Mutex<Vec<(bool, String)>>,
}

struct Service {
    info: PluginInfoSpec,
    recorded: Arc<Recorded>,
}

#[tonic::async_trait]
impl Registration for Service {
    async fn get_info(
        &self,
        _: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::PluginInfo>, Status> {
        self.recorded.info_calls.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(pb::PluginInfo {
            r#type: self.info.plugin_type.clone(),
            name: self.info.name.clone(),
            endpoint: self.info.endpoint.clone(),
            supported_versions: self.info.versions.clone(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<pb::RegistrationStatus>,
    ) -> Result<Response<pb::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        self.recorded
            .statuses
            .lock()
            .expect("statuses lock")
            .push((status.plugin_registered, status.error));
        Ok(Response::new(pb::RegistrationStatusResponse {}))
    }
}

/// A registrar serving the registration API on `<dir>/<file_name>`, in this process.
///
/// The socket is listening when [`serve`](FakeRegistrar::serve) returns.
/// [`remove`](FakeRegistrar::remove), or dropping it, removes the socket and stops the server.
#[derive(Debug)]
pub struct FakeRegistrar {
    socket: PathBuf,
    recorded: Arc<Recorded>,
    stop: CancellationToken,
    server: Option<JoinHandle<()>>,
}

impl FakeRegistrar {
    /// Binds `<dir>/<file_name>` (replacing whatever is there, as node-driver-registrar does)
    /// and serves `info` on it.
    ///
    /// # Panics
    /// Outside a Tokio runtime, or when the socket cannot be bound.
    pub fn serve(dir: &Path, file_name: &str, info: PluginInfoSpec) -> Self {
        let socket = dir.join(file_name);
        match std::fs::remove_file(&socket) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("cannot remove {} before binding: {e}", socket.display()),
        }
        let listener = tokio::net::UnixListener::bind(&socket)
            .unwrap_or_else(|e| panic!("cannot bind {}: {e}", socket.display()));
        let recorded = Arc::new(Recorded::default());
        let stop = CancellationToken::new();
        let service = Service {
            info,
            recorded: Arc::clone(&recorded),
        };
        let server = tokio::spawn({
            let stop = stop.clone();
            let socket = socket.clone();
            async move {
                let served = tonic::transport::Server::builder()
                    .add_service(RegistrationServer::new(service))
                    .serve_with_incoming_shutdown(
                        UnixListenerStream::new(listener),
                        stop.cancelled_owned(),
                    )
                    .await;
                if let Err(e) = served {
                    tracing::warn!(socket = %socket.display(), error = %e, "fake registrar failed");
                }
            }
        });
        Self {
            socket,
            recorded,
            stop,
            server: Some(server),
        }
    }

    /// The registration socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Every `NotifyRegistrationStatus` received, in order: (`plugin_registered`, `error`).
    pub fn statuses(&self) -> Vec<(bool, String)> {
        self.recorded
            .statuses
            .lock()
            .expect("statuses lock")
            .clone()
    }

    /// How many `GetInfo` calls were answered.
    pub fn info_calls(&self) -> usize {
        self.recorded.info_calls.load(Ordering::SeqCst)
    }

    /// Removes the socket, then stops the server and waits for it (in-flight calls get a
    /// few seconds to finish).
    pub async fn remove(mut self) {
        self.unlink();
        self.stop.cancel();
        if let Some(mut server) = self.server.take()
            && tokio::time::timeout(STOP_GRACE, &mut server).await.is_err()
        {
            server.abort();
            let _ = server.await;
        }
    }

    fn unlink(&self) {
        match std::fs::remove_file(&self.socket) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(socket = %self.socket.display(), error = %e, "cannot remove"),
        }
    }
}

impl Drop for FakeRegistrar {
    /// Removes the socket and stops the server without waiting for it.
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            self.unlink();
            self.stop.cancel();
            server.abort();
        }
    }
}
