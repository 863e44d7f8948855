//! The web UI (`/ui/`) in a real headless Chromium (Debian's `chromium` and `chromium-driver`)
//! against a real agent serving its API on loopback TCP: every view shows what the API says,
//! the page follows the event stream and updates without a reload, names are shown as text,
//! no secret or mount flag reaches the page, and the token box's token goes out on every call.
//!
//! Screenshots of each view go to `target/ui-screenshots/`. The test of live updates prints the
//! latency from an event to the page showing it (median of several runs).

mod agent_support;

use std::{
    net::{Ipv4Addr, TcpListener},
    path::PathBuf,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use agent_support::{
    AgentProcess, hostpath_config,
    jobs::{create_volume, run_job, volume_job, wait_alloc},
};
use berth_api::{
    jobs::{ClientStatus, JobStatus},
    volumes::{SpecFormat, VolumeSpecRequest},
};
use berth_testkit::Browser;
use fantoccini::Locator;
use serde_json::Value;

const PLUGIN: &str = "hp";
/// How long the page may take to show something the API already shows.
const SHOWN: Duration = Duration::from_secs(20);

/// A loopback port nobody listens on now.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn api_block(port: u16) -> String {
    format!("api {{\n  address = \"127.0.0.1:{port}\"\n}}\n")
}

/// An agent running berth-hostpath (staging and attaching) as plugin [`PLUGIN`], its API also
/// on loopback TCP; waits until the plugin is healthy. Returns it with the UI's URL.
async fn agent_with_hostpath() -> (AgentProcess, String) {
    let port = free_port();
    let config = hostpath_config(PLUGIN, &["--enable-stage", "--enable-attach"]) + &api_block(port);
    let agent = AgentProcess::start_in_namespace(&config).await;
    agent
        .wait_plugin(PLUGIN, Duration::from_secs(20), |p| p.health.healthy)
        .await;
    (agent, format!("http://127.0.0.1:{port}"))
}

/// A browser, or a failure that says how to install one.
async fn browser() -> Browser {
    Browser::start().await.unwrap_or_else(|e| panic!("{e}"))
}

/// Where screenshots go: `target/ui-screenshots` of the build that made this test.
fn screenshot_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // <target>/<profile>/deps/<test binary>
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the test binary is under target/<profile>/deps");
    target.join("ui-screenshots")
}

/// Takes a screenshot of the window as `<name>.png` and checks it is a PNG of some size.
async fn screenshot(b: &Browser, name: &str) {
    let path = screenshot_dir().join(format!("{name}.png"));
    let size = b.screenshot(&path).await;
    let png = std::fs::read(&path).expect("screenshot written");
    assert_eq!(png.len(), size);
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "{} is not a PNG",
        path.display()
    );
    assert!(
        size > 10_000,
        "{} is only {size} bytes: a blank page?",
        path.display()
    );
}

/// A JS string literal of `s`.
fn js(s: &str) -> String {
    serde_json::to_string(s).expect("JSON string")
}

/// Clicks the nav link of view `nav` (a real click through WebDriver) and waits until the
/// view has rendered.
async fn nav(b: &Browser, nav: &str) {
    click_nav(b, nav).await;
    wait_view(b, nav).await;
}

/// Clicks the nav link of view `nav`.
async fn click_nav(b: &Browser, nav: &str) {
    b.client()
        .find(Locator::Css(&format!("#nav a[data-nav=\"{nav}\"]")))
        .await
        .unwrap_or_else(|e| panic!("nav link {nav}: {e}"))
        .click()
        .await
        .expect("click");
}

/// Waits until view `name` has rendered at least once.
async fn wait_view(b: &Browser, name: &str) {
    b.wait_for(
        &format!("view {name} rendered"),
        SHOWN,
        &format!(
            "const v = document.getElementById('view'); \
             return v.dataset.view === {} && Number(v.dataset.renders) > 0;",
            js(name)
        ),
    )
    .await;
}

