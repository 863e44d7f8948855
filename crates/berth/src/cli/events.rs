//! `berth events`: the agent's event stream, as lines or JSON.

use std::time::{Duration, SystemTime};

use berth_api::stream::{StreamEvent, StreamLine, TopicFilter};
use clap::Args;

use crate::say;

use super::{
    UsageError,
    api_client::{self, AgentAddress},
    output::escape,
};

/// How long the stream may stay quiet before `berth events` without `--follow` takes it that
/// the window has been read.
const CAUGHT_UP_AFTER: Duration = Duration::from_millis(300);

/// The events the agent keeps (nodes, CSI plugins and volumes, jobs, allocs and their tasks,
/// devices), then with `--follow` live ones.
#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Keep reading live events until interrupted.
    #[arg(short = 'f', long)]
    follow: bool,
    /// Only these: `Topic`, `Topic:key` (the key is the object's id, or its job's), `*:key`;
    /// may be repeated. Topics: Node, CSIPlugin, CSIVolume, Job, Allocation, Device.
    #[arg(long = "topic", value_name = "TOPIC[:KEY]")]
    topics: Vec<String>,
    /// Start after this index (the last one already seen); default: the whole window.
    #[arg(long)]
    index: Option<u64>,
    /// One JSON event per line, as the API sends them.
    #[arg(long)]
    json: bool,
}

/// Runs `berth events`.
pub async fn run(address: &AgentAddress, args: EventsArgs) -> anyhow::Result<()> {
    let filter = TopicFilter::parse(args.topics.iter().map(String::as_str))
        .map_err(|e| UsageError(format!("--topic: {}", e.reason)))?;
    let client = api_client::connect(address)?;
    let heartbeat = (!args.follow).then_some(CAUGHT_UP_AFTER);
    let mut stream = client
        .event_stream(&filter, Some(args.index.unwrap_or(0)), heartbeat)
        .await?;
    let newest = stream.index().unwrap_or(0);
    while let Some(line) = stream.next().await {
        match line? {
            StreamLine::Events { index, events } => {
                for e in &events {
                    print_event(e, args.json)?;
                }
                if !args.follow && index >= newest {
                    return Ok(());
                }
            }
            StreamLine::Missed { missed } => {
                eprintln!(
                    "events {} to {} are no longer kept by the agent; going on from {}",
                    missed.from,
                    missed.to,
                    missed.to + 1
                );
            }
            StreamLine::Heartbeat {} if !args.follow => return Ok(()),
            StreamLine::Heartbeat {} => {}
        }
    }
    Ok(())
}

/// `INDEX TIME TOPIC TYPE KEY message`.
fn print_event(e: &StreamEvent, json: bool) -> anyhow::Result<()> {
    if json {
        return say!("{}", serde_json::to_string(e)?);
    }
    let message = e
        .payload
        .get("Message")
        .and_then(|m| m.as_str())
        .unwrap_or("");
    let time =
        humantime::format_rfc3339_millis(SystemTime::UNIX_EPOCH + Duration::from_millis(e.time_ms));
    say!(
        "{:>6} {time} {:<10} {:<24} {} {}",
        e.index,
        e.topic.as_str(),
        escape(&e.kind),
        escape(&e.key),
        escape(message)
    )
}
