//! A fleet on a three-member etcd survives the loss of the etcd leader: the allocs that run
//! when it is killed complete and are reported, every node stays registered (its lease kept
//! alive through another member), and new jobs are still placed and run.

mod agent_support;

use std::{collections::BTreeMap, time::Duration};

use agent_support::{
    AgentProcess, berth,
    fleet::ready_nodes,
    jobs::{run_job, wait_job_before},
};
use berth_api::{
    Client,
    jobs::{ClientStatus, JobStatus},
    nodes::{NodeList, NodeState},
};
use berth_testkit::EtcdCluster;
use tokio::{sync::oneshot, time::Instant};

const NAMES: [&str; 3] = ["alpha", "beta", "gamma"];

/// A node named `name` in the fleet under prefix `/e` on every member of `cluster`, with a
/// 3 s lease (kept alive every second).
fn config(cluster: &EtcdCluster, name: &str) -> String {
    let endpoints: Vec<String> = cluster
        .endpoints()
        .iter()
        .map(|e| format!("\"{e}\""))
        .collect();
    format!(
        "name = \"{name}\"\ncontrol_plane {{\n  etcd {{\n    endpoints = [{}]\n    prefix = \"/e\"\n    lease_ttl = \"3s\"\n  }}\n}}\n",
        endpoints.join(", ")
    )
}

/// When each node registered, by name.
fn registered(list: &NodeList) -> BTreeMap<String, u64> {
    list.nodes
        .iter()
        .map(|n| (n.name.clone(), n.registered_ms))
        .collect()
}

/// A batch job of `count` raw_exec tasks that each wait until `file` exists.
fn waiter(id: &str, count: u32, file: &std::path::Path) -> String {
    format!(
        r#"job "{id}" {{
  type = "batch"
  group "g" {{
    count = {count}
    task "wait" {{
      driver = "raw_exec"
      config {{
        command = "/bin/sh"
        args    = ["-c", "until [ -e \"$0\" ]; do sleep 0.05; done", "{}"]
      }}
      resources {{
        cpu    = 50
        memory = 64
      }}
    }}
  }}
}}"#,
        file.display()
    )
}

/// A batch job of two tasks that exit at once.
const AFTER: &str = r#"job "after" {
  type = "batch"
  group "g" {
    count = 2
    task "t" {
      driver = "raw_exec"
      config { command = "/bin/true" }
    }
  }
}"#;

/// The allocs whose tasks run (with a pid), with their nodes.
fn running(s: &JobStatus) -> BTreeMap<String, String> {
    s.placements
        .iter()
        .filter(|p| {
            s.allocs.iter().any(|a| {
                a.alloc_id == p.alloc_id
                    && a.client_status == ClientStatus::Running
                    && a.tasks.values().all(|t| t.pid.is_some())
            })
        })
        .map(|p| (p.alloc_id.clone(), p.node_name.clone()))
        .collect()
}

fn all_complete(s: &JobStatus, n: usize) -> bool {
    s.allocs.len() == n
        && s.allocs
            .iter()
            .all(|a| a.client_status == ClientStatus::Complete)
}

fn all_ready(l: &NodeList) -> bool {
    l.nodes.len() == 3 && l.nodes.iter().all(|n| n.status == NodeState::Ready)
}

fn states(l: &NodeList) -> Vec<(&str, NodeState)> {
    l.nodes
        .iter()
        .map(|n| (n.name.as_str(), n.status))
        .collect()
}

