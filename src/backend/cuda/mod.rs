//! The `cuda` backend: compiles the kernel's variants with NVRTC for the device's
//! architecture, proves each is the variant it claims, loads it, and launches it.

mod build;
pub mod device;
pub use build::finish_background;
pub mod code;
pub mod emulation;
pub mod groups;
pub mod headers;
pub mod identity;
pub mod kernel;
pub mod launch;
pub mod nvrtc;
pub mod reference;
pub mod revision;
pub mod tensor_map;
pub mod timer;
pub mod variant;
pub mod watchdog;

use std::mem::ManuallyDrop;
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute_enum as FnAttr;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DriverError};
use cudarc::nvrtc::Ptx;
use half::f16;

use super::{Backend, BackendError, DeviceSums, OnDevice};
use crate::devices::GpuId;
use crate::emulation::Algorithm;
use crate::kernels::{Abi, KernelSpec};
use crate::problem::Problem;
use crate::rows::RowSet;
use crate::schema::{GpuSlot, VariantMeta};
use crate::shapes::Entry;
use crate::timing::{TimedBlock, TimingPlan};
use crate::verdict::Verdict;
use device::DeviceInfo;
use identity::{DriverResources, KernelConstants, VariantIdentity};
use kernel::{BuiltVariant, KernelSource};
use launch::DeviceProblem;
use variant::VariantSpec;

/// A variant loaded on the device.
pub struct LoadedVariant {
    pub identity: VariantIdentity,
    /// The manifest entry of its kernel: entry names, launch ABI, numerics.
    pub kernel: KernelSpec,
    pub options: Vec<String>,
    /// The entries built (the base entry first), each with its function.
    functions: Vec<(Entry, CudaFunction)>,
    _modules: Vec<Arc<CudaModule>>,
}

impl LoadedVariant {
    /// The function of entry `e`, where it was built.
    pub fn entry(&self, e: Entry) -> Option<&CudaFunction> {
        self.functions.iter().find(|(x, _)| *x == e).map(|(_, f)| f)
    }
}

/// Everything that lives on the GPU; leaked instead of freed after a fault, when the
/// context is no longer usable.
struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    variants: Vec<LoadedVariant>,
    problem: Option<DeviceProblem>,
    timer: timer::Timer,
    /// The f64 references' kernel (cuda/reference_f64.cu), built in the background and loaded
    /// on first use, or why it did not build or load: that only matters when device
    /// references are asked for.
    reference: Lazy<reference::DeviceReference>,
    /// The emulation's kernel (cuda/emulation_f32.cu), likewise.
    emulation: Lazy<emulation::DeviceEmulation>,
    /// Two non-blocking streams for concurrent launches (created on first use).
    pair: Option<[Arc<CudaStream>; 2]>,
}

pub struct CudaBackend {
    gpu: ManuallyDrop<Gpu>,
    faulted: bool,
    names: Vec<String>,
    device: DeviceInfo,
    /// Which GPU: its ordinal and UUID go into every record.
    id: GpuId,
    nvrtc_version: String,
    include_dir: PathBuf,
    /// The kernel sources, the one under test first.
    kernels: Vec<KernelSource>,
    /// (shape, seed) of the loaded problem, for error messages.
    loaded: String,
    /// The algorithm each variant runs: its kernel's numerics with the KV split its module
    /// publishes (shared by the variants of one source).
    algorithms: Vec<Algorithm>,
}

impl CudaBackend {
    /// Opens the GPU, finds NVRTC and the headers, compiles and loads every variant.
    pub fn new(kernel: KernelSource, specs: &[VariantSpec]) -> Result<Self, BackendError> {
        Self::from_sources(vec![(kernel, specs.to_vec())])
    }

    /// As [`CudaBackend::new`], with every entry of the kernel (D = 128, causal).
    pub fn with_every_entry(
        kernel: KernelSource,
        specs: &[VariantSpec],
    ) -> Result<Self, BackendError> {
        let mut one = Self::on_gpus(&[0], vec![(kernel, specs.to_vec())], &Entry::all())?;
        Ok(one.pop().expect("one backend per GPU"))
    }

