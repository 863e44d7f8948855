//! berth's fleet scheduler (DESIGN.md component 6, job placement): given a job, its allocs
//! and the fleet's nodes, decides which allocs to place where and which to stop. Pure logic:
//! the elected leader reads the fleet, calls [`schedule`] for each job, and writes the plan.
//!
//! As Nomad's: a node is feasible when it is ready, in one of the job's datacenters, has the
//! task drivers, meets every `constraint` (job and group), serves the group's CSI volumes
//! (node plugin healthy, volume topology reachable), has the devices and the CPU and memory
//! left. Feasible nodes are ranked by bin-packing, the job's anti-affinity (copies of a
//! group spread over nodes), `affinity` and `spread`; the best wins. A job that fits nowhere
//! may preempt allocs of jobs at least 10 priority levels lower. A group that still cannot
//! be placed says why, per node class.

pub mod cluster;
pub mod feasible;
pub mod model;
pub mod rank;

use std::collections::{BTreeMap, BTreeSet};

use berth_api::nodes::NodeState;
use berth_controlplane::catalog::VolumeRecord;
use berth_job::{GroupSpec, JobType};
use serde::{Deserialize, Serialize};

pub use cluster::{Cluster, Resident, Slot, is_live};
pub use model::{Ask, Desired, FleetAlloc, FleetJob, Reported, StopReason};

use feasible::{Asker, Fit};

/// How much lower a job's priority must be for its allocs to be preempted (Nomad's).
pub const PREEMPTION_GAP: u8 = 10;

/// An alloc the plan stops.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stop {
    /// The alloc.
    pub alloc_id: String,
    /// Its node.
    pub node_id: String,
    /// Why.
    pub reason: StopReason,
}

/// Why copies of a group were not placed: for each node class, how many nodes gave each
/// reason.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupFailure {
    /// The group.
    pub group: String,
    /// Copies not placed.
    pub unplaced: u32,
    /// Nodes looked at.
    pub nodes_evaluated: usize,
    /// Class → reason → nodes.
    pub by_class: BTreeMap<String, BTreeMap<String, u32>>,
}

impl std::fmt::Display for GroupFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "group {}: {} alloc(s) not placed ({} node(s) evaluated",
            self.group, self.unplaced, self.nodes_evaluated
        )?;
        if self.nodes_evaluated == 0 {
            f.write_str(": no node is registered")?;
        }
        for (class, reasons) in &self.by_class {
            let list: Vec<String> = reasons.iter().map(|(r, n)| format!("{r} ({n})")).collect();
            write!(f, "; class {class}: {}", list.join(", "))?;
        }
        f.write_str(")")
    }
}

/// What the leader does for one job.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// New allocs.
    pub place: Vec<FleetAlloc>,
    /// Allocs to stop.
    pub stop: Vec<Stop>,
    /// Groups not (wholly) placed.
    pub failures: Vec<GroupFailure>,
}

impl Plan {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.place.is_empty() && self.stop.is_empty()
    }
}

/// What a pass knows beside the fleet.
#[allow(missing_debug_implementations)]
pub struct Context<'a> {
    /// The catalog's volume records.
    pub volume: &'a dyn Fn(&str) -> Option<VolumeRecord>,
    /// Names a new alloc of `(group, index)`.
    pub new_id: &'a mut dyn FnMut(&str, u32) -> String,
    /// Now, in ms since the epoch.
    pub now_ms: u64,
}

/// Decides what `job` needs: `allocs` are the job's allocs with what their nodes reported,
/// `cluster` the fleet (updated with the plan, for the next job of the pass).
pub fn schedule(
    job: &FleetJob,
    allocs: &[(&FleetAlloc, Option<Reported>)],
    cluster: &mut Cluster,
    cx: &mut Context<'_>,
) -> Plan {
    let mut plan = Plan::default();
    let mut stop = |plan: &mut Plan, cluster: &mut Cluster, a: &FleetAlloc, reason: StopReason| {
        cluster.release(&a.node_id, &a.id);
        plan.stop.push(Stop {
            alloc_id: a.id.clone(),
            node_id: a.node_id.clone(),
            reason,
        });
    };
    // Allocs the job holds on to: they should run, and are of this version.
    let mut held: Vec<&FleetAlloc> = Vec::new();
    for (a, _) in allocs {
        if !a.wants_run() {
            continue;
        }
        let node_state = cluster.slot(&a.node_id).map(|s| s.node.status);
        if job.stopped {
            stop(&mut plan, cluster, a, StopReason::JobStopped);
        } else if a.job_version != job.version {
            stop(&mut plan, cluster, a, StopReason::Updated);
        } else if node_state == Some(NodeState::Draining) {
            stop(&mut plan, cluster, a, StopReason::Drained);
        } else if node_state.is_none() {
            stop(&mut plan, cluster, a, StopReason::NodeLost);
        } else {
            held.push(a);
        }
    }
    if job.stopped {
        return plan;
    }
    for group in &job.spec.groups {
        let mine: Vec<&FleetAlloc> = held
            .iter()
            .copied()
            .filter(|a| a.group == group.name)
            .collect();
        if job.spec.job_type == JobType::System {
            place_system(job, group, &mine, cluster, cx, &mut plan, &mut stop);
        } else {
            let mut indexes: BTreeSet<u32> = BTreeSet::new();
            for a in &mine {
                if a.index >= group.count || !indexes.insert(a.index) {
                    stop(&mut plan, cluster, a, StopReason::ScaledDown);
                }
            }
            let missing: Vec<u32> = (0..group.count).filter(|i| !indexes.contains(i)).collect();
            let mut failure = GroupFailure {
                group: group.name.clone(),
                ..Default::default()
            };
            for index in missing {
                if !place_one(
                    job,
                    group,
                    index,
                    None,
                    cluster,
                    cx,
                    &mut plan,
                    &mut failure,
                ) {
                    failure.unplaced += 1;
                }
            }
            if failure.unplaced > 0 {
                plan.failures.push(failure);
            }
        }
    }
    plan
}

