//! The `sdpa-runner` binary: parse, dispatch, and exit with the documented code.

use std::process::ExitCode;

use clap::Parser;
use sdpa_runner::cli::Cli;

fn main() -> ExitCode {
    restore_sigpipe();
    let cli = Cli::parse(); // usage errors exit 2, --help and --version exit 0
    match sdpa_runner::commands::dispatch(cli) {
        Ok(outcome) => ExitCode::from(outcome.exit_code()),
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(err.exit_code())
        }
    }
}

/// Lets `sdpa-runner ... | head` end quietly, as other Unix tools do, instead of panicking
/// on a closed pipe (Rust ignores SIGPIPE by default).
fn restore_sigpipe() {
    #[cfg(unix)]
    // SAFETY: resetting a signal to its default action at start-up, before any threads exist.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
