//! Choosing devices for an alloc's tasks, and what a task gets for them.
//!
//! A placement is all or nothing: every `device` block of every task of every alloc gets its
//! instances — healthy (the plugin says so and is ready), not held by another alloc, in a
//! group that fits the block's name and constraints, the group its affinities like best — or
//! nothing is taken and every reason is returned.

use std::collections::{BTreeMap, BTreeSet};

use berth_input::Quoted;

use super::DeviceManager;
use crate::{
    assignment::{AssignedSource, DeviceAssignment, DeviceKey},
    cdi::{CdiRegistry, QualifiedName},
    model::{ContainerEdits, DeviceGroup},
    plugin::{PluginId, PluginOps},
    request::{DeviceRequest, DeviceTarget, affinity_score, check_group, instance_fits},
};

/// The `device` blocks of one task of an alloc being placed.
#[derive(Debug, Clone, Copy)]
pub struct TaskRequests<'a> {
    /// The alloc (it will hold the devices).
    pub alloc_id: &'a str,
    /// The task.
    pub task: &'a str,
    /// Where in the job, for reasons (`group web, task app`).
    pub at: &'a str,
    /// Its requests.
    pub requests: &'a [DeviceRequest],
}

/// Devices chosen for each (alloc id, task name).
pub type Chosen = BTreeMap<(String, String), Vec<DeviceAssignment>>;

/// One group as placement sees it.
struct Candidate {
    plugin: PluginId,
    group: DeviceGroup,
    ops: Option<std::sync::Arc<dyn PluginOps>>,
    /// Why its instances may not be given (its plugin's state), when they may not.
    unusable: Option<String>,
}

