//! `berth agent`: runs the node agent until SIGINT/SIGTERM.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use anyhow::Context as _;
use berth_agent::{
    Agent, AgentOptions,
    config::{Config, PluginDecl, PluginRun},
};
use berth_api::PluginType;
use clap::Args;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::say;

use super::{UsageError, input};

/// How long the agent gets to stop after the first signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(15);

/// Run the node agent.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Config file: HCL, or JSON when it ends in `.json`.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Data dir (default: the config's `data_dir`, else /var/lib/berth; with --dev a fresh
    /// temporary dir).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Development mode: a fresh temporary data dir, a berth-hostpath CSI plugin run by the
    /// agent, and the example Nomad device plugin (berth-nomad-device, when built) with two
    /// demo devices, so one command gives a working node. Tasks find berth's own binaries
    /// first on their PATH, and every job is stopped (its volumes released) before the agent
    /// exits.
    #[arg(long)]
    dev: bool,
    /// Join a fleet on etcd at these client URLs (comma-separated): overrides
    /// `control_plane.etcd.endpoints` of the config, keeping its other settings.
    #[arg(long, value_name = "URL,…", value_delimiter = ',')]
    etcd: Vec<String>,
}

/// The config file, if any, read before logging starts (it may set the log level): a regular
/// file of at most [`input::MAX_INPUT_BYTES`]. Any problem with it is a usage error.
pub fn load_config(args: &AgentArgs) -> anyhow::Result<Config> {
    let mut config = match &args.config {
        Some(file) => {
            let text = input::read_file_text(file, "--config")
                .map_err(|e| UsageError(format!("{:#}", anyhow::Error::new(e))))?;
            Config::parse(file, &text).map_err(|e| UsageError(e.to_string()))?
        }
        None => Config::default(),
    };
    if !args.etcd.is_empty() {
        let mut etcd = config
            .etcd
            .take()
            .unwrap_or_else(|| berth_fleet::EtcdSettings::defaults(Vec::new()));
        etcd.endpoints.clone_from(&args.etcd);
        berth_agent::config::check_etcd(&etcd)
            .map_err(|(field, m)| UsageError(format!("--etcd: {field}: {m}")))?;
        config.etcd = Some(etcd);
    }
    if let Some(etcd) = &config.etcd {
        berth_agent::config::check_etcd(etcd).map_err(|(field, m)| {
            UsageError(format!("{field}: {m} (in the config, or with --etcd)"))
        })?;
    }
    Ok(config)
}

/// Runs the agent with `config` until a signal; a second signal exits at once.
pub async fn run(args: AgentArgs, mut config: Config) -> anyhow::Result<()> {
    // Every connection, plugin socket, mount-table read and log file is an open file: the
    // inherited soft limit (often 1024) starves a busy agent long before the hard one.
    match berth_sys::raise_nofile_limit() {
        Ok((old, new)) if old != new => {
            tracing::info!(from = old, to = new, "raised the soft limit on open files");
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot raise the soft limit on open files"),
    }
    let mut dev_dir = None;
    let data_dir = match (&args.data_dir, &config.data_dir, args.dev) {
        (Some(d), _, _) => d.clone(),
        (None, _, true) => {
            let dir = std::env::temp_dir().join(format!("berth-dev-{:08x}", rand::random::<u32>()));
            dev_dir = Some(dir.clone());
            dir
        }
        (None, Some(d), false) => d.clone(),
        (None, None, false) => PathBuf::from(berth_api::DEFAULT_DATA_DIR),
    };
    if !data_dir.is_absolute() {
        return Err(UsageError(format!(
            "--data-dir {}: must be an absolute path",
            data_dir.display()
        ))
        .into());
    }
    if args.dev && !config.plugins.iter().any(|p| p.id == "hostpath") {
        config.plugins.push(dev_hostpath(&data_dir)?);
    }
    if args.dev && config.devices.plugin_dir.is_none() && config.devices.nomad_plugins.is_empty() {
        dev_devices(&mut config, &data_dir)?;
    }
    let mut opts = AgentOptions::from_config(config, data_dir.clone());
    if args.dev {
        opts.task_path = Some(dev_task_path()?);
        opts.chroot_env = Some(dev_chroot_env(opts.chroot_env.take())?);
    }

    let shutdown = CancellationToken::new();
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;

    let running = match Agent::start(opts, shutdown.clone()).await {
        Ok(r) => r,
        Err(e) => {
            if let Some(dir) = &dev_dir {
                let _ = std::fs::remove_dir_all(dir);
            }
            return Err(e.into());
        }
    };
    // The agent runs on when nobody reads this (`berth agent --dev | head -1`).
    let _ = say!(
        "berth agent running; data dir {}; API unix://{}\n  export BERTH_ADDR=unix://{}",
        data_dir.display(),
        running.api_socket.display(),
        running.api_socket.display()
    );

    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    if dev_dir.is_some() {
        // The data dir goes away: stop the jobs first, or their tasks would run on, orphaned.
        tracing::info!("--dev: stopping every job before exiting");
        let stopped = tokio::select! {
            done = running.agent.stop_all_jobs(SHUTDOWN_GRACE) => done,
            _ = term.recv() => false,
            _ = int.recv() => false,
        };
        if !stopped {
            tracing::warn!("--dev: some allocs did not finish; their tasks may still run");
        }
    }
    tracing::info!(grace = %berth_sys::short_duration(SHUTDOWN_GRACE), "shutting down");
    shutdown.cancel();
    let stopped = tokio::select! {
        () = running.wait() => true,
        _ = term.recv() => false,
        _ = int.recv() => false,
        () = tokio::time::sleep(SHUTDOWN_GRACE) => false,
    };
    if let Some(dir) = dev_dir {
        // The plugins' roots (made shared mounts) and anything a plugin left mounted go first,
        // or they would stay on the host and the dir could not be removed.
        match berth_sys::unmount_all_under(&dir) {
            Ok(left) if left.is_empty() => {}
            Ok(left) => tracing::warn!(?left, "--dev: mounts left under the data dir"),
            Err(e) => tracing::warn!(error = %e, "--dev: cannot read the mount table"),
        }
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "--dev: cannot remove the data dir");
        }
    }
    if !stopped {
        anyhow::bail!(
            "did not stop within {} (or a second signal came); exiting now",
            berth_sys::short_duration(SHUTDOWN_GRACE)
        );
    }
    Ok(())
}

