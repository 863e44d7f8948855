//! A supervised instance of one Nomad device plugin: launched in its slot, configured, its
//! device list and statistics followed and reported to the device manager, checked for
//! liveness, restarted with backoff whenever anything fails — never given up on (Nomad's
//! manager gives a plugin up for good after its first fingerprint error) — and stopped
//! cleanly at shutdown.

use std::{
    collections::BTreeMap,
    convert::Infallible,
    io,
    path::PathBuf,
    process::ExitStatus,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use berth_devices::{
    grpc::status_line,
    plugin::{Generation, PluginEvent, PluginId, PluginOps, PluginSink},
};
use berth_sys::{
    MAX_SOCKET_PATH,
    slot::{PluginSlot, RestartPolicy},
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::{
    client::{NomadClient, PluginInfo, PluginKind},
    convert, hclspec,
    launch::{self, LaunchError, LaunchSpec, PluginProcess, SOCKET_NAME_LEN},
    msgpack,
    ops::NomadOps,
    text::Secrets,
};

/// The log file in a plugin's directory (its stderr and stdout, appended). The slot's lock
/// and pid files sit beside it (`plugin.lock`, `plugin.pid`).
pub const LOG_FILE: &str = "plugin.log";
/// The socket directory in a plugin's directory (`PLUGIN_UNIX_SOCKET_DIR`).
pub const SOCKET_DIR: &str = "sock";
/// How long a plugin whose stream broke gets to show it exited, so the reason names its exit.
const EXIT_GRACE: Duration = Duration::from_millis(300);

/// How to run one Nomad device plugin. [`NomadPluginConfig::new`] gives the defaults.
/// `Debug` shows the keys of `config`, never its values (they may be credentials).
#[derive(Clone)]
pub struct NomadPluginConfig {
    /// The plugin's name in the agent config (its binary's name in `plugin_dir`).
    pub name: String,
    /// The binary.
    pub command: PathBuf,
    /// Its arguments (the plugin block's `args`).
    pub args: Vec<String>,
    /// Extra environment (the agent's own is inherited, as go-plugin does).
    pub env: BTreeMap<String, String>,
    /// The user's `config { … }` block as JSON (`null` when absent): the plugin's schema is
    /// applied to it before `SetConfig`.
    pub config: serde_json::Value,
    /// The plugin's private directory (created 0700): [`SOCKET_DIR`], [`LOG_FILE`] and the
    /// slot's files. Short: a socket path in it must fit in 107 bytes.
    pub dir: PathBuf,
    /// The `Stats` collection interval.
    pub stats_interval: Duration,
    /// Backoff between starts, and the grace a stopping plugin gets.
    pub restart: RestartPolicy,
    /// The deadline of every unary call (and of opening a stream).
    pub call_timeout: Duration,
    /// How long the handshake line may take.
    pub start_timeout: Duration,
    /// How often liveness is checked (`PluginInfo`).
    pub liveness_interval: Duration,
    /// The deadline of a liveness check.
    pub liveness_timeout: Duration,
    /// After this many failed liveness checks in a row the plugin hangs: it is killed and
    /// restarted.
    pub liveness_failures: u32,
    /// `PLUGIN_MIN_PORT` and `PLUGIN_MAX_PORT` (Nomad's client defaults: 14000 to 14512).
    pub ports: (u16, u16),
    /// The binary was found in `plugin_dir` without a `plugin` block: it may be any plugin.
    /// Until it has once said it is a device plugin (`PluginInfo`), nothing is reported to the
    /// sink, and `run` stops for good when it is another kind of plugin (logged at info) or
    /// when that first start fails (it is no Nomad plugin, or a broken one; logged as a
    /// warning), as Nomad's loader skips such files. Once it said it is a device plugin, it is
    /// supervised like a declared one.
    pub found_in_plugin_dir: bool,
}

impl std::fmt::Debug for NomadPluginConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NomadPluginConfig")
            .field("name", &self.name)
            .field("command", &self.command)
            .field("args", &self.args)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("config", &config_keys(&self.config))
            .field("dir", &self.dir)
            .field("stats_interval", &self.stats_interval)
            .field("restart", &self.restart)
            .field("found_in_plugin_dir", &self.found_in_plugin_dir)
            .finish_non_exhaustive()
    }
}

