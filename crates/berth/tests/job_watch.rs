//! Operating jobs from the CLI on a real agent: `job run` follows the job with progress lines
//! and its exit code says how it went; `-detach`; `job plan` and `job validate`; id prefixes;
//! alloc stop, restart and signal.

mod agent_support;

use std::time::Duration;

use agent_support::{
    AgentProcess, berth,
    jobs::{create_volume, volume_job, wait_alloc, wait_job},
};
use berth_api::jobs::{ClientStatus, TaskRunState};

const PLUGIN: &str = "hp";

fn text(out: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The index of the first line of `out` that contains `needle`, after line `from`.
fn line_after(out: &str, from: usize, needle: &str) -> usize {
    out.lines()
        .enumerate()
        .skip(from)
        .find(|(_, l)| l.contains(needle))
        .map(|(i, _)| i)
        .unwrap_or_else(|| panic!("no line with {needle:?} after line {from} in:\n{out}"))
}

fn write(agent: &AgentProcess, name: &str, text: &str) -> String {
    let path = agent.tmp.path().join(name);
    std::fs::write(&path, text).expect("write spec");
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_run_follows_a_claim_that_fails_then_succeeds_until_the_task_runs() {
    // The plugin dies at the first stage (the agent restarts it): the claim is retried, then mounts.
    let agent =
        AgentProcess::start_with_hostpath(PLUGIN, &["--fault", "NodeStageVolume:exit:1"]).await;
    create_volume(&agent.client(), PLUGIN, "v1").await;
    let dir = agent.tmp.path().join("mnt");
    let spec = write(
        &agent,
        "web.hcl",
        &volume_job("web", "service", "v1", &dir, "echo up; exec sleep 600"),
    );
    let out = berth(&agent, &["job", "run", &spec]).await;
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let placed = line_after(&stdout, 0, ": placed");
    let retrying = line_after(&stdout, placed, "claiming volumes: ");
    assert!(
        stdout.lines().nth(retrying).unwrap().contains("retrying"),
        "{stdout}"
    );
    let mounted = line_after(&stdout, retrying, "volume mounted: volume data (v1)");
    let running = line_after(&stdout, mounted, "task \"main\" running");
    let done = line_after(&stdout, running, "==> Job \"web\": 1 alloc(s) running");
    assert_eq!(
        done + 1,
        stdout.lines().count(),
        "the summary ends it:\n{stdout}"
    );
    let alloc = wait_alloc(&agent, "web", |a| a.client_status == ClientStatus::Running).await;
    assert!(alloc.tasks["main"].pid.is_some());

    // A batch job that fails: the exit code says so, with the reason.
    let spec = write(
        &agent,
        "bad.hcl",
        r#"
job "bad" {
  type = "batch"
  group "g" {
    restart {
      attempts = 0
      mode     = "fail"
    }
    task "t" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "exit 3"]
      }
    }
  }
}
"#,
    );
    let out = berth(&agent, &["job", "run", &spec]).await;
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    line_after(&stdout, 0, "task \"t\" exited: exited with code 3");
    assert!(
        stderr.contains("job \"bad\": alloc bad-g-0-") && stderr.contains("failed"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detach_returns_while_the_claim_hangs_and_plan_explains_a_refusal() {
    let agent =
        AgentProcess::start_with_hostpath(PLUGIN, &["--fault", "NodeStageVolume:hang"]).await;
    let client = agent.client();
    create_volume(&client, PLUGIN, "v1").await;
    let dir = agent.tmp.path().join("mnt");

    // Plan: a job whose volume does not exist cannot be placed; the reason names it, and
    // nothing is kept.
    let missing = write(
        &agent,
        "missing.hcl",
        &volume_job("m", "service", "nope", &dir, "sleep 1"),
    );
    let out = berth(&agent, &["job", "plan", &missing]).await;
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stdout.contains("Job \"m\" cannot be placed:"), "{stdout}");
    assert!(stdout.contains("no volume \"nope\""), "{stdout}");
    let good = write(
        &agent,
        "web.hcl",
        &volume_job("web", "service", "v1", &dir, "exec sleep 600"),
    );
    let out = berth(&agent, &["job", "plan", &good, "-json"]).await;
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let plan: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(plan["placeable"], true);
    assert_eq!(plan["allocs"][0]["volumes"]["data"], "v1");
    assert!(
        client.jobs().await.expect("jobs").jobs.is_empty(),
        "plan keeps nothing"
    );

    // -detach: the command returns although the claim never finishes.
    let out = berth(&agent, &["job", "run", "-detach", &good]).await;
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("Job \"web\" placed: 1 alloc(s)"),
        "{stdout}"
    );
    assert!(!stdout.contains("==>"), "not followed:\n{stdout}");
    let status = client.job("web").await.expect("job");
    assert_eq!(status.allocs[0].client_status, ClientStatus::Pending);

    // Planning the same job again explains that it is running.
    let out = berth(&agent, &["job", "plan", &good]).await;
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("is already running"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_needs_no_agent_and_names_the_line() {
    let dir = tempfile::tempdir().expect("tmp");
    let good = dir.path().join("ok.hcl");
    std::fs::write(
        &good,
        "job \"ok\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"exec\"\n      config {\n        command = \"/bin/true\"\n      }\n    }\n  }\n}\n",
    )
    .expect("write");
    let bad = dir.path().join("bad.hcl");
    std::fs::write(
        &bad,
        "job \"bad\" {\n  group \"g\" {\n    count = \"many\"\n  }\n}\n",
    )
    .expect("write");
    let run = |file: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
            .args([
                "--address",
                "unix:///nonexistent/berth.sock",
                "job",
                "validate",
            ])
            .arg(file)
            .output()
            .expect("run berth")
    };
    let out = run(&good);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("Job \"ok\" is valid: service job, 1 group(s)"),
        "{stdout}"
    );
    let out = run(&bad);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("bad.hcl:3"), "{stderr}");
}

