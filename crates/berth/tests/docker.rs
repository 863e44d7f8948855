//! The `docker` driver on a real agent, real podman and runc: berth-hostpath packaged into a
//! local image (built offline by the test) runs as a privileged CSI plugin task and serves a
//! volume to another job's container, with mounts travelling both ways; Nomad's own CSI plugin
//! job files run with only the image changed; a container survives an agent kill -9 and is
//! re-attached; bad input is refused by field and line and starts nothing; and nothing is left
//! behind (containers, mounts) once the jobs stop.

mod agent_support;

use std::{path::Path, time::Duration};

use agent_support::{
    AgentProcess,
    jobs::{create_volume, run_job, wait_alloc, wait_job},
};
use berth_api::jobs::{ClientStatus, JobRunRequest};
use berth_api::volumes::SpecFormat;
use berth_testkit::TestPodman;

const HOSTPATH_IMAGE: &str = "localhost/berth-hostpath:latest";
const BUSYBOX_IMAGE: &str = "localhost/berth-busybox:test";
const PLUGIN: &str = "dp";

/// podman storage with both images.
fn images() -> TestPodman {
    let podman = TestPodman::new();
    let hostpath = berth_testkit::bin_path("berth-hostpath");
    podman.build_image(
        HOSTPATH_IMAGE,
        &[hostpath.as_path()],
        Some("[\"/bin/berth-hostpath\"]"),
    );
    podman.build_image(BUSYBOX_IMAGE, &[], None);
    podman
}

fn config(podman: &TestPodman, allow_privileged: bool) -> String {
    format!(
        "health {{\n  interval = \"200ms\"\n  failures = 2\n}}\n\
         plugin \"docker\" {{\n  config {{\n    allow_privileged = {allow_privileged}\n    \
         storage_root = \"{}\"\n    run_root = \"{}\"\n  }}\n}}\n",
        podman.root().display(),
        podman.run_root().display()
    )
}

fn plugin_job() -> String {
    format!(
        r#"
job "plugin" {{
  group "p" {{
    task "hostpath" {{
      driver = "docker"
      config {{
        image        = "{HOSTPATH_IMAGE}"
        args         = ["--statedir", "/local/csi/hp", "--nodeid", "n1", "--strict"]
        privileged   = true
        network_mode = "none"
      }}
      csi_plugin {{
        id                     = "{PLUGIN}"
        type                   = "monolith"
        mount_dir              = "/csi"
        stage_publish_base_dir = "/local/csi"
      }}
      kill_timeout = "2s"
    }}
  }}
}}
"#
    )
}

fn writer_job(script: &str) -> String {
    format!(
        r#"
job "writer" {{
  group "w" {{
    volume "data" {{
      type        = "csi"
      source      = "v1"
      access_mode = "single-node-writer"
    }}
    task "main" {{
      driver = "docker"
      config {{
        image        = "{BUSYBOX_IMAGE}"
        command      = "sh"
        args         = ["-c", "{script}"]
        network_mode = "none"
        init         = true
      }}
      volume_mount {{
        volume      = "data"
        destination = "/data"
      }}
      kill_timeout = "2s"
    }}
  }}
}}
"#
    )
}

fn mountinfo(agent: &AgentProcess) -> String {
    std::fs::read_to_string(format!("/proc/{}/mountinfo", agent.pid())).unwrap_or_default()
}

async fn wait_running(agent: &AgentProcess, job: &str) -> berth_api::jobs::AllocStatus {
    wait_alloc(agent, job, |a| {
        a.client_status == ClientStatus::Running && a.tasks.values().all(|t| t.pid.is_some())
    })
    .await
}

async fn stop_and_wait(agent: &AgentProcess, job: &str) {
    agent.client().stop_job(job).await.expect("stop");
    wait_job(agent, job, |s| {
        s.allocs.iter().all(|a| a.client_status.is_terminal())
    })
    .await;
}

