//! ACLs on a real `berth agent`: every route refuses a request without a valid token (401 or
//! 403) and the refusal changes nothing; each policy grants what it names and nothing more;
//! bootstrap works once; secrets never show in logs or lists; a listener beyond loopback needs
//! TLS and ACLs, and then serves HTTPS to the CLI; `api.socket_group` opens the socket to that
//! group's members only.

mod agent_support;

use std::{os::unix::fs::MetadataExt as _, path::Path, process::Stdio, time::Duration};

use agent_support::{AgentProcess, hostpath_config, jobs};
use berth_api::{
    Client, ClientError, PluginType, RegisterRequest,
    acl::{NewToken, Policy, SecretId},
    jobs::ClientStatus,
    volumes::{SpecFormat, VolumeSpecRequest},
};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::UnixStream,
};

const ACL_ON: &str = "acl {\n  enabled = true\n}\n";
const PLUGIN: &str = "hp";
const VOLUME: &str = "v1";
const ALLOC: &str = "alloc-1";
/// A well-formed secret id that no token has.
const WRONG: &str = "0b8f3c1e-8d44-4d3c-9c9e-3c2b7c0a5f11";
/// A malformed token, which must not be repeated anywhere.
const CANARY: &str = "canary-Zq7Wx3-token";

/// An agent with ACLs on running berth-hostpath in its own mount namespace, bootstrapped: its
/// client sends the management token. Volume `v1` exists, claimed by `alloc-1`.
async fn start() -> (AgentProcess, NewToken) {
    let config = format!(
        "{ACL_ON}{}",
        hostpath_config(PLUGIN, &["--enable-stage", "--enable-attach"])
    );
    let mut agent = AgentProcess::start_in_namespace(&config).await;
    let boot = agent.client().acl_bootstrap().await.expect("bootstrap");
    assert_eq!(boot.token.policies, vec![Policy::Management]);
    agent.set_token(Some(boot.secret_id.clone()));
    agent
        .wait_plugin(PLUGIN, Duration::from_secs(20), |p| p.health.healthy)
        .await;
    jobs::create_volume(&agent.client(), PLUGIN, VOLUME).await;
    agent
        .client()
        .claim_volume(
            VOLUME,
            &serde_json::from_value(json!({
                "alloc_id": ALLOC,
                "access_mode": "single-node-writer",
            }))
            .unwrap(),
        )
        .await
        .expect("claim v1");
    (agent, boot)
}

fn spec_request(id: &str) -> String {
    let spec = format!(
        "id = \"{id}\"\ntype = \"csi\"\nplugin_id = \"{PLUGIN}\"\ncapacity_min = \"10MiB\"\n\
         capability {{\n  access_mode = \"single-node-writer\"\n  attachment_mode = \"file-system\"\n}}\n"
    );
    serde_json::to_string(&VolumeSpecRequest {
        spec,
        format: SpecFormat::Hcl,
        file: None,
    })
    .unwrap()
}

/// A batch job with one raw_exec task that exits 0.
fn batch_job(id: &str) -> String {
    format!(
        "job \"{id}\" {{\n  type = \"batch\"\n  group \"g\" {{\n    task \"t\" {{\n      \
         driver = \"raw_exec\"\n      config {{\n        command = \"/bin/true\"\n      }}\n    \
         }}\n  }}\n}}\n"
    )
}

fn job_request(id: &str) -> String {
    json!({"spec": batch_job(id), "format": "hcl"}).to_string()
}

