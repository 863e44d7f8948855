//! Hostile input against a real `berth agent` running berth-hostpath, over raw HTTP on its
//! socket: canaries (a string and numbers) sent in every wrong shape in every field of every
//! body, in ids and in queries, never appear in an answer (status line, headers, body) nor in
//! the agent's log; ids with control characters are refused with 400 on every route; and no
//! refused request changes anything (volumes and their statuses, plugins, jobs, the store).

mod agent_support;

use std::{path::Path, time::Duration};

use agent_support::AgentProcess;
use berth_api::{
    Client,
    server::MAX_BODY_BYTES,
    volumes::{
        ClaimRequest, FlagsInput, MAX_SPEC_BYTES, MountOptionsInput, SpecFormat, VolumeSpecRequest,
    },
};
use berth_csi::model::{AccessMode, AttachmentMode};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::UnixStream,
};

const PLUGIN: &str = "hp";
const VOLUME: &str = "v1";
const ALLOC: &str = "alloc-1";

const CANARY: &str = "canary-Zq7Wx3";
const CANARY_INT: i64 = 90_807_060_504;
const CANARY_FLOAT: f64 = 0.908_070_605_040_3;

/// Whether `text` holds any of the canaries.
fn leaks(text: &str) -> bool {
    text.contains(CANARY) || text.contains("90807060504") || text.contains("9080706050403")
}

/// An agent with volume `v1` (secrets, mount flags) claimed by `alloc-1`.
async fn start() -> AgentProcess {
    let agent =
        AgentProcess::start_with_hostpath(PLUGIN, &["--enable-stage", "--enable-attach"]).await;
    let client = agent.client();
    let spec = format!(
        "id = \"{VOLUME}\"\ntype = \"csi\"\nplugin_id = \"{PLUGIN}\"\ncapacity_min = \"10MiB\"\n\
         capability {{\n  access_mode = \"single-node-writer\"\n  attachment_mode = \"file-system\"\n}}\n\
         mount_options {{\n  mount_flags = [\"noatime\"]\n}}\nsecrets {{\n  token = \"s3cr3t\"\n}}\n"
    );
    client
        .create_volume(&VolumeSpecRequest {
            spec,
            format: SpecFormat::Hcl,
            file: Some("v1.hcl".into()),
        })
        .await
        .expect("create the volume");
    client
        .claim_volume(
            VOLUME,
            &ClaimRequest {
                alloc_id: ALLOC.into(),
                read_only: false,
                access_mode: AccessMode::SingleNodeWriter,
                attachment_mode: AttachmentMode::FileSystem,
                mount_options: Some(MountOptionsInput {
                    fs_type: None,
                    mount_flags: Some(FlagsInput(vec!["noatime".into()])),
                }),
            },
        )
        .await
        .expect("claim the volume");
    agent
}

/// What a refused request must not change: volumes with their statuses, plugins (ids, types,
/// instances; not the health clock), jobs, and the store file.
async fn state(agent: &AgentProcess, client: &Client) -> (String, Option<Vec<u8>>) {
    let volumes = client.volumes().await.expect("volumes");
    let mut out = serde_json::to_string(&volumes).unwrap();
    for v in &volumes.volumes {
        let status = client.volume(&v.id).await.expect("volume status");
        // Usage statistics are the filesystem's, not the agent's state.
        let claims = serde_json::to_string(&status.claims).unwrap();
        let usages: Vec<(String, Vec<(String, String)>)> = status
            .usages
            .iter()
            .map(|u| {
                let allocs = u
                    .allocs
                    .iter()
                    .map(|a| (a.alloc_id.clone(), a.state.clone()))
                    .collect();
                (u.usage.clone(), allocs)
            })
            .collect();
        out.push_str(&format!("{} {claims} {usages:?}", v.id));
    }
    for p in client.plugins().await.expect("plugins").plugins {
        let instances: Vec<_> = p
            .instances
            .iter()
            .map(|i| (i.instance.clone(), i.source, i.socket.clone(), i.active))
            .collect();
        out.push_str(&format!("{} {} {instances:?}", p.id, p.plugin_type));
    }
    out.push_str(&serde_json::to_string(&client.jobs().await.expect("jobs")).unwrap());
    let store = std::fs::read(agent.namespace().in_ns(agent.data_dir.join("state.redb"))).ok();
    (out, store)
}

