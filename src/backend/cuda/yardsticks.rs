//! The runner's own GPU kernels, its yardsticks: the f64 references (cuda/reference_f64.cu)
//! and the emulation (cuda/emulation_f32.cu), one module per head dim and algorithm (or
//! reading), built in the background once per architecture ([`YardstickBuilds`]) and loaded
//! into a GPU's context on first use, each within a share of the device's free memory. Their
//! failures are the environment's (exit 3), never the kernel under test's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, DriverError};
use half::f16;

use super::build::{Pending, unless_panicked};
use super::emulation::EmuBuild;
use super::reference::RefBuild;
use super::{CudaBackend, emulation, nvrtc, reference};
use crate::backend::{BackendError, DeviceSums, OnDevice};
use crate::emulation::Algorithm;
use crate::kernels::KernelSpec;
use crate::problem::Problem;
use crate::reference::{Model, Precision, Reading};
use crate::rows::RowSet;
use crate::shapes::Entry;

type Build = Arc<Pending<Result<nvrtc::Compiled, String>>>;

/// The runner's own modules for one architecture, each compiled once on a thread of its own
/// and shared by every GPU of that architecture: those a run will need are started with its
/// kernels' builds ([`YardstickBuilds::start_for`]), any other on first use.
pub struct YardstickBuilds {
    arch: String,
    references: Mutex<HashMap<RefBuild, Build>>,
    emulations: Mutex<HashMap<EmuBuild, Build>>,
}

impl YardstickBuilds {
    pub fn new(arch: &str) -> Arc<Self> {
        Arc::new(YardstickBuilds {
            arch: arch.to_string(),
            references: Mutex::new(HashMap::new()),
            emulations: Mutex::new(HashMap::new()),
        })
    }

    /// Starts the modules the kernels of `specs` need on the head dims of `entries`: the
    /// emulation of each kernel's algorithm, and the references its error model reads.
    pub fn start_for<'a>(&self, specs: impl Iterator<Item = &'a KernelSpec>, entries: &[Entry]) {
        for spec in specs {
            let alg = Algorithm::of(spec);
            let spread = Model::of(alg).reading().spread;
            for d in entries.iter().map(|e| e.d) {
                self.reference(RefBuild { d, spread });
                self.emulation(EmuBuild::new(d, alg));
            }
        }
    }

    /// The build of reference module `b`, started if it was not.
    fn reference(&self, b: RefBuild) -> Build {
        let arch = self.arch.clone();
        started(&self.references, b, move || reference::compile(b, &arch))
    }

    /// The build of emulation module `b`, started if it was not.
    fn emulation(&self, b: EmuBuild) -> Build {
        let arch = self.arch.clone();
        started(&self.emulations, b, move || emulation::compile(b, &arch))
    }
}

/// `builds[key]`, its compile started on a thread of its own if there was none.
fn started<K: std::hash::Hash + Eq>(
    builds: &Mutex<HashMap<K, Build>>,
    key: K,
    compile: impl FnOnce() -> Result<nvrtc::Compiled, String> + Send + std::panic::UnwindSafe + 'static,
) -> Build {
    let mut builds = builds.lock().unwrap_or_else(|e| e.into_inner());
    builds
        .entry(key)
        .or_insert_with(|| Pending::start(move || unless_panicked(compile)))
        .clone()
}

/// One GPU's loaded yardstick modules (or why one could not be built or loaded), by build.
pub(super) struct Loaded {
    pub builds: Arc<YardstickBuilds>,
    pub references: HashMap<RefBuild, Lazy<reference::DeviceReference>>,
    pub emulations: HashMap<EmuBuild, Lazy<emulation::DeviceEmulation>>,
}

impl Loaded {
    pub fn new(builds: Arc<YardstickBuilds>) -> Self {
        Loaded {
            builds,
            references: HashMap::new(),
            emulations: HashMap::new(),
        }
    }
}

/// One of the runner's own kernels on one GPU: its shared build still compiling, or loaded
/// into this GPU's context (or why it could not be built or loaded), from its first use on.
pub(super) enum Lazy<K> {
    Compiling(Build),
    Ready(Result<K, String>),
}

impl<K> Lazy<K> {
    /// The kernel, waiting for its build and loading it with `load` on first use.
    pub(super) fn get(
        &mut self,
        load: impl FnOnce(nvrtc::Compiled) -> Result<K, String>,
    ) -> Result<&K, &String> {
        if let Lazy::Compiling(pending) = self {
            let loaded = pending.wait().clone().and_then(load);
            *self = Lazy::Ready(loaded);
        }
        match self {
            Lazy::Ready(result) => result.as_ref(),
            Lazy::Compiling(_) => unreachable!("made ready above"),
        }
    }
}

/// Which of the runner's own kernels, for its messages.
struct Yardstick {
    kernel: &'static str,
    flag: &'static str,
}

