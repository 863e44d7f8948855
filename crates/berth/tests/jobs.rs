//! Jobs end to end: a real agent places a job, runs its `exec` task with a CSI volume mounted
//! at its destination (berth-hostpath, run by the agent, staging and attaching), and releases
//! the volume in CSI order when the job stops.

mod agent_support;

use std::time::Duration;

use agent_support::{
    AgentProcess,
    jobs::{VOLUME_RPCS, create_volume, run_job, volume_job, wait_job},
};
use berth_api::{
    jobs::ClientStatus,
    volumes::{SpecFormat, VolumeSpecRequest},
};
use berth_hostpath::calllog;

const PLUGIN: &str = "hp";
/// A mount flag that must never be shown.
const FLAG_SECRET: &str = "password=flag-secret-5678";

async fn start() -> AgentProcess {
    AgentProcess::start_with_hostpath(
        PLUGIN,
        &[
            "--enable-stage",
            "--enable-attach",
            "--call-log",
            "@TMP@/calls.log",
        ],
    )
    .await
}

#[tokio::test]
async fn a_batch_job_writes_into_its_csi_volume_then_releases_it() {
    let agent = start().await;
    let client = agent.client();
    let external = create_volume(&client, PLUGIN, "demo").await;
    let dest = agent.tmp.path().join("task-data");
    let status = run_job(
        &client,
        volume_job(
            "writer",
            "batch",
            "demo",
            &dest,
            "echo hello > $0/hello.txt",
        ),
    )
    .await
    .expect("job run");
    assert_eq!(status.allocs.len(), 1);
    let done = wait_job(&agent, "writer", |s| {
        s.allocs
            .iter()
            .all(|a| a.client_status == ClientStatus::Complete)
    })
    .await;
    // The data is in the volume (hostpath keeps volumes under its state dir).
    let file = agent
        .tmp
        .path()
        .join("hp/volumes")
        .join(&external)
        .join("hello.txt");
    let _ = done;
    berth_testkit::assert_eventually!(Duration::from_secs(10), || async { file.exists() });
    // Released once the task was dead: no claim left, nothing mounted.
    berth_testkit::assert_eventually!(Duration::from_secs(20), || async {
        client
            .volume("demo")
            .await
            .is_ok_and(|v| v.claims.is_empty())
    });
    let calls: Vec<String> = calllog::read(agent.tmp.path().join("calls.log"))
        .unwrap()
        .into_iter()
        .filter(|c| c.code == "OK" && VOLUME_RPCS.contains(&c.rpc.as_str()))
        .map(|c| c.rpc)
        .collect();
    assert_eq!(
        calls,
        [
            "ControllerPublishVolume",
            "NodeStageVolume",
            "NodePublishVolume",
            "NodeUnpublishVolume",
            "NodeUnstageVolume",
            "ControllerUnpublishVolume"
        ]
    );
    // A finished job may run again.
    run_job(
        &client,
        volume_job(
            "writer",
            "batch",
            "demo",
            &dest,
            "echo again > $0/again.txt",
        ),
    )
    .await
    .expect("run again");
}

