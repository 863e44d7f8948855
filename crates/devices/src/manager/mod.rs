//! The device manager: the one owner of the node's device view. Plugin instances of every
//! protocol report to it through [`PluginSink`]; it validates what they send, keeps each
//! plugin's devices, health and statistics, emits an event on every change, persists the last
//! device list of each plugin (so the node's devices and class survive an agent restart), and
//! counts which instances are held by which alloc.
//!
//! Unlike Nomad's manager, nothing waits for a first fingerprint: a plugin's devices are
//! usable the moment it reports them, and an empty list is just an empty list.

mod placement;
mod validate;

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    path::PathBuf,
    sync::{Arc, Mutex, MutexGuard},
};

use tokio::sync::watch;

pub use placement::{Chosen, PRE_START_WAIT, TaskRequests};
pub use validate::{MAX_GROUPS, MAX_INSTANCES, MAX_NAME_BYTES, validate};

use crate::{
    assignment::{AssignedSource, DeviceAssignment, DeviceKey},
    cdi::CdiRegistry,
    model::{DeviceGroup, DeviceGroupId, InstanceStats},
    now_ms,
    plugin::{Generation, PluginEvent, PluginId, PluginOps, PluginSink},
    view::{
        DeviceEvent, DeviceEventKind, DeviceMetrics, DevicesView, GroupView, InstanceView,
        PluginState, PluginView,
    },
};

/// Where the manager's events go (the agent's event bus). Called outside the manager's lock;
/// must not block.
pub trait DeviceObserver: Send + Sync + fmt::Debug {
    /// One event.
    fn on_event(&self, event: DeviceEvent);
}

/// An observer that drops every event.
#[derive(Debug, Default)]
pub struct NoObserver;

impl DeviceObserver for NoObserver {
    fn on_event(&self, _: DeviceEvent) {}
}

/// Where each plugin's last device list is kept across agent restarts. Best effort: an
/// implementation logs its own failures (the live view does not depend on them).
pub trait DeviceRecords: Send + Sync + fmt::Debug {
    /// Every stored device list.
    fn load(&self) -> Vec<(PluginId, Vec<DeviceGroup>)>;
    /// Stores `plugin`'s device list.
    fn save(&self, plugin: &PluginId, groups: &[DeviceGroup]);
    /// Forgets `plugin`.
    fn remove(&self, plugin: &PluginId);
}

/// Records kept nowhere.
#[derive(Debug, Default)]
pub struct NoRecords;

impl DeviceRecords for NoRecords {
    fn load(&self) -> Vec<(PluginId, Vec<DeviceGroup>)> {
        Vec::new()
    }
    fn save(&self, _: &PluginId, _: &[DeviceGroup]) {}
    fn remove(&self, _: &PluginId) {}
}

/// Options of the manager.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ManagerConfig {
    /// CDI spec directories, lowest priority first (a later one wins).
    pub cdi_dirs: Vec<PathBuf>,
}

/// One plugin as the manager keeps it.
#[derive(Debug)]
struct Plugin {
    state: PluginState,
    generation: Option<Generation>,
    ops: Option<Arc<dyn PluginOps>>,
    detail: String,
    reason: Option<String>,
    since_ms: u64,
    attachments: u64,
    fingerprinted: bool,
    invalid: Vec<String>,
    groups: Vec<DeviceGroup>,
    stats: BTreeMap<(DeviceGroupId, String), InstanceStats>,
    /// Down, and not tried again by its supervisor: it must register again (Kubernetes).
    awaiting_registration: bool,
}

impl Plugin {
    fn new(state: PluginState) -> Self {
        Self {
            state,
            generation: None,
            ops: None,
            detail: String::new(),
            reason: None,
            since_ms: now_ms(),
            attachments: 0,
            fingerprinted: false,
            invalid: Vec::new(),
            groups: Vec::new(),
            stats: BTreeMap::new(),
            awaiting_registration: false,
        }
    }

    fn set_state(&mut self, state: PluginState) {
        if self.state != state {
            self.state = state;
            self.since_ms = now_ms();
        }
    }

