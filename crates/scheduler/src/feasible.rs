//! Whether a group can run on a node, and why not: the node is ready, in one of the job's
//! datacenters, has the task drivers, meets the constraints, serves the group's CSI volumes
//! (plugin and topology), has the devices, and has room.

use std::collections::BTreeMap;

use berth_api::nodes::FleetNode;
use berth_controlplane::{
    catalog::VolumeRecord,
    claims::{Claim, ClaimMode},
};
use berth_devices::{
    model::DeviceGroupId,
    request::{DeviceName, DeviceTarget, text_holds},
};
use berth_job::{
    GroupSpec, JobSpec,
    rules::{NodeConstraint, Rules},
};

use crate::{
    cluster::{Resident, Slot},
    model::Ask,
};

/// The value of one `${…}` reference on `node`; `None` when it is not set there.
pub fn reference(node: &FleetNode, name: &str) -> Option<String> {
    let set = |s: &str| (!s.is_empty()).then(|| s.to_string());
    match name {
        "node.unique.id" => Some(node.id.clone()),
        "node.unique.name" => set(&node.name),
        "node.datacenter" => set(&node.datacenter),
        "node.region" => set(&node.region),
        "node.class" => set(&node.node_class),
        _ => {
            if let Some(k) = name.strip_prefix("attr.") {
                node.attributes.get(k).cloned()
            } else if let Some(k) = name.strip_prefix("meta.") {
                node.meta.get(k).cloned()
            } else {
                None
            }
        }
    }
}

/// A rule's side on `node`: its references filled; `None` when one of them is not set.
pub fn resolve(node: &FleetNode, text: &str) -> Option<String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find('}')?;
        out.push_str(&reference(node, &after[..end])?);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Some(out)
}

/// Whether `pattern` (with `*` and `?`) matches `text` whole.
pub fn glob(pattern: &str, text: &str) -> bool {
    fn go(p: &[char], t: &[char]) -> bool {
        match p.split_first() {
            None => t.is_empty(),
            Some(('*', rest)) => (0..=t.len()).any(|i| go(rest, &t[i..])),
            Some(('?', rest)) => !t.is_empty() && go(rest, &t[1..]),
            Some((c, rest)) => t.first() == Some(c) && go(rest, &t[1..]),
        }
    }
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    go(&p, &t)
}

/// What a feasible node gives the group: device group id → instances taken.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fit {
    /// Device group id → instances.
    pub devices: BTreeMap<String, u64>,
}

/// Who is placing: the job, the group, and the group's allocs already placed (live and in
/// this plan), for distinct-hosts and distinct-property rules.
#[derive(Debug)]
pub struct Asker<'a> {
    /// The job.
    pub job: &'a JobSpec,
    /// The group.
    pub group: &'a GroupSpec,
    /// What one alloc of the group takes.
    pub ask: Ask,
    /// Volume block → volume id, for this copy.
    pub volumes: &'a BTreeMap<String, String>,
}