/// Every route of the router (routes.rs, volume_routes.rs, job_routes.rs, acl routes), with
/// ids of things that exist and bodies the route would accept: admitted, each would answer or
/// change something. The fallbacks (an unknown path, a wrong method) too. `GET /v1/events`
/// would stream: refused, it answers at once.
fn every_route(node: &str, instance: &str, accessor: &str) -> Vec<(&'static str, String, String)> {
    let none = String::new;
    vec![
        ("GET", "/v1/plugins".into(), none()),
        (
            "POST",
            "/v1/plugins".into(),
            json!({"id": "p2", "type": "node", "socket": "/tmp/p2-acl.sock"}).to_string(),
        ),
        ("GET", format!("/v1/plugin/csi/{PLUGIN}"), none()),
        (
            "DELETE",
            format!("/v1/plugin/csi/{PLUGIN}/instances/{instance}"),
            none(),
        ),
        ("GET", "/v1/node".into(), none()),
        ("GET", "/v1/nodes".into(), none()),
        ("GET", format!("/v1/nodes/{node}"), none()),
        (
            "POST",
            format!("/v1/nodes/{node}/drain"),
            json!({"enable": true}).to_string(),
        ),
        ("GET", "/v1/events".into(), none()),
        ("GET", "/v1/metrics".into(), none()),
        ("GET", "/v1/volumes".into(), none()),
        ("POST", "/v1/volumes/register".into(), spec_request("v3")),
        ("POST", "/v1/volumes/create".into(), spec_request("v2")),
        (
            "GET",
            format!("/v1/volumes/snapshots?plugin_id={PLUGIN}"),
            none(),
        ),
        (
            "POST",
            "/v1/volumes/snapshot/delete".into(),
            json!({"plugin_id": PLUGIN, "snapshot_id": "s1"}).to_string(),
        ),
        ("GET", format!("/v1/volume/csi/{VOLUME}"), none()),
        ("DELETE", format!("/v1/volume/csi/{VOLUME}?force=true"), none()),
        ("POST", format!("/v1/volume/csi/{VOLUME}/delete"), none()),
        ("POST", format!("/v1/volume/csi/{VOLUME}/detach"), none()),
        (
            "POST",
            format!("/v1/volume/csi/{VOLUME}/expand"),
            json!({"capacity_min": 20 << 20}).to_string(),
        ),
        (
            "POST",
            format!("/v1/volume/csi/{VOLUME}/claim"),
            json!({"alloc_id": "alloc-2", "access_mode": "single-node-reader-only", "read_only": true})
                .to_string(),
        ),
        (
            "POST",
            format!("/v1/volume/csi/{VOLUME}/release"),
            json!({"alloc_id": ALLOC}).to_string(),
        ),
        (
            "POST",
            format!("/v1/volume/csi/{VOLUME}/snapshot"),
            json!({"name": "snap"}).to_string(),
        ),
        ("GET", "/v1/jobs".into(), none()),
        ("POST", "/v1/jobs".into(), job_request("j1")),
        ("GET", "/v1/job/j1".into(), none()),
        ("DELETE", "/v1/job/j1".into(), none()),
        ("GET", format!("/v1/alloc/{ALLOC}"), none()),
        ("GET", format!("/v1/alloc/{ALLOC}/stats"), none()),
        ("POST", "/v1/jobs/plan".into(), job_request("j1")),
        ("DELETE", "/v1/job/j1?purge=true".into(), none()),
        ("GET", "/v1/job/j1/spec".into(), none()),
        ("POST", format!("/v1/alloc/{ALLOC}/stop"), none()),
        ("POST", format!("/v1/alloc/{ALLOC}/restart"), "{}".into()),
        (
            "POST",
            format!("/v1/alloc/{ALLOC}/signal"),
            r#"{"signal":"SIGKILL"}"#.into(),
        ),
        ("GET", "/v1/event/stream?index=0".into(), none()),
        (
            "GET",
            format!("/v1/client/fs/logs/{ALLOC}?task=t&type=stdout"),
            none(),
        ),
        (
            "POST",
            format!("/v1/client/allocation/{ALLOC}/exec?task=t&command=%5B%22ls%22%5D"),
            none(),
        ),
        ("GET", "/v1/acl/tokens".into(), none()),
        (
            "POST",
            "/v1/acl/tokens".into(),
            json!({"name": "n", "policies": ["management"]}).to_string(),
        ),
        ("DELETE", format!("/v1/acl/token/{accessor}"), none()),
        ("GET", "/v1/acl/token/self".into(), none()),
        ("GET", "/v1/no-such-route".into(), none()),
        ("POST", "/v1/no-such-route".into(), "{}".into()),
        ("PUT", "/v1/plugins".into(), "{}".into()),
        // `/` (a redirect to the UI) and `/ui/…` (static files) are public; a write to `/`
        // is not.
        ("POST", "/".into(), "{}".into()),
    ]
}

/// One raw answer: status and the whole text (status line, headers, body).
#[derive(Debug)]
struct Answer {
    status: u16,
    text: String,
}