/// Clicks the first link inside the element `selector` whose data attribute `key` equals
/// `value` (compared in the page, so any text works), then waits for view `then`.
async fn click_row(b: &Browser, selector: &str, key: &str, value: &str, then: &str) {
    b.wait_for(
        &format!("{selector} with {key} = {value:?}, to click"),
        SHOWN,
        &format!(
            "for (const e of document.querySelectorAll({sel})) {{ \
               if (e.dataset[{key}] === {value}) {{ e.querySelector('a').click(); return true; }} \
             }} return false;",
            sel = js(selector),
            key = js(key),
            value = js(value)
        ),
    )
    .await;
    wait_view(b, then).await;
}

/// Waits until an element `selector` has data attributes `attrs` (all of them).
async fn wait_element(b: &Browser, selector: &str, attrs: &[(&str, &str)]) -> Value {
    let checks: Vec<String> = attrs
        .iter()
        .map(|(k, v)| format!("e.dataset[{}] === {}", js(k), js(v)))
        .collect();
    let cond = if checks.is_empty() {
        "true".to_owned()
    } else {
        checks.join(" && ")
    };
    b.wait_for(
        &format!("{selector} with {attrs:?}"),
        SHOWN,
        &format!(
            "for (const e of document.querySelectorAll({})) {{ if ({cond}) return e.textContent; }} \
             return false;",
            js(selector)
        ),
    )
    .await
}

/// The page's load id: a reload makes a new one.
async fn load_id(b: &Browser) -> String {
    b.eval("return window.__berth.loadId;")
        .await
        .as_str()
        .expect("load id")
        .to_owned()
}

fn epoch_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_secs_f64()
        * 1000.0
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Every view lists what the agent holds: a running job's alloc with its task and claimed
/// volume, the volume's claim, the healthy plugin, the node's drivers. Then the job is stopped
/// through the API while its view is open, and the alloc shows as complete without a reload.
#[tokio::test]
async fn the_ui_shows_every_view_and_follows_a_stop_without_reloading() {
    let (agent, base) = agent_with_hostpath().await;
    let client = agent.client();
    create_volume(&client, PLUGIN, "data").await;
    let dest = agent.tmp.path().join("web-data");
    run_job(
        &client,
        volume_job("web", "service", "data", &dest, "exec sleep 3600"),
    )
    .await
    .expect("job run");
    let alloc = wait_alloc(&agent, "web", |a| {
        a.client_status == ClientStatus::Running && a.tasks.values().all(|t| t.pid.is_some())
    })
    .await
    .alloc_id;

    let b = browser().await;
    // `/` leads to the UI.
    b.client().goto(&format!("{base}/")).await.expect("open /");
    let url = b.client().current_url().await.expect("url");
    assert_eq!(url.path(), "/ui/", "{url}");
    wait_view(&b, "overview").await;
    wait_element(&b, "#feed-state", &[("state", "live")]).await;
    let counts = b
        .wait_for(
            "overview counts",
            SHOWN,
            "const n = (k) => { const e = document.querySelector(`[data-count=\"${k}\"] .n`); \
               return e ? e.textContent : null; }; \
             return n('jobs') === '1' && n('allocs-running') === '1' && n('plugins-healthy') === '1' \
               && n('volumes') === '1' ? [n('jobs'), n('allocs-running')] : false;",
        )
        .await;
    assert_eq!(counts, serde_json::json!(["1", "1"]));
    // Recent events: read back from the agent's window, as the job ran before the page opened.
    wait_element(
        &b,
        "#recent-events li",
        &[("topic", "Job"), ("type", "JobRegistered")],
    )
    .await;
    screenshot(&b, "overview").await;
    let first_load = load_id(&b).await;

    nav(&b, "jobs").await;
    wait_element(
        &b,
        "#jobs-table tr",
        &[("jobId", "web"), ("stopped", "false")],
    )
    .await;
    screenshot(&b, "jobs").await;

    click_row(&b, "#jobs-table tr", "jobId", "web", "job").await;
    wait_element(
        &b,
        "#job-allocs tr",
        &[
            ("allocId", &alloc),
            ("status", "running"),
            ("desired", "run"),
        ],
    )
    .await;
    screenshot(&b, "job").await;

    click_row(&b, "#job-allocs tr", "allocId", &alloc, "alloc").await;
    wait_element(&b, "#alloc-status", &[("status", "running")]).await;
    wait_element(
        &b,
        "#alloc-tasks tr",
        &[("task", "main"), ("state", "running")],
    )
    .await;
    wait_element(
        &b,
        "#alloc-volumes tr",
        &[("volumeId", "data"), ("claimed", "true")],
    )
    .await;
    // The log panel is there; what it shows depends on the logs route, not tested here.
    b.wait_for(
        "the log panel",
        SHOWN,
        "return document.getElementById('log-output') !== null \
           && document.getElementById('log-task').value === 'main';",
    )
    .await;
    screenshot(&b, "alloc").await;

    nav(&b, "volumes").await;
    wait_element(
        &b,
        "#volumes-table tr",
        &[("volumeId", "data"), ("claims", "1")],
    )
    .await;
    screenshot(&b, "volumes").await;
    click_row(&b, "#volumes-table tr", "volumeId", "data", "volume").await;
    wait_element(
        &b,
        "#volume-claims tr",
        &[("claimAlloc", &alloc), ("state", "claimed")],
    )
    .await;
    screenshot(&b, "volume").await;

    nav(&b, "plugins").await;
    wait_element(&b, ".plugin", &[("pluginId", PLUGIN), ("healthy", "true")]).await;
    wait_element(&b, ".plugin tr", &[("healthy", "true")]).await;
    screenshot(&b, "plugins").await;

    nav(&b, "nodes").await;
    let node = client.node().await.expect("node");
    wait_element(&b, ".node", &[("nodeId", &node.id), ("status", "ready")]).await;
    wait_element(&b, ".node li", &[("driver", "exec"), ("healthy", "true")]).await;
    wait_element(&b, ".node li", &[("csiPlugin", PLUGIN)]).await;
    screenshot(&b, "nodes").await;

    // Live: the job's view is open when the job is stopped through the API.
    nav(&b, "jobs").await;
    click_row(&b, "#jobs-table tr", "jobId", "web", "job").await;
    wait_element(
        &b,
        "#job-allocs tr",
        &[("allocId", &alloc), ("status", "running")],
    )
    .await;
    b.eval("window.__testMarker = 'still here'; return true;")
        .await;
    let stopped: JobStatus = client.stop_job("web").await.expect("job stop");
    assert!(stopped.stopped);
    wait_element(
        &b,
        "#job-allocs tr",
        &[
            ("allocId", &alloc),
            ("status", "complete"),
            ("desired", "stop"),
        ],
    )
    .await;
    assert_eq!(load_id(&b).await, first_load, "the page was reloaded");
    assert_eq!(
        b.eval("return window.__testMarker;").await,
        Value::from("still here"),
        "the page was reloaded"
    );
    screenshot(&b, "job-stopped").await;
    // The volume's view follows the release too.
    nav(&b, "volumes").await;
    wait_element(
        &b,
        "#volumes-table tr",
        &[("volumeId", "data"), ("claims", "0")],
    )
    .await;
    b.close().await;
}

