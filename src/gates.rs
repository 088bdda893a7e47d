//! The gates file: every pass/fail threshold in one versioned JSON file, read strictly
//! (unknown, missing or negative keys are errors naming the file and key).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::usage::ConfigError;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gates {
    pub version: u32,
    pub correctness: CorrectnessGates,
    pub resources: ResourceGates,
    pub performance: PerformanceGates,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CorrectnessGates {
    /// Against the f64 reference on the dequantized inputs: the kernel's own error.
    pub kernel: ErrorGate,
    /// Against the f64 reference on the original f32 inputs: kernel plus quantization error.
    pub end_to_end: ErrorGate,
    /// Kernel error relative to the CPU emulation's error in the same precisions.
    pub relative: RelativeGate,
    /// End-to-end limits for named shapes whose inputs are conditioned so that FP8
    /// quantization alone exceeds the general limits (e.g. wide score ranges).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub end_to_end_by_shape: BTreeMap<String, ErrorGate>,
}

impl CorrectnessGates {
    /// The end-to-end limits that apply to `shape`.
    pub fn end_to_end_for(&self, shape: &str) -> &ErrorGate {
        self.end_to_end_by_shape
            .get(shape)
            .unwrap_or(&self.end_to_end)
    }
}

/// Absolute error limits and the rule that marks one element as bad:
/// `|out - ref| > bad_atol + bad_rtol * |ref|`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorGate {
    pub max_abs_err: f64,
    pub mean_abs_err: f64,
    /// Percent of elements allowed to be bad.
    pub pct_bad: f64,
    pub bad_atol: f64,
    pub bad_rtol: f64,
}

/// `kernel_err <= factor * emulation_err + eps`, for the max and the mean absolute error
/// against the kernel reference (FlashAttention's tests use factor 2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelativeGate {
    pub factor: f64,
    pub max_abs_eps: f64,
    pub mean_abs_eps: f64,
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
            )
            .chain(
                self.gates
                    .correctness
                    .end_to_end_by_shape
                    .keys()
                    .map(|s| (format!("correctness.end_to_end_by_shape.{s}"), s)),
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
    /// Range checks serde cannot express; the error is (dotted key, message).
    fn validate(&self) -> Result<(), (String, String)> {
        if self.version != 1 {
            return Err((
                "version".into(),
                format!(
                    "version {} is not supported; this runner reads version 1",
                    self.version
                ),
            ));
        }
        let c = &self.correctness;
        let mut numbers: Vec<(String, f64)> = Vec::new();
        let mut error_gates = vec![
            ("kernel".to_string(), &c.kernel),
            ("end_to_end".to_string(), &c.end_to_end),
        ];
        for (shape, gate) in &c.end_to_end_by_shape {
            error_gates.push((format!("end_to_end_by_shape.{shape}"), gate));
        }
        for (name, gate) in error_gates {
            for (key, value) in [
                ("max_abs_err", gate.max_abs_err),
                ("mean_abs_err", gate.mean_abs_err),
                ("pct_bad", gate.pct_bad),
                ("bad_atol", gate.bad_atol),
                ("bad_rtol", gate.bad_rtol),
            ] {
                numbers.push((format!("correctness.{name}.{key}"), value));
            }
        }
        numbers.push(("correctness.relative.factor".into(), c.relative.factor));
        numbers.push((
            "correctness.relative.max_abs_eps".into(),
            c.relative.max_abs_eps,
        ));
        numbers.push((
            "correctness.relative.mean_abs_eps".into(),
            c.relative.mean_abs_eps,
        ));
        let p = &self.performance;
        numbers.push(("performance.min_speedup_pct".into(), p.min_speedup_pct));
        numbers.push((
            "performance.max_regression_pct".into(),
            p.max_regression_pct,
        ));
        numbers.push(("performance.noise_floor_pct".into(), p.noise_floor_pct));
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
        let pct_bads = [
            ("kernel".to_string(), c.kernel.pct_bad),
            ("end_to_end".to_string(), c.end_to_end.pct_bad),
        ]
        .into_iter()
        .chain(
            c.end_to_end_by_shape
                .iter()
                .map(|(s, g)| (format!("end_to_end_by_shape.{s}"), g.pct_bad)),
        );
        for (key, value) in pct_bads {
            if value > 100.0 {
                return Err((
                    format!("correctness.{key}.pct_bad"),
                    format!("{value} is over 100 percent"),
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
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{ "version": 1,
      "correctness": {
        "kernel":     { "max_abs_err": 0.01, "mean_abs_err": 0.001, "pct_bad": 0.0, "bad_atol": 0.005, "bad_rtol": 0.01 },
        "end_to_end": { "max_abs_err": 0.06, "mean_abs_err": 0.01,  "pct_bad": 1.0, "bad_atol": 0.05, "bad_rtol": 0.0 },
        "relative":   { "factor": 2.0, "max_abs_eps": 0.001, "mean_abs_eps": 0.0001 } },
      "resources":   { "max_regs_per_thread": 128, "max_smem_bytes": 65536, "max_spill_bytes": 0, "min_blocks_per_sm": 2 },
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
        GateFile::load(&path).unwrap();
    }

    #[test]
    fn an_unknown_key_is_an_error_naming_file_and_key() {
        let err = parse(&GOOD.replace("\"bad_rtol\": 0.0", "\"bad_rtol\": 0.0, \"typo\": 1"))
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
        let err =
            parse(&GOOD.replace("\"max_abs_err\": 0.06", "\"max_abs_err\": -0.06")).unwrap_err();
        assert!(err.contains("correctness.end_to_end.max_abs_err"), "{err}");
        let err = parse(&GOOD.replace(
            "\"max_regs_per_thread\": 128",
            "\"max_regs_per_thread\": -1",
        ))
        .unwrap_err();
        assert!(err.contains("resources.max_regs_per_thread"), "{err}");
    }

    #[test]
    fn per_shape_end_to_end_limits_apply_to_their_shape_only() {
        let text = GOOD.replace(
            "\"relative\":",
            "\"end_to_end_by_shape\": { \"wide\": { \"max_abs_err\": 1.0, \"mean_abs_err\": 0.1, \"pct_bad\": 30.0, \"bad_atol\": 0.05, \"bad_rtol\": 0.0 } }, \"relative\":",
        );
        let g = parse(&text).unwrap().gates.correctness;
        assert_eq!(g.end_to_end_for("wide").max_abs_err, 1.0);
        assert_eq!(g.end_to_end_for("mission").max_abs_err, 0.06);
        let bad = text.replace("\"max_abs_err\": 1.0", "\"max_abs_err\": -1.0");
        assert!(
            parse(&bad)
                .unwrap_err()
                .contains("end_to_end_by_shape.wide.max_abs_err")
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
        let err = parse(&GOOD.replace("\"version\": 1", "\"version\": 2")).unwrap_err();
        assert!(err.contains("version"), "{err}");
    }
}