/// One raw answer: the whole text (status line, headers, body) and the status.
struct Answer {
    status: u16,
    text: String,
}

/// One HTTP/1.1 request, written as given (`path` already percent-encoded); reads the whole
/// answer. A write error is ignored: the agent may answer (413) before it read everything.
async fn send(socket: &Path, method: &str, path: &str, body: &[u8]) -> Answer {
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    let mut stream = UnixStream::connect(socket).await.expect("connect");
    let _ = stream.write_all(&request).await;
    let mut answer = Vec::new();
    match tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) if !answer.is_empty() && e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Ok(Err(e)) => panic!("{method} {path}: reading the answer: {e}"),
        Err(_) => panic!("{method} {path}: no answer in time"),
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{method} {path}: no status in {text:?}"));
    Answer { status, text }
}

/// Sends a request that must be refused with `status`, and checks the answer holds no canary.
async fn refused(agent: &AgentProcess, method: &str, path: &str, body: &[u8], status: u16) {
    let answer = send(&agent.socket(), method, path, body).await;
    let shown_body = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
    assert_eq!(
        answer.status, status,
        "{method} {path} {shown_body}: {}",
        answer.text
    );
    assert!(
        !leaks(&answer.text),
        "{method} {path} {shown_body}: the answer repeats a canary: {}",
        answer.text
    );
    assert!(
        answer.text.len() < 2048,
        "{method} {path}: a long answer: {}",
        answer.text
    );
}

/// The JSON kinds a field takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Str,
    Num,
    Bool,
    Null,
    Obj,
    Arr,
}

fn kind(v: &Value) -> Kind {
    match v {
        Value::String(_) => Kind::Str,
        Value::Number(_) => Kind::Num,
        Value::Bool(_) => Kind::Bool,
        Value::Null => Kind::Null,
        Value::Object(_) => Kind::Obj,
        Value::Array(_) => Kind::Arr,
    }
}

/// The canaries in every shape.
fn shapes() -> Vec<Value> {
    vec![
        json!(CANARY),
        json!(CANARY_INT),
        json!(-CANARY_INT),
        json!(CANARY_FLOAT),
        json!(true),
        json!(null),
        json!({ "k": CANARY }),
        json!([CANARY]),
        json!([CANARY_INT, CANARY_FLOAT]),
        json!([[{ "k": [CANARY, CANARY_INT] }]]),
        json!({ "k": { "k": CANARY_INT } }),
    ]
}

/// Ids the agent must refuse; those with the canary carry it past what an error repeats.
fn bad_ids() -> Vec<String> {
    let pad = "x".repeat(64);
    vec![
        format!("{pad}\n{CANARY}"),
        format!("{pad}\t{CANARY}"),
        format!("{pad}\u{1b}[31m{CANARY}"),
        format!("{pad}\u{202e}{CANARY}"),
        format!("{pad}\u{0}{CANARY}"),
        format!("{pad}/{CANARY}"),
        format!("{}{CANARY}", "x".repeat(200)),
    ]
}

/// Ids with a control character, short: each must be a 400 wherever an id goes.
fn control_ids() -> Vec<String> {
    [
        "a\nb",
        "a\tb",
        "a\rb",
        "a\u{1b}b",
        "a\u{202e}b",
        "a\u{2067}b",
        "a\u{7f}b",
        "a\u{9b}b",
    ]
    .map(String::from)
    .to_vec()
}

/// What a field of a body is: the kinds it takes, and strings it must refuse.
struct Field {
    name: &'static str,
    takes: &'static [Kind],
    bad_strings: Vec<String>,
}

fn field(name: &'static str, takes: &'static [Kind], bad_strings: Vec<String>) -> Field {
    Field {
        name,
        takes,
        bad_strings,
    }
}

struct BodyRoute {
    path: String,
    base: Value,
    fields: Vec<Field>,
}

