//! Timestamps for whoever is making the runner faster: with `SDPA_RUNNER_TRACE=1` in the
//! environment, [`mark`] writes `trace +1.234 s <what>` to stderr, the time counted from the
//! process's first mark. Without it, a mark costs one atomic load and writes nothing. No
//! result file or verdict ever depends on it (docs/DESIGN.md "What limits throughput").

use std::io::Write;
use std::sync::OnceLock;
use std::time::Instant;

/// The environment variable that turns the marks on.
pub const ENV: &str = "SDPA_RUNNER_TRACE";

fn origin() -> Option<&'static Instant> {
    static ORIGIN: OnceLock<Option<Instant>> = OnceLock::new();
    ORIGIN
        .get_or_init(|| {
            std::env::var_os(ENV)
                .is_some_and(|v| !v.is_empty() && v != "0")
                .then(Instant::now)
        })
        .as_ref()
}

/// Runs `f` between the marks `work begins` and `work done`: the span a command spends on its
/// problems, its start and its publishing left out (scripts/prove_devices.sh reads it as the
/// command's work time).
pub fn work<T>(f: impl FnOnce() -> T) -> T {
    mark(|| "work begins".into());
    let out = f();
    mark(|| "work done".into());
    out
}

/// Writes one timestamped line, when tracing is on; `what` is only formatted then.
pub fn mark(what: impl FnOnce() -> String) {
    if let Some(origin) = origin() {
        let line = format!(
            "trace +{:.3} s {}\n",
            origin.elapsed().as_secs_f64(),
            what()
        );
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
}
