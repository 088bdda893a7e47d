//! The `cuda` backend: compiles the kernel's variants with NVRTC for the device's
//! architecture, proves each is the variant it claims, loads it, and launches it.
//!
//! This file holds the backend's state and its [`Backend`] methods; opening it on its GPUs
//! is `open.rs`, the runner's own GPU kernels (references, emulation) `yardsticks.rs`,
//! launching one problem `launch.rs`, timing `timer.rs`.

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
pub mod machine_code;
pub mod nvrtc;
mod open;
pub mod reference;
pub mod revision;
pub mod tensor_map;
pub mod timer;
pub mod variant;
pub mod watchdog;
mod waves;
mod yardsticks;

use std::mem::ManuallyDrop;
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DriverError};
use half::f16;

use super::{Backend, BackendError, DeviceSums, OnDevice};
use crate::devices::GpuId;
use crate::emulation::Algorithm;
use crate::kernels::{Abi, KernelSpec};
use crate::problem::Problem;
use crate::reference::Reading;
use crate::rows::RowSet;
use crate::schema::{GpuSlot, VariantMeta};
use crate::shapes::Entry;
use crate::timing::{TimedBlock, TimingPlan};
use crate::verdict::Verdict;
use device::DeviceInfo;
use identity::VariantIdentity;
use kernel::KernelSource;
use launch::{DeviceProblem, TileChoice};

/// A variant loaded on the device.
pub struct LoadedVariant {
    pub identity: VariantIdentity,
    /// The manifest entry of its kernel: entry names, launch ABI, numerics.
    pub kernel: KernelSpec,
    pub options: Vec<String>,
    /// The entries built (the base entry first), each with its function.
    functions: Vec<(Entry, CudaFunction)>,
    /// The companions loaded: an entry's function of its own for query tiles of so many rows.
    companions: Vec<(Entry, u32, CudaFunction)>,
    /// The GPU's SMs (whether a short query's packs fit one CTA an SM: `launch_smem_bytes`).
    pub sms: u32,
    _modules: Vec<Arc<CudaModule>>,
}

impl LoadedVariant {
    /// The function of entry `e`, where it was built.
    pub fn entry(&self, e: Entry) -> Option<&CudaFunction> {
        self.functions.iter().find(|(x, _)| *x == e).map(|(_, f)| f)
    }

    /// The function a launch of entry `e` with query tiles of `rows` rows runs: the entry's
    /// companion of those rows where it has one, else the entry's own function.
    pub fn function(&self, e: Entry, rows: u32) -> Option<&CudaFunction> {
        self.companion(e, rows)
            .map(|(_, _, f)| f)
            .or_else(|| self.entry(e))
    }

    /// The name of the function [`LoadedVariant::function`] gives (for the launch's record).
    pub fn function_name(&self, e: Entry, rows: u32) -> String {
        match self.companion(e, rows) {
            Some(_) => kernel::companion_for(&self.kernel.entry, e, rows),
            None => kernel::entry_for(&self.kernel.entry, e),
        }
    }