/// One measurement of the page following a stop: the time from the stop call's answer (the
/// agent has published the stop) to the page showing the alloc as stopping, and from the
/// agent's event saying the alloc completed to the page showing it complete.
#[derive(Debug, Clone, Copy)]
struct Lag {
    stop_to_desired_ms: f64,
    stop_to_complete_ms: f64,
    event_to_complete_ms: f64,
    arrival_to_complete_ms: f64,
}

/// A service job of one raw_exec task that sleeps.
fn sleeper(id: &str) -> String {
    format!(
        r#"job "{id}" {{
  type = "service"
  group "g" {{
    task "t" {{
      driver = "raw_exec"
      config {{
        command = "/bin/sh"
        args    = ["-c", "exec sleep 600"]
      }}
      kill_timeout = "2s"
    }}
  }}
}}"#
    )
}

/// Runs job `id`, opens its view, stops it through the API and measures how the page follows.
async fn measure_stop(agent: &AgentProcess, b: &Browser, id: &str) -> Lag {
    let client = agent.client();
    run_job(&client, sleeper(id)).await.expect("job run");
    let alloc = wait_alloc(agent, id, |a| {
        a.client_status == ClientStatus::Running && a.tasks.values().all(|t| t.pid.is_some())
    })
    .await
    .alloc_id;
    b.eval(&format!(
        "location.hash = '#/job/' + encodeURIComponent({}); return true;",
        js(id)
    ))
    .await;
    wait_element(
        b,
        "#job-allocs tr",
        &[("allocId", &alloc), ("status", "running")],
    )
    .await;
    // Record, in the page, when the row first shows each state (wall-clock ms).
    b.eval(&format!(
        "const alloc = {}; window.__seen = {{}}; \
         const check = () => {{ \
           for (const tr of document.querySelectorAll('#job-allocs tr')) {{ \
             if (tr.dataset.allocId !== alloc) continue; \
             const t = performance.timeOrigin + performance.now(); \
             if (tr.dataset.desired === 'stop' && !window.__seen.desired) window.__seen.desired = t; \
             if (tr.dataset.status === 'complete' && !window.__seen.complete) window.__seen.complete = t; \
           }} }}; \
         new MutationObserver(check).observe(document.getElementById('view'), \
           {{ subtree: true, childList: true, attributes: true }}); \
         return true;",
        js(&alloc)
    ))
    .await;
    client.stop_job(id).await.expect("job stop");
    let stop_returned = epoch_ms();
    let seen = b
        .wait_for(
            &format!("job {id}'s alloc shown complete"),
            SHOWN,
            "return window.__seen.desired && window.__seen.complete ? window.__seen : false;",
        )
        .await;
    let desired_at = seen["desired"].as_f64().expect("desired time");
    let complete_at = seen["complete"].as_f64().expect("complete time");
    // The last AllocationUpdated of the alloc that reached the page before it showed complete:
    // the event that said so.
    let events = b.eval("return window.__berth.events;").await;
    let event = events
        .as_array()
        .expect("events")
        .iter()
        .rfind(|e| {
            e["Key"] == alloc.as_str()
                && e["Type"] == "AllocationUpdated"
                && e["arrived"].as_f64().is_some_and(|t| t <= complete_at)
        })
        .unwrap_or_else(|| panic!("no AllocationUpdated of {alloc} reached the page: {events}"))
        .clone();
    Lag {
        stop_to_desired_ms: desired_at - stop_returned,
        stop_to_complete_ms: complete_at - stop_returned,
        event_to_complete_ms: complete_at - event["TimeMs"].as_f64().expect("TimeMs"),
        arrival_to_complete_ms: complete_at - event["arrived"].as_f64().expect("arrived"),
    }
}