/// One HTTP/1.1 request on the socket with `headers` (already-encoded path); the whole answer.
async fn send(
    socket: &Path,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    let mut stream = UnixStream::connect(socket).await.expect("connect");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer))
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no answer in time"))
        .expect("read the answer");
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{method} {path}: no status in {text:?}"));
    Answer { status, text }
}

/// What no refused request may change: plugins and their instances, volumes with their
/// claims, jobs, tokens, and the store file.
async fn state(agent: &AgentProcess) -> (String, Vec<u8>) {
    let client = agent.client();
    let mut out = String::new();
    for p in client.plugins().await.expect("plugins").plugins {
        let instances: Vec<_> = p.instances.iter().map(|i| i.instance.clone()).collect();
        out.push_str(&format!("{} {instances:?}\n", p.id));
    }
    for v in client.volumes().await.expect("volumes").volumes {
        let status = client.volume(&v.id).await.expect("volume");
        out.push_str(&format!(
            "{} {} {}\n",
            v.id,
            serde_json::to_string(&status.claims).unwrap(),
            status.capacity_bytes
        ));
    }
    out.push_str(&serde_json::to_string(&client.jobs().await.expect("jobs")).unwrap());
    out.push_str(&serde_json::to_string(&client.acl_tokens().await.expect("tokens")).unwrap());
    let node = client.node().await.expect("node");
    out.push_str(&format!(
        "\ndrain {:?}",
        client.fleet_node(&node.id).await.map(|n| n.drain)
    ));
    let store = std::fs::read(agent.namespace().in_ns(agent.data_dir.join("state.redb")))
        .expect("the store");
    (out, store)
}

#[tokio::test]
async fn every_route_refuses_without_a_valid_token_and_the_refusal_changes_nothing() {
    let (agent, _boot) = start().await;
    let client = agent.client();
    let reader = client
        .acl_create_token("reader", &[Policy::Read])
        .await
        .expect("a read token");
    let node = client.node().await.expect("node").id;
    let instance = client.plugin(PLUGIN).await.expect("plugin").instances[0]
        .instance
        .clone();
    let before = state(&agent).await;
    let routes = every_route(&node, &instance, &reader.token.accessor_id);
    assert!(routes.len() >= 35, "{}", routes.len());

    for (method, path, body) in &routes {
        for (headers, status, says) in [
            (vec![], 401, "X-Berth-Token"),
            (vec![("X-Berth-Token", WRONG)], 403, "not found"),
            (vec![("X-Berth-Token", CANARY)], 403, "malformed"),
            (vec![("x-berth-token", "")], 403, "malformed"),
        ] {
            let answer = send(&agent.socket(), method, path, &headers, body).await;
            assert_eq!(
                answer.status, status,
                "{method} {path} {headers:?}: {}",
                answer.text
            );
            let (_, json_body) = answer.text.split_once("\r\n\r\n").expect("a body");
            let doc: Value = serde_json::from_str(json_body)
                .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {}", answer.text));
            let error = doc["error"].as_str().expect("an ErrorBody");
            assert!(error.contains(says), "{method} {path}: {error}");
            assert!(
                !answer.text.contains(CANARY) && !answer.text.contains(WRONG),
                "{method} {path}: the answer repeats the token: {}",
                answer.text
            );
        }
    }
    assert_eq!(
        state(&agent).await,
        before,
        "a refused request changed something"
    );
    assert!(client.job("j1").await.is_err_and(|e| e.is_not_found()));
    assert!(client.volume("v2").await.is_err_and(|e| e.is_not_found()));
    assert!(client.plugin("p2").await.is_err_and(|e| e.is_not_found()));
    let log = agent.log();
    assert!(
        !log.contains(CANARY) && !log.contains(WRONG),
        "the log holds a token"
    );

    // The same routes with a valid token pass the layer (a GET /v1/events would stream, so
    // not that one): whatever the route answers, it is not the layer's 401 or 403.
    let secret = reader.secret_id.expose();
    for (method, path, body) in routes.iter().filter(|(m, _, _)| *m == "GET") {
        if path == "/v1/events"
            || path.starts_with("/v1/event/stream")
            || path.starts_with("/v1/client/fs/logs")
            || path.starts_with("/v1/acl/tokens")
        {
            continue;
        }
        let answer = send(
            &agent.socket(),
            method,
            path,
            &[("X-Berth-Token", secret)],
            body,
        )
        .await;
        assert!(
            answer.status != 401 && answer.status != 403,
            "{method} {path} with a read token: {}",
            answer.text
        );
    }

    // Public without a token: the JWK set, bootstrap (refused as done, not as unauthorized),
    // and the UI's files (whatever the UI route answers, it is not the layer's refusal).
    let jwks = send(&agent.socket(), "GET", "/.well-known/jwks.json", &[], "").await;
    assert_eq!(jwks.status, 200, "{}", jwks.text);
    let again = send(&agent.socket(), "POST", "/v1/acl/bootstrap", &[], "").await;
    assert_eq!(again.status, 409, "{}", again.text);
    for path in ["/ui", "/ui/index.html"] {
        let ui = send(&agent.socket(), "GET", path, &[], "").await;
        assert!(ui.status != 401 && ui.status != 403, "{path}: {}", ui.text);
    }
    assert_eq!(state(&agent).await, before);
}

