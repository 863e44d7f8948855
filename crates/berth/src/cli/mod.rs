//! Command-line parsing and dispatch. Exit codes: 0 ok, 1 error, 2 usage.

mod api_client;
mod csi;
mod node;
mod output;
mod plugin;

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
    /// Log filter (error, warn, info, debug, trace, or a tracing directive).
    #[arg(long, global = true, env = "BERTH_LOG", default_value = "warn")]
    pub log_level: String,
    /// Log format.
    #[arg(long, global = true, env = "BERTH_LOG_FORMAT", value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
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
    /// Talk to a CSI plugin socket directly, for debugging plugins.
    Csi(Box<csi::CsiArgs>),
    /// CSI plugins registered with the agent.
    Plugin(plugin::PluginArgs),
    /// This node as the agent sees it.
    Node(node::NodeArgs),
}

/// Sets up the tracing subscriber on stderr.
pub fn init_logging(args: &LogArgs) {
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Runs the parsed command.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Csi(args) => csi::run(*args).await,
        Command::Plugin(args) => plugin::run(&cli.address, args).await,
        Command::Node(args) => node::run(&cli.address, args).await,
    }
}