/// The top-level keys of a config block, for `Debug`: what was set, not to what.
pub fn config_keys(config: &serde_json::Value) -> Vec<&str> {
    config
        .as_object()
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default()
}

impl NomadPluginConfig {
    /// A config with the defaults: no args, no env, an empty `config`, stats every second,
    /// [`RestartPolicy::default`], 10 s calls, 30 s to start, liveness every 5 s with a 2 s
    /// deadline and 3 failures allowed; declared (not found in `plugin_dir`).
    pub fn new(
        name: impl Into<String>,
        command: impl Into<PathBuf>,
        dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            name: name.into(),
            command: command.into(),
            args: Vec::new(),
            env: BTreeMap::new(),
            config: serde_json::Value::Null,
            dir: dir.into(),
            stats_interval: Duration::from_secs(1),
            restart: RestartPolicy::default(),
            call_timeout: Duration::from_secs(10),
            start_timeout: Duration::from_secs(30),
            liveness_interval: Duration::from_secs(5),
            liveness_timeout: Duration::from_secs(2),
            liveness_failures: 3,
            ports: (14000, 14512),
            found_in_plugin_dir: false,
        }
    }

    /// The log file: `dir/`[`LOG_FILE`].
    pub fn log_file(&self) -> PathBuf {
        self.dir.join(LOG_FILE)
    }

    /// The socket directory: `dir/`[`SOCKET_DIR`].
    pub fn socket_dir(&self) -> PathBuf {
        self.dir.join(SOCKET_DIR)
    }
}

/// A [`NomadPluginConfig`] that cannot be run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("nomad device plugin {plugin:?}: {field}: {reason}")]
pub struct ConfigInvalid {
    /// The plugin's name.
    pub plugin: String,
    /// The field (`dir`, `config`, `stats_interval`…).
    pub field: &'static str,
    /// What is wrong.
    pub reason: String,
}

/// One Nomad device plugin under supervision; [`run`](Self::run) it.
#[derive(Debug)]
pub struct NomadPlugin {
    config: NomadPluginConfig,
    id: PluginId,
    spec: LaunchSpec,
    /// The config's values, scrubbed from what the plugin says.
    secrets: Secrets,
}

impl NomadPlugin {
    /// Checks `config` (changes nothing on disk): a non-empty name and command, `config` an
    /// object or null, a directory short enough for a socket in it, non-zero durations, a
    /// port range.
    pub fn new(mut config: NomadPluginConfig) -> Result<Self, ConfigInvalid> {
        let invalid = |field, reason: String| ConfigInvalid {
            plugin: config.name.clone(),
            field,
            reason,
        };
        if config.name.is_empty() || config.name.chars().any(berth_sys::is_unprintable) {
            return Err(invalid("name", "must be non-empty and printable".into()));
        }
        if config.command.as_os_str().is_empty() {
            return Err(invalid("command", "must not be empty".into()));
        }
        if !matches!(
            config.config,
            serde_json::Value::Null | serde_json::Value::Object(_)
        ) {
            return Err(invalid(
                "config",
                "must be an object (the plugin's config block)".into(),
            ));
        }
        config.dir = std::path::absolute(&config.dir)
            .map_err(|e| invalid("dir", format!("{}: {e}", config.dir.display())))?;
        let socket_dir = config.socket_dir();
        let len = socket_dir.as_os_str().len();
        if len + SOCKET_NAME_LEN > MAX_SOCKET_PATH {
            return Err(invalid(
                "dir",
                format!(
                    "{} is too long: the socket path {}/plugin<digits> must fit in {MAX_SOCKET_PATH} \
                     bytes (this directory leaves {} for it); use a shorter data dir",
                    config.dir.display(),
                    socket_dir.display(),
                    MAX_SOCKET_PATH.saturating_sub(len)
                ),
            ));
        }
        for (field, d) in [
            ("stats_interval", config.stats_interval),
            ("call_timeout", config.call_timeout),
            ("start_timeout", config.start_timeout),
            ("liveness_interval", config.liveness_interval),
            ("liveness_timeout", config.liveness_timeout),
        ] {
            if d.is_zero() {
                return Err(invalid(field, "must be more than zero".into()));
            }
        }
        if config.liveness_failures == 0 {
            return Err(invalid("liveness_failures", "must be at least 1".into()));
        }
        if config.ports.0 > config.ports.1 {
            return Err(invalid(
                "ports",
                format!("{} is above {}", config.ports.0, config.ports.1),
            ));
        }
        let spec = LaunchSpec {
            name: config.name.clone(),
            command: config.command.clone(),
            args: config.args.clone(),
            env: config.env.clone(),
            socket_dir,
            log: config.log_file(),
            ports: config.ports,
            start_timeout: config.start_timeout,
        };
        Ok(Self {
            id: PluginId::nomad(config.name.clone()),
            secrets: Secrets::of_config(&config.config),
            config,
            spec,
        })
    }

