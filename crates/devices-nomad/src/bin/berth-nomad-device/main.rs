//! `berth-nomad-device`: an example Nomad device plugin, for tests. It speaks the protocol as
//! a go-plugin server does: it checks Nomad's magic cookie (without it, it prints go-plugin's
//! notice and exits 1), needs protocol version 2 among `PLUGIN_PROTOCOL_VERSIONS`, listens on
//! a unix socket in `PLUGIN_UNIX_SOCKET_DIR` (else the temp dir), prints
//! `1|2|unix|<path>|grpc|`, and serves BasePlugin, DevicePlugin, GRPCController (`Shutdown`
//! ends it cleanly) and the gRPC health check.
//!
//! Its devices are the files directly in its `dir` (see `config` for the schema); faults come
//! from its `fault_file` and `BERTH_NOMAD_DEVICE_FAULT` (see `faults`); it says it is a
//! driver when `BERTH_NOMAD_DEVICE_TYPE=driver`.

mod config;
mod devices;
mod faults;
mod service;

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use anyhow::Context as _;
use berth_devices_nomad::{
    handshake::{
        APP_PROTOCOL_VERSION, CORE_PROTOCOL_VERSION, MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE,
        NOT_RUN_DIRECTLY_NOTICE, PROTOCOL_VERSIONS_VAR, UNIX_SOCKET_DIR_VAR,
    },
    proto::{
        base::base_plugin_server::BasePluginServer,
        controller::grpc_controller_server::GrpcControllerServer,
        device::device_plugin_server::DevicePluginServer, health::health_server::HealthServer,
    },
};
use tokio::{
    net::UnixListener,
    signal::unix::{SignalKind, signal},
};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;

use crate::{
    faults::{CRASH_EXIT, Fault, Faults},
    service::{Plugin, Services},
};

/// How long in-flight calls may run once the plugin is told to stop.
const STOP_GRACE: Duration = Duration::from_secs(3);

fn main() -> ExitCode {
    if std::env::var(MAGIC_COOKIE_KEY).ok().as_deref() != Some(MAGIC_COOKIE_VALUE) {
        eprint!(
            "{NOT_RUN_DIRECTLY_NOTICE} (a Nomad device plugin). It is not meant to be run by \
             hand:\nconfigure it in the agent that loads Nomad device plugins, which starts it.\n"
        );
        return ExitCode::from(1);
    }
    let offered = std::env::var(PROTOCOL_VERSIONS_VAR).unwrap_or_default();
    if !offered
        .split(',')
        .any(|v| v.trim().parse::<u32>() == Ok(APP_PROTOCOL_VERSION))
    {
        eprintln!(
            "berth-nomad-device: the host offers plugin protocol versions {offered:?} \
             ({PROTOCOL_VERSIONS_VAR}); this plugin speaks version {APP_PROTOCOL_VERSION} only"
        );
        return ExitCode::from(1);
    }
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    if Faults::read(None).has(Fault::Crash) {
        tracing::error!("fault: crash");
        return ExitCode::from(u8::try_from(CRASH_EXIT).unwrap_or(1));
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("berth-nomad-device: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(serve()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("berth-nomad-device: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

async fn serve() -> anyhow::Result<()> {
    let dir = std::env::var_os(UNIX_SOCKET_DIR_VAR).map_or_else(std::env::temp_dir, PathBuf::from);
    let (listener, path) = listen(&dir)?;
    let shutdown = CancellationToken::new();
    let plugin = Plugin::new(shutdown.clone());
    let services = Services(plugin);

    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "{CORE_PROTOCOL_VERSION}|{APP_PROTOCOL_VERSION}|unix|{}|grpc|",
        path.display()
    )
    .and_then(|()| stdout.flush())
    .context("printing the handshake line")?;
    drop(stdout);
    tracing::info!(socket = %path.display(), "serving");

    let server = tonic::transport::Server::builder()
        .add_service(BasePluginServer::new(services.clone()))
        .add_service(DevicePluginServer::new(services.clone()))
        .add_service(GrpcControllerServer::new(services.clone()))
        .add_service(HealthServer::new(services))
        .serve_with_incoming_shutdown(
            UnixListenerStream::new(listener),
            shutdown.clone().cancelled_owned(),
        );
    let result = tokio::select! {
        r = server => r.context("serving gRPC"),
        () = async {
            stop_signal(&shutdown).await;
            tokio::time::sleep(STOP_GRACE).await;
        } => {
            tracing::warn!("calls still running after the stop grace; exiting anyway");
            Ok(())
        }
    };
    let _ = std::fs::remove_file(&path);
    tracing::info!("stopped");
    result
}

/// Returns once the plugin is told to stop: `Shutdown` (the token), SIGTERM or SIGINT.
async fn stop_signal(shutdown: &CancellationToken) {
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        shutdown.cancelled().await;
        return;
    };
    tokio::select! {
        () = shutdown.cancelled() => {}
        _ = term.recv() => {
            tracing::info!("SIGTERM: stopping");
            shutdown.cancel();
        }
        _ = int.recv() => {
            tracing::info!("SIGINT: stopping");
            shutdown.cancel();
        }
    }
}

/// Listens on a new socket `plugin<digits>` in `dir`, as go-plugin names it.
fn listen(dir: &Path) -> anyhow::Result<(UnixListener, PathBuf)> {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
        ^ std::process::id().rotate_left(16);
    for attempt in 0..100u32 {
        let path = dir.join(format!(
            "plugin{}",
            seed.wrapping_add(attempt.wrapping_mul(7919))
        ));
        match UnixListener::bind(&path) {
            Ok(l) => return Ok((l, path)),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {}
            Err(e) => {
                return Err(e).with_context(|| format!("listening on {}", path.display()));
            }
        }
    }
    anyhow::bail!("no free socket name in {}", dir.display())
}
