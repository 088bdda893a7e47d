//! The gates file: every pass/fail threshold in one versioned JSON file, read strictly
//! (unknown, missing or negative keys are errors naming the file and key).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::usage::ConfigError;

/// The gates file version this runner reads.
pub const GATES_VERSION: u32 = 2;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gates {
    pub version: u32,
    pub correctness: CorrectnessGates,
    /// The base entry's limits (D = 64, no mask: the main job's kernel).
    pub resources: ResourceGates,
    /// Every other entry's limits, keyed by its suffix (`d64_causal`, `d128`, `d128_causal`):
    /// each instantiation has its own register and shared-memory budget
    /// (cuda/sdpa_fp8_stage_c_mma.cu, "Resources per entry").
    pub resources_by_entry: BTreeMap<String, ResourceGates>,
    pub performance: PerformanceGates,
}

/// The correctness limits. Each is a multiple of what the error model allows
/// (src/reference/bound.rs, docs/DESIGN.md "Error model"), so none depends on a shape; the
/// exact checks (unwritten, nonfinite, the quantizer, the inputs) need no limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CorrectnessGates {
    /// Against the f64 reference on the dequantized inputs: the kernel's own error.
    pub kernel: BoundGate,
    /// Against the f64 reference on the original f32 inputs: kernel plus quantization error.
    pub end_to_end: BoundGate,
    /// Kernel error relative to the CPU emulation's error in the same precisions.
    pub relative: RelativeGate,
    /// The slope of the kernel's output on its emulation's (src/scale_fit.rs). Optional in
    /// the file: a version-2 file written before it gets the model's values.
    #[serde(default)]
    pub scale: ScaleGate,
}

/// `|slope − 1| <= allowance + t(1 − p/2, rows − 1) · std_err`, the slope of the kernel's
/// output on the emulation's over the checked elements (docs/DESIGN.md "The scale gate"):
/// `allowance` is what the emulation may leave unmodelled and applies to every output, `p`
/// the chance that the row-to-row spread alone fails a correct kernel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScaleGate {
    pub allowance: f64,
    pub p: f64,
}

impl ScaleGate {
    /// The smallest allowance: 12 times the systematic part measured between correct kernels
    /// and their emulations (1.0e-5 on an H100, stop 37), which chance does not cover.
    pub const MIN_ALLOWANCE: f64 = 1.0 / 8192.0;
    /// The smallest `p`: a smaller one loosens the gate (the model's default).
    pub const MIN_P: f64 = 1e-6;
    /// The largest allowance the model admits. The emulations model every rounding of their
    /// kernel; were Stage D's model of its fp22 accumulator (13 bits kept) wrong outright, each
    /// of a KV tile's four k-steps (128 keys / 32) could bias P·V by 2^-13 the same way:
    /// 4 · 2^-13 = 2^-11, doubled for margin. Stage C's f32 accumulator leaves far less.
    pub const MODEL_ALLOWANCE: f64 = 1.0 / 1024.0;
}

impl Default for ScaleGate {
    fn default() -> Self {
        ScaleGate {
            allowance: Self::MODEL_ALLOWANCE,
            p: 1e-6,
        }
    }
}

/// `max |out - ref| / bound <= max_err_over_bound` over the elements; 1 is the model itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoundGate {
    pub max_err_over_bound: f64,
}