    /// Why its devices may not be given to tasks, when they may not; `plugin` names the
    /// plugin in the sentence (`its plugin`, `device plugin nomad:x`).
    fn unusable_reason(&self, plugin: &str) -> Option<String> {
        match self.state {
            PluginState::Ready if self.fingerprinted => None,
            PluginState::Ready | PluginState::Starting => {
                Some(format!("{plugin} has not reported its devices yet"))
            }
            PluginState::Restored => Some(format!(
                "last known before the agent restarted; {plugin} has not reported since"
            )),
            PluginState::Down => Some(format!(
                "{plugin} is down: {}",
                self.reason.as_deref().unwrap_or("no reason given")
            )),
        }
    }
}

#[derive(Debug, Default)]
struct State {
    next_generation: u64,
    plugins: BTreeMap<PluginId, Plugin>,
    /// Devices held, by the alloc holding them.
    reservations: BTreeMap<DeviceKey, String>,
    /// The CDI spec directories as last read, and what they held.
    cdi: Option<(CdiStamp, Arc<CdiRegistry>)>,
}

/// What the CDI spec directories hold, as cheap to compare: every file's path, modification
/// time and length.
type CdiStamp = Vec<(PathBuf, Option<std::time::SystemTime>, u64)>;

/// The device manager. Cheap to share (`Arc`); every method is safe to call from any task.
pub struct DeviceManager {
    state: Mutex<State>,
    version: watch::Sender<u64>,
    observer: Arc<dyn DeviceObserver>,
    records: Arc<dyn DeviceRecords>,
    config: ManagerConfig,
    /// Serializes placements (choose, then take).
    placing: tokio::sync::Mutex<()>,
}

impl fmt::Debug for DeviceManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceManager")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn device_name(group: &DeviceGroupId, id: &str) -> String {
    format!("{group}/{id}")
}

