//! The `berth` command line.

mod cli;

use std::{io::Write as _, process::ExitCode};

fn main() -> ExitCode {
    let args = cli::parse();
    if let Some(collector) = cli::logmon_args(&args) {
        return berth_drivers::logs::collector_main(collector);
    }
    let prepared =
        match cli::prepare(&args).and_then(|p| cli::init_logging(&args.log, &p).map(|()| p)) {
            Ok(p) => p,
            Err(err) => return fail(&err),
        };
    // Spec parsers recurse up to the 64 levels of nesting berth accepts: a debug build can use
    // about 1.5 MiB of stack for that, close to tokio's 2 MiB default. 8 MiB leaves room.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(8 << 20)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "error: cannot start the async runtime: {e}"
            );
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(cli::run(args, prepared)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => fail(&err),
    }
}

/// Prints the error; exit code 2 for usage errors, 1 for the rest. A closed standard output
/// (`berth … | head -1`) is no error: nothing is printed and the exit code is 0.
fn fail(err: &anyhow::Error) -> ExitCode {
    if err.chain().any(|e| e.is::<cli::output::StdoutClosed>()) {
        return ExitCode::SUCCESS;
    }
    if let Some(i) = err.downcast_ref::<cli::Interrupted>() {
        let _ = writeln!(std::io::stderr(), "{i}");
        return ExitCode::from(130);
    }
    // `alloc exec`: the command's own exit code, which says all.
    if let Some(cli::RemoteExit(code)) = err.downcast_ref::<cli::RemoteExit>() {
        return ExitCode::from(*code);
    }
    let text = format!("{err:#}");
    // Nothing more can be done when standard error is gone too.
    let _ = writeln!(
        std::io::stderr(),
        "error: {}",
        cli::output::escape_keeping_lines(&text)
    );
    ExitCode::from(err.downcast_ref::<cli::UsageError>().map_or(1, |_| 2))
}