/// Checks everything but room and devices; the first reason it cannot run on `slot`.
pub fn check_node(
    a: &Asker<'_>,
    slot: &Slot,
    fleet: &[&Slot],
    volume: &dyn Fn(&str) -> Option<VolumeRecord>,
) -> Result<(), String> {
    let node = &slot.node;
    if !slot.ready() {
        return Err(format!("node is {}", node.status.as_str()));
    }
    if !a.job.datacenters.is_empty() && !a.job.datacenters.iter().any(|d| glob(d, &node.datacenter))
    {
        return Err(format!(
            "datacenter {:?} is not one of the job's",
            node.datacenter
        ));
    }
    for t in &a.group.tasks {
        match node.drivers.iter().find(|d| d.name == t.driver) {
            Some(d) if d.healthy => {}
            Some(_) => return Err(format!("driver {:?} is not healthy", t.driver)),
            None => return Err(format!("missing driver {:?}", t.driver)),
        }
    }
    for (rules, whose) in [(&a.job.rules, Whose::Job), (&a.group.rules, Whose::Group)] {
        check_rules(a, rules, whose, slot, fleet)?;
    }
    let plugins_of_job: Vec<&str> = a
        .job
        .groups
        .iter()
        .flat_map(|g| &g.tasks)
        .filter_map(|t| t.csi_plugin.as_ref().map(|p| p.id.as_str()))
        .collect();
    for (block, volume_id) in a.volumes {
        let Some(v) = volume(volume_id) else {
            return Err(format!("volume {volume_id:?} is not registered"));
        };
        if plugins_of_job.contains(&v.plugin_id.as_str()) {
            continue;
        }
        let Some(p) = node.csi_plugins.iter().find(|p| p.plugin_id == v.plugin_id) else {
            return Err(format!("missing CSI node plugin {:?}", v.plugin_id));
        };
        if !p.healthy {
            return Err(format!("CSI node plugin {:?} is not healthy", v.plugin_id));
        }
        // The volume is reachable from the node when one of its segments sets all match.
        if !v.topology.is_empty()
            && !v
                .topology
                .iter()
                .any(|seg| seg.iter().all(|(k, val)| p.topology.get(k) == Some(val)))
        {
            return Err(format!(
                "volume {volume_id:?} is not accessible from the node's topology"
            ));
        }
        // The claim the alloc would make must be grantable now (a single-writer volume still
        // held by another alloc, a lost one whose claim is not freed yet, waits).
        if let Some(req) = a.group.volumes.get(block)
            && let Ok(mut set) = v.claim_set()
        {
            let claim = Claim {
                alloc_id: "placing".into(),
                node_id: node.id.clone(),
                mode: if req.read_only {
                    ClaimMode::Read
                } else {
                    ClaimMode::Write
                },
                access_mode: req.access_mode,
                attachment_mode: req.attachment_mode,
            };
            if let Err(e) = set.claim(&v.capability_pairs(), claim) {
                return Err(format!("volume {volume_id:?}: {e}"));
            }
        }
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Whose {
    Job,
    Group,
}

/// Allocs of the job (or of the group) on `slot`.
fn mine<'s>(a: &Asker<'_>, whose: Whose, slot: &'s Slot) -> impl Iterator<Item = &'s Resident> {
    let (job, group) = (a.job.id.clone(), a.group.name.clone());
    slot.residents
        .iter()
        .filter(move |r| r.job_id == job && (whose == Whose::Job || r.group == group))
}

fn check_rules(
    a: &Asker<'_>,
    rules: &Rules,
    whose: Whose,
    slot: &Slot,
    fleet: &[&Slot],
) -> Result<(), String> {
    let node = &slot.node;
    for c in &rules.constraints {
        match c {
            NodeConstraint::Attribute {
                attribute,
                operator,
                value,
            } => {
                let l = resolve(node, attribute);
                let r = (!value.is_empty()).then(|| resolve(node, value)).flatten();
                text_holds(*operator, l.as_deref(), r.as_deref()).map_err(|why| {
                    format!("constraint {attribute} {operator} {value:?} failed: {why}")
                })?;
            }
            NodeConstraint::DistinctHosts => {
                if mine(a, whose, slot).next().is_some() {
                    return Err("constraint distinct_hosts failed".into());
                }
            }
            NodeConstraint::DistinctProperty { attribute, limit } => {
                let Some(here) = resolve(node, attribute) else {
                    return Err(format!(
                        "constraint distinct_property {attribute} failed: not set"
                    ));
                };
                let used: usize = fleet
                    .iter()
                    .filter(|s| resolve(&s.node, attribute).as_deref() == Some(here.as_str()))
                    .map(|s| mine(a, whose, s).count())
                    .sum();
                if used as u64 >= u64::from(*limit) {
                    return Err(format!(
                        "constraint distinct_property {attribute} failed: {used} alloc(s) already have {here:?}"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Whether the group's devices and its CPU and memory fit what is left of `slot`.
pub fn check_room(a: &Asker<'_>, slot: &Slot) -> Result<Fit, String> {
    let mut fit = Fit::default();
    for t in &a.group.tasks {
        for req in &t.devices {
            let DeviceTarget::Plugin(name) = &req.target else {
                // CDI devices are resolved on the node from its CDI specs.
                continue;
            };
            let want = u64::from(req.count);
            let chosen = slot.node.devices.iter().find(|d| {
                let taken = slot.devices_used.get(&d.id).copied().unwrap_or(0)
                    + fit.devices.get(&d.id).copied().unwrap_or(0);
                group_id(&d.id).is_some_and(|id| name.matches(&id))
                    && (d.healthy as u64).saturating_sub(taken) >= want
            });
            match chosen {
                Some(d) => *fit.devices.entry(d.id.clone()).or_default() += want,
                None => return Err(format!("missing devices: {want} × {name}")),
            }
        }
    }
    let free = slot.free();
    if free.cpu_mhz < a.ask.cpu_mhz {
        return Err("resources exhausted: cpu".into());
    }
    if free.memory_mb < a.ask.memory_mb {
        return Err("resources exhausted: memory".into());
    }
    Ok(fit)
}

fn group_id(id: &str) -> Option<DeviceGroupId> {
    let n = DeviceName::parse(id).ok()?;
    Some(DeviceGroupId {
        vendor: n.vendor?,
        device_type: n.device_type,
        name: n.name?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_and_references() {
        assert!(glob("dc*", "dc1"));
        assert!(glob("*", ""));
        assert!(glob("d?1", "dc1"));
        assert!(!glob("dc?", "dc12"));
        let mut n = FleetNode {
            id: "n1".into(),
            datacenter: "dc1".into(),
            ..Default::default()
        };
        n.attributes.insert("kernel.name".into(), "linux".into());
        n.meta.insert("rack".into(), "r1".into());
        assert_eq!(
            resolve(&n, "${attr.kernel.name}-${meta.rack}").as_deref(),
            Some("linux-r1")
        );
        assert_eq!(resolve(&n, "${node.datacenter}").as_deref(), Some("dc1"));
        assert_eq!(resolve(&n, "${node.class}"), None);
        assert_eq!(resolve(&n, "${attr.nope}"), None);
        assert_eq!(resolve(&n, "plain").as_deref(), Some("plain"));
    }
}
