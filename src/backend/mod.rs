//! Backends run the kernel's variants on a problem: `cuda` (the real kernel through NVRTC and
//! cudarc) and `cpu` (the emulation of its algorithm, for machines without a GPU).

pub mod cpu;
pub mod cuda;
#[cfg(test)]
pub(crate) mod fake;

use half::f16;

use crate::emulation::Algorithm;
use crate::problem::Problem;
use crate::reference::{Reading, RowSums};
use crate::rows::RowSet;
use crate::schema::{GpuSlot, VariantMeta};
use crate::timing::{TimedBlock, TimingPlan};
use crate::verdict::Verdict;

/// `--backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// The Stage-C kernel on the GPU (needs the NVIDIA driver, NVRTC and CUDA headers).
    Cuda,
    /// The CPU emulation of the kernel's algorithm and precisions (no GPU needed).
    Cpu,
}

/// Failures of the backend layer; each maps to one exit code.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BackendError {
    /// No usable GPU, driver, NVRTC or headers (exit 3).
    #[error("{0}")]
    Environment(String),
    /// The kernel failed to compile, is not the variant asked for, or faulted (exit 4).
    #[error("{0}")]
    Kernel(String),
    /// The request cannot run on this backend, e.g. a shape too large for the device (exit 2).
    #[error("{0}")]
    Config(String),
}

/// What the runner's own kernels on the device ([`Backend::reference_sums`],
/// [`Backend::emulation_on_device`]) give when nothing faulted.
pub enum OnDevice<T> {
    /// The result, computed on the device.
    Computed(T),
    /// Why the device cannot compute it (out of memory, or the runner's kernel did not build
    /// or load); the host can.
    Unavailable(String),
}

/// The f64 references' sums from the device.
pub type DeviceSums = OnDevice<RowSums>;

impl<T> OnDevice<T> {
    /// The result made into another.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> OnDevice<U> {
        match self {
            OnDevice::Computed(x) => OnDevice::Computed(f(x)),
            OnDevice::Unavailable(why) => OnDevice::Unavailable(why),
        }
    }

    /// The result, or why there is none.
    pub fn computed(self) -> Result<T, String> {
        match self {
            OnDevice::Computed(x) => Ok(x),
            OnDevice::Unavailable(why) => Err(why),
        }
    }
}

/// `Send`: a backend is opened on the main thread and used by one worker thread at a time
/// (src/shard.rs), which calls [`Backend::attach_thread`] first.
pub trait Backend: Send {
    /// `cpu` or `cuda`, as recorded in the result files.
    fn name(&self) -> &'static str;

    /// The GPU this backend runs on, recorded with every result; `None` for the CPU.
    fn gpu(&self) -> Option<GpuSlot> {
        None
    }

    /// Makes the calling thread able to drive this backend (binds the GPU's context to it).
    fn attach_thread(&self) -> Result<(), BackendError> {
        Ok(())
    }

    /// The variants this backend runs, baseline first.
    fn variants(&self) -> &[String];

    /// Makes `problem` the input of the following runs (uploads it, for a GPU).
    fn load(&mut self, problem: &Problem) -> Result<(), BackendError>;

    /// Poisons the output, runs `variant` once on the loaded problem, and returns the output.
    fn launch_poisoned(&mut self, variant: usize) -> Result<Vec<f16>, BackendError>;

    /// Two checked runs of `variant` launched at once (on two streams, for a GPU), so races
    /// that only show under load get their chance.
    fn run_concurrent(&mut self, variant: usize) -> Result<[Vec<f16>; 2], BackendError> {
        Ok([
            self.launch_poisoned(variant)?,
            self.launch_poisoned(variant)?,
        ])
    }

    /// Untimed launches of `variant` on the loaded problem.
    fn warm_up(&mut self, variant: usize, launches: usize) -> Result<(), BackendError>;

    /// A block of `count` timed samples of `variant` on the loaded problem, in microseconds
    /// per launch, each sample `plan.batch` launches long (outputs are not checked), with
    /// what the backend knows of the conditions it ran under.
    fn time_samples(
        &mut self,
        variant: usize,
        count: usize,
        plan: &TimingPlan,
    ) -> Result<TimedBlock, BackendError>;

    /// What the timings measure, said plainly for reports.
    fn clock(&self) -> &'static str;

    /// The device timings were taken on (the GPU model, or the CPU); compare refuses to
    /// mix devices.
    fn device_name(&self) -> String;

    /// The device's facts for perf.json.
    fn device_json(&self) -> serde_json::Value;

    /// Backend identity for build_meta.json.
    fn details(&self) -> serde_json::Value;

