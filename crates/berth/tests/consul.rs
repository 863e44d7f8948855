//! Consul service identity tokens end to end: a real agent signs each service's workload
//! identity, logs in to a fake Consul (on loopback, speaking Consul's ACL API and verifying the
//! JWT against the agent's own `/.well-known/jwks.json`), waits for the token to replicate,
//! hands it to the Connect sidecar task in `secrets/si_token`, and revokes it when the alloc
//! stops or fails. No token may show in the agent's log, its events or its API answers.

mod agent_support;

use std::{
    collections::BTreeSet,
    os::unix::fs::PermissionsExt as _,
    path::PathBuf,
    sync::{Arc, OnceLock},
    time::Duration,
};

use agent_support::{
    AgentProcess,
    jobs::{run_job, wait_alloc, wait_alloc_before},
};
use berth_api::jobs::{AllocStatus, ClientStatus, EventKind};
use berth_testkit::{FakeConsul, FakeConsulConfig, LoginOutcome};

/// A fake Consul whose auth method trusts the agent started next, and that agent.
struct Setup {
    consul: FakeConsul,
    agent: AgentProcess,
}

async fn start() -> Setup {
    // Consul's auth method fetches the JWKS at each login; the fake asks on a blocking thread
    // of its own runtime, where the agent's client can run.
    let agent_client: Arc<OnceLock<berth_api::Client>> = Arc::new(OnceLock::new());
    let for_consul = Arc::clone(&agent_client);
    let consul = FakeConsul::start(FakeConsulConfig::new(move || {
        let client = for_consul.get().ok_or("the agent has not started")?;
        tokio::runtime::Handle::current()
            .block_on(client.jwks())
            .map_err(|e| e.to_string())
    }))
    .expect("fake consul");
    let config = format!("consul {{\n  address = \"{}\"\n}}\n", consul.address());
    let agent = AgentProcess::start_in_namespace(&config).await;
    agent_client.set(agent.client()).expect("set once");
    Setup { consul, agent }
}

/// A group with service `count-api` (a Connect sidecar, a workload identity), its task `web`
/// and the sidecar task `proxy` (exec: its secrets are a tmpfs of its own), which prints its
/// token at every start. `extra` goes into the group.
fn countdash(id: &str, extra: &str) -> String {
    format!(
        r#"
job "{id}" {{
  group "api" {{
    restart {{
      attempts = 5
      interval = "1h"
      delay    = "50ms"
      mode     = "fail"
    }}
    service {{
      name = "count-api"
      port = "9001"
      connect {{
        sidecar_service {{}}
      }}
      identity {{
        aud = ["consul.io"]
        ttl = "1h"
      }}
    }}
    {extra}
    task "web" {{
      driver = "raw_exec"
      config {{
        command = "/bin/sh"
        args    = ["-c", "exec sleep 600"]
      }}
      kill_timeout = "2s"
    }}
    task "proxy" {{
      driver = "exec"
      kind   = "connect-proxy:count-api"
      config {{
        command = "/bin/sh"
        args    = ["-c", "stat -c '%a' /secrets/si_token; cat /secrets/si_token; echo; exec sleep 600"]
      }}
      kill_timeout = "2s"
    }}
  }}
}}
"#
    )
}

/// Waits until every task of job `job`'s alloc has a process, or the alloc failed.
async fn wait_started(agent: &AgentProcess, job: &str) -> AllocStatus {
    wait_alloc(agent, job, |a| {
        a.tasks.values().all(|t| t.pid.is_some()) || a.client_status == ClientStatus::Failed
    })
    .await
}

fn alloc_dir(agent: &AgentProcess, alloc: &AllocStatus) -> PathBuf {
    agent.data_dir.join("allocs").join(&alloc.alloc_id)
}

fn has(alloc: &AllocStatus, kind: EventKind) -> bool {
    alloc.events.iter().any(|e| e.kind == kind)
}

