//! Following a long operation: `job run` until its allocs run (service) or finish (batch),
//! `job stop` until its allocs are stopped, and any slow call, with progress lines and Ctrl-C.
//!
//! What is shown comes from the job's status, read again whenever the agent's event stream
//! says something about the job (or every [`POLL`] when the agent keeps no stream, or the
//! job's allocs run on other nodes of a fleet): every alloc event is printed once, in order.

use std::{
    collections::BTreeMap,
    future::Future,
    time::{Duration, SystemTime},
};

use berth_api::{
    Client,
    jobs::{AllocEvent, AllocStatus, ClientStatus, EventKind, JobStatus, TaskRunState},
    stream::{StreamLine, TopicFilter},
};

use crate::say;

use super::output::{escape, quoted};

/// How often the job's status is read without a word from the event stream.
const POLL: Duration = Duration::from_millis(500);

/// After this long, a slow call says it is still waiting.
const SLOW: Duration = Duration::from_secs(2);

/// The user pressed Ctrl-C: the operation goes on at the agent; exit code 130.
#[derive(Debug, thiserror::Error)]
#[error("interrupted; {0}")]
pub struct Interrupted(pub String);

/// What a job run is waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// Every alloc running (or, for a batch job, finished).
    Placed,
    /// Every alloc stopped.
    Stopped,
}

/// Where the watch stands for one alloc.
#[derive(Debug, Default)]
struct Seen {
    /// Events printed (kept and dropped ones counted).
    events: u64,
    status: Option<ClientStatus>,
    /// Tasks whose "starting" was printed, by the start it was printed for.
    starting: BTreeMap<String, u32>,
}

