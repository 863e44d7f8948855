//! The CSI manager: one health loop per registered plugin instance.
//!
//! A loop starts the moment its instance registers: it fingerprints at once (plugin info and
//! capabilities, then node info and node or controller capabilities by role), then probes on an
//! interval. One Probe per interval while nothing changes; the fingerprint is taken again when
//! the plugin's socket is replaced (it restarted) or after a failure. A healthy instance turns
//! unhealthy only after `failures` consecutive failed checks; an instance never seen healthy is
//! unhealthy from its first failed check. Every transition is an event with its reason. A socket
//! appearing or disappearing wakes the loop at once.
//!
//! The loops probe on a node-wide grid: each one at `epoch + slot + k × interval`, with one of
//! [`PROBE_SLOTS`] slots spread over the interval, picked from the instance's name. Probes of
//! the same slot fall due together and the runtime handles them in one wake-up, instead of
//! waking once per plugin: with a thousand plugins that is most of the agent's idle CPU.
//!
//! Each fingerprint is kept in the store with the identity of the socket it came through. A
//! restarted agent whose plugin lives on behind the same socket file takes it from there,
//! counts the instance healthy as it was, and sends nothing until the loop's first regular
//! probe; that probe failing turns it unhealthy at once (it was not seen healthy since).

use std::{
    collections::HashMap,
    hash::{Hash as _, Hasher as _},
    os::unix::fs::MetadataExt as _,
    sync::{Arc, Mutex},
    time::Duration,
};

use berth_api::{EventKind, Fingerprint, Health};
use berth_csi::{CsiClient, CsiError, Endpoint, Rpc};
use berth_state::{Batch, Store, Table};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::{
    config::HealthConfig,
    events::EventBus,
    metrics::Metrics,
    registry::{Change, PluginRecord, Registry},
    watch::SocketWatcher,
};

/// Deadline of one fingerprint call (each of its RPCs is one attempt, no retries: the loop
/// itself retries).
const FINGERPRINT_TIMEOUT: Duration = Duration::from_secs(5);
/// Re-checks after a new socket fails its first check: 10, 20, 40, … ms (about 0.6 s in all),
/// before the loop falls back to its interval.
const QUICK_RECHECKS: u32 = 6;
const QUICK_RECHECK_FIRST: Duration = Duration::from_millis(10);
/// Deadline of one Probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Instants per interval at which probes fall due (see the module docs).
pub const PROBE_SLOTS: u32 = 4;
/// Health description of an instance whose fingerprint a restarted agent took from the store.
const CARRIED_OVER: &str = "healthy before the agent restarted, behind the same socket; not \
                            probed since";

/// What identifies a socket file: see [`socket_identity`].
type SocketId = (u64, u64, i64, i64);

/// A fingerprint as the store keeps it: with the socket it was taken through.
#[derive(Debug, Serialize, Deserialize)]
struct KnownFingerprint {
    socket: SocketId,
    fingerprint: Fingerprint,
}

/// The store key of an instance's fingerprint.
fn fingerprint_key(id: &str, instance: &str) -> String {
    format!("{id}/{instance}")
}

/// The node-wide probe grid: when each loop's next regular check falls due.
#[derive(Debug, Clone, Copy)]
struct ProbeGrid {
    epoch: tokio::time::Instant,
    interval: Duration,
}

impl ProbeGrid {
    /// `key`'s slot on the grid.
    fn slot(&self, key: &(String, String)) -> ProbeSlot {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        key.hash(&mut h);
        let slot = u128::from(h.finish() % u64::from(PROBE_SLOTS));
        let period = self.interval.as_nanos().max(1);
        ProbeSlot {
            epoch: self.epoch,
            period,
            offset: period * slot / u128::from(PROBE_SLOTS),
        }
    }
}

