//! Benchmark: jobs through a real `berth agent`.
//!
//! Starts the agent in a private mount namespace with a supervised monolith `berth-hostpath`
//! (staging and attaching), then measures:
//!
//! 1. **Start**: each sample runs a one-alloc service job whose `exec` task (`sleep`) mounts one
//!    CSI volume (single-node-writer), and measures the time from `POST /v1/jobs` to the task's
//!    process started (its `started_at`, stamped by the agent) and to the alloc seen running
//!    through the API (polled every millisecond). The baseline, interleaved sample by sample, is
//!    the same job without the volume. After each sample the job is stopped and its volume
//!    released, outside the timing.
//! 2. **Parallel**: one job with `count = --allocs`, each alloc with its own volume
//!    (`per_alloc`), started at once: per-alloc start latency (`started_at` minus the time of
//!    the request), wall time until every task runs, and the agent's CPU time. The baseline is
//!    the same job without volumes. Every volume must be claimed and mounted, and after the stop
//!    nothing may stay mounted or claimed.
//!
//! `cargo bench -p berth --bench jobs [-- --samples 100 --allocs 50]`; `-- --quick` is a smoke
//! run (10 samples, 10 allocs). Needs root and util-linux (`unshare`, `setpriv`).

mod common;

use std::{
    path::Path,
    process::ExitCode,
    time::{Duration, Instant, SystemTime},
};

use berth_api::{
    Client,
    jobs::{ClientStatus, JobRunRequest, JobStatus},
    volumes::{SpecFormat, VolumeSpecRequest},
};
use common::{
    Agent, CpuMeter, Options, PLUGIN, hostpath_binary, mounts_under, ms, poll_until, print_cpu,
    row, stats,
};

const USAGE: &str = "\
usage: jobs [--samples N] [--warmup N] [--allocs A] [--quick]
  --samples N  single-alloc starts with a volume and without, interleaved (default 100)
  --warmup N   starts of each kind run first and not counted (default 5)
  --allocs A   allocs of the parallel run, each with its own volume (default 50)
  --quick      smoke run: 10 samples, 1 warm-up, 10 allocs (flags given still win)";

/// How long any one wait of the bench may take before it fails.
const WAIT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy)]
struct Opts {
    samples: usize,
    warmup: usize,
    allocs: usize,
}

fn parse_args() -> Result<Opts, String> {
    let args = Options::parse(&["--samples", "--warmup", "--allocs"])?;
    let (samples, warmup, allocs) = if args.quick {
        (10, 1, 10)
    } else {
        (100, 5, 50)
    };
    let o = Opts {
        samples: args.count("--samples", samples)?,
        warmup: args.count("--warmup", warmup)?,
        allocs: args.count("--allocs", allocs)?,
    };
    if o.samples == 0 || o.allocs == 0 {
        return Err("--samples and --allocs must be at least 1".into());
    }
    Ok(o)
}

/// A service job of `count` allocs, each running `sleep` under `exec`; with `volume`, each
/// mounts that CSI volume (its own copy, `volume[index]`, when `count` > 1) at `dest`.
fn job_spec(id: &str, count: usize, volume: Option<&str>, dest: &Path) -> String {
    let (group_volume, mount) = match volume {
        Some(source) => (
            format!(
                "    volume \"data\" {{\n      type = \"csi\"\n      source = \"{source}\"\n      \
                 access_mode = \"single-node-writer\"\n      per_alloc = {}\n    }}\n",
                count > 1
            ),
            format!(
                "      volume_mount {{\n        volume = \"data\"\n        destination = \"{}\"\n      \
                 }}\n",
                dest.display()
            ),
        ),
        None => (String::new(), String::new()),
    };
    format!(
        "job \"{id}\" {{\n  type = \"service\"\n  group \"g\" {{\n    count = {count}\n\
         {group_volume}    task \"main\" {{\n      driver = \"exec\"\n      config {{\n        \
         command = \"/bin/sleep\"\n        args = [\"3600\"]\n      }}\n{mount}      \
         kill_timeout = \"2s\"\n    }}\n  }}\n}}\n"
    )
}

