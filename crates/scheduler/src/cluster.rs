//! The fleet as the scheduler sees it during one pass: each node with what its live allocs
//! take. Placements and stops of the pass are applied to it, so the next job sees them.

use std::collections::BTreeMap;

use berth_api::nodes::{FleetNode, NodeState};

use crate::model::{Ask, FleetAlloc, Reported};

/// A live alloc on a node, as the scheduler counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resident {
    /// The alloc.
    pub id: String,
    /// Its job.
    pub job_id: String,
    /// Its group.
    pub group: String,
    /// Its job's priority.
    pub priority: u8,
    /// What it takes.
    pub ask: Ask,
    /// Device group id → instances it takes.
    pub devices: BTreeMap<String, u64>,
}

/// One node and what is taken of it.
#[derive(Debug, Clone)]
pub struct Slot {
    /// The node, with its state.
    pub node: FleetNode,
    /// CPU and memory taken by live allocs.
    pub used: Ask,
    /// Device instances taken, by group id.
    pub devices_used: BTreeMap<String, u64>,
    /// The live allocs on it.
    pub residents: Vec<Resident>,
}

impl Slot {
    /// What is left of the node's CPU and memory.
    pub fn free(&self) -> Ask {
        Ask {
            cpu_mhz: self.node.resources.cpu_mhz,
            memory_mb: self.node.resources.memory_mb,
        }
        .minus(self.used)
    }

    /// Whether the node takes new allocs (ready: alive and not draining).
    pub fn ready(&self) -> bool {
        self.node.status == NodeState::Ready
    }

    /// The class placement failures are counted under.
    pub fn class(&self) -> &str {
        if self.node.node_class.is_empty() {
            "<none>"
        } else {
            &self.node.node_class
        }
    }

    pub(crate) fn add(&mut self, r: Resident) {
        self.used = self.used.plus(r.ask);
        for (g, n) in &r.devices {
            *self.devices_used.entry(g.clone()).or_default() += n;
        }
        self.residents.push(r);
    }

    pub(crate) fn remove(&mut self, alloc_id: &str) -> Option<Resident> {
        let at = self.residents.iter().position(|r| r.id == alloc_id)?;
        let r = self.residents.remove(at);
        self.used = self.used.minus(r.ask);
        for (g, n) in &r.devices {
            if let Some(u) = self.devices_used.get_mut(g) {
                *u = u.saturating_sub(*n);
            }
        }
        Some(r)
    }
}

/// Whether an alloc takes room on its node: it should run and has not finished.
pub fn is_live(alloc: &FleetAlloc, reported: Option<Reported>) -> bool {
    alloc.wants_run() && !reported.is_some_and(Reported::is_terminal)
}

/// Every node, by id, with what its live allocs take.
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    slots: BTreeMap<String, Slot>,
}

impl Cluster {
    /// The fleet: `nodes` with their state, and every alloc with what its node reported.
    pub fn new<'a>(
        nodes: impl IntoIterator<Item = FleetNode>,
        allocs: impl IntoIterator<Item = (&'a FleetAlloc, Option<Reported>)>,
    ) -> Self {
        let mut slots: BTreeMap<String, Slot> = nodes
            .into_iter()
            .map(|node| {
                (
                    node.id.clone(),
                    Slot {
                        node,
                        used: Ask::default(),
                        devices_used: BTreeMap::new(),
                        residents: Vec::new(),
                    },
                )
            })
            .collect();
        for (a, rep) in allocs {
            if !is_live(a, rep) {
                continue;
            }
            if let Some(s) = slots.get_mut(&a.node_id) {
                s.add(resident(a));
            }
        }
        Self { slots }
    }

    /// Every node, by id.
    pub fn slots(&self) -> impl Iterator<Item = &Slot> {
        self.slots.values()
    }

    /// One node.
    pub fn slot(&self, node_id: &str) -> Option<&Slot> {
        self.slots.get(node_id)
    }

    /// Takes `alloc`'s room off its node.
    pub fn place(&mut self, alloc: &FleetAlloc) {
        if let Some(s) = self.slots.get_mut(&alloc.node_id) {
            s.add(resident(alloc));
        }
    }

    /// Gives a stopped alloc's room back.
    pub fn release(&mut self, node_id: &str, alloc_id: &str) {
        if let Some(s) = self.slots.get_mut(node_id) {
            s.remove(alloc_id);
        }
    }
}

fn resident(a: &FleetAlloc) -> Resident {
    Resident {
        id: a.id.clone(),
        job_id: a.job_id.clone(),
        group: a.group.clone(),
        priority: a.priority,
        ask: a.ask,
        devices: a.devices.clone(),
    }
}