    /// As [`CudaBackend::new`], for variants of several kernel sources (the kernel under test
    /// and `--base-kernel`), in the order given. The variants of one source must share their
    /// KV split; each source may have its own.
    pub fn from_sources(
        sources: Vec<(KernelSource, Vec<VariantSpec>)>,
    ) -> Result<Self, BackendError> {
        Self::on_gpu(0, sources)
    }

    /// As [`CudaBackend::from_sources`], on the GPU of CUDA ordinal `ordinal`.
    pub fn on_gpu(
        ordinal: usize,
        sources: Vec<(KernelSource, Vec<VariantSpec>)>,
    ) -> Result<Self, BackendError> {
        let mut one = Self::on_gpus(&[ordinal], sources, &[Entry::BASE])?;
        Ok(one.pop().expect("one backend per GPU"))
    }

    /// One backend per GPU of `ordinals` (an ordinal may repeat: two workers on one GPU).
    /// The GPUs' contexts open while NVRTC compiles, once per architecture ([`build`]), and
    /// every GPU then loads that architecture's CUBINs. `entries`: those of the problems the
    /// backend will be given (each other than the base entry is a module of its own, built
    /// only when asked for). The first failure is returned.
    pub fn on_gpus(
        ordinals: &[usize],
        sources: Vec<(KernelSource, Vec<VariantSpec>)>,
        entries: &[Entry],
    ) -> Result<Vec<Self>, BackendError> {
        let archs = ordinals
            .iter()
            .map(|&o| device::arch(o))
            .collect::<Result<Vec<_>, _>>()?;
        let nvrtc_version = kernel::require_nvrtc()?;
        let include_dir =
            headers::find_in_environment().map_err(|e| BackendError::Environment(e.to_string()))?;
        let mut distinct = archs.clone();
        distinct.sort();
        distinct.dedup();
        let (opened, builds) = std::thread::scope(|scope| {
            let opening: Vec<_> = ordinals
                .iter()
                .map(|&o| {
                    scope.spawn(move || {
                        let opened = device::open(o);
                        crate::trace::mark(|| format!("gpu {o}: context open"));
                        opened
                    })
                })
                .collect();
            let building: Vec<_> = distinct
                .iter()
                .map(|arch| {
                    let (sources, include_dir) = (&sources, &include_dir);
                    scope.spawn(move || {
                        let built = build::compile(sources, include_dir, arch, entries);
                        crate::trace::mark(|| format!("{arch}: compiled"));
                        built
                    })
                })
                .collect();
            let opened: Vec<_> = opening
                .into_iter()
                .map(|job| job.join().expect("opening a GPU panicked"))
                .collect();
            let builds: Vec<_> = building
                .into_iter()
                .map(|job| job.join().expect("an NVRTC compile thread panicked"))
                .collect();
            (opened, builds)
        });
        let opened = opened.into_iter().collect::<Result<Vec<_>, _>>()?;
        let kernels: Vec<KernelSource> = sources.iter().map(|(k, _)| k.clone()).collect();
        let specs: Vec<Vec<VariantSpec>> = sources.into_iter().map(|(_, s)| s).collect();
        opened
            .into_iter()
            .zip(&archs)
            .map(|((ctx, device, id), arch)| {
                let build =
                    builds[distinct.binary_search(arch).expect("built for every arch")].clone();
                let gpu = Gpu::load(ctx, &device, build, &specs)?;
                crate::trace::mark(|| format!("gpu {}: loaded", id.ordinal));
                Ok(CudaBackend {
                    names: specs.iter().flatten().map(|s| s.name.clone()).collect(),
                    algorithms: gpu.algorithms,
                    gpu: ManuallyDrop::new(gpu.gpu),
                    faulted: false,
                    device,
                    id,
                    nvrtc_version: nvrtc_version.clone(),
                    include_dir: include_dir.clone(),
                    kernels: kernels.clone(),
                    loaded: String::new(),
                })
            })
            .collect()
    }