async fn create_volume(client: &Client, id: &str) {
    let spec = format!(
        "id = \"{id}\"\ntype = \"csi\"\nplugin_id = \"{PLUGIN}\"\ncapacity_min = \"1MiB\"\n\
         capability {{\n  access_mode = \"single-node-writer\"\n  \
         attachment_mode = \"file-system\"\n}}\n"
    );
    client
        .create_volume(&VolumeSpecRequest {
            spec,
            format: SpecFormat::Hcl,
            file: Some(format!("{id}.hcl")),
        })
        .await
        .unwrap_or_else(|e| panic!("create volume {id}: {e}"));
}

fn running(s: &JobStatus, count: usize) -> bool {
    s.allocs.len() == count
        && s.allocs.iter().all(|a| {
            a.client_status == ClientStatus::Running && a.tasks.values().all(|t| t.pid.is_some())
        })
}

/// Polls the job every `poll` until `pred` holds; the status that did, and when it was seen.
/// An alloc that ends on the way fails the bench.
async fn wait_job(
    client: &Client,
    id: &str,
    poll: Duration,
    pred: impl Fn(&JobStatus) -> bool,
) -> (JobStatus, Instant) {
    poll_until(&format!("job {id}"), poll, WAIT, || async {
        let s = client
            .job(id)
            .await
            .unwrap_or_else(|e| panic!("status of job {id}: {e}"));
        if pred(&s) {
            return Ok((s, Instant::now()));
        }
        if let Some(a) = s.allocs.iter().find(|a| a.client_status.is_terminal()) {
            panic!(
                "job {id}: alloc {} ended ({:?}): {:?}",
                a.alloc_id, a.client_status, a.failure
            );
        }
        Err(format!("{s:#?}"))
    })
    .await
}

/// When each alloc's task started, measured from `t0`, in ms.
fn start_latencies(s: &JobStatus, t0: SystemTime) -> Vec<f64> {
    s.allocs
        .iter()
        .flat_map(|a| a.tasks.values())
        .map(|t| {
            let started = t.started_at.expect("a running task has started_at");
            ms(started.duration_since(t0).unwrap_or(Duration::ZERO))
        })
        .collect()
}

/// Runs `spec` and waits until its `count` allocs run: (time to each task's process start in
/// ms, time until seen running through the API, time until `job run` answered, the running
/// status).
async fn run_until_running(
    client: &Client,
    id: &str,
    spec: String,
    count: usize,
    poll: Duration,
) -> (Vec<f64>, Duration, Duration, JobStatus) {
    let req = JobRunRequest {
        spec,
        format: SpecFormat::Hcl,
        file: Some(format!("{id}.hcl")),
        ..Default::default()
    };
    let t0 = SystemTime::now();
    let start = Instant::now();
    client
        .run_job(&req)
        .await
        .unwrap_or_else(|e| panic!("run job {id}: {e}"));
    let answered = start.elapsed();
    let (status, seen) = wait_job(client, id, poll, |s| running(s, count)).await;
    (start_latencies(&status, t0), seen - start, answered, status)
}

/// Stops job `id` and waits until its allocs completed and `volumes` have no claim.
async fn stop_and_release(client: &Client, id: &str, volumes: &[String]) {
    client
        .stop_job(id)
        .await
        .unwrap_or_else(|e| panic!("stop job {id}: {e}"));
    let every = Duration::from_millis(5);
    poll_until(&format!("stop of job {id}"), every, WAIT, || async {
        let s = client
            .job(id)
            .await
            .unwrap_or_else(|e| panic!("status of job {id}: {e}"));
        if s.allocs
            .iter()
            .all(|a| a.client_status == ClientStatus::Complete)
        {
            Ok(())
        } else {
            Err(format!("{s:#?}"))
        }
    })
    .await;
    for v in volumes {
        poll_until(&format!("release of {v}"), every, WAIT, || async {
            let st = client
                .volume(v)
                .await
                .unwrap_or_else(|e| panic!("status of volume {v}: {e}"));
            if st.claims.is_empty() && st.usages.is_empty() {
                Ok(())
            } else {
                Err(format!("{st:#?}"))
            }
        })
        .await;
    }
}

