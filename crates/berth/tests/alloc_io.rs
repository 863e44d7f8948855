//! `berth alloc logs` and `berth alloc exec` against a real agent running real `exec` tasks:
//! a followed log across a task's restart, rotation by the `logs` block, log collectors that
//! outlive an agent killed with SIGKILL, commands run inside a task's root, and refusals that
//! name the field and change nothing.

mod agent_support;

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use agent_support::{
    AgentProcess, berth,
    jobs::{run_job, wait_alloc},
};
use berth_api::jobs::{AllocStatus, ClientStatus};
use berth_testkit::assert_eventually;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// How long a polled condition may take.
const WAIT: Duration = Duration::from_secs(30);

/// A job `id` of `job_type` with one exec task `main` running `script` (`sh -c`), and `extra`
/// in the task.
fn job(id: &str, job_type: &str, script: &str, extra: &str) -> String {
    let script = script.replace('\\', "\\\\").replace('"', "\\\"");
    format!(
        r#"job "{id}" {{
  type = "{job_type}"
  group "g" {{
    task "main" {{
      driver = "exec"
      config {{
        command = "/bin/sh"
        args    = ["-c", "{script}"]
      }}
      kill_timeout = "1s"
{extra}    }}
  }}
}}
"#
    )
}

async fn running(agent: &AgentProcess, id: &str) -> AllocStatus {
    wait_alloc(agent, id, |a| {
        a.tasks
            .get("main")
            .is_some_and(|t| t.state.to_string() == "running")
    })
    .await
}

fn logs_dir(agent: &AgentProcess, alloc: &str) -> PathBuf {
    agent.data_dir.join("allocs").join(alloc).join("logs")
}