/// `PATH` of tasks in `--dev`: the directory of the `berth` binary first (so a job can run
/// `berth-hostpath` by name), then the agent's own.
fn dev_task_path() -> anyhow::Result<String> {
    let exe = std::env::current_exe().context("cannot find the berth binary")?;
    let dir = exe.parent().context("the berth binary has no directory")?;
    let rest = std::env::var("PATH")
        .unwrap_or_else(|_| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    Ok(format!("{}:{rest}", dir.display()))
}

/// `chroot_env` in `--dev`: the configured one (or Nomad's defaults) plus the directory of the
/// `berth` binary at its own path, so `exec` tasks find `berth-hostpath` there too.
fn dev_chroot_env(
    configured: Option<BTreeMap<PathBuf, PathBuf>>,
) -> anyhow::Result<BTreeMap<PathBuf, PathBuf>> {
    let mut env = configured.unwrap_or_else(|| berth_drivers::ExecConfig::default().chroot_env);
    let exe = std::env::current_exe().context("cannot find the berth binary")?;
    let dir = exe.parent().context("the berth binary has no directory")?;
    if !env
        .iter()
        .any(|(src, dst)| dir.starts_with(src) && src == dst)
    {
        env.insert(dir.to_path_buf(), dir.to_path_buf());
    }
    Ok(env)
}

/// The berth-hostpath plugin `--dev` runs: a monolith next to the `berth` binary, staging and
/// attaching like a real block-storage driver.
fn dev_hostpath(data_dir: &std::path::Path) -> anyhow::Result<PluginDecl> {
    let exe = std::env::current_exe().context("cannot find the berth binary")?;
    let command = exe.with_file_name("berth-hostpath");
    if !command.is_file() {
        anyhow::bail!(
            "--dev runs berth-hostpath, expected at {}: build it with `cargo build --bin berth-hostpath`",
            command.display()
        );
    }
    let node_id = berth_sys::hostname().unwrap_or_else(|_| "localhost".into());
    Ok(PluginDecl {
        id: "hostpath".into(),
        plugin_type: PluginType::Monolith,
        run: PluginRun::Command {
            command,
            args: vec![
                "--statedir".into(),
                data_dir.join("hostpath").display().to_string(),
                "--nodeid".into(),
                node_id,
                // The whole CSI flow: NodeStage once per usage, ControllerPublish per node.
                "--enable-stage".into(),
                "--enable-attach".into(),
                // It refuses any request where berth skips a duty of the CO (the staging
                // directory, the target's parent…), so `--dev` shows such a defect at once.
                "--strict".into(),
            ],
            env: Default::default(),
        },
    })
}

/// The example Nomad device plugin `--dev` runs, when `berth-nomad-device` was built next to
/// `berth`: `<data_dir>/dev-plugins` holds a link to it, and its devices are the files of
/// `<data_dir>/dev-devices` (`dev0` and `dev1` to start with; add or chmod 0777 files there
/// to see devices come, go and turn unhealthy).
fn dev_devices(config: &mut Config, data_dir: &std::path::Path) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the berth binary")?;
    let binary = exe.with_file_name("berth-nomad-device");
    if !binary.is_file() {
        tracing::info!(
            expected = %binary.display(),
            "--dev: berth-nomad-device is not built; no device plugin runs"
        );
        return Ok(());
    }
    let plugins = data_dir.join("dev-plugins");
    let devices = data_dir.join("dev-devices");
    for dir in [data_dir, &plugins, &devices] {
        berth_sys::create_private_dir(dir)
            .with_context(|| format!("cannot make {}", dir.display()))?;
    }
    let link = plugins.join("berth-nomad-device");
    if !link.exists() {
        std::os::unix::fs::symlink(&binary, &link)
            .with_context(|| format!("cannot link {}", link.display()))?;
    }
    for name in ["dev0", "dev1"] {
        let file = devices.join(name);
        if !file.exists() {
            std::fs::write(&file, format!("demo device {name}\n"))
                .with_context(|| format!("cannot write {}", file.display()))?;
        }
    }
    config.devices.plugin_dir = Some(plugins);
    config
        .devices
        .nomad_plugins
        .push(berth_agent::config::NomadPluginDecl {
            name: "berth-nomad-device".into(),
            args: Vec::new(),
            config: serde_json::json!({
                "dir": devices.display().to_string(),
                "list_period": "1s",
            }),
        });
    Ok(())
}
