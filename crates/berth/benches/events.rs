//! Benchmark: the event stream on one real agent. A batch job of many `raw_exec` allocs fills
//! the event window (every alloc's received, started, exited, complete… events) while a live
//! reader counts how fast events reach it; then a reader replays the whole window from index 0,
//! sample after sample. Reports the replay's time and throughput (medians) and its ratio to the
//! live rate measured in the same run.
//!
//! `cargo bench -p berth --bench events [-- --samples 15 --allocs 200]`; `-- --quick` is a smoke
//! run (3 samples, 40 allocs).

mod common;

use std::{
    process::ExitCode,
    time::{Duration, Instant},
};

use berth_api::{
    Client,
    jobs::JobRunRequest,
    stream::{StreamLine, TopicFilter},
    volumes::SpecFormat,
};
use common::{Agent, Options, ms, poll_until, stats};

const WAIT: Duration = Duration::from_secs(300);

fn job(allocs: u64) -> String {
    format!(
        "job \"fill\" {{\n  type = \"batch\"\n  group \"g\" {{\n    count = {allocs}\n    task \"t\" {{\n      driver = \"raw_exec\"\n      config {{\n        command = \"/bin/true\"\n      }}\n    }}\n  }}\n}}\n"
    )
}

/// Reads every event after `after` up to `last`: how many, and how many bytes of JSON.
async fn read_to(client: &Client, after: u64, last: u64) -> (u64, usize) {
    let mut stream = client
        .event_stream(&TopicFilter::default(), Some(after), None)
        .await
        .expect("event stream");
    let (mut n, mut bytes) = (0u64, 0usize);
    loop {
        match stream.next().await.expect("open").expect("a line") {
            StreamLine::Events { index, events } => {
                n += events.len() as u64;
                bytes += events
                    .iter()
                    .map(|e| serde_json::to_vec(e).map_or(0, |v| v.len()))
                    .sum::<usize>();
                if index >= last {
                    return (n, bytes);
                }
            }
            StreamLine::Missed { missed } => panic!("the window lost {missed:?}"),
            StreamLine::Heartbeat {} => {}
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let opts = match Options::parse(&["--samples", "--allocs"]) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}\nusage: events [--samples N] [--allocs N] [--quick]");
            return ExitCode::from(2);
        }
    };
    let samples = opts.value("--samples", if opts.quick { 3 } else { 15 }) as usize;
    let allocs = opts.value("--allocs", if opts.quick { 40 } else { 200 });
    let agent = Agent::launch(|_| "events {\n  window = 200000\n}\n".to_string()).await;
    let client = agent.client();

    // Live: a reader from now on, while the job fills the window.
    let start_index = {
        let s = client
            .event_stream(&TopicFilter::default(), None, None)
            .await
            .expect("stream");
        s.index().expect("index header")
    };
    // Told the last index once the job is done; it reads up to there.
    let (until_tx, mut until) = tokio::sync::watch::channel(u64::MAX);
    let live = {
        let client = client.clone();
        tokio::spawn(async move {
            let mut stream = client
                .event_stream(&TopicFilter::default(), Some(start_index), None)
                .await
                .expect("stream");
            let mut times: Vec<(Instant, u64)> = Vec::new();
            loop {
                let target = *until.borrow_and_update();
                if times.last().is_some_and(|l| l.1 >= target) {
                    return times;
                }
                tokio::select! {
                    line = stream.next() => match line {
                        Some(Ok(StreamLine::Events { events, .. })) => {
                            let now = Instant::now();
                            times.extend(events.iter().map(|e| (now, e.index)));
                        }
                        Some(Ok(_)) => {}
                        _ => return times,
                    },
                    _ = until.changed() => {}
                }
            }
        })
    };
    client
        .run_job(&JobRunRequest {
            spec: job(allocs),
            format: SpecFormat::Hcl,
            file: Some("fill.hcl".into()),
            ..Default::default()
        })
        .await
        .expect("job run");
    poll_until(
        "every alloc complete",
        Duration::from_millis(50),
        WAIT,
        || async {
            let s = client.job("fill").await.map_err(|e| e.to_string())?;
            if s.allocs.iter().all(|a| a.client_status.is_terminal()) {
                Ok(())
            } else {
                Err("running".into())
            }
        },
    )
    .await;
    let done_at = client
        .event_stream(&TopicFilter::default(), None, None)
        .await
        .expect("stream")
        .index()
        .expect("index");
    until_tx.send_replace(done_at);
    let live = tokio::time::timeout(Duration::from_secs(60), live)
        .await
        .expect("the live reader saw every alloc finish")
        .expect("live reader");
    let live_span = live.last().map(|l| l.0).zip(live.first().map(|f| f.0));
    let live_rate = match live_span {
        Some((last, first)) if last > first => {
            live.len() as f64 / last.duration_since(first).as_secs_f64()
        }
        _ => f64::NAN,
    };
    let last = done_at;

    // Replay the whole window, sample after sample (one warm-up first).
    let mut took = Vec::new();
    let mut rates = Vec::new();
    let mut size = (0, 0);
    for i in 0..=samples {
        let t0 = Instant::now();
        let got = read_to(&client, 0, last).await;
        let elapsed = t0.elapsed();
        assert!(
            got.0 >= last,
            "every event of the window: {} of {last}",
            got.0
        );
        size = got;
        if i > 0 {
            took.push(ms(elapsed));
            rates.push(got.0 as f64 / elapsed.as_secs_f64());
        }
    }
    let t = stats(&took);
    let r = stats(&rates);
    println!(
        "event stream: {} events in the window ({:.1} KiB of JSON), {allocs} allocs",
        size.0,
        size.1 as f64 / 1024.0
    );
    println!(
        "  replay from index 0: p50 {:.1} ms, p90 {:.1} ms; p50 {:.0} events/s ({:.1} MiB/s)",
        t.p50,
        t.p90,
        r.p50,
        r.p50 * (size.1 as f64 / size.0.max(1) as f64) / (1024.0 * 1024.0)
    );
    println!(
        "  live while the job ran: {} events at {:.0} events/s",
        live.len(),
        live_rate
    );
    println!(
        "  ratio replay / live rate: {:.1}",
        r.p50 / live_rate.max(f64::MIN_POSITIVE)
    );
    drop(agent);
    ExitCode::SUCCESS
}