    /// Maps a driver error during a run to exit 4, and marks the context as unusable.
    fn fault(&mut self, variant: usize, what: &str, e: DriverError) -> BackendError {
        self.faulted = true;
        BackendError::Kernel(format!(
            "variant {} on {} failed while {what}: {e}",
            self.names[variant], self.loaded
        ))
    }

    /// A checked launch that stopped: a driver error ([`CudaBackend::fault`]), or a hang past
    /// the watchdog's limit (exit 4; the context, with the kernel still in it, is left alone).
    fn stopped(&mut self, variant: usize, s: Stopped) -> BackendError {
        match s {
            Stopped::Driver(what, e) => self.fault(variant, what, e),
            Stopped::Hung(waited) => {
                self.faulted = true;
                BackendError::Kernel(format!(
                    "variant {} on {} {}",
                    self.names[variant],
                    self.loaded,
                    watchdog::hung_message("did not finish", waited)
                ))
            }
        }
    }
}

/// Why a checked launch stopped.
enum Stopped {
    Driver(&'static str, DriverError),
    Hung(std::time::Duration),
}

impl From<(&'static str, DriverError)> for Stopped {
    fn from((what, e): (&'static str, DriverError)) -> Self {
        Stopped::Driver(what, e)
    }
}

/// Waits for `stream` within the watchdog's limit.
fn finish_checked(stream: &CudaStream) -> Result<(), Stopped> {
    match watchdog::finish(stream, watchdog::limit()) {
        Ok(watchdog::Waited::Done) => Ok(()),
        Ok(watchdog::Waited::Hung(waited)) => Err(Stopped::Hung(waited)),
        Err(e) => Err(Stopped::Driver("running (fault in the kernel)", e)),
    }
}

/// One of the runner's own kernels on one GPU: its shared build still compiling, or loaded
/// into this GPU's context (or why it could not be built or loaded), from its first use on.
enum Lazy<K> {
    Compiling(Arc<build::Pending<Result<nvrtc::Compiled, String>>>),
    Ready(Result<K, String>),
}

impl<K> Lazy<K> {
    /// The kernel, waiting for its build and loading it with `load` on first use.
    fn get(
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

/// A [`Gpu`] just loaded, with the algorithm of each of its variants.
struct Loaded {
    gpu: Gpu,
    algorithms: Vec<Algorithm>,
}

impl Gpu {
    /// Loads one architecture's build into `ctx`: the timer (whose failure is this GPU's),
    /// the runner's own kernels (whose failure matters only when they are asked for), and
    /// every variant of `specs`, one list per source, whose variants must share a KV split.
    fn load(
        ctx: Arc<CudaContext>,
        device: &DeviceInfo,
        build: build::ArchBuild,
        specs: &[Vec<VariantSpec>],
    ) -> Result<Loaded, BackendError> {
        // One stream only, synchronized explicitly: cudarc's per-buffer event records would
        // otherwise sit inside every timed region.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        let timer =
            timer::Timer::load(&ctx, build.timer?, device.max_sm_clock_mhz, device.sm_count)?;
        let reference = Lazy::Compiling(build.reference);
        let emulation = Lazy::Compiling(build.emulation);
        let mut built = build.variants.into_iter();
        let mut variants = Vec::new();
        let mut algorithms = Vec::new();
        for specs in specs {
            let first = variants.len();
            for _ in specs {
                let variant = built.next().expect("one build per spec")?;
                variants.push(load_variant(&ctx, variant)?);
            }
            let constants: Vec<(&str, KernelConstants)> = variants[first..]
                .iter()
                .map(|v: &LoadedVariant| (v.identity.name.as_str(), v.identity.constants))
                .collect();
            let split =
                identity::shared_kv_split(&constants).map_err(BackendError::Config)? as usize;
            let alg = variants[first..]
                .first()
                .map_or(Algorithm::STAGE_C, |v: &LoadedVariant| {
                    Algorithm::of(&v.kernel)
                })
                .with_split(split);
            algorithms.extend(std::iter::repeat_n(alg, specs.len()));
        }
        Ok(Loaded {
            gpu: Gpu {
                ctx,
                stream,
                variants,
                problem: None,
                timer,
                reference,
                emulation,
                pair: None,
            },
            algorithms,
        })
    }
}

fn load_variant(
    ctx: &Arc<CudaContext>,
    built: BuiltVariant,
) -> Result<LoadedVariant, BackendError> {
    let BuiltVariant {
        spec,
        kernel,
        compiled,
        others,
        mut identity,
    } = built;
    let refuse = |what: &str, e: DriverError| {
        BackendError::Kernel(format!("variant {}: {what}: {e}", spec.name))
    };
    let c = identity.constants;
    let mut functions = Vec::new();
    let mut modules = Vec::new();
    for (e, built) in std::iter::once((Entry::BASE, compiled.cubin))
        .chain(others.into_iter().map(|(e, c)| (e, c.cubin)))
    {
        let module = ctx
            .load_module(Ptx::from_binary(built))
            .map_err(|err| refuse(&format!("loading the {} CUBIN failed", e.suffix()), err))?;
        let smem_bytes = if e.d == 128 {
            c.smem_bytes_d128
        } else {
            c.smem_bytes
        };
        let function = module
            .load_function(&kernel::entry_for(&kernel.entry, e))
            .map_err(|err| refuse("the entry point is missing", err))?;
        function
            .set_attribute(
                FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem_bytes as i32,
            )
            .map_err(|err| refuse("the device refused the kernel's shared memory size", err))?;
        let attr = |a: FnAttr| function.get_attribute(a).map(|v| v.max(0) as u32);
        let resources = (|| -> Result<DriverResources, DriverError> {
            Ok(DriverResources {
                registers_per_thread: attr(FnAttr::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
                static_smem_bytes: attr(FnAttr::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
                dynamic_smem_bytes: smem_bytes,
                local_bytes: attr(FnAttr::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
                threads_per_block: c.threads,
                max_blocks_per_sm: function.occupancy_max_active_blocks_per_multiprocessor(
                    c.threads,
                    smem_bytes as usize,
                    None,
                )?,
            })
        })()
        .map_err(|err| refuse("querying its resources failed", err))?;
        if e == Entry::BASE {
            identity.driver = Some(resources);
        } else if let Some(x) = identity.entries.iter_mut().find(|x| x.entry == e) {
            x.driver = Some(resources);
        }
        functions.push((e, function));
        modules.push(module);
    }
    Ok(LoadedVariant {
        identity,
        kernel,
        options: compiled.options,
        functions,
        _modules: modules,
    })
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

/// Makes `ctx` current on this thread. cudarc first reports (and clears) an error it stored
/// from an earlier asynchronous call, without binding; the second try binds.
fn bind(ctx: &Arc<CudaContext>) -> Result<(), DriverError> {
    ctx.bind_to_thread().or_else(|_| ctx.bind_to_thread())
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        if !self.faulted {
            // The buffers are freed in this GPU's context, whichever thread drops the backend.
            let _ = bind(&self.gpu.ctx);
            // SAFETY: dropped exactly once, here; after a fault the GPU state is leaked instead.
            unsafe { ManuallyDrop::drop(&mut self.gpu) };
        }
    }
}

impl CudaBackend {
    /// [`Backend::reference_sums`] with the heads uploaded in groups of at most `group_bytes`
    /// and at most 80% of the device's free memory (at least one head per group), and at most
    /// `blocks_per_launch` row blocks per launch (the tests make both small to prove that
    /// neither changes a bit).
    pub fn reference_sums_grouped(
        &mut self,
        p: &Problem,
        rows: &RowSet,
        group_bytes: u64,
        blocks_per_launch: usize,
    ) -> Result<DeviceSums, BackendError> {
        let gpu = &mut *self.gpu;
        let ctx = &gpu.ctx;
        let kernel = gpu
            .reference
            .get(|c| reference::DeviceReference::load(ctx, c));
        let result = kernel.map_err(String::clone).map(|k| {
            let budget = group_bytes.min(free_share(ctx));
            k.sums(&gpu.stream, p, rows, budget, blocks_per_launch)
        });
        self.own_kernel_outcome(YARDSTICK_REFERENCES, p, result)
    }

    /// [`Backend::emulation_on_device`] with the limits of [`Self::reference_sums_grouped`].
    pub fn emulation_grouped(
        &mut self,
        p: &Problem,
        kv_split: usize,
        rows: &RowSet,
        group_bytes: u64,
        blocks_per_launch: usize,
    ) -> Result<OnDevice<Vec<f16>>, BackendError> {
        let gpu = &mut *self.gpu;
        let ctx = &gpu.ctx;
        let kernel = gpu
            .emulation
            .get(|c| emulation::DeviceEmulation::load(ctx, c));
        let result = kernel.map_err(String::clone).map(|k| {
            let budget = group_bytes.min(free_share(ctx));
            k.run(&gpu.stream, p, kv_split, rows, budget, blocks_per_launch)
        });
        self.own_kernel_outcome(YARDSTICK_EMULATION, p, result)
    }

    /// What one of the runner's own kernels gave, in the three outcomes of
    /// [`Backend::reference_sums`]. Its failures are environment errors (exit 3), never the
    /// kernel under test's (exit 4, which the self-test counts as a caught mutant): a kernel
    /// that did not build or load (`Err(why)`), or an allocation that did not fit, is
    /// [`OnDevice::Unavailable`] and leaves the context usable; any other driver error (a
    /// launch, a synchronize, or a copy reporting an earlier fault) marks it unusable.
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

    /// The compiled variants' full identities (build_meta.json has them too).
    pub fn identities(&self) -> Vec<VariantIdentity> {
        self.gpu
            .variants
            .iter()
            .map(|v| v.identity.clone())
            .collect()
    }
}

/// Why the runner's GPU `what` kernel cannot take a problem of `shape`.
fn uncovered(shape: &crate::shapes::Shape, what: &str) -> String {
    format!(
        "the GPU {what} kernel covers plain attention of D = {} only, not {}",
        crate::reference::DEVICE_HEAD_DIM,
        shape.dims()
    )
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn variants(&self) -> &[String] {
        &self.names
    }

    fn algorithm(&self) -> Algorithm {
        self.algorithms
            .first()
            .copied()
            .unwrap_or(Algorithm::STAGE_C)
    }

    fn algorithm_of(&self, variant: usize) -> Algorithm {
        self.algorithms[variant]
    }

    fn query_tile_of(&self, variant: usize) -> usize {
        self.gpu.variants[variant].identity.constants.block_m as usize
    }

    fn has_device(&self) -> bool {
        true
    }

    fn reference_sums(&mut self, p: &Problem, rows: &RowSet) -> Result<DeviceSums, BackendError> {
        if !crate::reference::device_covers(&p.shape) {
            return Ok(OnDevice::Unavailable(uncovered(&p.shape, "f64 reference")));
        }
        self.reference_sums_grouped(
            p,
            rows,
            reference::GROUP_BYTES,
            reference::BLOCKS_PER_LAUNCH,
        )
    }

    fn emulation_on_device(
        &mut self,
        p: &Problem,
        kv_split: usize,
        rows: &RowSet,
    ) -> Result<OnDevice<Vec<f16>>, BackendError> {
        if !crate::reference::device_covers(&p.shape) {
            return Ok(OnDevice::Unavailable(uncovered(&p.shape, "emulation")));
        }
        self.emulation_grouped(
            p,
            kv_split,
            rows,
            reference::GROUP_BYTES,
            reference::BLOCKS_PER_LAUNCH,
        )
    }

    fn load(&mut self, p: &Problem) -> Result<(), BackendError> {
        self.loaded = format!(
            "shape {} ({}) seed {} on GPU {}",
            p.shape.name,
            p.shape.dims(),
            p.seed,
            self.id.ordinal
        );
        if self
            .gpu
            .variants
            .iter()
            .any(|v| v.entry(p.shape.entry()).is_none())
        {
            return Err(BackendError::Config(format!(
                "{}: the variants were built without their {} entry (a command builds the \
                 entries of its shapes' problems)",
                self.loaded,
                p.shape.entry().suffix()
            )));
        }
        if p.shape.heads() > 65535 {
            return Err(BackendError::Config(format!(
                "shape {}: B*H = {} exceeds the grid's limit of 65535 (b, h) pairs; use fewer batches or heads",
                p.shape.name,
                p.shape.heads()
            )));
        }
        self.gpu.problem = None; // free the previous problem's buffers first
        let needed = DeviceProblem::bytes_needed(p);
        let free = self
            .gpu
            .ctx
            .mem_get_info()
            .map(|(free, _)| free as u64)
            .unwrap_or(u64::MAX);
        if needed > free {
            return Err(BackendError::Config(format!(
                "shape {} needs {:.2} GiB of GPU memory, {:.2} GiB is free; choose a smaller B, H or S",
                p.shape.name,
                needed as f64 / (1u64 << 30) as f64,
                free as f64 / (1u64 << 30) as f64
            )));
        }
        match DeviceProblem::upload(&self.gpu.stream, p) {
            Ok(mut dp) => {
                // The tensor maps of a `tensor-maps` kernel, built once per problem: a map the
                // driver refuses is named here, before any launch (exit 4: the kernel's ABI
                // cannot take this problem).
                let tiles = self
                    .gpu
                    .variants
                    .iter()
                    .filter(|v| v.kernel.abi == Abi::TensorMaps);
                for v in tiles {
                    let layout = v.identity.constants.map_layout();
                    dp.tensor_maps(&self.gpu.stream, layout).map_err(|why| {
                        BackendError::Kernel(format!(
                            "variant {} on {}: {why}",
                            v.identity.name, self.loaded
                        ))
                    })?;
                }
                self.gpu.problem = Some(dp);
                Ok(())
            }
            // Free memory can shrink between the check and the allocations (another process,
            // or a second worker on this GPU): the context is still sound, the problem too big.
            Err(e) if reference::out_of_memory(&e) => Err(BackendError::Config(format!(
                "{}: the GPU ran out of memory for the inputs ({e}); choose a smaller B, H or S, \
                 or free the GPU (a GPU listed twice in --devices shares its memory)",
                self.loaded
            ))),
            Err(e) => Err(self.fault(0, "uploading the inputs", e)),
        }
    }

    fn launch_poisoned(&mut self, variant: usize) -> Result<Vec<f16>, BackendError> {
        let gpu = &mut *self.gpu;
        let dp = gpu
            .problem
            .as_mut()
            .expect("load() before launch_poisoned()");
        let v = &gpu.variants[variant];
        let result = (|| -> Result<Vec<f16>, Stopped> {
            dp.poison(&gpu.stream, 0)
                .map_err(|e| ("poisoning the output", e))?;
            dp.launch(&gpu.stream, v, 0).map_err(|e| ("launching", e))?;
            finish_checked(&gpu.stream)?;
            Ok(dp
                .download(&gpu.stream, 0)
                .map_err(|e| ("reading the output back", e))?)
        })();
        result.map_err(|s| self.stopped(variant, s))
    }

    /// Poisons two outputs and launches the variant into both at once on two streams.
    fn run_concurrent(&mut self, variant: usize) -> Result<[Vec<f16>; 2], BackendError> {
        let gpu = &mut *self.gpu;
        let result = (|| -> Result<[Vec<f16>; 2], Stopped> {
            if gpu.pair.is_none() {
                let made = |_| gpu.ctx.new_stream().map_err(|e| ("creating streams", e));
                gpu.pair = Some([made(0)?, made(1)?]);
            }
            let pair = gpu.pair.as_ref().expect("created above");
            let dp = gpu
                .problem
                .as_mut()
                .expect("load() before run_concurrent()");
            let v = &gpu.variants[variant];
            dp.ensure_outputs(&gpu.stream, 2)
                .map_err(|e| ("allocating", e))?;
            gpu.stream.synchronize().map_err(|e| ("synchronizing", e))?;
            for (slot, stream) in pair.iter().enumerate() {
                dp.poison(stream, slot)
                    .map_err(|e| ("poisoning the outputs", e))?;
                dp.launch(stream, v, slot).map_err(|e| ("launching", e))?;
            }
            for stream in pair {
                finish_checked(stream)?;
            }
            let read = |slot: usize| {
                dp.download(&pair[slot], slot)
                    .map_err(|e| ("reading the outputs back", e))
            };
            Ok([read(0)?, read(1)?])
        })();
        result.map_err(|s| self.stopped(variant, s))
    }

    fn warm_up(&mut self, variant: usize, launches: usize) -> Result<(), BackendError> {
        let gpu = &mut *self.gpu;
        let dp = gpu.problem.as_mut().expect("load() before warm_up()");
        let v = &gpu.variants[variant];
        let result = (0..launches)
            .try_for_each(|_| dp.launch(&gpu.stream, v, 0))
            .and_then(|_| gpu.stream.synchronize());
        result.map_err(|e| self.fault(variant, "warming up", e))
    }

    fn time_samples(
        &mut self,
        variant: usize,
        count: usize,
        plan: &TimingPlan,
    ) -> Result<TimedBlock, BackendError> {
        let l2_bytes = self.device.l2_bytes as usize;
        let gpu = &mut *self.gpu;
        let dp = gpu.problem.as_mut().expect("load() before time_samples()");
        let v = &gpu.variants[variant];
        let result = gpu
            .timer
            .time(&gpu.ctx, &gpu.stream, v, dp, count, plan, l2_bytes);
        result.map_err(|e| self.fault(variant, "timing", e))
    }

    fn clock(&self) -> &'static str {
        "GPU time per launch from CUDA events"
    }

    fn device_name(&self) -> String {
        self.device.name.clone()
    }

    fn gpu(&self) -> Option<GpuSlot> {
        Some(GpuSlot {
            index: self.id.ordinal,
            uuid: self.id.uuid.clone(),
        })
    }

    fn attach_thread(&self) -> Result<(), BackendError> {
        bind(&self.gpu.ctx).map_err(|e| {
            BackendError::Environment(format!(
                "cannot use GPU {} from a worker thread: {e}",
                self.id.ordinal
            ))
        })
    }

    fn device_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(&self.device).expect("device info serializes");
        v["nvrtc_version"] = self.nvrtc_version.clone().into();
        v
    }

    fn describe(&self) -> String {
        let d = &self.device;
        let kernels: Vec<String> = self
            .kernels
            .iter()
            .enumerate()
            .map(|(i, k)| match i {
                0 => k.origin.clone(),
                _ => format!("against base {}", k.origin),
            })
            .collect();
        format!(
            "backend: cuda — {} (compute {}, {} SMs), driver CUDA {}, NVRTC {}, kernel {}",
            d.name,
            d.compute_capability,
            d.sm_count,
            d.driver_cuda_version,
            self.nvrtc_version,
            kernels.join(" ")
        )
    }

    fn variant_meta(&self) -> Vec<VariantMeta> {
        self.identities().iter().map(VariantMeta::from).collect()
    }

    fn details(&self) -> serde_json::Value {
        serde_json::json!({
            "device": self.device,
            "nvrtc_version": self.nvrtc_version,
            "cuda_include": self.include_dir.display().to_string(),
            "kernel_source": {
                "path": self.kernels[0].origin,
                "sha256": self.kernels[0].sha256,
            },
            "base_kernel_source": self.kernels.get(1).map(|k| serde_json::json!({
                "path": k.origin,
                "sha256": k.sha256,
            })),
            "variants": self.gpu.variants.iter().map(|v| serde_json::json!({
                "identity": v.identity,
                "nvrtc_options": v.options,
            })).collect::<Vec<_>>(),
        })
    }

    fn resource_verdicts(&self, gates: &crate::gates::Gates) -> Vec<(String, Verdict)> {
        self.gpu
            .variants
            .iter()
            .map(|v| {
                let gates = v.kernel.resource_gates(gates);
                (v.identity.name.clone(), v.identity.resource_verdict(&gates))
            })
            .collect()
    }
}
