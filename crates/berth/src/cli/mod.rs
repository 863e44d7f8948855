//! Command-line parsing and dispatch. Exit codes: 0 ok, 1 error, 2 usage.

mod agent;
mod alloc;
mod api_client;
mod csi;
mod job;
mod node;
mod output;
mod plugin;
mod volume;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// A usage mistake found after parsing (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// berth: a node agent that attaches CSI storage, devices and task drivers to workloads.
#[derive(Debug, Parser)]
#[command(name = "berth", version, about, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub log: LogArgs,
    /// The agent's API: unix:///path/berth.sock, /path/berth.sock or http://127.0.0.1:PORT.
    #[arg(long, global = true, env = "BERTH_ADDR", default_value = berth_api::DEFAULT_ADDRESS)]
    pub address: String,
    #[command(subcommand)]
    command: Command,
}

/// Logging flags, shared by every command.
#[derive(Debug, Args)]
pub struct LogArgs {
    /// Log filter (error, warn, info, debug, trace, or a tracing directive). Default: the
    /// agent's config `log_level`, else `info` for `berth agent` and `warn` for the rest.
    #[arg(long, global = true, env = "BERTH_LOG")]
    pub log_level: Option<String>,
    /// Log format (default: the agent's config `log_format`, else human).
    #[arg(long, global = true, env = "BERTH_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
}

/// How logs are written (to stderr).
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    /// For people.
    Human,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node agent (until SIGINT/SIGTERM).
    Agent(agent::AgentArgs),
    /// Talk to a CSI plugin socket directly, for debugging plugins.
    Csi(Box<csi::CsiArgs>),
    /// CSI plugins registered with the agent.
    Plugin(plugin::PluginArgs),
    /// This node as the agent sees it.
    Node(node::NodeArgs),
    /// Volumes: register, create, status, claims, snapshots.
    Volume(volume::VolumeArgs),
    /// Jobs: run, stop, status.
    Job(job::JobArgs),
    /// Allocs: status with tasks, volumes and events.
    Alloc(alloc::AllocArgs),
}

/// What is settled before the runtime starts: the agent's config (it may set logging).
#[derive(Debug, Default)]
pub struct Prepared {
    agent_config: Option<berth_agent::config::Config>,
}

/// Reads what the command needs before logging starts. A bad config file is a usage error.
pub fn prepare(cli: &Cli) -> anyhow::Result<Prepared> {
    match &cli.command {
        Command::Agent(args) => Ok(Prepared {
            agent_config: Some(agent::load_config(args)?),
        }),
        _ => Ok(Prepared::default()),
    }
}

/// Sets up the tracing subscriber on stderr: flags first, then the agent config, then the
/// command's default.
pub fn init_logging(args: &LogArgs, prepared: &Prepared) -> anyhow::Result<()> {
    let cfg = prepared.agent_config.as_ref();
    let level = args
        .log_level
        .clone()
        .or_else(|| cfg.and_then(|c| c.log_level.clone()))
        .unwrap_or_else(|| {
            if cfg.is_some() {
                "info".into()
            } else {
                "warn".into()
            }
        });
    let filter = tracing_subscriber::EnvFilter::try_new(&level)
        .map_err(|e| UsageError(format!("--log-level {level:?}: {e}")))?;
    let json = match args.log_format {
        Some(f) => matches!(f, LogFormat::Json),
        None => cfg.and_then(|c| c.log_format.as_deref()) == Some("json"),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
    Ok(())
}

/// Runs the parsed command.
pub async fn run(cli: Cli, prepared: Prepared) -> anyhow::Result<()> {
    match cli.command {
        Command::Agent(args) => agent::run(args, prepared.agent_config.unwrap_or_default()).await,
        Command::Csi(args) => csi::run(*args).await,
        Command::Plugin(args) => plugin::run(&cli.address, args).await,
        Command::Node(args) => node::run(&cli.address, args).await,
        Command::Volume(args) => volume::run(&cli.address, args).await,
        Command::Job(args) => job::run(&cli.address, args).await,
        Command::Alloc(args) => alloc::run(&cli.address, args).await,
    }
}