/// Follows `job` (as the run or stop answered) until `until` holds; prints progress lines.
/// Fails when an alloc failed (run) and on Ctrl-C.
pub async fn follow_job(client: &Client, job: &JobStatus, until: Until) -> anyhow::Result<()> {
    // The job's allocs, and the volume events of its allocs (a claim step the volume layer
    // retries shows there first).
    let mut terms = vec![format!("Allocation:{}", job.id), format!("Job:{}", job.id)];
    terms.extend(
        job.allocs
            .iter()
            .take(berth_api::stream::MAX_TOPIC_TERMS - 2)
            .map(|a| format!("CSIVolume:{}", a.alloc_id)),
    );
    let filter = TopicFilter::parse(terms.iter().map(String::as_str)).ok();
    let mut stream = match (job.event_index, filter) {
        (Some(index), Some(filter)) => client
            .event_stream(&filter, Some(index), Some(POLL))
            .await
            .ok(),
        _ => None,
    };
    let mut seen: BTreeMap<String, Seen> = BTreeMap::new();
    let mut status = job.clone();
    let interrupt = tokio::signal::ctrl_c();
    tokio::pin!(interrupt);
    loop {
        for a in &status.allocs {
            print_progress(a, seen.entry(a.alloc_id.clone()).or_default())?;
        }
        if let Some(verdict) = verdict(&status, until) {
            return verdict;
        }
        tokio::select! {
            biased;
            _ = &mut interrupt => {
                return Err(Interrupted(format!(
                    "the agent goes on; see `berth job status {}`",
                    status.id
                )).into());
            }
            r = wake(&mut stream) => r?,
        }
        status = match client.job(&job.id).await {
            Ok(s) => s,
            // Purged: it finished stopping.
            Err(e) if e.is_not_found() && until == Until::Stopped => {
                say!("==> Job {} stopped and purged", quoted(&job.id))?;
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
    }
}

/// Follows one alloc's stop until it has stopped.
pub async fn follow_alloc_stop(client: &Client, first: AllocStatus) -> anyhow::Result<()> {
    let id = first.alloc_id.clone();
    let mut seen = Seen::default();
    let mut alloc = first;
    let interrupt = tokio::signal::ctrl_c();
    tokio::pin!(interrupt);
    loop {
        print_progress(&alloc, &mut seen)?;
        if alloc.client_status.is_terminal() {
            return say!("==> Alloc {} stopped", escape(&id));
        }
        tokio::select! {
            biased;
            _ = &mut interrupt => {
                return Err(Interrupted(format!(
                    "the agent goes on; see `berth alloc status {id}`"
                )).into());
            }
            () = tokio::time::sleep(POLL) => {}
        }
        alloc = client.alloc(&id).await?;
    }
}

/// Waits for a line of the stream (any line: the status is read again), or [`POLL`] without
/// a stream; prints the volume layer's failed claim steps it carries. A stream that ends (the
/// agent restarts) is given up for polling.
async fn wake(stream: &mut Option<berth_api::client::StreamReader>) -> anyhow::Result<()> {
    let Some(s) = stream else {
        tokio::time::sleep(POLL).await;
        return Ok(());
    };
    match tokio::time::timeout(POLL * 4, s.next()).await {
        Ok(Some(Ok(StreamLine::Events { events, .. }))) => {
            for e in events.iter().filter(|e| {
                e.topic == berth_api::stream::Topic::CsiVolume && e.kind == "VolumeStepFailed"
            }) {
                let field = |k: &str| e.payload.get(k).and_then(|v| v.as_str()).unwrap_or("");
                say!(
                    "    {} alloc {}: claiming volume {}: {}; retrying",
                    time(SystemTime::UNIX_EPOCH + Duration::from_millis(e.time_ms)),
                    escape(field("Alloc")),
                    quoted(&e.key),
                    escape(field("Message"))
                )?;
            }
        }
        Ok(Some(Ok(_))) | Err(_) => {}
        Ok(None | Some(Err(_))) => {
            *stream = None;
            tokio::time::sleep(POLL).await;
        }
    }
    Ok(())
}

/// `Some` once the job is where `until` wants it (`Ok`) or cannot get there (`Err`).
fn verdict(job: &JobStatus, until: Until) -> Option<anyhow::Result<()>> {
    if job.allocs.is_empty() {
        return (!job.failures.is_empty() || until == Until::Stopped).then(|| {
            if job.failures.is_empty() {
                Ok(())
            } else {
                Err(anyhow::anyhow!(
                    "job {} placed no alloc: {}",
                    quoted(&job.id),
                    job.failures.join("; ")
                ))
            }
        });
    }
    let n = job.allocs.len();
    let terminal = job
        .allocs
        .iter()
        .filter(|a| a.client_status.is_terminal())
        .count();
    match until {
        Until::Stopped => (terminal == n).then(|| {
            say!("==> Job {}: {n} alloc(s) stopped", quoted(&job.id))?;
            Ok(())
        }),
        Until::Placed => {
            let failed: Vec<&AllocStatus> = job
                .allocs
                .iter()
                .filter(|a| a.client_status == ClientStatus::Failed)
                .collect();
            if let Some(a) = failed.first() {
                return Some(Err(anyhow::anyhow!(
                    "job {}: alloc {} failed: {}",
                    quoted(&job.id),
                    a.alloc_id,
                    a.failure.as_deref().unwrap_or("see `berth alloc status`")
                )));
            }
            if job.stopped {
                return Some(Err(anyhow::anyhow!(
                    "job {} was stopped while it was being placed",
                    quoted(&job.id)
                )));
            }
            let batch = job.job_type == "batch";
            if batch && terminal == n {
                return Some(say!("==> Job {}: {n} alloc(s) complete", quoted(&job.id)));
            }
            let running = job
                .allocs
                .iter()
                .filter(|a| a.client_status == ClientStatus::Running && tasks_up(a))
                .count();
            (!batch && running == n).then(|| {
                say!("==> Job {}: {n} alloc(s) running", quoted(&job.id))?;
                Ok(())
            })
        }
    }
}

/// Every task of `a` runs (or finished well, as a prestart task does).
fn tasks_up(a: &AllocStatus) -> bool {
    a.tasks
        .values()
        .all(|t| t.state == TaskRunState::Running || (t.state == TaskRunState::Dead && !t.failed))
}

/// Prints what is new about `a`: its events, a task that is starting, its status.
fn print_progress(a: &AllocStatus, seen: &mut Seen) -> anyhow::Result<()> {
    let total = a.events_dropped + a.events.len() as u64;
    let new = usize::try_from(total.saturating_sub(seen.events)).unwrap_or(usize::MAX);
    let skip = a.events.len().saturating_sub(new);
    if new > a.events.len() && seen.events > 0 {
        say!(
            "    alloc {}: {} event(s) dropped",
            a.alloc_id,
            new - a.events.len()
        )?;
    }
    for e in a.events.iter().skip(skip) {
        say!(
            "    {} alloc {}: {}",
            time(e.time),
            escape(&a.alloc_id),
            escape(&phrase(e))
        )?;
    }
    seen.events = total;
    for (name, t) in &a.tasks {
        if t.state == TaskRunState::Starting && seen.starting.get(name) != Some(&t.restarts) {
            seen.starting.insert(name.clone(), t.restarts);
            say!(
                "    {} alloc {}: task {} starting",
                time(SystemTime::now()),
                escape(&a.alloc_id),
                quoted(name)
            )?;
        }
    }
    if seen.status != Some(a.client_status) {
        seen.status = Some(a.client_status);
        let why = a
            .failure
            .as_deref()
            .map(|f| format!(": {f}"))
            .unwrap_or_default();
        say!(
            "    {} alloc {}: {}{}",
            time(SystemTime::now()),
            escape(&a.alloc_id),
            a.client_status,
            escape(&why)
        )?;
    }
    Ok(())
}

/// The words for one alloc event.
fn phrase(e: &AllocEvent) -> String {
    let m = &e.message;
    let task = e.task.as_deref().map(quoted);
    match (&e.kind, task) {
        (EventKind::Received, _) => "placed".into(),
        (EventKind::VolumeClaimRetrying, _) => format!("claiming volumes: {m}; retrying"),
        (EventKind::VolumeClaimed, _) => format!("volume mounted: {m}"),
        (EventKind::VolumeClaimFailed, _) => format!("claiming volumes failed: {m}"),
        (EventKind::UpstreamWaiting, _) => format!("waiting for earlier allocs: {m}"),
        (EventKind::Started, Some(t)) => format!("task {t} running ({m})"),
        (EventKind::StartFailed, Some(t)) => format!("task {t} failed to start: {m}"),
        (EventKind::Exited, Some(t)) => format!("task {t} exited: {m}"),
        (EventKind::Restarting, Some(t)) => format!("task {t} restarting: {m}"),
        (EventKind::NotRestarting, Some(t)) => format!("task {t} failed: {m}"),
        (EventKind::Killing, Some(t)) => format!("task {t} stopping: {m}"),
        (kind, Some(t)) => format!("task {t}: {kind:?}: {m}"),
        (kind, None) => format!("{kind:?}: {m}"),
    }
}

fn time(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Runs `call`, saying every few seconds that it is still waiting; Ctrl-C stops waiting (the
/// agent goes on: `after` says where to look).
pub async fn slow_call<T>(
    what: &str,
    after: &str,
    call: impl Future<Output = Result<T, berth_api::ClientError>>,
) -> anyhow::Result<T> {
    let started = tokio::time::Instant::now();
    tokio::pin!(call);
    let interrupt = tokio::signal::ctrl_c();
    tokio::pin!(interrupt);
    loop {
        tokio::select! {
            biased;
            r = &mut call => return r.map_err(Into::into),
            _ = &mut interrupt => {
                return Err(Interrupted(format!("the agent goes on with {what}; {after}")).into());
            }
            () = tokio::time::sleep(SLOW) => {
                eprintln!(
                    "    {what}: still waiting ({})",
                    super::api_client::duration(started.elapsed())
                );
            }
        }
    }
}
