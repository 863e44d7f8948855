//! Agents in a fleet on a real etcd: each registers its node under a lease; `node status` lists
//! the fleet; a paused agent's node goes down when its lease expires and comes back when it
//! resumes (with a new lease); drain; an etcd that requires client certificates; bad etcd
//! settings are refused before anything starts.

mod agent_support;

use std::{
    process::{Output, Stdio},
    time::Duration,
};

use agent_support::{AgentProcess, berth, fleet::wait_nodes};
use berth_api::nodes::{NodeList, NodeState};
use berth_testkit::EtcdCluster;
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

/// A node named `name` in the fleet under prefix `/t`, with a 3 s lease.
fn fleet_config(name: &str) -> String {
    format!(
        "name = \"{name}\"\ncontrol_plane {{\n  etcd {{\n    prefix = \"/t\"\n    lease_ttl = \"3s\"\n  }}\n}}\n"
    )
}

async fn join(cluster: &EtcdCluster, name: &str) -> AgentProcess {
    AgentProcess::start_with(&fleet_config(name), &["--etcd", &cluster.endpoints_csv()]).await
}

fn state_of(list: &NodeList, name: &str) -> Option<NodeState> {
    list.nodes.iter().find(|n| n.name == name).map(|n| n.status)
}

fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_agents_register_a_paused_one_goes_down_and_comes_back() {
    let cluster = EtcdCluster::single().expect("etcd");
    let a = join(&cluster, "alpha").await;
    let b = join(&cluster, "beta").await;
    let c = join(&cluster, "gamma").await;

    // Every agent sees the whole fleet, ready, with what each node registered.
    for agent in [&a, &b, &c] {
        let list = wait_nodes(agent, "three ready nodes", |l| {
            l.fleet && l.nodes.len() == 3 && l.nodes.iter().all(|n| n.status == NodeState::Ready)
        })
        .await;
        let alpha = list.nodes.iter().find(|n| n.name == "alpha").unwrap();
        assert!(
            alpha
                .drivers
                .iter()
                .any(|d| d.name == "raw_exec" && d.healthy),
            "{alpha:?}"
        );
        assert!(alpha.attributes.contains_key("kernel.name"), "{alpha:?}");
    }
    let out = stdout(&berth(&a, &["node", "status"]).await);
    for name in ["alpha", "beta", "gamma"] {
        let row = out
            .lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("{name} missing:\n{out}"));
        assert!(row.contains("ready"), "{out}");
    }
    let gamma_id = b.client().node().await.unwrap().id;
    let gamma_id = {
        let list = a.client().nodes().await.unwrap();
        let id = list
            .nodes
            .iter()
            .find(|n| n.name == "gamma")
            .unwrap()
            .id
            .clone();
        assert_ne!(id, gamma_id, "beta's id is not gamma's");
        id
    };
    let one = stdout(&berth(&a, &["node", "status", &gamma_id[..6]]).await);
    assert!(one.contains(&gamma_id) && one.contains("ready"), "{one}");
    assert!(one.contains("raw_exec"), "{one}");

    // Paused past its lease: down on the others; resumed: it registers again and is ready.
    let pid = Pid::from_raw(i32::try_from(c.pid()).unwrap());
    kill(pid, Signal::SIGSTOP).unwrap();
    let paused = tokio::time::Instant::now();
    let list = wait_nodes(&a, "gamma down", |l| {
        state_of(l, "gamma") == Some(NodeState::Down)
    })
    .await;
    let down_after = paused.elapsed();
    assert_eq!(state_of(&list, "alpha"), Some(NodeState::Ready));
    assert_eq!(state_of(&list, "beta"), Some(NodeState::Ready));
    // The lease is 3 s: not down before it can have expired.
    assert!(
        down_after >= Duration::from_secs(2),
        "down after {down_after:?}"
    );
    kill(pid, Signal::SIGCONT).unwrap();
    wait_nodes(&b, "gamma ready again", |l| {
        state_of(l, "gamma") == Some(NodeState::Ready)
    })
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !c.log().contains("registering again") {
        assert!(tokio::time::Instant::now() < deadline, "{}", c.log());
        tokio::time::sleep(berth_testkit::POLL_INTERVAL).await;
    }

    // Drain by id prefix, then back.
    let out = stdout(&berth(&a, &["node", "drain", &gamma_id[..6]]).await);
    assert!(out.contains("draining"), "{out}");
    wait_nodes(&c, "gamma draining", |l| {
        state_of(l, "gamma") == Some(NodeState::Draining)
    })
    .await;
    let out = stdout(&berth(&b, &["node", "drain", "--disable", &gamma_id]).await);
    assert!(out.contains("ready"), "{out}");

    // A prefix that matches nothing, and a stopped agent (down at once: its lease is revoked).
    let o = berth(&a, &["node", "status", "zzzz"]).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no node"));
    let mut c = c;
    assert!(c.terminate().await.success());
    let list = wait_nodes(&a, "gamma down after a clean stop", |l| {
        state_of(l, "gamma") == Some(NodeState::Down)
    })
    .await;
    assert_eq!(list.nodes.len(), 3, "a down node stays listed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_started_before_etcd_waits_for_it() {
    let mut cluster = EtcdCluster::single().expect("etcd");
    cluster.kill(0);
    let mut a = AgentProcess::start_unready(
        &fleet_config("early"),
        &["--etcd", &cluster.endpoints_csv()],
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !a.log().contains("does not answer; trying again") {
        assert!(tokio::time::Instant::now() < deadline, "{}", a.log());
        tokio::time::sleep(berth_testkit::POLL_INTERVAL).await;
    }
    cluster.restart(0).expect("etcd again");
    a.wait_ready().await;
    wait_nodes(&a, "the early node ready", |l| {
        state_of(l, "early") == Some(NodeState::Ready)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_joins_an_etcd_that_requires_client_certificates() {
    let cluster = EtcdCluster::start_tls(1).expect("etcd");
    let tls = cluster.tls().expect("certificates");
    let config = format!(
        "name = \"secure\"\ncontrol_plane {{\n  etcd {{\n    prefix = \"/t\"\n    tls {{\n      ca_file = \"{}\"\n      cert_file = \"{}\"\n      key_file = \"{}\"\n    }}\n  }}\n}}\n",
        tls.ca.display(),
        tls.client_cert.display(),
        tls.client_key.display()
    );
    let a = AgentProcess::start_with(&config, &["--etcd", &cluster.endpoints_csv()]).await;
    let list = wait_nodes(&a, "the node ready over TLS", |l| {
        state_of(l, "secure") == Some(NodeState::Ready)
    })
    .await;
    assert!(list.fleet);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_etcd_the_node_list_is_this_node() {
    let a = AgentProcess::start("").await;
    let list = a.client().nodes().await.unwrap();
    assert!(!list.fleet);
    assert_eq!(list.nodes.len(), 1);
    assert_eq!(list.nodes[0].id, a.client().node().await.unwrap().id);
    // Drain needs a fleet.
    let o = berth(&a, &["node", "drain", &list.nodes[0].id]).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("fleet"));
}

/// `berth agent` with `args` and `config`: must exit 2 naming `want`, without creating the
/// data dir.
fn refused(config: &str, args: &[&str], want: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("agent.hcl");
    std::fs::write(&cfg, config).unwrap();
    let data = tmp.path().join("data");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["agent", "--config"])
        .arg(&cfg)
        .arg("--data-dir")
        .arg(&data)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{config} {args:?}: {stderr}");
    assert!(stderr.contains(want), "{want:?} not in {stderr}");
    assert!(!data.exists(), "the data dir was created");
}

#[test]
fn bad_etcd_settings_are_refused_before_anything_starts() {
    refused(
        "",
        &["--etcd", "etcd:2379"],
        "--etcd: control_plane.etcd.endpoints[0]",
    );
    refused(
        "",
        &["--etcd", "http://127.0.0.1:2379,http://h"],
        "control_plane.etcd.endpoints[1]",
    );
    refused(
        "control_plane {\n  etcd {\n    endpoints = []\n  }\n}\n",
        &[],
        "control_plane.etcd.endpoints: at least one etcd client URL is needed",
    );
    refused(
        "control_plane {\n  etcd {\n    endpoints = [\"http://127.0.0.1:2379\"]\n    prefix = \"berth\"\n  }\n}\n",
        &[],
        "control_plane.etcd.prefix",
    );
    refused(
        "control_plane {\n  etcd {\n    endpoints = [\"http://127.0.0.1:2379\"]\n    lease_ttl = \"1s\"\n  }\n}\n",
        &[],
        "control_plane.etcd.lease_ttl",
    );
    refused(
        "control_plane {\n  etcd {\n    endpoints = [\"http://127.0.0.1:2379\"]\n    lost_claims {\n      after = \"soon\"\n    }\n  }\n}\n",
        &[],
        "control_plane.etcd.lost_claims.after",
    );
    refused(
        "control_plane {\n  etcd {\n    endpoints = [\"http://127.0.0.1:2379\"]\n    lost_claims {\n      after = \"30d\"\n    }\n  }\n}\n",
        &[],
        "control_plane.etcd.lost_claims.after",
    );
    refused(
        "control_plane {\n  etcd {\n    endpoints = [\"http://127.0.0.1:2379\"]\n    tls {\n      ca_file = \"ca.pem\"\n    }\n  }\n}\n",
        &[],
        "control_plane.etcd.tls.ca_file",
    );
    refused(
        "control_plane {\n  etcd {\n    endpoints = [\"http://127.0.0.1:2379\"]\n    gc_after = \"40d\"\n  }\n}\n",
        &[],
        "control_plane.etcd.gc_after",
    );
    refused(
        "control_plane {\n  etcd {\n    tls {\n      ca_file = \"/ca.pem\"\n    }\n  }\n}\n",
        &["--etcd", "http://127.0.0.1:2379"],
        "control_plane.etcd.tls: set, but the endpoints are http:// URLs",
    );
    refused(
        "control_plane {\n  etcd {\n    endpoint = \"x\"\n  }\n}\n",
        &[],
        "endpoint",
    );
}
