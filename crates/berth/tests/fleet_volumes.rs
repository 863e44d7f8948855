//! CSI volumes in a fleet on a real etcd, with real plugins: three agents, each in its own
//! mount namespace, each with its own copy of berth-hostpath on one shared state directory
//! (storage every node reaches); only the first agent runs the plugin's controller.
//!
//! - A job with `count = 3` and a per-alloc volume runs one alloc per node; each node stages
//!   and publishes its own volume; every controller RPC runs on the controller's node (asked
//!   through etcd by the others); stopping the job releases everything in CSI order.
//! - A paused node's alloc moves: its claim is freed after ControllerUnpublishVolume for it,
//!   the alloc runs on another node, and the paused node, resumed, unmounts its copy.

mod agent_support;

use std::{path::Path, time::Duration};

use agent_support::{
    AgentProcess, berth, client_config,
    fleet::wait_nodes,
    jobs::{run_job, wait_job_before},
    poll_api,
};
use berth_api::{
    jobs::{ClientStatus, JobStatus},
    nodes::{NodeList, NodeState},
    volumes::{ClaimState, SpecFormat, VolumeSpecRequest, VolumeStatus},
};
use berth_testkit::EtcdCluster;
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

/// Agent `name`: a copy of berth-hostpath on the shared state dir (`role` `monolith` on the
/// controller's node, `node` elsewhere), in the fleet under `/v`: 3 s leases, allocs lost and
/// claims freed 2 s after a node went down.
fn config(name: &str, role: &str, shared: &Path, lost_claims: &str) -> String {
    let hostpath = berth_testkit::bin_path("berth-hostpath");
    let args = [
        "--statedir".to_string(),
        shared.join("state").display().to_string(),
        "--shared".into(),
        "--nodeid".into(),
        name.into(),
        "--strict".into(),
        "--call-log".into(),
        shared.join("calls").display().to_string(),
    ];
    format!(
        "name = \"{name}\"\n\
         health {{\n  interval = \"200ms\"\n  failures = 2\n}}\n\
         plugin \"hp\" {{\n  type = \"{role}\"\n  command = \"{}\"\n  args = {args:?}\n}}\n\
         {}\
         control_plane {{\n  etcd {{\n    prefix = \"/v\"\n    lease_ttl = \"3s\"\n    lost_after = \"2s\"\n    lost_claims {{\n      after = \"{lost_claims}\"\n    }}\n  }}\n}}\n",
        hostpath.display(),
        client_config("")
    )
}

async fn join(cluster: &EtcdCluster, name: &str, role: &str, shared: &Path) -> AgentProcess {
    join_with(cluster, name, role, shared, "2s").await
}

async fn join_with(
    cluster: &EtcdCluster,
    name: &str,
    role: &str,
    shared: &Path,
    lost_claims: &str,
) -> AgentProcess {
    let agent = AgentProcess::start_in_namespace_with(
        &config(name, role, shared, lost_claims),
        &["--etcd", &cluster.endpoints_csv()],
    )
    .await;
    agent
        .wait_plugin("hp", Duration::from_secs(20), |p| p.health.healthy)
        .await;
    agent
}

async fn ready_nodes(agent: &AgentProcess, n: usize) -> NodeList {
    wait_nodes(agent, "ready nodes with the plugin", move |l| {
        l.nodes
            .iter()
            .filter(|x| x.status == NodeState::Ready && !x.csi_plugins.is_empty())
            .count()
            == n
            && l.nodes.iter().any(|x| !x.csi_controllers.is_empty())
    })
    .await
}

/// Creates volume `id` through `agent` (which may have no controller).
async fn create(agent: &AgentProcess, id: &str) -> VolumeStatus {
    let spec = format!(
        "id = \"{id}\"\ntype = \"csi\"\nplugin_id = \"hp\"\ncapacity_min = \"1MiB\"\n\
         capability {{\n  access_mode = \"single-node-writer\"\n  attachment_mode = \"file-system\"\n}}\n"
    );
    agent
        .client()
        .create_volume(&VolumeSpecRequest {
            spec,
            format: SpecFormat::Hcl,
            file: None,
        })
        .await
        .unwrap_or_else(|e| panic!("create {id}: {e}\n{}", agent.log()))
}