/// Every secret the fake handed out or was sent: SecretIDs and the login JWTs.
fn secrets(consul: &FakeConsul) -> BTreeSet<String> {
    let mut all: BTreeSet<String> = consul
        .logins()
        .into_iter()
        .map(|l| l.bearer_token)
        .collect();
    all.extend(consul.live_tokens().into_iter().map(|t| t.secret_id));
    all.extend(
        consul
            .logouts()
            .into_iter()
            .map(|l| l.secret_id)
            .filter(|s| !s.is_empty()),
    );
    all
}

/// No secret in the agent's log, its API answers, the event stream's backlog or a CLI call.
async fn assert_nothing_leaks(setup: &Setup, job: &str) {
    let secrets = secrets(&setup.consul);
    assert!(!secrets.is_empty());
    let client = setup.agent.client();
    let status = serde_json::to_string(&client.job(job).await.expect("job")).unwrap();
    let jobs = serde_json::to_string(&client.jobs().await.expect("jobs")).unwrap();
    let cli = agent_support::berth(&setup.agent, &["job", "status", job]).await;
    let cli = format!(
        "{}{}",
        String::from_utf8_lossy(&cli.stdout),
        String::from_utf8_lossy(&cli.stderr)
    );
    let log = setup.agent.log();
    for secret in &secrets {
        for (what, text) in [
            ("log", &log),
            ("job status", &status),
            ("jobs", &jobs),
            ("cli", &cli),
        ] {
            assert!(
                !text.contains(secret.as_str()),
                "a secret shows in the {what}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_gets_its_service_token_keeps_it_across_a_kill_9_and_it_is_revoked_at_stop() {
    let mut setup = start().await;
    let client = setup.agent.client();
    run_job(&client, countdash("dash", ""))
        .await
        .expect("job run");
    let running = wait_started(&setup.agent, "dash").await;
    assert_eq!(running.client_status, ClientStatus::Running, "{running:?}");

    // One login, for the service's identity, with Nomad's claims and meta.
    let logins = setup.consul.logins();
    assert_eq!(logins.len(), 1, "{logins:?}");
    let login = &logins[0];
    assert_eq!(login.auth_method, "nomad-workloads");
    let claims = login.claims.as_ref().expect("claims");
    assert_eq!(claims["nomad_service"], "count-api");
    assert_eq!(claims["nomad_job_id"], "dash");
    assert_eq!(claims["nomad_namespace"], "default");
    assert_eq!(claims["nomad_allocation_id"], running.alloc_id.as_str());
    assert_eq!(claims["aud"], serde_json::json!(["consul.io"]));
    assert_eq!(
        claims["sub"],
        "global:default:dash:api:count-api:consul-service_count-api-9001"
    );
    assert!(claims.get("nomad_task").is_none());
    assert_eq!(login.meta["requested_by"], "nomad_service_count-api");
    let node = client.node().await.expect("node");
    assert_eq!(login.meta["node_id"], node.id);
    let LoginOutcome::Issued { accessor_id } = &login.outcome else {
        panic!("refused: {login:?}");
    };
    let live = setup.consul.live_tokens();
    assert_eq!(live.len(), 1);
    let secret = live[0].secret_id.clone();
    assert_eq!(live[0].service_name.as_deref(), Some("count-api"));

    // secrets/si_token: the SecretID, mode 0440, no newline; the task sees it in its tmpfs.
    let dir = alloc_dir(&setup.agent, &running);
    let file = dir.join("proxy/secrets/si_token");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), secret);
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o440);
    let stdout = dir.join("logs/proxy.stdout.0");
    berth_testkit::assert_eventually!(Duration::from_secs(10), || async {
        std::fs::read_to_string(&stdout).is_ok_and(|o| o == format!("440\n{secret}\n"))
    });
    assert!(
        !dir.join("web/secrets/si_token").exists(),
        "only the sidecar gets the token"
    );
    let alloc = client.alloc(&running.alloc_id).await.expect("alloc");
    assert!(has(&alloc, EventKind::ConsulTokensDerived), "{alloc:?}");
    assert!(
        alloc
            .events
            .iter()
            .any(|e| e.message.contains(accessor_id.as_str())),
        "events name the token by its AccessorID"
    );

    // kill -9 of the agent; the token file is lost (a fresh tmpfs), the sidecar dies; the
    // next agent restarts it with the file written again, without logging in again.
    setup.agent.kill9();
    std::fs::remove_file(&file).unwrap();
    let proxy_pid = running.tasks["proxy"].pid.expect("pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(proxy_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    setup.agent.respawn();
    setup.agent.wait_ready().await;
    let restarted = wait_alloc(&setup.agent, "dash", |a| {
        a.tasks["proxy"].pid.is_some_and(|p| p != proxy_pid)
    })
    .await;
    assert_eq!(restarted.client_status, ClientStatus::Running);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), secret);
    berth_testkit::assert_eventually!(Duration::from_secs(10), || async {
        std::fs::read_to_string(&stdout)
            .is_ok_and(|o| o == format!("440\n{secret}\n440\n{secret}\n"))
    });
    assert_eq!(setup.consul.logins().len(), 1, "no second login");

    // Stop: the token is logged out once the tasks are dead.
    client.stop_job("dash").await.expect("stop");
    let stopped = wait_alloc(&setup.agent, "dash", |a| {
        a.client_status == ClientStatus::Complete
    })
    .await;
    assert!(has(&stopped, EventKind::ConsulTokensRevoked), "{stopped:?}");
    let logouts = setup.consul.logouts();
    assert_eq!(logouts.len(), 1, "{:?}", logouts.len());
    assert!(logouts[0].removed);
    assert_eq!(logouts[0].secret_id, secret);
    assert!(setup.consul.live_tokens().is_empty());
    assert_nothing_leaks(&setup, "dash").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_that_replicates_after_three_checks_is_waited_for() {
    let setup = start().await;
    setup.consul.token_self_not_found(3);
    run_job(&setup.agent.client(), countdash("late", ""))
        .await
        .expect("job run");
    let running = wait_started(&setup.agent, "late").await;
    assert_eq!(running.client_status, ClientStatus::Running, "{running:?}");
    let live = setup.consul.live_tokens();
    assert_eq!(live.len(), 1);
    assert_eq!(setup.consul.token_self_count(&live[0].secret_id), 4);
    assert_eq!(setup.consul.logins().len(), 1);
    assert_nothing_leaks(&setup, "late").await;
}