    fn companion(&self, e: Entry, rows: u32) -> Option<&(Entry, u32, CudaFunction)> {
        self.companions
            .iter()
            .find(|(x, r, _)| *x == e && *r == rows)
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
    /// The runner's own kernels, the f64 references' (cuda/reference_f64.cu) and the
    /// emulation's (cuda/emulation_f32.cu), built in the background and loaded on first use,
    /// or why one did not build or load: that only matters when they are asked for.
    yardsticks: yardsticks::Loaded,
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

    /// Poisons output 0, launches `variant` into it at the query tile `which`, waits within
    /// the watchdog's limit and reads the output back; None where the entry runs no such tile
    /// (nothing was launched).
    fn poisoned_launch_at(
        &mut self,
        variant: usize,
        which: TileChoice,
    ) -> Result<Option<Vec<f16>>, BackendError> {
        let gpu = &mut *self.gpu;
        let dp = gpu.problem.as_mut().expect("load() before a launch");
        let v = &gpu.variants[variant];
        let launching = match which {
            TileChoice::Chosen => "launching",
            TileChoice::Other => "launching at the other query tile",
        };
        let result = (|| -> Result<Option<Vec<f16>>, Stopped> {
            dp.poison(&gpu.stream, 0)
                .map_err(|e| ("poisoning the output", e))?;
            if !dp
                .launch_at(&gpu.stream, v, 0, which)
                .map_err(|e| (launching, e))?
            {
                return Ok(None);
            }
            finish_checked(&gpu.stream)?;
            let out = dp
                .download(&gpu.stream, 0)
                .map_err(|e| ("reading the output back", e))?;
            Ok(Some(out))
        })();
        result.map_err(|s| self.stopped(variant, s))
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
    /// The compiled variants' full identities (build_meta.json has them too).
    pub fn identities(&self) -> Vec<VariantIdentity> {
        self.gpu
            .variants
            .iter()
            .map(|v| v.identity.clone())
            .collect()
    }
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

    fn algorithm_of(&self, variant: usize, shape: &crate::shapes::Shape) -> Algorithm {
        // A split launch's CTAs are more chains of the same algorithm (launch.rs,
        // identity/geometry.rs `kv_ctas`): the CTA's split times the CTAs.
        let alg = self.algorithms[variant];
        let c = &self.gpu.variants[variant].identity.constants;
        let ctas = c.kv_ctas(shape.entry(), identity::LaunchShape::of(shape)) as usize;
        alg.with_split(alg.kv_split * ctas)
    }

    fn query_tiles_of(&self, variant: usize) -> Vec<usize> {
        self.gpu.variants[variant].identity.constants.query_tiles()
    }

    fn has_device(&self) -> bool {
        true
    }

    fn reference_sums(
        &mut self,
        p: &Problem,
        reading: Reading,
        rows: &RowSet,
    ) -> Result<DeviceSums, BackendError> {
        self.reference_sums_grouped(
            p,
            reading,
            rows,
            reference::GROUP_BYTES,
            reference::BLOCKS_PER_LAUNCH,
        )
    }

    fn emulation_on_device(
        &mut self,
        p: &Problem,
        alg: Algorithm,
        rows: &RowSet,
    ) -> Result<OnDevice<Vec<f16>>, BackendError> {
        self.emulation_grouped(
            p,
            alg,
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
        let launch_shape = identity::LaunchShape::of(&p.shape);
        if let Some(why) =
            self.gpu.variants.iter().find_map(|v| {
                launch::grid_limit(p.shape.entry(), launch_shape, &v.identity.constants)
            })
        {
            return Err(BackendError::Config(format!(
                "shape {}: {why}",
                p.shape.name
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
                // The tensor maps of a `tensor-maps` or `pointers-and-kv-maps` kernel, built once
                // per problem: a map the driver refuses is named here, before any launch (exit
                // 4: the kernel's ABI cannot take this problem).
                for v in &self.gpu.variants {
                    let layout = v.identity.constants.map_layout();
                    let built = match v.kernel.abi {
                        Abi::Pointers => Ok(()),
                        Abi::TensorMaps => dp.tensor_maps(&self.gpu.stream, layout).map(|_| ()),
                        Abi::PointersAndKvMaps => dp.kv_maps(&self.gpu.stream, layout).map(|_| ()),
                    };
                    built.map_err(|why| {
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
        let out = self.poisoned_launch_at(variant, TileChoice::Chosen)?;
        Ok(out.expect("the chosen tile is always launched"))
    }

    fn timed_launch(&mut self, variant: usize) -> Option<crate::schema::LaunchRecord> {
        let gpu = &mut *self.gpu;
        let v = &gpu.variants[variant];
        gpu.problem.as_mut()?.chosen_launch(v)
    }

    fn other_geometries(&mut self, variant: usize) -> Result<Vec<Vec<f16>>, BackendError> {
        let out = self.poisoned_launch_at(variant, TileChoice::Other)?;
        Ok(out.into_iter().collect())
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