fn body_routes() -> Vec<BodyRoute> {
    use Kind::*;
    let ids = bad_ids;
    let long = |max: usize| {
        vec![
            format!("{}{CANARY}", "x".repeat(max)),
            format!("a\n{}{CANARY}", "x".repeat(64)),
        ]
    };
    let enumerated = || vec![CANARY.to_string()];
    let spec = |text: &str| json!({"spec": text, "format": "hcl", "file": "x.hcl"});
    let spec_fields = || {
        vec![
            field(
                "spec",
                &[Str],
                vec![format!("{CANARY}{}", "s".repeat(MAX_SPEC_BYTES))],
            ),
            field("format", &[Str], enumerated()),
            field("file", &[Str, Null], long(256)),
        ]
    };
    let vol = |rest: &str| format!("/v1/volume/csi/{VOLUME}/{rest}");
    vec![
        BodyRoute {
            path: "/v1/plugins".into(),
            base: json!({"id": PLUGIN, "type": "monolith", "socket": "/nonexistent/x.sock", "instance": "i"}),
            fields: vec![
                field("id", &[Str], ids()),
                field("type", &[Str], enumerated()),
                field(
                    "socket",
                    &[Str],
                    vec![
                        format!("relative/{CANARY}"),
                        format!("/run/\n{CANARY}"),
                        format!("/{}{CANARY}", "s".repeat(200)),
                    ],
                ),
                field("instance", &[Str, Null], ids()),
            ],
        },
        BodyRoute {
            path: "/v1/volumes/register".into(),
            base: spec(""),
            fields: spec_fields(),
        },
        BodyRoute {
            path: "/v1/volumes/create".into(),
            base: spec(""),
            fields: spec_fields(),
        },
        BodyRoute {
            path: "/v1/jobs".into(),
            base: spec(""),
            fields: spec_fields(),
        },
        BodyRoute {
            path: vol("claim"),
            base: json!({
                "alloc_id": ALLOC,
                "read_only": false,
                "access_mode": "single-node-writer",
                "attachment_mode": "file-system",
                "mount_options": {"fs_type": "", "mount_flags": ["noatime"]},
            }),
            fields: vec![
                field("alloc_id", &[Str], ids()),
                field("read_only", &[Bool], vec![]),
                field("access_mode", &[Str], enumerated()),
                field("attachment_mode", &[Str], enumerated()),
                field("mount_options", &[Obj, Null], vec![]),
                field(
                    "mount_options.fs_type",
                    &[Str, Null],
                    vec![
                        format!("ext4,{CANARY}"),
                        format!("{}{CANARY}", "x".repeat(100_000)),
                    ],
                ),
                field("mount_options.mount_flags", &[Arr, Null], vec![]),
                field(
                    "mount_options.mount_flags.0",
                    &[Str],
                    vec![
                        format!("{CANARY}\u{0}"),
                        format!("{CANARY}{}", "f".repeat(5000)),
                    ],
                ),
            ],
        },
        BodyRoute {
            path: vol("release"),
            base: json!({"alloc_id": ALLOC}),
            fields: vec![field("alloc_id", &[Str], ids())],
        },
        BodyRoute {
            path: vol("detach"),
            base: json!({"node_id": "n1"}),
            fields: vec![field("node_id", &[Str, Null], ids())],
        },
        BodyRoute {
            path: vol("expand"),
            base: json!({"capacity_min": 1, "capacity_max": 2}),
            fields: vec![
                field("capacity_min", &[Num], vec![]),
                field("capacity_max", &[Num, Null], vec![]),
            ],
        },
        BodyRoute {
            path: vol("snapshot"),
            base: json!({"name": "s1", "parameters": {"k": "v"}, "secrets": {"token": "t"}}),
            fields: vec![
                field("name", &[Str], long(128)),
                field("parameters", &[Obj], vec![]),
                field(
                    "parameters.k",
                    &[Str],
                    vec![format!("{CANARY}{}", "p".repeat(5000))],
                ),
                field("secrets", &[Obj, Null], vec![]),
                field(
                    "secrets.token",
                    &[Str],
                    vec![format!("{CANARY}{}", "p".repeat(5000))],
                ),
            ],
        },
        BodyRoute {
            path: "/v1/volumes/snapshot/delete".into(),
            base: json!({"plugin_id": PLUGIN, "snapshot_id": "s1", "secrets": {"token": "t"}}),
            fields: vec![
                field("plugin_id", &[Str], ids()),
                field("snapshot_id", &[Str], long(128)),
                field("secrets", &[Obj], vec![]),
                field(
                    "secrets.token",
                    &[Str],
                    vec![format!("{CANARY}{}", "p".repeat(5000))],
                ),
            ],
        },
    ]
}

