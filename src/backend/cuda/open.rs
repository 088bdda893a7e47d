//! Opening the `cuda` backend: every GPU's context opens while NVRTC compiles the variants
//! (once per architecture, src/backend/cuda/build.rs), then each GPU loads its build: the
//! timer, the runner's own kernels (lazily, src/backend/cuda/yardsticks.rs) and every variant
//! with its entries, whose resources the driver reports.

use std::mem::ManuallyDrop;
use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute_enum as FnAttr;
use cudarc::driver::{CudaContext, CudaFunction, DriverError};
use cudarc::nvrtc::Ptx;

use super::device::{self, DeviceInfo};
use super::identity::{self, DriverResources, KernelConstants};
use super::kernel::{self, BuiltVariant, KernelSource};
use super::variant::VariantSpec;
use super::yardsticks;
use super::{CudaBackend, Gpu, LoadedVariant, build, headers, timer};
use crate::backend::BackendError;
use crate::emulation::Algorithm;
use crate::shapes::Entry;

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
        let yardsticks = yardsticks::Loaded::new(build.yardsticks);
        let mut built = build.variants.into_iter();
        let mut variants = Vec::new();
        let mut algorithms = Vec::new();
        for specs in specs {
            let first = variants.len();
            for _ in specs {
                let variant = built.next().expect("one build per spec")?;
                variants.push(load_variant(&ctx, variant, device.sm_count)?);
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
                yardsticks,
                pair: None,
            },
            algorithms,
        })
    }
}

/// Loads a built variant's modules on a GPU of `sms` SMs (its launches' shared memory
/// depends on them: identity/geometry.rs `launch_smem_bytes`).
fn load_variant(
    ctx: &Arc<CudaContext>,
    built: BuiltVariant,
    sms: u32,
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
    // A short query's deeper pipeline only where this GPU allows a block its shared memory
    // (sm_90: 227 KB; smaller GPUs launch it with the entry's figure, and the kernel, which
    // checks what it got, runs its shallow body).
    let optin = ctx
        .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        .map_err(|err| refuse("querying the device's shared memory limit failed", err))?;
    identity.constants = identity.constants.within_device_smem(optin.max(0) as u32);
    let sms = sms.max(1);
    let c = identity.constants;
    let mut functions = Vec::new();
    let mut companions = Vec::new();
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
        // The entry's function, and its companion's where it has one (in the same module,
        // launched with the entry's shared memory: kernel.rs checked that the module holds it).
        let load = |name: &str, threads: u32| {
            let function = module
                .load_function(name)
                .map_err(|err| refuse(&format!("the function `{name}` is missing"), err))?;
            function
                .set_attribute(
                    FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    c.max_smem_bytes(e) as i32,
                )
                .map_err(|err| refuse("the device refused the kernel's shared memory size", err))?;
            let resources = driver_resources(&function, threads, smem_bytes)
                .map_err(|err| refuse("querying its resources failed", err))?;
            Ok::<_, BackendError>((function, resources))
        };
        if let Some((rows, threads)) = c.companion(e) {
            let (function, resources) =
                load(&kernel::companion_for(&kernel.entry, e, rows), threads)?;
            if let Some(x) = identity
                .companions
                .iter_mut()
                .find(|x| x.entry == e && x.rows == rows)
            {
                x.driver = Some(resources);
            }
            companions.push((e, rows, function));
        }
        let (function, resources) = load(&kernel::entry_for(&kernel.entry, e), c.threads_of(e))?;
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
        companions,
        sms,
        _modules: modules,
    })
}

/// What the driver reports of a loaded function launched with `threads` threads and
/// `smem_bytes` of dynamic shared memory.
fn driver_resources(
    function: &CudaFunction,
    threads: u32,
    smem_bytes: u32,
) -> Result<DriverResources, DriverError> {
    let attr = |a: FnAttr| function.get_attribute(a).map(|v| v.max(0) as u32);
    Ok(DriverResources {
        registers_per_thread: attr(FnAttr::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
        static_smem_bytes: attr(FnAttr::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
        dynamic_smem_bytes: smem_bytes,
        local_bytes: attr(FnAttr::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
        threads_per_block: threads,
        max_blocks_per_sm: function.occupancy_max_active_blocks_per_multiprocessor(
            threads,
            smem_bytes as usize,
            None,
        )?,
    })
}
