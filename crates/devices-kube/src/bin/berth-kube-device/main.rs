//! `berth-kube-device`: an example Kubernetes device plugin (API v1beta1), written as
//! Kubernetes device plugins are, so it works against kubelet as well as against berth.
//!
//! It serves `DevicePlugin` on `<kubelet-dir>/<socket>`, registers on
//! `<kubelet-dir>/kubelet.sock` (waiting for it to exist), and registers again whenever
//! `kubelet.sock` is re-created or its own socket is deleted (it re-creates it first).
//!
//! Devices are `<type>-0` … from `--count`, or one per entry of `--dir` (re-read every
//! `--list-period`). `Allocate` gives each container `<TYPE>_IDS=<ids>` and
//! `<TYPE>_<ID>=present`, a read-only mount of `<state-dir>/<type>s/<id>` at `/<type>s/<id>`,
//! and either a device node (`--device-node`) or a CDI device name (`--cdi`) per device.
//!
//! Test switches: every call is logged as a JSON line in `<state-dir>/calls.jsonl`; faults
//! are read from `<state-dir>/faults` and `BERTH_KUBE_DEVICE_FAULT` (`crash`, `hang`,
//! `unhealthy`, `invalid`, `bad-answer`).

mod calllog;
mod faults;
mod listen;
mod prefer;
mod register;
mod service;
mod state;

use std::{
    os::unix::ffi::OsStrExt as _, path::PathBuf, process::ExitCode, sync::Arc, time::Duration,
};

use anyhow::Context as _;
use berth_devices_kube::{
    MAX_SOCKET_PATH,
    proto::{
        DEFAULT_DIR, KUBELET_SOCKET,
        v1beta1::{DevicePluginOptions, device_plugin_server::DevicePluginServer},
    },
};
use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::{
    calllog::CallLog,
    faults::{FAULT_ENV, FAULT_FILE, Faults},
    listen::Listener,
    register::Registrar,
    service::{Service, Settings},
    state::{Source, State},
};

