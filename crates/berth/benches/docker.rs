//! Benchmark: the time from `job run` to the task running, with a `docker` task (a busybox
//! container through podman and runc) against the same task with `exec`, interleaved sample by
//! sample through one real agent (medians and their ratio). Each sample is a one-alloc service
//! job running `sleep`; it is stopped (its container removed) outside the timing.
//!
//! `cargo bench -p berth --bench docker [-- --samples 30]`; `-- --quick` is a smoke run (5
//! samples). Needs root, podman, runc and busybox-static.

mod common;

use std::{
    process::ExitCode,
    time::{Duration, Instant},
};

use berth_api::{
    Client,
    jobs::{ClientStatus, JobRunRequest},
    volumes::SpecFormat,
};
use common::{Agent, Options, ms, poll_until, row};

const IMAGE: &str = "localhost/berth-busybox:bench";
const WAIT: Duration = Duration::from_secs(60);

fn job(id: &str, driver: &str) -> String {
    let config = if driver == "docker" {
        format!(
            "image = \"{IMAGE}\"\n        command = \"sleep\"\n        args = [\"600\"]\n        network_mode = \"none\""
        )
    } else {
        "command = \"/bin/sleep\"\n        args = [\"600\"]".to_string()
    };
    format!(
        "job \"{id}\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"{driver}\"\n      config {{\n        {config}\n      }}\n      kill_timeout = \"1s\"\n    }}\n  }}\n}}\n"
    )
}

/// Runs job `id` and returns the time until its task is seen running (polled every ms).
async fn start(client: &Client, id: &str, driver: &str) -> Duration {
    let req = JobRunRequest {
        spec: job(id, driver),
        format: SpecFormat::Hcl,
        file: Some(format!("{id}.hcl")),
        ..Default::default()
    };
    let t0 = Instant::now();
    client
        .run_job(&req)
        .await
        .unwrap_or_else(|e| panic!("{id}: {e}"));
    poll_until(
        &format!("job {id} running"),
        Duration::from_millis(1),
        WAIT,
        || async {
            let s = client.job(id).await.map_err(|e| e.to_string())?;
            match s.allocs.first() {
                Some(a)
                    if a.client_status == ClientStatus::Running
                        && a.tasks.values().all(|t| t.pid.is_some()) =>
                {
                    Ok(())
                }
                Some(a) if a.client_status.is_terminal() => panic!("{id}: {:?}", a.failure),
                _ => Err("not yet".into()),
            }
        },
    )
    .await;
    t0.elapsed()
}

async fn stop(client: &Client, id: &str) {
    client
        .stop_job(id)
        .await
        .unwrap_or_else(|e| panic!("stop {id}: {e}"));
    poll_until(
        &format!("job {id} stopped"),
        Duration::from_millis(5),
        WAIT,
        || async {
            let s = client.job(id).await.map_err(|e| e.to_string())?;
            if s.allocs.iter().all(|a| a.client_status.is_terminal()) {
                Ok(())
            } else {
                Err("running".into())
            }
        },
    )
    .await;
}

#[tokio::main]
async fn main() -> ExitCode {
    let opts = match Options::parse(&["--samples"]) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}\nusage: docker [--samples N] [--quick]");
            return ExitCode::from(2);
        }
    };
    let samples = opts.value("--samples", if opts.quick { 5 } else { 30 }) as usize;
    let podman = berth_testkit::TestPodman::new();
    podman.build_image(IMAGE, &[], None);
    let (root, run) = (podman.root(), podman.run_root());
    let agent = Agent::launch(move |_| {
        format!(
            "plugin \"docker\" {{\n  config {{\n    storage_root = \"{}\"\n    run_root = \"{}\"\n  }}\n}}\n",
            root.display(),
            run.display()
        )
    })
    .await;
    let client = agent.client();
    let (mut docker, mut exec) = (Vec::new(), Vec::new());
    // One warm-up of each, not counted.
    for i in 0..=samples {
        for (driver, out) in [("docker", &mut docker), ("exec", &mut exec)] {
            let id = format!("{driver}-{i}");
            let took = start(&client, &id, driver).await;
            stop(&client, &id).await;
            if i > 0 {
                out.push(ms(took));
            }
        }
    }
    println!("job run -> task running, {samples} samples each, interleaved (ms)");
    println!(
        "  {:<40} {:>8} {:>8} {:>8} {:>8}",
        "", "p50", "p90", "p99", "max"
    );
    let d = row("docker (podman + runc)", &docker);
    let e = row("exec", &exec);
    println!("  ratio of medians docker / exec: {:.2}", d.p50 / e.p50);
    drop(agent);
    ExitCode::SUCCESS
}