/// One loop's instants on the grid, worked out once.
#[derive(Debug, Clone, Copy)]
struct ProbeSlot {
    epoch: tokio::time::Instant,
    /// The interval, in nanoseconds (never 0).
    period: u128,
    /// Where in the interval the slot lies, in nanoseconds.
    offset: u128,
}

impl ProbeSlot {
    /// The first instant of the slot strictly after `now`. Consecutive ones are exactly one
    /// interval apart, so a loop that checks at each one probes once per interval.
    fn next_after(&self, now: tokio::time::Instant) -> tokio::time::Instant {
        let since = now.saturating_duration_since(self.epoch).as_nanos();
        // The next k with epoch + offset + k × period > now.
        let k = (since + self.period - self.offset) / self.period;
        let at = self.offset + k * self.period;
        self.epoch + Duration::from_nanos(u64::try_from(at).unwrap_or(u64::MAX))
    }
}

/// What the loop knows of one instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceState {
    /// Current health.
    pub health: Health,
    /// The last fingerprint, if one was ever taken.
    pub fingerprint: Option<Fingerprint>,
}

impl InstanceState {
    /// Before the first check.
    pub fn pending() -> Self {
        Self {
            health: Health {
                healthy: false,
                description: "not checked yet".into(),
                last_transition_ms: 0,
            },
            fingerprint: None,
        }
    }
}

struct Monitor {
    record: PluginRecord,
    state: watch::Receiver<InstanceState>,
    cancel: CancellationToken,
}

/// Runs and tracks the health loops.
#[derive(Debug)]
pub struct Manager {
    registry: Arc<Registry>,
    events: Arc<EventBus>,
    metrics: Arc<Metrics>,
    sockets: Arc<SocketWatcher>,
    store: Arc<Store>,
    health: HealthConfig,
    grid: ProbeGrid,
    monitors: Mutex<HashMap<(String, String), Monitor>>,
    tasks: TaskTracker,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor")
            .field("record", &self.record)
            .finish_non_exhaustive()
    }
}

impl Manager {
    /// A manager; nothing runs until [`Manager::run`].
    pub fn new(
        registry: Arc<Registry>,
        events: Arc<EventBus>,
        metrics: Arc<Metrics>,
        sockets: Arc<SocketWatcher>,
        store: Arc<Store>,
        health: HealthConfig,
    ) -> Self {
        Self {
            registry,
            events,
            metrics,
            sockets,
            store,
            health,
            grid: ProbeGrid {
                epoch: tokio::time::Instant::now(),
                interval: health.interval,
            },
            monitors: Mutex::default(),
            tasks: TaskTracker::new(),
        }
    }