/// `got` is the agent's 403 "permission denied".
fn forbidden<T: std::fmt::Debug>(what: &str, got: Result<T, ClientError>) {
    match got {
        Err(ClientError::Api {
            status: 403,
            message,
            ..
        }) => assert!(message.contains("permission denied"), "{what}: {message}"),
        other => panic!("{what}: expected 403, got {other:?}"),
    }
}

#[tokio::test]
async fn each_policy_grants_what_it_names_and_nothing_more() {
    let (agent, _boot) = start().await;
    let management = agent.client();
    let address = format!("unix://{}", agent.socket().display());
    let as_token = |t: &NewToken| {
        Client::new(&address)
            .unwrap()
            .with_token(t.secret_id.clone())
    };
    let make = |name: &'static str, p: Policy| {
        let management = management.clone();
        async move {
            management
                .acl_create_token(name, &[p])
                .await
                .expect("a token")
        }
    };
    let read = as_token(&make("read", Policy::Read).await);
    let jobs_op = as_token(&make("jobs", Policy::JobOperator).await);
    let volumes_op = as_token(&make("volumes", Policy::VolumeOperator).await);
    let register = RegisterRequest {
        id: "p2".into(),
        plugin_type: PluginType::Node,
        socket: agent.tmp.path().join("p2.sock"),
        instance: None,
    };
    let spec = |id: &str| VolumeSpecRequest {
        spec: serde_json::from_str::<Value>(&spec_request(id)).unwrap()["spec"]
            .as_str()
            .unwrap()
            .to_string(),
        format: SpecFormat::Hcl,
        file: None,
    };

    // read: every read, no write.
    read.jobs().await.expect("read: jobs");
    read.volumes().await.expect("read: volumes");
    read.volume(VOLUME).await.expect("read: a volume");
    read.plugins().await.expect("read: plugins");
    read.node().await.expect("read: node");
    read.metrics().await.expect("read: metrics");
    assert_eq!(
        read.acl_token_self().await.expect("read: self").name,
        "read"
    );
    forbidden("read: job run", jobs::run_job(&read, batch_job("r")).await);
    forbidden("read: volume create", read.create_volume(&spec("v2")).await);
    forbidden("read: plugin register", read.register(&register).await);
    forbidden("read: token list", read.acl_tokens().await);

    // job-operator: runs and stops jobs; no volume, plugin or token writes.
    forbidden(
        "job-operator: volume register",
        jobs_op.register_volume(&spec("v3")).await,
    );
    forbidden(
        "job-operator: volume create",
        jobs_op.create_volume(&spec("v2")).await,
    );
    forbidden(
        "job-operator: plugin register",
        jobs_op.register(&register).await,
    );
    forbidden(
        "job-operator: token create",
        jobs_op.acl_create_token("x", &[Policy::Management]).await,
    );
    jobs::run_job(&jobs_op, batch_job("ok"))
        .await
        .expect("job-operator: job run");
    let done = jobs::wait_alloc(&agent, "ok", |a| a.client_status.is_terminal()).await;
    assert_eq!(done.client_status, ClientStatus::Complete, "{done:#?}");
    jobs_op
        .stop_job("ok")
        .await
        .expect("job-operator: job stop");

    // volume-operator: volumes, not jobs.
    forbidden(
        "volume-operator: job run",
        jobs::run_job(&volumes_op, batch_job("v")).await,
    );
    volumes_op
        .create_volume(&spec("v2"))
        .await
        .expect("volume-operator: volume create");
    forbidden(
        "volume-operator: plugin register",
        volumes_op.register(&register).await,
    );

    // management: everything.
    management
        .register(&register)
        .await
        .expect("management: plugin register");
    management
        .create_volume(&spec("v4"))
        .await
        .expect("management: volume create");
    jobs::run_job(&management, batch_job("m"))
        .await
        .expect("management: job run");
    let tokens = management.acl_tokens().await.expect("management: tokens");
    assert_eq!(tokens.tokens.len(), 4, "{tokens:?}");

    // Nothing refused above happened.
    assert!(management.job("r").await.is_err_and(|e| e.is_not_found()));
    assert!(management.job("v").await.is_err_and(|e| e.is_not_found()));
    assert!(
        management
            .volume("v3")
            .await
            .is_err_and(|e| e.is_not_found())
    );
}