/// `doc` with the field at the dotted `path` set to `value`.
fn with_field(doc: &Value, path: &str, value: Value) -> Value {
    let mut doc = doc.clone();
    let mut here = &mut doc;
    for segment in path.split('.') {
        here = match segment.parse::<usize>() {
            Ok(i) => &mut here[i],
            Err(_) => &mut here[segment],
        };
    }
    *here = value;
    doc
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Every route with an id in its path or query, the id replaced by `e` (percent-encoded), with
/// a body the route would otherwise take.
fn routes_with_id(e: &str) -> Vec<(&'static str, String, String)> {
    let claim = json!({"alloc_id": "a9", "access_mode": "single-node-writer"}).to_string();
    let release = json!({"alloc_id": "a9"}).to_string();
    let expand = json!({"capacity_min": 1}).to_string();
    let snapshot = json!({"name": "s9"}).to_string();
    vec![
        ("GET", format!("/v1/plugin/csi/{e}"), String::new()),
        (
            "DELETE",
            format!("/v1/plugin/csi/{e}/instances/i"),
            String::new(),
        ),
        (
            "DELETE",
            format!("/v1/plugin/csi/{PLUGIN}/instances/{e}"),
            String::new(),
        ),
        ("GET", format!("/v1/volume/csi/{e}"), String::new()),
        ("DELETE", format!("/v1/volume/csi/{e}"), String::new()),
        (
            "DELETE",
            format!("/v1/volume/csi/{e}?force=true"),
            String::new(),
        ),
        ("POST", format!("/v1/volume/csi/{e}/delete"), String::new()),
        ("POST", format!("/v1/volume/csi/{e}/detach"), String::new()),
        ("POST", format!("/v1/volume/csi/{e}/expand"), expand),
        ("POST", format!("/v1/volume/csi/{e}/claim"), claim),
        ("POST", format!("/v1/volume/csi/{e}/release"), release),
        ("POST", format!("/v1/volume/csi/{e}/snapshot"), snapshot),
        ("GET", format!("/v1/job/{e}"), String::new()),
        ("DELETE", format!("/v1/job/{e}"), String::new()),
        ("GET", format!("/v1/alloc/{e}"), String::new()),
        (
            "GET",
            format!("/v1/volumes/snapshots?plugin_id={e}"),
            String::new(),
        ),
    ]
}

/// Bodies with `id` in each of their id fields. A provider's snapshot id may hold `/`: it
/// gets `id` only when `id` is too long or holds a control character.
fn bodies_with_id(id: &str) -> Vec<(String, Value)> {
    let vol = |rest: &str| format!("/v1/volume/csi/{VOLUME}/{rest}");
    let mut bodies = vec![
        (
            "/v1/plugins".into(),
            json!({"id": id, "type": "node", "socket": "/run/p.sock"}),
        ),
        (
            "/v1/plugins".into(),
            json!({"id": "p9", "type": "node", "socket": "/run/p.sock", "instance": id}),
        ),
        (
            vol("claim"),
            json!({"alloc_id": id, "access_mode": "single-node-writer"}),
        ),
        (vol("release"), json!({"alloc_id": id})),
        (vol("detach"), json!({"node_id": id})),
        (
            "/v1/volumes/snapshot/delete".into(),
            json!({"plugin_id": id, "snapshot_id": "s"}),
        ),
    ];
    if id.len() > 128 || id.chars().any(berth_sys::is_unprintable) {
        bodies.push((
            "/v1/volumes/snapshot/delete".into(),
            json!({"plugin_id": PLUGIN, "snapshot_id": id}),
        ));
    }
    bodies
}

#[tokio::test]
async fn hostile_input_is_refused_repeats_nothing_and_changes_nothing() {
    let agent = start().await;
    let client = agent.client();
    let before = state(&agent, &client).await;
    let mut sent = 0;

    // Every field of every body, in every shape it does not take, and in strings it refuses.
    for route in body_routes() {
        for f in &route.fields {
            let mut values: Vec<Value> = shapes()
                .into_iter()
                .filter(|v| !f.takes.contains(&kind(v)))
                .collect();
            values.extend(f.bad_strings.iter().map(|s| json!(s)));
            assert!(!values.is_empty(), "{} {}", route.path, f.name);
            for value in values {
                let doc = with_field(&route.base, f.name, value);
                refused(&agent, "POST", &route.path, doc.to_string().as_bytes(), 400).await;
                sent += 1;
            }
        }
        // The whole body in each shape, and secrets in their right shape in a body refused
        // for another field.
        for shape in shapes() {
            refused(
                &agent,
                "POST",
                &route.path,
                shape.to_string().as_bytes(),
                400,
            )
            .await;
        }
        let mut doc = with_field(&route.base, "bogus", json!(1));
        for f in &route.fields {
            if f.name.contains("secrets.") || f.name.contains("mount_flags.") {
                doc = with_field(&doc, f.name, json!(CANARY));
            }
        }
        refused(&agent, "POST", &route.path, doc.to_string().as_bytes(), 400).await;
        sent += shapes().len() + 1;
    }

    // Bad ids in every path, query and body.
    for id in bad_ids().into_iter().chain(control_ids()) {
        for (method, path, body) in routes_with_id(&encode(&id)) {
            refused(&agent, method, &path, body.as_bytes(), 400).await;
            sent += 1;
        }
        for (path, doc) in bodies_with_id(&id) {
            refused(&agent, "POST", &path, doc.to_string().as_bytes(), 400).await;
            sent += 1;
        }
    }

    // Queries.
    let v = format!("/v1/volume/csi/{VOLUME}");
    let queries = [
        ("DELETE", format!("{v}?force={CANARY}")),
        ("DELETE", format!("{v}?{CANARY}=true")),
        ("DELETE", format!("{v}?force=true&force=true")),
        ("DELETE", format!("{v}?force=%FF{CANARY}")),
        (
            "GET",
            format!("/v1/volumes/snapshots?plugin_id={PLUGIN}&{CANARY}=1"),
        ),
        (
            "GET",
            format!("/v1/volumes/snapshots?plugin_id=%FF{CANARY}"),
        ),
        ("GET", "/v1/volumes/snapshots".to_string()),
    ];
    for (method, path) in queries {
        refused(&agent, method, &path, b"", 400).await;
        sent += 1;
    }

    // Bodies too large, and nested too deep, on every body route.
    let big = format!("\"{CANARY}{}\"", "x".repeat(MAX_BODY_BYTES));
    let deep = format!(
        "{{\"alloc_id\": {}{CANARY_INT}{}}}",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    for route in body_routes() {
        refused(&agent, "POST", &route.path, big.as_bytes(), 413).await;
        refused(&agent, "POST", &route.path, deep.as_bytes(), 400).await;
        sent += 2;
    }
    assert!(sent > 500, "{sent} requests");

    // Nothing changed; no canary in the log.
    assert_eq!(
        state(&agent, &client).await,
        before,
        "a refused request changed something"
    );
    let log = agent.log();
    assert!(!leaks(&log), "a canary reached the agent's log:\n{log}");
    // The agent still serves.
    assert_eq!(client.volume(VOLUME).await.expect("status").claims.len(), 1);
}

#[tokio::test]
async fn ids_with_control_characters_are_400_on_every_route() {
    let agent = start().await;
    let client = agent.client();
    let before = state(&agent, &client).await;
    for id in control_ids() {
        for (method, path, body) in routes_with_id(&encode(&id)) {
            let answer = send(&agent.socket(), method, &path, body.as_bytes()).await;
            assert_eq!(answer.status, 400, "{method} {path}: {}", answer.text);
            assert!(
                answer.text.contains("must not contain control characters"),
                "{method} {path}: {}",
                answer.text
            );
        }
        for (path, doc) in bodies_with_id(&id) {
            let answer = send(&agent.socket(), "POST", &path, doc.to_string().as_bytes()).await;
            assert_eq!(answer.status, 400, "{path} {doc}: {}", answer.text);
            assert!(
                answer.text.contains("must not contain control characters"),
                "{}",
                answer.text
            );
        }
    }
    // A release is refused for exactly the alloc ids a claim refuses.
    for id in control_ids().into_iter().chain(bad_ids()) {
        let claim = json!({"alloc_id": id, "access_mode": "single-node-writer"}).to_string();
        let release = json!({"alloc_id": id}).to_string();
        let c = send(
            &agent.socket(),
            "POST",
            &format!("/v1/volume/csi/{VOLUME}/claim"),
            claim.as_bytes(),
        )
        .await;
        let r = send(
            &agent.socket(),
            "POST",
            &format!("/v1/volume/csi/{VOLUME}/release"),
            release.as_bytes(),
        )
        .await;
        assert_eq!(
            (c.status, r.status),
            (400, 400),
            "{id:?}: {} / {}",
            c.text,
            r.text
        );
    }
    assert_eq!(state(&agent, &client).await, before);
}
