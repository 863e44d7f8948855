//! The leader's garbage collection of the fleet's history in etcd: allocs that are done, their
//! reports, and stopped jobs, once they have been done for `gc_after` (what Nomad's servers do
//! with `job_gc_threshold`). Until then `berth job status` still shows them.
//!
//! What is collected:
//! - an alloc the leader stopped whose node reported it finished (tasks dead, volumes
//!   released), or whose node is down or gone (its node, if it ever comes back, stops what the
//!   fleet no longer has): the alloc's key and its report;
//! - a stopped job, once every alloc it has is collectable: the job, why it was not placed,
//!   and its allocs with their reports;
//! - a report whose alloc is gone.
//!
//! An alloc the leader still wants to run is never collected (a finished batch alloc keeps
//! its job from being placed again). Deletes compare every key's revision and are fenced
//! like every leader write: something that changed since (a job run again under the same id)
//! is left for the next pass.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Mutex,
    time::{Duration, Instant},
};

use berth_api::nodes::NodeState;
use berth_scheduler::{Desired, FleetAlloc, FleetJob};

use crate::{
    etcd::{Versioned, Write},
    scheduling::AllocReport,
};

/// How long a finished alloc or a stopped job is kept, by default.
pub const DEFAULT_GC_AFTER: Duration = Duration::from_secs(3600);

/// Something the collector may delete, with every key it takes along.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Item {
    /// A finished alloc (its key and its report).
    Alloc(String),
    /// A stopped job with nothing left running.
    Job(String),
    /// A report whose alloc is gone.
    Report(String),
}

/// The fleet's history as the leader sees it.
#[derive(Debug)]
pub struct History<'a> {
    /// Jobs by id.
    pub jobs: &'a BTreeMap<String, Versioned<FleetJob>>,
    /// Allocs by id.
    pub allocs: &'a BTreeMap<String, Versioned<FleetAlloc>>,
    /// Reports by alloc id.
    pub reports: &'a BTreeMap<String, Versioned<AllocReport>>,
    /// Placement reports by job id.
    pub placements: &'a BTreeMap<String, i64>,
    /// Each registered node's status.
    pub nodes: &'a BTreeMap<String, NodeState>,
}

impl History<'_> {
    /// Whether `a` is done: stopped by the leader, and finished on its node or its node is
    /// down or gone.
    fn alloc_done(&self, a: &FleetAlloc) -> bool {
        if a.desired != Desired::Stop {
            return false;
        }
        let finished = self
            .reports
            .get(&a.id)
            .is_some_and(|r| r.value.reported.is_terminal());
        let node_gone = self
            .nodes
            .get(&a.node_id)
            .is_none_or(|s| *s == NodeState::Down);
        finished || node_gone
    }

    /// Everything collectable now (before the wait).
    pub fn collectable(&self) -> BTreeSet<Item> {
        let mut items = BTreeSet::new();
        let mut of_job: BTreeMap<&str, Vec<&FleetAlloc>> = BTreeMap::new();
        for a in self.allocs.values() {
            of_job
                .entry(a.value.job_id.as_str())
                .or_default()
                .push(&a.value);
        }
        let mut jobs_collected = BTreeSet::new();
        for (id, job) in self.jobs {
            let allocs = of_job.get(id.as_str()).map_or(&[][..], Vec::as_slice);
            if job.value.stopped && allocs.iter().all(|a| self.alloc_done(a)) {
                jobs_collected.insert(id.as_str());
                items.insert(Item::Job(id.clone()));
            }
        }
        // A collected job takes its allocs along.
        for a in self.allocs.values() {
            if !jobs_collected.contains(a.value.job_id.as_str()) && self.alloc_done(&a.value) {
                items.insert(Item::Alloc(a.value.id.clone()));
            }
        }
        for id in self.reports.keys() {
            if !self.allocs.contains_key(id) {
                items.insert(Item::Report(id.clone()));
            }
        }
        items
    }

    /// The deletes that collect `item`, each comparing the revision it was read at.
    pub fn deletes(&self, item: &Item, key: impl Fn(&str, &str) -> String) -> Vec<Write> {
        let alloc = |id: &str, out: &mut Vec<Write>| {
            if let Some(a) = self.allocs.get(id) {
                out.push(Write::delete(key("allocs", id), a.mod_revision));
            }
            if let Some(r) = self.reports.get(id) {
                out.push(Write::delete(key("reports", id), r.mod_revision));
            }
        };
        let mut out = Vec::new();
        match item {
            Item::Alloc(id) | Item::Report(id) => alloc(id, &mut out),
            Item::Job(id) => {
                if let Some(j) = self.jobs.get(id) {
                    out.push(Write::delete(key("jobs", id), j.mod_revision));
                }
                if let Some(rev) = self.placements.get(id) {
                    out.push(Write::delete(key("placements", id), *rev));
                }
                for a in self.allocs.values().filter(|a| a.value.job_id == *id) {
                    alloc(&a.value.id, &mut out);
                }
            }
        }
        out
    }
}

