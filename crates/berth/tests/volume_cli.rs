//! `berth volume …` against a fake agent served in this process on a real unix socket through
//! the real router: what each command sends, what it prints, exit codes, and that spec texts,
//! secrets and mount flags are never printed.

use std::{
    collections::BTreeMap,
    path::Path,
    process::{Output, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use berth_api::{
    AgentView, ApiError, Event, Listeners, NodeStatus, PluginStatus, RegisterRequest, SpecOp,
    VolumeView,
    volumes::{
        CapabilityView, ClaimRequest, ClaimResponse, ClaimState, ClaimView, DetachRequest,
        DetachResponse, ExpandRequest, ExpandResponse, FlagsInput, MountOptionsInput,
        MountOptionsView, PublishedView, REDACTED, ReleaseRequest, ReleaseResponse,
        SnapshotCreateRequest, SnapshotDeleteRequest, SnapshotList, SnapshotView, SpecFormat,
        UsageView, VolumeList, VolumeOrigin, VolumeSpecRequest, VolumeStatus, VolumeSummary,
        WriteOnly,
    },
};
use berth_csi::model::{AccessMode, AttachmentMode, VolumeStats, VolumeUsage};
use tokio::{io::AsyncWriteExt as _, sync::broadcast, task::JoinHandle};
use tokio_util::sync::CancellationToken;

/// What would leak if a spec, secret or flag were printed.
const SPEC_SECRET: &str = "spec-secret-1234";
const FLAG_SECRET: &str = "flag-secret-5678";
const CLI_SECRET: &str = "cli-secret-9012";

/// A call the fake agent received, after the router checked it.
#[derive(Debug, Clone, PartialEq)]
enum Call {
    Volumes,
    Volume(String),
    Put(SpecOp, VolumeSpecRequest),
    Deregister(String, bool),
    Delete(String),
    Detach(String, DetachRequest),
    Expand(String, ExpandRequest),
    Claim(String, ClaimRequest),
    Release(String, ReleaseRequest),
    CreateSnapshot(String, SnapshotCreateRequest),
    DeleteSnapshot(SnapshotDeleteRequest),
    ListSnapshots(String),
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

/// `vol1` in detail. Its mount flags come back unredacted, as a faulty agent would send them:
/// the CLI must still show `[REDACTED]`.
fn vol1() -> VolumeStatus {
    let leaky = MountOptionsView {
        fs_type: "ext4".into(),
        mount_flags: Some(format!("noatime,password={FLAG_SECRET}")),
    };
    VolumeStatus {
        id: "vol1".into(),
        name: "Database".into(),
        plugin_id: "hostpath".into(),
        external_id: "ext-vol1".into(),
        origin: VolumeOrigin::Created,
        capabilities: vec![
            CapabilityView {
                access_mode: AccessMode::SingleNodeWriter,
                attachment_mode: AttachmentMode::FileSystem,
            },
            CapabilityView {
                access_mode: AccessMode::MultiNodeReaderOnly,
                attachment_mode: AttachmentMode::BlockDevice,
            },
        ],
        mount_options: leaky.clone(),
        capacity_bytes: 1 << 30,
        parameters: BTreeMap::from([("tier".into(), "fast".into())]),
        context: BTreeMap::from([("share".into(), "s1".into())]),
        secret_names: vec!["password".into(), "token".into()],
        topology: vec![BTreeMap::from([("zone".into(), "z1".into())])],
        controller_required: true,
        claims: vec![
            ClaimView {
                alloc_id: "a1".into(),
                node_id: "node-1".into(),
                mode: "write".into(),
                access_mode: AccessMode::SingleNodeWriter,
                attachment_mode: AttachmentMode::FileSystem,
                state: ClaimState::Claimed,
                error: None,
            },
            ClaimView {
                alloc_id: "a2".into(),
                node_id: "node-1".into(),
                mode: "read".into(),
                access_mode: AccessMode::SingleNodeWriter,
                attachment_mode: AttachmentMode::FileSystem,
                state: ClaimState::Releasing,
                error: Some("NodeUnpublishVolume: unavailable".into()),
            },
        ],
        usages: vec![UsageView {
            usage: "rw-file-system-single-node-writer".into(),
            mount_options: leaky,
            staging: Some("staged".into()),
            allocs: vec![PublishedView {
                alloc_id: "a1".into(),
                state: "published".into(),
                target: "/data/csi/per-alloc/a1/vol1/rw".into(),
                stats: Some(VolumeStats {
                    usage: vec![
                        VolumeUsage {
                            unit: "inodes".into(),
                            available: 90,
                            total: 100,
                            used: 10,
                        },
                        VolumeUsage {
                            unit: "bytes".into(),
                            available: 3 << 29,
                            total: 1 << 30,
                            used: 1 << 29,
                        },
                    ],
                    abnormal: None,
                }),
            }],
        }],
        created_ms: 1_700_000_000_000,
        warnings: Vec::new(),
    }
}

fn summaries() -> VolumeList {
    VolumeList {
        volumes: vec![
            VolumeSummary {
                id: "vol1".into(),
                name: "Database".into(),
                plugin_id: "hostpath".into(),
                external_id: "ext-vol1".into(),
                access_modes: vec![
                    AccessMode::SingleNodeWriter,
                    AccessMode::MultiNodeReaderOnly,
                ],
                read_claims: 1,
                write_claims: 1,
                capacity_bytes: 1 << 30,
                controller_required: false,
            },
            VolumeSummary {
                id: "vol2".into(),
                name: "scratch".into(),
                plugin_id: "nfs".into(),
                external_id: "ext-vol2".into(),
                access_modes: vec![AccessMode::MultiNodeMultiWriter],
                read_claims: 0,
                write_claims: 0,
                capacity_bytes: 0,
                controller_required: true,
            },
        ],
    }
}

fn snapshot_view(id: &str) -> SnapshotView {
    SnapshotView {
        snapshot_id: id.into(),
        plugin_id: "hostpath".into(),
        source_external_id: "ext-vol1".into(),
        source_volume_id: Some("vol1".into()),
        size_bytes: 1 << 30,
        creation_time: Some(1_700_000_000),
        ready_to_use: true,
    }
}

impl berth_api::JobView for FakeAgent {}

impl VolumeView for FakeAgent {
    fn volumes(&self) -> Result<VolumeList, ApiError> {
        self.record(Call::Volumes);
        Ok(summaries())
    }

    async fn volume(&self, id: &str) -> Result<VolumeStatus, ApiError> {
        self.record(Call::Volume(id.into()));
        match id {
            "vol1" => Ok(vol1()),
            _ => Err(ApiError::NotFound(format!("no volume {id:?}"))),
        }
    }

    async fn put_volume(
        &self,
        op: SpecOp,
        req: VolumeSpecRequest,
    ) -> Result<VolumeStatus, ApiError> {
        let file = req.file.clone().unwrap_or_default();
        let bad = req.spec.contains("capacity_min = \"lots\"");
        self.record(Call::Put(op, req));
        if bad {
            return Err(ApiError::BadRequest(format!(
                "{file}:3: field `capacity_min`: not a size"
            )));
        }
        let mut v = vol1();
        v.origin = match op {
            SpecOp::Register => VolumeOrigin::Registered,
            SpecOp::Create => VolumeOrigin::Created,
        };
        Ok(v)
    }

    async fn deregister_volume(&self, id: &str, force: bool) -> Result<DetachResponse, ApiError> {
        self.record(Call::Deregister(id.into(), force));
        if !force {
            return Ok(DetachResponse::default());
        }
        Ok(DetachResponse {
            releases: vec![release(id, "a1", true)],
        })
    }

    async fn delete_volume(&self, id: &str) -> Result<(), ApiError> {
        self.record(Call::Delete(id.into()));
        Ok(())
    }

    async fn detach_volume(
        &self,
        id: &str,
        req: DetachRequest,
    ) -> Result<DetachResponse, ApiError> {
        self.record(Call::Detach(id.into(), req));
        Ok(DetachResponse {
            releases: vec![release(id, "a1", true), release(id, "a2", false)],
        })
    }

    async fn expand_volume(
        &self,
        id: &str,
        req: ExpandRequest,
    ) -> Result<ExpandResponse, ApiError> {
        let bytes = i64::try_from(req.capacity_min).unwrap();
        self.record(Call::Expand(id.into(), req));
        Ok(ExpandResponse {
            volume_id: id.into(),
            capacity_bytes: bytes,
            node_expanded: true,
        })
    }

    async fn claim_volume(&self, id: &str, req: ClaimRequest) -> Result<ClaimResponse, ApiError> {
        let alloc = req.alloc_id.clone();
        self.record(Call::Claim(id.into(), req));
        Ok(ClaimResponse {
            volume_id: id.into(),
            alloc_id: alloc.clone(),
            node_id: "node-1".into(),
            usage: "rw-file-system-single-node-writer".into(),
            target: format!("/data/csi/per-alloc/{alloc}/{id}/rw").into(),
            publish_context: BTreeMap::new(),
        })
    }

    async fn release_volume(
        &self,
        id: &str,
        req: ReleaseRequest,
    ) -> Result<ReleaseResponse, ApiError> {
        let alloc = req.alloc_id.clone();
        self.record(Call::Release(id.into(), req));
        Ok(release(id, &alloc, alloc != "stuck"))
    }

    async fn create_snapshot(
        &self,
        id: &str,
        req: SnapshotCreateRequest,
    ) -> Result<SnapshotView, ApiError> {
        let name = req.name.clone();
        self.record(Call::CreateSnapshot(id.into(), req));
        Ok(snapshot_view(&format!("snap-{name}")))
    }

    async fn delete_snapshot(&self, req: SnapshotDeleteRequest) -> Result<(), ApiError> {
        self.record(Call::DeleteSnapshot(req));
        Ok(())
    }

    async fn list_snapshots(&self, plugin_id: &str) -> Result<SnapshotList, ApiError> {
        self.record(Call::ListSnapshots(plugin_id.into()));
        Ok(SnapshotList {
            snapshots: vec![snapshot_view("snap-1"), {
                let mut s = snapshot_view("snap-2");
                s.source_volume_id = None;
                s.creation_time = None;
                s.ready_to_use = false;
                s
            }],
        })
    }
}

fn release(id: &str, alloc: &str, released: bool) -> ReleaseResponse {
    ReleaseResponse {
        volume_id: id.into(),
        alloc_id: alloc.into(),
        released,
        error: (!released).then(|| "NodeUnstageVolume: unavailable".into()),
    }
}

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

    /// Runs `berth --address <agent> volume <args>`, with `stdin` on its standard input.
    async fn berth_stdin(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_berth"));
        cmd.args(["--address", &self.address, "volume"])
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

/// Neither output holds any of the secrets.
fn assert_no_secrets(o: &Output) {
    let all = format!("{}{}", text(&o.stdout), text(&o.stderr));
    for secret in [SPEC_SECRET, FLAG_SECRET, CLI_SECRET, "password="] {
        assert!(!all.contains(secret), "{secret:?} printed:\n{all}");
    }
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

fn hcl_spec(extra: &str) -> String {
    format!(
        "id        = \"vol1\"\nname      = \"Database\"\n{extra}plugin_id = \"hostpath\"\n\
         secrets {{\n  password = \"{SPEC_SECRET}\"\n}}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_and_create_send_the_file_as_written_and_never_echo_it() {
    let agent = Agent::start();
    let hcl = hcl_spec("");
    let hcl_path = agent.write("vol1.hcl", &hcl);
    let o = agent.berth(&["register", &hcl_path]).await;
    assert_eq!(
        stdout(&o),
        "Volume \"vol1\" registered (external id \"ext-vol1\", plugin \"hostpath\")\n"
    );
    assert_no_secrets(&o);
    assert_eq!(
        agent.take_calls(),
        [Call::Put(
            SpecOp::Register,
            VolumeSpecRequest {
                spec: hcl.clone(),
                format: SpecFormat::Hcl,
                file: Some(hcl_path.clone()),
            }
        )]
    );

    // A .json file is JSON; create answers the created volume.
    let json = format!(r#"{{"id": "vol1", "secrets": {{"password": "{SPEC_SECRET}"}}}}"#);
    let json_path = agent.write("vol1.json", &json);
    let o = agent.berth(&["create", &json_path]).await;
    assert_eq!(
        stdout(&o),
        "Volume \"vol1\" created (external id \"ext-vol1\", plugin \"hostpath\")\n"
    );
    assert_no_secrets(&o);
    assert_eq!(
        agent.take_calls(),
        [Call::Put(
            SpecOp::Create,
            VolumeSpecRequest {
                spec: json.clone(),
                format: SpecFormat::Json,
                file: Some(json_path.clone()),
            }
        )]
    );

    // --format overrides the extension; `-` reads stdin.
    let o = agent
        .berth(&["register", &json_path, "--format", "hcl"])
        .await;
    stdout(&o);
    let o = agent
        .berth_stdin(&["create", "-", "--format", "json"], Some(&json))
        .await;
    stdout(&o);
    assert_no_secrets(&o);
    assert_eq!(
        agent.take_calls(),
        [
            Call::Put(
                SpecOp::Register,
                VolumeSpecRequest {
                    spec: json.clone(),
                    format: SpecFormat::Hcl,
                    file: Some(json_path.clone()),
                }
            ),
            Call::Put(
                SpecOp::Create,
                VolumeSpecRequest {
                    spec: json.clone(),
                    format: SpecFormat::Json,
                    file: Some("<stdin>".into()),
                }
            ),
        ]
    );

    // --json prints the answer, flags redacted.
    let o = agent.berth(&["register", &hcl_path, "--json"]).await;
    let status: VolumeStatus = serde_json::from_str(&stdout(&o)).expect("a VolumeStatus");
    assert_eq!(status.origin, VolumeOrigin::Registered);
    assert_eq!(status.mount_options.mount_flags.as_deref(), Some(REDACTED));
    assert_no_secrets(&o);
    agent.take_calls();
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_spec_is_an_error_without_the_spec() {
    let agent = Agent::start();
    let hcl = hcl_spec("capacity_min = \"lots\"\n");
    let path = agent.write("bad.hcl", &hcl);
    for args in [
        vec!["register", path.as_str()],
        vec!["create", path.as_str(), "--json"],
    ] {
        let o = agent.berth(&args).await;
        assert_eq!(
            failed(&o, 1),
            format!("error: {path}:3: field `capacity_min`: not a size\n")
        );
        assert!(o.stdout.is_empty());
        assert_no_secrets(&o);
    }
    assert_eq!(agent.take_calls().len(), 2);

    // An unreadable file names the file, and nothing is sent.
    let missing = agent.dir.path().join("missing.hcl");
    let o = agent.berth(&["register", missing.to_str().unwrap()]).await;
    let err = failed(&o, 1);
    assert!(
        err.starts_with(&format!("error: cannot read {}", missing.display())),
        "{err}"
    );
    assert_eq!(agent.take_calls(), []);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lists_volumes_as_a_table_and_as_json() {
    let agent = Agent::start();
    let out = stdout(&agent.berth(&["status"]).await);
    assert_eq!(
        cells(&out),
        [
            vec![
                "ID",
                "NAME",
                "PLUGIN",
                "EXTERNAL",
                "ID",
                "SCHEDULABLE",
                "ACCESS",
                "MODES",
                "READERS",
                "WRITERS",
                "CAPACITY"
            ],
            vec![
                "vol1",
                "Database",
                "hostpath",
                "ext-vol1",
                "no",
                "single-node-writer,multi-node-reader-only",
                "1",
                "1",
                "1GiB"
            ],
            vec![
                "vol2",
                "scratch",
                "nfs",
                "ext-vol2",
                "no",
                "multi-node-multi-writer",
                "0",
                "0",
                "-"
            ],
        ],
        "{out}"
    );
    let out = stdout(&agent.berth(&["status", "--json"]).await);
    let list: VolumeList = serde_json::from_str(&out).expect("a VolumeList");
    assert_eq!(list, summaries());
    assert_eq!(agent.take_calls(), [Call::Volumes, Call::Volumes]);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_of_one_volume_shows_details_claims_and_usages_without_secrets() {
    let agent = Agent::start();
    let o = agent.berth(&["status", "vol1"]).await;
    let out = stdout(&o);
    assert_no_secrets(&o);
    assert_eq!(field(&out, "id"), "vol1");
    assert_eq!(field(&out, "name"), "Database");
    assert_eq!(field(&out, "plugin"), "hostpath");
    assert_eq!(field(&out, "external id"), "ext-vol1");
    assert_eq!(field(&out, "origin"), "created");
    assert!(field(&out, "created").ends_with("ago (2023-11-14T22:13:20Z)"));
    assert_eq!(field(&out, "capacity"), "1GiB (1073741824 bytes)");
    assert_eq!(
        field(&out, "capabilities"),
        "single-node-writer/file-system, multi-node-reader-only/block-device"
    );
    assert_eq!(field(&out, "fs type"), "ext4");
    assert_eq!(field(&out, "mount flags"), "[REDACTED]");
    assert_eq!(field(&out, "parameters"), "tier=fast");
    assert_eq!(field(&out, "context"), "share=s1");
    assert_eq!(field(&out, "secrets"), "password, token");
    assert_eq!(field(&out, "topology"), "zone=z1");
    assert_eq!(field(&out, "controller required"), "yes");
    assert_eq!(
        table(&out, "ALLOC"),
        [
            vec![
                "ALLOC",
                "TASK",
                "GROUP",
                "DESIRED",
                "STATUS",
                "CREATED",
                "MODIFIED",
                "NODE",
                "MODE",
                "ACCESS",
                "ATTACHMENT",
                "STATE",
                "ERROR"
            ],
            vec![
                "a1",
                "-",
                "-",
                "-",
                "-",
                "-",
                "node-1",
                "write",
                "single-node-writer",
                "file-system",
                "claimed",
                "-"
            ],
            vec![
                "a2",
                "-",
                "-",
                "-",
                "-",
                "-",
                "node-1",
                "read",
                "single-node-writer",
                "file-system",
                "releasing",
                "NodeUnpublishVolume:",
                "unavailable"
            ],
        ],
        "{out}"
    );
    assert_eq!(
        table(&out, "USAGE"),
        [
            vec![
                "USAGE", "STAGING", "ALLOC", "STATE", "TARGET", "USED", "TOTAL"
            ],
            vec![
                "rw-file-system-single-node-writer",
                "staged",
                "a1",
                "published",
                "/data/csi/per-alloc/a1/vol1/rw",
                "512MiB",
                "1GiB"
            ],
        ],
        "{out}"
    );

    // JSON: the document, flags redacted even though the agent sent them.
    let o = agent.berth(&["status", "vol1", "--json"]).await;
    let status: VolumeStatus = serde_json::from_str(&stdout(&o)).expect("a VolumeStatus");
    assert_no_secrets(&o);
    let mut expected = vol1();
    expected.mount_options.mount_flags = Some(REDACTED.into());
    expected.usages[0].mount_options.mount_flags = Some(REDACTED.into());
    assert_eq!(status, expected);

    // Unknown: the agent's words, exit 1.
    let o = agent.berth(&["status", "ghost"]).await;
    assert_eq!(failed(&o, 1), "error: no volume \"ghost\"\n");
    assert_eq!(
        agent.take_calls(),
        [
            Call::Volume("vol1".into()),
            Call::Volume("vol1".into()),
            Call::Volume("ghost".into())
        ]
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_sends_the_request_and_prints_the_target_but_never_the_flags() {
    let agent = Agent::start();
    let flag = format!("password={FLAG_SECRET}");
    let o = agent
        .berth(&[
            "claim",
            "vol1",
            "--alloc",
            "a1",
            "--access-mode",
            "multi-node-reader-only",
            "--attachment-mode",
            "file-system",
            "--read-only",
            "--fs-type",
            "xfs",
            "--mount-flag",
            "noatime",
            "--mount-flag",
            &flag,
        ])
        .await;
    assert_eq!(stdout(&o), "/data/csi/per-alloc/a1/vol1/rw\n");
    assert_no_secrets(&o);
    assert_eq!(
        agent.take_calls(),
        [Call::Claim(
            "vol1".into(),
            ClaimRequest {
                alloc_id: "a1".into(),
                read_only: true,
                access_mode: AccessMode::MultiNodeReaderOnly,
                attachment_mode: AttachmentMode::FileSystem,
                mount_options: Some(MountOptionsInput {
                    fs_type: Some("xfs".into()),
                    mount_flags: Some(FlagsInput(vec!["noatime".into(), flag.clone()])),
                }),
            }
        )]
    );

    // Defaults: file-system, read-write, the volume's mount options; --json prints the answer.
    let o = agent
        .berth(&[
            "claim",
            "vol1",
            "--alloc",
            "a2",
            "--access-mode",
            "SINGLE_NODE_WRITER",
            "--json",
        ])
        .await;
    let answer: ClaimResponse = serde_json::from_str(&stdout(&o)).expect("a ClaimResponse");
    assert_eq!(answer.target, Path::new("/data/csi/per-alloc/a2/vol1/rw"));
    assert_eq!(
        agent.take_calls(),
        [Call::Claim(
            "vol1".into(),
            ClaimRequest {
                alloc_id: "a2".into(),
                read_only: false,
                access_mode: AccessMode::SingleNodeWriter,
                attachment_mode: AttachmentMode::FileSystem,
                mount_options: None,
            }
        )]
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_exits_1_while_the_agent_is_still_releasing() {
    let agent = Agent::start();
    let o = agent.berth(&["release", "vol1", "--alloc", "a1"]).await;
    assert_eq!(stdout(&o), "released\n");

    let o = agent.berth(&["release", "vol1", "--alloc", "stuck"]).await;
    assert_eq!(
        failed(&o, 1),
        "error: the claim of alloc \"stuck\" on volume \"vol1\" is not released yet\n"
    );
    assert_eq!(
        text(&o.stdout),
        "releasing (retrying in the background): NodeUnstageVolume: unavailable\n"
    );

    let o = agent
        .berth(&["release", "vol1", "--alloc", "stuck", "--json"])
        .await;
    failed(&o, 1);
    let answer: ReleaseResponse = serde_json::from_slice(&o.stdout).expect("a ReleaseResponse");
    assert!(!answer.released);

    let release = |alloc: &str| {
        Call::Release(
            "vol1".into(),
            ReleaseRequest {
                alloc_id: alloc.into(),
            },
        )
    };
    assert_eq!(
        agent.take_calls(),
        [release("a1"), release("stuck"), release("stuck")]
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deregister_delete_detach_and_expand_send_what_was_asked() {
    let agent = Agent::start();
    let out = stdout(&agent.berth(&["deregister", "vol1"]).await);
    assert_eq!(out, "Volume \"vol1\" deregistered\n");
    let out = stdout(&agent.berth(&["deregister", "vol1", "--force"]).await);
    assert_eq!(
        cells(&out),
        [
            vec!["ALLOC", "RELEASE"],
            vec!["a1", "released"],
            vec!["Volume", "\"vol1\"", "deregistered"]
        ]
    );
    let out = stdout(&agent.berth(&["delete", "vol2"]).await);
    assert_eq!(out, "Volume \"vol2\" deleted\n");

    // Detach: one released, one still pending → exit 1 after the table.
    let o = agent.berth(&["detach", "vol1", "--node", "node-9"]).await;
    let err = failed(&o, 1);
    assert!(
        err.contains("1 claim(s) on volume \"vol1\" not released yet"),
        "{err}"
    );
    assert_eq!(
        cells(&text(&o.stdout)),
        [
            vec!["ALLOC", "RELEASE"],
            vec!["a1", "released"],
            vec!["a2", "pending:", "NodeUnstageVolume:", "unavailable"],
        ]
    );
    failed(&agent.berth(&["detach", "vol1"]).await, 1);

    let out = stdout(
        &agent
            .berth(&[
                "expand",
                "vol1",
                "--capacity-min",
                "2GiB",
                "--capacity-max",
                "3000000000",
            ])
            .await,
    );
    assert_eq!(
        out,
        "Volume \"vol1\" expanded to 2GiB (2147483648 bytes), filesystem grown on this node\n"
    );
    let out = stdout(
        &agent
            .berth(&["expand", "vol1", "--capacity-min", "500MB", "--json"])
            .await,
    );
    let answer: ExpandResponse = serde_json::from_str(&out).expect("an ExpandResponse");
    assert_eq!(answer.capacity_bytes, 500_000_000);

    assert_eq!(
        agent.take_calls(),
        [
            Call::Deregister("vol1".into(), false),
            Call::Deregister("vol1".into(), true),
            Call::Delete("vol2".into()),
            Call::Detach(
                "vol1".into(),
                DetachRequest {
                    node_id: Some("node-9".into())
                }
            ),
            Call::Detach("vol1".into(), DetachRequest { node_id: None }),
            Call::Expand(
                "vol1".into(),
                ExpandRequest {
                    capacity_min: 2 << 30,
                    capacity_max: Some(3_000_000_000),
                }
            ),
            Call::Expand(
                "vol1".into(),
                ExpandRequest {
                    capacity_min: 500_000_000,
                    capacity_max: None,
                }
            ),
        ]
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_created_listed_and_deleted_with_secrets_sent_not_shown() {
    let agent = Agent::start();
    let secret = format!("password={CLI_SECRET}");
    let secrets_file = agent.write("secrets.env", &format!("token={CLI_SECRET}\n"));
    let o = agent
        .berth(&[
            "snapshot",
            "create",
            "vol1",
            "nightly",
            "--parameter",
            "kind=full",
            "--secret",
            &secret,
            "--secrets-file",
            &secrets_file,
        ])
        .await;
    let out = stdout(&o);
    assert_no_secrets(&o);
    assert_eq!(field(&out, "snapshot id"), "snap-nightly");
    assert_eq!(field(&out, "volume"), "vol1");
    assert_eq!(field(&out, "size"), "1GiB");
    assert_eq!(field(&out, "created"), "2023-11-14T22:13:20Z");
    assert_eq!(field(&out, "ready"), "yes");
    // Without secrets: the volume's are used (none sent).
    let o = agent
        .berth(&["snapshot", "create", "vol1", "adhoc", "--json"])
        .await;
    let snap: SnapshotView = serde_json::from_str(&stdout(&o)).expect("a SnapshotView");
    assert_eq!(snap.snapshot_id, "snap-adhoc");

    let out = stdout(
        &agent
            .berth(&["snapshot", "list", "--plugin", "hostpath"])
            .await,
    );
    assert_eq!(
        cells(&out),
        [
            vec![
                "SNAPSHOT", "ID", "SOURCE", "VOLUME", "SIZE", "CREATED", "READY"
            ],
            vec![
                "snap-1",
                "ext-vol1",
                "vol1",
                "1GiB",
                "2023-11-14T22:13:20Z",
                "yes"
            ],
            vec!["snap-2", "ext-vol1", "-", "1GiB", "-", "no"],
        ],
        "{out}"
    );
    let out = stdout(
        &agent
            .berth(&["snapshot", "list", "--plugin", "hostpath", "--json"])
            .await,
    );
    let list: SnapshotList = serde_json::from_str(&out).expect("a SnapshotList");
    assert_eq!(list.snapshots.len(), 2);

    let o = agent
        .berth(&[
            "snapshot", "delete", "--plugin", "hostpath", "snap-1", "--secret", &secret,
        ])
        .await;
    assert_eq!(stdout(&o), "Snapshot \"snap-1\" deleted\n");
    assert_no_secrets(&o);

    let secrets = |pairs: &[(&str, &str)]| {
        WriteOnly(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    };
    assert_eq!(
        agent.take_calls(),
        [
            Call::CreateSnapshot(
                "vol1".into(),
                SnapshotCreateRequest {
                    name: "nightly".into(),
                    parameters: BTreeMap::from([("kind".into(), "full".into())]),
                    secrets: Some(secrets(&[("password", CLI_SECRET), ("token", CLI_SECRET)])),
                }
            ),
            Call::CreateSnapshot(
                "vol1".into(),
                SnapshotCreateRequest {
                    name: "adhoc".into(),
                    parameters: BTreeMap::new(),
                    secrets: None,
                }
            ),
            Call::ListSnapshots("hostpath".into()),
            Call::ListSnapshots("hostpath".into()),
            Call::DeleteSnapshot(SnapshotDeleteRequest {
                plugin_id: "hostpath".into(),
                snapshot_id: "snap-1".into(),
                secrets: secrets(&[("password", CLI_SECRET)]),
            }),
        ]
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_command_lines_are_usage_errors_and_send_nothing() {
    let agent = Agent::start();
    let claim = |mode: &'static str| vec!["claim", "vol1", "--alloc", "a1", "--access-mode", mode];
    for args in [
        claim("sometimes-writer"),
        [
            claim("single-node-writer"),
            vec!["--attachment-mode", "tape"],
        ]
        .concat(),
        claim("single-node-writer")[..4].to_vec(),
        vec!["expand", "vol1", "--capacity-min", "12XB"],
        vec!["expand", "vol1", "--capacity-min", "lots"],
        vec!["expand", "vol1"],
        vec![
            "expand",
            "vol1",
            "--capacity-min",
            "2GiB",
            "--capacity-max",
            "1GiB",
        ],
        vec!["status", ""],
        vec!["register"],
        vec!["register", "x.hcl", "--format", "yaml"],
        vec!["snapshot", "list"],
        vec!["snapshot", "create", "vol1", "n", "--secret", CLI_SECRET],
        vec![
            "snapshot", "delete", "--plugin", "p", "s", "--secret", CLI_SECRET,
        ],
        vec!["frobnicate", "vol1"],
    ] {
        let o = agent.berth(&args).await;
        let err = failed(&o, 2);
        assert!(!err.is_empty(), "{args:?}");
        assert!(o.stdout.is_empty(), "{args:?}");
        assert_no_secrets(&o);
    }
    let o = agent.berth(&claim("sometimes-writer")).await;
    assert!(
        text(&o.stderr).contains("sometimes-writer"),
        "names the mode"
    );
    let o = agent
        .berth(&["expand", "vol1", "--capacity-min", "12XB"])
        .await;
    assert!(text(&o.stderr).contains("unknown unit"));
    assert_eq!(agent.take_calls(), []);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_ids_reach_the_router_as_given_and_are_refused() {
    let agent = Agent::start();
    for id in ["..", ".", "a/../b", "a/b", "../plugins"] {
        for args in [
            vec!["status", id],
            vec!["deregister", id, "--force"],
            vec!["delete", id],
            vec![
                "claim",
                id,
                "--alloc",
                "a1",
                "--access-mode",
                "single-node-writer",
            ],
            vec!["release", id, "--alloc", "a1"],
            vec!["expand", id, "--capacity-min", "1GiB"],
            vec!["snapshot", "create", id, "n"],
        ] {
            let o = agent.berth(&args).await;
            let err = failed(&o, 1);
            assert!(
                err.starts_with(&format!("error: invalid volume id {id:?}")),
                "{args:?}: {err}"
            );
        }
    }
    assert_eq!(agent.take_calls(), []);

    // A query in an id stays part of the id: it does not become `force`.
    let odd = "x?force=true";
    let o = agent.berth(&["status", odd]).await;
    assert_eq!(failed(&o, 1), "error: no volume \"x?force=true\"\n");
    stdout(&agent.berth(&["deregister", odd]).await);
    assert_eq!(
        agent.take_calls(),
        [
            Call::Volume(odd.into()),
            Call::Deregister(odd.into(), false)
        ]
    );
    agent.stop().await;
}