/// Every volume of `s` claimed with a target mounted in the agent's namespace.
fn check_mounted(agent: &Agent, s: &JobStatus) -> Result<(), String> {
    let mounted = mounts_under(agent.pid(), &agent.data_dir);
    for a in &s.allocs {
        for (name, v) in &a.volumes {
            match &v.target {
                Some(t) if v.claimed && mounted.contains(t) => {}
                _ => {
                    return Err(format!(
                        "alloc {} volume {name}: not mounted: {v:?}",
                        a.alloc_id
                    ));
                }
            }
        }
    }
    Ok(())
}

async fn bench_start(opts: Opts, agent: &Agent, dest: &Path) -> Vec<String> {
    let client = agent.client();
    let vol = "one".to_string();
    create_volume(&client, &vol).await;
    let vols = [vol.clone()];
    let poll = Duration::from_millis(1);
    let mut failures = Vec::new();
    let (mut v_start, mut v_seen, mut n_start, mut n_seen) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..opts.warmup + opts.samples {
        let counted = i >= opts.warmup;
        // Alternate which goes first, so neither always follows the other.
        for with_volume in [i % 2 == 0, i % 2 != 0] {
            let id = format!("{}-{i}", if with_volume { "vol" } else { "novol" });
            let volume = with_volume.then_some(vol.as_str());
            let spec = job_spec(&id, 1, volume, dest);
            let (start, seen, _, status) = run_until_running(&client, &id, spec, 1, poll).await;
            if with_volume && let Err(e) = check_mounted(agent, &status) {
                failures.push(e);
            }
            stop_and_release(&client, &id, if with_volume { &vols[..] } else { &[] }).await;
            if counted {
                let (s, v) = if with_volume {
                    (&mut v_start, &mut v_seen)
                } else {
                    (&mut n_start, &mut n_seen)
                };
                s.extend(start);
                v.push(ms(seen));
            }
        }
    }
    println!(
        "\n1. Start: `job run` of one exec task → running (n={}, {} warm-up, interleaved)",
        opts.samples, opts.warmup
    );
    println!(
        "  {:<40} {:>8} {:>8} {:>8} {:>8}",
        "ms", "median", "p90", "p99", "max"
    );
    let vs = row("with a CSI volume: process started", &v_start);
    let vv = row("with a CSI volume: seen running (API)", &v_seen);
    let ns = row("no volume: process started", &n_start);
    let nv = row("no volume: seen running (API)", &n_seen);
    println!(
        "  with/without volume: process started median {:.2}x (p90 {:.2}x), seen running \
         median {:.2}x; the volume adds {:.2} ms (median difference)",
        vs.p50 / ns.p50,
        vs.p90 / ns.p90,
        vv.p50 / nv.p50,
        vs.p50 - ns.p50
    );
    failures
}

/// One parallel run: `count` allocs of one job started at once.
struct Parallel {
    start: Vec<f64>,
    answered: Duration,
    wall: Duration,
    cpu: f64,
    plugin_cpu: Option<f64>,
}

async fn parallel_run(
    agent: &Agent,
    id: &str,
    count: usize,
    volume: Option<&str>,
    dest: &Path,
) -> (Parallel, JobStatus) {
    let client = agent.client();
    let meter = CpuMeter::start(agent);
    let (start, wall, answered, status) = run_until_running(
        &client,
        id,
        job_spec(id, count, volume, dest),
        count,
        Duration::from_millis(5),
    )
    .await;
    let (cpu, plugin_cpu) = meter.read();
    (
        Parallel {
            start,
            answered,
            wall,
            cpu,
            plugin_cpu,
        },
        status,
    )
}