/// The numbered files of a stream, by index.
fn files_of(dir: &Path, stream: &str) -> Vec<u64> {
    let mut found: Vec<u64> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| {
                    e.file_name()
                        .to_str()?
                        .strip_prefix(&format!("{stream}."))?
                        .parse()
                        .ok()
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort_unstable();
    found
}

fn text(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn err_text(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `berth --address <agent> <args>` with `stdin` piped in; its output.
async fn berth_with_input(
    agent: &AgentProcess,
    args: &[&str],
    stdin: &[u8],
) -> std::process::Output {
    let address = format!("unix://{}", agent.socket().display());
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["--address", &address])
        .args(args)
        .env_remove("BERTH_ADDR")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run berth");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin).await.unwrap();
    drop(input);
    tokio::time::timeout(WAIT, child.wait_with_output())
        .await
        .expect("berth finishes")
        .expect("berth output")
}

/// A `berth` command left running, its standard output gathered as it comes.
struct Running {
    child: tokio::process::Child,
    out: Arc<Mutex<Vec<u8>>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Running {
    fn start(agent: &AgentProcess, args: &[&str]) -> Self {
        let address = format!("unix://{}", agent.socket().display());
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["--address", &address])
            .args(args)
            .env_remove("BERTH_ADDR")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("run berth");
        let mut stdout = child.stdout.take().unwrap();
        let out = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&out);
        let reader = tokio::spawn(async move {
            let mut buf = vec![0u8; 8192];
            while let Ok(n) = stdout.read(&mut buf).await {
                if n == 0 {
                    return;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Self { child, out, reader }
    }

    fn output(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().unwrap()).into_owned()
    }

    /// Waits for it to exit; its status and everything it printed.
    async fn finish(mut self) -> (std::process::ExitStatus, String) {
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("berth exits")
            .expect("status");
        tokio::time::timeout(WAIT, &mut self.reader)
            .await
            .expect("output read")
            .unwrap();
        (status, self.output())
    }
}

fn lines(from: u32, to: u32) -> String {
    (from..=to).map(|i| format!("{i}\n")).collect()
}

#[tokio::test]
async fn a_followed_log_shows_both_runs_of_a_restarted_task_in_order() {
    let agent = AgentProcess::start("").await;
    // The first run prints 1..5 and waits for `go`, then fails; the restart prints 6..10.
    let script = "if [ -e /alloc/data/ran ]; then seq 6 10; exit 0; fi; \
                  touch /alloc/data/ran; seq 1 5; \
                  while [ ! -e /alloc/data/go ]; do sleep 0.05; done; exit 1";
    let restart = "      restart {\n        attempts = 1\n        delay    = \"200ms\"\n        mode     = \"fail\"\n      }\n";
    run_job(&agent.client(), job("twice", "batch", script, restart))
        .await
        .expect("job run");
    let alloc = running(&agent, "twice").await.alloc_id;
    let follow = Running::start(&agent, &["alloc", "logs", "-f", &alloc, "main"]);
    assert_eventually!(
        WAIT,
        || async { follow.output() == lines(1, 5) },
        "the first run's lines; got {:?}",
        follow.output()
    );
    std::fs::write(
        agent
            .data_dir
            .join("allocs")
            .join(&alloc)
            .join("alloc/data/go"),
        "",
    )
    .unwrap();
    let done = wait_alloc(&agent, "twice", |a| a.client_status.is_terminal()).await;
    assert_eq!(done.client_status, ClientStatus::Complete, "{done:#?}");
    assert_eq!(done.tasks["main"].restarts, 1);
    // The follow ends by itself once the alloc is done and everything was sent.
    let (status, out) = follow.finish().await;
    assert!(status.success(), "{status}");
    assert_eq!(out, lines(1, 10));
    // Both runs wrote into the same file: the restart appended to it.
    assert_eq!(files_of(&logs_dir(&agent, &alloc), "main.stdout"), [0]);
}

#[tokio::test]
async fn output_rotates_as_the_logs_block_says_and_reads_back_in_order() {
    let agent = AgentProcess::start("").await;
    // 25,000 lines of 100 bytes (2.4 MiB) into files of 1 MiB, two kept.
    let script = "i=1; while [ $i -le 25000 ]; do printf 'line %094d\\n' $i; i=$((i+1)); done; echo oops >&2";
    let logs = "      logs {\n        max_files     = 2\n        max_file_size = 1\n      }\n";
    run_job(&agent.client(), job("rot", "batch", script, logs))
        .await
        .expect("job run");
    let done = wait_alloc(&agent, "rot", |a| a.client_status.is_terminal()).await;
    assert_eq!(done.client_status, ClientStatus::Complete, "{done:#?}");
    let alloc = done.alloc_id;
    let dir = logs_dir(&agent, &alloc);
    assert_eventually!(
        WAIT,
        || async { files_of(&dir, "main.stdout") == [1, 2] },
        "at most 2 files, the oldest deleted: {:?}",
        files_of(&dir, "main.stdout")
    );
    let all: String = (1..=25_000u32).map(|i| format!("line {i:094}\n")).collect();

    let out = berth(&agent, &["alloc", "logs", &alloc]).await;
    assert!(out.status.success(), "{}", err_text(&out));
    let kept = text(&out);
    assert_eq!(
        kept.len(),
        all.len() - 1024 * 1024,
        "two files of the stream"
    );
    assert!(all.ends_with(&kept), "the newest bytes, in order");

    // Nomad's single-dash forms.
    let out = berth(
        &agent,
        &["alloc", "logs", "-tail", "-n", "5", &alloc, "main"],
    )
    .await;
    assert!(out.status.success(), "{}", err_text(&out));
    let last5: String = (24_996..=25_000u32)
        .map(|i| format!("line {i:094}\n"))
        .collect();
    assert_eq!(text(&out), last5);
    let out = berth(&agent, &["alloc", "logs", "-c", "101", &alloc]).await;
    assert_eq!(text(&out), format!("\nline {:094}\n", 25_000));
    let out = berth(
        &agent,
        &["alloc", "logs", "-stderr", "-task", "main", &alloc],
    )
    .await;
    assert_eq!(text(&out), "oops\n");
    // A finished alloc's follow returns at once with everything.
    let out = berth(&agent, &["alloc", "logs", "-f", "-tail", "-n", "1", &alloc]).await;
    assert!(out.status.success(), "{}", err_text(&out));
    assert_eq!(text(&out), format!("line {:094}\n", 25_000));
}

/// Pids of the live log collectors reading a stream under `dir`.
fn collectors(dir: &Path) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let ours = args.contains(&&b"logmon"[..])
            && args
                .windows(2)
                .any(|w| w[0] == b"--base" && w[1].starts_with(dir.as_os_str().as_encoded_bytes()));
        if ours && agent_support::alive(pid) {
            pids.push(pid);
        }
    }
    pids.sort_unstable();
    pids
}

/// The numbers of the whole `line N` lines in `text`, which must be 1, 2, 3… without a gap;
/// the last one.
fn numbered(text: &str) -> u32 {
    let whole = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
    let mut last = 0;
    for line in whole.lines() {
        let n: u32 = line
            .strip_prefix("line ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unexpected line {line:?}"));
        assert_eq!(n, last + 1, "lines in order, none lost");
        last = n;
    }
    last
}

#[tokio::test]
async fn log_collectors_outlive_an_agent_killed_with_sigkill() {
    let mut agent = AgentProcess::start("").await;
    let script = "i=0; while :; do i=$((i+1)); echo line $i; sleep 0.02; done";
    run_job(&agent.client(), job("steady", "service", script, ""))
        .await
        .expect("job run");
    let status = running(&agent, "steady").await;
    let alloc = status.alloc_id.clone();
    let pid = status.tasks["main"].pid.expect("a pid");
    let dir = logs_dir(&agent, &alloc);
    let stdout = dir.join("main.stdout.0");
    let read = || std::fs::read_to_string(&stdout).unwrap_or_default();
    assert_eventually!(WAIT, || async { read().lines().count() >= 5 }, "lines");
    let before = collectors(&dir);
    assert_eq!(before.len(), 2, "one per stream: {before:?}");

    agent.kill9();
    // While no agent runs, the task goes on writing and its collector on collecting.
    let at_kill = read().lines().count();
    assert_eventually!(
        WAIT,
        || async { read().lines().count() >= at_kill + 20 },
        "lines written while the agent is down"
    );
    let while_down = numbered(&read());
    assert_eq!(collectors(&dir), before, "the same collectors");
    assert!(
        agent_support::alive(i32::try_from(pid).unwrap()),
        "the task runs"
    );

    agent.respawn();
    agent.wait_ready().await;
    let again = running(&agent, "steady").await;
    assert_eq!(
        again.tasks["main"].pid,
        Some(pid),
        "re-attached, not restarted"
    );
    assert_eq!(again.tasks["main"].restarts, 0);
    let out = berth(&agent, &["alloc", "logs", &alloc, "main"]).await;
    assert!(out.status.success(), "{}", err_text(&out));
    let through = numbered(&text(&out));
    assert!(through >= while_down, "{through} < {while_down}");
    assert_eq!(collectors(&dir), before, "still the same collectors");

    agent.client().stop_job("steady").await.expect("stop");
    wait_alloc(&agent, "steady", |a| a.client_status.is_terminal()).await;
    assert_eventually!(
        WAIT,
        || async { collectors(&dir).is_empty() },
        "the collectors end with the task"
    );
}

#[tokio::test]
async fn exec_runs_inside_the_tasks_root_with_its_input_and_exit_code() {
    let agent = AgentProcess::start("").await;
    run_job(
        &agent.client(),
        job("box", "service", "echo up; exec sleep 1000", ""),
    )
    .await
    .expect("job run");
    let alloc = running(&agent, "box").await.alloc_id;

    let out = berth(&agent, &["alloc", "exec", &alloc, "main", "ls", "/"]).await;
    assert!(out.status.success(), "{}", err_text(&out));
    let listing = text(&out);
    let names: Vec<&str> = listing.lines().collect();
    for want in ["alloc", "local", "secrets", "tmp", "usr"] {
        assert!(names.contains(&want), "{want} in {names:?}");
    }
    // The host's own directories outside the chroot_env, and the agent's data dir, are not
    // there.
    let tmp_name = agent.tmp.path().file_name().unwrap().to_str().unwrap();
    for absent in ["home", "root", "var", "srv", tmp_name] {
        assert!(!names.contains(&absent), "{absent} in {names:?}");
    }

    let out = berth(
        &agent,
        &[
            "alloc",
            "exec",
            &alloc,
            "sh",
            "-c",
            "echo to-err >&2; exit 3",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(3), "{}", err_text(&out));
    assert_eq!(
        err_text(&out),
        "to-err\n",
        "the command's stderr, and nothing else"
    );

    let out = berth_with_input(
        &agent,
        &["alloc", "exec", "-task", "main", &alloc, "cat"],
        b"hello\nworld\n",
    )
    .await;
    assert!(out.status.success(), "{}", err_text(&out));
    assert_eq!(text(&out), "hello\nworld\n");

    let out = berth(
        &agent,
        &[
            "alloc",
            "exec",
            &alloc,
            "sh",
            "-c",
            "id -un; echo $BERTH_TASK_NAME",
        ],
    )
    .await;
    assert_eq!(
        text(&out),
        "nobody\nmain\n",
        "as the task's user, with its environment"
    );

    // A terminal: allocated on the node even when this side has none.
    let out = berth(
        &agent,
        &[
            "alloc",
            "exec",
            "-t",
            &alloc,
            "sh",
            "-c",
            "test -t 0 && echo on-a-tty",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", err_text(&out));
    assert_eq!(text(&out), "on-a-tty\r\n");

    // The command's arguments are its own, flags included.
    let out = berth(
        &agent,
        &[
            "alloc", "exec", &alloc, "echo", "-task", "-tail", "--stderr",
        ],
    )
    .await;
    assert_eq!(text(&out), "-task -tail --stderr\n");
}

#[tokio::test]
async fn bad_input_is_refused_by_field_and_changes_nothing() {
    let agent = AgentProcess::start("").await;
    let client = agent.client();
    run_job(
        &client,
        job("keep", "service", "echo kept; exec sleep 1000", ""),
    )
    .await
    .expect("job run");
    let before = running(&agent, "keep").await;
    let alloc = before.alloc_id.clone();
    let dir = logs_dir(&agent, &alloc);
    assert_eventually!(
        WAIT,
        || async {
            std::fs::read_to_string(dir.join("main.stdout.0")).unwrap_or_default() == "kept\n"
        },
        "the task's line"
    );
    let files_before = files_of(&dir, "main.stdout");

    let refused = |out: &std::process::Output| {
        assert_eq!(out.status.code(), Some(1), "{}", err_text(out));
        err_text(out)
    };
    let e = refused(&berth(&agent, &["alloc", "logs", "a/../b"]).await);
    assert!(e.contains("alloc id"), "{e}");
    let e = refused(&berth(&agent, &["alloc", "logs", &alloc, "nope"]).await);
    assert!(e.contains("no task \"nope\"") && e.contains("main"), "{e}");
    let e = refused(&berth(&agent, &["alloc", "logs", &alloc, "a/b"]).await);
    assert!(e.contains("task name"), "{e}");
    let e = refused(&berth(&agent, &["alloc", "logs", "no-such-alloc"]).await);
    assert!(e.contains("no alloc"), "{e}");
    let e = refused(&berth(&agent, &["alloc", "exec", &alloc, "--task", "nope", "ls"]).await);
    assert!(e.contains("no task \"nope\""), "{e}");
    let e = refused(&berth(&agent, &["alloc", "exec", "..", "ls"]).await);
    assert!(e.contains("alloc id"), "{e}");

    // A job whose `logs` block is wrong is refused with its file and line; nothing is placed.
    let bad = job(
        "badlogs",
        "batch",
        "true",
        "      logs {\n        max_files = 0\n      }\n",
    );
    let path = agent.tmp.path().join("badlogs.hcl");
    std::fs::write(&path, bad).unwrap();
    let out = berth(&agent, &["job", "run", path.to_str().unwrap()]).await;
    let e = refused(&out);
    assert!(e.contains("badlogs.hcl:12"), "{e}");
    assert!(e.contains("logs.max_files"), "{e}");
    assert!(
        client.job("badlogs").await.unwrap_err().is_not_found(),
        "no job placed"
    );

    // The task was left alone.
    let after = running(&agent, "keep").await;
    assert_eq!(after.tasks["main"].pid, before.tasks["main"].pid);
    assert_eq!(after.tasks["main"].restarts, 0);
    assert_eq!(files_of(&dir, "main.stdout"), files_before);
    assert_eq!(
        std::fs::read_to_string(dir.join("main.stdout.0")).unwrap(),
        "kept\n"
    );
}
