//! The `berth` command line.

mod cli;

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    let prepared =
        match cli::prepare(&args).and_then(|p| cli::init_logging(&args.log, &p).map(|()| p)) {
            Ok(p) => p,
            Err(err) => return fail(&err),
        };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(cli::run(args, prepared)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => fail(&err),
    }
}

/// Prints the error; exit code 2 for usage errors, 1 for the rest.
fn fail(err: &anyhow::Error) -> ExitCode {
    eprintln!("error: {err:#}");
    ExitCode::from(err.downcast_ref::<cli::UsageError>().map_or(1, |_| 2))
}