/// The leader's clock of what became collectable when. A new leader starts it afresh, so a
/// change of leader only delays collection.
#[derive(Debug)]
pub struct Collector {
    after: Duration,
    since: Mutex<BTreeMap<Item, Instant>>,
}

impl Collector {
    /// Collects what has been collectable for `after`.
    pub fn new(after: Duration) -> Self {
        Self {
            after,
            since: Mutex::new(BTreeMap::new()),
        }
    }

    /// Forgets every clock (a new term).
    pub fn reset(&self) {
        self.since.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// Of `now_collectable`, what has been so for `after` (as this leader saw it); clocks of
    /// items no longer collectable are dropped.
    pub fn due(&self, now_collectable: BTreeSet<Item>, now: Instant) -> Vec<Item> {
        let mut since = self.since.lock().unwrap_or_else(|p| p.into_inner());
        since.retain(|item, _| now_collectable.contains(item));
        let mut due = Vec::new();
        for item in now_collectable {
            let first = *since.entry(item.clone()).or_insert(now);
            if now.duration_since(first) >= self.after {
                due.push(item);
            }
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_scheduler::{Reported, StopReason};

    fn v<T>(value: T, rev: i64) -> Versioned<T> {
        Versioned {
            value,
            mod_revision: rev,
        }
    }

    fn job(id: &str, stopped: bool) -> FleetJob {
        let text = format!(
            "job \"{id}\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"raw_exec\"\n      config {{\n        command = \"/bin/true\"\n      }}\n    }}\n  }}\n}}\n"
        );
        FleetJob {
            spec: berth_job::JobSpec::parse_hcl(std::path::Path::new("job.hcl"), &text)
                .unwrap_or_else(|e| panic!("{e}")),
            version: 1,
            stopped,
            submitted_ms: 0,
        }
    }

    fn alloc(id: &str, job: &str, node: &str, desired: Desired) -> FleetAlloc {
        FleetAlloc {
            id: id.into(),
            job_id: job.into(),
            job_version: 1,
            group: "g".into(),
            index: 0,
            node_id: node.into(),
            desired,
            stop_reason: (desired == Desired::Stop).then_some(StopReason::JobStopped),
            priority: 50,
            ask: Default::default(),
            devices: BTreeMap::new(),
            volumes: BTreeMap::new(),
            preempts: Vec::new(),
            created_ms: 0,
        }
    }

    fn report(node: &str, r: Reported) -> AllocReport {
        AllocReport {
            node_id: node.into(),
            reported: r,
            status: berth_api::jobs::AllocStatus {
                alloc_id: "x".into(),
                job_id: "j".into(),
                group: "g".into(),
                index: 0,
                desired: berth_api::jobs::DesiredState::Run,
                client_status: berth_api::jobs::ClientStatus::Running,
                failure: None,
                tasks: BTreeMap::new(),
                volumes: BTreeMap::new(),
                events: Vec::new(),
                events_dropped: 0,
            },
        }
    }

    #[test]
    fn only_what_is_done_is_collectable() {
        let jobs: BTreeMap<_, _> = [
            ("live".to_string(), v(job("live", false), 10)),
            ("gone".to_string(), v(job("gone", true), 11)),
            ("busy".to_string(), v(job("busy", true), 12)),
        ]
        .into();
        let allocs: BTreeMap<_, _> = [
            // Still wanted: never collected, finished or not.
            ("l1", alloc("l1", "live", "n1", Desired::Run)),
            // Stopped and finished on a ready node.
            ("l2", alloc("l2", "live", "n1", Desired::Stop)),
            // Stopped, not finished yet, on a ready node.
            ("l3", alloc("l3", "live", "n1", Desired::Stop)),
            // Stopped on a node that is down.
            ("l4", alloc("l4", "live", "n2", Desired::Stop)),
            ("g1", alloc("g1", "gone", "n1", Desired::Stop)),
            ("g2", alloc("g2", "gone", "n9", Desired::Stop)),
            ("b1", alloc("b1", "busy", "n1", Desired::Stop)),
        ]
        .into_iter()
        .enumerate()
        .map(|(i, (id, a))| (id.to_string(), v(a, 20 + i as i64)))
        .collect();
        let reports: BTreeMap<_, _> = [
            ("l1", Reported::Complete),
            ("l2", Reported::Complete),
            ("l3", Reported::Running),
            ("g1", Reported::Failed),
            ("b1", Reported::Running),
            ("orphan", Reported::Complete),
        ]
        .into_iter()
        .enumerate()
        .map(|(i, (id, r))| (id.to_string(), v(report("n1", r), 40 + i as i64)))
        .collect();
        let placements: BTreeMap<String, i64> = [("gone".to_string(), 50)].into();
        let nodes: BTreeMap<String, NodeState> = [
            ("n1".to_string(), NodeState::Ready),
            ("n2".to_string(), NodeState::Down),
        ]
        .into();
        let h = History {
            jobs: &jobs,
            allocs: &allocs,
            reports: &reports,
            placements: &placements,
            nodes: &nodes,
        };
        let items: Vec<Item> = h.collectable().into_iter().collect();
        assert_eq!(
            items,
            vec![
                Item::Alloc("l2".into()),
                Item::Alloc("l4".into()),
                Item::Job("gone".into()),
                Item::Report("orphan".into()),
            ]
        );
        let key = |dir: &str, id: &str| format!("/p/{dir}/{id}");
        let job_deletes: Vec<(String, i64)> = h
            .deletes(&Item::Job("gone".into()), key)
            .into_iter()
            .map(|w| {
                assert!(w.value.is_none());
                (w.key, w.expected)
            })
            .collect();
        assert_eq!(
            job_deletes,
            vec![
                ("/p/jobs/gone".to_string(), 11),
                ("/p/placements/gone".to_string(), 50),
                ("/p/allocs/g1".to_string(), 24),
                ("/p/reports/g1".to_string(), 43),
                ("/p/allocs/g2".to_string(), 25),
            ]
        );
    }

    #[test]
    fn an_item_is_due_only_after_it_stayed_collectable_for_the_wait() {
        let c = Collector::new(Duration::from_secs(10));
        let t0 = Instant::now();
        let a = Item::Alloc("a".into());
        let set = |items: &[&Item]| items.iter().map(|i| (*i).clone()).collect::<BTreeSet<_>>();
        assert!(c.due(set(&[&a]), t0).is_empty());
        assert!(c.due(set(&[&a]), t0 + Duration::from_secs(9)).is_empty());
        // No longer collectable (run again, say): its clock starts over.
        assert!(c.due(set(&[]), t0 + Duration::from_secs(9)).is_empty());
        assert!(c.due(set(&[&a]), t0 + Duration::from_secs(10)).is_empty());
        assert_eq!(
            c.due(set(&[&a]), t0 + Duration::from_secs(20)),
            vec![a.clone()]
        );
        c.reset();
        assert!(c.due(set(&[&a]), t0 + Duration::from_secs(30)).is_empty());
    }
}