fn report_parallel(name: &str, count: usize, p: &Parallel) {
    let s = stats(&p.start);
    let wall = p.wall.as_secs_f64();
    println!(
        "  {name}: {}/{count} running; `job run` answered in {:.1} ms",
        p.start.len(),
        ms(p.answered)
    );
    println!(
        "    start per alloc (job run → process started): p50 {:.1} ms, p90 {:.1} ms, \
         p99 {:.1} ms, max {:.1} ms",
        s.p50, s.p90, s.p99, s.max
    );
    println!(
        "    wall time until all seen running: {:.1} ms ({:.0} allocs/s)",
        wall * 1e3,
        count as f64 / wall
    );
    print_cpu(wall, p.cpu, p.plugin_cpu);
}

async fn bench_parallel(opts: Opts, agent: &Agent, dest: &Path) -> Vec<String> {
    let client = agent.client();
    let n = opts.allocs;
    let vols: Vec<String> = (0..n).map(|i| format!("par[{i}]")).collect();
    for v in &vols {
        create_volume(&client, v).await;
    }
    let mut failures = Vec::new();
    let (base, _) = parallel_run(agent, "par-novol", n, None, dest).await;
    stop_and_release(&client, "par-novol", &[]).await;
    let (with, status) = parallel_run(agent, "par-vol", n, Some("par"), dest).await;
    if let Err(e) = check_mounted(agent, &status) {
        failures.push(e);
    }
    let mut claimed = 0;
    for v in &vols {
        let s = client
            .volume(v)
            .await
            .unwrap_or_else(|e| panic!("status of {v}: {e}"));
        claimed += usize::from(!s.claims.is_empty());
    }
    let t = Instant::now();
    stop_and_release(&client, "par-vol", &vols).await;
    let stopped = t.elapsed();
    let left = mounts_under(agent.pid(), &agent.data_dir);

    println!("\n2. Parallel: one job of {n} allocs, started at once");
    report_parallel("no volume (baseline)", n, &base);
    report_parallel("each alloc with its own CSI volume", n, &with);
    let (b, w) = (stats(&base.start), stats(&with.start));
    println!(
        "  with/without volumes: p50 start {:.2}x, p99 start {:.2}x, wall {:.2}x",
        w.p50 / b.p50,
        w.p99 / b.p99,
        with.wall.as_secs_f64() / base.wall.as_secs_f64()
    );
    println!(
        "  {claimed}/{n} volumes claimed while running; stop → all complete and released in \
         {:.0} ms; {} mounts left under the data dir",
        ms(stopped),
        left.len()
    );
    if claimed != n {
        failures.push(format!("{} volumes not claimed", n - claimed));
    }
    if !left.is_empty() {
        failures.push(format!("left mounted under the data dir: {left:?}"));
    }
    failures
}

async fn run(opts: Opts) -> Vec<String> {
    let hostpath = hostpath_binary();
    let agent = Agent::start(&hostpath).await;
    // The tasks' mount point: exec makes it on the host, so it lies in the agent's temp dir.
    let dest = agent.data_dir.with_file_name("task-data");
    println!(
        "berth jobs bench: {} cores; samples {}, warm-up {}, allocs {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        opts.samples,
        opts.warmup,
        opts.allocs
    );
    println!(
        "agent pid {} (data dir {}), its berth-hostpath pid {}",
        agent.pid(),
        agent.data_dir.display(),
        agent
            .plugin_pid()
            .map_or("?".into(), |p: u32| p.to_string()),
    );
    let mut failures = bench_start(opts, &agent, &dest).await;
    failures.extend(bench_parallel(opts, &agent, &dest).await);
    failures
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    common::bench_main(
        "jobs",
        USAGE,
        parse_args(),
        run,
        "every alloc ran with its volume mounted; nothing left after stop",
    )
    .await
}