    /// One line that says plainly what runs: the GPU and its software, or the emulation.
    fn describe(&self) -> String;

    /// The algorithm the runs follow (tiles, precisions, KV split: cuda/kernels.toml and the
    /// module's published split), so the emulation yardstick sums as they do and the error
    /// model that bounds them is chosen ([`crate::reference::Model::of`]).
    fn algorithm(&self) -> Algorithm {
        Algorithm::STAGE_C
    }

    /// The algorithm of one variant on problems of `shape` (variants of different kernel
    /// sources may differ in split, and a module that splits a short query's keys across CTAs
    /// sums that problem in more chains).
    fn algorithm_of(&self, _variant: usize, _shape: &crate::shapes::Shape) -> Algorithm {
        self.algorithm()
    }

    /// The launch `variant`'s timed launches of the loaded problem make (its CTA's query rows
    /// and threads, the grid), where the backend launches kernels.
    fn timed_launch(&mut self, _variant: usize) -> Option<crate::schema::LaunchRecord> {
        None
    }

    /// The output of `variant` on the loaded problem at each launch geometry its entry runs
    /// beside the one it chose and times (a kernel whose manifest names a narrower query tile),
    /// each poisoned and checked like [`Backend::launch_poisoned`]'s; none for most kernels. The
    /// runner compares their bits with the chosen launch's (`launch.geometries_differ`).
    fn other_geometries(&mut self, _variant: usize) -> Result<Vec<Vec<f16>>, BackendError> {
        Ok(Vec::new())
    }

    /// Query rows one CTA (or work item) of `variant` owns, one figure per tile size its
    /// entries launch with: the sampled check covers the edges of these tiles (src/rows.rs).
    fn query_tiles_of(&self, _variant: usize) -> Vec<usize> {
        vec![crate::emulation::ROW_CHUNK]
    }

    /// Whether this backend has a device that can compute the yardsticks (the f64 references,
    /// [`Backend::reference_sums`], and the emulation, [`Backend::emulation_on_device`]);
    /// `--references device` and `--emulation device` are refused (exit 2) where not, before
    /// any work.
    fn has_device(&self) -> bool {
        false
    }

    /// The f64 references' sums of `rows` of `problem`, read as `reading` says (its small
    /// weight, and the spread where it asks for it), computed on the device
    /// (cuda/reference_f64.cu) in the backend's own buffers; the loaded problem is left as it
    /// is. Three outcomes:
    /// - `Ok(Computed)`: the sums.
    /// - `Ok(Unavailable(why))`: the device cannot compute them here, and nothing is broken:
    ///   it ran out of memory for the reference's buffers, or the reference kernel did not
    ///   build or load. `--references auto` computes them on the host instead (and records
    ///   `host`); `--references device` stops with `why` (exit 3).
    /// - `Err(Environment)`: the runner's own reference kernel faulted (exit 3, never exit 4:
    ///   that is the kernel under test's); the context may be unusable, so the run ends.
    ///
    /// Backends without a device ([`Backend::has_device`] false) say so.
    fn reference_sums(
        &mut self,
        _problem: &Problem,
        _reading: Reading,
        _rows: &RowSet,
    ) -> Result<DeviceSums, BackendError> {
        Ok(OnDevice::Unavailable(format!(
            "the {} backend has no device",
            self.name()
        )))
    }

    /// The clean emulation of algorithm `alg` on `rows` of `problem`, computed on the device
    /// (cuda/emulation_f32.cu): the same bits as `emulation::clean` on the host, in the
    /// compact layout of `rows`. The three outcomes of [`Backend::reference_sums`], with
    /// `--emulation` in place of `--references`.
    fn emulation_on_device(
        &mut self,
        _problem: &Problem,
        _alg: Algorithm,
        _rows: &RowSet,
    ) -> Result<OnDevice<Vec<f16>>, BackendError> {
        Ok(OnDevice::Unavailable(format!(
            "the {} backend has no device",
            self.name()
        )))
    }

    /// Each variant as reports show it: defines, and for a compiled kernel its PTX hash,
    /// whether the PTX holds cp.async, and its resources.
    fn variant_meta(&self) -> Vec<VariantMeta> {
        self.variants()
            .iter()
            .map(|name| VariantMeta {
                name: name.clone(),
                ..VariantMeta::default()
            })
            .collect()
    }

    /// Resource-gate verdicts per variant; empty where resources do not apply.
    fn resource_verdicts(&self, _gates: &crate::gates::Gates) -> Vec<(String, Verdict)> {
        Vec::new()
    }
}
