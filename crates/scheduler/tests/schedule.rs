//! The scheduler's decisions over simulated fleets.

use std::{collections::BTreeMap, path::Path};

use berth_api::nodes::{DriverState, FleetNode, NodeResources, NodeState};
use berth_scheduler::{
    Cluster, Context, Desired, FleetAlloc, FleetJob, Plan, Reported, StopReason, schedule,
};

fn node(id: &str, class: &str, cpu: u64, mem: u64) -> FleetNode {
    FleetNode {
        id: id.into(),
        name: id.into(),
        datacenter: "dc1".into(),
        node_class: class.into(),
        drivers: vec![DriverState {
            name: "raw_exec".into(),
            healthy: true,
            description: String::new(),
        }],
        resources: NodeResources {
            cpu_mhz: cpu,
            memory_mb: mem,
        },
        status: NodeState::Ready,
        attributes: BTreeMap::from([("kernel.name".to_string(), "linux".to_string())]),
        ..Default::default()
    }
}

fn job(text: &str, version: u64) -> FleetJob {
    FleetJob {
        spec: berth_job::JobSpec::parse_hcl(Path::new("job.hcl"), text)
            .unwrap_or_else(|e| panic!("{e}")),
        version,
        stopped: false,
        submitted_ms: 0,
    }
}

fn service(id: &str, count: u32, priority: u8, memory: u32, extra: &str) -> FleetJob {
    job(
        &format!(
            r#"job "{id}" {{
  priority = {priority}
  {extra}
  group "g" {{
    count = {count}
    task "t" {{
      driver = "raw_exec"
      config {{ command = "/bin/true" }}
      resources {{
        cpu    = 100
        memory = {memory}
      }}
    }}
  }}
}}"#
        ),
        1,
    )
}

fn run(job: &FleetJob, allocs: &[FleetAlloc], cluster: &mut Cluster) -> Plan {
    let mine: Vec<(&FleetAlloc, Option<Reported>)> = allocs
        .iter()
        .filter(|a| a.job_id == job.spec.id)
        .map(|a| (a, Some(Reported::Running)))
        .collect();
    let mut n = 0;
    let mut new_id = |g: &str, i: u32| {
        n += 1;
        format!("{}-{g}-{i}-{n}", job.spec.id)
    };
    let volume = |_: &str| None;
    let mut cx = Context {
        volume: &volume,
        new_id: &mut new_id,
        now_ms: 1,
    };
    schedule(job, &mine, cluster, &mut cx)
}

fn fleet(nodes: Vec<FleetNode>, allocs: &[FleetAlloc]) -> Cluster {
    Cluster::new(nodes, allocs.iter().map(|a| (a, Some(Reported::Running))))
}

#[test]
fn copies_of_a_group_spread_over_equal_nodes() {
    let nodes = vec![
        node("a", "", 4000, 4096),
        node("b", "", 4000, 4096),
        node("c", "", 4000, 4096),
    ];
    let j = service("web", 3, 50, 256, "");
    let mut c = fleet(nodes, &[]);
    let plan = run(&j, &[], &mut c);
    assert!(plan.failures.is_empty(), "{:?}", plan.failures);
    let mut on: Vec<&str> = plan.place.iter().map(|a| a.node_id.as_str()).collect();
    on.sort_unstable();
    assert_eq!(on, ["a", "b", "c"]);
    // Once placed, nothing more to do.
    let again = run(
        &j,
        &plan.place,
        &mut fleet(
            vec![
                node("a", "", 4000, 4096),
                node("b", "", 4000, 4096),
                node("c", "", 4000, 4096),
            ],
            &plan.place,
        ),
    );
    assert!(again.is_empty(), "{again:?}");
}

#[test]
fn bin_packing_fills_the_fuller_node_when_spreading_is_not_asked() {
    // One alloc each: the node already holding more is preferred.
    let nodes = vec![node("a", "", 4000, 4096), node("b", "", 4000, 4096)];
    let other = service("other", 1, 50, 2048, "");
    let mut c = fleet(nodes.clone(), &[]);
    let first = run(&other, &[], &mut c);
    let busy = first.place[0].node_id.clone();
    let j = service("web", 1, 50, 512, "");
    let plan = run(&j, &[], &mut fleet(nodes, &first.place));
    assert_eq!(plan.place[0].node_id, busy);
}

#[test]
fn unplaceable_groups_say_why_per_node_class() {
    let mut small = node("s", "small", 4000, 256);
    small.meta.insert("rack".into(), "r1".into());
    let mut other = node("o", "gpu", 4000, 8192);
    other
        .attributes
        .insert("kernel.name".into(), "freebsd".into());
    let j = service(
        "web",
        1,
        50,
        1024,
        r#"constraint {
    attribute = "${attr.kernel.name}"
    value     = "linux"
  }"#,
    );
    let plan = run(&j, &[], &mut fleet(vec![small, other], &[]));
    assert!(plan.place.is_empty());
    let f = &plan.failures[0];
    assert_eq!(f.unplaced, 1);
    assert_eq!(f.nodes_evaluated, 2);
    assert_eq!(f.by_class["small"]["resources exhausted: memory"], 1);
    let gpu: Vec<&String> = f.by_class["gpu"].keys().collect();
    assert!(
        gpu[0].contains("constraint ${attr.kernel.name} = \"linux\" failed"),
        "{gpu:?}"
    );
    let text = f.to_string();
    assert!(
        text.contains("class small") && text.contains("class gpu"),
        "{text}"
    );
}

