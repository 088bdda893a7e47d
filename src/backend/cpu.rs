//! The `cpu` backend: the emulation of the chosen kernel's algorithm as a backend (Stage C's by
//! default), so the whole pipeline runs and is tested without a GPU. Its one variant,
//! `cpu-emu`, models the numerics both kernel variants share (they differ only in how tiles
//! reach shared memory, or how deep the pipeline is), with the manifest's KV split: a GPU
//! launch that also splits a short query's keys across CTAs (Stage C's split KV) sums that
//! problem in more chains, which only the `cuda` backend's `algorithm_of` follows.

use std::time::Instant;

use half::f16;

use super::{Backend, BackendError};
use crate::emulation::{self, Algorithm, Defect};
use crate::metrics::POISON;
use crate::problem::Problem;
use crate::rows::RowSet;
use crate::timing::{TimedBlock, TimingPlan};

pub const VARIANT: &str = "cpu-emu";

pub struct CpuBackend {
    defect: Defect,
    alg: Algorithm,
    variants: Vec<String>,
    problem: Option<Problem>,
}

impl CpuBackend {
    /// Stage C's algorithm, with a planted defect or none.
    pub fn new(defect: Defect) -> Self {
        CpuBackend {
            defect,
            alg: Algorithm::STAGE_C,
            variants: vec![VARIANT.to_string()],
            problem: None,
        }
    }

    /// The same backend emulating another kernel's algorithm.
    pub fn emulating(self, alg: Algorithm) -> Self {
        CpuBackend { alg, ..self }
    }
}

impl CpuBackend {
    fn loaded(&self) -> &Problem {
        self.problem.as_ref().expect("load() before a launch")
    }

    /// One whole emulation run of the loaded problem, with the planted defect.
    fn emulate(&self) -> Vec<f16> {
        let p = self.loaded();
        let mut out = vec![POISON; p.output_len()];
        emulation::run(p, self.alg, self.defect, &mut out);
        out
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn variants(&self) -> &[String] {
        &self.variants
    }

    fn load(&mut self, problem: &Problem) -> Result<(), BackendError> {
        self.problem = Some(problem.clone());
        Ok(())
    }

    /// A clean checked launch is the yardstick's emulation of the same problem
    /// ([`emulation::clean`]); a planted defect runs its own.
    fn launch_poisoned(&mut self, _variant: usize) -> Result<Vec<f16>, BackendError> {
        let p = self.loaded();
        if self.defect == Defect::None {
            return Ok(emulation::clean(p, self.alg, &RowSet::all(&p.shape)));
        }
        Ok(self.emulate())
    }

    fn warm_up(&mut self, _variant: usize, launches: usize) -> Result<(), BackendError> {
        for _ in 0..launches {
            std::hint::black_box(self.emulate());
        }
        Ok(())
    }

    /// Wall time of whole emulation runs (the L2 mode has no meaning here).
    /// Every timed launch runs the whole emulation.
    fn time_samples(
        &mut self,
        _variant: usize,
        count: usize,
        plan: &TimingPlan,
    ) -> Result<TimedBlock, BackendError> {
        Ok(TimedBlock::plain(
            (0..count)
                .map(|_| {
                    let start = Instant::now();
                    for _ in 0..plan.batch {
                        std::hint::black_box(self.emulate());
                    }
                    start.elapsed().as_secs_f64() * 1e6 / plan.batch as f64
                })
                .collect(),
        ))
    }

    fn clock(&self) -> &'static str {
        "CPU wall time of the emulation (not GPU time)"
    }

    fn device_name(&self) -> String {
        let model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split(':').nth(1))
                    .map(|m| m.trim().to_string())
            })
            .unwrap_or_else(|| std::env::consts::ARCH.to_string());
        format!("CPU {model} ({} threads)", rayon::current_num_threads())
    }

    fn device_json(&self) -> serde_json::Value {
        serde_json::json!({ "name": self.device_name(), "kind": "cpu" })
    }

    fn describe(&self) -> String {
        format!(
            "backend: cpu — the CPU emulation of the kernel's algorithm and precisions ({}); no GPU was used",
            self.alg.describe()
        )
    }

    fn algorithm(&self) -> Algorithm {
        self.alg
    }

    fn details(&self) -> serde_json::Value {
        serde_json::json!({
            "kind": "CPU emulation of the kernel's algorithm (not the GPU kernel)",
            "algorithm": self.alg.describe(),
            "kv_tile": self.alg.block_n,
            "kv_split": self.alg.kv_split,
            "k_step": self.alg.mma_k,
            "planted_defect": format!("{:?}", self.defect),
        })
    }
}