    /// The plugin's id (protocol `nomad`, its name).
    pub fn id(&self) -> &PluginId {
        &self.id
    }

    /// The config, with `dir` made absolute.
    pub fn config(&self) -> &NomadPluginConfig {
        &self.config
    }

    /// Runs the plugin until `shutdown`: launches it in its slot (stopping whatever an earlier
    /// agent or copy left there), checks it is a device plugin, applies its schema to the
    /// config and sets it, attaches it to `sink` and reports `Ready`, then its device lists
    /// (`Devices`) and statistics (`Stats`). When it exits, fails, hangs (liveness), ends its
    /// `Fingerprint` stream, or cannot be started or configured, `Down` says why and when it
    /// is tried again, and it is restarted with the restart policy's backoff, forever. At
    /// shutdown it is asked to exit (`GRPCController.Shutdown`), killed after the stop grace if
    /// it does not, the slot is released, and `Removed` is reported. Returns once nothing of
    /// it runs. What the plugin says (its errors, its output, its name and version) is
    /// scrubbed of its config's values before it is reported or logged.
    ///
    /// A plugin [found in `plugin_dir`](NomadPluginConfig::found_in_plugin_dir) that turns out
    /// not to be a device plugin (or whose first start fails) is stopped, its slot released,
    /// and `run` returns without having told `sink` anything.
    pub async fn run(self, sink: Arc<dyn PluginSink>, shutdown: CancellationToken) {
        let span = tracing::info_span!("nomad_device_plugin", plugin = %self.config.name);
        self.supervise(sink, shutdown).instrument(span).await;
    }

    async fn supervise(self, sink: Arc<dyn PluginSink>, shutdown: CancellationToken) {
        let reporter = Reporter {
            sink,
            id: self.id.clone(),
            generation: Mutex::new(None),
        };
        let mut slot = PluginSlot::new(&self.id.to_string(), &self.config.log_file());
        let mut backoff = Backoff {
            policy: self.config.restart,
            last: None,
        };
        // A plugin found in plugin_dir is unproven until it says it is a device plugin.
        let unproven = AtomicBool::new(self.config.found_in_plugin_dir);
        loop {
            let wait = match self
                .run_once(&mut slot, &reporter, &shutdown, &mut backoff, &unproven)
                .await
            {
                RunEnd::Shutdown | RunEnd::Skip => break,
                RunEnd::Retry(wait) => wait,
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = shutdown.cancelled() => break,
            }
        }
        let stuck = slot.release(self.config.restart.stop_grace).await;
        if !stuck.is_empty() {
            tracing::error!(plugin = %self.config.name, pids = ?stuck, "plugin processes survive SIGKILL");
        }
        if !unproven.load(Ordering::Relaxed) {
            reporter.report(PluginEvent::Removed {
                reason: "the agent is shutting down".to_string(),
            });
        }
    }