/// Runs the berth CLI at `address` with `args` and `env` (BERTH_* cleared first), bounded.
async fn cli(address: &str, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    cli_as(address, args, env, None).await
}

/// [`cli`] as `uid`/`gid` when given.
async fn cli_as(
    address: &str,
    args: &[&str],
    env: &[(&str, &str)],
    ids: Option<(u32, u32)>,
) -> std::process::Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_berth"));
    cmd.args(["--address", address]).args(args);
    for var in ["BERTH_ADDR", "BERTH_TOKEN", "BERTH_CACERT", "BERTH_LOG"] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    if let Some((uid, gid)) = ids {
        cmd.uid(uid).gid(gid);
    }
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run berth");
    tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("berth finishes within 60s")
        .expect("berth output")
}

fn text(out: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The secret id a `berth acl bootstrap` or `token create` printed.
fn printed_secret(out: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("secret id"))
        .unwrap_or_else(|| panic!("no secret printed:\n{}", text(out)));
    let secret = line.split_whitespace().last().unwrap().to_string();
    assert!(
        secret.parse::<SecretId>().is_ok() && secret.len() == 36,
        "{line}"
    );
    secret
}

#[tokio::test]
async fn bootstrap_works_once_and_secrets_stay_out_of_logs_and_lists() {
    let mut agent = AgentProcess::start(ACL_ON).await;
    let address = format!("unix://{}", agent.socket().display());

    let out = cli(&address, &["acl", "bootstrap"], &[]).await;
    assert!(out.status.success(), "{}", text(&out));
    let boot = printed_secret(&out);
    let again = cli(&address, &["acl", "bootstrap"], &[]).await;
    assert_eq!(again.status.code(), Some(1), "{}", text(&again));
    assert!(
        text(&again).contains("already bootstrapped"),
        "{}",
        text(&again)
    );
    assert!(!text(&again).contains(&boot));

    // Without a token the CLI is told how to send one.
    let out = cli(&address, &["node", "status"], &[]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("BERTH_TOKEN"), "{}", text(&out));

    // Nomad's single-dash flags, the token from --token.
    let out = cli(
        &address,
        &[
            "--token",
            &boot,
            "acl",
            "token",
            "create",
            "-name",
            "ops",
            "-policy",
            "job-operator",
            "-policy",
            "read",
        ],
        &[],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out));
    let ops = printed_secret(&out);
    assert!(text(&out).contains("read, job-operator"), "{}", text(&out));
    let secrets = [boot.clone(), ops.clone()];

    // An unknown policy is refused by the CLI, and by the agent naming the field.
    let out = cli(
        &address,
        &[
            "--token", &boot, "acl", "token", "create", "--name", "x", "--policy", "root",
        ],
        &[],
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("unknown policy"), "{}", text(&out));
    let raw = send(
        &agent.socket(),
        "POST",
        "/v1/acl/tokens",
        &[("X-Berth-Token", &boot)],
        &json!({"name": "x", "policies": ["read", "root"]}).to_string(),
    )
    .await;
    assert_eq!(raw.status, 400, "{}", raw.text);
    assert!(raw.text.contains("policies[1]"), "{}", raw.text);

    // The token from BERTH_TOKEN; lists never show a secret, nor does a trace-level CLI log.
    let env = [("BERTH_TOKEN", boot.as_str()), ("BERTH_LOG", "trace")];
    let list = cli(&address, &["acl", "token", "list"], &env).await;
    assert!(list.status.success(), "{}", text(&list));
    assert!(text(&list).contains("Bootstrap Token") && text(&list).contains("ops"));
    let list_json = cli(&address, &["acl", "token", "list", "--json"], &env).await;
    assert!(list_json.status.success(), "{}", text(&list_json));
    let me = cli(
        &address,
        &["acl", "token", "self"],
        &[("BERTH_TOKEN", &ops)],
    )
    .await;
    assert!(me.status.success(), "{}", text(&me));
    assert!(text(&me).contains("ops"), "{}", text(&me));
    for out in [&list, &list_json, &me] {
        for s in &secrets {
            assert!(
                !text(out).contains(s.as_str()),
                "a secret shows:\n{}",
                text(out)
            );
        }
    }

    // A job-operator token cannot manage tokens.
    let out = cli(&address, &["--token", &ops, "acl", "token", "list"], &[]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("permission denied"), "{}", text(&out));

    // Tokens and the bootstrap outlive a restart; a deleted token stops working.
    agent.kill9();
    agent.respawn();
    agent.wait_ready().await;
    let again = cli(&address, &["acl", "bootstrap"], &[]).await;
    assert_eq!(again.status.code(), Some(1), "{}", text(&again));
    let client = Client::new(&address)
        .unwrap()
        .with_token(boot.parse().unwrap());
    let ops_accessor = client
        .acl_tokens()
        .await
        .expect("tokens")
        .tokens
        .into_iter()
        .find(|t| t.name == "ops")
        .expect("ops survived")
        .accessor_id;
    let out = cli(
        &address,
        &["--token", &boot, "acl", "token", "delete", &ops_accessor],
        &[],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out));
    let out = cli(&address, &["--token", &ops, "job", "status"], &[]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("ACL token not found"), "{}", text(&out));
    // The last management token is kept.
    let boot_accessor = client.acl_token_self().await.expect("self").accessor_id;
    let out = cli(
        &address,
        &["--token", &boot, "acl", "token", "delete", &boot_accessor],
        &[],
    )
    .await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("last management token"),
        "{}",
        text(&out)
    );

    let log = agent.log();
    for s in &secrets {
        assert!(!log.contains(s.as_str()), "the agent's log holds a secret");
    }
    let store = std::fs::read(agent.data_dir.join("state.redb")).expect("store");
    for s in &secrets {
        let found = store.windows(s.len()).any(|w| w == s.as_bytes());
        assert!(!found, "the store holds a secret");
    }
}

