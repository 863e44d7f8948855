//! Jobs in a fleet on a real etcd: `job run` on any agent; the elected leader places the
//! allocs (spread over the nodes); each agent runs those placed on it. A killed leader is
//! replaced; a paused node's alloc is lost and placed elsewhere, and the node stops its copy
//! when it resumes; a higher-priority job preempts a lower one and waits for it to stop; the
//! leader collects finished allocs and stopped jobs after `gc_after`.

mod agent_support;

use std::{collections::BTreeSet, time::Duration};

use agent_support::{
    AgentProcess, berth,
    fleet::ready_nodes,
    jobs::{run_job, wait_job_before},
};
use berth_api::jobs::{ClientStatus, JobStatus};
use berth_testkit::EtcdCluster;
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

/// A node named `name` in the fleet under prefix `/j`: 3 s leases, allocs lost 2 s after.
fn config(name: &str, extra: &str) -> String {
    format!(
        "name = \"{name}\"\n{extra}\ncontrol_plane {{\n  etcd {{\n    prefix = \"/j\"\n    lease_ttl = \"3s\"\n    lost_after = \"2s\"\n  }}\n}}\n"
    )
}

async fn join(cluster: &EtcdCluster, name: &str, extra: &str) -> AgentProcess {
    AgentProcess::start_with(&config(name, extra), &["--etcd", &cluster.endpoints_csv()]).await
}

fn sleeper(id: &str, count: u32, priority: u8, memory: u32) -> String {
    format!(
        r#"job "{id}" {{
  priority = {priority}
  group "app" {{
    count = {count}
    task "sleep" {{
      driver = "raw_exec"
      config {{
        command = "/bin/sleep"
        args    = ["600"]
      }}
      resources {{
        cpu    = 50
        memory = {memory}
      }}
    }}
  }}
}}"#
    )
}