    /// One start of the plugin, until it fails (`Retry`, after `Down` was reported and the
    /// process stopped), shutdown (`Shutdown`, the process stopped), or, while `unproven`
    /// (found in `plugin_dir`, not yet seen to be a device plugin), until it is seen not to
    /// be one or fails (`Skip`, the process stopped, nothing reported).
    async fn run_once(
        &self,
        slot: &mut PluginSlot,
        reporter: &Reporter,
        shutdown: &CancellationToken,
        backoff: &mut Backoff,
        unproven: &AtomicBool,
    ) -> RunEnd {
        let name = &self.config.name;
        let started = Instant::now();
        // `reason` is scrubbed already.
        let mut down = |reason: String| {
            if unproven.load(Ordering::Relaxed) {
                tracing::warn!(plugin = %name, %reason, "a file found in plugin_dir did not start as a Nomad device plugin; it is not run");
                return RunEnd::Skip;
            }
            let wait = backoff.next(started.elapsed());
            tracing::warn!(plugin = %name, %reason, retry_in = %berth_sys::short_duration(wait), "device plugin down");
            reporter.report(PluginEvent::Down {
                reason,
                retry_in: Some(wait),
            });
            RunEnd::Retry(wait)
        };
        // The plugin's own words (its output, its errors) may repeat its config.
        let scrub = |reason: String| self.secrets.scrub(&reason);
        let claimed = tokio::select! {
            r = slot.claim(self.config.restart.stop_grace) => r,
            () = shutdown.cancelled() => return RunEnd::Shutdown,
        };
        if let Err(e) = claimed {
            return down(format!("cannot start the plugin: {e}"));
        }
        let mut process = match launch::launch(&self.spec, slot, shutdown).await {
            Ok(p) => p,
            Err(LaunchError::Cancelled { .. }) => return RunEnd::Shutdown,
            Err(e) => return down(scrub(e.to_string())),
        };
        if let Err(e) = slot.record(process.pid()) {
            // The copy is marked and holds the lock: the next agent finds it without the file.
            tracing::warn!(plugin = %name, error = %e, "cannot write the plugin's pid file");
        }
        let client = NomadClient::new(name, process.address(), self.config.call_timeout)
            .scrubbing(self.secrets.clone());

        let setup = tokio::select! {
            r = self.setup(&client, unproven) => Step::Done(r),
            r = process.wait() => Step::Exited(r),
            () = shutdown.cancelled() => Step::Shutdown,
        };
        let info = match setup {
            Step::Done(Ok(info)) => info,
            Step::Done(Err(Setup::NotADevicePlugin(kind))) => {
                tracing::info!(plugin = %name, %kind, "plugin_dir holds a {kind} plugin, not a device plugin: berth runs device plugins only; it is not run");
                self.stop(process, Some(&client), slot).await;
                return RunEnd::Skip;
            }
            Step::Done(Err(Setup::Failed(reason))) => {
                // A call that failed because the plugin died says less than its exit status.
                let reason = match tokio::time::timeout(EXIT_GRACE, process.wait()).await {
                    Ok(r) => format!("{} while starting; {reason}", exited(&r)),
                    Err(_) => reason,
                };
                let end = down(scrub(reason));
                self.stop(process, Some(&client), slot).await;
                return end;
            }
            Step::Exited(r) => {
                let end = down(format!("{} while starting", exited(&r)));
                self.stop(process, None, slot).await;
                return end;
            }
            Step::Shutdown => {
                self.stop(process, Some(&client), slot).await;
                return RunEnd::Shutdown;
            }
        };

        let ops = NomadOps::new(self.id.clone(), client.clone());
        let generation = reporter.attach(ops.clone());
        let (plugin_name, version) = (scrub(info.name), scrub(info.version));
        reporter.event(
            generation,
            PluginEvent::Ready {
                detail: format!("{plugin_name} {version}, pid {}", process.pid()),
            },
        );
        tracing::info!(plugin = %name, pid = process.pid(), %version, address = %process.address(), "device plugin ready");

        let followed = tokio::select! {
            reason = self.follow_fingerprints(&client, reporter, generation) => Ended::Fingerprint(reason),
            never = self.follow_stats(&client, reporter, generation) => match never {},
            reason = self.liveness(&client) => Ended::Hung(reason),
            r = process.wait() => Ended::Exited(r),
            () = shutdown.cancelled() => Ended::Shutdown,
        };
        match followed {
            Ended::Shutdown => {
                ops.disconnect("the agent is shutting down");
                self.stop(process, Some(&client), slot).await;
                RunEnd::Shutdown
            }
            Ended::Exited(r) => {
                let reason = exited(&r);
                ops.disconnect(&reason);
                let end = down(reason);
                self.stop(process, None, slot).await;
                end
            }
            // The fingerprint stream ended or failed.
            Ended::Fingerprint(reason) => {
                let reason = match tokio::time::timeout(EXIT_GRACE, process.wait()).await {
                    Ok(r) => format!("{}; {reason}", exited(&r)),
                    Err(_) => reason,
                };
                let reason = scrub(reason);
                ops.disconnect(&reason);
                let end = down(reason);
                self.stop(process, Some(&client), slot).await;
                end
            }
            // The plugin hangs: no point in asking it to stop.
            Ended::Hung(reason) => {
                let reason = scrub(reason);
                ops.disconnect(&reason);
                let end = down(reason);
                process.kill().await;
                slot.forget();
                end
            }
        }
    }

