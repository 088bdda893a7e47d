//! Noise floors measured per GPU model (docs/DESIGN.md "Measured noise floors"): how far two
//! separate processes timing the same kernel on the same shape drift apart, measured by
//! `sdpa-runner noise` and used by `compare` instead of a constant tuned on one GPU.
//!
//! From N processes' medians of one shape, s is the standard deviation of their logarithms;
//! its one-sided 95% upper bound from N − 1 degrees of freedom is σ_U = s·√((N − 1) / χ²₀.₀₅)
//! (statrs), and the difference of two processes is N(0, 2σ²), so the floor that two
//! processes of the same code exceed one time in twenty at most is z₀.₉₇₅·√2·σ_U, in percent.
//! The unpaired verdict also needs its confidence interval beyond the floor, so its false rate
//! stays below that.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use statrs::distribution::{ChiSquared, ContinuousCDF};

use crate::usage::ConfigError;

/// The committed floors, relative to the checkout.
pub const DEFAULT_FILE: &str = "gates/noise_floors.json";
const VERSION: u32 = 1;

/// Where no floor was measured for a GPU model and shape, compare uses the gates file's
/// unpaired floor but never less than this: the H100's measured process-to-process drift on
/// mission reached 2.35% against the 1.0% tuned on an H200.
pub const UNMEASURED_MIN_PCT: f64 = 3.0;

/// `gates/noise_floors.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FloorFile {
    pub version: u32,
    /// GPU model (as perf.json's `device_name`) -> its floors.
    pub gpus: BTreeMap<String, GpuFloors>,
}

/// The floors of one GPU model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuFloors {
    pub measured_at: String,
    /// Separate processes timed.
    pub processes: usize,
    /// The variant timed, and the kernel source it was built from.
    pub variant: String,
    pub kernel_sha256: String,
    /// shape -> its floor.
    pub shapes: BTreeMap<String, ShapeFloor>,
}

/// The floor of one shape, and what it was computed from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShapeFloor {
    pub floor_pct: f64,
    /// s and σ_U, in percent.
    pub sd_pct: f64,
    pub sd_upper_pct: f64,
    /// The largest difference between two of the processes, percent.
    pub max_pair_pct: f64,
    /// Each process's median, µs.
    pub p50_us: Vec<f64>,
}

impl ShapeFloor {
    /// The floor from `p50s`, one median per process (at least 3).
    pub fn from_medians(p50s: &[f64]) -> Option<Self> {
        let n = p50s.len();
        if n < 3 || p50s.iter().any(|x| !(x.is_finite() && *x > 0.0)) {
            return None;
        }
        let logs: Vec<f64> = p50s.iter().map(|x| x.ln()).collect();
        let mean = logs.iter().sum::<f64>() / n as f64;
        let var = logs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        let s = var.sqrt();
        let dof = (n - 1) as f64;
        let chi = ChiSquared::new(dof).ok()?.inverse_cdf(0.05);
        let upper = s * (dof / chi).sqrt();
        let z = 1.959_963_984_540_054;
        let pct = |x: f64| 100.0 * x.exp_m1();
        let mut max_pair = 0f64;
        for (i, a) in p50s.iter().enumerate() {
            for b in &p50s[i + 1..] {
                max_pair = max_pair.max(100.0 * ((a / b).max(b / a) - 1.0));
            }
        }
        Some(ShapeFloor {
            floor_pct: pct(z * std::f64::consts::SQRT_2 * upper),
            sd_pct: pct(s),
            sd_upper_pct: pct(upper),
            max_pair_pct: max_pair,
            p50_us: p50s.to_vec(),
        })
    }
}

/// The floor compare uses for one shape, and where it came from, in words.
#[derive(Debug, Clone, PartialEq)]
pub struct FloorChoice {
    pub pct: f64,
    pub source: String,
}

