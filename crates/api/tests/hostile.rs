//! Hostile input against the router, served on a real socket over the fake agent: values in
//! the wrong shape in every field of every body, bad ids on every route, unbounded fields, huge
//! and deeply nested bodies. A refused request is answered with a JSON error (400, 408 or 413)
//! and never reaches the agent; no answer repeats a value of the body.

mod fake;

use std::time::Duration;

use berth_api::{
    ErrorBody,
    server::{BODY_READ_TIMEOUT, MAX_BODY_BYTES},
    volumes::MAX_SPEC_BYTES,
};
use fake::{RawAnswer, Served, raw, raw_bytes};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;

const CANARY: &str = "canary-7Hq2xZ";
const CANARY_INT: u64 = 73_914_628_051;
const CANARY_FLOAT: f64 = 0.731_946_285_1;

/// Whether `text` holds any of the canaries.
fn leaks(text: &str) -> bool {
    text.contains(CANARY) || text.contains("73914628051") || text.contains("7319462851")
}

/// The canaries in every shape a field can be sent in.
fn shapes() -> Vec<Value> {
    vec![
        json!(CANARY),
        json!(CANARY_INT),
        json!(-73_914_628_051_i64),
        json!(CANARY_FLOAT),
        json!(true),
        json!(null),
        json!({ "k": CANARY }),
        json!([CANARY]),
        json!([CANARY_INT]),
        json!([[{ "k": [CANARY, CANARY_INT] }]]),
        json!({ "k": { "k": CANARY_INT } }),
    ]
}

/// A route with a JSON body: a valid body, and the fields to break one at a time (dotted
/// paths; a number indexes an array).
struct BodyRoute {
    path: &'static str,
    base: Value,
    fields: &'static [&'static str],
}

fn body_routes() -> Vec<BodyRoute> {
    let spec = |spec: &str, file: &str| json!({"spec": spec, "format": "hcl", "file": file});
    vec![
        BodyRoute {
            path: "/v1/plugins",
            base: json!({"id": "p", "type": "node", "socket": "/run/p.sock", "instance": "i1"}),
            fields: &["id", "type", "socket", "instance"],
        },
        BodyRoute {
            path: "/v1/volumes/register",
            base: spec("id = \"v\"", "v.hcl"),
            fields: &["spec", "format", "file"],
        },
        BodyRoute {
            path: "/v1/volumes/create",
            base: spec("id = \"v\"", "v.hcl"),
            fields: &["spec", "format", "file"],
        },
        BodyRoute {
            path: "/v1/volume/csi/v1/claim",
            base: json!({
                "alloc_id": "a1",
                "read_only": false,
                "access_mode": "single-node-writer",
                "attachment_mode": "file-system",
                "mount_options": {"fs_type": "ext4", "mount_flags": ["ro"]},
            }),
            fields: &[
                "alloc_id",
                "read_only",
                "access_mode",
                "attachment_mode",
                "mount_options",
                "mount_options.fs_type",
                "mount_options.mount_flags",
                "mount_options.mount_flags.0",
            ],
        },
        BodyRoute {
            path: "/v1/volume/csi/v1/release",
            base: json!({"alloc_id": "a1"}),
            fields: &["alloc_id"],
        },
        BodyRoute {
            path: "/v1/volume/csi/v1/detach",
            base: json!({"node_id": "n1"}),
            fields: &["node_id"],
        },
        BodyRoute {
            path: "/v1/volume/csi/v1/expand",
            base: json!({"capacity_min": 1, "capacity_max": 2}),
            fields: &["capacity_min", "capacity_max"],
        },
        BodyRoute {
            path: "/v1/volume/csi/v1/snapshot",
            base: json!({"name": "s1", "parameters": {"k": "v"}, "secrets": {"token": "t"}}),
            fields: &[
                "name",
                "parameters",
                "parameters.k",
                "secrets",
                "secrets.token",
            ],
        },
        BodyRoute {
            path: "/v1/volumes/snapshot/delete",
            base: json!({"plugin_id": "p", "snapshot_id": "snap/1", "secrets": {"token": "t"}}),
            fields: &["plugin_id", "snapshot_id", "secrets", "secrets.token"],
        },
        BodyRoute {
            path: "/v1/jobs",
            base: spec("job \"j\" {}", "j.hcl"),
            fields: &["spec", "format", "file"],
        },
    ]
}