    /// `PluginInfo` (a device plugin of our API version?), `ConfigSchema`, the schema applied
    /// to the config, `SetConfig`. What failed, when anything does. While `unproven`, another
    /// kind of plugin is [`Setup::NotADevicePlugin`], and a device plugin makes it proven.
    async fn setup(
        &self,
        client: &NomadClient,
        unproven: &AtomicBool,
    ) -> Result<PluginInfo, Setup> {
        let name = &self.config.name;
        let failed = |e: &dyn std::fmt::Display| Setup::Failed(e.to_string());
        let info = client.plugin_info().await.map_err(|e| failed(&e))?;
        if unproven.load(Ordering::Relaxed) {
            if info.kind != PluginKind::Device {
                return Err(Setup::NotADevicePlugin(info.kind));
            }
            unproven.store(false, Ordering::Relaxed);
            tracing::info!(plugin = %name, "device plugin found in plugin_dir");
        }
        info.check_device(name).map_err(|e| failed(&e))?;
        let schema = client.config_schema().await.map_err(|e| failed(&e))?;
        let decoded =
            hclspec::apply(name, schema.as_ref(), &self.config.config).map_err(|e| failed(&e))?;
        let bytes = decoded.as_ref().map(msgpack::encode).unwrap_or_default();
        client.set_config(bytes).await.map_err(|e| {
            Setup::Failed(format!(
                "plugin {} refused its configuration (SetConfig): {}",
                berth_input::Quoted(name),
                e.failure
            ))
        })?;
        Ok(info)
    }

    /// Reports every `Fingerprint` message; returns why the stream stopped.
    async fn follow_fingerprints(
        &self,
        client: &NomadClient,
        reporter: &Reporter,
        generation: Generation,
    ) -> String {
        let name = &self.config.name;
        let mut stream = match client.fingerprint().await {
            Ok(s) => s,
            Err(e) => return e.to_string(),
        };
        loop {
            match stream.message().await {
                Ok(Some(msg)) => reporter.event(
                    generation,
                    PluginEvent::Devices(convert::device_groups(name, msg)),
                ),
                Ok(None) => return format!("plugin {name:?} ended its Fingerprint stream"),
                Err(status) => {
                    return format!(
                        "plugin {name:?}: Fingerprint stream failed: {}",
                        status_line(&status)
                    );
                }
            }
        }
    }

    /// Reports every `Stats` message, reopening the stream with backoff when it fails (the
    /// plugin keeps running); stops asking for good when the plugin does not implement it.
    async fn follow_stats(
        &self,
        client: &NomadClient,
        reporter: &Reporter,
        generation: Generation,
    ) -> Infallible {
        let name = &self.config.name;
        let mut last_wait = None;
        loop {
            let failure = match client.stats(self.config.stats_interval).await {
                Ok(mut stream) => loop {
                    match stream.message().await {
                        Ok(Some(msg)) => {
                            last_wait = None;
                            reporter
                                .event(generation, PluginEvent::Stats(convert::group_stats(msg)));
                        }
                        Ok(None) => break "the plugin ended its Stats stream".to_string(),
                        Err(s) if s.code() == tonic::Code::Unimplemented => {
                            tracing::info!(plugin = %name, "the plugin reports no statistics");
                            return std::future::pending().await;
                        }
                        Err(s) => break format!("Stats stream failed: {}", status_line(&s)),
                    }
                },
                Err(e) if e.code() == Some(tonic::Code::Unimplemented) => {
                    tracing::info!(plugin = %name, "the plugin reports no statistics");
                    return std::future::pending().await;
                }
                Err(e) => e.to_string(),
            };
            let wait = self.config.restart.next_wait(last_wait, Duration::ZERO);
            last_wait = Some(wait);
            let failure = self.secrets.scrub(&failure);
            tracing::warn!(plugin = %name, error = %failure, retry_in = %berth_sys::short_duration(wait), "device statistics failed");
            tokio::time::sleep(wait).await;
        }
    }