/// How quickly the page follows events: five stops of a running job, each measured from the
/// stop call's answer and from the agent's event to the page showing the change, with no
/// reload. Prints the medians.
#[tokio::test]
async fn the_ui_updates_within_a_bounded_time_after_an_event() {
    let port = free_port();
    let mut agent = AgentProcess::start(&api_block(port)).await;
    agent.wait_ready().await;
    let b = browser().await;
    b.client()
        .goto(&format!("http://127.0.0.1:{port}/ui/"))
        .await
        .expect("open the UI");
    wait_view(&b, "overview").await;
    wait_element(&b, "#feed-state", &[("state", "live")]).await;
    let first_load = load_id(&b).await;
    let mut lags = Vec::new();
    for i in 0..5 {
        lags.push(measure_stop(&agent, &b, &format!("lat{i}")).await);
    }
    assert_eq!(load_id(&b).await, first_load, "the page was reloaded");
    for (i, l) in lags.iter().enumerate() {
        println!(
            "run {i}: stop answered → page shows stop: {:.1} ms; stop answered → page shows \
             complete: {:.1} ms; agent's complete event → page: {:.1} ms (of which in the page: \
             {:.1} ms)",
            l.stop_to_desired_ms,
            l.stop_to_complete_ms,
            l.event_to_complete_ms,
            l.arrival_to_complete_ms
        );
        // The page's clock and the test's are the same wall clock, read at different moments:
        // a few ms of skew either way, never more.
        assert!(l.stop_to_desired_ms > -50.0, "{l:?}");
        assert!(l.event_to_complete_ms > -50.0, "{l:?}");
    }
    let pick = |f: fn(&Lag) -> f64| median(&mut lags.iter().map(f).collect::<Vec<_>>());
    println!(
        "UI update latency after an event (median of {} runs): stop answered → page shows the \
         alloc stopping {:.1} ms; agent's event → page shows the alloc complete {:.1} ms (in the \
         page: {:.1} ms); stop answered → complete {:.1} ms",
        lags.len(),
        pick(|l| l.stop_to_desired_ms),
        pick(|l| l.event_to_complete_ms),
        pick(|l| l.arrival_to_complete_ms),
        pick(|l| l.stop_to_complete_ms),
    );
    b.close().await;
}