/// How long in-flight calls may run after SIGTERM.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// An example Kubernetes device plugin (device plugin API v1beta1).
#[derive(Debug, Parser)]
#[command(name = "berth-kube-device", version)]
struct Args {
    /// The device plugin directory, where kubelet.sock is and this plugin's socket goes.
    #[arg(long, default_value = DEFAULT_DIR)]
    kubelet_dir: PathBuf,
    /// The extended resource name to register (domain/type).
    #[arg(long, default_value = "example.com/widget")]
    resource: String,
    /// This plugin's socket, a file name in the kubelet dir [default: berth-TYPE.sock].
    #[arg(long)]
    socket: Option<String>,
    /// How many devices (TYPE-0 …).
    #[arg(long, default_value_t = 2)]
    count: usize,
    /// One device per entry of this directory (instead of --count), named as the entry.
    #[arg(long, conflicts_with = "count")]
    dir: Option<PathBuf>,
    /// How often --dir is listed again.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    list_period: Duration,
    /// Spread the devices over this many NUMA nodes (reported as topology); 0: none.
    #[arg(long, default_value_t = 0)]
    numa: u32,
    /// Offer GetPreferredAllocation (same NUMA node first, lowest ids first).
    #[arg(long)]
    preferred: bool,
    /// Ask for PreStartContainer before every container start.
    #[arg(long)]
    pre_start: bool,
    /// Answer Allocate with CDI device names KIND=ID (KIND: vendor.com/class).
    #[arg(long, value_name = "KIND")]
    cdi: Option<String>,
    /// Give this host device node to each allocated device, at /dev/ID (permissions rw).
    #[arg(long, value_name = "PATH")]
    device_node: Option<PathBuf>,
    /// Where the call log, the fault file and the per-device mount sources live
    /// [default: /run/berth-kube-device/SOCKET-WITHOUT-.sock].
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Serve without registering (tests: the agent must find the plugin by re-dialing).
    #[arg(long, hide = true)]
    no_register: bool,
    /// Log filter (RUST_LOG syntax).
    #[arg(long, default_value = "info", env = "RUST_LOG")]
    log_level: String,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let filter = match tracing_subscriber::EnvFilter::try_new(&args.log_level) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("berth-kube-device: invalid --log-level: {e}");
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let shutdown = CancellationToken::new();
    let signals = tokio::spawn(cancel_on_signal(shutdown.clone()));
    let result = run(args, shutdown).await;
    signals.abort();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("berth-kube-device: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

async fn run(args: Args, shutdown: CancellationToken) -> anyhow::Result<()> {
    let kind = args
        .resource
        .rsplit('/')
        .next()
        .unwrap_or(&args.resource)
        .to_string();
    let socket_name = args.socket.clone().unwrap_or_else(|| {
        let safe: String = kind
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        format!("berth-{safe}.sock")
    });
    let kubelet_dir = std::path::absolute(&args.kubelet_dir)
        .with_context(|| format!("--kubelet-dir {}", args.kubelet_dir.display()))?;
    let socket = kubelet_dir.join(&socket_name);
    let kubelet_socket = kubelet_dir.join(KUBELET_SOCKET);
    for (flag, path) in [("--socket", &socket), ("--kubelet-dir", &kubelet_socket)] {
        let len = path.as_os_str().as_bytes().len();
        anyhow::ensure!(
            len <= MAX_SOCKET_PATH,
            "{flag}: socket path {} is {len} bytes; a unix socket path must fit in \
             {MAX_SOCKET_PATH} bytes",
            path.display()
        );
    }
    std::fs::create_dir_all(&kubelet_dir)
        .with_context(|| format!("creating {}", kubelet_dir.display()))?;
    let state_dir = match &args.state_dir {
        Some(d) => {
            std::path::absolute(d).with_context(|| format!("--state-dir {}", d.display()))?
        }
        None => PathBuf::from("/run/berth-kube-device")
            .join(socket_name.strip_suffix(".sock").unwrap_or(&socket_name)),
    };
    std::fs::create_dir_all(&state_dir)
        .with_context(|| format!("creating the state dir {}", state_dir.display()))?;
    let log = Arc::new(CallLog::open(&state_dir)?);

    let env_faults = match std::env::var(FAULT_ENV) {
        Ok(text) => {
            let (f, unknown) = Faults::parse(&text);
            anyhow::ensure!(
                unknown.is_empty(),
                "{FAULT_ENV}: unknown faults {unknown:?}"
            );
            f
        }
        Err(_) => Faults::default(),
    };
    let source = match &args.dir {
        Some(dir) => Source::Dir(dir.clone()),
        None => Source::Count {
            kind: kind.clone(),
            n: args.count,
        },
    };
    let state = Arc::new(State::new(
        source,
        args.numa,
        state_dir.join(FAULT_FILE),
        env_faults,
    ));
    let options = DevicePluginOptions {
        pre_start_required: args.pre_start,
        get_preferred_allocation_available: args.preferred,
    };
    let service = Service {
        settings: Arc::new(Settings {
            options,
            kind,
            cdi: args.cdi.clone(),
            device_node: args.device_node.clone(),
            state_dir: state_dir.clone(),
        }),
        state: Arc::clone(&state),
        log: Arc::clone(&log),
        shutdown: shutdown.clone(),
    };

    let tracker = TaskTracker::new();
    tracker.spawn(Arc::clone(&state).run(args.list_period, shutdown.clone()));
    let (conn_tx, conn_rx) = tokio::sync::mpsc::channel(16);
    let mut listener = Listener::new(socket.clone(), conn_tx, tracker.clone(), shutdown.clone());
    listener.bind()?;
    let server = tonic::transport::Server::builder()
        .add_service(DevicePluginServer::new(service))
        .serve_with_incoming_shutdown(
            ReceiverStream::new(conn_rx),
            shutdown.clone().cancelled_owned(),
        );
    let server = tracker.spawn(server);

    let registrar = Registrar {
        kubelet_socket,
        endpoint: socket_name,
        resource: args.resource.clone(),
        options,
        no_register: args.no_register,
        state: Arc::clone(&state),
    };
    let result = registrar.run(&mut listener, &log, &shutdown).await;

    shutdown.cancel();
    listener.close();
    tracker.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!("calls still running at shutdown; stopping anyway");
    }
    if server.is_finished()
        && let Ok(Err(e)) = server.await
    {
        tracing::warn!(error = %e, "the DevicePlugin server failed");
    }
    tracing::info!("stopped");
    result
}

/// Cancels `shutdown` on the first SIGINT or SIGTERM.
async fn cancel_on_signal(shutdown: CancellationToken) {
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(term), Ok(int)) => (term, int),
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!(error = %e, "cannot install signal handlers; stop with SIGKILL");
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
    shutdown.cancel();
}
