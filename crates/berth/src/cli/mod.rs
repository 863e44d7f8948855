//! Command-line parsing and dispatch. Exit codes: 0 ok, 1 error, 2 usage.

mod acl;
mod agent;
mod alloc;
mod alloc_exec;
mod alloc_logs;
mod api_client;
mod csi;
mod events;
mod input;
mod job;
mod node;
pub mod output;
mod plugin;
mod volume;
mod watch;

use clap::{
    Args, CommandFactory as _, FromArgMatches as _, Parser, Subcommand, ValueEnum,
    parser::ValueSource,
};

pub use alloc_exec::RemoteExit;
use api_client::{AddressSource, AgentAddress};
pub use watch::Interrupted;

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
    /// The agent's API: unix:///path/berth.sock, /path/berth.sock, http://127.0.0.1:PORT or
    /// https://HOST:PORT.
    #[arg(long, global = true, env = "BERTH_ADDR", default_value = berth_api::DEFAULT_ADDRESS)]
    pub address: String,
    #[command(flatten)]
    pub auth: api_client::AuthArgs,
    /// Where `address` came from (set by [`parse`]).
    #[arg(skip)]
    address_source: AddressSource,
    #[command(subcommand)]
    command: Command,
}

/// Parses the command line; exits 2 on a usage error and 0 after `--help` or `--version`.
pub fn parse() -> Cli {
    try_parse_from(nomad_style_flags(std::env::args_os())).unwrap_or_else(|e| e.exit())
}

/// Nomad's single-dash long flags that its users type (`berth job run -var k=v -detach`,
/// `berth volume status -type csi -verbose`), rewritten to the double-dash form clap reads.
///
/// Only a word that is a long flag of the command it is given to (or a global one) is
/// rewritten, so a short flag (`-f`) or another program's argument (`alloc exec … ls -la`)
/// passes as typed; nothing after `--`, nor after the first positional of a command that takes
/// a trailing command line, is touched.
fn nomad_style_flags(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    let root = command();
    let mut current = &root;
    let mut out = Vec::new();
    let mut rest = false;
    let mut value_next = false;
    for (i, arg) in args.into_iter().enumerate() {
        let text = arg.to_str().map(str::to_owned);
        let Some(s) = text.filter(|_| i > 0 && !rest) else {
            out.push(arg);
            continue;
        };
        if std::mem::take(&mut value_next) {
            out.push(arg);
            continue;
        }
        if s == "--" {
            rest = true;
            out.push(arg);
            continue;
        }
        if let Some(sub) = current.find_subcommand(&s) {
            current = sub;
            out.push(arg);
            continue;
        }
        let dashed = s.strip_prefix("--").or_else(|| {
            s.strip_prefix('-')
                .filter(|b| b.len() >= 2 && b.starts_with(|c: char| c.is_ascii_alphabetic()))
        });
        if let Some(body) = dashed {
            let (name, value) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (body, None),
            };
            if let Some(flag) = current.get_arguments().find(|a| {
                a.get_long() == Some(name)
                    || a.get_all_aliases()
                        .is_some_and(|aliases| aliases.contains(&name))
            }) {
                value_next = value.is_none() && flag.get_action().takes_values();
                out.push(format!("--{body}").into());
                continue;
            }
        } else if !s.starts_with('-')
            && current
                .get_positionals()
                .any(clap::Arg::is_trailing_var_arg_set)
        {
            // The command line of another program starts here.
            rest = true;
        }
        out.push(arg);
    }
    out
}

fn try_parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let matches = command().try_get_matches_from(args)?;
    let mut cli = Cli::from_arg_matches(&matches)?;
    cli.address_source = address_source(&matches);
    Ok(cli)
}

/// Where `--address` came from: the flag when it was given at any level of the command line
/// (`berth --address A plugin status`, `berth plugin status --address A`), else the
/// environment or the default.
fn address_source(matches: &clap::ArgMatches) -> AddressSource {
    let mut level = Some(matches);
    let mut source = AddressSource::Default;
    while let Some(m) = level {
        match m.value_source("address") {
            Some(ValueSource::CommandLine) => return AddressSource::Flag,
            Some(ValueSource::EnvVariable) => source = AddressSource::Env,
            _ => {}
        }
        level = m.subcommand().map(|(_, sub)| sub);
    }
    source
}