/// A volume spec whose name is markup, with a secret and a mount flag that must never reach
/// the page.
fn hostile_volume(id: &str, name: &str, secret: &str, flag: &str) -> String {
    format!(
        "id = \"{id}\"\nname = \"{name}\"\ntype = \"csi\"\nplugin_id = \"{PLUGIN}\"\n\
         capacity_min = \"10MiB\"\n\
         capability {{\n  access_mode = \"single-node-writer\"\n  attachment_mode = \"file-system\"\n}}\n\
         mount_options {{\n  mount_flags = [\"noatime\", \"{flag}\"]\n}}\n\
         secrets {{\n  token = \"{secret}\"\n}}\n"
    )
}

/// Names that are markup show as text and run nothing; secrets and mount flags (the volume's
/// and a job's) appear in no view's HTML.
#[tokio::test]
async fn names_show_as_text_and_no_secret_reaches_the_page() {
    const SECRET: &str = "canary-secret-7c1f9a";
    const FLAG: &str = "canary-flag-3b8e2d";
    const JOB_FLAG: &str = "canary-jobflag-91d0";
    const VOLUME_NAME: &str = "<img src=x onerror=window.__pwned=1>";
    const JOB_ID: &str = "<img src=x onerror=window.__pwned=2>";
    let (agent, base) = agent_with_hostpath().await;
    let client = agent.client();
    client
        .create_volume(&VolumeSpecRequest {
            spec: hostile_volume("evil", VOLUME_NAME, SECRET, FLAG),
            format: SpecFormat::Hcl,
            file: Some("evil.hcl".into()),
        })
        .await
        .expect("create the volume");
    let dest = agent.tmp.path().join("evil-data");
    let spec = volume_job(JOB_ID, "service", "evil", &dest, "exec sleep 3600").replace(
        "      access_mode = \"single-node-writer\"",
        &format!(
            "      access_mode = \"single-node-writer\"\n      \
             mount_options {{\n        mount_flags = [\"{JOB_FLAG}\"]\n      }}"
        ),
    );
    run_job(&client, spec).await.expect("job run");
    let alloc = wait_alloc(&agent, JOB_ID, |a| {
        a.client_status == ClientStatus::Running && a.volumes.values().all(|v| v.claimed)
    })
    .await
    .alloc_id;

    let b = browser().await;
    b.client()
        .goto(&format!("{base}/ui/"))
        .await
        .expect("open the UI");
    wait_view(&b, "overview").await;
    wait_element(&b, "#feed-state", &[("state", "live")]).await;
    // The overview's recent events include the job's and the volume's.
    b.wait_for(
        "recent events",
        SHOWN,
        "return document.querySelectorAll('#recent-events li').length > 0;",
    )
    .await;
    no_secret_and_no_script(&b, "overview", &[SECRET, FLAG, JOB_FLAG]).await;

    nav(&b, "jobs").await;
    let shown = wait_element(&b, "#jobs-table tr", &[("jobId", JOB_ID)]).await;
    assert!(shown.as_str().unwrap().contains(JOB_ID), "{shown}");
    no_secret_and_no_script(&b, "jobs", &[SECRET, FLAG, JOB_FLAG]).await;

    click_row(&b, "#jobs-table tr", "jobId", JOB_ID, "job").await;
    let title = wait_element(&b, "#job-title", &[]).await;
    assert_eq!(title, Value::from(JOB_ID));
    wait_element(&b, "#job-allocs tr", &[("allocId", &alloc)]).await;
    no_secret_and_no_script(&b, "job", &[SECRET, FLAG, JOB_FLAG]).await;

    click_row(&b, "#job-allocs tr", "allocId", &alloc, "alloc").await;
    let volume_row = wait_element(&b, "#alloc-volumes tr", &[("volumeId", "evil")]).await;
    assert!(
        volume_row.as_str().unwrap().contains("set (not shown)"),
        "{volume_row}"
    );
    no_secret_and_no_script(&b, "alloc", &[SECRET, FLAG, JOB_FLAG]).await;

    nav(&b, "volumes").await;
    wait_element(&b, "#volumes-table tr", &[("volumeId", "evil")]).await;
    let names = b
        .eval("return [...document.querySelectorAll('#volumes-table .volume-name')].map(e => e.textContent);")
        .await;
    assert_eq!(names, serde_json::json!([VOLUME_NAME]));
    no_secret_and_no_script(&b, "volumes", &[SECRET, FLAG, JOB_FLAG]).await;
    screenshot(&b, "hostile-volumes").await;

    click_row(&b, "#volumes-table tr", "volumeId", "evil", "volume").await;
    let facts = wait_element(&b, "#volume-facts", &[]).await;
    let facts = facts.as_str().unwrap();
    assert!(facts.contains(VOLUME_NAME), "{facts}");
    assert!(facts.contains("token (values not shown)"), "{facts}");
    assert!(facts.contains("set (not shown)"), "{facts}");
    wait_element(&b, "#volume-claims tr", &[("claimAlloc", &alloc)]).await;
    no_secret_and_no_script(&b, "volume", &[SECRET, FLAG, JOB_FLAG]).await;

    nav(&b, "plugins").await;
    no_secret_and_no_script(&b, "plugins", &[SECRET, FLAG, JOB_FLAG]).await;
    nav(&b, "nodes").await;
    no_secret_and_no_script(&b, "nodes", &[SECRET, FLAG, JOB_FLAG]).await;
    b.close().await;
}

