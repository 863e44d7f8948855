//! `berth alloc …`: one alloc with its tasks, volumes and events; its tasks' logs
//! ([`super::alloc_logs`]) and commands run in them ([`super::alloc_exec`]).

use std::time::SystemTime;

use berth_api::jobs::{AllocActionRequest, AllocStats, AllocStatus, TaskRunState, TaskUsage};
use clap::{Args, Subcommand};
use serde::Serialize;

use crate::say;

use super::{
    api_client::{self, ago_time, yes_no},
    job::parse_id,
    output,
};

/// Allocs on this node.
#[derive(Debug, Args)]
pub struct AllocArgs {
    #[command(subcommand)]
    command: AllocCommand,
}

#[derive(Debug, Subcommand)]
enum AllocCommand {
    /// One alloc: its state, its tasks, its volumes and its latest events.
    Status {
        /// The alloc id.
        #[arg(value_parser = parse_id)]
        id: String,
        /// Print the summary fields only, without the tasks, volumes and events.
        #[arg(long)]
        short: bool,
        /// Every event (not only the latest 10), and the node's whole id.
        #[arg(long)]
        verbose: bool,
        /// Print the API's JSON document instead.
        #[arg(long)]
        json: bool,
    },
    /// Stop one alloc: its tasks stop, then its volumes are released; follows until it has
    /// stopped.
    Stop {
        /// The alloc id (or a unique prefix).
        #[arg(value_parser = parse_id)]
        id: String,
        /// Return at once.
        #[arg(long)]
        detach: bool,
    },
    /// Restart an alloc's running tasks (or one) in place; not counted against their restart
    /// policy.
    Restart {
        /// The alloc id (or a unique prefix).
        #[arg(value_parser = parse_id)]
        id: String,
        /// The task (default: every running task).
        #[arg(value_parser = parse_id)]
        task: Option<String>,
        /// The task, as Nomad's `-task` gives it.
        #[arg(long = "task", value_parser = parse_id, conflicts_with = "task")]
        task_flag: Option<String>,
    },
    /// Send a signal to an alloc's running tasks (or one).
    Signal {
        /// The alloc id (or a unique prefix).
        #[arg(value_parser = parse_id)]
        id: String,
        /// The task (default: every running task).
        #[arg(value_parser = parse_id)]
        task: Option<String>,
        /// The signal: SIGHUP, HUP or a number (default SIGKILL, as Nomad's).
        #[arg(short = 's', long, default_value = "SIGKILL")]
        signal: String,
        /// The task, as Nomad's `-task` gives it.
        #[arg(long = "task", value_parser = parse_id, conflicts_with = "task")]
        task_flag: Option<String>,
    },
    /// A task's stdout (or stderr), as it wrote it; -f follows it.
    Logs(super::alloc_logs::LogsArgs),
    /// Run a command inside a running task, with this terminal's input and output.
    Exec(super::alloc_exec::ExecArgs),
}

/// Runs `berth alloc …` against the agent at `address`.
pub async fn run(address: &api_client::AgentAddress, args: AllocArgs) -> anyhow::Result<()> {
    let client = api_client::connect(address)?;
    match args.command {
        AllocCommand::Status {
            id,
            short,
            verbose,
            json,
        } => {
            let alloc = client.alloc(&id).await?;
            if json {
                return output::json(&alloc);
            }
            let node = alloc_node(&client, &alloc, verbose).await?;
            let usage = if !short
                && alloc
                    .tasks
                    .values()
                    .any(|t| t.state == TaskRunState::Running)
            {
                match client.alloc_stats(&alloc.alloc_id).await {
                    Ok(s) => s,
                    // Not here (another node of the fleet) or not served: no usage to show.
                    Err(e) if e.is_not_found() => AllocStats::default(),
                    Err(e) => return Err(e.into()),
                }
            } else {
                AllocStats::default()
            };
            let view = AllocView {
                node,
                usage,
                short,
                verbose,
            };
            print_alloc(&alloc, &view, SystemTime::now())
        }
        AllocCommand::Stop { id, detach } => {
            let alloc = client.stop_alloc(&id).await?;
            say!("Alloc {} is stopping", alloc.alloc_id)?;
            if detach {
                return Ok(());
            }
            super::watch::follow_alloc_stop(&client, alloc).await
        }
        AllocCommand::Restart {
            id,
            task,
            task_flag,
        } => {
            let req = AllocActionRequest {
                task: task.or(task_flag),
                signal: None,
            };
            let done = client.alloc_action(&id, &req).await?;
            say!(
                "Alloc {}: restarting {}",
                done.alloc_id,
                output::escape(&done.tasks.join(", "))
            )
        }
        AllocCommand::Signal {
            id,
            task,
            signal,
            task_flag,
        } => {
            let req = AllocActionRequest {
                task: task.or(task_flag),
                signal: Some(signal.clone()),
            };
            let done = client.alloc_action(&id, &req).await?;
            say!(
                "Alloc {}: {} sent to {}",
                done.alloc_id,
                output::escape(&signal),
                output::escape(&done.tasks.join(", "))
            )
        }
        AllocCommand::Logs(logs) => super::alloc_logs::run(address, logs).await,
        AllocCommand::Exec(exec) => super::alloc_exec::run(address, exec).await,
    }
}