/// One alloc of a system job on every eligible node that has none.
fn place_system(
    job: &FleetJob,
    group: &GroupSpec,
    mine: &[&FleetAlloc],
    cluster: &mut Cluster,
    cx: &mut Context<'_>,
    plan: &mut Plan,
    stop: &mut impl FnMut(&mut Plan, &mut Cluster, &FleetAlloc, StopReason),
) {
    let volumes = volumes_of(group, 0);
    let asker = Asker {
        job: &job.spec,
        group,
        ask: Ask::of_group(group),
        volumes: &volumes,
    };
    let nodes: Vec<String> = cluster.slots().map(|s| s.node.id.clone()).collect();
    let mut failure = GroupFailure {
        group: group.name.clone(),
        ..Default::default()
    };
    for node_id in nodes {
        let here: Vec<&&FleetAlloc> = mine.iter().filter(|a| a.node_id == node_id).collect();
        let slot = cluster.slot(&node_id).expect("listed above");
        if !slot.ready() {
            continue;
        }
        let fleet: Vec<&Slot> = cluster.slots().collect();
        if let Err(why) = feasible::check_node(&asker, slot, &fleet, cx.volume) {
            for a in here {
                stop(plan, cluster, a, StopReason::Ineligible);
            }
            // A system job is for the nodes it fits; the others are not failures.
            let _ = why;
            continue;
        }
        if !here.is_empty() {
            for extra in here.iter().skip(1) {
                stop(plan, cluster, extra, StopReason::ScaledDown);
            }
            continue;
        }
        failure.nodes_evaluated += 1;
        if !place_one(
            job,
            group,
            0,
            Some(&node_id),
            cluster,
            cx,
            plan,
            &mut failure,
        ) {
            failure.unplaced += 1;
        }
    }
    if failure.unplaced > 0 {
        plan.failures.push(failure);
    }
}

/// Volume block → volume id for copy `index`.
fn volumes_of(group: &GroupSpec, index: u32) -> BTreeMap<String, String> {
    group
        .volumes
        .iter()
        .map(|(n, v)| (n.clone(), v.source_for(index)))
        .collect()
}