/// The page's HTML holds none of `canaries`, no markup from a name became an element, and no
/// script of a name ran.
async fn no_secret_and_no_script(b: &Browser, view: &str, canaries: &[&str]) {
    let html = b.eval("return document.documentElement.outerHTML;").await;
    let html = html.as_str().expect("HTML");
    for c in canaries {
        assert!(!html.contains(c), "view {view} shows {c:?}:\n{html}");
    }
    let pwned = b
        .eval(
            "return [window.__pwned === undefined, document.querySelectorAll('#view img').length];",
        )
        .await;
    assert_eq!(
        pwned,
        serde_json::json!([true, 0]),
        "view {view}: a name became markup"
    );
}

/// A token typed into the token box goes out in `X-Berth-Token` on every API call the page
/// makes (the event stream included), survives a reload, and stops going out once cleared.
/// The UI's own files are loaded without it. A missing or refused token is said as such.
#[tokio::test]
async fn the_token_box_token_goes_out_on_every_call() {
    const TOKEN: &str = "0f6c5a1e-ui-token";
    let port = free_port();
    let mut agent = AgentProcess::start(&api_block(port)).await;
    agent.wait_ready().await;
    let b = browser().await;
    b.client()
        .goto(&format!("http://127.0.0.1:{port}/ui/"))
        .await
        .expect("open the UI");
    wait_view(&b, "overview").await;
    wait_element(&b, "#feed-state", &[("state", "live")]).await;
    let before = b.requests().await;
    assert!(
        before
            .iter()
            .filter(|r| r.url.contains("/v1/"))
            .all(|r| !r.headers.contains_key("x-berth-token")),
        "a token went out before one was set: {before:#?}"
    );

    let input = b
        .client()
        .find(Locator::Id("token-input"))
        .await
        .expect("token box");
    input.send_keys(TOKEN).await.expect("type the token");
    b.client()
        .find(Locator::Id("token-save"))
        .await
        .expect("use button")
        .click()
        .await
        .expect("click");
    wait_element(&b, "#token-state", &[("set", "true")]).await;
    // What went out before the token was set (a refresh still running, say) is not looked at.
    b.requests().await;
    // The box does not keep the token in the page.
    assert_eq!(
        b.eval("return document.getElementById('token-input').value;")
            .await,
        Value::from("")
    );
    nav(&b, "jobs").await;
    nav(&b, "nodes").await;
    wait_element(&b, "#feed-state", &[("state", "live")]).await;
    let with = api_requests(&b).await;
    for path in ["/v1/jobs", "/v1/nodes", "/v1/node"] {
        assert!(
            with.iter().any(|r| r.url.contains(path)),
            "no request to {path}: {with:#?}"
        );
    }
    for r in &with {
        assert_eq!(
            r.headers.get("x-berth-token").map(String::as_str),
            Some(TOKEN),
            "{} went out without the token",
            r.url
        );
    }
    // The token stays across a reload; the UI's files need none.
    b.client().refresh().await.expect("reload");
    wait_view(&b, "nodes").await;
    wait_element(&b, "#token-state", &[("set", "true")]).await;
    wait_element(&b, "#feed-state", &[("state", "live")]).await;
    let reloaded = b.requests().await;
    for path in ["/ui/app.js", "/v1/event/stream", "/v1/nodes"] {
        assert!(
            reloaded.iter().any(|r| r.url.contains(path)),
            "no request to {path}: {reloaded:#?}"
        );
    }
    for r in &reloaded {
        let sent = r.headers.get("x-berth-token").map(String::as_str);
        if r.url.contains("/v1/") {
            assert_eq!(sent, Some(TOKEN), "{} went out without the token", r.url);
        }
    }
    // Cleared: no more token.
    b.client()
        .find(Locator::Id("token-clear"))
        .await
        .expect("clear button")
        .click()
        .await
        .expect("click");
    wait_element(&b, "#token-state", &[("set", "false")]).await;
    nav(&b, "jobs").await;
    let cleared = api_requests(&b).await;
    let after_clear: Vec<_> = cleared
        .iter()
        .filter(|r| r.url.contains("/v1/jobs"))
        .collect();
    assert!(!after_clear.is_empty(), "{cleared:#?}");
    for r in after_clear {
        assert!(!r.headers.contains_key("x-berth-token"), "{r:?}");
    }

    // The agent has no ACLs yet: stand in for them in the page, answering the API 401 without
    // a token and 403 with any token but "good", and passing on what carries "good".
    b.eval(
        "const real = window.fetch; \
         window.fetch = (url, init) => { \
           if (!String(url).startsWith('/v1/')) return real(url, init); \
           const token = new Headers((init && init.headers) || {}).get('X-Berth-Token'); \
           if (token === 'good') return real(url, init); \
           const status = token === null ? 401 : 403; \
           return Promise.resolve(new Response(JSON.stringify({ error: 'ACL says no' }), \
             { status, headers: { 'content-type': 'application/json' } })); \
         }; return true;",
    )
    .await;
    click_nav(&b, "plugins").await;
    wait_element(&b, "#view", &[("view", "plugins")]).await;
    wait_element(&b, "#view-error", &[("status", "401")]).await;
    let banner = wait_element(&b, "#auth-banner", &[("reason", "needed")]).await;
    assert!(
        banner.as_str().unwrap().contains("needs an ACL token"),
        "{banner}"
    );
    for (token, reason) in [("bad", Some("refused")), ("good", None)] {
        let input = b
            .client()
            .find(Locator::Id("token-input"))
            .await
            .expect("box");
        input.send_keys(token).await.expect("type the token");
        b.client()
            .find(Locator::Id("token-save"))
            .await
            .expect("use button")
            .click()
            .await
            .expect("click");
        match reason {
            Some(reason) => {
                wait_element(&b, "#view-error", &[("status", "403")]).await;
                let banner = wait_element(&b, "#auth-banner", &[("reason", reason)]).await;
                assert!(
                    banner.as_str().unwrap().contains("refused the token"),
                    "{banner}"
                );
            }
            None => {
                wait_element(&b, "#plugins-list", &[]).await;
                b.wait_for(
                    "the banner gone",
                    SHOWN,
                    "return document.getElementById('auth-banner').hidden;",
                )
                .await;
            }
        }
    }
    wait_element(&b, "#feed-state", &[("state", "live")]).await;
    b.close().await;
}