/// `doc` with the field at `path` (dotted) set to `value`.
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

fn error_text(answer: &RawAnswer) -> String {
    assert!(
        answer.head.contains("content-type: application/json"),
        "{answer:?}"
    );
    serde_json::from_str::<ErrorBody>(&answer.body)
        .unwrap_or_else(|e| panic!("not an error body ({e}): {answer:?}"))
        .error
}

/// Sends `body`; returns the answer and whether the request reached the agent.
async fn post(served: &Served, path: &str, body: &[u8]) -> (RawAnswer, bool) {
    let before = served.agent.calls();
    let answer = raw(&served.socket, "POST", path, body).await;
    (answer, served.agent.calls() != before)
}

/// Asserts a refusal with `status` that did not reach the agent, repeats no canary, and whose
/// error says `says`.
fn refused(answer: &RawAnswer, reached: bool, status: u16, says: &str) {
    assert_eq!(answer.status, status, "{answer:?}");
    assert!(!reached, "a refused request reached the agent: {answer:?}");
    assert!(!leaks(&answer.all()), "{answer:?}");
    let error = error_text(answer);
    assert!(error.contains(says), "{error:?} does not say {says:?}");
}

#[tokio::test]
async fn every_wrong_shape_of_every_field_is_refused_without_its_value() {
    let served = Served::start(16);
    for route in body_routes() {
        // The base body is valid: it reaches the agent.
        let (answer, reached) = post(&served, route.path, route.base.to_string().as_bytes()).await;
        assert!(reached, "{}: {answer:?}", route.path);
        assert!(!leaks(&answer.all()));

        for field in route.fields {
            let mut refusals = 0;
            for shape in shapes() {
                let doc = with_field(&route.base, field, shape);
                let (answer, reached) = post(&served, route.path, doc.to_string().as_bytes()).await;
                if answer.status == 400 {
                    refusals += 1;
                    // Named as a field of the JSON (`field `x``) or of the request (`x: `).
                    let top = field.split('.').next().unwrap();
                    refused(&answer, reached, 400, top);
                } else {
                    // A shape this field takes (a string for a string, null for an option):
                    // it reached the fake, which answers (404, or 200 for a registration).
                    assert!(
                        matches!(answer.status, 200 | 404),
                        "{} {doc}: {answer:?}",
                        route.path
                    );
                    assert!(reached, "{} {doc}", route.path);
                }
            }
            assert!(
                refusals >= 5,
                "{} `{field}`: only {refusals} shapes refused",
                route.path
            );
        }
        // The whole body in each shape.
        for shape in shapes() {
            let (answer, reached) = post(&served, route.path, shape.to_string().as_bytes()).await;
            refused(&answer, reached, 400, "invalid");
        }
        // Secrets in their right shape, in a body refused for another reason.
        let doc = with_field(&route.base, "bogus", json!(CANARY));
        let doc = match route.path {
            p if p.ends_with("/claim") => {
                with_field(&doc, "mount_options.mount_flags", json!([CANARY, CANARY]))
            }
            p if p.contains("snapshot") => with_field(
                &doc,
                "secrets",
                json!({"token": CANARY, "k": CANARY_INT.to_string()}),
            ),
            _ => doc,
        };
        let (answer, reached) = post(&served, route.path, doc.to_string().as_bytes()).await;
        refused(&answer, reached, 400, "field `bogus`: unknown field");
    }
    served.stop().await;
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

/// Ids no route may accept; the last ones carry the canary past what an error repeats.
fn bad_ids() -> Vec<String> {
    let mut ids: Vec<String> = [
        "a\nb",
        "a\tb",
        "a\rb",
        "a\u{1b}[31mred",
        "a\u{202e}b",
        "a\u{2066}b",
        "a\u{200f}b",
        "a\u{0}b",
        "a\u{7f}b",
        "a\u{85}b",
    ]
    .map(String::from)
    .to_vec();
    ids.push(format!("{}\n{CANARY}", "x".repeat(64)));
    ids.push(format!("{}{CANARY}", "x".repeat(200)));
    ids
}

/// Ids that name stored things but are not path segments.
fn not_segments() -> Vec<String> {
    vec![
        "a/b".into(),
        "..".into(),
        ".".into(),
        String::new(),
        "x".repeat(129),
    ]
}

#[tokio::test]
async fn bad_ids_are_refused_on_every_route_before_the_agent_sees_them() {
    let served = Served::start(16);
    let claim = json!({"alloc_id": "a1", "access_mode": "single-node-writer"}).to_string();
    let release = json!({"alloc_id": "a1"}).to_string();
    let expand = json!({"capacity_min": 1}).to_string();
    let snapshot = json!({"name": "s"}).to_string();
    let mut checked = 0;
    for id in bad_ids().into_iter().chain(not_segments()) {
        if id.is_empty() {
            continue; // An empty path segment is another route (or none): see below.
        }
        let e = encode(&id);
        let in_paths: Vec<(&str, String, &str)> = vec![
            ("GET", format!("/v1/plugin/csi/{e}"), ""),
            ("DELETE", format!("/v1/plugin/csi/{e}/instances/i1"), ""),
            ("DELETE", format!("/v1/plugin/csi/p/instances/{e}"), ""),
            ("GET", format!("/v1/volume/csi/{e}"), ""),
            ("DELETE", format!("/v1/volume/csi/{e}"), ""),
            ("DELETE", format!("/v1/volume/csi/{e}?force=true"), ""),
            ("POST", format!("/v1/volume/csi/{e}/delete"), ""),
            ("POST", format!("/v1/volume/csi/{e}/detach"), ""),
            ("POST", format!("/v1/volume/csi/{e}/expand"), &expand),
            ("POST", format!("/v1/volume/csi/{e}/claim"), &claim),
            ("POST", format!("/v1/volume/csi/{e}/release"), &release),
            ("POST", format!("/v1/volume/csi/{e}/snapshot"), &snapshot),
            ("GET", format!("/v1/job/{e}"), ""),
            ("DELETE", format!("/v1/job/{e}"), ""),
            ("GET", format!("/v1/alloc/{e}"), ""),
            ("GET", format!("/v1/volumes/snapshots?plugin_id={e}"), ""),
        ];
        for (method, path, body) in in_paths {
            let before = served.agent.calls();
            let answer = raw(&served.socket, method, &path, body.as_bytes()).await;
            refused(&answer, served.agent.calls() != before, 400, "invalid");
            let error = error_text(&answer);
            assert!(error.len() < 300, "{method} {path}: {error}");
            assert!(
                !error.contains('\n') && !error.contains('\u{202e}'),
                "{error:?}"
            );
            checked += 1;
        }
        let in_bodies: Vec<(&str, Value)> = vec![
            (
                "/v1/plugins",
                json!({"id": id, "type": "node", "socket": "/run/p.sock"}),
            ),
            (
                "/v1/plugins",
                json!({"id": "p", "type": "node", "socket": "/run/p.sock", "instance": id}),
            ),
            (
                "/v1/volume/csi/v1/claim",
                json!({"alloc_id": id, "access_mode": "single-node-writer"}),
            ),
            ("/v1/volume/csi/v1/release", json!({"alloc_id": id})),
            ("/v1/volume/csi/v1/detach", json!({"node_id": id})),
            (
                "/v1/volumes/snapshot/delete",
                json!({"plugin_id": id, "snapshot_id": "s"}),
            ),
        ];
        for (path, doc) in in_bodies {
            let (answer, reached) = post(&served, path, doc.to_string().as_bytes()).await;
            refused(&answer, reached, 400, "invalid");
            checked += 1;
        }
    }
    // A provider's snapshot id may hold `/` and dots, but not control characters.
    for id in bad_ids() {
        let doc = json!({"plugin_id": "p", "snapshot_id": id});
        let (answer, reached) = post(
            &served,
            "/v1/volumes/snapshot/delete",
            doc.to_string().as_bytes(),
        )
        .await;
        refused(&answer, reached, 400, "snapshot_id: ");
    }
    for id in ["snap/1", "..", "projects/p/snapshots/s"] {
        let doc = json!({"plugin_id": "p", "snapshot_id": id});
        let (answer, reached) = post(
            &served,
            "/v1/volumes/snapshot/delete",
            doc.to_string().as_bytes(),
        )
        .await;
        assert!(reached, "{id}: {answer:?}");
    }
    // An empty id: no such route, or a 400 where the id is a query or a body field.
    let answer = raw(&served.socket, "GET", "/v1/plugin/csi/", b"").await;
    assert_eq!(answer.status, 404, "{answer:?}");
    let answer = raw(
        &served.socket,
        "GET",
        "/v1/volumes/snapshots?plugin_id=",
        b"",
    )
    .await;
    assert_eq!(answer.status, 400, "{answer:?}");
    assert!(checked > 200);
    assert!(
        served
            .agent
            .view_calls
            .lock()
            .unwrap()
            .iter()
            .all(|c| !c.contains('\n'))
    );
    served.stop().await;
}

#[tokio::test]
async fn a_long_plugin_id_is_refused_and_not_echoed() {
    let served = Served::start(16);
    let id = "p".repeat(10 * 1024);
    let answer = raw(&served.socket, "GET", &format!("/v1/plugin/csi/{id}"), b"").await;
    assert_eq!(answer.status, 400, "{answer:?}");
    let error = error_text(&answer);
    assert_eq!(
        error,
        format!(
            "invalid plugin id {:?}: is 10240 bytes long, more than 128",
            "p".repeat(64)
        )
    );
    assert_eq!(served.agent.calls(), 0);
    // Ids in unknown routes and methods are cut too.
    let answer = raw(&served.socket, "GET", &format!("/v1/nope/{id}"), b"").await;
    assert_eq!(answer.status, 404);
    assert!(error_text(&answer).chars().count() < 200, "{answer:?}");
    let answer = raw(&served.socket, "PUT", &format!("/v1/plugin/csi/{id}"), b"").await;
    assert_eq!(answer.status, 405);
    assert!(error_text(&answer).chars().count() < 200, "{answer:?}");
    served.stop().await;
}

#[tokio::test]
async fn release_refuses_exactly_the_alloc_ids_claim_refuses() {
    let served = Served::start(16);
    let mut ids = bad_ids();
    ids.extend(not_segments());
    ids.extend([
        "a1".to_string(),
        "...".into(),
        "ünïcode".into(),
        "x".repeat(128),
    ]);
    for id in ids {
        let claim = json!({"alloc_id": id, "access_mode": "single-node-writer"});
        let release = json!({"alloc_id": id});
        let (c, claim_reached) = post(
            &served,
            "/v1/volume/csi/v1/claim",
            claim.to_string().as_bytes(),
        )
        .await;
        let (r, release_reached) = post(
            &served,
            "/v1/volume/csi/v1/release",
            release.to_string().as_bytes(),
        )
        .await;
        assert_eq!(
            (c.status, claim_reached),
            (r.status, release_reached),
            "{id:?}"
        );
        if c.status == 400 {
            assert_eq!(error_text(&c), error_text(&r), "{id:?}");
        }
    }
    served.stop().await;
}

#[tokio::test]
async fn every_string_field_is_bounded() {
    let served = Served::start(16);
    let claim = |options: Value| json!({"alloc_id": "a1", "access_mode": "single-node-writer", "mount_options": options});
    let spec = |file: &str| json!({"spec": "x", "file": file});
    let long_spec = "s".repeat(MAX_SPEC_BYTES + 1);
    let secret = CANARY.repeat(400);
    let cases: Vec<(&str, Value, String)> = vec![
        (
            "/v1/volume/csi/v1/claim",
            claim(json!({"fs_type": "x".repeat(100_000)})),
            "mount_options.fs_type: not a filesystem type (100000 bytes".into(),
        ),
        (
            "/v1/volume/csi/v1/claim",
            claim(json!({"fs_type": "ext4 -o x"})),
            "mount_options.fs_type: not a filesystem type".into(),
        ),
        (
            "/v1/volume/csi/v1/claim",
            claim(json!({"mount_flags": [secret]})),
            "mount_options.mount_flags: mount flags take 5200 bytes, more than 4096".into(),
        ),
        (
            "/v1/volume/csi/v1/claim",
            claim(json!({"mount_flags": [format!("{CANARY}\u{0}")]})),
            "mount_options.mount_flags: ".into(),
        ),
        (
            "/v1/volumes/create",
            spec("a\nb.hcl"),
            "file: must not contain control characters".into(),
        ),
        (
            "/v1/volumes/register",
            spec("a\u{202e}b"),
            "file: must not contain control".into(),
        ),
        (
            "/v1/volumes/create",
            spec(&"f".repeat(257)),
            "file: is 257 bytes long, more than 256".into(),
        ),
        (
            "/v1/volumes/create",
            spec(""),
            "file: must not be empty".into(),
        ),
        (
            "/v1/jobs",
            spec("\u{1b}[2J"),
            "file: must not contain control characters".into(),
        ),
        (
            "/v1/volumes/create",
            json!({"spec": long_spec}),
            format!(
                "spec: is {} bytes long, more than {MAX_SPEC_BYTES}",
                MAX_SPEC_BYTES + 1
            ),
        ),
        (
            "/v1/jobs",
            json!({"spec": long_spec}),
            format!("spec: is {} bytes long", MAX_SPEC_BYTES + 1),
        ),
        (
            "/v1/volume/csi/v1/snapshot",
            json!({"name": "n".repeat(129)}),
            "name: is 129 bytes long, more than 128".into(),
        ),
        (
            "/v1/volume/csi/v1/snapshot",
            json!({"name": ""}),
            "name: must not be empty".into(),
        ),
        (
            "/v1/volume/csi/v1/snapshot",
            json!({"name": "s", "parameters": {"k": "v".repeat(5000)}}),
            "parameters: takes 5001 bytes, more than 4096".into(),
        ),
        (
            "/v1/volume/csi/v1/snapshot",
            json!({"name": "s", "secrets": {"token": secret}}),
            "secrets: takes 5205 bytes, more than 4096".into(),
        ),
        (
            "/v1/volume/csi/v1/snapshot",
            json!({"name": "s", "secrets": {"a\nb": CANARY}}),
            r#"secrets: key "a\nb" must not contain control characters"#.into(),
        ),
        (
            "/v1/volumes/snapshot/delete",
            json!({"plugin_id": "p", "snapshot_id": "s".repeat(129)}),
            "snapshot_id: is 129 bytes long, more than 128".into(),
        ),
        (
            "/v1/volumes/snapshot/delete",
            json!({"plugin_id": "p", "snapshot_id": "s", "secrets": {"t": secret}}),
            "secrets: takes 5201 bytes".into(),
        ),
        (
            "/v1/plugins",
            json!({"id": "p", "type": "node", "socket": "/run/a\nb.sock"}),
            "socket: must not contain control characters".into(),
        ),
        (
            "/v1/volume/csi/v1/expand",
            json!({"capacity_min": 10, "capacity_max": 9}),
            "capacity_max: below capacity_min".into(),
        ),
        (
            "/v1/volume/csi/v1/expand",
            json!({"capacity_min": u64::MAX}),
            "capacity_min: more than 9223372036854775807 bytes".into(),
        ),
    ];
    for (path, doc, says) in cases {
        let (answer, reached) = post(&served, path, doc.to_string().as_bytes()).await;
        refused(&answer, reached, 400, &says);
    }
    // At the bounds, requests go through.
    let at_bounds: Vec<(&str, Value)> = vec![
        (
            "/v1/volumes/create",
            json!({"spec": "s".repeat(MAX_SPEC_BYTES), "file": "f".repeat(256)}),
        ),
        (
            "/v1/volume/csi/v1/snapshot",
            json!({"name": "n".repeat(128)}),
        ),
        (
            "/v1/volume/csi/v1/claim",
            claim(json!({"fs_type": "fuse.sshfs", "mount_flags": ["a".repeat(4096)]})),
        ),
    ];
    for (path, doc) in at_bounds {
        let (answer, reached) = post(&served, path, doc.to_string().as_bytes()).await;
        assert!(reached, "{path}: {answer:?}");
    }
    served.stop().await;
}

/// Every route that reads a body.
const BODY_PATHS: [&str; 10] = [
    "/v1/plugins",
    "/v1/volumes/register",
    "/v1/volumes/create",
    "/v1/volume/csi/v1/claim",
    "/v1/volume/csi/v1/release",
    "/v1/volume/csi/v1/detach",
    "/v1/volume/csi/v1/expand",
    "/v1/volume/csi/v1/snapshot",
    "/v1/volumes/snapshot/delete",
    "/v1/jobs",
];

fn too_large() -> String {
    format!("the request body is larger than {MAX_BODY_BYTES} bytes")
}

#[tokio::test]
async fn bodies_over_the_limit_are_413_on_every_route() {
    let served = Served::start(16);
    // A JSON string just over the limit, with the canary in it.
    let big = format!("\"{CANARY}{}\"", "x".repeat(MAX_BODY_BYTES));
    for path in BODY_PATHS {
        let (answer, reached) = post(&served, path, big.as_bytes()).await;
        refused(&answer, reached, 413, &too_large());

        // Announced but never sent: refused from the head alone.
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY_BYTES + 1
        );
        let answer = raw_bytes(&served.socket, head.as_bytes()).await;
        refused(&answer, false, 413, &too_large());

        // Chunked, with no length announced: refused once it passes the limit.
        let mut chunked =
            format!("POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
                .into_bytes();
        let chunk = "y".repeat(64 * 1024);
        for _ in 0..(MAX_BODY_BYTES / chunk.len() + 2) {
            chunked.extend_from_slice(format!("{:x}\r\n{chunk}\r\n", chunk.len()).as_bytes());
        }
        chunked.extend_from_slice(b"0\r\n\r\n");
        let answer = raw_bytes(&served.socket, &chunked).await;
        refused(&answer, false, 413, &too_large());
    }
    assert_eq!(served.agent.calls(), 0);
    // A body at the limit is read (and refused for what it is).
    let at_limit = format!("\"{}\"", "x".repeat(MAX_BODY_BYTES - 2));
    let (answer, reached) = post(&served, "/v1/jobs", at_limit.as_bytes()).await;
    refused(
        &answer,
        reached,
        400,
        "invalid job run request: expected struct JobRunRequest",
    );
    served.stop().await;
}

#[tokio::test]
async fn deep_nesting_is_a_clean_400_on_every_route() {
    let served = Served::start(16);
    let arrays = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let objects = format!("{}1{}", r#"{"k":"#.repeat(50_000), "}".repeat(50_000));
    for path in BODY_PATHS {
        for body in [&arrays, &objects] {
            let (answer, reached) = post(&served, path, body.as_bytes()).await;
            refused(&answer, reached, 400, "recursion limit exceeded");
        }
        let field = format!(
            r#"{{"alloc_id": {}{CANARY_INT}{}}}"#,
            "[".repeat(5000),
            "]".repeat(5000)
        );
        let (answer, reached) = post(&served, path, field.as_bytes()).await;
        refused(&answer, reached, 400, "recursion limit exceeded");
    }
    // The server is fine afterwards.
    let answer = raw(&served.socket, "GET", "/v1/node", b"").await;
    assert_eq!(answer.status, 200);
    served.stop().await;
}

#[tokio::test]
async fn a_body_that_does_not_arrive_is_answered_408() {
    let served = Served::start(16);
    let mut stream = tokio::net::UnixStream::connect(&served.socket)
        .await
        .expect("connect");
    stream
        .write_all(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"sp")
        .await
        .expect("write");
    let answer = tokio::time::timeout(
        BODY_READ_TIMEOUT + Duration::from_secs(20),
        fake::read_answer(&mut stream),
    )
    .await
    .expect("an answer once the body read timeout passed");
    refused(
        &answer,
        false,
        408,
        "the request body did not arrive within 10 s",
    );
    assert_eq!(served.agent.calls(), 0);
    served.stop().await;
}

#[tokio::test]
async fn queries_are_checked_and_never_echoed() {
    let served = Served::start(16);
    let cases = [
        (
            "DELETE",
            format!("/v1/volume/csi/v1?force={CANARY}"),
            "query `force`: expected true or false",
        ),
        (
            "DELETE",
            format!("/v1/volume/csi/v1?{CANARY}=1"),
            "unknown query parameter; this route takes `force`",
        ),
        (
            "DELETE",
            "/v1/volume/csi/v1?force=true&force=false".to_string(),
            "query parameter `force` is given more than once",
        ),
        (
            "GET",
            format!("/v1/volumes/snapshots?plugin_id=p&{CANARY}=1"),
            "unknown query parameter",
        ),
        (
            "GET",
            "/v1/volumes/snapshots?plugin_id=p&plugin_id=q".to_string(),
            "given more than once",
        ),
        (
            "GET",
            "/v1/volumes/snapshots".to_string(),
            "query `plugin_id` is required",
        ),
        (
            "GET",
            "/v1/volumes/snapshots?plugin_id=%FF".to_string(),
            "cannot be decoded as UTF-8",
        ),
        (
            "GET",
            "/v1/volumes/snapshots?plugin_id=a%0Ab".to_string(),
            "invalid plugin id \"a\\nb\"",
        ),
        (
            "GET",
            format!(
                "/v1/volumes/snapshots?plugin_id=a%E2%80%AE{}{CANARY}",
                "x".repeat(64)
            ),
            "must not contain control",
        ),
    ];
    for (method, path, says) in cases {
        let before = served.agent.calls();
        let answer = raw(&served.socket, method, &path, b"").await;
        refused(&answer, served.agent.calls() != before, 400, says);
    }
    assert_eq!(served.agent.calls(), 0);
    // Valid queries reach the agent.
    for (method, path) in [
        ("DELETE", "/v1/volume/csi/v1?force=true"),
        ("DELETE", "/v1/volume/csi/v1"),
        ("GET", "/v1/volumes/snapshots?plugin_id=p"),
    ] {
        let answer = raw(&served.socket, method, path, b"").await;
        assert_eq!(answer.status, 404, "{path}: {answer:?}");
    }
    assert_eq!(served.agent.calls(), 3);
    served.stop().await;
}

#[tokio::test]
async fn a_path_id_that_is_not_utf8_is_refused_without_echo() {
    let served = Served::start(16);
    for path in [
        "/v1/volume/csi/%FF%FE",
        "/v1/job/a%C3",
        "/v1/plugin/csi/p/instances/%80",
    ] {
        let answer = raw(&served.socket, "GET", path, b"").await;
        // DELETE is the only method on the instance route.
        let answer = if answer.status == 405 {
            raw(&served.socket, "DELETE", path, b"").await
        } else {
            answer
        };
        assert_eq!(answer.status, 400, "{path}: {answer:?}");
        assert!(error_text(&answer).contains("not UTF-8"), "{answer:?}");
    }
    assert_eq!(served.agent.calls(), 0);
    served.stop().await;
}