/// Waits (past the 10 s the token may take) for the alloc of `job` to fail; checks nothing
/// started and every token obtained is gone.
async fn assert_failed_and_revoked(setup: &Setup, job: &str, reason: &str) -> AllocStatus {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    let failed = wait_alloc_before(&setup.agent, job, deadline, |a| {
        a.client_status == ClientStatus::Failed
    })
    .await;
    let failure = failed.failure.clone().expect("a reason");
    assert!(failure.contains(reason), "{failure}");
    assert!(
        failed.tasks.values().all(|t| t.started_at.is_none()),
        "no task started: {failed:?}"
    );
    assert!(has(&failed, EventKind::ConsulTokensFailed), "{failed:?}");
    assert!(
        setup.consul.live_tokens().is_empty(),
        "every token obtained was revoked"
    );
    let dir = alloc_dir(&setup.agent, &failed);
    assert!(!dir.join("proxy/secrets/si_token").exists());
    assert_nothing_leaks(setup, job).await;
    failed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_never_usable_fails_the_alloc_and_is_revoked() {
    let setup = start().await;
    setup.consul.fail_token_self(403, "ACL not found");
    run_job(&setup.agent.client(), countdash("never", ""))
        .await
        .expect("job run");
    let failed = assert_failed_and_revoked(&setup, "never", "was not usable within 10s").await;
    assert!(
        failed.failure.unwrap().contains("ACL not found"),
        "the reason is Consul's answer"
    );
    let logouts = setup.consul.logouts();
    assert_eq!(logouts.len(), 1);
    assert!(logouts[0].removed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_login_fails_the_alloc_and_revokes_the_tokens_already_obtained() {
    let setup = start().await;
    // A second service whose identity's audience Consul's auth method is not bound to: its
    // login is refused after the first service got its token.
    let second = r#"service {
      name = "metrics"
      port = "9102"
      identity {
        aud = ["elsewhere.example"]
      }
    }"#;
    run_job(&setup.agent.client(), countdash("refused", second))
        .await
        .expect("job run");
    let failed =
        assert_failed_and_revoked(&setup, "refused", "login for service \"metrics\"").await;
    assert!(
        failed
            .failure
            .unwrap()
            .contains("aud claim does not match any bound audience"),
        "the reason is Consul's answer"
    );
    let logins = setup.consul.logins();
    assert_eq!(logins.len(), 2, "{logins:?}");
    let logouts = setup.consul.logouts();
    assert_eq!(logouts.len(), 1, "the first service's token was revoked");
    assert!(logouts[0].removed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_consul_refuses_fails_the_alloc_with_its_answer() {
    let setup = start().await;
    setup
        .consul
        .fail_logins(500, "rpc error making call: Permission denied", 1);
    run_job(&setup.agent.client(), countdash("denied", ""))
        .await
        .expect("job run");
    let failed = assert_failed_and_revoked(&setup, "denied", "500").await;
    assert!(failed.failure.unwrap().contains("Permission denied"));
    assert!(setup.consul.logouts().is_empty(), "nothing to revoke");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jwks_holds_one_public_es256_key_that_survives_a_restart() {
    let mut setup = start().await;
    let client = setup.agent.client();
    let jwks: serde_json::Value =
        serde_json::from_str(&client.jwks().await.expect("jwks")).unwrap();
    let keys = jwks["keys"].as_array().expect("keys");
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0]["alg"], "ES256");
    assert!(keys[0].get("d").is_none(), "no private part");
    setup.agent.terminate().await;
    setup.agent.respawn();
    setup.agent.wait_ready().await;
    let again: serde_json::Value =
        serde_json::from_str(&client.jwks().await.expect("jwks")).unwrap();
    assert_eq!(again, jwks, "the key is kept in the agent's store");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_obtained_before_a_kill_9_is_reused_not_leaked() {
    let mut setup = start().await;
    // The agent dies while it waits for its fresh token to replicate.
    setup.consul.fail_token_self(403, "ACL not found");
    run_job(&setup.agent.client(), countdash("crash", ""))
        .await
        .expect("job run");
    berth_testkit::assert_eventually!(Duration::from_secs(10), || async {
        setup
            .consul
            .live_tokens()
            .first()
            .is_some_and(|t| setup.consul.token_self_count(&t.secret_id) > 0)
    });
    setup.agent.kill9();
    setup.consul.clear_token_self_failure();
    setup.agent.respawn();
    setup.agent.wait_ready().await;
    let running = wait_started(&setup.agent, "crash").await;
    assert_eq!(running.client_status, ClientStatus::Running, "{running:?}");
    assert_eq!(
        setup.consul.logins().len(),
        1,
        "the persisted token was reused"
    );
    let live = setup.consul.live_tokens();
    assert_eq!(live.len(), 1);
    let file = alloc_dir(&setup.agent, &running).join("proxy/secrets/si_token");
    assert_eq!(std::fs::read_to_string(file).unwrap(), live[0].secret_id);
    setup.agent.client().stop_job("crash").await.expect("stop");
    wait_alloc(&setup.agent, "crash", |a| {
        a.client_status == ClientStatus::Complete
    })
    .await;
    assert!(setup.consul.live_tokens().is_empty());
    assert_nothing_leaks(&setup, "crash").await;
}