/// Starts an agent with `config` that must refuse to start; its exit status and log.
async fn refused_config(config: &str) -> (Option<i32>, String) {
    let mut agent = AgentProcess::start_unready(config, &[]);
    let status = agent.wait_exit(Duration::from_secs(20)).await;
    assert!(!agent.socket().exists(), "the socket was bound");
    (status.code(), agent.log())
}

#[tokio::test]
async fn an_address_beyond_loopback_needs_tls_and_acls() {
    let certs = tempfile::Builder::new()
        .prefix("bt")
        .tempdir_in("/tmp")
        .unwrap();
    let tls = berth_testkit::EtcdTls::generate(certs.path(), "berth acl test CA").unwrap();
    let tls_block = format!(
        "  tls {{\n    cert_file = \"{}\"\n    key_file = \"{}\"\n  }}\n",
        tls.server_cert.display(),
        tls.server_key.display()
    );
    for (config, says) in [
        (
            "api {\n  address = \"0.0.0.0:4646\"\n}\n".to_string(),
            "needs api { tls { cert_file, key_file } } and acl { enabled = true }",
        ),
        (
            format!("api {{\n  address = \"0.0.0.0:4646\"\n{tls_block}}}\n"),
            "needs acl { enabled = true }",
        ),
        (
            format!("{ACL_ON}api {{\n  address = \"[::]:4646\"\n}}\n"),
            "needs api { tls { cert_file, key_file } }",
        ),
    ] {
        let (code, log) = refused_config(&config).await;
        assert_eq!(code, Some(2), "{config}\n{log}");
        assert!(log.contains("api.address"), "{log}");
        assert!(log.contains(says), "{says}: {log}");
    }
    // A key that is not the certificate's.
    let bad = format!(
        "{ACL_ON}api {{\n  address = \"0.0.0.0:0\"\n  tls {{\n    cert_file = \"{}\"\n    \
         key_file = \"{}\"\n  }}\n}}\n",
        tls.server_cert.display(),
        tls.client_key.display()
    );
    let (code, log) = refused_config(&bad).await;
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("api.tls.key_file"), "{log}");
}

