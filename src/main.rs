//! The `sdpa-runner` binary: parse, dispatch, and exit with the documented code.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use sdpa_runner::cli::Cli;

fn main() -> ExitCode {
    sdpa_runner::trace::mark(|| "start".into());
    disable_cuda_compute_cache();
    sdpa_runner::interrupt::install();
    let cli = Cli::parse(); // usage errors exit 2, --help and --version exit 0
    let result = {
        // No thread may still be inside NVRTC when the process exits, even after a panic
        // (src/backend/cuda/build.rs).
        let _background = FinishBackground;
        sdpa_runner::commands::dispatch(cli)
    };
    sdpa_runner::interrupt::park_if_stopping();
    match result {
        Ok(outcome) => ExitCode::from(outcome.exit_code()),
        Err(err) => {
            let _ = writeln!(std::io::stderr(), "error: {err}");
            ExitCode::from(err.exit_code())
        }
    }
}

/// Waits for the background NVRTC compiles when dropped, whether main returns or unwinds.
struct FinishBackground;

impl Drop for FinishBackground {
    fn drop(&mut self) {
        sdpa_runner::backend::cuda::finish_background();
    }
}

/// NVRTC honours CUDA's compute cache, and a cache hit skips ptxas, whose report (registers,
/// spills) then goes missing from the log (NVIDIA/cuda-python#1124). Compiling every time
/// costs well under a second; an explicit CUDA_CACHE_DISABLE from the user is kept.
fn disable_cuda_compute_cache() {
    if std::env::var_os("CUDA_CACHE_DISABLE").is_none() {
        // SAFETY: called at the start of main, before any other thread exists.
        unsafe { std::env::set_var("CUDA_CACHE_DISABLE", "1") };
    }
}