/// The API requests the page sent since the last look.
async fn api_requests(b: &Browser) -> Vec<berth_testkit::SeenRequest> {
    b.requests()
        .await
        .into_iter()
        .filter(|r| r.url.contains("/v1/"))
        .collect()
}

/// When the agent goes away (kill -9) and comes back, the page says so, reconnects to the event
/// stream from the last index it saw, and shows what changed, all without a reload.
#[tokio::test]
async fn the_page_reconnects_from_the_last_index_after_the_agent_restarts() {
    let port = free_port();
    let mut agent = AgentProcess::start(&api_block(port)).await;
    agent.wait_ready().await;
    let b = browser().await;
    b.client()
        .goto(&format!("http://127.0.0.1:{port}/ui/#/jobs"))
        .await
        .expect("open the UI");
    wait_view(&b, "jobs").await;
    wait_element(&b, "#feed-state", &[("state", "live")]).await;
    let first_load = load_id(&b).await;
    // An event the page sees before the agent goes away.
    run_job(&agent.client(), sleeper("before"))
        .await
        .expect("job run");
    wait_element(&b, "#jobs-table tr", &[("jobId", "before")]).await;

    agent.kill9();
    wait_element(&b, "#feed-state", &[("state", "reconnecting")]).await;
    // Nothing more can arrive: this is the last event the page saw.
    let last_seen = b
        .eval("const e = window.__berth.events; return e.length ? e[e.length - 1].Index : null;")
        .await
        .as_u64()
        .expect("the page saw the job's events");
    agent.respawn();
    agent.wait_ready().await;
    wait_element(&b, "#feed-state", &[("state", "live")]).await;
    run_job(&agent.client(), sleeper("after"))
        .await
        .expect("job run");
    wait_element(&b, "#jobs-table tr", &[("jobId", "after")]).await;
    assert_eq!(load_id(&b).await, first_load, "the page was reloaded");

    // The stream was asked again from where the page was, not from the agent's newest event.
    let streams: Vec<String> = api_requests(&b)
        .await
        .into_iter()
        .map(|r| r.url)
        .filter(|u| u.contains("/v1/event/stream"))
        .collect();
    let resumed = format!("index={last_seen}");
    assert!(
        streams.last().is_some_and(|u| u.ends_with(&resumed)),
        "the stream was not asked again from {resumed}: {streams:#?}"
    );
    b.close().await;
}