    /// Checks liveness every interval; returns once the plugin failed too many checks in a
    /// row, with the reason.
    async fn liveness(&self, client: &NomadClient) -> String {
        let n = self.config.liveness_failures;
        let mut failures = 0;
        loop {
            tokio::time::sleep(self.config.liveness_interval).await;
            match client
                .plugin_info_within(self.config.liveness_timeout)
                .await
            {
                Ok(_) => failures = 0,
                Err(e) => {
                    failures += 1;
                    tracing::debug!(plugin = %self.config.name, failures, error = %e, "liveness check failed");
                    if failures >= n {
                        return format!(
                            "plugin {:?} failed {n} liveness checks in a row (last: {}): it hangs; killing it",
                            self.config.name, e.failure
                        );
                    }
                }
            }
        }
    }

    /// Stops the process (through `client` when given) and forgets its pid.
    async fn stop(&self, process: PluginProcess, client: Option<&NomadClient>, slot: &PluginSlot) {
        let pid = process.pid();
        let stopped = process
            .stop(
                client,
                self.config.call_timeout,
                self.config.restart.stop_grace,
            )
            .await;
        tracing::debug!(plugin = %self.config.name, pid, ?stopped, "plugin process stopped");
        slot.forget();
    }
}

/// `exited (exit status: 2)`.
fn exited(r: &io::Result<ExitStatus>) -> String {
    match r {
        Ok(status) => format!("the plugin exited ({status})"),
        Err(e) => format!("the plugin cannot be waited for: {e}"),
    }
}

enum Step<T> {
    Done(T),
    Exited(io::Result<ExitStatus>),
    Shutdown,
}

/// Why following a configured plugin ended.
enum Ended {
    Fingerprint(String),
    Hung(String),
    Exited(io::Result<ExitStatus>),
    Shutdown,
}

enum RunEnd {
    Retry(Duration),
    Shutdown,
    /// Found in `plugin_dir` and not (or not working as) a device plugin: not run.
    Skip,
}

/// Why [`NomadPlugin::setup`] failed.
enum Setup {
    /// An unproven plugin is another kind of plugin.
    NotADevicePlugin(PluginKind),
    /// A call failed, the plugin is not of our API version, or its config was refused.
    Failed(String),
}

struct Backoff {
    policy: RestartPolicy,
    last: Option<Duration>,
}

impl Backoff {
    fn next(&mut self, ran: Duration) -> Duration {
        let wait = self.policy.next_wait(self.last, ran);
        self.last = Some(wait);
        wait
    }
}

/// Reports to the sink under the current generation.
struct Reporter {
    sink: Arc<dyn PluginSink>,
    id: PluginId,
    generation: Mutex<Option<Generation>>,
}

impl Reporter {
    fn attach(&self, ops: Arc<dyn PluginOps>) -> Generation {
        let generation = self.sink.attach(&self.id, ops);
        *self.generation.lock().unwrap_or_else(|p| p.into_inner()) = Some(generation);
        generation
    }

    fn event(&self, generation: Generation, event: PluginEvent) {
        self.sink.event(&self.id, generation, event);
    }

    /// Reports `event` under the current generation; before the first attachment, attaches
    /// ops that answer "unavailable" first (the sink takes events of attached instances only).
    fn report(&self, event: PluginEvent) {
        let current = *self.generation.lock().unwrap_or_else(|p| p.into_inner());
        let generation = match current {
            Some(g) => g,
            None => self.attach(NomadOps::disconnected(
                self.id.clone(),
                "the plugin has not started yet",
            )),
        };
        self.event(generation, event);
    }
}

#[cfg(test)]
mod debug_tests {
    use super::*;

    #[test]
    fn debug_never_shows_config_values() {
        let mut c = NomadPluginConfig::new("p", "/bin/p", "/tmp/p");
        c.config = serde_json::json!({"token": "s3cr3t-9931"});
        c.env.insert("API_KEY".into(), "k3y-7723".into());
        let shown = format!("{c:?}");
        assert!(
            shown.contains("token") && shown.contains("API_KEY"),
            "{shown}"
        );
        assert!(
            !shown.contains("s3cr3t-9931") && !shown.contains("k3y-7723"),
            "{shown}"
        );
    }
}