#[tokio::test]
async fn https_with_a_private_ca_and_a_token() {
    let certs = tempfile::Builder::new()
        .prefix("bt")
        .tempdir_in("/tmp")
        .unwrap();
    let tls = berth_testkit::EtcdTls::generate(certs.path(), "berth acl test CA").unwrap();
    let config = format!(
        "{ACL_ON}api {{\n  address = \"0.0.0.0:0\"\n  tls {{\n    cert_file = \"{}\"\n    \
         key_file = \"{}\"\n  }}\n}}\n",
        tls.server_cert.display(),
        tls.server_key.display()
    );
    let agent = AgentProcess::start_with(&config, &["--log-format", "json"]).await;
    // The port it picked, from its log (written before the API answers).
    let port = agent
        .log()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["fields"]["message"] == "API listening on TCP")
        .and_then(|l| {
            l["fields"]["addr"]
                .as_str()?
                .rsplit_once(':')?
                .1
                .parse::<u16>()
                .ok()
        })
        .unwrap_or_else(|| panic!("no TCP address logged:\n{}", agent.log()));
    let https = format!("https://localhost:{port}");
    let ca = tls.ca.display().to_string();

    let out = cli(&https, &["--ca-cert", &ca, "acl", "bootstrap"], &[]).await;
    assert!(out.status.success(), "{}", text(&out));
    let secret = printed_secret(&out);

    let out = cli(
        &https,
        &["--ca-cert", &ca, "--token", &secret, "node", "status"],
        &[],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out));
    // The CA and token from the environment; by IP too (the certificate names 127.0.0.1).
    let env = [
        ("BERTH_CACERT", ca.as_str()),
        ("BERTH_TOKEN", secret.as_str()),
    ];
    let out = cli(
        &format!("https://127.0.0.1:{port}"),
        &["job", "status"],
        &env,
    )
    .await;
    assert!(out.status.success(), "{}", text(&out));

    // Without the CA the agent's certificate is not trusted; without a token, 401.
    let out = cli(&https, &["--token", &secret, "node", "status"], &[]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("TLS with the agent"), "{}", text(&out));
    let out = cli(&https, &["--ca-cert", &ca, "node", "status"], &[]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("X-Berth-Token"), "{}", text(&out));
    // Plain HTTP gets no answer from the TLS port.
    let out = cli(
        &format!("http://127.0.0.1:{port}"),
        &["node", "status"],
        &env,
    )
    .await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    // A CA file that is not one is a usage error naming the flag.
    let out = cli(
        &https,
        &["--ca-cert", "/nonexistent/ca.pem", "node", "status"],
        &[],
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--ca-cert"), "{}", text(&out));

    // The unix socket stays plain HTTP.
    let unix = format!("unix://{}", agent.socket().display());
    let out = cli(&unix, &["--token", &secret, "node", "status"], &[]).await;
    assert!(out.status.success(), "{}", text(&out));
    assert!(!agent.log().contains(&secret), "the log holds the secret");
}

#[tokio::test]
async fn the_socket_group_opens_the_socket_to_its_members_only() {
    let agent = AgentProcess::start("api {\n  socket_group = \"nogroup\"\n}\n").await;
    let meta = std::fs::metadata(agent.socket()).expect("socket");
    assert_eq!(meta.mode() & 0o777, 0o660, "{:o}", meta.mode());
    assert_eq!(meta.gid(), 65534);
    // The test's directories must be traversable by the group's members (the README says so
    // for real setups).
    use std::os::unix::fs::PermissionsExt as _;
    for dir in [agent.tmp.path(), agent.data_dir.as_path()] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    }
    let address = format!("unix://{}", agent.socket().display());

    let member = cli_as(&address, &["node", "status"], &[], Some((65534, 65534))).await;
    assert!(member.status.success(), "{}", text(&member));
    let stranger = cli_as(&address, &["node", "status"], &[], Some((65533, 65533))).await;
    assert_eq!(stranger.status.code(), Some(1), "{}", text(&stranger));
    assert!(
        text(&stranger).contains("permission denied"),
        "{}",
        text(&stranger)
    );
}