/// `kernel_err <= factor * emulation_err + eps_ulps * ulp`, for the max and the mean absolute
/// error against the kernel reference (FlashAttention's rule, factor 2), where ulp is one f16
/// ulp of the largest (for the max) or of the mean (for the mean) output magnitude: kernel
/// and emulation may round an output to neighbouring f16 values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelativeGate {
    pub factor: f64,
    pub eps_ulps: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceGates {
    pub max_regs_per_thread: u32,
    pub max_smem_bytes: u32,
    pub max_spill_bytes: u32,
    pub min_blocks_per_sm: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerformanceGates {
    /// Speedup (percent of baseline p50) the candidate must reach on the target shapes.
    pub min_speedup_pct: f64,
    /// Slowdown beyond which `compare --gate` refuses a candidate.
    pub max_regression_pct: f64,
    /// Confidence level of the interval on the median ratio.
    pub confidence: f64,
    /// Differences smaller than this are SAME, however significant (in-run A/B, paired).
    pub noise_floor_pct: f64,
    /// The same for two saved runs compared (unpaired): separate processes add their own
    /// variation, measured by the two-run A/A of scripts/prove_verdicts.sh.
    pub unpaired_noise_floor_pct: f64,
    /// Unpaired floors of shapes noisier across processes than the default.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unpaired_noise_floor_by_shape: BTreeMap<String, f64>,
    pub target_shapes: Vec<String>,
    /// A round is left out of a paired verdict when its baseline's block ran with its mean SM
    /// clock more than this below the shape's median block clock (docs/DESIGN.md "Timing and
    /// comparison").
    #[serde(default = "default_clock_sag_pct")]
    pub clock_sag_pct: f64,
}

fn default_clock_sag_pct() -> f64 {
    3.0
}

#[cfg(test)]
impl CorrectnessGates {
    /// The committed file's correctness gates: the bounds at the model (1), the relative gate
    /// at twice the emulation's error plus an ulp. For tests of what reads them.
    pub fn at_the_model() -> Self {
        CorrectnessGates {
            kernel: BoundGate {
                max_err_over_bound: 1.0,
            },
            end_to_end: BoundGate {
                max_err_over_bound: 1.0,
            },
            relative: RelativeGate {
                factor: 2.0,
                eps_ulps: 1.0,
            },
            scale: ScaleGate::default(),
        }
    }
}

impl PerformanceGates {
    /// The noise floor of an unpaired comparison of `shape`.
    pub fn unpaired_floor(&self, shape: &str) -> f64 {
        self.unpaired_noise_floor_by_shape
            .get(shape)
            .copied()
            .unwrap_or(self.unpaired_noise_floor_pct)
    }
}

/// A loaded gates file and where it came from.
#[derive(Debug, Clone)]
pub struct GateFile {
    pub path: PathBuf,
    pub gates: Gates,
}

impl GateFile {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::parse(path, &crate::json::read_text(path)?)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let gates: Gates = crate::json::from_str_with_path(path, text)?;
        gates
            .validate()
            .map_err(|(key, message)| ConfigError::invalid_key(path, key, message))?;
        Ok(GateFile {
            path: path.to_path_buf(),
            gates,
        })
    }
}

