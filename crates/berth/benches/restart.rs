//! Benchmark: an agent restart with many published volumes.
//!
//! Starts the agent in a mount namespace that outlives it, with a monolith `berth-hostpath`
//! (staging and attaching) that logs every call it answers, declared by its socket and run by
//! the bench in the same namespace (a plugin the agent runs itself is started afresh by a
//! restarted agent, and fingerprinted again), and claims `--volumes` single-node-writer
//! volumes, one alloc each, so that each is staged and published. Then, `--restarts` times:
//! kills the agent with SIGKILL (the plugin and every mount live on), starts it again, and
//! measures
//!
//! - **API**: from the start until the API answers;
//! - **recovered**: from the start until the agent says (event `PluginVolumesRecovered`) that
//!   it has checked every record against the mount table and driven every claim to its end;
//! - the plugin calls made meanwhile, from the plugin's call log: none is expected (the
//!   agent keeps the plugin's fingerprint and probes it first at its regular slot, after
//!   recovery); a volume RPC or a fingerprint call fails the bench, a Probe is reported;
//! - the new agent's CPU time until then.
//!
//! Every target must still be mounted after each restart, and every claim claimed.
//!
//! `cargo bench -p berth --bench restart [-- --volumes 1000 --restarts 5]`; `-- --quick` is a
//! smoke run (50 volumes, 2 restarts). Needs root and util-linux (`unshare`, `nsenter`,
//! `setpriv`).

mod common;

use std::{
    collections::BTreeMap,
    path::Path,
    process::ExitCode,
    time::{Duration, Instant},
};

use berth_api::{Client, stream::TopicFilter, volumes::ClaimState};
use berth_csi::model::AccessMode;
use common::{
    Agent, Options, PLUGIN, claim_req, clk_tck, cpu_ticks, hostpath_binary, mounts_under, ms,
    stats, volume_spec,
};
use futures::StreamExt as _;

const USAGE: &str = "\
usage: restart [--volumes N] [--restarts R] [--quick]
  --volumes N   volumes claimed and mounted before the restarts (default 1000)
  --restarts R  restarts measured (default 5)
  --quick       smoke run: 50 volumes, 2 restarts (flags given still win)";

/// Calls made at once while the volumes are set up.
const SETUP_CONCURRENCY: usize = 16;

/// How long one restart may take before the bench gives up on it.
const RESTART_TIMEOUT: Duration = Duration::from_secs(120);

/// The plugin's regular health check.
const PROBE: &str = "Probe";

#[derive(Debug, Clone, Copy)]
struct Opts {
    volumes: usize,
    restarts: usize,
}

fn parse_args() -> Result<Opts, String> {
    let args = Options::parse(&["--volumes", "--restarts"])?;
    let (volumes, restarts) = if args.quick { (50, 2) } else { (1000, 5) };
    let o = Opts {
        volumes: args.count("--volumes", volumes)?,
        restarts: args.count("--restarts", restarts)?,
    };
    if o.volumes == 0 || o.restarts == 0 {
        return Err("--volumes and --restarts must be at least 1".into());
    }
    Ok(o)
}

/// Runs `f` over `items`, `SETUP_CONCURRENCY` at a time; the first failure.
async fn all<T, F, Fut>(items: &[T], f: F) -> Result<(), String>
where
    F: Fn(&T) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let mut results =
        futures::stream::iter(items.iter().map(f)).buffer_unordered(SETUP_CONCURRENCY);
    while let Some(r) = results.next().await {
        r?;
    }
    Ok(())
}

/// Waits for the `PluginVolumesRecovered` event of [`PLUGIN`] stamped at `since_ms` or later;
/// its message.
async fn recovered_event(client: &Client, since_ms: u64) -> Result<String, String> {
    let filter =
        TopicFilter::parse([format!("CSIPlugin:{PLUGIN}").as_str()]).map_err(|e| e.to_string())?;
    let mut stream = client
        .event_stream(&filter, Some(0), None)
        .await
        .map_err(|e| format!("event stream: {e}"))?;
    let event = stream
        .first_event(|e| e.kind == "PluginVolumesRecovered" && e.time_ms >= since_ms)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("the event stream ended")?;
    Ok(event.payload["Message"].as_str().unwrap_or_default().into())
}

/// The plugin the bench runs in the agent's namespace: killed and reaped on drop.
struct PluginProcess(std::process::Child);

impl Drop for PluginProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One restart's figures.
struct Restart {
    api: Duration,
    recovered: Duration,
    cpu: f64,
    calls: BTreeMap<String, usize>,
    message: String,
}

async fn restart(agent: &mut Agent, calls_log: &Path) -> Restart {
    let calls_before = berth_hostpath::calllog::read(calls_log)
        .expect("call log")
        .len();
    agent.kill9();
    let since_ms = berth_sys::now_ms();
    let t0 = Instant::now();
    agent.respawn();
    let client = agent.client();
    common::poll_until(
        "the restarted agent's API answering",
        Duration::from_millis(1),
        RESTART_TIMEOUT,
        || {
            let c = client.clone();
            async move { c.node().await.map(drop).map_err(|e| e.to_string()) }
        },
    )
    .await;
    let api = t0.elapsed();
    let message = tokio::time::timeout(RESTART_TIMEOUT, recovered_event(&client, since_ms))
        .await
        .unwrap_or_else(|_| Err(format!("not within {RESTART_TIMEOUT:?}")))
        .unwrap_or_else(|e| panic!("no PluginVolumesRecovered event: {e}\n{}", agent.log_tail()));
    let recovered = t0.elapsed();
    // The new agent's CPU time since it started.
    let cpu = cpu_ticks(agent.pid()) as f64 / clk_tck();
    let mut calls = BTreeMap::new();
    for c in berth_hostpath::calllog::read(calls_log)
        .expect("call log")
        .into_iter()
        .skip(calls_before)
    {
        *calls.entry(c.rpc).or_insert(0) += 1;
    }
    Restart {
        api,
        recovered,
        cpu,
        calls,
        message,
    }
}