fn sleeper(id: &str) -> String {
    format!(
        r#"
job "{id}" {{
  group "g" {{
    task "t" {{
      driver = "exec"
      config {{
        command = "/bin/sh"
        args    = ["-c", "trap 'echo got-hup' HUP; echo ready; while true; do sleep 0.1; done"]
      }}
      kill_timeout = "2s"
    }}
  }}
}}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefixes_single_dash_flags_and_alloc_stop_restart_signal() {
    let agent = AgentProcess::start_in_namespace(&agent_support::client_config("")).await;
    let client = agent.client();
    for id in ["web-a", "web-b"] {
        let spec = write(&agent, &format!("{id}.hcl"), &sleeper(id));
        let out = berth(&agent, &["job", "run", &spec]).await;
        assert!(out.status.success(), "{:?}", text(&out));
    }

    // An ambiguous prefix lists the candidates; a unique one is enough.
    let out = berth(&agent, &["job", "status", "web"]).await;
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("job id prefix \"web\" matches 2 jobs: web-a, web-b"),
        "{stderr}"
    );
    let out = berth(&agent, &["job", "status", "-json", "web-b"]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let job: serde_json::Value = serde_json::from_str(&stdout).expect("-json is JSON");
    assert_eq!(job["id"], "web-b");
    let alloc_id = job["allocs"][0]["alloc_id"]
        .as_str()
        .expect("alloc id")
        .to_owned();
    let prefix = &alloc_id[..alloc_id.len() - 4];
    let out = berth(&agent, &["alloc", "status", prefix, "-json"]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains(&alloc_id), "{stdout}");
    let out = berth(&agent, &["alloc", "status", "web-"]).await;
    let (_, stderr) = text(&out);
    assert!(
        stderr.contains("alloc id prefix \"web-\" matches 2 allocs"),
        "{stderr}"
    );

    // Signal: the task's trap sees it (once it has set its trap).
    let log = agent.data_dir.join("allocs").join(&alloc_id).join("logs");
    let wait_output = |needle: &'static str| {
        let log = log.clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            loop {
                let stdout = std::fs::read_dir(&log)
                    .expect("logs dir")
                    .filter_map(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy().starts_with("t.stdout"))
                    .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
                    .collect::<String>();
                if stdout.contains(needle) {
                    return;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no {needle}: {stdout:?}"
                );
                tokio::time::sleep(berth_testkit::POLL_INTERVAL).await;
            }
        }
    };
    wait_output("ready").await;
    let out = berth(&agent, &["alloc", "signal", "-s", "SIGHUP", prefix, "t"]).await;
    assert!(out.status.success(), "{:?}", text(&out));
    wait_output("got-hup").await;
    let out = berth(&agent, &["alloc", "signal", "-s", "SIGNOPE", prefix]).await;
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("`signal`"), "{stderr}");

    // Restart: a new process, the restart counted, the alloc still running.
    let before = client.alloc(&alloc_id).await.expect("alloc").tasks["t"].pid;
    let out = berth(&agent, &["alloc", "restart", prefix]).await;
    assert!(out.status.success(), "{:?}", text(&out));
    let after = wait_job(&agent, "web-b", |j| {
        let t = &j.allocs[0].tasks["t"];
        t.restarts == 1 && t.state == TaskRunState::Running && t.pid.is_some() && t.pid != before
    })
    .await;
    assert_eq!(after.allocs[0].client_status, ClientStatus::Running);
    let out = berth(&agent, &["alloc", "restart", prefix, "nope"]).await;
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("no task \"nope\""), "{stderr}");

    // Stop one alloc: followed until it stopped; the other job runs on.
    let out = berth(&agent, &["alloc", "stop", prefix]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("==> Alloc {alloc_id} stopped")),
        "{stdout}"
    );
    let other = client.job("web-a").await.expect("web-a");
    assert_eq!(other.allocs[0].client_status, ClientStatus::Running);

    // Stop and purge: the job is forgotten once its alloc has stopped.
    let out = berth(&agent, &["job", "stop", "-purge", "web-a"]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while client
        .jobs()
        .await
        .expect("jobs")
        .jobs
        .iter()
        .any(|j| j.id == "web-a")
    {
        assert!(tokio::time::Instant::now() < deadline, "web-a not purged");
        tokio::time::sleep(berth_testkit::POLL_INTERVAL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_volume_create_shows_progress_and_ctrl_c_leaves_it_to_the_agent() {
    use tokio::io::AsyncBufReadExt as _;
    let agent =
        AgentProcess::start_with_hostpath(PLUGIN, &["--fault", "CreateVolume:delay=4s"]).await;
    let spec = write(
        &agent,
        "slow.hcl",
        &format!(
            "id = \"slow\"\nname = \"slow\"\ntype = \"csi\"\nplugin_id = \"{PLUGIN}\"\n\
             capacity_min = \"10MiB\"\n\
             capability {{\n  access_mode = \"single-node-writer\"\n  attachment_mode = \"file-system\"\n}}\n"
        ),
    );
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["--address", &format!("unix://{}", agent.socket().display())])
        .args(["volume", "create", &spec])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("berth");
    let mut lines = tokio::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
    let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("progress within 20 s")
        .expect("read")
        .expect("a line");
    assert!(
        first.contains("creating the volume: still waiting"),
        "{first}"
    );
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id().expect("pid")).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("SIGINT");
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("exits")
        .expect("status");
    assert_eq!(status.code(), Some(130));
    let mut rest = String::new();
    while let Ok(Some(l)) = lines.next_line().await {
        rest.push_str(&l);
        rest.push('\n');
    }
    assert!(rest.contains("interrupted; the agent goes on"), "{rest}");
    // The agent finished the create on its own.
    let client = agent.client();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while client.volume("slow").await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the volume was not created"
        );
        tokio::time::sleep(berth_testkit::POLL_INTERVAL).await;
    }
}