/// Types `token` into the token box and uses it.
async fn use_token(b: &Browser, token: &str) {
    let input = b
        .client()
        .find(Locator::Id("token-input"))
        .await
        .expect("token box");
    input.send_keys(token).await.expect("type the token");
    b.client()
        .find(Locator::Id("token-save"))
        .await
        .expect("use button")
        .click()
        .await
        .expect("click");
    wait_element(b, "#token-state", &[("set", "true")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_acls_on_the_ui_asks_for_a_token_refuses_a_wrong_one_and_works_with_a_read_token() {
    let port = free_port();
    let config = format!("acl {{\n  enabled = true\n}}\n{}", api_block(port));
    let agent = AgentProcess::start(&config).await;
    let admin = agent.client().acl_bootstrap().await.expect("bootstrap");
    let admin_client = agent.client().with_token(admin.secret_id.clone());
    let reader = admin_client
        .acl_create_token("ui", &[berth_api::acl::Policy::Read])
        .await
        .expect("a read token");
    run_job(
        &admin_client,
        r#"
job "acl-web" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/sleep"
        args    = ["600"]
      }
      kill_timeout = "1s"
    }
  }
}
"#
        .into(),
    )
    .await
    .expect("job run");

    let b = browser().await;
    b.client()
        .goto(&format!("http://127.0.0.1:{port}/ui/"))
        .await
        .expect("open the UI: its files need no token");
    wait_element(&b, "#auth-banner", &[("reason", "needed")]).await;

    use_token(&b, "00000000-0000-4000-8000-000000000000").await;
    click_nav(&b, "jobs").await;
    wait_element(&b, "#auth-banner", &[("reason", "refused")]).await;

    b.client()
        .find(Locator::Id("token-clear"))
        .await
        .expect("clear button")
        .click()
        .await
        .expect("click");
    use_token(&b, reader.secret_id.expose()).await;
    nav(&b, "jobs").await;
    wait_element(&b, "#jobs-table tr", &[("jobId", "acl-web")]).await;
    wait_element(&b, "#feed-state", &[("state", "live")]).await;
    b.wait_for(
        "the token banner gone",
        SHOWN,
        "return document.getElementById('auth-banner').hidden;",
    )
    .await;
    let html = b
        .eval("return document.documentElement.outerHTML;")
        .await
        .to_string();
    assert!(
        !html.contains(reader.secret_id.expose()) && !html.contains(admin.secret_id.expose()),
        "a token's secret is in the page"
    );
    admin_client.stop_job("acl-web").await.expect("stop");
}