/// The clap command, with usage lines that show what is required and what is optional.
///
/// clap's error messages otherwise print a "smart" usage line built from the flags the user
/// gave, so an optional `--json` reads as if it were required
/// (`berth volume snapshot list --plugin <PLUGIN> --json`). Every command's usage is fixed to
/// the one its `--help` shows (`[OPTIONS]` for the optional flags).
pub fn command() -> clap::Command {
    // `agent` and `csi` do not talk to the agent's API: their own hidden `--address` (which
    // the global one is then not propagated over) is refused in `prepare`.
    let refused = || {
        clap::Arg::new("address")
            .long("address")
            .value_name("ADDRESS")
            .hide(true)
            .global(true)
    };
    let mut cmd = Cli::command()
        .mut_subcommand("agent", |c| c.arg(refused()))
        .mut_subcommand("csi", |c| c.arg(refused()));
    cmd.build();
    fix_usage(&mut cmd);
    cmd
}

fn fix_usage(cmd: &mut clap::Command) {
    for sub in cmd.get_subcommands_mut() {
        fix_usage(sub);
    }
    let usage = cmd.render_usage().to_string();
    let usage = usage.strip_prefix("Usage: ").unwrap_or(&usage).to_string();
    *cmd = std::mem::take(cmd).override_usage(usage);
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
    /// Allocs: status with tasks, volumes and events; task logs; exec.
    Alloc(alloc::AllocArgs),
    /// The agent's event stream: what happened to nodes, plugins, volumes, jobs and allocs.
    Events(events::EventsArgs),
    /// ACL tokens: bootstrap, create, list, delete.
    Acl(acl::AclArgs),
    /// The log collector of a task's output stream, as the agent starts it (not for people).
    #[command(hide = true)]
    Logmon(LogmonArgs),
}

/// `berth logmon …`: its arguments go to the collector as they are.
#[derive(Debug, Args)]
pub struct LogmonArgs {
    #[arg(
        num_args = 0..,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_parser = clap::value_parser!(std::ffi::OsString)
    )]
    args: Vec<std::ffi::OsString>,
}

/// The collector's arguments when the command is `berth logmon`: it runs without the async
/// runtime, logging or the agent's config.
pub fn logmon_args(cli: &Cli) -> Option<Vec<std::ffi::OsString>> {
    match &cli.command {
        Command::Logmon(a) => Some(a.args.clone()),
        _ => None,
    }
}

/// What is settled before the runtime starts: the agent's config (it may set logging).
#[derive(Debug, Default)]
pub struct Prepared {
    agent_config: Option<berth_agent::config::Config>,
}

