//! The `cpu` backend: the Stage-C emulation as a backend, so the whole pipeline runs and is
//! tested without a GPU. Its one variant, `cpu-emu`, models the numerics both kernel variants
//! share (they differ only in how tiles reach shared memory).

use half::f16;

use super::{Backend, BackendError};
use crate::emulation::{self, Defect, KV_TILE};
use crate::metrics::POISON;
use crate::problem::Problem;

pub const VARIANT: &str = "cpu-emu";

pub struct CpuBackend {
    defect: Defect,
    variants: Vec<String>,
    problem: Option<Problem>,
}

impl CpuBackend {
    pub fn new(defect: Defect) -> Self {
        CpuBackend {
            defect,
            variants: vec![VARIANT.to_string()],
            problem: None,
        }
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

    fn run_checked(&mut self, _variant: usize) -> Result<Vec<f16>, BackendError> {
        let p = self.problem.as_ref().expect("load() before run_checked()");
        let mut out = vec![POISON; p.output_len()];
        emulation::run(p, self.defect, &mut out);
        Ok(out)
    }

    fn describe(&self) -> String {
        "backend: cpu — the CPU emulation of the kernel's algorithm and precisions; no GPU was used"
            .into()
    }

    fn details(&self) -> serde_json::Value {
        serde_json::json!({
            "kind": "CPU emulation of the Stage-C algorithm (not the GPU kernel)",
            "kv_tile": KV_TILE,
            "k_step": 16,
            "planted_defect": format!("{:?}", self.defect),
        })
    }
}
