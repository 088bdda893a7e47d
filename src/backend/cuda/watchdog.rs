//! A checked launch that does not finish is a hang, not a wait: the kernel under test is given
//! a time limit per checked launch (docs/DESIGN.md "Exit codes"). Past it, the run stops with
//! exit 4 naming the launch; the process's exit ends the kernel. A wrong mbarrier phase parity,
//! or a TMA transaction count that never completes, hangs a kernel forever and would otherwise
//! hang the run and the CI job with it.

use std::time::{Duration, Instant};

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{CudaStream, DriverError};

/// The limit without `SDPA_RUNNER_LAUNCH_LIMIT_S`: the largest problem the runner knows
/// (index64, 2.2·10^9 elements per tensor) runs for about a second.
const DEFAULT_LIMIT_S: f64 = 20.0;

/// The time limit of one checked launch: `SDPA_RUNNER_LAUNCH_LIMIT_S` (positive seconds)
/// where set and valid, else 20 s.
pub fn limit() -> Duration {
    let from_env = std::env::var("SDPA_RUNNER_LAUNCH_LIMIT_S")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0);
    Duration::from_secs_f64(from_env.unwrap_or(DEFAULT_LIMIT_S))
}

/// How waiting for a stream ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Waited {
    Done,
    /// Still running after the limit.
    Hung(Duration),
}

/// Waits for everything enqueued on `stream`, at most `limit`: polls the stream (spinning
/// for the first millisecond, then every 200 µs) instead of blocking in the driver.
pub fn finish(stream: &CudaStream, limit: Duration) -> Result<Waited, DriverError> {
    let start = Instant::now();
    loop {
        // SAFETY: the stream is alive for the borrow.
        match unsafe { sys::cuStreamQuery(stream.cu_stream()) } {
            CUresult::CUDA_SUCCESS => return Ok(Waited::Done),
            CUresult::CUDA_ERROR_NOT_READY => {}
            other => return Err(DriverError(other)),
        }
        let waited = start.elapsed();
        if waited > limit {
            return Ok(Waited::Hung(waited));
        }
        if waited > Duration::from_millis(1) {
            std::thread::sleep(Duration::from_micros(200));
        } else {
            std::hint::spin_loop();
        }
    }
}

/// The message of a hung launch.
pub fn hung_message(what: &str, waited: Duration) -> String {
    format!(
        "{what}: it had not finished after {:.1} s (the limit; SDPA_RUNNER_LAUNCH_LIMIT_S sets \
         it): the kernel hangs, e.g. a wait on an mbarrier phase that never completes or on \
         bytes that never arrive",
        waited.as_secs_f64()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_twenty_seconds_unless_a_positive_number_of_seconds_is_set() {
        // One test touches the variable, so no other reads it while it changes.
        // SAFETY: no other thread of this test binary reads SDPA_RUNNER_LAUNCH_LIMIT_S.
        unsafe { std::env::remove_var("SDPA_RUNNER_LAUNCH_LIMIT_S") };
        assert_eq!(limit(), Duration::from_secs(20));
        for (set, want) in [
            ("2.5", 2.5),
            ("0", 20.0),
            ("-1", 20.0),
            ("x", 20.0),
            ("inf", 20.0),
        ] {
            unsafe { std::env::set_var("SDPA_RUNNER_LAUNCH_LIMIT_S", set) };
            assert_eq!(limit(), Duration::from_secs_f64(want), "{set}");
        }
        unsafe { std::env::remove_var("SDPA_RUNNER_LAUNCH_LIMIT_S") };
        assert!(hung_message("running", Duration::from_secs(21)).contains("21.0 s"));
    }
}
