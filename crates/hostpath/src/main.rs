//! The `berth-hostpath` binary: parses flags, sets up logging and signals, runs the plugin.

use std::process::ExitCode;

use berth_hostpath::{Config, run};
use clap::Parser as _;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::parse();
    if let Err(e) = config.init_tracing() {
        eprintln!("berth-hostpath: invalid --log-level or RUST_LOG: {e}");
        return ExitCode::from(2);
    }
    let shutdown = CancellationToken::new();
    let signals = tokio::spawn(cancel_on_signal(shutdown.clone()));
    let result = run(config, shutdown).await;
    signals.abort();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let code = e.exit_code();
            eprintln!("berth-hostpath: error: {:#}", anyhow::Error::from(e));
            ExitCode::from(code)
        }
    }
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
    let name = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    tracing::info!(signal = name, "shutting down");
    shutdown.cancel();
}