async fn run(o: Opts) -> Vec<String> {
    let mut failures = Vec::new();
    let mut agent = Agent::launch_kept(|tmp| {
        format!(
            "plugin \"{PLUGIN}\" {{\n  type = \"monolith\"\n  socket = \"{}\"\n}}\n",
            tmp.join("hp.sock").display()
        )
    })
    .await;
    let tmp = agent.tmp().to_path_buf();
    let ns = agent.namespace().expect("a kept namespace");
    let _plugin = PluginProcess(
        ns.command(hostpath_binary())
            .arg(format!(
                "--endpoint=unix://{}",
                tmp.join("hp.sock").display()
            ))
            .args(["--nodeid", "n1", "--log-level", "warn", "--enable-stage"])
            .args(["--enable-attach", "--statedir"])
            .arg(tmp.join("hp"))
            .arg("--call-log")
            .arg(tmp.join("calls.log"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("berth-hostpath"),
    );
    agent.wait_plugin_healthy().await;
    let calls_log = agent.tmp().join("calls.log");
    let client = agent.client();

    let ids: Vec<String> = (0..o.volumes).map(|i| format!("r{i}")).collect();
    let t = Instant::now();
    let created = all(&ids, |id| {
        let c = client.clone();
        let req = volume_spec(id, AccessMode::SingleNodeWriter);
        async move {
            c.create_volume(&req)
                .await
                .map(drop)
                .map_err(|e| format!("create {}: {e}", req.file.unwrap_or_default()))
        }
    })
    .await;
    if let Err(e) = created {
        return vec![e];
    }
    let claimed = all(&ids, |id| {
        let c = client.clone();
        let id = id.clone();
        async move {
            c.claim_volume(
                &id,
                &claim_req(&format!("a-{id}"), AccessMode::SingleNodeWriter),
            )
            .await
            .map(drop)
            .map_err(|e| format!("claim {id}: {e}"))
        }
    })
    .await;
    if let Err(e) = claimed {
        return vec![e];
    }
    let mounted = mounts_under(agent.pid(), &agent.data_dir);
    println!(
        "{} volumes created, claimed and mounted in {:.1} s ({} mounts under the data dir: \
         staging and targets)",
        o.volumes,
        t.elapsed().as_secs_f64(),
        mounted.len()
    );

    let mut runs = Vec::new();
    for r in 0..o.restarts {
        let run = restart(&mut agent, &calls_log).await;
        let asked: usize = run
            .calls
            .iter()
            .filter(|(rpc, _)| rpc.as_str() != PROBE)
            .map(|(_, n)| n)
            .sum();
        println!(
            "restart {}: API {:.1} ms, recovered {:.1} ms, agent CPU {:.3} s; plugin calls {:?}; \
             {}",
            r + 1,
            ms(run.api),
            ms(run.recovered),
            run.cpu,
            run.calls,
            run.message
        );
        if asked > 0 {
            failures.push(format!(
                "restart {}: {asked} volume or fingerprint RPCs: {:?}",
                r + 1,
                run.calls
            ));
        }
        let now = mounts_under(agent.pid(), &agent.data_dir);
        if now != mounted {
            failures.push(format!(
                "restart {}: {} mounts under the data dir, {} before",
                r + 1,
                now.len(),
                mounted.len()
            ));
        }
        runs.push(run);
    }
    // Every claim still claimed, as the catalog says after the last restart.
    let list = client.volumes().await.expect("volume list");
    let status = futures::stream::iter(list.volumes.iter().map(|v| client.volume(&v.id)))
        .buffer_unordered(SETUP_CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
    let claimed = status
        .iter()
        .filter(|s| {
            s.as_ref().is_ok_and(|s| {
                s.claims.len() == 1 && s.claims.iter().all(|c| c.state == ClaimState::Claimed)
            })
        })
        .count();
    if claimed != o.volumes {
        failures.push(format!(
            "{claimed} of {} volumes claimed at the end",
            o.volumes
        ));
    }

    let api: Vec<f64> = runs.iter().map(|r| ms(r.api)).collect();
    let rec: Vec<f64> = runs.iter().map(|r| ms(r.recovered)).collect();
    let cpu: Vec<f64> = runs.iter().map(|r| r.cpu).collect();
    let calls: usize = runs.iter().flat_map(|r| r.calls.values()).sum();
    println!(
        "\n{} restarts with {} published volumes: API answering median {:.1} ms (max {:.1}); \
         every volume recovered median {:.1} ms (max {:.1}); agent CPU to then median {:.3} s; \
         plugin calls until recovered, all restarts: {calls}",
        o.restarts,
        o.volumes,
        stats(&api).p50,
        api.iter().copied().fold(0.0, f64::max),
        stats(&rec).p50,
        rec.iter().copied().fold(0.0, f64::max),
        stats(&cpu).p50
    );
    failures
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    common::bench_main(
        "restart",
        USAGE,
        parse_args(),
        run,
        "no volume or fingerprint RPC at restart, every mount kept, every claim claimed",
    )
    .await
}