/// A service job of `count` allocs, each claiming `source` (`per_alloc`: its own copy) and
/// writing its alloc id into it; `rule` goes into the group.
fn job(id: &str, count: u32, source: &str, per_alloc: bool, rule: &str) -> String {
    format!(
        r#"job "{id}" {{
  group "g" {{
    count = {count}
    {rule}
    volume "data" {{
      type            = "csi"
      source          = "{source}"
      per_alloc       = {per_alloc}
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
    }}
    task "main" {{
      driver = "exec"
      config {{
        command = "/bin/sh"
        args    = ["-c", "echo $NOMAD_ALLOC_ID > /data/owner && exec sleep 600"]
      }}
      volume_mount {{
        volume      = "data"
        destination = "/data"
      }}
      kill_timeout = "2s"
    }}
  }}
}}"#
    )
}

/// Allocs that should run and run, with their node names.
fn running(s: &JobStatus) -> Vec<(String, String)> {
    s.placements
        .iter()
        .filter(|p| p.desired == "run")
        .filter(|p| {
            s.allocs
                .iter()
                .any(|a| a.alloc_id == p.alloc_id && a.client_status == ClientStatus::Running)
        })
        .map(|p| (p.alloc_id.clone(), p.node_name.clone()))
        .collect()
}

/// The lines of the shared call log about `external_id`: (index, rpc, code).
fn calls_of(log: &str, external_id: &str) -> Vec<(usize, String, String)> {
    log.lines()
        .enumerate()
        .filter_map(|(i, l)| {
            let mut f = l.split_whitespace();
            let (rpc, vol, code) = (f.next()?, f.next()?, f.next()?);
            (vol == external_id).then(|| (i, rpc.to_string(), code.to_string()))
        })
        .collect()
}

/// The index of the last successful `rpc` call in `calls`.
fn last_ok(calls: &[(usize, String, String)], rpc: &str) -> Option<usize> {
    calls
        .iter()
        .filter(|(_, r, c)| r == rpc && c == "OK")
        .map(|(i, _, _)| *i)
        .next_back()
}