/// Reads what the command needs before logging starts. A bad config file is a usage error, and
/// so is `--address` given to a command that does not talk to the agent's API.
pub fn prepare(cli: &Cli) -> anyhow::Result<Prepared> {
    let address_flag = cli.address_source == AddressSource::Flag;
    match &cli.command {
        Command::Agent(_) if address_flag => {
            return Err(UsageError(
                "berth agent takes no --address: --address tells the other commands where the \
                 agent is. The agent's own listeners are set in its config file (--config): \
                 api { socket = \"/path/berth.sock\", address = \"127.0.0.1:PORT\" }"
                    .into(),
            )
            .into());
        }
        Command::Csi(_) if address_flag => {
            return Err(UsageError(
                "berth csi takes no --address: it talks to a plugin's socket, given with \
                 --endpoint (or CSI_ENDPOINT)"
                    .into(),
            )
            .into());
        }
        _ => {}
    }
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
    let address = AgentAddress {
        value: cli.address,
        source: cli.address_source,
        auth: cli.auth,
    };
    match cli.command {
        Command::Agent(args) => agent::run(args, prepared.agent_config.unwrap_or_default()).await,
        Command::Csi(args) => csi::run(*args).await,
        Command::Plugin(args) => plugin::run(&address, args).await,
        Command::Node(args) => node::run(&address, args).await,
        Command::Volume(args) => volume::run(&address, args).await,
        Command::Job(args) => job::run(&address, args).await,
        Command::Alloc(args) => alloc::run(&address, args).await,
        Command::Events(args) => events::run(&address, args).await,
        Command::Acl(args) => acl::run(&address, args).await,
        Command::Logmon(args) => {
            // Normally taken before the runtime starts (see `logmon_args`).
            match berth_drivers::logs::collector_main(args.args) {
                code if code == std::process::ExitCode::SUCCESS => Ok(()),
                _ => Err(anyhow::anyhow!("the log collector failed")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command, with its path of names.
    fn all_commands(cmd: &clap::Command, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        path.push(cmd.get_name().to_string());
        out.push(path.clone());
        for sub in cmd.get_subcommands() {
            all_commands(sub, path, out);
        }
        path.pop();
    }

    #[test]
    fn usage_lines_show_optional_flags_as_options_everywhere() {
        let root = command();
        let mut paths = Vec::new();
        all_commands(&root, &mut Vec::new(), &mut paths);
        assert!(paths.len() > 40, "{}", paths.len());
        for path in paths {
            let mut cmd = root.clone();
            for name in &path[1..] {
                cmd = cmd.find_subcommand(name).expect("subcommand").clone();
            }
            let usage = cmd.render_usage().to_string();
            assert!(
                usage.starts_with(&format!("Usage: {}", path.join(" "))),
                "{usage}"
            );
            let optional = cmd
                .get_arguments()
                .any(|a| !a.is_positional() && !a.is_required_set() && !a.is_hide_set());
            assert_eq!(usage.contains("[OPTIONS]"), optional, "{usage}");
        }
    }

    #[test]
    fn usage_errors_show_the_commands_usage_not_the_flags_given() {
        for (args, usage) in [
            (
                &["volume", "snapshot", "list", "--json"][..],
                "Usage: berth volume snapshot list [OPTIONS] --plugin <PLUGIN>\n",
            ),
            (
                &["csi", "--json", "volume", "create", "--required-bytes", "5"],
                "Usage: berth csi volume create [OPTIONS] --name <NAME>\n",
            ),
            (
                &["volume", "status", "--json", "--bogus"],
                "Usage: berth volume status [OPTIONS] [ID]\n",
            ),
            (
                &["volume", "claim", "v", "--read-only", "--alloc", "a"],
                "Usage: berth volume claim [OPTIONS] --alloc <ALLOC> --access-mode <ACCESS_MODE> \
                 <ID>\n",
            ),
        ] {
            let err = try_parse_from(std::iter::once("berth").chain(args.iter().copied()))
                .expect_err("a usage error");
            assert_eq!(err.exit_code(), 2);
            let text = err.render().to_string();
            assert!(text.contains(usage), "{args:?}:\n{text}");
        }
    }

    fn rewritten(args: &[&str]) -> Vec<String> {
        nomad_style_flags(
            std::iter::once("berth")
                .chain(args.iter().copied())
                .map(std::ffi::OsString::from),
        )
        .into_iter()
        .skip(1)
        .map(|a| a.into_string().expect("utf-8"))
        .collect()
    }

    #[test]
    fn nomads_single_dash_long_flags_are_read_as_long_flags() {
        assert_eq!(
            rewritten(&[
                "job",
                "run",
                "-var",
                "a=b",
                "-var-file=f.hcl",
                "-json",
                "j.hcl"
            ]),
            [
                "job",
                "run",
                "--var",
                "a=b",
                "--var-file=f.hcl",
                "--json",
                "j.hcl"
            ]
        );
        // A flag's value is not a flag, even when it looks like one.
        assert_eq!(
            rewritten(&["job", "run", "-var", "-json", "j.hcl"]),
            ["job", "run", "--var", "-json", "j.hcl"]
        );
        // Global flags work at any level; unknown words and short flags pass as typed.
        assert_eq!(
            rewritten(&["events", "-address", "unix:///s", "-bogus", "-f"]),
            ["events", "--address", "unix:///s", "-bogus", "-f"]
        );
        assert_eq!(
            rewritten(&["job", "status", "-json", "--", "-json"]),
            ["job", "status", "--json", "--", "-json"]
        );
        let cli = try_parse_from(nomad_style_flags(
            ["berth", "events", "-topic", "Job", "-json"]
                .into_iter()
                .map(std::ffi::OsString::from),
        ))
        .expect("parses");
        assert!(matches!(cli.command, Command::Events(_)));
    }

    #[test]
    fn nomads_single_dash_flags_are_rewritten_but_never_an_exec_command() {
        let rewrite = |args: &[&str]| -> Vec<String> {
            nomad_style_flags(args.iter().map(std::ffi::OsString::from))
                .into_iter()
                .map(|a| a.into_string().unwrap())
                .collect()
        };
        assert_eq!(
            rewrite(&[
                "berth",
                "alloc",
                "logs",
                "-stderr",
                "-tail",
                "-n",
                "5",
                "-task=web",
                "a1"
            ]),
            [
                "berth",
                "alloc",
                "logs",
                "--stderr",
                "--tail",
                "-n",
                "5",
                "--task=web",
                "a1"
            ]
        );
        assert_eq!(
            rewrite(&[
                "berth", "alloc", "exec", "-task", "web", "a1", "grep", "-task", "-tail"
            ]),
            [
                "berth", "alloc", "exec", "--task", "web", "a1", "grep", "-task", "-tail"
            ]
        );
        assert_eq!(
            rewrite(&[
                "berth",
                "--address",
                "/s",
                "alloc",
                "exec",
                "-t",
                "a1",
                "sh",
                "-var",
                "x"
            ]),
            [
                "berth",
                "--address",
                "/s",
                "alloc",
                "exec",
                "-t",
                "a1",
                "sh",
                "-var",
                "x"
            ]
        );
        assert_eq!(
            rewrite(&["berth", "job", "run", "-var", "a=b", "--", "-tail"]),
            ["berth", "job", "run", "--var", "a=b", "--", "-tail"]
        );
        let cli = try_parse_from(rewrite(&[
            "berth", "alloc", "exec", "-task", "web", "a1", "ls", "-la", "--task",
        ]))
        .expect("parses");
        let Command::Alloc(_) = cli.command else {
            panic!("an alloc command");
        };
    }

    #[test]
    fn address_flag_is_refused_by_commands_that_do_not_reach_the_agent() {
        for args in [
            &["agent", "--address", "unix:///x.sock"][..],
            &["agent", "--dev", "--address=unix:///x.sock"],
            &["--address", "unix:///x.sock", "agent"],
            &["csi", "--address", "unix:///x.sock", "info"],
            &["csi", "volume", "list", "--address", "unix:///x.sock"],
        ] {
            let cli = try_parse_from(std::iter::once("berth").chain(args.iter().copied()))
                .expect("parses");
            assert_eq!(cli.address_source, AddressSource::Flag, "{args:?}");
            let err = prepare(&cli).expect_err("refused");
            assert!(err.is::<UsageError>(), "{args:?}");
            let text = err.to_string();
            assert!(text.contains("takes no --address"), "{text}");
            if args.contains(&"agent") {
                assert!(text.contains("api { socket"), "{text}");
            } else {
                assert!(text.contains("--endpoint"), "{text}");
            }
        }
        for args in [
            &["--address", "unix:///x.sock", "plugin", "status"][..],
            &["plugin", "status", "--address", "unix:///x.sock"],
            &[
                "volume",
                "status",
                "v",
                "--address=unix:///x.sock",
                "--json",
            ],
        ] {
            let cli = try_parse_from(std::iter::once("berth").chain(args.iter().copied()))
                .expect("parses");
            assert_eq!(cli.address_source, AddressSource::Flag, "{args:?}");
            assert_eq!(cli.address, "unix:///x.sock");
            prepare(&cli).expect("accepted");
        }
    }
}
