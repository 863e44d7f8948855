//! One registered plugin, followed: dial its socket, read its options, attach it to the
//! manager, follow `ListAndWatch`, check that it still answers, and re-dial with backoff while
//! its socket exists. Ends when it is replaced by a new `Register`, when its socket is gone,
//! or at shutdown.

use std::{
    collections::BTreeMap,
    os::unix::fs::FileTypeExt as _,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use berth_devices::{
    grpc::{is_deadline, status_line},
    plugin::{Generation, PluginEvent, PluginId, PluginSink},
};
use berth_sys::{short_duration, slot::RestartPolicy};
use tokio::{
    sync::mpsc,
    time::{Instant, MissedTickBehavior},
};
use tokio_util::sync::CancellationToken;
use tonic::Request;

use crate::{
    devices,
    ops::{Client, Conn, Deadlines, KubeOps, request},
    proto::v1beta1::{DevicePluginOptions, Empty},
    validate::Registration,
};

/// What every instance shares: where to report, the timings, and the latest generation of
/// each plugin (for `Down` before a new instance attaches, and `Removed` at shutdown).
#[derive(Debug)]
pub(crate) struct Shared {
    pub sink: Arc<dyn PluginSink>,
    pub restart: RestartPolicy,
    pub call_timeout: Duration,
    pub liveness_interval: Duration,
    pub liveness_timeout: Duration,
    pub pre_start_timeout: Duration,
    generations: Mutex<BTreeMap<String, Generation>>,
}

impl Shared {
    pub(crate) fn new(
        sink: Arc<dyn PluginSink>,
        restart: RestartPolicy,
        call_timeout: Duration,
        liveness_interval: Duration,
        liveness_timeout: Duration,
        pre_start_timeout: Duration,
    ) -> Self {
        Self {
            sink,
            restart,
            call_timeout,
            liveness_interval,
            liveness_timeout,
            pre_start_timeout,
            generations: Mutex::new(BTreeMap::new()),
        }
    }

    fn generations(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Generation>> {
        self.generations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The latest generation of every plugin ever attached.
    pub(crate) fn all_generations(&self) -> Vec<(String, Generation)> {
        self.generations()
            .iter()
            .map(|(k, g)| (k.clone(), *g))
            .collect()
    }
}

/// Why one connection ended.
enum Outcome {
    /// Replaced or shut down: say nothing more.
    Stopped,
    /// The plugin failed; `ran` is how long it was attached (zero if it never was).
    Failed { reason: String, ran: Duration },
}

/// The task following one registration of one plugin.
#[derive(Debug)]
pub(crate) struct Instance {
    pub shared: Arc<Shared>,
    pub reg: Registration,
    pub plugin: PluginId,
    /// Cancelled when the instance is replaced or at shutdown.
    pub stop: CancellationToken,
    /// The replaced instance's `finished`: nothing is attached before it has ended.
    pub previous: Option<CancellationToken>,
    /// Cancelled when this task ends, however it ends.
    pub finished: CancellationToken,
    /// Told `(resource, seq)` when this task ends.
    pub done: mpsc::UnboundedSender<(String, u64)>,
    pub seq: u64,
}

impl Instance {
    pub(crate) async fn run(self) {
        let _finished = self.finished.clone().drop_guard();
        let waited = match &self.previous {
            None => true,
            Some(previous) => tokio::select! {
                () = previous.cancelled() => true,
                () = self.stop.cancelled() => false,
            },
        };
        if waited {
            self.follow_with_backoff().await;
        }
        // The owner may be gone already (shutdown); nothing to tell then.
        let _ = self
            .done
            .send((self.reg.resource.as_str().to_string(), self.seq));
    }

    async fn follow_with_backoff(&self) {
        let mut previous_wait = None;
        loop {
            if self.stop.is_cancelled() {
                return;
            }
            if !is_socket(&self.reg.socket) {
                self.down(
                    format!(
                        "its socket {} is gone; waiting for the plugin to register again",
                        self.reg.socket.display()
                    ),
                    None,
                );
                return;
            }
            let (reason, ran) = match self.follow().await {
                Outcome::Stopped => return,
                Outcome::Failed { reason, ran } => (reason, ran),
            };
            if self.stop.is_cancelled() {
                return;
            }
            if !is_socket(&self.reg.socket) {
                self.down(
                    format!(
                        "{reason}; its socket {} is gone, waiting for the plugin to register again",
                        self.reg.socket.display()
                    ),
                    None,
                );
                return;
            }
            let wait = self.shared.restart.next_wait(previous_wait, ran);
            previous_wait = Some(wait);
            tracing::warn!(
                plugin = %self.plugin,
                socket = %self.reg.socket.display(),
                retry_in = %short_duration(wait),
                "{reason}"
            );
            self.down(reason, Some(wait));
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.stop.cancelled() => return,
            }
        }
    }

    /// One connection: dial, options, attach, then `ListAndWatch` and liveness checks until
    /// something fails or the instance is stopped.
    async fn follow(&self) -> Outcome {
        let failed = |reason: String, ran: Duration| Outcome::Failed { reason, ran };
        let call = self.shared.call_timeout;
        let mut client = Client::new(berth_devices::grpc::unix_channel(&self.reg.socket));
        let answer = tokio::select! {
            () = self.stop.cancelled() => return Outcome::Stopped,
            r = tokio::time::timeout(
                call,
                client.get_device_plugin_options(request(Empty {}, call)),
            ) => r,
        };
        let options = match answer {
            Ok(Ok(resp)) => resp.into_inner(),
            Ok(Err(status)) if !is_deadline(&status) => {
                return failed(
                    format!("GetDevicePluginOptions failed: {}", status_line(&status)),
                    Duration::ZERO,
                );
            }
            // The deadline passed, whoever noticed first (tonic or the timeout around it).
            Ok(Err(_)) | Err(_) => {
                return failed(
                    format!(
                        "did not answer GetDevicePluginOptions within {}",
                        short_duration(call)
                    ),
                    Duration::ZERO,
                );
            }
        };
        if let Some(registered) = self.reg.options
            && registered != options
        {
            tracing::warn!(
                plugin = %self.plugin,
                registered = %options_text(&registered),
                answered = %options_text(&options),
                "the options the plugin registered with differ from those GetDevicePluginOptions \
                 answers; using the answered ones"
            );
        }
        if self.stop.is_cancelled() {
            return Outcome::Stopped;
        }

        let conn = Arc::new(Conn::new(client.clone()));
        let _close = CloseOnDrop(Arc::clone(&conn));
        let ops = KubeOps::new(
            self.plugin.clone(),
            Arc::clone(&conn),
            options,
            Deadlines {
                call,
                pre_start: self.shared.pre_start_timeout,
            },
        );
        let generation = self.shared.sink.attach(&self.plugin, Arc::new(ops));
        self.shared
            .generations()
            .insert(self.reg.resource.as_str().to_string(), generation);
        let attached = Instant::now();
        let ran = || attached.elapsed();
        tracing::info!(
            plugin = %self.plugin,
            socket = %self.reg.socket.display(),
            generation = generation.0,
            options = %options_text(&options),
            "device plugin attached"
        );
        self.event(
            generation,
            PluginEvent::Ready {
                detail: format!(
                    "socket {}, {}",
                    self.reg.socket.file_name().map_or_else(
                        || self.reg.socket.display().to_string(),
                        |n| n.to_string_lossy().into_owned()
                    ),
                    options_text(&options)
                ),
            },
        );

        // The stream lives as long as the plugin: no deadline on it, only on its first answer.
        let opened = tokio::select! {
            () = self.stop.cancelled() => return Outcome::Stopped,
            r = tokio::time::timeout(call, client.list_and_watch(Request::new(Empty {}))) => r,
        };
        let mut stream = match opened {
            Err(_) => {
                return failed(
                    format!("did not open ListAndWatch within {}", short_duration(call)),
                    ran(),
                );
            }
            Ok(Err(status)) => {
                return failed(
                    format!("ListAndWatch failed: {}", status_line(&status)),
                    ran(),
                );
            }
            Ok(Ok(resp)) => resp.into_inner(),
        };

        let every = self.shared.liveness_interval;
        let mut liveness = tokio::time::interval_at(Instant::now() + every, every);
        liveness.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = self.stop.cancelled() => return Outcome::Stopped,
                msg = stream.message() => match msg {
                    Ok(Some(list)) => {
                        let group = devices::group(&self.reg.resource, list);
                        tracing::debug!(
                            plugin = %self.plugin,
                            devices = group.instances.len(),
                            healthy = group.instances.iter().filter(|i| i.healthy).count(),
                            "device list"
                        );
                        self.event(generation, PluginEvent::Devices(vec![group]));
                    }
                    Ok(None) => return failed("ListAndWatch ended".into(), ran()),
                    Err(status) => {
                        return failed(
                            format!("ListAndWatch failed: {}", status_line(&status)),
                            ran(),
                        );
                    }
                },
                _ = liveness.tick() => {
                    let limit = self.shared.liveness_timeout;
                    let probe = tokio::select! {
                        () = self.stop.cancelled() => return Outcome::Stopped,
                        r = tokio::time::timeout(
                            limit,
                            client.get_device_plugin_options(request(Empty {}, limit)),
                        ) => r,
                    };
                    match probe {
                        Ok(Ok(_)) => {}
                        Ok(Err(status)) if !is_deadline(&status) => {
                            return failed(
                                format!(
                                    "liveness check failed: GetDevicePluginOptions: {}",
                                    status_line(&status)
                                ),
                                ran(),
                            );
                        }
                        Ok(Err(_)) | Err(_) => {
                            return failed(
                                format!(
                                    "stopped answering: GetDevicePluginOptions got no answer \
                                     within {}",
                                    short_duration(limit)
                                ),
                                ran(),
                            );
                        }
                    }
                }
            }
        }
    }

    fn event(&self, generation: Generation, event: PluginEvent) {
        self.shared.sink.event(&self.plugin, generation, event);
    }

    /// `Down` for the plugin's latest attachment (this instance's, or the one it replaced);
    /// only a log line if it was never attached.
    fn down(&self, reason: String, retry_in: Option<Duration>) {
        let generation = self
            .shared
            .generations()
            .get(self.reg.resource.as_str())
            .copied();
        match generation {
            Some(generation) => self.event(generation, PluginEvent::Down { reason, retry_in }),
            None => tracing::warn!(
                plugin = %self.plugin,
                retry_in = ?retry_in.map(short_duration),
                "device plugin not attached: {reason}"
            ),
        }
    }
}

/// Closes the connection when the connection's turn ends, so the ops given for it answer
/// `Unavailable` from then on.
struct CloseOnDrop(Arc<Conn>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

fn is_socket(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

pub(crate) fn options_text(o: &DevicePluginOptions) -> String {
    format!(
        "pre_start_required={}, get_preferred_allocation_available={}",
        o.pre_start_required, o.get_preferred_allocation_available
    )
}