/// What `alloc status` shows besides the alloc: its node, its tasks' use, how much.
struct AllocView {
    node: String,
    usage: AllocStats,
    short: bool,
    verbose: bool,
}

/// Events `alloc status` shows without `--verbose`: the latest ones.
const LATEST_EVENTS: usize = 10;

/// The alloc's node as `name (id)`: where the fleet placed it, else this agent's node; the
/// id cut to 8 characters unless `verbose`.
async fn alloc_node(
    client: &berth_api::Client,
    a: &AllocStatus,
    verbose: bool,
) -> anyhow::Result<String> {
    let placed = match client.job(&a.job_id).await {
        Ok(job) => job
            .placements
            .into_iter()
            .find(|p| p.alloc_id == a.alloc_id)
            .map(|p| (p.node_id, p.node_name)),
        Err(e) if e.is_not_found() => None,
        Err(e) => return Err(e.into()),
    };
    let (id, name) = match placed {
        Some(p) => p,
        None => {
            let node = client.node().await?;
            (node.id, node.name)
        }
    };
    let id = if verbose {
        id
    } else {
        id.chars().take(8).collect()
    };
    Ok(if name.is_empty() {
        id
    } else {
        format!("{name} ({id})")
    })
}

/// `cpu 1.2s, memory 3.4MiB, 2 processes`.
fn usage_line(u: &TaskUsage) -> String {
    format!(
        "cpu {:.1}s, memory {}, {} process{}",
        u.cpu_seconds,
        output::size(i64::try_from(u.rss_bytes).unwrap_or(i64::MAX)),
        u.pids,
        if u.pids == 1 { "" } else { "es" }
    )
}