/// Polls volume `id` through `agent` until `pred` holds (bounded).
async fn wait_volume(
    agent: &AgentProcess,
    id: &str,
    what: &str,
    pred: impl Fn(&VolumeStatus) -> bool,
) -> VolumeStatus {
    let id = id.to_string();
    poll_api(
        agent,
        what,
        tokio::time::Instant::now() + Duration::from_secs(60),
        move |c| {
            let id = id.clone();
            async move { c.volume(&id).await.expect("volume status") }
        },
        pred,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_alloc_volumes_over_three_nodes_with_one_controller_and_a_lost_node() {
    let cluster = EtcdCluster::single().expect("etcd");
    let shared = tempfile::Builder::new()
        .prefix("bfv")
        .tempdir_in("/tmp")
        .unwrap();
    let n1 = join(&cluster, "n1", "monolith", shared.path()).await;
    let n2 = join(&cluster, "n2", "node", shared.path()).await;
    let n3 = join(&cluster, "n3", "node", shared.path()).await;
    let nodes = ready_nodes(&n2, 3).await;
    let with_controller: Vec<&str> = nodes
        .nodes
        .iter()
        .filter(|n| !n.csi_controllers.is_empty())
        .map(|n| n.name.as_str())
        .collect();
    assert_eq!(with_controller, ["n1"]);

    // n2 has no controller: CreateVolume runs on n1, asked through etcd.
    let mut external = Vec::new();
    for i in 0..3 {
        external.push(create(&n2, &format!("vol[{i}]")).await.external_id);
    }
    assert!(
        n1.log()
            .contains("serving a controller RPC for another node")
    );

    run_job(
        &n3.client(),
        job(
            "pa",
            3,
            "vol",
            true,
            "constraint {\n      operator = \"distinct_hosts\"\n      value = \"true\"\n    }",
        ),
    )
    .await
    .expect("job run");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let up = wait_job_before(&n1, "pa", deadline, |s| running(s).len() == 3).await;
    let mut on: Vec<String> = running(&up).into_iter().map(|(_, n)| n).collect();
    on.sort();
    assert_eq!(on, ["n1", "n2", "n3"], "one alloc per node: {up:#?}");
    let agents = [("n1", &n1), ("n2", &n2), ("n3", &n3)];
    for (i, ext) in external.iter().enumerate() {
        let vol = format!("vol[{i}]");
        let status = n1.client().volume(&vol).await.unwrap();
        let claim = &status.claims[0];
        let node = &up
            .placements
            .iter()
            .find(|p| p.alloc_id == claim.alloc_id)
            .unwrap()
            .node_name;
        let (_, agent) = agents.iter().find(|(n, _)| n == node).unwrap();
        // Its node staged and published it; the other nodes did not.
        let here = agent.client().volume(&vol).await.unwrap();
        assert!(
            !here.usages.is_empty(),
            "{vol} is not in use on {node}: {here:#?}"
        );
        for (other, a) in &agents {
            if other != node {
                let there = a.client().volume(&vol).await.unwrap();
                assert!(
                    there.usages.is_empty(),
                    "{vol} in use on {other}: {there:#?}"
                );
            }
        }
        let log = std::fs::read_to_string(shared.path().join("calls")).unwrap();
        let calls = calls_of(&log, ext);
        let publish = last_ok(&calls, "ControllerPublishVolume").expect("controller published");
        let stage = last_ok(&calls, "NodeStageVolume").expect("staged");
        let node_publish = last_ok(&calls, "NodePublishVolume").expect("published");
        assert!(publish < stage && stage < node_publish, "{calls:?}");
    }
    // ControllerPublishVolume for n2's and n3's allocs ran on n1, asked by them.
    let served = n1
        .log()
        .matches("serving a controller RPC for another node")
        .count();
    assert!(served >= 5, "n1 served {served} requests:\n{}", n1.log());
    for a in [&n2, &n3] {
        assert!(a.log().contains("controller RPC sent to another node"));
        assert!(!a.log().contains("serving a controller RPC"));
    }

    // Stop: every node unpublishes and unstages, then the controller unpublishes.
    n2.client().stop_job("pa").await.expect("job stop");
    for i in 0..3 {
        wait_volume(&n1, &format!("vol[{i}]"), "claims freed", |v| {
            v.claims.is_empty()
        })
        .await;
    }
    let log = std::fs::read_to_string(shared.path().join("calls")).unwrap();
    for ext in &external {
        let calls = calls_of(&log, ext);
        let unpublish = last_ok(&calls, "NodeUnpublishVolume").expect("node unpublished");
        let unstage = last_ok(&calls, "NodeUnstageVolume").expect("unstaged");
        let controller =
            last_ok(&calls, "ControllerUnpublishVolume").expect("controller unpublished");
        assert!(unpublish < unstage && unstage < controller, "{calls:?}");
    }

    // A node is lost: its claim is freed after ControllerUnpublishVolume for it, and its
    // alloc runs elsewhere (not on n1, which keeps the controller).
    let solo = create(&n1, "solo").await.external_id;
    let not_n1 = "constraint {\n      attribute = \"${node.unique.name}\"\n      operator = \"!=\"\n      value = \"n1\"\n    }";
    run_job(&n1.client(), job("solo", 1, "solo", false, not_n1))
        .await
        .expect("job run");
    let first = wait_job_before(&n1, "solo", deadline, |s| running(s).len() == 1).await;
    let (old_alloc, old_node) = running(&first)[0].clone();
    let (paused, other, other_name) = if old_node == "n2" {
        (&n2, &n3, "n3")
    } else {
        (&n3, &n2, "n2")
    };
    wait_volume(paused, "solo", "the claim mounted", |v| {
        v.claims.iter().any(|c| c.state == ClaimState::Claimed) && !v.usages.is_empty()
    })
    .await;
    let pid = Pid::from_raw(i32::try_from(paused.pid()).unwrap());
    kill(pid, Signal::SIGSTOP).unwrap();
    let stopped_at = tokio::time::Instant::now();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let moved = wait_job_before(&n1, "solo", deadline, |s| {
        running(s).iter().any(|(id, _)| *id != old_alloc)
    })
    .await;
    let (new_alloc, new_node) = running(&moved)
        .into_iter()
        .find(|(id, _)| *id != old_alloc)
        .unwrap();
    assert_eq!(new_node, other_name);
    // Lease (3 s), then the claims' grace (2 s): never sooner.
    let took = stopped_at.elapsed();
    assert!(took >= Duration::from_secs(4), "moved after {took:?}");
    eprintln!("the lost node's alloc ran elsewhere {took:?} after the node was paused");
    let status = n1.client().volume("solo").await.unwrap();
    assert_eq!(status.claims.len(), 1, "{status:#?}");
    assert_eq!(status.claims[0].alloc_id, new_alloc);
    let log = std::fs::read_to_string(shared.path().join("calls")).unwrap();
    let calls = calls_of(&log, &solo);
    let unpublish_lost = calls
        .iter()
        .position(|(_, r, c)| r == "ControllerUnpublishVolume" && c == "OK")
        .expect("ControllerUnpublishVolume for the lost node");
    let publish_new = calls
        .iter()
        .rposition(|(_, r, c)| r == "ControllerPublishVolume" && c == "OK")
        .unwrap();
    assert!(unpublish_lost < publish_new, "{calls:?}");
    assert!(other.client().volume("solo").await.unwrap().usages.len() == 1);

    // Resumed: the paused node stops its copy and unmounts the volume whose claim was freed.
    kill(pid, Signal::SIGCONT).unwrap();
    wait_volume(paused, "solo", "the resumed node unmounted", |v| {
        v.usages.is_empty()
    })
    .await;
    let log = paused.log();
    assert!(
        log.contains("stopping the alloc as the fleet asks"),
        "{log}"
    );
    let end = wait_job_before(&n1, "solo", deadline, |s| {
        s.allocs
            .iter()
            .any(|a| a.alloc_id == old_alloc && a.client_status.is_terminal())
    })
    .await;
    assert_eq!(running(&end), vec![(new_alloc.clone(), new_node)]);
    // The claim is the new alloc's alone, mounted once.
    let status = n1.client().volume("solo").await.unwrap();
    assert_eq!(status.claims.len(), 1);
    assert_eq!(status.claims[0].alloc_id, new_alloc);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_manual_policy_a_down_node_keeps_its_claims_until_an_operator_detaches() {
    let cluster = EtcdCluster::single().expect("etcd");
    let shared = tempfile::Builder::new()
        .prefix("bfm")
        .tempdir_in("/tmp")
        .unwrap();
    let n1 = join_with(&cluster, "n1", "monolith", shared.path(), "manual").await;
    let n2 = join_with(&cluster, "n2", "node", shared.path(), "manual").await;
    let n3 = join_with(&cluster, "n3", "node", shared.path(), "manual").await;
    ready_nodes(&n1, 3).await;
    create(&n1, "solo").await;
    let not_n1 = "constraint {\n      attribute = \"${node.unique.name}\"\n      operator = \"!=\"\n      value = \"n1\"\n    }";
    run_job(&n1.client(), job("solo", 1, "solo", false, not_n1))
        .await
        .expect("job run");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let first = wait_job_before(&n1, "solo", deadline, |s| running(s).len() == 1).await;
    let (old_alloc, old_node) = running(&first)[0].clone();
    let (paused, other_name) = if old_node == "n2" {
        (&n2, "n3")
    } else {
        (&n3, "n2")
    };
    let paused_id = first
        .placements
        .iter()
        .find(|p| p.alloc_id == old_alloc)
        .unwrap()
        .node_id
        .clone();

    // Detaching a live node's claims from another node is refused, and changes nothing.
    let out = berth(&n1, &["volume", "detach", "solo", "--node", &paused_id]).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("node_id") && err.contains("is ready"), "{err}");
    let out = berth(&n1, &["volume", "detach", "solo", "--node", "no-such-node"]).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no node"));
    let status = n1.client().volume("solo").await.unwrap();
    assert_eq!(status.claims.len(), 1);
    assert_eq!(status.claims[0].state, ClaimState::Claimed);

    let pid = Pid::from_raw(i32::try_from(paused.pid()).unwrap());
    kill(pid, Signal::SIGSTOP).unwrap();
    // The alloc is lost and its replacement cannot be placed: the volume is still claimed.
    let waiting = wait_job_before(&n1, "solo", deadline, |s| {
        s.failures.iter().any(|f| f.contains("solo"))
            && s.placements
                .iter()
                .any(|p| p.alloc_id == old_alloc && p.desired != "run")
    })
    .await;
    assert!(
        waiting
            .failures
            .iter()
            .any(|f| f.contains("volume \"solo\"") && f.contains("already uses it")),
        "{waiting:#?}"
    );
    let status = n1.client().volume("solo").await.unwrap();
    assert_eq!(status.claims.len(), 1, "{status:#?}");
    assert_eq!(status.claims[0].alloc_id, old_alloc);

    // The operator frees it (by node name): ControllerUnpublishVolume, then the claim goes,
    // and the replacement runs.
    let out = berth(&n1, &["volume", "detach", "solo", "--node", &old_node]).await;
    assert!(out.status.success(), "{out:?}\n{}", n1.log());
    let moved = wait_job_before(&n1, "solo", deadline, |s| {
        running(s).iter().any(|(id, _)| *id != old_alloc)
    })
    .await;
    let (_, new_node) = running(&moved)
        .into_iter()
        .find(|(id, _)| *id != old_alloc)
        .unwrap();
    assert_eq!(new_node, other_name);
    kill(pid, Signal::SIGCONT).unwrap();
    wait_volume(paused, "solo", "the resumed node unmounted", |v| {
        v.usages.is_empty()
    })
    .await;
}