    /// Starts a loop for every registered instance, then follows registry changes until
    /// `shutdown`; then stops every loop and waits for them.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        // Subscribe before reading the list, so nothing registered in between is missed.
        let mut changes = self.registry.subscribe();
        for record in self.registry.list() {
            self.start(record, &shutdown);
        }
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                change = changes.recv() => match change {
                    Ok(Change::Registered(r)) => self.start(r, &shutdown),
                    Ok(Change::Deregistered(r)) => self.stop(&r.id, &r.instance),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => self.resync(&shutdown),
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                },
            }
        }
        for m in self.lock().values() {
            m.cancel.cancel();
        }
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// The state of one instance, if it has a loop.
    pub fn state(&self, id: &str, instance: &str) -> Option<InstanceState> {
        self.lock()
            .get(&(id.to_string(), instance.to_string()))
            .map(|m| m.state.borrow().clone())
    }

    /// Drops, in one write, the kept fingerprints that no loop may take: those of instances
    /// not registered any more, and those of `restarted` (`(plugin id, instance)`: plugins
    /// the agent starts afresh). Called before [`Manager::run`].
    pub async fn drop_stale_fingerprints(&self, restarted: &[(String, String)]) {
        let live: std::collections::HashSet<String> = self
            .registry
            .list()
            .iter()
            .map(|r| fingerprint_key(&r.id, &r.instance))
            .filter(|k| !restarted.iter().any(|(id, i)| fingerprint_key(id, i) == *k))
            .collect();
        let mut batch = Batch::new();
        for key in self.store.keys(Table::FINGERPRINTS).unwrap_or_default() {
            if !live.contains(&key) {
                batch.delete(Table::FINGERPRINTS, &key);
            }
        }
        batch.deferred();
        if let Err(e) = self.store.commit(batch).await {
            tracing::warn!(error = %e, "cannot drop stale kept fingerprints");
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Monitor>> {
        self.monitors.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Brings the loops in line with the registry after missed change notices.
    fn resync(&self, shutdown: &CancellationToken) {
        let records = self.registry.list();
        let live: Vec<(String, String)> = records
            .iter()
            .map(|r| (r.id.clone(), r.instance.clone()))
            .collect();
        let stale: Vec<(String, String)> = self
            .lock()
            .keys()
            .filter(|k| !live.contains(k))
            .cloned()
            .collect();
        for (id, instance) in stale {
            self.stop(&id, &instance);
        }
        for r in records {
            self.start(r, shutdown);
        }
    }

    fn start(&self, record: PluginRecord, shutdown: &CancellationToken) {
        let key = (record.id.clone(), record.instance.clone());
        let mut monitors = self.lock();
        if let Some(m) = monitors.get(&key) {
            if m.record == record {
                return;
            }
            m.cancel.cancel();
        }
        let cancel = shutdown.child_token();
        let (tx, rx) = watch::channel(InstanceState::pending());
        let lp = HealthLoop {
            record: record.clone(),
            events: Arc::clone(&self.events),
            metrics: Arc::clone(&self.metrics),
            sockets: Arc::clone(&self.sockets),
            store: Arc::clone(&self.store),
            health: self.health,
            grid: self.grid,
            state: tx,
            cancel: cancel.clone(),
        };
        let span = tracing::info_span!("plugin", plugin = %record.id, instance = %record.instance);
        self.tasks
            .spawn(tracing::Instrument::instrument(lp.run(), span));
        monitors.insert(
            key,
            Monitor {
                record,
                state: rx,
                cancel,
            },
        );
    }

    fn stop(&self, id: &str, instance: &str) {
        if let Some(m) = self.lock().remove(&(id.to_string(), instance.to_string())) {
            m.cancel.cancel();
        }
        self.metrics.remove_instance(id, instance);
        let store = Arc::clone(&self.store);
        let key = fingerprint_key(id, instance);
        self.tasks.spawn(async move {
            let mut batch = Batch::new();
            batch.delete(Table::FINGERPRINTS, &key).deferred();
            if let Err(e) = store.commit(batch).await {
                tracing::warn!(error = %e, key, "cannot drop a deregistered plugin's fingerprint");
            }
        });
    }
}

struct HealthLoop {
    record: PluginRecord,
    events: Arc<EventBus>,
    metrics: Arc<Metrics>,
    sockets: Arc<SocketWatcher>,
    store: Arc<Store>,
    health: HealthConfig,
    grid: ProbeGrid,
    state: watch::Sender<InstanceState>,
    cancel: CancellationToken,
}

/// One check's outcome.
enum Check {
    Ok(Option<Fingerprint>),
    Failed(String),
}

impl HealthLoop {
    /// Checks the instance until its token is cancelled. The token is watched around the
    /// whole loop rather than at each await in it: a probe wakes the task a few times, and
    /// each wake-up then asks the token once instead of joining and leaving its waiters.
    async fn run(self) {
        let cancel = self.cancel.clone();
        tokio::select! {
            biased;
            () = cancel.cancelled() => {}
            () = self.checks() => {}
        }
    }

    async fn checks(&self) {
        let Ok(endpoint) = Endpoint::from_path(&self.record.socket) else {
            // The registry checks sockets; this cannot happen, but never panic on it.
            self.transition(
                false,
                &format!("invalid socket {}", self.record.socket.display()),
            );
            return;
        };
        let client = self.client(endpoint);
        let slot = self
            .grid
            .slot(&(self.record.id.clone(), self.record.instance.clone()));
        let mut wake = self.sockets.watch(&self.record.socket, None);
        let mut failures = 0u32;
        let mut socket_id = None;
        let mut fingerprinted = false;
        // Quick re-checks left for the current socket: a socket file exists from bind(2), a
        // moment before the plugin listens, so a check right after it appears may be refused.
        let mut quick = 0u32;
        // Whether the socket file may have been replaced since it was last looked at: at the
        // start, after the watcher woke the loop or a check failed, and after the client had
        // to open a new connection (the old one ended). Otherwise the file is left alone.
        let mut restat = true;
        // A fingerprint kept from before the agent restarted, behind this very socket: taken
        // as is, and the first check waits for the loop's slot.
        let mut carried = false;
        let mut first_due = None;
        if let Some(known) = self.kept_fingerprint()
            && Some(known.socket) == socket_identity(&self.record.socket)
        {
            tracing::debug!("fingerprint kept from before the restart; socket unchanged");
            socket_id = Some(known.socket);
            fingerprinted = true;
            restat = false;
            carried = true;
            self.state
                .send_modify(|s| s.fingerprint = Some(known.fingerprint));
            self.transition(true, CARRIED_OVER);
            first_due = Some(slot.next_after(tokio::time::Instant::now()));
        }
        loop {
            if let Some(due) = first_due.take() {
                tokio::select! {
                    biased;
                    () = tokio::time::sleep_until(due) => {}
                    () = wake.changed() => restat = true,
                }
            }
            // Read before the check: a socket replaced during the check is fingerprinted again
            // on the next round.
            if restat || !wake.is_watching() {
                let current = socket_identity(&self.record.socket);
                if current != socket_id {
                    socket_id = current;
                    fingerprinted = false;
                    quick = QUICK_RECHECKS;
                }
            }
            let connections = client.connections();
            let check = self.check(&client, !fingerprinted).await;
            if self.cancel.is_cancelled() {
                // Stopped while the answer came in: the loop's instance is no more.
                break;
            }
            // Whether this check took the fingerprint.
            let mut fresh = false;
            match check {
                Check::Ok(fp) => {
                    failures = 0;
                    quick = 0;
                    carried = false;
                    if let Some(fp) = fp {
                        fresh = true;
                        fingerprinted = true;
                        self.keep_fingerprint(socket_id, &fp).await;
                        self.state.send_modify(|s| s.fingerprint = Some(fp));
                    }
                    self.transition(true, "probe ok");
                }
                Check::Failed(reason) => {
                    failures += 1;
                    fingerprinted = false;
                    // Health carried over from before a restart is not this agent's to keep.
                    let was_healthy = self.state.borrow().health.healthy && !carried;
                    carried = false;
                    if was_healthy && failures < self.health.failures {
                        tracing::debug!(failures, %reason, "check failed");
                        self.state.send_modify(|s| {
                            s.health.description =
                                format!("healthy; {failures} failed check(s): {reason}");
                        });
                    } else {
                        self.transition(false, &reason);
                    }
                }
            }
            // A new connection may lead to another plugin process (a socket file recreated
            // at once can even get the old inode back): fingerprint it before the next probe.
            // The client's first connection is no reconnection.
            let reconnected = connections > 0 && client.connections() != connections;
            restat = failures > 0 || reconnected;
            let stale = reconnected && failures == 0 && !fresh;
            if stale {
                fingerprinted = false;
            }
            if !wake.is_watching() {
                // The directory may exist now.
                wake = self.sockets.watch(&self.record.socket, Some(&wake));
            }
            let now = tokio::time::Instant::now();
            let regular = slot.next_after(now);
            let due = if stale {
                now
            } else if failures > 0 && socket_id.is_some() && quick > 0 {
                quick -= 1;
                (now + QUICK_RECHECK_FIRST * 2u32.pow(QUICK_RECHECKS - quick - 1)).min(regular)
            } else {
                regular
            };
            tokio::select! {
                biased;
                () = tokio::time::sleep_until(due) => {}
                () = wake.changed() => restat = true,
            }
        }
    }

    /// The fingerprint the store keeps for this instance, if any (and readable).
    fn kept_fingerprint(&self) -> Option<KnownFingerprint> {
        let key = fingerprint_key(&self.record.id, &self.record.instance);
        match self
            .store
            .get::<KnownFingerprint>(Table::FINGERPRINTS, &key)
        {
            Ok(known) => known,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the kept fingerprint; asking the plugin");
                None
            }
        }
    }

    /// Keeps `fp`, taken through the socket `socket`, for a restarted agent. A deferred write:
    /// losing it to a crash only means asking the plugin again.
    async fn keep_fingerprint(&self, socket: Option<SocketId>, fp: &Fingerprint) {
        let Some(socket) = socket else {
            return;
        };
        let key = fingerprint_key(&self.record.id, &self.record.instance);
        let known = KnownFingerprint {
            socket,
            fingerprint: fp.clone(),
        };
        let mut batch = Batch::new();
        batch.put(Table::FINGERPRINTS, &key, &known).deferred();
        if let Err(e) = self.store.commit(batch).await {
            tracing::warn!(error = %e, "cannot keep the fingerprint; a restarted agent asks again");
        }
    }

    /// A client whose calls make one attempt each: the loop is the retry. It needs no
    /// cancellation token of its own: the loop drops a call in flight when it is cancelled.
    fn client(&self, endpoint: Endpoint) -> CsiClient {
        let once = |timeout: Duration| Rpc::Probe.policy().single_attempt(timeout);
        let mut b = CsiClient::builder(endpoint)
            .observer(self.metrics.observer(&self.record.id))
            .policy(Rpc::Probe, once(PROBE_TIMEOUT));
        for rpc in [
            Rpc::GetPluginInfo,
            Rpc::GetPluginCapabilities,
            Rpc::NodeGetInfo,
            Rpc::NodeGetCapabilities,
            Rpc::ControllerGetCapabilities,
        ] {
            b = b.policy(rpc, once(FINGERPRINT_TIMEOUT));
        }
        b.build()
    }

    async fn check(&self, client: &CsiClient, fingerprint: bool) -> Check {
        let fp = if fingerprint {
            // Boxed: rare, and its future is most of the loop's size otherwise (one per plugin).
            match Box::pin(self.fingerprint(client)).await {
                Ok(fp) => Some(fp),
                Err(e) => return Check::Failed(e.to_string()),
            }
        } else {
            None
        };
        match client.probe().await {
            Ok(true) => Check::Ok(fp),
            Ok(false) => {
                Check::Failed("the plugin says it is not ready (Probe ready = false)".into())
            }
            Err(e) => Check::Failed(e.to_string()),
        }
    }

    async fn fingerprint(&self, client: &CsiClient) -> Result<Fingerprint, CsiError> {
        let info = client.plugin_info().await?;
        let plugin_capabilities = client.plugin_capabilities().await?;
        let t = self.record.plugin_type;
        let (node_info, node_capabilities) = if t.is_node() {
            (
                Some(client.node_info().await?),
                Some(client.node_capabilities().await?),
            )
        } else {
            (None, None)
        };
        let controller_capabilities = if t.is_controller() {
            Some(client.controller_capabilities().await?)
        } else {
            None
        };
        tracing::info!(provider = %info.name, version = %info.vendor_version, "fingerprinted");
        Ok(Fingerprint {
            provider: info.name,
            version: info.vendor_version,
            plugin_capabilities,
            controller_capabilities,
            node_capabilities,
            node_info,
            taken_ms: crate::now_ms(),
        })
    }

    /// Sets health; on a change (or the first check) emits an event and updates the gauge.
    /// A check that changes nothing (the usual probe) touches nothing.
    fn transition(&self, healthy: bool, description: &str) {
        let changed = {
            let s = self.state.borrow();
            let first = s.health.last_transition_ms == 0;
            if !first && s.health.healthy == healthy && s.health.description == description {
                return;
            }
            first || s.health.healthy != healthy
        };
        self.state.send_modify(|s| {
            s.health.healthy = healthy;
            description.clone_into(&mut s.health.description);
            if changed {
                s.health.last_transition_ms = crate::now_ms();
            }
        });
        if changed {
            let kind = if healthy {
                EventKind::PluginHealthy
            } else {
                EventKind::PluginUnhealthy
            };
            self.events.emit(
                kind,
                &self.record.id,
                Some(&self.record.instance),
                description.to_owned(),
            );
            self.metrics
                .set_healthy(&self.record.id, &self.record.instance, healthy);
        }
    }
}

/// The socket file's identity: a new one means the plugin restarted. The birth time is part of
/// it because a file recreated at once may get the old inode number back; a chmod or chown of
/// the same file (a plugin often makes its socket private right after binding it) leaves it
/// unchanged. Where the filesystem keeps no birth time the change time stands in, and such a
/// change costs one more fingerprint.
fn socket_identity(path: &std::path::Path) -> Option<SocketId> {
    let m = std::fs::metadata(path).ok()?;
    let born = m
        .created()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .and_then(|d| {
            Some((
                i64::try_from(d.as_secs()).ok()?,
                i64::from(d.subsec_nanos()),
            ))
        });
    let (secs, nanos) = born.unwrap_or((m.ctime(), m.ctime_nsec()));
    Some((m.dev(), m.ino(), secs, nanos))
}

#[cfg(test)]
mod identity_tests {
    use super::socket_identity;

    #[test]
    fn a_socket_keeps_its_identity_through_chmod_and_loses_it_when_made_again() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("p.sock");
        assert_eq!(socket_identity(&path), None, "no file, no identity");
        let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        let bound = socket_identity(&path).expect("identity");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        // Only where the filesystem keeps birth times (ext4, tmpfs, xfs, btrfs do).
        if std::fs::metadata(&path).and_then(|m| m.created()).is_ok() {
            assert_eq!(
                socket_identity(&path),
                Some(bound),
                "a chmod is the same socket"
            );
        }
        drop(listener);
        std::fs::remove_file(&path).expect("remove");
        let _again = std::os::unix::net::UnixListener::bind(&path).expect("bind again");
        assert_ne!(
            socket_identity(&path),
            Some(bound),
            "a new socket, whatever its inode"
        );
    }
}

#[cfg(test)]
mod grid_tests {
    use super::*;

    #[test]
    fn a_loop_checks_once_per_interval_on_its_slot_and_slots_spread_over_the_interval() {
        let epoch = tokio::time::Instant::now();
        let interval = Duration::from_millis(1000);
        let grid = ProbeGrid { epoch, interval };
        let mut offsets = std::collections::BTreeSet::new();
        for i in 0..64 {
            let key = (format!("p{i}"), "config".to_string());
            let slot = grid.slot(&key);
            let first = slot.next_after(epoch);
            assert!(first > epoch && first <= epoch + interval, "{i}");
            let offset = (first - epoch).as_nanos() % interval.as_nanos();
            assert_eq!(offset % (interval.as_nanos() / u128::from(PROBE_SLOTS)), 0);
            offsets.insert(offset);
            // From its instant, or any instant before the next, the next is one interval on.
            for ms in [0u64, 1, 250, 999] {
                let at = first + Duration::from_millis(ms);
                assert_eq!(slot.next_after(at), first + interval, "{i} +{ms} ms");
            }
            assert_eq!(slot.next_after(first + interval), first + interval * 2);
        }
        assert_eq!(offsets.len(), PROBE_SLOTS as usize, "every slot used");
    }
}