impl DeviceManager {
    /// A manager with the device lists `records` kept from an earlier run (shown as
    /// [`PluginState::Restored`], not usable until their plugins report again).
    pub fn new(
        config: ManagerConfig,
        observer: Arc<dyn DeviceObserver>,
        records: Arc<dyn DeviceRecords>,
    ) -> Self {
        let mut state = State::default();
        for (id, groups) in records.load() {
            let (groups, _) = validate(groups);
            let mut p = Plugin::new(PluginState::Restored);
            p.groups = groups;
            state.plugins.insert(id, p);
        }
        let (version, _) = watch::channel(0);
        Self {
            state: Mutex::new(state),
            version,
            observer,
            records,
            config,
            placing: tokio::sync::Mutex::new(()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Emits `events` and tells watchers something changed.
    fn changed(&self, events: Vec<DeviceEvent>) {
        for e in events {
            tracing::info!(plugin = %e.plugin, kind = ?e.kind, device = ?e.device, message = %e.message, "device event");
            self.observer.on_event(e);
        }
        self.version.send_modify(|v| *v += 1);
    }

    /// A receiver whose value grows at every change of the device view (for waiting on a
    /// change without polling).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// Removes the restored plugins (known from an earlier run, not attached since) for which
    /// `keep` is false: plugins no longer configured, or Kubernetes plugins that did not
    /// register again in time. Their devices go; reservations stay with their allocs.
    pub fn forget_restored(&self, keep: impl Fn(&PluginId) -> bool) {
        self.remove_plugins(
            |id, p| p.state == PluginState::Restored && !keep(id),
            "known from before the agent restarted, and not back: its devices are removed",
        );
    }

    /// Removes the plugins `gone` picks, with their stored lists, and says `message` of each.
    fn remove_plugins(&self, gone: impl Fn(&PluginId, &Plugin) -> bool, message: &str) {
        let removed: Vec<PluginId> = {
            let mut st = self.lock();
            let ids: Vec<PluginId> = st
                .plugins
                .iter()
                .filter(|(id, p)| gone(id, p))
                .map(|(id, _)| id.clone())
                .collect();
            for id in &ids {
                st.plugins.remove(id);
            }
            ids
        };
        if removed.is_empty() {
            return;
        }
        // After the lock: a store commit waits for the disk.
        for id in &removed {
            self.records.remove(id);
        }
        let events = removed
            .into_iter()
            .map(|plugin| DeviceEvent {
                kind: DeviceEventKind::PluginRemoved,
                plugin,
                device: None,
                message: message.to_string(),
            })
            .collect();
        self.changed(events);
    }

    /// The node's devices now.
    pub fn view(&self) -> DevicesView {
        let st = self.lock();
        let mut plugins = Vec::new();
        let mut groups = Vec::new();
        for (id, p) in &st.plugins {
            plugins.push(PluginView {
                id: id.clone(),
                state: p.state,
                detail: p.detail.clone(),
                reason: p.reason.clone(),
                since_ms: p.since_ms,
                attachments: p.attachments,
                fingerprinted: p.fingerprinted,
                invalid: p.invalid.clone(),
            });
            let unusable = p.unusable_reason("its plugin");
            for g in &p.groups {
                let gid = g.id();
                let source = AssignedSource::Plugin {
                    plugin: id.clone(),
                    group: gid.clone(),
                };
                let instances = g
                    .instances
                    .iter()
                    .map(|i| {
                        let key = DeviceKey {
                            source: source.clone(),
                            id: i.id.clone(),
                        };
                        let (healthy, health_description) = match &unusable {
                            Some(why) => (false, why.clone()),
                            None => (i.healthy, i.health_description.clone()),
                        };
                        InstanceView {
                            id: i.id.clone(),
                            healthy,
                            health_description,
                            locality: i.locality.clone(),
                            reserved_by: st.reservations.get(&key).cloned(),
                            stats: p.stats.get(&(gid.clone(), i.id.clone())).cloned(),
                        }
                    })
                    .collect();
                groups.push(GroupView {
                    vendor: g.vendor.clone(),
                    device_type: g.device_type.clone(),
                    name: g.name.clone(),
                    plugin: id.clone(),
                    attributes: g.attributes.clone(),
                    instances,
                });
            }
        }
        groups.sort_by(|a, b| {
            (&a.vendor, &a.device_type, &a.name, &a.plugin).cmp(&(
                &b.vendor,
                &b.device_type,
                &b.name,
                &b.plugin,
            ))
        });
        DevicesView {
            plugins,
            groups,
            cdi_devices: Vec::new(),
            cdi_errors: Vec::new(),
        }
    }

    /// [`view`](Self::view) with the CDI devices and the refused CDI spec files
    /// ([`cdi_registry`](Self::cdi_registry)).
    pub fn view_with_cdi(&self) -> DevicesView {
        let mut view = self.view();
        let registry = self.cdi_registry();
        view.cdi_devices = registry
            .devices()
            .into_iter()
            .map(|(name, _)| name.to_string())
            .collect();
        view.cdi_errors = registry.errors().iter().map(ToString::to_string).collect();
        view
    }

    /// The CDI specs of the spec directories: read again only when a file there was added,
    /// removed or changed (by modification time and length) since the last read.
    pub fn cdi_registry(&self) -> Arc<CdiRegistry> {
        let stamp = cdi_stamp(&self.config.cdi_dirs);
        if let Some((seen, registry)) = &self.lock().cdi
            && *seen == stamp
        {
            return Arc::clone(registry);
        }
        let registry = Arc::new(CdiRegistry::load(&self.config.cdi_dirs));
        self.lock().cdi = Some((stamp, Arc::clone(&registry)));
        registry
    }

    /// What metrics export of every plugin and instance: cheaper than [`view`](Self::view),
    /// which copies every statistic.
    pub fn metrics(&self) -> DeviceMetrics {
        let st = self.lock();
        let mut out = DeviceMetrics::default();
        for (id, p) in &st.plugins {
            let plugin = id.to_string();
            out.plugins.push(crate::view::PluginMetrics {
                plugin: plugin.clone(),
                ready: p.unusable_reason("").is_none(),
                attachments: p.attachments,
            });
            let usable = p.unusable_reason("").is_none();
            for g in &p.groups {
                let gid = g.id();
                let source = AssignedSource::Plugin {
                    plugin: id.clone(),
                    group: gid.clone(),
                };
                for i in &g.instances {
                    let key = DeviceKey {
                        source: source.clone(),
                        id: i.id.clone(),
                    };
                    let summary = p
                        .stats
                        .get(&(gid.clone(), i.id.clone()))
                        .and_then(|s| s.summary.as_ref())
                        .and_then(|v| v.number().map(|n| (n, v.unit.clone())));
                    out.instances.push(crate::view::InstanceMetrics {
                        plugin: plugin.clone(),
                        device: gid.to_string(),
                        instance: i.id.clone(),
                        healthy: usable && i.healthy,
                        reserved: st.reservations.contains_key(&key),
                        summary,
                    });
                }
            }
        }
        out
    }

    /// The device groups of every plugin (restored and down ones included): what the node's
    /// computed class is made of, stable across instance health changes.
    pub fn groups(&self) -> Vec<DeviceGroup> {
        self.lock()
            .plugins
            .values()
            .flat_map(|p| p.groups.iter().cloned())
            .collect()
    }

    /// Takes the devices of `assignments` for `alloc_id` (after an agent restart, from the
    /// persisted alloc records). Devices another alloc holds stay with it; the conflicts are
    /// returned (they cannot happen unless the store was edited).
    pub fn restore(&self, alloc_id: &str, assignments: &[DeviceAssignment]) -> Vec<String> {
        let mut conflicts = Vec::new();
        {
            let mut st = self.lock();
            for key in assignments.iter().flat_map(DeviceAssignment::keys) {
                match st.reservations.get(&key) {
                    Some(holder) if holder != alloc_id => {
                        conflicts.push(format!("{} is held by alloc {holder} too", key.id));
                    }
                    _ => {
                        st.reservations.insert(key, alloc_id.to_string());
                    }
                }
            }
        }
        self.changed(Vec::new());
        conflicts
    }

    /// Frees every device `alloc_id` holds (its alloc ended). Returns how many.
    pub fn release(&self, alloc_id: &str) -> usize {
        let freed = {
            let mut st = self.lock();
            let before = st.reservations.len();
            st.reservations.retain(|_, holder| holder != alloc_id);
            before - st.reservations.len()
        };
        if freed > 0 {
            tracing::info!(alloc_id, freed, "devices released");
            self.changed(Vec::new());
        }
        freed
    }

    /// The allocs holding devices, with how many each holds.
    pub fn holders(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for holder in self.lock().reservations.values() {
            *out.entry(holder.clone()).or_insert(0) += 1;
        }
        out
    }

    /// The ops of `plugin`'s current instance, if attached and ready.
    pub(crate) fn ops(&self, plugin: &PluginId) -> Result<Arc<dyn PluginOps>, String> {
        let st = self.lock();
        let p = st
            .plugins
            .get(plugin)
            .ok_or_else(|| format!("device plugin {plugin} is not known on this node"))?;
        let subject = format!("device plugin {plugin}");
        match (&p.ops, p.state) {
            (Some(ops), PluginState::Ready) => Ok(Arc::clone(ops)),
            _ => Err(p
                .unusable_reason(&subject)
                .unwrap_or_else(|| format!("{subject} is not ready"))),
        }
    }

    /// The ops of `plugin`'s latest instance, ready or not (`None` when it never attached in
    /// this agent's life).
    pub(crate) fn last_ops(&self, plugin: &PluginId) -> Option<Arc<dyn PluginOps>> {
        self.lock().plugins.get(plugin).and_then(|p| p.ops.clone())
    }

    fn apply(&self, id: &PluginId, generation: Generation, event: PluginEvent) {
        let mut events = Vec::new();
        // Written after the lock is released: a store commit waits for the disk.
        let mut save: Option<Vec<DeviceGroup>> = None;
        {
            let mut st = self.lock();
            let Some(p) = st.plugins.get_mut(id) else {
                return;
            };
            if p.generation != Some(generation) {
                tracing::debug!(plugin = %id, ?generation, current = ?p.generation, "event of a replaced instance dropped");
                return;
            }
            let event_of = |kind, device: Option<String>, message: String| DeviceEvent {
                kind,
                plugin: id.clone(),
                device,
                message,
            };
            match event {
                PluginEvent::Ready { detail } => {
                    p.set_state(PluginState::Ready);
                    p.awaiting_registration = false;
                    p.reason = None;
                    p.detail.clone_from(&detail);
                    events.push(event_of(
                        DeviceEventKind::PluginReady,
                        None,
                        format!("ready: {detail}"),
                    ));
                }
                PluginEvent::Devices(groups) => {
                    let (groups, mut problems) = validate(groups);
                    if problems.len() > MAX_PROBLEMS {
                        let more = problems.len() - MAX_PROBLEMS;
                        problems.truncate(MAX_PROBLEMS);
                        problems.push(format!("… and {more} more"));
                    }
                    if !problems.is_empty() {
                        events.push(event_of(
                            DeviceEventKind::FingerprintInvalid,
                            None,
                            format!("invalid device list: {}", problems.join("; ")),
                        ));
                    }
                    events.extend(health_changes(id, &p.groups, &groups));
                    let first = !p.fingerprinted;
                    p.fingerprinted = true;
                    p.invalid = problems;
                    if first || shape(&p.groups) != shape(&groups) {
                        let count: usize = groups.iter().map(|g| g.instances.len()).sum();
                        let healthy: usize = groups
                            .iter()
                            .flat_map(|g| &g.instances)
                            .filter(|i| i.healthy)
                            .count();
                        let names: Vec<String> =
                            groups.iter().map(|g| g.id().to_string()).collect();
                        events.push(event_of(
                            DeviceEventKind::DevicesChanged,
                            None,
                            if groups.is_empty() {
                                "no devices".into()
                            } else {
                                format!(
                                    "{} ({count} instances, {healthy} healthy)",
                                    names.join(", ")
                                )
                            },
                        ));
                    }
                    if p.groups != groups {
                        save = Some(groups.clone());
                    }
                    // Statistics of instances that are gone go with them.
                    let live: BTreeSet<(DeviceGroupId, String)> = groups
                        .iter()
                        .flat_map(|g| g.instances.iter().map(|i| (g.id(), i.id.clone())))
                        .collect();
                    p.stats.retain(|k, _| live.contains(k));
                    p.groups = groups;
                }
                PluginEvent::Stats(stats) => {
                    for gs in stats {
                        let Some(group) = p.groups.iter().find(|g| {
                            g.vendor == gs.group.vendor
                                && g.device_type == gs.group.device_type
                                && g.name == gs.group.name
                        }) else {
                            continue;
                        };
                        let known: BTreeSet<&str> =
                            group.instances.iter().map(|i| i.id.as_str()).collect();
                        for (iid, s) in gs.instances {
                            if known.contains(iid.as_str()) {
                                p.stats.insert((gs.group.clone(), iid), bounded_stats(s));
                            }
                        }
                    }
                    // Statistics are not events; watchers are not woken for them.
                    return;
                }
                PluginEvent::Down { reason, retry_in } => {
                    p.set_state(PluginState::Down);
                    p.awaiting_registration = retry_in.is_none();
                    let message = match retry_in {
                        Some(d) => format!(
                            "down: {reason}; trying again in {}",
                            berth_sys::short_duration(d)
                        ),
                        None => format!("down: {reason}; waiting for it to register again"),
                    };
                    p.reason = Some(reason);
                    p.fingerprinted = false;
                    events.push(event_of(DeviceEventKind::PluginDown, None, message));
                }
                PluginEvent::Removed { reason } => {
                    // Its stored list stays: see `PluginEvent::Removed`.
                    st.plugins.remove(id);
                    events.push(event_of(
                        DeviceEventKind::PluginRemoved,
                        None,
                        format!("removed: {reason}"),
                    ));
                }
            }
        }
        if let Some(groups) = save {
            self.records.save(id, &groups);
        }
        self.changed(events);
    }

    /// Forgets the Kubernetes plugins that must register again and have not for `grace`:
    /// those down without a retry (their socket is gone) and those known only from before the
    /// agent restarted. Their devices go (kubelet drops a stopped endpoint's resource after a
    /// grace period too); reservations stay with their allocs.
    pub fn expire_unregistered(&self, grace: std::time::Duration) {
        let grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
        let now = now_ms();
        self.remove_plugins(
            |id, p| {
                id.protocol == crate::plugin::Protocol::Kubernetes
                    && (p.state == PluginState::Restored
                        || (p.state == PluginState::Down && p.awaiting_registration))
                    && now.saturating_sub(p.since_ms) >= grace_ms
            },
            &format!(
                "did not register again within {}: its devices are removed",
                berth_sys::short_duration(grace)
            ),
        );
    }
}

/// Every spec file of `dirs` with its modification time and length, in order.
fn cdi_stamp(dirs: &[PathBuf]) -> CdiStamp {
    let mut stamp = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut files: CdiStamp = entries
            .flatten()
            .filter_map(|e| {
                let meta = std::fs::metadata(e.path()).ok()?;
                Some((e.path(), meta.modified().ok(), meta.len()))
            })
            .collect();
        files.sort();
        stamp.push((dir.clone(), None, 0));
        stamp.extend(files);
    }
    stamp
}

/// Most problems of one device list reported.
const MAX_PROBLEMS: usize = 16;
/// Most values and nested objects kept of one instance's statistics.
const MAX_STAT_ENTRIES: usize = 256;
/// Deepest nesting kept of one instance's statistics.
const MAX_STAT_DEPTH: usize = 8;

/// `s` cut to [`MAX_STAT_ENTRIES`] entries over at most [`MAX_STAT_DEPTH`] levels, strings
/// cut to 256 bytes: a plugin's statistics are data, and held for every instance.
fn bounded_stats(mut s: InstanceStats) -> InstanceStats {
    fn cut(v: &mut crate::model::StatValue) {
        for text in [&mut v.unit, &mut v.desc]
            .into_iter()
            .chain(v.string.as_mut())
        {
            if text.len() > 256 {
                let mut at = 256;
                while !text.is_char_boundary(at) {
                    at -= 1;
                }
                text.truncate(at);
            }
        }
    }
    fn walk(o: &mut crate::model::StatObject, depth: usize, budget: &mut usize) {
        o.attributes.retain(|_, _| {
            let keep = *budget > 0;
            *budget = budget.saturating_sub(1);
            keep
        });
        o.attributes.values_mut().for_each(cut);
        if depth >= MAX_STAT_DEPTH {
            o.nested.clear();
            return;
        }
        o.nested.retain(|_, _| {
            let keep = *budget > 0;
            *budget = budget.saturating_sub(1);
            keep
        });
        for n in o.nested.values_mut() {
            walk(n, depth + 1, budget);
        }
    }
    if let Some(v) = s.summary.as_mut() {
        cut(v);
    }
    if let Some(o) = s.stats.as_mut() {
        let mut budget = MAX_STAT_ENTRIES;
        walk(o, 1, &mut budget);
    }
    s
}

/// The groups' names, attributes and instance ids (what a "devices changed" event is about).
fn shape(groups: &[DeviceGroup]) -> Vec<(DeviceGroupId, String, Vec<&str>)> {
    let mut s: Vec<(DeviceGroupId, String, Vec<&str>)> = groups
        .iter()
        .map(|g| {
            // Attributes compare by their JSON form (they hold floats).
            let attrs = serde_json::to_string(&g.attributes).unwrap_or_default();
            (
                g.id(),
                attrs,
                g.instances.iter().map(|i| i.id.as_str()).collect(),
            )
        })
        .collect();
    s.sort();
    s
}

/// An event per instance whose reported health differs between `old` and `new`.
fn health_changes(plugin: &PluginId, old: &[DeviceGroup], new: &[DeviceGroup]) -> Vec<DeviceEvent> {
    let mut events = Vec::new();
    for g in new {
        let gid = g.id();
        let Some(before) = old.iter().find(|o| o.id() == gid) else {
            continue;
        };
        for i in &g.instances {
            let Some(was) = before.instances.iter().find(|o| o.id == i.id) else {
                continue;
            };
            if was.healthy == i.healthy {
                continue;
            }
            let (kind, word) = if i.healthy {
                (DeviceEventKind::DeviceHealthy, "healthy")
            } else {
                (DeviceEventKind::DeviceUnhealthy, "unhealthy")
            };
            let why = if i.health_description.is_empty() {
                String::new()
            } else {
                format!(": {}", berth_input::Shown(&i.health_description))
            };
            events.push(DeviceEvent {
                kind,
                plugin: plugin.clone(),
                device: Some(device_name(&gid, &i.id)),
                message: format!("{} is {word}{why}", device_name(&gid, &i.id)),
            });
        }
    }
    events
}

impl PluginSink for DeviceManager {
    fn attach(&self, plugin: &PluginId, ops: Arc<dyn PluginOps>) -> Generation {
        let generation = {
            let mut st = self.lock();
            st.next_generation += 1;
            let generation = Generation(st.next_generation);
            let p = st
                .plugins
                .entry(plugin.clone())
                .or_insert_with(|| Plugin::new(PluginState::Starting));
            p.set_state(PluginState::Starting);
            p.generation = Some(generation);
            p.ops = Some(ops);
            p.attachments += 1;
            p.fingerprinted = false;
            generation
        };
        tracing::debug!(%plugin, ?generation, "device plugin instance attached");
        self.changed(Vec::new());
        generation
    }

    fn event(&self, plugin: &PluginId, generation: Generation, event: PluginEvent) {
        self.apply(plugin, generation, event);
    }
}
