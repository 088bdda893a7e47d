//! The `sdpa-runner` binary: parse, dispatch, and exit with the documented code.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use sdpa_runner::cli::Cli;

fn main() -> ExitCode {
    disable_cuda_compute_cache();
    sdpa_runner::interrupt::install();
    let cli = Cli::parse(); // usage errors exit 2, --help and --version exit 0
    let result = sdpa_runner::commands::dispatch(cli);
    sdpa_runner::interrupt::park_if_stopping();
    match result {
        Ok(outcome) => ExitCode::from(outcome.exit_code()),
        Err(err) => {
            let _ = writeln!(std::io::stderr(), "error: {err}");
            ExitCode::from(err.exit_code())
        }
    }
}

/// NVRTC honours CUDA's compute cache, and a cache hit skips ptxas, whose report (registers,
/// spills) then goes missing from the log (NVIDIA/cuda-python#1124). Compiling every time
/// costs well under a second; an explicit CUDA_CACHE_DISABLE from the user is kept.
fn disable_cuda_compute_cache() {
    if std::env::var_os("CUDA_CACHE_DISABLE").is_none() {
        // SAFETY: called first thing in main, before any other thread exists.
        unsafe { std::env::set_var("CUDA_CACHE_DISABLE", "1") };
    }
}