#[tokio::test]
async fn job_stop_stops_the_task_then_releases_in_order() {
    let agent = start().await;
    let client = agent.client();
    create_volume(&client, PLUGIN, "svc").await;
    let dest = agent.tmp.path().join("svc-data");
    // Mount flags (one of them a secret) go to the plugin and never come back out.
    let spec = volume_job(
        "svc",
        "service",
        "svc",
        &dest,
        "touch $0/started; exec sleep 3600",
    )
    .replace(
        "      access_mode = \"single-node-writer\"",
        &format!(
            "      access_mode = \"single-node-writer\"\n      \
             mount_options {{\n        mount_flags = [\"noatime\", \"{FLAG_SECRET}\"]\n      }}"
        ),
    );
    run_job(&client, spec).await.expect("job run");
    let running = wait_job(&agent, "svc", |s| {
        s.allocs.iter().all(|a| {
            a.client_status == ClientStatus::Running && a.tasks.values().all(|t| t.pid.is_some())
        })
    })
    .await;
    let alloc = client
        .alloc(&running.allocs[0].alloc_id)
        .await
        .expect("alloc status");
    let pid = alloc.tasks["main"].pid.expect("a pid");
    let data = &alloc.volumes["data"];
    assert!(data.claimed, "{data:?}");
    assert_eq!(data.mount_flags.as_deref(), Some(berth_csi::REDACTED));
    let shown = [
        serde_json::to_string(&alloc).unwrap(),
        serde_json::to_string(&running).unwrap(),
        serde_json::to_string(&client.volume("svc").await.expect("volume status")).unwrap(),
    ];
    for text in shown.iter().chain([&agent.log()]) {
        assert!(!text.contains(FLAG_SECRET), "the flag leaked: {text}");
    }
    // A running job is not run twice.
    let e = run_job(
        &client,
        volume_job("svc", "service", "svc", &dest, "exec sleep 3600"),
    )
    .await
    .expect_err("already running");
    assert_eq!(e.status(), Some(409), "{e}");
    assert!(agent_support::alive(i32::try_from(pid).unwrap()));
    client.stop_job("svc").await.expect("stop");
    wait_job(&agent, "svc", |s| {
        s.allocs
            .iter()
            .all(|a| a.client_status == ClientStatus::Complete)
    })
    .await;
    berth_testkit::assert_eventually!(Duration::from_secs(10), || async {
        !agent_support::alive(i32::try_from(pid).unwrap())
    });
    berth_testkit::assert_eventually!(Duration::from_secs(20), || async {
        client
            .volume("svc")
            .await
            .is_ok_and(|v| v.claims.is_empty())
    });
    let tail: Vec<String> = calllog::read(agent.tmp.path().join("calls.log"))
        .unwrap()
        .into_iter()
        .filter(|c| c.code == "OK" && VOLUME_RPCS[3..].contains(&c.rpc.as_str()))
        .map(|c| c.rpc)
        .collect();
    assert_eq!(
        tail,
        [
            "NodeUnpublishVolume",
            "NodeUnstageVolume",
            "ControllerUnpublishVolume"
        ]
    );
    assert!(
        !agent.log().contains(FLAG_SECRET),
        "the flag leaked into the log"
    );
}

#[tokio::test]
async fn a_job_that_cannot_be_placed_is_refused_and_nothing_is_placed() {
    let agent = start().await;
    let client = agent.client();
    create_volume(&client, PLUGIN, "v").await;
    let dest = agent.tmp.path().join("d");
    let cases = [
        (
            volume_job("j1", "batch", "v", &dest, "true").replace("\"exec\"", "\"qemu\""),
            "driver \"qemu\" is not available on this node: docker, exec, raw_exec",
        ),
        (
            volume_job("j2", "batch", "nope", &dest, "true"),
            "no volume \"nope\" is registered",
        ),
        (
            volume_job("j3", "batch", "v", &dest, "true").replace(
                "    task \"main\" {",
                "    task \"main\" {\n      driver = \"exec\"\n      config { command = \"/bin/true\" }\n    }\n    task \"main\" {",
            ),
            "main",
        ),
        (
            volume_job("j4", "batch", "v", &dest, "true").replace(
                "      kill_timeout = \"2s\"",
                "      kill_timeout = \"2s\"\n      csi_plugin {\n        id = \"other\"\n        type = \"node\"\n        mount_dir = \"/local/csi/sock\"\n      }",
            ),
            "mount_dir: /local/csi/sock lies inside stage_publish_base_dir",
        ),
        (
            // A task id (`<alloc id>.<task>`) becomes a path: at most 128 bytes.
            volume_job("j5", "batch", "v", &dest, "true")
                .replace("task \"main\"", &format!("task \"{}\"", "t".repeat(120))),
            "128",
        ),
    ];
    for (text, want) in cases {
        let e = run_job(&client, text).await.expect_err("refused");
        assert_eq!(e.status(), Some(400), "{e}");
        assert!(e.to_string().contains(want), "{want}: {e}");
    }
    assert!(client.jobs().await.expect("jobs").jobs.is_empty());
    assert!(client.volume("v").await.unwrap().claims.is_empty());
}

/// Kills the given pids when dropped (task processes outlive a killed agent on purpose).
struct KillOnDrop(Vec<u32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for pid in &self.0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(*pid).unwrap_or(i32::MAX)),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

