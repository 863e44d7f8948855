//! `berth job …` and `berth alloc …` against a fake agent served in this process on a real unix
//! socket through the real router: what each command sends, what it prints, exit codes, and
//! that a job spec's text is never printed.

use std::{
    collections::BTreeMap,
    process::{Output, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use berth_api::{
    AgentView, ApiError, Event, JobView, Listeners, NodeStatus, PluginStatus, RegisterRequest,
    VolumeView,
    jobs::{
        AllocStatus, ClientStatus, DesiredState, JobList, JobRunRequest, JobStatus, JobSummary,
    },
    volumes::SpecFormat,
};
use serde_json::json;
use tokio::{io::AsyncWriteExt as _, sync::broadcast, task::JoinHandle};
use tokio_util::sync::CancellationToken;

/// What would show if a spec's text were printed.
const SPEC_MARKER: &str = "spec-text-marker-4711";

/// 2023-11-14T22:13:20Z.
const T0: u64 = 1_700_000_000;

/// A call the fake agent received, after the router checked it.
#[derive(Debug, Clone, PartialEq)]
enum Call {
    Jobs,
    Job(String),
    Alloc(String),
    Run(JobRunRequest),
    Stop(String),
}

#[derive(Debug)]
struct FakeAgent {
    calls: Mutex<Vec<Call>>,
    events: broadcast::Sender<Event>,
}

impl FakeAgent {
    fn record(&self, call: Call) {
        self.calls.lock().unwrap().push(call);
    }
}

fn at(secs: u64) -> serde_json::Value {
    json!({ "secs_since_epoch": T0 + secs, "nanos_since_epoch": 0 })
}

/// `web-0`: two tasks (one running after a restart, one failed for good), a third waiting
/// after it was lost, two volumes and a few events.
fn web0() -> AllocStatus {
    serde_json::from_value(json!({
        "alloc_id": "web-0",
        "job_id": "web",
        "group": "frontend",
        "index": 0,
        "desired": "run",
        "client_status": "running",
        "failure": null,
        "tasks": {
            "logger": {
                "driver": "",
                "state": "pending",
                "pid": null,
                "restarts": 0,
                "failed": false,
                "lost": true,
                "last_exit": null,
                "started_at": null,
                "finished_at": null
            },
            "server": {
                "driver": "exec",
                "state": "running",
                "pid": 4242,
                "restarts": 1,
                "failed": false,
                "lost": false,
                "last_exit": { "exit_code": 1, "signal": null, "oom_killed": false },
                "started_at": at(3),
                "finished_at": null
            },
            "sidecar": {
                "driver": "raw_exec",
                "state": "dead",
                "pid": null,
                "restarts": 3,
                "failed": true,
                "lost": false,
                "last_exit": { "exit_code": null, "signal": 9, "oom_killed": true },
                "started_at": at(2),
                "finished_at": at(4)
            }
        },
        "volumes": {
            "config": {
                "volume_id": "cfg",
                "read_only": true,
                "access_mode": "multi-node-reader-only",
                "attachment_mode": "file-system",
                "fs_type": "",
                "claimed": false,
                "target": null
            },
            "data": {
                "volume_id": "db[0]",
                "read_only": false,
                "access_mode": "single-node-writer",
                "attachment_mode": "file-system",
                "fs_type": "ext4",
                "mount_flags": "[REDACTED]",
                "claimed": true,
                "target": "/var/lib/berth/csi/per-alloc/web-0/db[0]/rw"
            }
        },
        "events": [
            { "time": at(0), "task": null, "kind": "received", "message": "alloc received" },
            {
                "time": at(1),
                "task": null,
                "kind": "volume_claimed",
                "message": "volume \"data\" claimed"
            },
            { "time": at(2), "task": "server", "kind": "started", "message": "pid 4241" },
            { "time": at(3), "task": "server", "kind": "exited", "message": "exited with code 1" }
        ],
        "events_dropped": 2
    }))
    .expect("an AllocStatus")
}

/// `web-1`: still pending, nothing started.
fn web1() -> AllocStatus {
    serde_json::from_value(json!({
        "alloc_id": "web-1",
        "job_id": "web",
        "group": "frontend",
        "index": 1,
        "desired": "run",
        "client_status": "pending",
        "failure": null,
        "tasks": {},
        "volumes": {},
        "events": [],
        "events_dropped": 0
    }))
    .expect("an AllocStatus")
}

fn web() -> JobStatus {
    JobStatus {
        id: "web".into(),
        job_type: "service".into(),
        stopped: false,
        allocs: vec![web0(), web1()],
        version: None,
        placements: Vec::new(),
        failures: Vec::new(),
        event_index: None,
    }
}

fn stopped_web() -> JobStatus {
    let mut job = web();
    job.stopped = true;
    for a in &mut job.allocs {
        a.desired = DesiredState::Stop;
        a.client_status = ClientStatus::Complete;
    }
    job
}

fn job_list() -> JobList {
    JobList {
        jobs: vec![
            JobSummary {
                id: "nightly".into(),
                job_type: "batch".into(),
                stopped: true,
                allocs: BTreeMap::from([("complete".into(), 1), ("failed".into(), 2)]),
            },
            JobSummary {
                id: "web".into(),
                job_type: "service".into(),
                stopped: false,
                allocs: BTreeMap::from([("pending".into(), 1), ("running".into(), 1)]),
            },
        ],
    }
}

impl JobView for FakeAgent {
    fn jobs(&self) -> Result<JobList, ApiError> {
        self.record(Call::Jobs);
        Ok(job_list())
    }

    fn job(&self, id: &str) -> Result<JobStatus, ApiError> {
        self.record(Call::Job(id.into()));
        match id {
            "web" => Ok(web()),
            _ => Err(ApiError::NotFound(format!("no job {id:?}"))),
        }
    }

    fn alloc(&self, id: &str) -> Result<AllocStatus, ApiError> {
        self.record(Call::Alloc(id.into()));
        match id {
            "web-0" => Ok(web0()),
            "web-1" => Ok(web1()),
            _ => Err(ApiError::NotFound(format!("no alloc {id:?}"))),
        }
    }

    async fn run_job(&self, req: JobRunRequest) -> Result<JobStatus, ApiError> {
        let file = req.file.clone().unwrap_or_default();
        let bad = req.spec.contains("count = \"many\"");
        self.record(Call::Run(req));
        if bad {
            return Err(ApiError::BadRequest(format!(
                "{file}:3: field `count`: not a number"
            )));
        }
        Ok(web())
    }

    async fn stop_job(&self, id: &str, _purge: bool) -> Result<JobStatus, ApiError> {
        self.record(Call::Stop(id.into()));
        match id {
            "web" => Ok(stopped_web()),
            _ => Err(ApiError::NotFound(format!("no job {id:?}"))),
        }
    }
}

impl VolumeView for FakeAgent {}

impl AgentView for FakeAgent {
    fn plugins(&self) -> Vec<PluginStatus> {
        Vec::new()
    }

    fn plugin(&self, _id: &str) -> Option<PluginStatus> {
        None
    }

    fn node(&self) -> NodeStatus {
        NodeStatus {
            id: "node-1".into(),
            hostname: "worker-1".into(),
            csi_plugins: Vec::new(),
            ..Default::default()
        }
    }

    fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    fn metrics(&self) -> String {
        String::new()
    }

    async fn register(&self, req: RegisterRequest) -> Result<PluginStatus, ApiError> {
        Err(ApiError::Internal(format!("not in this test: {}", req.id)))
    }

    async fn deregister(&self, id: &str, _instance: &str) -> Result<(), ApiError> {
        Err(ApiError::Internal(format!("not in this test: {id}")))
    }
}

#[derive(Debug)]
struct Agent {
    view: Arc<FakeAgent>,
    address: String,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
    dir: tempfile::TempDir,
}

impl Agent {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("berth.sock");
        let listeners = Listeners::bind(&socket, None).unwrap();
        let view = Arc::new(FakeAgent {
            calls: Mutex::new(Vec::new()),
            events: broadcast::channel(4).0,
        });
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(listeners.serve(berth_api::router(view.clone()), shutdown.clone()));
        Self {
            view,
            address: format!("unix://{}", socket.display()),
            shutdown,
            task,
            dir,
        }
    }

    /// The calls received since the last look.
    fn take_calls(&self) -> Vec<Call> {
        std::mem::take(&mut *self.view.calls.lock().unwrap())
    }

    /// A file in the test's directory.
    fn write(&self, name: &str, text: &str) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    }

    async fn berth(&self, args: &[&str]) -> Output {
        self.berth_stdin(args, None).await
    }

    /// Runs `berth --address <agent> <args>`, with `stdin` on its standard input.
    async fn berth_stdin(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_berth"));
        cmd.args(["--address", &self.address])
            .args(args)
            .env_remove("BERTH_ADDR")
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("run berth");
        if let Some(text) = stdin {
            let mut pipe = child.stdin.take().unwrap();
            pipe.write_all(text.as_bytes()).await.unwrap();
        }
        tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
            .await
            .expect("berth finishes within 30s")
            .expect("berth's output")
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the server stops within 10s")
            .unwrap();
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// Stdout of a successful run.
fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "{:?}: {}", o.status, text(&o.stderr));
    text(&o.stdout)
}

