//! How much a feasible node suits an alloc, as Nomad ranks nodes: bin-packing, the job's
//! anti-affinity (copies of a group spread over nodes), affinities and spreads. Each score is
//! in [-1, 1]; a node's rank is their mean over those that apply.

use std::collections::BTreeMap;

use berth_devices::request::text_holds;
use berth_job::rules::Spread;

use crate::{
    cluster::Slot,
    feasible::{Asker, resolve},
};

/// Nomad's best-fit score: nodes left fuller score higher, in [0, 1].
pub fn binpack(a: &Asker<'_>, slot: &Slot) -> f64 {
    let cap = &slot.node.resources;
    let free = |cap: u64, used: u64, ask: u64| {
        if cap == 0 {
            0.0
        } else {
            1.0 - (used + ask) as f64 / cap as f64
        }
    };
    let cpu = free(cap.cpu_mhz, slot.used.cpu_mhz, a.ask.cpu_mhz);
    let mem = free(cap.memory_mb, slot.used.memory_mb, a.ask.memory_mb);
    let total = 10f64.powf(cpu) + 10f64.powf(mem);
    ((20.0 - total) / 18.0).clamp(0.0, 1.0)
}

/// Minus the share of the group's copies already on the node (`None`: none there).
pub fn anti_affinity(a: &Asker<'_>, slot: &Slot, wanted: u32) -> Option<f64> {
    let here = slot
        .residents
        .iter()
        .filter(|r| r.job_id == a.job.id && r.group == a.group.name)
        .count();
    (here > 0).then(|| -(here as f64) / f64::from(wanted.max(1)))
}

/// The job's and group's affinities on the node (`None`: there are none).
pub fn affinity(a: &Asker<'_>, slot: &Slot) -> Option<f64> {
    let all: Vec<_> = a
        .job
        .rules
        .affinities
        .iter()
        .chain(&a.group.rules.affinities)
        .collect();
    if all.is_empty() {
        return None;
    }
    let mut matched = 0.0;
    let mut total = 0.0;
    for af in all {
        total += f64::from(af.weight).abs();
        let l = resolve(&slot.node, &af.attribute);
        let r = resolve(&slot.node, &af.value);
        if text_holds(af.operator, l.as_deref(), r.as_deref()).is_ok() {
            matched += f64::from(af.weight);
        }
    }
    Some(matched / total)
}

/// The job's and group's spreads on the node (`None`: there are none). `fleet` is every
/// feasible node, for the values seen and the group's copies on each.
pub fn spread(a: &Asker<'_>, slot: &Slot, fleet: &[&Slot], wanted: u32) -> Option<f64> {
    let all: Vec<&Spread> = a
        .job
        .rules
        .spreads
        .iter()
        .chain(&a.group.rules.spreads)
        .collect();
    if all.is_empty() {
        return None;
    }
    let weights: f64 = all.iter().map(|s| f64::from(s.weight)).sum();
    let mut score = 0.0;
    for s in all {
        // Copies of the group per value of the property.
        let mut counts: BTreeMap<String, u32> = BTreeMap::new();
        for other in fleet {
            let Some(v) = resolve(&other.node, &s.attribute) else {
                continue;
            };
            let n = other
                .residents
                .iter()
                .filter(|r| r.job_id == a.job.id && r.group == a.group.name)
                .count() as u32;
            *counts.entry(v).or_default() += n;
        }
        let Some(here) = resolve(&slot.node, &s.attribute) else {
            // A node without the property is the least wanted.
            score -= f64::from(s.weight) / weights;
            continue;
        };
        let used = f64::from(counts.get(&here).copied().unwrap_or(0));
        let boost = if s.targets.is_empty() {
            // Even spread: the emptiest values are wanted most.
            let min = counts.values().copied().min().unwrap_or(0);
            let max = counts.values().copied().max().unwrap_or(0);
            if max == min {
                0.0
            } else {
                (f64::from(max) - used) / f64::from(max) * 2.0 - 1.0
            }
        } else {
            let listed: u32 = s.targets.iter().map(|t| u32::from(t.percent)).sum();
            let percent = s
                .targets
                .iter()
                .find(|t| t.value == here)
                .map_or_else(|| 100u32.saturating_sub(listed), |t| u32::from(t.percent));
            let desired = f64::from(percent) / 100.0 * f64::from(wanted);
            if desired <= 0.0 {
                -1.0
            } else {
                ((desired - used) / desired).clamp(-1.0, 1.0)
            }
        };
        score += boost * f64::from(s.weight) / weights;
    }
    Some(score)
}