#[tokio::test]
async fn a_docker_plugin_serves_a_volume_to_a_docker_task_and_nothing_is_left() {
    let podman = images();
    let agent = AgentProcess::start_in_namespace(&config(&podman, true)).await;
    let client = agent.client();
    run_job(&client, plugin_job()).await.expect("plugin job");
    agent
        .wait_plugin(PLUGIN, Duration::from_secs(30), |p| p.health.healthy)
        .await;
    let external = create_volume(&client, PLUGIN, "v1").await;

    run_job(
        &client,
        writer_job("echo hello > /data/hello.txt; exec sleep 600"),
    )
    .await
    .expect("writer job");
    let writer = wait_running(&agent, "writer").await;
    let volume = agent
        .data_dir
        .join("csi/monolith")
        .join(PLUGIN)
        .join("hp/volumes")
        .join(&external)
        .join("hello.txt");
    berth_testkit::assert_eventually!(
        Duration::from_secs(20),
        || async { std::fs::read_to_string(&volume).is_ok_and(|s| s == "hello\n") },
        "the writer's file never reached the volume; agent log:\n{}",
        agent.log()
    );
    // The plugin staged and published inside its container; both mounts show on the host
    // (container to host), and the host's publish target reached the writer's container.
    let target = writer.volumes["data"].target.clone().expect("a target");
    let info = mountinfo(&agent);
    assert!(
        info.contains(&target.display().to_string()),
        "the publish target {} is not mounted on the host:\n{info}",
        target.display()
    );
    assert!(
        info.contains("/staging/"),
        "no staging mount on the host:\n{info}"
    );
    assert_eq!(podman.containers_in(agent.namespace()).len(), 2);

    stop_and_wait(&agent, "writer").await;
    stop_and_wait(&agent, "plugin").await;
    berth_testkit::assert_eventually!(
        Duration::from_secs(20),
        || async { podman.containers_in(agent.namespace()).is_empty() },
        "containers left: {:?}",
        podman.containers_in(agent.namespace())
    );
    let info = mountinfo(&agent);
    let csi = agent.data_dir.join("csi").display().to_string();
    assert!(
        !info
            .lines()
            .any(|l| l.contains(&csi) && (l.contains("/per-alloc/") || l.contains("/staging/"))),
        "volume mounts left:\n{info}"
    );
    let storage = podman.root().display().to_string();
    assert!(
        !info
            .lines()
            .any(|l| l.contains(&storage) && l.contains("/merged")),
        "container root filesystems left mounted:\n{info}"
    );
}

