//! One build per GPU architecture (a run's GPUs are of one model, src/devices.rs): NVRTC compiles every variant, the timer's kernels and the
//! runner's f64 reference and emulation kernels for one architecture, each program on its own
//! thread. Every GPU of that architecture then loads these same CUBINs, so GPUs of one model
//! run the same code by construction, and several GPUs start in the time one takes
//! (docs/DESIGN.md "Several GPUs").
//!
//! The variants and the timer are waited for: nothing runs without them. The runner's own
//! kernels are needed only by yardsticks computed on the GPU (large problems), so their
//! compiles go on in the background ([`Pending`], one per module the run's kernels and head
//! dims need: `yardsticks::YardstickBuilds`) and the first GPU that needs one waits.

use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use super::kernel::{self, BuiltVariant, KernelSource};
use super::nvrtc::Compiled;
use super::timer;
use super::variant::VariantSpec;
use super::yardsticks::YardstickBuilds;
use crate::backend::BackendError;
use crate::shapes::Entry;

/// What NVRTC made for one architecture, failures included: each GPU that loads it reports
/// them as its own.
#[derive(Clone)]
pub struct ArchBuild {
    pub timer: Result<Compiled, BackendError>,
    /// The runner's own kernels, those the run will need already compiling: a failure
    /// matters only if they are asked for.
    pub yardsticks: Arc<YardstickBuilds>,
    /// One per spec, in the order of the sources and their specs.
    pub variants: Vec<Result<BuiltVariant, BackendError>>,
}

/// Compiles everything a GPU of architecture `arch` (e.g. `sm_90`) loads; of each variant,
/// the modules of `entries` (the base entry's always).
pub fn compile(
    sources: &[(KernelSource, Vec<VariantSpec>)],
    include_dir: &Path,
    arch: &str,
    entries: &[Entry],
) -> ArchBuild {
    let yardsticks = YardstickBuilds::new(arch);
    yardsticks.start_for(sources.iter().map(|(source, _)| &source.spec), entries);
    std::thread::scope(|scope| {
        let timer_job = scope.spawn(|| timer::compile(include_dir, arch));
        let jobs: Vec<_> = sources
            .iter()
            .flat_map(|(source, specs)| specs.iter().map(move |spec| (source, spec)))
            .map(|(source, spec)| {
                scope.spawn(move || kernel::build_variant(source, include_dir, arch, spec, entries))
            })
            .collect();
        ArchBuild {
            variants: jobs.into_iter().map(joined).collect(),
            timer: joined(timer_job),
            yardsticks,
        }
    })
}

/// Work started on a thread of its own; whoever first needs the result waits for it, and
/// every later [`Pending::wait`], from any thread, gets the same result.
pub struct Pending<T> {
    job: Mutex<Option<JoinHandle<T>>>,
    result: OnceLock<T>,
}

/// Every [`Pending`] this process started, until [`finish_background`] waits for them.
static STARTED: Mutex<Vec<Arc<dyn Finish>>> = Mutex::new(Vec::new());

trait Finish: Send + Sync {
    fn finish(&self);
}

impl<T: Send + Sync + 'static> Finish for Pending<T> {
    fn finish(&self) {
        self.wait();
    }
}

/// Waits for every background compile still running. main calls it before returning, so
/// that no thread is inside NVRTC while the process's exit handlers (NVRTC's and the driver's
/// among them) run. Observed once, not reproduced: a self-test child of a build without this
/// wait died of a signal; 15 short runs of such a build, whose compile had not finished when
/// the results were published, did not.
/// Kernels that faulted leak their GPU state on purpose, so a compile's end cannot be tied to
/// a drop.
pub fn finish_background() {
    let started = std::mem::take(&mut *STARTED.lock().unwrap_or_else(|e| e.into_inner()));
    for pending in started {
        pending.finish();
    }
}

impl<T: Send + Sync + 'static> Pending<T> {
    pub fn start(work: impl FnOnce() -> T + Send + 'static) -> Arc<Self> {
        let pending = Arc::new(Pending {
            job: Mutex::new(Some(std::thread::spawn(work))),
            result: OnceLock::new(),
        });
        STARTED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(pending.clone());
        pending
    }

    /// The result, waiting for the work if it is still running.
    pub fn wait(&self) -> &T {
        self.result.get_or_init(|| {
            let job = self.job.lock().unwrap_or_else(|e| e.into_inner()).take();
            job.expect("joined once, inside get_or_init")
                .join()
                .expect("an NVRTC compile thread panicked")
        })
    }
}

/// A background compile's result, a panic in it kept as a failure: the runner's own kernel is
/// then unavailable (the host computes its yardstick under `auto`), and no waiter, nor
/// [`finish_background`] after the results are written, ever panics on it.
pub(super) fn unless_panicked(
    compile: impl FnOnce() -> Result<Compiled, String> + std::panic::UnwindSafe,
) -> Result<Compiled, String> {
    std::panic::catch_unwind(compile)
        .unwrap_or_else(|_| Err("its NVRTC compile panicked".to_string()))
}

fn joined<T>(job: std::thread::ScopedJoinHandle<'_, T>) -> T {
    job.join().expect("an NVRTC compile thread panicked")
}

#[cfg(test)]
mod tests {
    use super::Pending;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};

    #[test]
    fn pending_work_runs_once_and_every_waiter_gets_its_result() {
        static RUNS: AtomicUsize = AtomicUsize::new(0);
        let gate = Arc::new(Barrier::new(2));
        let release = gate.clone();
        let pending = Pending::start(move || {
            release.wait(); // still running while the waiters arrive
            RUNS.fetch_add(1, Ordering::SeqCst);
            vec![7u8; 3]
        });
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let p = pending.clone();
                std::thread::spawn(move || p.wait().clone())
            })
            .collect();
        gate.wait();
        for w in waiters {
            assert_eq!(w.join().unwrap(), vec![7u8; 3]);
        }
        assert_eq!(pending.wait(), &vec![7u8; 3]);
        assert_eq!(RUNS.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_background_compile_that_panics_is_a_failure_not_a_panic() {
        let pending = Pending::start(|| {
            super::unless_panicked(|| -> Result<super::Compiled, String> { panic!("boom") })
        });
        let got = pending.wait().as_ref().map(|_| ()).unwrap_err();
        assert!(got.contains("panicked"), "{got}");
        super::finish_background();
    }

    #[test]
    fn finish_background_returns_only_when_started_work_has_ended() {
        static ENDED: AtomicUsize = AtomicUsize::new(0);
        let _pending = Pending::start(|| {
            std::thread::sleep(std::time::Duration::from_millis(50));
            ENDED.fetch_add(1, Ordering::SeqCst);
        });
        super::finish_background();
        assert_eq!(ENDED.load(Ordering::SeqCst), 1);
    }
}
