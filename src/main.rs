//! The `sdpa-runner` binary: parse, dispatch, and exit with the documented code.

use std::process::ExitCode;

use clap::Parser;
use sdpa_runner::cli::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse(); // usage errors exit 2, --help and --version exit 0
    match sdpa_runner::commands::dispatch(cli) {
        Ok(outcome) => ExitCode::from(outcome.exit_code()),
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(err.exit_code())
        }
    }
}