/// Asks every agent for its node list every poll interval until `stop`; returns how many
/// lists were read and the first few answers in which a node was not ready (or that failed).
async fn sample_nodes(
    agents: Vec<(&'static str, Client)>,
    mut stop: oneshot::Receiver<()>,
) -> (usize, Vec<String>) {
    let started = Instant::now();
    let (mut reads, mut bad) = (0, Vec::new());
    loop {
        for (name, client) in &agents {
            reads += 1;
            let seen = match client.nodes().await {
                Ok(l) if all_ready(&l) => continue,
                Ok(l) => format!("{:?}", states(&l)),
                Err(e) => format!("error: {e}"),
            };
            if bad.len() < 10 {
                bad.push(format!(
                    "{:?} after the kill, {name} saw {seen}",
                    started.elapsed()
                ));
            }
        }
        tokio::select! {
            _ = &mut stop => return (reads, bad),
            () = tokio::time::sleep(berth_testkit::POLL_INTERVAL) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_completes_when_the_etcd_leader_is_killed() {
    let mut cluster = EtcdCluster::start(3).expect("etcd");
    let mut agents = Vec::new();
    for name in NAMES {
        agents.push(AgentProcess::start(&config(&cluster, name)).await);
    }
    let before = registered(&ready_nodes(&agents[0], 3).await);
    for a in &agents[1..] {
        ready_nodes(a, 3).await;
    }

    let gate = tempfile::tempdir().expect("tempdir");
    let go = gate.path().join("go");
    let placed = run_job(&agents[1].client(), waiter("work", 3, &go))
        .await
        .expect("job run");
    assert_eq!(placed.version, Some(1), "{placed:#?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let work = wait_job_before(&agents[2], "work", deadline, |s| running(s).len() == 3).await;
    let where_placed = running(&work);

    // Kill -9 the etcd leader while the tasks run; the two others elect a new one.
    let clients = NAMES
        .iter()
        .zip(&agents)
        .map(|(n, a)| (*n, a.client()))
        .collect();
    let old = cluster
        .wait_leader(Duration::from_secs(10))
        .expect("an etcd leader");
    cluster.kill(old);
    let killed_at = Instant::now();
    let (stop, stopped) = oneshot::channel();
    let sampler = tokio::spawn(sample_nodes(clients, stopped));
    let new = cluster
        .wait_leader(Duration::from_secs(10))
        .expect("a new etcd leader");
    assert_ne!(new, old);

    // The tasks finish; every agent sees every alloc complete, where it was placed.
    // Bounds keep the whole test under the runner's limit, so clean-up always runs.
    std::fs::write(&go, b"").expect("release the tasks");
    let deadline = killed_at + Duration::from_secs(45);
    for a in &agents {
        let done = wait_job_before(a, "work", deadline, |s| all_complete(s, 3)).await;
        let ran: BTreeMap<String, String> = done
            .placements
            .iter()
            .map(|p| (p.alloc_id.clone(), p.node_name.clone()))
            .collect();
        assert_eq!(ran, where_placed, "no alloc was moved: {done:#?}");
        assert!(
            done.placements.iter().all(|p| p.stop_reason.is_none()),
            "{done:#?}"
        );
    }
    let completed = killed_at.elapsed();
    let list = agents[0].client().jobs().await.expect("GET /v1/jobs");
    let summary = list.jobs.iter().find(|j| j.id == "work").expect("job work");
    let counts: Vec<(&str, usize)> = summary
        .allocs
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(s, n)| (s.as_str(), *n))
        .collect();
    assert_eq!(counts, [("complete", 3)], "{summary:#?}");
    let out = berth(&agents[2], &["job", "status", "work"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text.matches("complete").count(), 3, "{text}");

    // No node was ever seen down or draining, and none had to register again.
    let _ = stop.send(());
    let (reads, bad) = sampler.await.expect("the node sampler");
    assert!(reads > 0);
    assert!(bad.is_empty(), "a node went down:\n{}", bad.join("\n"));
    for a in &agents {
        let after = registered(&ready_nodes(a, 3).await);
        assert_eq!(
            after, before,
            "a node's lease lapsed and it registered again (when each node registered)"
        );
    }

    // With two members of three, a new job is still placed and run.
    let spec = gate.path().join("after.hcl");
    std::fs::write(&spec, AFTER).expect("write the spec");
    let out = berth(&agents[0], &["job", "run", &spec.display().to_string()]).await;
    assert!(
        out.status.success(),
        "job run with two etcd members of three: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = wait_job_before(&agents[2], "after", deadline, |s| all_complete(s, 2)).await;
    assert!(after.failures.is_empty(), "{after:#?}");

    eprintln!(
        "etcd leader m{old} killed; m{new} leads; the job completed {completed:?} after the kill"
    );
}