/// Places copy `index` of `group` on the best node (or on `only`); false when it fits
/// nowhere, even with preemption (the reasons are added to `failure`).
#[allow(clippy::too_many_arguments)]
fn place_one(
    job: &FleetJob,
    group: &GroupSpec,
    index: u32,
    only: Option<&str>,
    cluster: &mut Cluster,
    cx: &mut Context<'_>,
    plan: &mut Plan,
    failure: &mut GroupFailure,
) -> bool {
    let volumes = volumes_of(group, index);
    let asker = Asker {
        job: &job.spec,
        group,
        ask: Ask::of_group(group),
        volumes: &volumes,
    };
    let wanted = if job.spec.job_type == JobType::System {
        1
    } else {
        group.count
    };
    let fleet: Vec<&Slot> = cluster.slots().collect();
    let mut best: Option<(f64, String, Fit)> = None;
    // Nodes that fail on room alone: candidates for preemption.
    let mut crowded: Vec<String> = Vec::new();
    let mut reasons: Vec<(String, String)> = Vec::new();
    for slot in fleet
        .iter()
        .filter(|s| only.is_none_or(|id| s.node.id == id))
    {
        if only.is_none() {
            failure.nodes_evaluated += 1;
        }
        let checked = feasible::check_node(&asker, slot, &fleet, cx.volume).and_then(|()| {
            feasible::check_room(&asker, slot).inspect_err(|_| {
                crowded.push(slot.node.id.clone());
            })
        });
        let fit = match checked {
            Ok(fit) => fit,
            Err(why) => {
                reasons.push((slot.class().to_string(), why));
                continue;
            }
        };
        let mut scores = vec![rank::binpack(&asker, slot)];
        scores.extend(rank::anti_affinity(&asker, slot, wanted));
        scores.extend(rank::affinity(&asker, slot));
        scores.extend(rank::spread(&asker, slot, &fleet, wanted));
        let score = scores.iter().sum::<f64>() / scores.len() as f64;
        // Ties go to the lowest node id: plans are reproducible.
        if best.as_ref().is_none_or(|(b, _, _)| score > *b) {
            best = Some((score, slot.node.id.clone(), fit));
        }
    }
    let mut preempts = Vec::new();
    let chosen = match best {
        Some((_, node_id, fit)) => Some((node_id, fit)),
        None => {
            preempt(&asker, job.spec.priority, &crowded, cluster).map(|(node_id, fit, evict)| {
                preempts = evict;
                (node_id, fit)
            })
        }
    };
    let Some((node_id, fit)) = chosen else {
        for (class, why) in reasons {
            *failure
                .by_class
                .entry(class)
                .or_default()
                .entry(why)
                .or_default() += 1;
        }
        return false;
    };
    let alloc = FleetAlloc {
        id: (cx.new_id)(&group.name, index),
        job_id: job.spec.id.clone(),
        job_version: job.version,
        group: group.name.clone(),
        index,
        node_id: node_id.clone(),
        desired: Desired::Run,
        stop_reason: None,
        priority: job.spec.priority,
        ask: asker.ask,
        devices: fit.devices,
        volumes,
        preempts: preempts.iter().map(|r: &Resident| r.id.clone()).collect(),
        created_ms: cx.now_ms,
    };
    for r in &preempts {
        cluster.release(&node_id, &r.id);
        plan.stop.push(Stop {
            alloc_id: r.id.clone(),
            node_id: node_id.clone(),
            reason: StopReason::Preempted {
                by: alloc.id.clone(),
            },
        });
    }
    cluster.place(&alloc);
    plan.place.push(alloc);
    true
}

/// The node among `crowded` where stopping the fewest, lowest-priority allocs (each at
/// least [`PREEMPTION_GAP`] below `priority`) makes room; with the allocs to stop.
fn preempt(
    asker: &Asker<'_>,
    priority: u8,
    crowded: &[String],
    cluster: &Cluster,
) -> Option<(String, Fit, Vec<Resident>)> {
    type Choice = ((u64, usize), String, Fit, Vec<Resident>);
    let mut best: Option<Choice> = None;
    for node_id in crowded {
        let Some(slot) = cluster.slot(node_id) else {
            continue;
        };
        let mut victims: Vec<Resident> = slot
            .residents
            .iter()
            .filter(|r| r.priority.saturating_add(PREEMPTION_GAP) <= priority)
            .cloned()
            .collect();
        // Lowest priority first; among equals, the biggest first (fewer to stop).
        victims.sort_by(|a, b| {
            a.priority
                .cmp(&b.priority)
                .then(b.ask.memory_mb.cmp(&a.ask.memory_mb))
                .then(b.ask.cpu_mhz.cmp(&a.ask.cpu_mhz))
                .then(a.id.cmp(&b.id))
        });
        let mut trial = slot.clone();
        let mut evicted = Vec::new();
        let mut fit = feasible::check_room(asker, &trial).ok();
        for v in victims {
            if fit.is_some() {
                break;
            }
            trial.remove(&v.id);
            evicted.push(v);
            fit = feasible::check_room(asker, &trial).ok();
        }
        let Some(fit) = fit else { continue };
        let cost = (
            evicted.iter().map(|r| u64::from(r.priority)).sum::<u64>(),
            evicted.len(),
        );
        if best.as_ref().is_none_or(|(c, ..)| cost < *c) {
            best = Some((cost, node_id.clone(), fit, evicted));
        }
    }
    best.map(|(_, n, f, e)| (n, f, e))
}

/// Allocs on nodes that have been down since before `down_before_ms` (their lease expired
/// more than the grace ago): the leader stops them as lost, and [`schedule`] replaces them.
pub fn lost<'a>(
    allocs: impl IntoIterator<Item = &'a FleetAlloc>,
    down_since: &BTreeMap<String, u64>,
    down_before_ms: u64,
) -> Vec<Stop> {
    allocs
        .into_iter()
        .filter(|a| a.wants_run())
        .filter(|a| {
            down_since
                .get(&a.node_id)
                .is_some_and(|since| *since <= down_before_ms)
        })
        .map(|a| Stop {
            alloc_id: a.id.clone(),
            node_id: a.node_id.clone(),
            reason: StopReason::NodeLost,
        })
        .collect()
}