/// The allocs that should run and whose tasks run (with a pid), with their nodes.
fn running(s: &JobStatus) -> Vec<(String, String)> {
    s.placements
        .iter()
        .filter(|p| p.desired == "run")
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

fn pid_of(s: &JobStatus, alloc_id: &str) -> u32 {
    let a = s.allocs.iter().find(|a| a.alloc_id == alloc_id).unwrap();
    a.tasks["sleep"].pid.expect("a running task has a pid")
}

fn alive(pid: u32) -> bool {
    kill(Pid::from_raw(i32::try_from(pid).unwrap()), None).is_ok()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
}

fn leader_of<'a>(agents: &'a [&'a AgentProcess]) -> Option<usize> {
    // The last agent to say it was elected and not since stepped down.
    agents.iter().position(|a| {
        let log = a.log();
        let elected = log.rfind("elected fleet leader");
        let resigned = log.rfind("no longer the fleet leader");
        elected.is_some() && resigned.is_none_or(|r| Some(r) < elected)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_spreads_over_three_agents_and_another_leader_takes_over() {
    let cluster = EtcdCluster::single().expect("etcd");
    let a = join(&cluster, "alpha", "").await;
    let b = join(&cluster, "beta", "").await;
    let c = join(&cluster, "gamma", "").await;
    ready_nodes(&a, 3).await;

    let placed = run_job(&b.client(), sleeper("web", 3, 50, 64))
        .await
        .expect("job run");
    assert_eq!(placed.version, Some(1));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let web = wait_job_before(&c, "web", deadline, |s| running(s).len() == 3).await;
    let nodes: BTreeSet<String> = running(&web).into_iter().map(|(_, n)| n).collect();
    assert_eq!(nodes.len(), 3, "one alloc per node: {web:#?}");
    // Every agent shows where each alloc runs.
    let out = berth(&a, &["job", "status", "web"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for n in ["alpha", "beta", "gamma"] {
        assert!(text.contains(n), "{text}");
    }

    // Kill -9 the leader: another agent leads within seconds, and places new work.
    let mut agents = [a, b, c];
    let leader = {
        let refs: Vec<&AgentProcess> = agents.iter().collect();
        leader_of(&refs).expect("one agent leads")
    };
    agents[leader].kill9();
    let killed_at = tokio::time::Instant::now();
    let (left, right) = agents.split_at(if leader == 0 { 1 } else { 0 });
    let survivor = if leader == 0 { &right[0] } else { &left[0] };
    let survivors: Vec<&AgentProcess> = agents
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != leader)
        .map(|(_, a)| a)
        .collect();
    let batch = r#"job "once" {
  type = "batch"
  group "g" {
    count = 2
    task "t" {
      driver = "raw_exec"
      config { command = "/bin/true" }
    }
  }
}"#;
    run_job(&survivor.client(), batch.into())
        .await
        .expect("job run");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    wait_job_before(survivor, "once", deadline, |s| {
        s.allocs.len() == 2
            && s.allocs
                .iter()
                .all(|a| a.client_status == ClientStatus::Complete)
    })
    .await;
    let took = killed_at.elapsed();
    assert!(leader_of(&survivors).is_some(), "a survivor leads");
    assert!(took < Duration::from_secs(20), "took over after {took:?}");
    // The dead leader's alloc of web is lost and runs again on a live node.
    let dead_name = ["alpha", "beta", "gamma"][leader];
    let web = wait_job_before(survivor, "web", deadline, |s| {
        let r = running(s);
        r.len() == 3 && r.iter().all(|(_, n)| n != dead_name)
    })
    .await;
    let lost = web
        .placements
        .iter()
        .filter(|p| p.stop_reason.as_deref() == Some("its node was lost"))
        .count();
    assert_eq!(lost, 1, "{web:#?}");

    // Stop: every alloc on every live node stops.
    let out = berth(survivor, &["job", "stop", "web"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_job_before(survivor, "web", deadline, |s| {
        s.placements.iter().all(|p| p.desired == "stop")
            && s.allocs
                .iter()
                .filter(|a| {
                    !web.placements
                        .iter()
                        .any(|p| p.alloc_id == a.alloc_id && p.node_name == dead_name)
                })
                .all(|a| a.client_status == ClientStatus::Complete)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_loses_its_alloc_and_stops_its_copy_when_it_resumes() {
    let cluster = EtcdCluster::single().expect("etcd");
    let a = join(&cluster, "alpha", "").await;
    let b = join(&cluster, "beta", "").await;
    ready_nodes(&b, 2).await;
    run_job(&a.client(), sleeper("solo", 1, 50, 64))
        .await
        .expect("job run");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let first = wait_job_before(&a, "solo", deadline, |s| running(s).len() == 1).await;
    let (old_alloc, old_node) = running(&first)[0].clone();
    let old_pid = pid_of(&first, &old_alloc);
    let (paused, other) = if old_node == "alpha" {
        (&a, &b)
    } else {
        (&b, &a)
    };

    let pid = Pid::from_raw(i32::try_from(paused.pid()).unwrap());
    kill(pid, Signal::SIGSTOP).unwrap();
    let stopped_at = tokio::time::Instant::now();
    // Lease (3 s) + grace (2 s) + a pass: the alloc runs on the other node.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let moved = wait_job_before(other, "solo", deadline, |s| {
        running(s).iter().any(|(id, _)| *id != old_alloc)
    })
    .await;
    let took = stopped_at.elapsed();
    assert!(took >= Duration::from_secs(4), "moved after {took:?}");
    assert!(took < Duration::from_secs(20), "moved after {took:?}");
    let (new_alloc, new_node) = running(&moved)
        .into_iter()
        .find(|(id, _)| *id != old_alloc)
        .unwrap();
    assert_ne!(new_node, old_node);
    // The paused node's task still runs: nothing could stop it.
    assert!(alive(old_pid));

    kill(pid, Signal::SIGCONT).unwrap();
    // Resumed: it stops the copy that was moved away.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while alive(old_pid) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the moved alloc's task still runs\n{}",
            paused.log()
        );
        tokio::time::sleep(berth_testkit::POLL_INTERVAL).await;
    }
    let log = paused.log();
    let stop_at = log
        .find("stopping the alloc as the fleet asks")
        .expect("it says why it stops the alloc");
    assert!(log[stop_at..].contains("its node was lost"), "{log}");
    let end = wait_job_before(other, "solo", deadline, |s| {
        s.allocs
            .iter()
            .any(|a| a.alloc_id == old_alloc && a.client_status == ClientStatus::Complete)
    })
    .await;
    // One copy runs, on the other node.
    assert_eq!(running(&end), vec![(new_alloc, new_node)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_priority_job_preempts_a_lower_one_on_a_full_node() {
    let cluster = EtcdCluster::single().expect("etcd");
    let a = join(&cluster, "small", "client {\n  memory_total_mb = 1000\n}").await;
    ready_nodes(&a, 1).await;
    run_job(&a.client(), sleeper("low", 1, 20, 800))
        .await
        .expect("job run");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let low = wait_job_before(&a, "low", deadline, |s| running(s).len() == 1).await;
    let (low_alloc, _) = running(&low)[0].clone();
    let low_pid = pid_of(&low, &low_alloc);

    // A bad spec is refused with its field and line, and the fleet's jobs do not change.
    let before = a.client().jobs().await.unwrap();
    let bad = "job \"bad\" {\n  type = \"system\"\n  group \"g\" {\n    count = 2\n    task \"t\" {\n      driver = \"raw_exec\"\n      config { command = \"/bin/true\" }\n    }\n  }\n}\n";
    let err = run_job(&a.client(), bad.into())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("job.hcl:4") && err.contains("job.group[g].count"),
        "{err}"
    );
    assert_eq!(a.client().jobs().await.unwrap(), before);

    // Same priority band: no room, and it says why.
    let near = run_job(&a.client(), sleeper("near", 1, 25, 800))
        .await
        .expect("job run");
    assert!(
        near.failures
            .iter()
            .any(|f| f.contains("resources exhausted: memory")),
        "{near:#?}"
    );
    berth(&a, &["job", "stop", "near"]).await;

    let high = run_job(&a.client(), sleeper("high", 1, 80, 800))
        .await
        .expect("job run");
    let high_alloc = high.placements[0].alloc_id.clone();
    assert_eq!(high.placements[0].preempts, vec![low_alloc.clone()]);
    let high = wait_job_before(&a, "high", deadline, |s| running(s).len() == 1).await;
    // It started only after the preempted alloc had stopped.
    assert!(!alive(low_pid));
    let status = a.client().alloc(&high_alloc).await.unwrap();
    assert!(
        status.events.iter().any(|e| e.message.contains(&low_alloc)),
        "{status:#?}"
    );
    let low = a.client().job("low").await.unwrap();
    let p = low
        .placements
        .iter()
        .find(|p| p.alloc_id == low_alloc)
        .unwrap();
    assert_eq!(
        p.stop_reason.as_deref(),
        Some(format!("preempted by alloc {high_alloc}").as_str())
    );
    // Nowhere else to go: the preempted job says why.
    assert!(
        low.failures.iter().any(|f| f.contains("class <none>")),
        "{low:#?}"
    );
    drop(high);
}

/// The ids of every key under `<prefix>/<dir>/` in the fleet's etcd.
async fn keys(etcd: &berth_fleet::Etcd, dir: &str) -> BTreeSet<String> {
    let (all, _) = etcd
        .list::<serde_json::Value>(&etcd.dir(dir))
        .await
        .expect("etcd list");
    all.into_iter()
        .map(|(k, _)| k.strip_prefix(&etcd.dir(dir)).unwrap_or(&k).to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_collects_finished_allocs_and_stopped_jobs_after_gc_after() {
    let cluster = EtcdCluster::single().expect("etcd");
    let gc_config = |name: &str| {
        format!(
            "name = \"{name}\"\ncontrol_plane {{\n  etcd {{\n    prefix = \"/g\"\n    gc_after = \"2s\"\n  }}\n}}\n"
        )
    };
    let etcd_flag = ["--etcd", &cluster.endpoints_csv()].map(str::to_string);
    let etcd_flag: Vec<&str> = etcd_flag.iter().map(String::as_str).collect();
    let a = AgentProcess::start_with(&gc_config("alpha"), &etcd_flag).await;
    let mut b = AgentProcess::start_with(&gc_config("beta"), &etcd_flag).await;
    ready_nodes(&a, 2).await;
    let mut settings = berth_fleet::EtcdSettings::new(cluster.endpoints()).unwrap();
    settings.prefix = "/g".into();
    let etcd = berth_fleet::Etcd::connect(&settings).await.expect("etcd");

    run_job(&a.client(), sleeper("web", 2, 50, 64))
        .await
        .expect("job run");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    wait_job_before(&a, "web", deadline, |s| running(s).len() == 2).await;
    let batch = r#"job "once" {
  type = "batch"
  group "g" {
    task "t" {
      driver = "raw_exec"
      config { command = "/bin/true" }
    }
  }
}"#;
    run_job(&b.client(), batch.into()).await.expect("job run");
    wait_job_before(&a, "once", deadline, |s| {
        s.allocs.len() == 1 && s.allocs[0].client_status == ClientStatus::Complete
    })
    .await;

    // A new version (one copy): the old copies stop and are shown, done, until they have been
    // done for gc_after; then they are gone with their reports, while the new one runs on.
    let first = wait_job_before(&a, "web", deadline, |s| running(s).len() == 2).await;
    let old: BTreeSet<String> = running(&first).into_iter().map(|(id, _)| id).collect();
    run_job(&a.client(), sleeper("web", 1, 50, 64))
        .await
        .expect("job run");
    wait_job_before(&a, "web", deadline, |s| {
        old.iter().all(|id| {
            s.placements
                .iter()
                .any(|p| &p.alloc_id == id && p.desired == "stop")
                && s.allocs
                    .iter()
                    .any(|x| &x.alloc_id == id && x.client_status == ClientStatus::Complete)
        })
    })
    .await;
    let web = wait_job_before(&a, "web", deadline, |s| {
        s.placements.len() == 1 && running(s).len() == 1
    })
    .await;
    assert!(!old.contains(&web.placements[0].alloc_id));
    let (allocs, reports) = (keys(&etcd, "allocs").await, keys(&etcd, "reports").await);
    assert!(
        allocs.is_disjoint(&old) && reports.is_disjoint(&old),
        "{allocs:?} {reports:?}"
    );
    let mut web_allocs = old;
    web_allocs.insert(web.placements[0].alloc_id.clone());

    // Stopped: once its allocs are done, the job goes with all it had.
    let out = berth(&b, &["job", "stop", "web"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_web(&a, deadline, |s| s.is_none()).await;
    assert!(!keys(&etcd, "jobs").await.contains("web"));
    assert!(!keys(&etcd, "placements").await.contains("web"));
    let left = keys(&etcd, "allocs").await;
    assert!(left.is_disjoint(&web_allocs), "{left:?}");
    // The finished batch alloc is kept: its job still wants it (it would run again otherwise).
    let once = a.client().job("once").await.expect("job once");
    assert_eq!(once.allocs.len(), 1);
    assert_eq!(once.allocs[0].client_status, ClientStatus::Complete);

    // An agent that restarts does not report again the allocs the leader collected: a
    // report of its new system alloc proves it has reported since it came back.
    b.kill9();
    b.respawn();
    b.wait_ready().await;
    ready_nodes(&a, 2).await;
    let system = r#"job "sys" {
  type = "system"
  group "g" {
    task "sleep" {
      driver = "raw_exec"
      config {
        command = "/bin/sleep"
        args    = ["600"]
      }
    }
  }
}"#;
    run_job(&a.client(), system.into()).await.expect("job run");
    let sys = wait_job_before(&a, "sys", deadline, |s| running(s).len() == 2).await;
    let reports = keys(&etcd, "reports").await;
    for p in &sys.placements {
        assert!(reports.contains(&p.alloc_id), "{reports:?}");
    }
    assert!(reports.is_disjoint(&web_allocs), "{reports:?}");
}

/// Polls whether job `web` is still shown until `pred` holds of it (`None`: not found).
async fn wait_web(
    agent: &AgentProcess,
    deadline: tokio::time::Instant,
    pred: impl Fn(Option<&JobStatus>) -> bool,
) {
    loop {
        let got = match agent.client().job("web").await {
            Ok(s) => Some(s),
            Err(e) if e.status() == Some(404) => None,
            Err(e) => panic!("job status: {e}"),
        };
        if pred(got.as_ref()) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "job web: {got:#?}\n{}",
            agent.log()
        );
        tokio::time::sleep(berth_testkit::POLL_INTERVAL).await;
    }
}