#[tokio::test]
async fn after_kill_9_the_agent_owns_the_same_running_allocs_without_remounting() {
    let mut agent = start().await;
    let client = agent.client();
    let spec = "id = \"shared\"\ntype = \"csi\"\nplugin_id = \"hp\"\n\
                capability {\n  access_mode = \"single-node-multi-writer\"\n  attachment_mode = \"file-system\"\n}\n";
    client
        .create_volume(&VolumeSpecRequest {
            spec: spec.into(),
            format: SpecFormat::Hcl,
            file: None,
        })
        .await
        .expect("create");
    let dest = agent.tmp.path().join("shared-data");
    let text = volume_job("three", "service", "shared", &dest, "exec sleep 3600")
        .replace("single-node-writer", "single-node-multi-writer")
        .replace("  group \"g\" {", "  group \"g\" {\n    count = 3");
    run_job(&client, text).await.expect("job run");
    let running = wait_job(&agent, "three", |s| {
        s.allocs.len() == 3
            && s.allocs.iter().all(|a| {
                a.client_status == ClientStatus::Running
                    && a.tasks.values().all(|t| t.pid.is_some())
            })
    })
    .await;
    let pids: Vec<u32> = running
        .allocs
        .iter()
        .map(|a| a.tasks["main"].pid.unwrap())
        .collect();
    let _guard = KillOnDrop(pids.clone());
    let calls_before = calllog::read(agent.tmp.path().join("calls.log"))
        .unwrap()
        .len();

    agent.kill9();
    agent.respawn();
    agent.wait_ready().await;
    let client = agent.client();
    let after = wait_job(&agent, "three", |s| {
        s.allocs.iter().all(|a| {
            a.client_status == ClientStatus::Running && a.tasks.values().all(|t| t.pid.is_some())
        })
    })
    .await;
    let pids_after: Vec<u32> = after
        .allocs
        .iter()
        .map(|a| a.tasks["main"].pid.unwrap())
        .collect();
    assert_eq!(pids_after, pids, "tasks were restarted");
    for pid in &pids {
        assert!(agent_support::alive(i32::try_from(*pid).unwrap()));
    }
    let vol = client.volume("shared").await.expect("volume");
    assert_eq!(vol.claims.len(), 3, "{vol:#?}");
    let new_calls: Vec<String> = calllog::read(agent.tmp.path().join("calls.log"))
        .unwrap()
        .into_iter()
        .skip(calls_before)
        .map(|c| c.rpc)
        .filter(|r| VOLUME_RPCS.contains(&r.as_str()))
        .collect();
    assert!(
        new_calls.is_empty(),
        "remounted after restart: {new_calls:?}"
    );

    client.stop_job("three").await.expect("stop");
    berth_testkit::assert_eventually!(Duration::from_secs(20), || async {
        client
            .volume("shared")
            .await
            .is_ok_and(|v| v.claims.is_empty())
    });
    for pid in &pids {
        assert!(!agent_support::alive(i32::try_from(*pid).unwrap()));
    }
}

#[tokio::test]
async fn an_exec_task_sees_its_own_volume_and_not_other_allocs_volumes() {
    let agent = start().await;
    let client = agent.client();
    let e0 = create_volume(&client, PLUGIN, "pv[0]").await;
    let e1 = create_volume(&client, PLUGIN, "pv[1]").await;
    let dest = agent.tmp.path().join("pv-data");
    let per_alloc = agent.data_dir.join("csi/monolith/hp/per-alloc");
    let script = format!(
        "ls {} 2>/dev/null | wc -l > $0/seen; echo $BERTH_ALLOC_INDEX > $0/index",
        per_alloc.display()
    );
    let text = volume_job("iso", "batch", "pv", &dest, &script)
        .replace("  group \"g\" {", "  group \"g\" {\n    count = 2")
        .replace(
            "      access_mode = \"single-node-writer\"",
            "      access_mode = \"single-node-writer\"\n      per_alloc = true",
        );
    run_job(&client, text).await.expect("job run");
    wait_job(&agent, "iso", |s| {
        s.allocs.len() == 2
            && s.allocs
                .iter()
                .all(|a| a.client_status == ClientStatus::Complete)
    })
    .await;
    for (i, ext) in [e0, e1].iter().enumerate() {
        let vol = agent.tmp.path().join("hp/volumes").join(ext);
        let read = |f: &str| std::fs::read_to_string(vol.join(f)).unwrap_or_default();
        assert_eq!(read("index").trim(), i.to_string(), "volume pv[{i}]");
        assert_eq!(read("seen").trim(), "0", "alloc {i} saw the per-alloc dir");
    }
}
