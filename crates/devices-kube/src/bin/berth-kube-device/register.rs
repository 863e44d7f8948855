//! Registering with the agent as Kubernetes plugins do: `Register` on
//! `<kubelet-dir>/kubelet.sock` once it exists, again whenever `kubelet.sock` is re-created,
//! and after re-creating the plugin's own socket when it was deleted.

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context as _;
use berth_devices_kube::proto::{
    VERSION,
    v1beta1::{DevicePluginOptions, RegisterRequest, registration_client::RegistrationClient},
};
use notify::Watcher as _;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Code;

use crate::{
    calllog::CallLog,
    listen::{FileId, Listener, socket_id},
    state::State,
};

/// How often the sockets are checked when no filesystem event comes.
const CHECK_PERIOD: Duration = Duration::from_millis(250);

/// Deadline of one `Register`.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug)]
pub struct Registrar {
    pub kubelet_socket: PathBuf,
    pub endpoint: String,
    pub resource: String,
    pub options: DevicePluginOptions,
    /// Serve only (a test switch: the agent must find the plugin by re-dialing).
    pub no_register: bool,
    /// Told of every registration, so calls are checked against what was sent since.
    pub state: Arc<State>,
}

enum Failure {
    /// Worth another try: the agent is not there yet, or not ready for this registration
    /// (`Unavailable`: e.g. the plugin's socket was removed by an agent starting, between the
    /// check above and the call; it is bound again on the next round).
    Retry(String),
    /// The agent refused the registration itself (`InvalidArgument`).
    Refused(String),
}

impl Registrar {
    /// Keeps the plugin registered until `shutdown`; fails when the agent refuses it.
    pub async fn run(
        &self,
        listener: &mut Listener,
        log: &CallLog,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<()> {
        let dir = self
            .kubelet_socket
            .parent()
            .context("kubelet socket has no directory")?
            .to_path_buf();
        let (wake_tx, mut wake_rx) = mpsc::channel::<()>(1);
        let mut watcher = notify::recommended_watcher(move |_: notify::Result<notify::Event>| {
            let _ = wake_tx.try_send(());
        })
        .context("watching the kubelet directory")?;
        watcher
            .watch(&dir, notify::RecursiveMode::NonRecursive)
            .with_context(|| format!("watching {}", dir.display()))?;

        let mut registered_with: Option<FileId> = None;
        let mut need = !self.no_register;
        let mut tick = tokio::time::interval(CHECK_PERIOD);
        let mut last_failure = String::new();
        loop {
            if !listener.is_current() {
                tracing::warn!(socket = %listener.path().display(), "own socket gone; re-creating it");
                listener.bind()?;
                need = !self.no_register;
            }
            let kubelet = socket_id(&self.kubelet_socket);
            if !self.no_register && kubelet.is_some() && kubelet != registered_with {
                need = true;
            }
            if need && kubelet.is_some() {
                match self.register().await {
                    Ok(()) => {
                        log.record(&json!({"call": "Register", "ok": true}));
                        tracing::info!(
                            kubelet = %self.kubelet_socket.display(),
                            resource = %self.resource,
                            "registered"
                        );
                        need = false;
                        registered_with = kubelet;
                        last_failure.clear();
                    }
                    Err(Failure::Refused(msg)) => {
                        log.record(&json!({"call": "Register", "ok": false, "error": msg}));
                        anyhow::bail!("the agent refused the registration: {msg}");
                    }
                    Err(Failure::Retry(msg)) => {
                        if msg != last_failure {
                            tracing::info!(error = %msg, "cannot register yet; retrying");
                            last_failure = msg;
                        }
                    }
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                _ = wake_rx.recv() => {}
                _ = tick.tick() => {}
            }
        }
    }

    async fn register(&self) -> Result<(), Failure> {
        // Before the call: the agent dials back and opens ListAndWatch as soon as it answers.
        self.state.new_registration();
        let mut client =
            RegistrationClient::new(berth_devices::grpc::unix_channel(&self.kubelet_socket));
        let req = RegisterRequest {
            version: VERSION.into(),
            endpoint: self.endpoint.clone(),
            resource_name: self.resource.clone(),
            options: Some(self.options),
        };
        match tokio::time::timeout(REGISTER_TIMEOUT, client.register(req)).await {
            Err(_) => Err(Failure::Retry("Register got no answer".into())),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(s)) if s.code() == Code::InvalidArgument => {
                Err(Failure::Refused(s.message().to_string()))
            }
            Ok(Err(s)) => Err(Failure::Retry(format!("{:?}: {}", s.code(), s.message()))),
        }
    }
}