impl FloorFile {
    /// Reads `path`; `Ok(None)` when it does not exist. A file that does not parse, or of
    /// another version, is refused naming the key.
    pub fn load(path: &Path) -> Result<Option<Self>, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        let de = &mut serde_json::Deserializer::from_str(&text);
        let file: FloorFile = serde_path_to_error::deserialize(de).map_err(|e| {
            ConfigError::invalid_key(
                path,
                e.path().to_string(),
                format!("{}; measure again with `sdpa-runner noise`", e.inner()),
            )
        })?;
        if file.version != VERSION {
            return Err(ConfigError::invalid_key(
                path,
                "version",
                format!(
                    "{} is not {VERSION}; measure again with `sdpa-runner noise`",
                    file.version
                ),
            ));
        }
        for (gpu, g) in &file.gpus {
            for (shape, f) in &g.shapes {
                // Any positive percentage: a noisy machine may measure floors above 100%.
                if !(f.floor_pct.is_finite() && f.floor_pct > 0.0) {
                    return Err(ConfigError::invalid_key(
                        path,
                        format!("gpus.{gpu}.shapes.{shape}.floor_pct"),
                        format!("{} is not a percentage above 0", f.floor_pct),
                    ));
                }
            }
        }
        Ok(Some(file))
    }

    /// The unpaired floor of `shape` on `gpu`: the measured one, else the gates file's
    /// (`gates_floor`) raised to [`UNMEASURED_MIN_PCT`], each with its source in words. A floor
    /// measured with another kernel build than the runs' (`kernel`, its source's sha256) is
    /// still used (it is the GPU's and the harness's noise, relative to the time), and says so.
    pub fn choose(
        file: Option<&FloorFile>,
        path: &Path,
        (gpu, kernel): (&str, Option<&str>),
        shape: &str,
        gates_floor: f64,
    ) -> FloorChoice {
        let fallback = |why: String| FloorChoice {
            pct: gates_floor.max(UNMEASURED_MIN_PCT),
            source: format!(
                "{why}: the conservative default, max(gates file {gates_floor}%, {UNMEASURED_MIN_PCT}%)"
            ),
        };
        let Some(file) = file else {
            return fallback(format!("no floors file at {}", path.display()));
        };
        let Some(g) = file.gpus.get(gpu) else {
            let known: Vec<&str> = file.gpus.keys().map(String::as_str).collect();
            return fallback(format!(
                "no floors measured on {gpu} ({} has {})",
                path.display(),
                if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                }
            ));
        };
        let Some(f) = g.shapes.get(shape) else {
            return fallback(format!("no floor measured for {shape} on {gpu}"));
        };
        let other_kernel = match kernel {
            Some(k) if k != g.kernel_sha256 => format!(
                "; measured with kernel {}, these runs' is {}: used, the floor is the GPU's noise",
                &g.kernel_sha256[..12.min(g.kernel_sha256.len())],
                &k[..12.min(k.len())]
            ),
            _ => String::new(),
        };
        FloorChoice {
            pct: f.floor_pct,
            source: format!(
                "measured on {gpu}: {} processes of {} on {} (95% upper bound of their spread), {}{other_kernel}",
                g.processes,
                g.variant,
                g.measured_at,
                path.display()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_the_two_process_quantile_from_an_upper_bound_of_the_spread() {
        // Medians 1% apart around 100 µs: s ≈ 0.79%, and with 5 processes the upper bound
        // is about 2.37 s, the floor 1.96·√2 of it.
        let f = ShapeFloor::from_medians(&[99.0, 100.0, 101.0, 100.0, 99.5]).unwrap();
        assert!((f.sd_pct - 0.76).abs() < 0.05, "{f:?}");
        assert!(
            f.sd_upper_pct > 1.8 * f.sd_pct && f.sd_upper_pct < 3.0 * f.sd_pct,
            "{f:?}"
        );
        let expected = 100.0 * (1.96 * 2f64.sqrt() * f.sd_upper_pct / 100.0).exp_m1();
        assert!((f.floor_pct - expected).abs() < 0.05, "{f:?}");
        assert!((f.max_pair_pct - 100.0 * (101.0 / 99.0 - 1.0)).abs() < 1e-9);
        // More processes, the same spread: a tighter bound.
        let many: Vec<f64> = (0..40)
            .map(|i| [99.0, 100.0, 101.0, 100.0, 99.5][i % 5])
            .collect();
        assert!(ShapeFloor::from_medians(&many).unwrap().floor_pct < f.floor_pct);
        assert!(ShapeFloor::from_medians(&[1.0, 2.0]).is_none());
        assert!(ShapeFloor::from_medians(&[1.0, 2.0, f64::NAN]).is_none());
    }

    #[test]
    fn compare_uses_the_measured_floor_and_otherwise_a_conservative_default_saying_why() {
        let path = Path::new("gates/noise_floors.json");
        let mut file = FloorFile {
            version: 1,
            gpus: BTreeMap::new(),
        };
        file.gpus.insert(
            "NVIDIA H100".into(),
            GpuFloors {
                measured_at: "2026-11-25".into(),
                processes: 12,
                variant: "cp0".into(),
                kernel_sha256: "k".into(),
                shapes: [(
                    "mission".to_string(),
                    ShapeFloor::from_medians(&[10.0, 10.1, 9.9]).unwrap(),
                )]
                .into(),
            },
        );
        let h100 = ("NVIDIA H100", Some("k"));
        let rebuilt = FloorFile::choose(
            Some(&file),
            path,
            ("NVIDIA H100", Some("k2")),
            "mission",
            1.0,
        );
        assert!(
            rebuilt
                .source
                .contains("measured with kernel k, these runs' is k2"),
            "{rebuilt:?}"
        );
        let got = FloorFile::choose(Some(&file), path, h100, "mission", 1.0);
        assert!(!got.source.contains("measured with kernel") && rebuilt.pct == got.pct);
        assert!(
            got.source
                .starts_with("measured on NVIDIA H100: 12 processes"),
            "{got:?}"
        );
        let other_gpu = FloorFile::choose(Some(&file), path, ("NVIDIA H200", None), "mission", 1.0);
        assert_eq!(other_gpu.pct, UNMEASURED_MIN_PCT);
        assert!(
            other_gpu
                .source
                .contains("no floors measured on NVIDIA H200"),
            "{other_gpu:?}"
        );
        let other_shape = FloorFile::choose(Some(&file), path, h100, "long", 4.0);
        assert_eq!(other_shape.pct, 4.0);
        assert!(other_shape.source.contains("no floor measured for long"));
        let none = FloorFile::choose(None, path, h100, "mission", 1.0);
        assert!(none.source.contains("no floors file"));
    }

    #[test]
    fn the_committed_floors_name_both_gpu_models_and_every_measured_shape() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(DEFAULT_FILE);
        let file = FloorFile::load(&path)
            .unwrap()
            .expect("gates/noise_floors.json is committed");
        for gpu in ["NVIDIA H100 80GB HBM3", "NVIDIA H200"] {
            let g = &file.gpus[gpu];
            assert!(g.processes >= 10, "{gpu}");
            for shape in ["small", "mission", "long"] {
                let f = &g.shapes[shape];
                assert_eq!(f.p50_us.len(), g.processes, "{gpu} {shape}");
                let again = ShapeFloor::from_medians(&f.p50_us).unwrap();
                assert!(
                    (again.floor_pct - f.floor_pct).abs() < 1e-9,
                    "{gpu} {shape}: recomputed"
                );
            }
        }
    }

    #[test]
    fn a_malformed_or_foreign_floors_file_is_refused_naming_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.json");
        assert!(FloorFile::load(&p).unwrap().is_none(), "missing: none");
        for (text, key) in [
            ("{", "line"),
            (r#"{"version": 2, "gpus": {}}"#, "version"),
            (r#"{"version": 1, "gpus": {}, "extra": 1}"#, "extra"),
            (
                r#"{"version": 1, "gpus": {"G": {"measured_at": "x", "processes": 3, "variant": "cp0", "kernel_sha256": "k", "shapes": {"s": {"floor_pct": -1, "sd_pct": 0, "sd_upper_pct": 0, "max_pair_pct": 0, "p50_us": []}}}}}"#,
                "floor_pct",
            ),
        ] {
            std::fs::write(&p, text).unwrap();
            let err = FloorFile::load(&p).unwrap_err().to_string();
            assert!(err.contains(key) && err.contains("f.json"), "{text}: {err}");
        }
    }
}