#[test]
fn a_higher_priority_job_preempts_lower_ones_and_they_move_if_they_can() {
    let nodes = vec![node("a", "", 4000, 1024)];
    let low = service("low", 1, 20, 800, "");
    let mut c = fleet(nodes.clone(), &[]);
    let placed = run(&low, &[], &mut c).place;
    assert_eq!(placed[0].node_id, "a");
    // Not enough priority difference: no preemption.
    let near = service("near", 1, 25, 800, "");
    let plan = run(&near, &placed, &mut fleet(nodes.clone(), &placed));
    assert!(plan.place.is_empty() && plan.stop.is_empty());
    let high = service("high", 1, 80, 800, "");
    let plan = run(&high, &placed, &mut fleet(nodes, &placed));
    assert_eq!(plan.place.len(), 1);
    assert_eq!(plan.place[0].preempts, vec![placed[0].id.clone()]);
    assert_eq!(plan.stop.len(), 1);
    assert_eq!(
        plan.stop[0].reason,
        StopReason::Preempted {
            by: plan.place[0].id.clone()
        }
    );
    // The preempted alloc is placed again where it fits.
    let mut stopped = placed[0].clone();
    stopped.desired = Desired::Stop;
    let all = vec![stopped, plan.place[0].clone()];
    let two = vec![node("a", "", 4000, 1024), node("b", "", 4000, 1024)];
    let again = run(&low, &all, &mut fleet(two, &all));
    assert_eq!(again.place.len(), 1);
    assert_eq!(again.place[0].node_id, "b");
}

#[test]
fn system_jobs_run_once_on_every_eligible_node() {
    let mut gone = node("c", "", 4000, 4096);
    gone.status = NodeState::Down;
    let nodes = vec![node("a", "", 4000, 4096), node("b", "", 4000, 4096), gone];
    let j = job(
        r#"job "sys" {
  type = "system"
  group "g" {
    task "t" {
      driver = "raw_exec"
      config { command = "/bin/true" }
    }
  }
}"#,
        1,
    );
    let plan = run(&j, &[], &mut fleet(nodes, &[]));
    let mut on: Vec<&str> = plan.place.iter().map(|a| a.node_id.as_str()).collect();
    on.sort_unstable();
    assert_eq!(on, ["a", "b"]);
}

#[test]
fn draining_nodes_give_their_allocs_back_and_new_versions_replace_old_ones() {
    let nodes = vec![node("a", "", 4000, 4096), node("b", "", 4000, 4096)];
    let j = service("web", 1, 50, 256, "");
    let placed = run(&j, &[], &mut fleet(nodes.clone(), &[])).place;
    let on = placed[0].node_id.clone();
    let mut drained = nodes.clone();
    for n in &mut drained {
        if n.id == on {
            n.status = NodeState::Draining;
        }
    }
    let plan = run(&j, &placed, &mut fleet(drained, &placed));
    assert_eq!(plan.stop[0].reason, StopReason::Drained);
    assert_ne!(plan.place[0].node_id, on);
    let mut v2 = service("web", 1, 50, 300, "");
    v2.version = 2;
    let plan = run(&v2, &placed, &mut fleet(nodes, &placed));
    assert_eq!(plan.stop[0].reason, StopReason::Updated);
    assert_eq!(plan.place[0].job_version, 2);
}

#[test]
fn spread_targets_and_distinct_hosts_are_followed() {
    let mut nodes = Vec::new();
    for (id, dc) in [("a", "dc1"), ("b", "dc1"), ("c", "dc2"), ("d", "dc2")] {
        let mut n = node(id, "", 8000, 8192);
        n.datacenter = dc.into();
        nodes.push(n);
    }
    let j = service(
        "web",
        4,
        50,
        128,
        r#"spread {
    attribute = "${node.datacenter}"
    target "dc1" { percent = 75 }
    target "dc2" { percent = 25 }
  }"#,
    );
    let plan = run(&j, &[], &mut fleet(nodes.clone(), &[]));
    let in_dc1 = plan
        .place
        .iter()
        .filter(|a| a.node_id == "a" || a.node_id == "b")
        .count();
    assert_eq!(in_dc1, 3, "{:?}", plan.place);
    let j = service(
        "one-each",
        5,
        50,
        128,
        r#"constraint { distinct_hosts = true }"#,
    );
    let plan = run(&j, &[], &mut fleet(nodes, &[]));
    assert_eq!(plan.place.len(), 4);
    assert_eq!(plan.failures[0].unplaced, 1);
    assert!(plan.failures[0].to_string().contains("distinct_hosts"));
}

#[test]
fn lost_nodes_lose_their_allocs_after_the_grace() {
    let nodes = vec![node("a", "", 4000, 4096)];
    let j = service("web", 1, 50, 256, "");
    let placed = run(&j, &[], &mut fleet(nodes, &[])).place;
    let down = BTreeMap::from([("a".to_string(), 100u64)]);
    assert!(berth_scheduler::lost(&placed, &down, 99).is_empty());
    let lost = berth_scheduler::lost(&placed, &down, 100);
    assert_eq!(lost[0].reason, StopReason::NodeLost);
}
