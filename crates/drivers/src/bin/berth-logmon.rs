//! The log collector as a program of its own (`berth-logmon --base … --max-files N
//! --max-file-size MIB --mode OCTAL`): the same as `berth logmon`, for drivers run without the
//! `berth` binary (their tests).

use std::process::ExitCode;

fn main() -> ExitCode {
    berth_drivers::logs::collector_main(std::env::args_os().skip(1).collect())
}