#[tokio::test]
async fn nomad_csi_plugin_files_run_with_a_local_image() {
    let podman = images();
    let agent = AgentProcess::start_in_namespace(&config(&podman, true)).await;
    let client = agent.client();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for (file, plugin) in [
        (
            "examples/nomad/jobs/csi-hostpath-plugin.hcl",
            "hostpath-plugin0",
        ),
        ("examples/nomad/jobs/csi-ebs-node-plugin.hcl", "aws-ebs0"),
    ] {
        let text = std::fs::read_to_string(repo.join(file)).expect(file);
        client
            .run_job(&JobRunRequest {
                spec: text,
                format: SpecFormat::Hcl,
                file: Some(file.into()),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        agent
            .wait_plugin(plugin, Duration::from_secs(30), |p| p.health.healthy)
            .await;
    }
    assert_eq!(podman.containers_in(agent.namespace()).len(), 2);
    for job in ["csi-plugin", "plugin-aws-ebs-nodes"] {
        stop_and_wait(&agent, job).await;
    }
    assert!(podman.containers_in(agent.namespace()).is_empty());
}

#[tokio::test]
async fn a_container_survives_an_agent_kill_9_and_is_reattached() {
    let podman = images();
    let mut agent = AgentProcess::start_in_namespace(&config(&podman, false)).await;
    let job = format!(
        r#"
job "svc" {{
  group "g" {{
    task "main" {{
      driver = "docker"
      config {{
        image        = "{BUSYBOX_IMAGE}"
        command      = "sh"
        args         = ["-c", "echo up; exec sleep 600"]
        network_mode = "none"
        init         = true
      }}
      kill_timeout = "2s"
    }}
  }}
}}
"#
    );
    run_job(&agent.client(), job).await.expect("job");
    let before = wait_running(&agent, "svc").await;
    let pid = before.tasks["main"].pid.expect("pid");
    let ids = podman.containers_in(agent.namespace());
    assert_eq!(ids.len(), 1);

    agent.kill9();
    assert!(
        agent_support::alive(pid as i32),
        "the container died with the agent"
    );
    agent.respawn();
    agent.wait_ready().await;
    let after = wait_alloc(&agent, "svc", |a| {
        a.client_status == ClientStatus::Running && a.tasks["main"].pid.is_some()
    })
    .await;
    assert_eq!(after.tasks["main"].pid, Some(pid));
    assert_eq!(after.tasks["main"].restarts, 0);
    assert_eq!(
        podman.containers_in(agent.namespace()),
        ids,
        "the same container, not a new one"
    );

    stop_and_wait(&agent, "svc").await;
    assert!(podman.containers_in(agent.namespace()).is_empty());
}

#[tokio::test]
async fn bad_docker_input_is_refused_and_starts_nothing() {
    let podman = images();
    let agent = AgentProcess::start_in_namespace(&config(&podman, false)).await;
    let client = agent.client();
    let job = |config: &str| {
        format!(
            "job \"bad\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"docker\"\n      config {{\n{config}\n      }}\n    }}\n  }}\n}}\n"
        )
    };
    for (config, needle) in [
        (
            format!("        image = \"{BUSYBOX_IMAGE}\"\n        imagee = \"x\""),
            "job.hcl:7",
        ),
        (
            format!("        image = \"{BUSYBOX_IMAGE}\"\n        privileged = true"),
            "allow_privileged",
        ),
        (
            format!("        image = \"{BUSYBOX_IMAGE}\"\n        volumes = [\"../../etc:/x\"]"),
            "volumes[0]",
        ),
    ] {
        let err = run_job(&client, job(&config))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{needle:?} not in {err}");
    }
    assert!(
        client.jobs().await.unwrap().jobs.is_empty(),
        "a refused job was kept"
    );

    // A missing image fails the task at once with the reason; no container is made.
    run_job(&client, job("        image = \"localhost/not-here:1\""))
        .await
        .expect("accepted: images are looked up when the task starts");
    let failed = wait_alloc(&agent, "bad", |a| {
        a.events.iter().any(|e| e.message.contains("no registry"))
    })
    .await;
    assert!(
        failed
            .events
            .iter()
            .any(|e| e.message.contains("localhost/not-here:1")),
        "{failed:#?}"
    );
    assert!(podman.containers_in(agent.namespace()).is_empty());
}

#[tokio::test]
async fn a_containers_output_is_rotated_and_exec_runs_inside_it() {
    let podman = images();
    let agent = AgentProcess::start_in_namespace(&config(&podman, false)).await;
    // 12,000 lines of 100 bytes (1.1 MiB) through podman's passthrough into the collector's
    // FIFO; then it waits.
    let job = format!(
        r#"
job "box" {{
  group "g" {{
    task "main" {{
      driver = "docker"
      config {{
        image        = "{BUSYBOX_IMAGE}"
        command      = "sh"
        args         = ["-c", "i=1; while [ $i -le 12000 ]; do printf 'line %094d\\n' $i; i=$((i+1)); done; echo done >&2; exec sleep 600"]
        network_mode = "none"
        init         = true
      }}
      logs {{
        max_files     = 2
        max_file_size = 1
      }}
      kill_timeout = "2s"
    }}
  }}
}}
"#
    );
    run_job(&agent.client(), job).await.expect("job");
    let alloc = wait_running(&agent, "box").await.alloc_id;
    let logs = agent.data_dir.join("allocs").join(&alloc).join("logs");
    berth_testkit::assert_eventually!(
        Duration::from_secs(30),
        || async {
            std::fs::read_to_string(logs.join("main.stderr.0")).unwrap_or_default() == "done\n"
        },
        "the container's stderr"
    );
    let out = agent_support::berth(&agent, &["alloc", "logs", &alloc]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all: String = (1..=12_000u32).map(|i| format!("line {i:094}\n")).collect();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        all,
        "both files, in order"
    );
    assert!(logs.join("main.stdout.1").exists(), "rotated at 1 MiB");

    // `podman exec`: the container's root and environment, its exit code.
    let out = agent_support::berth(
        &agent,
        &["alloc", "exec", &alloc, "sh", "-c", "ls /; exit 3"],
    )
    .await;
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    for want in ["alloc", "local", "secrets", "bin"] {
        assert!(listing.lines().any(|l| l == want), "{want} in {listing}");
    }
    let out = agent_support::berth(
        &agent,
        &[
            "alloc",
            "exec",
            "-t",
            &alloc,
            "sh",
            "-c",
            "test -t 1 && echo tty",
        ],
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "tty\r\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    stop_and_wait(&agent, "box").await;
    assert!(podman.containers_in(agent.namespace()).is_empty());
}