impl GateFile {
    /// Refuses a gates file that names a shape the shapes file does not have (a typo there
    /// would silently gate nothing).
    pub fn check_shape_names(
        &self,
        known: impl Fn(&str) -> bool,
        shapes_file: &Path,
    ) -> Result<(), ConfigError> {
        let p = &self.gates.performance;
        let named = p
            .target_shapes
            .iter()
            .map(|s| ("performance.target_shapes".to_string(), s))
            .chain(
                p.unpaired_noise_floor_by_shape
                    .keys()
                    .map(|s| (format!("performance.unpaired_noise_floor_by_shape.{s}"), s)),
            );
        for (key, shape) in named {
            if !known(shape) {
                return Err(ConfigError::invalid_key(
                    &self.path,
                    key,
                    format!(
                        "names the shape `{shape}`, which {} does not define; fix the name or \
                         add the shape",
                        shapes_file.display()
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl Gates {
    /// The same gates with `limits` for the base entry and every other entry: a kernel whose
    /// manifest entry states its own resource limits (cuda/kernels.toml `[resources]`).
    pub fn with_resources_of_every_entry(&self, limits: &ResourceGates) -> Gates {
        let mut g = self.clone();
        g.resources = limits.clone();
        for e in crate::shapes::Entry::all() {
            if e != crate::shapes::Entry::BASE {
                g.resources_by_entry.insert(e.suffix(), limits.clone());
            }
        }
        g
    }

    /// Range checks serde cannot express; the error is (dotted key, message).
    fn validate(&self) -> Result<(), (String, String)> {
        if self.version != GATES_VERSION {
            return Err((
                "version".into(),
                format!(
                    "version {} is not supported; this runner reads version {GATES_VERSION} \
                     (version 2 replaced the fixed error thresholds by the error model's \
                     bounds: see gates/default.json)",
                    self.version
                ),
            ));
        }
        let c = &self.correctness;
        let mut numbers: Vec<(String, f64)> = vec![
            (
                "correctness.kernel.max_err_over_bound".into(),
                c.kernel.max_err_over_bound,
            ),
            (
                "correctness.end_to_end.max_err_over_bound".into(),
                c.end_to_end.max_err_over_bound,
            ),
        ];
        numbers.push(("correctness.relative.factor".into(), c.relative.factor));
        numbers.push(("correctness.relative.eps_ulps".into(), c.relative.eps_ulps));
        numbers.push(("correctness.scale.allowance".into(), c.scale.allowance));
        let p = &self.performance;
        numbers.push(("performance.min_speedup_pct".into(), p.min_speedup_pct));
        numbers.push((
            "performance.max_regression_pct".into(),
            p.max_regression_pct,
        ));
        numbers.push(("performance.noise_floor_pct".into(), p.noise_floor_pct));
        numbers.push(("performance.clock_sag_pct".into(), p.clock_sag_pct));
        numbers.push((
            "performance.unpaired_noise_floor_pct".into(),
            p.unpaired_noise_floor_pct,
        ));
        for (shape, floor) in &p.unpaired_noise_floor_by_shape {
            numbers.push((
                format!("performance.unpaired_noise_floor_by_shape.{shape}"),
                *floor,
            ));
        }
        for (key, value) in numbers {
            if !(value.is_finite() && value >= 0.0) {
                return Err((key, format!("{value} must be a finite number >= 0")));
            }
        }
        for (key, value) in [
            ("kernel", c.kernel.max_err_over_bound),
            ("end_to_end", c.end_to_end.max_err_over_bound),
        ] {
            if value > 1.0 {
                return Err((
                    format!("correctness.{key}.max_err_over_bound"),
                    format!(
                        "{value} allows more error than the error model (1.0); if a correct \
                         kernel exceeds its bound, the model is wrong: fix it in \
                         src/reference/bound.rs, do not loosen the gate"
                    ),
                ));
            }
        }
        if c.relative.factor < 1.0 {
            return Err((
                "correctness.relative.factor".into(),
                format!(
                    "{} must be at least 1 (the kernel cannot be held to beat its own precision)",
                    c.relative.factor
                ),
            ));
        }
        let sc = &c.scale;
        if !(ScaleGate::MIN_ALLOWANCE..=ScaleGate::MODEL_ALLOWANCE).contains(&sc.allowance) {
            return Err((
                "correctness.scale.allowance".into(),
                format!(
                    "{} must lie in [2^-13, 2^-10] = [{}, {}]: above, it allows more than the \
                     model (a correct kernel's slope on its emulation is off only by chance and \
                     what the emulation does not model; if one exceeds it, find what the \
                     emulation does not model); below, it no longer covers that unmodelled part \
                     (measured up to 1e-5) with margin (src/gates.rs ScaleGate)",
                    sc.allowance,
                    ScaleGate::MIN_ALLOWANCE,
                    ScaleGate::MODEL_ALLOWANCE
                ),
            ));
        }
        if !(ScaleGate::MIN_P..=0.01).contains(&sc.p) {
            return Err((
                "correctness.scale.p".into(),
                format!(
                    "{} must lie in [1e-6, 0.01]: the chance that a correct output fails; a \
                     smaller one loosens the gate",
                    sc.p
                ),
            ));
        }
        if !(p.confidence > 0.5 && p.confidence < 1.0) {
            return Err((
                "performance.confidence".into(),
                format!("{} must lie strictly between 0.5 and 1", p.confidence),
            ));
        }
        if self.resources.min_blocks_per_sm == 0 {
            return Err((
                "resources.min_blocks_per_sm".into(),
                "must be at least 1".into(),
            ));
        }
        for e in crate::shapes::Entry::all() {
            if e == crate::shapes::Entry::BASE {
                continue;
            }
            match self.resources_by_entry.get(&e.suffix()) {
                None => {
                    return Err((
                        format!("resources_by_entry.{}", e.suffix()),
                        "is missing: every kernel entry has its own resource limits".into(),
                    ));
                }
                Some(r) if r.min_blocks_per_sm == 0 => {
                    return Err((
                        format!("resources_by_entry.{}.min_blocks_per_sm", e.suffix()),
                        "must be at least 1".into(),
                    ));
                }
                Some(_) => {}
            }
        }
        if let Some(other) = self.resources_by_entry.keys().find(|k| {
            !crate::shapes::Entry::all()
                .iter()
                .any(|e| *e != crate::shapes::Entry::BASE && e.suffix() == **k)
        }) {
            return Err((
                format!("resources_by_entry.{other}"),
                "is not an entry of the kernel (d64_causal, d128, d128_causal)".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{ "version": 2,
      "correctness": {
        "kernel":     { "max_err_over_bound": 1.0 },
        "end_to_end": { "max_err_over_bound": 0.5 },
        "relative":   { "factor": 2.0, "eps_ulps": 1.0 } },
      "resources":   { "max_regs_per_thread": 128, "max_smem_bytes": 65536, "max_spill_bytes": 0, "min_blocks_per_sm": 2 },
      "resources_by_entry": {
        "d64_causal":  { "max_regs_per_thread": 168, "max_smem_bytes": 65536, "max_spill_bytes": 0, "min_blocks_per_sm": 2 },
        "d128":        { "max_regs_per_thread": 255, "max_smem_bytes": 98304, "max_spill_bytes": 0, "min_blocks_per_sm": 2 },
        "d128_causal": { "max_regs_per_thread": 255, "max_smem_bytes": 98304, "max_spill_bytes": 0, "min_blocks_per_sm": 2 } },
      "performance": { "min_speedup_pct": 10.0, "max_regression_pct": 3.0, "confidence": 0.95,
                       "noise_floor_pct": 1.0, "unpaired_noise_floor_pct": 1.0, "target_shapes": ["mission"] } }"#;

    fn parse(text: &str) -> Result<GateFile, String> {
        GateFile::parse(Path::new("gates/x.json"), text).map_err(|e| e.to_string())
    }

    #[test]
    fn a_complete_file_loads() {
        let g = parse(GOOD).unwrap().gates;
        assert_eq!(g.resources.max_regs_per_thread, 128);
        assert_eq!(g.performance.target_shapes, vec!["mission"]);
    }

    #[test]
    fn the_shipped_default_gates_file_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("gates/default.json");
        let g = GateFile::load(&path).unwrap().gates;
        assert_eq!(g.correctness.scale, ScaleGate::default());
    }

    #[test]
    fn a_file_without_the_scale_gate_gets_the_models_and_one_outside_the_models_range_is_refused() {
        assert_eq!(
            parse(GOOD).unwrap().gates.correctness.scale,
            ScaleGate::default()
        );
        let with = |scale: &str| {
            let mut value: serde_json::Value = serde_json::from_str(GOOD).unwrap();
            value["correctness"]["scale"] = serde_json::from_str(scale).unwrap();
            parse(&value.to_string())
        };
        assert!(with(r#"{ "allowance": 0.0005, "p": 1e-4 }"#).is_ok());
        let err = with(r#"{ "allowance": 0.002, "p": 1e-6 }"#).unwrap_err();
        assert!(
            err.contains("correctness.scale.allowance") && err.contains("emulation does not model"),
            "{err}"
        );
        let err = with(r#"{ "allowance": 0.00001, "p": 1e-6 }"#).unwrap_err();
        assert!(err.contains("correctness.scale.allowance"), "{err}");
        for p in ["0.5", "1e-9", "0"] {
            let err = with(&format!(r#"{{ "allowance": 0.0005, "p": {p} }}"#)).unwrap_err();
            assert!(err.contains("correctness.scale.p"), "p {p}: {err}");
        }
        let err = with(r#"{ "allowance": 0.0005 }"#).unwrap_err();
        assert!(err.contains("missing field `p`"), "{err}");
    }

    #[test]
    fn every_kernel_entry_needs_its_own_resource_limits_and_no_unknown_entry_is_taken() {
        let parse = |text: &str| GateFile::parse(Path::new("g.json"), text);
        let mut value: serde_json::Value = serde_json::from_str(GOOD).unwrap();
        let entries = value["resources_by_entry"].as_object_mut().unwrap();
        entries.remove("d128_causal");
        let err = parse(&value.to_string()).unwrap_err().to_string();
        assert!(
            err.contains("resources_by_entry.d128_causal") && err.contains("missing"),
            "{err}"
        );
        let mut value: serde_json::Value = serde_json::from_str(GOOD).unwrap();
        let d128 = value["resources_by_entry"]["d128"].clone();
        value["resources_by_entry"]["d256"] = d128;
        let err = parse(&value.to_string()).unwrap_err().to_string();
        assert!(err.contains("resources_by_entry"), "{err}");
        assert!(parse(GOOD).is_ok());
    }

    #[test]
    fn an_unknown_key_is_an_error_naming_file_and_key() {
        let err = parse(&GOOD.replace("\"eps_ulps\": 1.0", "\"eps_ulps\": 1.0, \"typo\": 1"))
            .unwrap_err();
        assert!(
            err.contains("gates/x.json") && err.contains("typo"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_key_is_an_error_naming_it() {
        let err = parse(&GOOD.replace("\"max_spill_bytes\": 0,", "")).unwrap_err();
        assert!(
            err.contains("max_spill_bytes") && err.contains("resources"),
            "{err}"
        );
    }

    #[test]
    fn a_negative_threshold_is_an_error_naming_its_key() {
        let err = parse(&GOOD.replace(
            "\"max_err_over_bound\": 0.5",
            "\"max_err_over_bound\": -0.5",
        ))
        .unwrap_err();
        assert!(
            err.contains("correctness.end_to_end.max_err_over_bound"),
            "{err}"
        );
        let err = parse(&GOOD.replace(
            "\"max_regs_per_thread\": 128",
            "\"max_regs_per_thread\": -1",
        ))
        .unwrap_err();
        assert!(err.contains("resources.max_regs_per_thread"), "{err}");
    }

    #[test]
    fn a_limit_looser_than_the_error_model_is_refused_pointing_at_the_model() {
        let err =
            parse(&GOOD.replace("\"max_err_over_bound\": 1.0", "\"max_err_over_bound\": 1.5"))
                .unwrap_err();
        assert!(
            err.contains("correctness.kernel.max_err_over_bound")
                && err.contains("src/reference/bound.rs"),
            "{err}"
        );
    }

    #[test]
    fn a_version_1_file_with_fixed_thresholds_is_refused_with_the_reason() {
        let err = parse(&GOOD.replace("\"version\": 2", "\"version\": 1")).unwrap_err();
        assert!(
            err.contains("version 1") && err.contains("error model"),
            "{err}"
        );
    }

    #[test]
    fn a_shape_name_the_shapes_file_lacks_is_refused_naming_the_key() {
        let g = parse(&GOOD.replace("[\"mission\"]", "[\"nosuchshape\"]")).unwrap();
        let err = g
            .check_shape_names(|s| s == "mission", Path::new("shapes/x.json"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("performance.target_shapes") && err.contains("nosuchshape"),
            "{err}"
        );
        parse(GOOD)
            .unwrap()
            .check_shape_names(|s| s == "mission", Path::new("shapes/x.json"))
            .unwrap();
    }

    #[test]
    fn a_wrong_version_is_refused() {
        let err = parse(&GOOD.replace("\"version\": 2", "\"version\": 3")).unwrap_err();
        assert!(err.contains("version"), "{err}");
    }
}