impl DeviceManager {
    /// Chooses and takes devices for every request of `tasks`, all or nothing. `Err` holds
    /// every reason a request cannot be met (`group web, task app, device "nvidia/gpu": …`);
    /// then nothing is taken. Placements run one at a time.
    pub async fn place(&self, tasks: &[TaskRequests<'_>]) -> Result<Chosen, Vec<String>> {
        if tasks.iter().all(|t| t.requests.is_empty()) {
            return Ok(Chosen::new());
        }
        let _placing = self.placing.lock().await;
        let chosen = self.plan(tasks, true).await?;
        let mut st = self.lock();
        // A plugin's answer may have been awaited (its preferred allocation): what was chosen
        // must still be there, healthy and free, or nothing is taken.
        let changed: Vec<String> = chosen
            .values()
            .flatten()
            .flat_map(|a| a.keys())
            .filter_map(|key| still_free(&st, &key).err())
            .collect();
        if !changed.is_empty() {
            return Err(changed);
        }
        for ((alloc_id, _), assignments) in &chosen {
            for key in assignments.iter().flat_map(DeviceAssignment::keys) {
                st.reservations.insert(key, alloc_id.clone());
            }
        }
        drop(st);
        self.changed(Vec::new());
        Ok(chosen)
    }

    /// Every reason the requests of `tasks` could not be placed now, taking nothing and asking
    /// no plugin: for a job refused for other reasons (its volumes, its drivers), so that all
    /// of them are said at once.
    pub async fn check(&self, tasks: &[TaskRequests<'_>]) -> Vec<String> {
        if tasks.iter().all(|t| t.requests.is_empty()) {
            return Vec::new();
        }
        self.plan(tasks, false).await.err().unwrap_or_default()
    }

    /// Chooses devices for every request of `tasks` (all or nothing) without taking them;
    /// `ask` lets it ask plugins for their preferred allocation (then only while holding
    /// `placing`, so that what it chooses is still free when it is taken).
    async fn plan(&self, tasks: &[TaskRequests<'_>], ask: bool) -> Result<Chosen, Vec<String>> {
        let (candidates, held, not_ready) = self.candidates();
        // Read (or taken from the cache) when a request names a CDI device.
        let mut registry: Option<std::sync::Arc<CdiRegistry>> = None;
        let mut taken: BTreeSet<DeviceKey> = BTreeSet::new();
        let mut chosen = Chosen::new();
        let mut reasons = Vec::new();
        for t in tasks {
            for req in t.requests {
                let at = format!("{}, device {}", t.at, Quoted(&req.name));
                let result = match &req.target {
                    DeviceTarget::Cdi(name) => {
                        let registry = registry.get_or_insert_with(|| self.cdi_registry());
                        cdi_choice(req, name, registry, &held, &taken)
                    }
                    DeviceTarget::Plugin(_) => {
                        self.plugin_choice(req, &candidates, &held, &taken, &not_ready, ask)
                            .await
                    }
                };
                match result {
                    Ok(a) => {
                        taken.extend(a.keys());
                        chosen
                            .entry((t.alloc_id.to_owned(), t.task.to_owned()))
                            .or_default()
                            .push(a);
                    }
                    Err(why) => reasons.extend(why.into_iter().map(|w| format!("{at}: {w}"))),
                }
            }
        }
        if reasons.is_empty() {
            Ok(chosen)
        } else {
            Err(reasons)
        }
    }

    /// Every group of every plugin, the devices held and by whom, and the plugins not ready.
    fn candidates(&self) -> (Vec<Candidate>, BTreeMap<DeviceKey, String>, Vec<String>) {
        let st = self.lock();
        let mut out = Vec::new();
        let mut not_ready = Vec::new();
        for (id, p) in &st.plugins {
            let unusable = p.unusable_reason("its plugin");
            if unusable.is_some() {
                not_ready.push(format!("{id} ({})", p.state.as_str()));
            }
            for g in &p.groups {
                out.push(Candidate {
                    plugin: id.clone(),
                    group: g.clone(),
                    ops: p.ops.clone(),
                    unusable: unusable.clone(),
                });
            }
        }
        // A copy: plugins may be asked before anything is taken.
        let held = st.reservations.clone();
        (out, held, not_ready)
    }

    /// The instances of the best fitting group for a plugin device request, or every reason
    /// there is none.
    async fn plugin_choice(
        &self,
        req: &DeviceRequest,
        candidates: &[Candidate],
        held: &BTreeMap<DeviceKey, String>,
        taken: &BTreeSet<DeviceKey>,
        not_ready: &[String],
        ask: bool,
    ) -> Result<DeviceAssignment, Vec<String>> {
        let count = usize::try_from(req.count).unwrap_or(usize::MAX);
        let mut reasons = Vec::new();
        let mut named = 0;
        // (score, free ids, candidate)
        let mut feasible: Vec<(f64, Vec<String>, &Candidate)> = Vec::new();
        for c in candidates {
            let gid = c.group.id();
            match check_group(req, &c.group) {
                Ok(()) => {}
                Err(why) => {
                    let DeviceTarget::Plugin(name) = &req.target else {
                        continue;
                    };
                    if name.matches(&gid) {
                        named += 1;
                        reasons.extend(why.into_iter().map(|w| format!("{gid}: {w}")));
                    }
                    continue;
                }
            }
            named += 1;
            let source = AssignedSource::Plugin {
                plugin: c.plugin.clone(),
                group: gid.clone(),
            };
            let mut free = Vec::new();
            let mut busy = Vec::new();
            for i in &c.group.instances {
                let key = DeviceKey {
                    source: source.clone(),
                    id: i.id.clone(),
                };
                if let Some(why) = &c.unusable {
                    busy.push(format!("{} {why}", i.id));
                } else if !i.healthy {
                    let why = if i.health_description.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", berth_input::Shown(&i.health_description))
                    };
                    busy.push(format!("{} unhealthy{why}", i.id));
                } else if let Some(alloc) = held.get(&key) {
                    busy.push(format!("{} held by alloc {alloc}", i.id));
                } else if taken.contains(&key) {
                    busy.push(format!("{} taken by another block of this job", i.id));
                } else if !instance_fits(req, &c.group, &i.id) {
                    busy.push(format!("{} excluded by a ${{device.ids}} constraint", i.id));
                } else {
                    free.push(i.id.clone());
                }
            }
            if free.len() >= count {
                feasible.push((affinity_score(req, &c.group), free, c));
            } else {
                let mut why = format!(
                    "{gid}: {} healthy free instance(s) of {}, {count} needed",
                    free.len(),
                    c.group.instances.len()
                );
                if !busy.is_empty() {
                    why.push_str(&format!(
                        " ({})",
                        berth_input::shown_list(busy.iter().map(String::as_str))
                    ));
                }
                reasons.push(why);
            }
        }
        if feasible.is_empty() {
            if named == 0 {
                let known: BTreeSet<String> = candidates
                    .iter()
                    .map(|c| c.group.id().to_string())
                    .collect();
                let mut why = format!(
                    "no such device on this node ({})",
                    if known.is_empty() {
                        "it has no devices".to_owned()
                    } else {
                        format!(
                            "it has {}",
                            berth_input::shown_list(known.iter().map(String::as_str))
                        )
                    }
                );
                if !not_ready.is_empty() {
                    why.push_str(&format!(
                        "; device plugins not ready yet: {}",
                        berth_input::shown_list(not_ready.iter().map(String::as_str))
                    ));
                }
                reasons.push(why);
            }
            return Err(reasons);
        }
        // The best score; among equals, the first group in name order.
        feasible.sort_by(|a, b| {
            b.0.partial_cmp(&a.0)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then_with(|| a.2.group.id().cmp(&b.2.group.id()))
        });
        let (_, mut free, c) = feasible.swap_remove(0);
        free.sort();
        let ids = if ask {
            self.preferred(c, &free, count).await
        } else {
            free.iter().take(count).cloned().collect()
        };
        Ok(DeviceAssignment {
            request: req.name.clone(),
            source: AssignedSource::Plugin {
                plugin: c.plugin.clone(),
                group: c.group.id(),
            },
            ids,
        })
    }

    /// The plugin's preferred `count` of `free` (Kubernetes' GetPreferredAllocation), else
    /// the first `count` in order. A wrong or failed answer falls back too (logged).
    async fn preferred(&self, c: &Candidate, free: &[String], count: usize) -> Vec<String> {
        let fallback = || free.iter().take(count).cloned().collect::<Vec<_>>();
        let Some(ops) = &c.ops else {
            return fallback();
        };
        match ops.preferred(free, &[], count).await {
            Ok(Some(ids))
                if ids.len() == count
                    && ids.iter().all(|i| free.contains(i))
                    && ids.iter().collect::<BTreeSet<_>>().len() == count =>
            {
                ids
            }
            Ok(Some(ids)) => {
                tracing::warn!(plugin = %c.plugin, ?ids, count, "the plugin's preferred allocation does not fit; taking the first free instances");
                fallback()
            }
            Ok(None) => fallback(),
            Err(e) => {
                tracing::warn!(plugin = %c.plugin, error = %e, "no preferred allocation; taking the first free instances");
                fallback()
            }
        }
    }

    /// What a task of `alloc_id` gets for `assignments`: each plugin's answer (Nomad's
    /// `Reserve`, Kubernetes' `Allocate`) merged in order, then every CDI device (named in the
    /// job or in a plugin's answer) resolved from the CDI spec directories, and the whole
    /// checked ([`ContainerEdits::check`]). The names resolved stay in the result's
    /// `cdi_devices` for status. Every device must be held by `alloc_id`; `Err` says which
    /// device failed and why.
    pub async fn reserve(
        &self,
        alloc_id: &str,
        assignments: &[DeviceAssignment],
    ) -> Result<ContainerEdits, String> {
        {
            let st = self.lock();
            for key in assignments.iter().flat_map(DeviceAssignment::keys) {
                let holder = st.reservations.get(&key);
                if holder.map(String::as_str) != Some(alloc_id) {
                    let by = holder.map_or_else(|| "nobody".to_string(), |h| format!("alloc {h}"));
                    let key = shown_key(&key);
                    return Err(format!("{key} is held by {by}, not by alloc {alloc_id}"));
                }
            }
        }
        let mut edits = ContainerEdits::default();
        for a in assignments {
            match &a.source {
                AssignedSource::Plugin { plugin, .. } => {
                    let ops = self.ops(plugin)?;
                    edits.merge(ops.reserve(&a.ids).await.map_err(|e| e.to_string())?);
                }
                AssignedSource::Cdi => edits.merge(ContainerEdits {
                    cdi_devices: a.ids.clone(),
                    ..ContainerEdits::default()
                }),
            }
        }
        // Every CDI name once (`merge` keeps one of each), from the job and from plugins.
        if !edits.cdi_devices.is_empty() {
            let resolved = self
                .cdi_registry()
                .resolve_names(&edits.cdi_devices)
                .map_err(|e| format!("CDI: {e}"))?;
            let names = std::mem::take(&mut edits.cdi_devices);
            edits.merge(resolved);
            edits.cdi_devices = names;
        }
        edits
            .check()
            .map_err(|e| format!("what the devices give the task is not usable: {e}"))?;
        Ok(edits)
    }

    /// Before every start of a task holding `assignments`: each Kubernetes plugin's pre-start
    /// call (`PreStartContainer`, where the plugin asked for it at registration). A plugin
    /// that asked for it but is not ready now (it registers again after an agent restart, say)
    /// is waited for, at most [`PRE_START_WAIT`]; if it does not come back the start fails
    /// (the restart policy tries again), as kubelet's would. A plugin known only from before
    /// the agent restarted, which did not say whether it needs the call, is waited for the
    /// same time, then skipped with a note (the task keeps the devices it was given). A
    /// plugin that refuses fails the start.
    pub async fn pre_start(&self, assignments: &[DeviceAssignment]) -> Result<Vec<String>, String> {
        let mut notes = Vec::new();
        for a in assignments {
            let AssignedSource::Plugin { plugin, .. } = &a.source else {
                continue;
            };
            // Only Kubernetes plugins have a pre-start call.
            if plugin.protocol != crate::plugin::Protocol::Kubernetes {
                continue;
            }
            let required = self.last_ops(plugin).map(|o| o.pre_start_required());
            if required == Some(false) {
                continue;
            }
            match self.ready_ops(plugin, PRE_START_WAIT).await {
                Ok(ops) => ops.pre_start(&a.ids).await.map_err(|e| e.to_string())?,
                Err(why) if required == Some(true) => {
                    return Err(format!(
                        "{why}; it must prepare {} before the task starts (PreStartContainer)",
                        a.device_names().join(", ")
                    ));
                }
                Err(why) => notes.push(format!(
                    "{why}: whether it needs a pre-start call for {} is not known; the task starts with the devices it was given",
                    a.device_names().join(", ")
                )),
            }
        }
        Ok(notes)
    }

    /// The ops of `plugin` once it is ready, waiting at most `wait`.
    async fn ready_ops(
        &self,
        plugin: &PluginId,
        wait: std::time::Duration,
    ) -> Result<std::sync::Arc<dyn PluginOps>, String> {
        let mut changes = self.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let why = match self.ops(plugin) {
                Ok(ops) => return Ok(ops),
                Err(why) => why,
            };
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                _ => {
                    return Err(format!(
                        "{why} (waited {})",
                        berth_sys::short_duration(wait)
                    ));
                }
            }
        }
    }
}