fn print_alloc(a: &AllocStatus, view: &AllocView, now: SystemTime) -> anyhow::Result<()> {
    let at = |t: Option<SystemTime>| t.map_or_else(|| "-".into(), |t| ago_time(t, now));
    output::fields(&[
        ("id", a.alloc_id.clone()),
        ("job", a.job_id.clone()),
        ("group", a.group.clone()),
        ("index", a.index.to_string()),
        ("node", view.node.clone()),
        ("desired", word(&a.desired)),
        ("status", a.client_status.to_string()),
        ("created", at(a.events.first().map(|e| e.time))),
        ("modified", at(a.events.last().map(|e| e.time))),
        (
            "failure",
            a.failure
                .as_deref()
                .map_or_else(|| "-".into(), str::to_string),
        ),
    ])?;
    if view.short {
        return Ok(());
    }

    say!()?;
    if a.tasks.is_empty() {
        say!("no tasks")?;
    } else {
        let rows: Vec<Vec<String>> = a
            .tasks
            .iter()
            .map(|(name, t)| {
                vec![
                    name.clone(),
                    or_dash(&t.driver),
                    t.state.to_string(),
                    t.pid.map_or_else(|| "-".into(), |p| p.to_string()),
                    t.restarts.to_string(),
                    yes_no(t.failed).into(),
                    yes_no(t.lost).into(),
                    t.last_exit.map_or_else(|| "-".into(), |e| e.to_string()),
                ]
            })
            .collect();
        output::table(
            &[
                "TASK",
                "DRIVER",
                "STATE",
                "PID",
                "RESTARTS",
                "FAILED",
                "LOST",
                "LAST EXIT",
            ],
            &rows,
        )?;
    }

    for (name, t) in &a.tasks {
        let mounts: Vec<String> = t
            .volume_mounts
            .iter()
            .map(|m| {
                format!(
                    "{} → {} ({})",
                    m.volume,
                    m.destination,
                    if m.read_only { "ro" } else { "rw" }
                )
            })
            .collect();
        say!()?;
        say!("Task {}", output::quoted(name))?;
        output::fields(&[
            ("started at", at(t.started_at)),
            ("finished at", at(t.finished_at)),
            ("volume mounts", list_or_dash(&mounts)),
            (
                "usage",
                view.usage
                    .tasks
                    .get(name)
                    .filter(|_| t.state == TaskRunState::Running)
                    .map_or_else(|| "-".into(), usage_line),
            ),
        ])?;
    }

    print_devices(a)?;

    say!()?;
    if a.volumes.is_empty() {
        say!("no volumes")?;
    } else {
        let rows: Vec<Vec<String>> = a
            .volumes
            .iter()
            .map(|(name, v)| {
                vec![
                    name.clone(),
                    v.volume_id.clone(),
                    if v.read_only { "ro" } else { "rw" }.into(),
                    v.access_mode.to_string(),
                    v.attachment_mode.to_string(),
                    or_dash(&v.fs_type),
                    v.mount_flags.clone().unwrap_or_else(|| "-".into()),
                    yes_no(v.claimed).into(),
                    v.target
                        .as_ref()
                        .map_or_else(|| "-".into(), |t| t.display().to_string()),
                ]
            })
            .collect();
        output::table(
            &[
                "VOLUME",
                "VOLUME ID",
                "MODE",
                "ACCESS MODE",
                "ATTACHMENT",
                "FS",
                "FLAGS",
                "CLAIMED",
                "TARGET",
            ],
            &rows,
        )?;
    }

    say!()?;
    if a.events.is_empty() {
        say!("no events")?;
    } else {
        let skip = if view.verbose {
            0
        } else {
            a.events.len().saturating_sub(LATEST_EVENTS)
        };
        let rows: Vec<Vec<String>> = a
            .events
            .iter()
            .skip(skip)
            .map(|e| {
                vec![
                    time(e.time),
                    e.task.clone().unwrap_or_else(|| "-".into()),
                    word(&e.kind),
                    e.message.clone(),
                ]
            })
            .collect();
        output::table(&["TIME", "TASK", "KIND", "MESSAGE"], &rows)?;
        if skip > 0 {
            say!("({skip} older event(s) not shown; --verbose shows them)")?;
        }
    }
    if a.events_dropped > 0 {
        say!("({} older event(s) dropped)", a.events_dropped)?;
    }
    Ok(())
}

/// Each task's devices: what it holds, what it gets for them, their latest statistics.
fn print_devices(a: &AllocStatus) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for (task, t) in &a.tasks {
        for d in &t.devices {
            let stats: Vec<String> = d.stats.iter().map(|(k, v)| format!("{k}: {v}")).collect();
            rows.push(vec![
                task.clone(),
                d.request.clone(),
                d.devices.join(", "),
                list_or_dash(&d.env),
                list_or_dash(&d.mounts),
                list_or_dash(&d.device_nodes),
                list_or_dash(&stats),
            ]);
        }
    }
    if rows.is_empty() {
        return Ok(());
    }
    say!()?;
    output::table(
        &[
            "TASK",
            "DEVICE",
            "INSTANCES",
            "ENV",
            "MOUNTS",
            "DEVICE NODES",
            "STATS",
        ],
        &rows,
    )
}

fn list_or_dash(items: &[String]) -> String {
    if items.is_empty() {
        "-".into()
    } else {
        items.join("; ")
    }
}

/// An enum's word as the API spells it (`run`, `volume_claimed`).
fn word<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        _ => "?".into(),
    }
}

/// A wall-clock time as RFC 3339, to the second.
fn time(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

fn or_dash(s: &str) -> String {
    if s.is_empty() { "-".into() } else { s.into() }
}