const YARDSTICK_REFERENCES: Yardstick = Yardstick {
    kernel: "f64 reference kernel",
    flag: "--references",
};
const YARDSTICK_EMULATION: Yardstick = Yardstick {
    kernel: "emulation kernel",
    flag: "--emulation",
};

/// 80% of the device's free memory: what one of the runner's own kernels may take.
fn free_share(ctx: &Arc<CudaContext>) -> u64 {
    let free = ctx
        .mem_get_info()
        .map(|(free, _)| free as u64)
        .unwrap_or(u64::MAX);
    free / 5 * 4
}

impl CudaBackend {
    /// [`Backend::reference_sums`](crate::backend::Backend::reference_sums) with the heads
    /// uploaded in groups of at most `group_bytes` and at most 80% of the device's free
    /// memory (at least one head per group), and at most `blocks_per_launch` row blocks per
    /// launch (the tests make both small to prove that neither changes a bit).
    pub fn reference_sums_grouped(
        &mut self,
        p: &Problem,
        reading: Reading,
        rows: &RowSet,
        group_bytes: u64,
        blocks_per_launch: usize,
    ) -> Result<DeviceSums, BackendError> {
        if reading.precision != Precision::Fp8 {
            return Ok(OnDevice::Unavailable(format!(
                "the GPU's f64 reference reads FP8 codes, not {:?} inputs",
                reading.precision
            )));
        }
        let gpu = &mut *self.gpu;
        let ctx = &gpu.ctx;
        let build = RefBuild {
            d: p.shape.d,
            spread: reading.spread,
        };
        let own = &mut gpu.yardsticks;
        let kernel = own
            .references
            .entry(build)
            .or_insert_with(|| Lazy::Compiling(own.builds.reference(build)))
            .get(|c| reference::DeviceReference::load(ctx, build, c));
        let result = kernel.map_err(String::clone).map(|k| {
            let budget = group_bytes.min(free_share(ctx));
            k.sums(&gpu.stream, p, reading, rows, budget, blocks_per_launch)
        });
        self.own_kernel_outcome(YARDSTICK_REFERENCES, p, result)
    }

    /// [`Backend::emulation_on_device`](crate::backend::Backend::emulation_on_device) with the
    /// limits of [`Self::reference_sums_grouped`].
    pub fn emulation_grouped(
        &mut self,
        p: &Problem,
        alg: Algorithm,
        rows: &RowSet,
        group_bytes: u64,
        blocks_per_launch: usize,
    ) -> Result<OnDevice<Vec<f16>>, BackendError> {
        let gpu = &mut *self.gpu;
        let ctx = &gpu.ctx;
        let build = EmuBuild::new(p.shape.d, alg);
        let own = &mut gpu.yardsticks;
        let kernel = own
            .emulations
            .entry(build)
            .or_insert_with(|| Lazy::Compiling(own.builds.emulation(build)))
            .get(|c| emulation::DeviceEmulation::load(ctx, build, c));
        let result = kernel.map_err(String::clone).map(|k| {
            let budget = group_bytes.min(free_share(ctx));
            k.run(
                &gpu.stream,
                p,
                alg.kv_split,
                rows,
                budget,
                blocks_per_launch,
            )
        });
        self.own_kernel_outcome(YARDSTICK_EMULATION, p, result)
    }

    /// What one of the runner's own kernels gave, in the three outcomes of
    /// [`Backend::reference_sums`](crate::backend::Backend::reference_sums). Its failures are
    /// environment errors (exit 3), never the kernel under test's (exit 4, which the
    /// self-test counts as a caught mutant): a kernel that did not build or load
    /// (`Err(why)`), or an allocation that did not fit, is [`OnDevice::Unavailable`] and
    /// leaves the context usable; any other driver error (a launch, a synchronize, or a copy
    /// reporting an earlier fault) marks it unusable.
    fn own_kernel_outcome<T>(
        &mut self,
        which: Yardstick,
        p: &Problem,
        result: Result<Result<T, DriverError>, String>,
    ) -> Result<OnDevice<T>, BackendError> {
        let on = format!(
            "shape {} ({}) seed {}",
            p.shape.name,
            p.shape.dims(),
            p.seed
        );
        let Yardstick { kernel, flag } = which;
        match result {
            Ok(Ok(x)) => Ok(OnDevice::Computed(x)),
            Err(why) => Ok(OnDevice::Unavailable(format!(
                "the runner's {kernel} is unavailable for {on}: {why}"
            ))),
            Ok(Err(e)) if reference::out_of_memory(&e) => Ok(OnDevice::Unavailable(format!(
                "the runner's {kernel} ran out of GPU memory on {on}: {e}"
            ))),
            Ok(Err(e)) => {
                self.faulted = true;
                Err(BackendError::Environment(format!(
                    "the runner's own {kernel} failed (a kernel launched before it may have \
                     left the GPU in a bad state) on {on}: {e}; {flag} host computes it on the \
                     host"
                )))
            }
        }
    }
}