/// How long a task's start waits for a Kubernetes plugin that must pre-start its devices.
pub const PRE_START_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// `Ok` when the device of `key` is still held by nobody and, for a plugin's, still listed
/// and healthy with its plugin ready; else why not.
fn still_free(st: &super::State, key: &DeviceKey) -> Result<(), String> {
    if let Some(holder) = st.reservations.get(key) {
        return Err(format!(
            "{} was taken by alloc {holder} while this job was placed; run it again",
            key.id
        ));
    }
    usable(st, key).map_err(|()| {
        format!(
            "{}: its health or its plugin changed while this job was placed; run it again",
            shown_key(key)
        )
    })
}

/// `Ok` when the device of `key` is a CDI device, or is listed and healthy by its plugin,
/// which is ready.
fn usable(st: &super::State, key: &DeviceKey) -> Result<(), ()> {
    let AssignedSource::Plugin { plugin, group } = &key.source else {
        return Ok(());
    };
    let ok = st.plugins.get(plugin).is_some_and(|p| {
        p.unusable_reason("its plugin").is_none()
            && p.groups.iter().any(|g| {
                g.id() == *group && g.instances.iter().any(|i| i.id == key.id && i.healthy)
            })
    });
    if ok { Ok(()) } else { Err(()) }
}

/// `vendor/type/name/id`, or a CDI device's name.
fn shown_key(key: &DeviceKey) -> String {
    match &key.source {
        AssignedSource::Plugin { group, .. } => format!("{group}/{}", key.id),
        AssignedSource::Cdi => key.id.clone(),
    }
}

/// A CDI device named in the job: it must resolve, and not be held.
fn cdi_choice(
    req: &DeviceRequest,
    name: &QualifiedName,
    registry: &CdiRegistry,
    held: &BTreeMap<DeviceKey, String>,
    taken: &BTreeSet<DeviceKey>,
) -> Result<DeviceAssignment, Vec<String>> {
    if let Err(e) = registry.resolve(std::slice::from_ref(name)) {
        return Err(vec![e.to_string()]);
    }
    let key = DeviceKey {
        source: AssignedSource::Cdi,
        id: name.to_string(),
    };
    if let Some(alloc) = held.get(&key) {
        return Err(vec![format!("CDI device {name} is held by alloc {alloc}")]);
    }
    if taken.contains(&key) {
        return Err(vec![format!(
            "CDI device {name} is taken by another block of this job"
        )]);
    }
    Ok(DeviceAssignment {
        request: req.name.clone(),
        source: AssignedSource::Cdi,
        ids: vec![name.to_string()],
    })
}