/// Stderr of a run that exited with `code`.
fn failed(o: &Output, code: i32) -> String {
    assert_eq!(
        o.status.code(),
        Some(code),
        "stdout: {}\nstderr: {}",
        text(&o.stdout),
        text(&o.stderr)
    );
    text(&o.stderr)
}

/// Neither output holds the spec's text.
fn assert_no_spec(o: &Output) {
    let all = format!("{}{}", text(&o.stdout), text(&o.stderr));
    assert!(!all.contains(SPEC_MARKER), "the spec was printed:\n{all}");
}

/// The whitespace-separated cells of each line.
fn cells(text: &str) -> Vec<Vec<&str>> {
    text.lines()
        .map(|l| l.split_whitespace().collect())
        .collect()
}

/// The table whose header starts with `first`, up to the next blank line.
fn table<'a>(text: &'a str, first: &str) -> Vec<Vec<&'a str>> {
    cells(text)
        .into_iter()
        .skip_while(|row| row.first() != Some(&first))
        .take_while(|row| !row.is_empty())
        .collect()
}

/// The value of a `key  value` line.
fn field<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(key)
                .filter(|rest| rest.starts_with("  "))
                .map(str::trim)
        })
        .unwrap_or_else(|| panic!("no field {key:?} in\n{text}"))
}

/// The allocs table of `web` as printed, with `status` for both allocs (`None`: as placed).
fn web_allocs(status: Option<&'static str>) -> Vec<Vec<&'static str>> {
    vec![
        vec!["ID", "GROUP", "INDEX", "STATUS"],
        vec!["web-0", "frontend", "0", status.unwrap_or("running")],
        vec!["web-1", "frontend", "1", status.unwrap_or("pending")],
    ]
}

fn hcl_spec(extra: &str) -> String {
    format!(
        "job \"web\" {{\n  meta {{ note = \"{SPEC_MARKER}\" }}\n{extra}  group \"frontend\" {{}}\n}}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_sends_the_file_as_written_and_prints_the_allocs_never_the_spec() {
    let agent = Agent::start();
    let hcl = hcl_spec("");
    let hcl_path = agent.write("web.hcl", &hcl);
    let o = agent.berth(&["job", "run", &hcl_path]).await;
    let out = stdout(&o);
    assert_no_spec(&o);
    assert!(
        out.starts_with("Job \"web\" placed: 2 alloc(s)\n\n"),
        "{out}"
    );
    assert_eq!(table(&out, "ID"), web_allocs(None), "{out}");
    assert_eq!(
        agent.take_calls(),
        [Call::Run(JobRunRequest {
            spec: hcl.clone(),
            format: SpecFormat::Hcl,
            file: Some(hcl_path.clone()),
            ..Default::default()
        })]
    );

    // A .json file is JSON; --format overrides the extension; `-` reads stdin.
    let json = format!(r#"{{"Job": {{"ID": "web", "Meta": {{"note": "{SPEC_MARKER}"}}}}}}"#);
    let json_path = agent.write("web.JSON", &json);
    let o = agent.berth(&["job", "run", &json_path]).await;
    stdout(&o);
    assert_no_spec(&o);
    let o = agent
        .berth(&["job", "run", &json_path, "--format", "hcl"])
        .await;
    stdout(&o);
    let o = agent
        .berth_stdin(&["job", "run", "-", "--format", "json"], Some(&json))
        .await;
    stdout(&o);
    assert_no_spec(&o);
    let o = agent.berth_stdin(&["job", "run", "-"], Some(&hcl)).await;
    stdout(&o);
    let run = |spec: &str, format, file: &str| {
        Call::Run(JobRunRequest {
            spec: spec.into(),
            format,
            file: Some(file.into()),
            ..Default::default()
        })
    };
    assert_eq!(
        agent.take_calls(),
        [
            run(&json, SpecFormat::Json, &json_path),
            run(&json, SpecFormat::Hcl, &json_path),
            run(&json, SpecFormat::Json, "<stdin>"),
            run(&hcl, SpecFormat::Hcl, "<stdin>"),
        ]
    );

    // --json prints the answer.
    let o = agent.berth(&["job", "run", &hcl_path, "--json"]).await;
    let job: JobStatus = serde_json::from_str(&stdout(&o)).expect("a JobStatus");
    assert_eq!(job, web());
    assert_no_spec(&o);
    assert_eq!(agent.take_calls().len(), 1);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_spec_is_an_error_naming_file_and_line_without_the_spec() {
    let agent = Agent::start();
    let path = agent.write("bad.hcl", &hcl_spec("  count = \"many\"\n"));
    for args in [
        vec!["job", "run", path.as_str()],
        vec!["job", "run", path.as_str(), "--json"],
    ] {
        let o = agent.berth(&args).await;
        assert_eq!(
            failed(&o, 1),
            format!("error: {path}:3: field `count`: not a number\n")
        );
        assert!(o.stdout.is_empty());
        assert_no_spec(&o);
    }
    assert_eq!(agent.take_calls().len(), 2);

    // An unreadable file names the file, and nothing is sent.
    let missing = agent.dir.path().join("missing.hcl");
    let o = agent
        .berth(&["job", "run", missing.to_str().unwrap()])
        .await;
    let err = failed(&o, 1);
    assert!(
        err.starts_with(&format!("error: cannot read {}", missing.display())),
        "{err}"
    );
    assert_eq!(agent.take_calls(), []);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lists_jobs_and_shows_one_job_as_tables_and_as_json() {
    let agent = Agent::start();
    let out = stdout(&agent.berth(&["job", "status"]).await);
    assert_eq!(
        cells(&out),
        [
            vec![
                "ID", "TYPE", "STOPPED", "PENDING", "RUNNING", "COMPLETE", "FAILED"
            ],
            vec!["nightly", "batch", "yes", "0", "0", "1", "2"],
            vec!["web", "service", "no", "1", "1", "0", "0"],
        ],
        "{out}"
    );
    let out = stdout(&agent.berth(&["job", "status", "--json"]).await);
    let list: JobList = serde_json::from_str(&out).expect("a JobList");
    assert_eq!(list, job_list());

    let out = stdout(&agent.berth(&["job", "status", "web"]).await);
    assert_eq!(field(&out, "id"), "web");
    assert_eq!(field(&out, "type"), "service");
    assert_eq!(field(&out, "stopped"), "no");
    assert_eq!(table(&out, "ID"), web_allocs(None), "{out}");
    let out = stdout(&agent.berth(&["job", "status", "web", "--json"]).await);
    let job: JobStatus = serde_json::from_str(&out).expect("a JobStatus");
    assert_eq!(job, web());

    // Unknown: the agent's words, exit 1.
    let o = agent.berth(&["job", "status", "ghost"]).await;
    assert_eq!(failed(&o, 1), "error: no job \"ghost\"\n");
    assert!(o.stdout.is_empty());
    assert_eq!(
        agent.take_calls(),
        [
            Call::Jobs,
            Call::Jobs,
            Call::Job("web".into()),
            Call::Job("web".into()),
            Call::Job("ghost".into()),
        ]
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_sends_the_id_and_prints_the_stopped_allocs() {
    let agent = Agent::start();
    let out = stdout(&agent.berth(&["job", "stop", "web"]).await);
    assert!(out.starts_with("Job \"web\" stopped\n\n"), "{out}");
    assert_eq!(table(&out, "ID"), web_allocs(Some("complete")), "{out}");
    let out = stdout(&agent.berth(&["job", "stop", "web", "--json"]).await);
    let job: JobStatus = serde_json::from_str(&out).expect("a JobStatus");
    assert_eq!(job, stopped_web());
    let o = agent.berth(&["job", "stop", "ghost"]).await;
    assert_eq!(failed(&o, 1), "error: no job \"ghost\"\n");
    assert_eq!(
        agent.take_calls(),
        [
            Call::Stop("web".into()),
            Call::Stop("web".into()),
            Call::Stop("ghost".into()),
        ]
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alloc_status_shows_tasks_volumes_and_events() {
    let agent = Agent::start();
    let out = stdout(&agent.berth(&["alloc", "status", "web-0"]).await);
    assert_eq!(field(&out, "id"), "web-0");
    assert_eq!(field(&out, "job"), "web");
    assert_eq!(field(&out, "group"), "frontend");
    assert_eq!(field(&out, "index"), "0");
    assert_eq!(field(&out, "desired"), "run");
    assert_eq!(field(&out, "status"), "running");
    assert_eq!(field(&out, "failure"), "-");
    assert_eq!(
        table(&out, "TASK"),
        [
            vec![
                "TASK", "DRIVER", "STATE", "PID", "RESTARTS", "FAILED", "LOST", "LAST", "EXIT"
            ],
            vec!["logger", "-", "pending", "-", "0", "no", "yes", "-"],
            vec![
                "server", "exec", "running", "4242", "1", "no", "no", "exited", "with", "code", "1"
            ],
            vec![
                "sidecar", "raw_exec", "dead", "-", "3", "yes", "no", "killed", "by", "SIGKILL",
                "(OOM", "killed)"
            ],
        ],
        "{out}"
    );
    assert_eq!(
        table(&out, "VOLUME"),
        [
            vec![
                "VOLUME",
                "VOLUME",
                "ID",
                "MODE",
                "ACCESS",
                "MODE",
                "ATTACHMENT",
                "FS",
                "FLAGS",
                "CLAIMED",
                "TARGET"
            ],
            vec![
                "config",
                "cfg",
                "ro",
                "multi-node-reader-only",
                "file-system",
                "-",
                "-",
                "no",
                "-"
            ],
            vec![
                "data",
                "db[0]",
                "rw",
                "single-node-writer",
                "file-system",
                "ext4",
                "[REDACTED]",
                "yes",
                "/var/lib/berth/csi/per-alloc/web-0/db[0]/rw"
            ],
        ],
        "{out}"
    );
    assert_eq!(
        table(&out, "TIME"),
        [
            vec!["TIME", "TASK", "KIND", "MESSAGE"],
            vec!["2023-11-14T22:13:20Z", "-", "received", "alloc", "received"],
            vec![
                "2023-11-14T22:13:21Z",
                "-",
                "volume_claimed",
                "volume",
                "\"data\"",
                "claimed"
            ],
            vec!["2023-11-14T22:13:22Z", "server", "started", "pid", "4241"],
            vec![
                "2023-11-14T22:13:23Z",
                "server",
                "exited",
                "exited",
                "with",
                "code",
                "1"
            ],
            vec!["(2", "older", "event(s)", "dropped)"],
        ],
        "{out}"
    );

    // JSON: the API's document as sent.
    let out = stdout(&agent.berth(&["alloc", "status", "web-0", "--json"]).await);
    let alloc: AllocStatus = serde_json::from_str(&out).expect("an AllocStatus");
    assert_eq!(alloc, web0());

    // Nothing yet: each section says so.
    let out = stdout(&agent.berth(&["alloc", "status", "web-1"]).await);
    assert_eq!(field(&out, "status"), "pending");
    let sections: Vec<&str> = out.lines().filter(|l| l.starts_with("no ")).collect();
    assert_eq!(sections, ["no tasks", "no volumes", "no events"], "{out}");

    // Unknown: the agent's words, exit 1.
    let o = agent.berth(&["alloc", "status", "ghost"]).await;
    assert_eq!(failed(&o, 1), "error: no alloc \"ghost\"\n");
    assert!(o.stdout.is_empty());
    assert_eq!(
        agent.take_calls(),
        // The human form reads the alloc's job too (where it was placed: its node).
        [
            Call::Alloc("web-0".into()),
            Call::Job("web".into()),
            Call::Alloc("web-0".into()),
            Call::Alloc("web-1".into()),
            Call::Job("web".into()),
            Call::Alloc("ghost".into()),
        ]
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_command_lines_are_usage_errors_and_send_nothing() {
    let agent = Agent::start();
    let path = agent.write("web.hcl", &hcl_spec(""));
    for args in [
        vec!["job", "run"],
        vec!["job", "run", path.as_str(), "--format", "yaml"],
        vec!["job", "run", path.as_str(), "extra"],
        vec!["job", "stop"],
        vec!["job", "stop", ""],
        vec!["job", "status", ""],
        vec!["job", "status", "web", "--bogus"],
        vec!["job", "frobnicate"],
        vec!["job"],
        vec!["alloc", "status"],
        vec!["alloc", "status", ""],
        vec!["alloc", "frobnicate", "web-0"],
    ] {
        let o = agent.berth(&args).await;
        let err = failed(&o, 2);
        assert!(!err.is_empty(), "{args:?}");
        assert!(o.stdout.is_empty(), "{args:?}");
        assert_no_spec(&o);
    }
    let o = agent
        .berth(&["--address", "ftp://x", "job", "status"])
        .await;
    assert!(failed(&o, 2).contains("--address"));
    assert_eq!(agent.take_calls(), []);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_ids_reach_the_router_as_given_and_are_refused() {
    let agent = Agent::start();
    for id in ["..", ".", "a/../b", "a/b", "../jobs"] {
        for (args, kind) in [
            (vec!["job", "status", id], "job id"),
            (vec!["job", "status", id, "--json"], "job id"),
            (vec!["job", "stop", id], "job id"),
            (vec!["alloc", "status", id], "alloc id"),
        ] {
            let o = agent.berth(&args).await;
            let err = failed(&o, 1);
            assert!(
                err.starts_with(&format!("error: invalid {kind} {id:?}")),
                "{args:?}: {err}"
            );
            assert!(o.stdout.is_empty(), "{args:?}");
        }
    }
    assert_eq!(agent.take_calls(), []);

    // A query in an id stays part of the id.
    let odd = "x?y=1";
    let o = agent.berth(&["alloc", "status", odd]).await;
    assert_eq!(failed(&o, 1), "error: no alloc \"x?y=1\"\n");
    assert_eq!(agent.take_calls(), [Call::Alloc(odd.into())]);
    agent.stop().await;
}
