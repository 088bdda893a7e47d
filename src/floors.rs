//! Noise floors measured per GPU model (docs/DESIGN.md "Measured noise floors"): how far two
//! separate processes timing the same kernel on the same shape drift apart, measured by
//! `sdpa-runner noise` and used by `compare` instead of a constant tuned on one GPU; and how
//! far two arms of the same code drift apart inside one run (`noise --paired`), the in-run
//! floor every paired verdict of that GPU model uses.
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

/// No floor, in-run or between processes, is below this: a difference under 0.2% is not called
/// a change, whatever the A/A runs sampled (medians on the timer's 32 ns steps can all be
/// equal, a spread of 0).
pub const MIN_FLOOR_PCT: f64 = 0.2;

/// Fewest in-run A/A comparisons a paired floor may rest on.
pub const PAIRED_MIN_COMPARISONS: usize = 10;

/// `gates/noise_floors.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FloorFile {
    pub version: u32,
    /// GPU model (as perf.json's `device_name`) -> its floors between processes.
    pub gpus: BTreeMap<String, GpuFloors>,
    /// GPU model -> its in-run (paired) floors (`noise --paired`), of the default kernel.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub paired: BTreeMap<String, PairedFloors>,
    /// Another kernel's source file name (e.g. `sdpa_fp8_stage_d_wgmma.cu`) -> GPU model -> its
    /// in-run floors (`noise --paired --kernel`): a run of that kernel uses them before
    /// `paired`'s.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub paired_kernels: BTreeMap<String, BTreeMap<String, PairedFloors>>,
}

/// The in-run floors of one GPU model: runs of the PR gate whose base kernel is the kernel
/// under test, so that every comparison against the base is an A/A of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairedFloors {
    pub measured_at: String,
    /// Runs (separate processes), and the seeds each timed.
    pub runs: usize,
    pub seeds: Vec<u64>,
    pub kernel_sha256: String,
    /// shape -> its floor.
    pub shapes: BTreeMap<String, PairedShapeFloor>,
}

/// The in-run floor of one shape, and the A/A differences it was computed from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairedShapeFloor {
    pub floor_pct: f64,
    /// r (the root mean square of the A/A log ratios about zero: a bias counts) and its 95%
    /// upper bound, in percent.
    pub rms_pct: f64,
    pub rms_upper_pct: f64,
    /// The largest A/A difference seen, percent.
    pub max_abs_pct: f64,
    /// Each A/A comparison's speedup, percent (every variant of every run).
    pub speedups_pct: Vec<f64>,
    /// Where it was measured, when that is not its entry's latest `noise --paired` run (a later
    /// run measured other shapes and kept this one: [`PairedFloors::merged`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<PairedOrigin>,
}

/// Where an in-run floor was measured: one `noise --paired` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairedOrigin {
    pub measured_at: String,
    pub runs: usize,
    pub seeds: Vec<u64>,
    pub kernel_sha256: String,
}

impl PairedFloors {
    /// Where `f`, one of this entry's floors, was measured: its own origin, else the entry's.
    pub fn origin_of(&self, f: &PairedShapeFloor) -> PairedOrigin {
        f.origin.clone().unwrap_or_else(|| PairedOrigin {
            measured_at: self.measured_at.clone(),
            runs: self.runs,
            seeds: self.seeds.clone(),
            kernel_sha256: self.kernel_sha256.clone(),
        })
    }

    /// `newer` (a later `noise --paired` run of this GPU model and kernel) over this entry: its
    /// run's header and floors, and every shape it did not measure kept with the origin it was
    /// measured at; with the names of the kept shapes. Measuring some shapes loses no other.
    pub fn merged(self, mut newer: PairedFloors) -> (PairedFloors, Vec<String>) {
        let kept = keep_unmeasured(&self.shapes, &mut newer.shapes, |f| PairedShapeFloor {
            origin: Some(self.origin_of(f)),
            ..f.clone()
        });
        (newer, kept)
    }
}

impl PairedShapeFloor {
    /// The floor from in-run A/A speedups (at least [`PAIRED_MIN_COMPARISONS`]) of `runs`
    /// separate processes: each is one run's estimate of a difference that is zero, so with r
    /// their root mean square about zero and r_U = r·√(ν / χ²₀.₀₅,ν), an A/A comparison
    /// exceeds z₀.₉₇₅·r_U one time in twenty at most. ν is the number of runs, not of
    /// comparisons: the comparisons of one run (cp0 and cp1 against their twins) share its
    /// process and are not independent, so counting them all would narrow the bound. The
    /// verdict also needs its interval beyond the floor, so its false rate stays below that.
    /// Never below [`MIN_FLOOR_PCT`].
    pub fn from_speedups(speedups_pct: &[f64], runs: usize) -> Option<Self> {
        let n = speedups_pct.len();
        if n < PAIRED_MIN_COMPARISONS
            || runs == 0
            || runs > n
            || speedups_pct.iter().any(|x| !(x.is_finite() && *x > -100.0))
        {
            return None;
        }
        let logs: Vec<f64> = speedups_pct.iter().map(|x| (x / 100.0).ln_1p()).collect();
        let rms = (logs.iter().map(|x| x * x).sum::<f64>() / n as f64).sqrt();
        let dof = runs as f64;
        let chi = ChiSquared::new(dof).ok()?.inverse_cdf(0.05);
        let upper = rms * (dof / chi).sqrt();
        let pct = |x: f64| 100.0 * x.exp_m1();
        Some(PairedShapeFloor {
            floor_pct: pct(Z_975 * upper).max(MIN_FLOOR_PCT),
            rms_pct: pct(rms),
            rms_upper_pct: pct(upper),
            max_abs_pct: speedups_pct.iter().fold(0f64, |m, x| m.max(x.abs())),
            speedups_pct: speedups_pct.to_vec(),
            origin: None,
        })
    }
}

const Z_975: f64 = 1.959_963_984_540_054;

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
    /// Where it was measured, when that is not its entry's latest `noise` run (a later run
    /// measured other shapes and kept this one: [`GpuFloors::merged`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<ProcessOrigin>,
}

/// Where a floor between processes was measured: one `noise` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessOrigin {
    pub measured_at: String,
    pub processes: usize,
    pub variant: String,
    pub kernel_sha256: String,
}

impl GpuFloors {
    /// Where `f`, one of this entry's floors, was measured: its own origin, else the entry's.
    pub fn origin_of(&self, f: &ShapeFloor) -> ProcessOrigin {
        f.origin.clone().unwrap_or_else(|| ProcessOrigin {
            measured_at: self.measured_at.clone(),
            processes: self.processes,
            variant: self.variant.clone(),
            kernel_sha256: self.kernel_sha256.clone(),
        })
    }

    /// `newer` over this entry, as [`PairedFloors::merged`].
    pub fn merged(self, mut newer: GpuFloors) -> (GpuFloors, Vec<String>) {
        let kept = keep_unmeasured(&self.shapes, &mut newer.shapes, |f| ShapeFloor {
            origin: Some(self.origin_of(f)),
            ..f.clone()
        });
        (newer, kept)
    }
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
        let z = Z_975;
        let pct = |x: f64| 100.0 * x.exp_m1();
        let mut max_pair = 0f64;
        for (i, a) in p50s.iter().enumerate() {
            for b in &p50s[i + 1..] {
                max_pair = max_pair.max(100.0 * ((a / b).max(b / a) - 1.0));
            }
        }
        Some(ShapeFloor {
            floor_pct: pct(z * std::f64::consts::SQRT_2 * upper).max(MIN_FLOOR_PCT),
            sd_pct: pct(s),
            sd_upper_pct: pct(upper),
            max_pair_pct: max_pair,
            p50_us: p50s.to_vec(),
            origin: None,
        })
    }
}

/// The floor compare uses for one shape, and where it came from, in words.
#[derive(Debug, Clone, PartialEq)]
pub struct FloorChoice {
    pub pct: f64,
    pub source: String,
}

/// `; measured with kernel X, these runs' is Y: ...` when the floor was measured with another
/// kernel source than `kernel`, else nothing.
fn other_kernel(measured: &str, kernel: Option<&str>) -> String {
    match kernel {
        Some(k) if k != measured => format!(
            "; measured with kernel {}, these runs' is {}: used, the floor is the GPU's noise",
            &measured[..12.min(measured.len())],
            &k[..12.min(k.len())]
        ),
        _ => String::new(),
    }
}

/// The floors file as a run or merge reads it: where it is, and what it holds (None when
/// there is no file there).
pub struct Floors {
    pub path: std::path::PathBuf,
    pub file: Option<FloorFile>,
}

impl Floors {
    pub fn load(path: std::path::PathBuf) -> Result<Self, ConfigError> {
        let file = FloorFile::load(&path)?;
        Ok(Floors { path, file })
    }

    /// The in-run floor of each shape of a run ([`FloorFile::choose_paired`]): on its GPU
    /// model, for its kernel under test (the first variant that is not the base kernel's).
    pub fn paired_chooser(
        &self,
        perf: Option<&crate::schema::PerfFile>,
        gates_floor: f64,
    ) -> impl Fn(&str) -> FloorChoice + '_ {
        let gpu = perf.map_or_else(String::new, |p| p.device_name.clone());
        let kernel = perf.and_then(|p| {
            p.variants
                .iter()
                .find(|v| !v.is_base())
                .and_then(|v| v.kernel.clone())
        });
        let sha = kernel.as_ref().map(|k| k.sha256.clone());
        let file_name = kernel.as_ref().and_then(|k| kernel_file_name(&k.source));
        move |shape| {
            FloorFile::choose_paired(
                self.file.as_ref(),
                &self.path,
                (&gpu, sha.as_deref(), file_name.as_deref()),
                shape,
                gates_floor,
            )
        }
    }
}

/// The file name of a kernel source as runs record it (`KernelRef::source`: a path, or
/// `git:REV (sha):PATH`), the key of `FloorFile::paired_kernels`.
pub fn kernel_file_name(source: &str) -> Option<String> {
    let path = source.rsplit(':').next()?;
    Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
}

/// Puts every floor of `older` whose shape `newer` lacks into `newer`, as `with_origin` makes
/// it (the floor, stamped with where it was measured); returns those shapes.
fn keep_unmeasured<F>(
    older: &BTreeMap<String, F>,
    newer: &mut BTreeMap<String, F>,
    with_origin: impl Fn(&F) -> F,
) -> Vec<String> {
    let kept: Vec<String> = older
        .keys()
        .filter(|shape| !newer.contains_key(*shape))
        .cloned()
        .collect();
    for shape in &kept {
        newer.insert(shape.clone(), with_origin(&older[shape]));
    }
    kept
}

impl FloorFile {
    /// Reads `path`; `Ok(None)` when it does not exist. A file that does not parse, or of
    /// another version, is refused naming the key.
    pub fn load(path: &Path) -> Result<Option<Self>, ConfigError> {
        let Some(text) = crate::json::read_text_if_any(path)? else {
            return Ok(None);
        };
        let file: FloorFile = crate::json::from_str_with_path(path, &text).map_err(|e| {
            ConfigError::Usage(format!(
                "{e}; fix that key or remove the file, then measure again with `sdpa-runner noise`"
            ))
        })?;
        if file.version != VERSION {
            return Err(ConfigError::invalid_key(
                path,
                "version",
                format!(
                    "{} is not {VERSION}; remove the file and measure again with `sdpa-runner noise`",
                    file.version
                ),
            ));
        }
        // Any percentage from the minimum up (a noisy machine may measure floors above 100%),
        // between processes and in-run alike.
        let between = file.gpus.iter().flat_map(|(gpu, g)| {
            g.shapes
                .iter()
                .map(move |(shape, f)| (format!("gpus.{gpu}.shapes.{shape}"), f.floor_pct))
        });
        // In-run: the default kernel's section, then each other kernel's.
        let sections = std::iter::once(("paired".to_string(), &file.paired)).chain(
            file.paired_kernels
                .iter()
                .map(|(k, gpus)| (format!("paired_kernels.{k}"), gpus)),
        );
        let in_run = sections.flat_map(|(section, gpus)| {
            gpus.iter().flat_map(move |(gpu, g)| {
                let section = section.clone();
                g.shapes
                    .iter()
                    .map(move |(shape, f)| (format!("{section}.{gpu}.shapes.{shape}"), f.floor_pct))
            })
        });
        for (key, floor) in between.chain(in_run) {
            if !(floor.is_finite() && floor >= MIN_FLOOR_PCT) {
                return Err(ConfigError::invalid_key(
                    path,
                    format!("{key}.floor_pct"),
                    format!("{floor} is not a percentage of at least {MIN_FLOOR_PCT}"),
                ));
            }
        }
        Ok(Some(file))
    }

    /// The in-run (paired) floor of `shape` on `gpu`: the one measured for the run's kernel
    /// file (`kernel_file`, `noise --paired --kernel`), else the default kernel's (`noise
    /// --paired`), else the gates file's constant (`gates_floor`), each with its source in
    /// words. Like [`FloorFile::choose`], a floor measured with another kernel source than the
    /// run's (`kernel`, its sha256) is used and says so.
    pub fn choose_paired(
        file: Option<&FloorFile>,
        path: &Path,
        (gpu, kernel, kernel_file): (&str, Option<&str>, Option<&str>),
        shape: &str,
        gates_floor: f64,
    ) -> FloorChoice {
        let fallback = |why: String| FloorChoice {
            pct: gates_floor,
            source: format!("{why}: the gates file's constant {gates_floor}%"),
        };
        let Some(file) = file else {
            return fallback(format!("no floors file at {}", path.display()));
        };
        let measured = |on: String, g: &PairedFloors, f: &PairedShapeFloor| {
            let origin = g.origin_of(f);
            FloorChoice {
                pct: f.floor_pct,
                source: format!(
                    "measured on {on}: {} in-run A/A comparisons in {} runs (95% upper bound of \
                     their spread, at least {MIN_FLOOR_PCT}%), {}, {}{}",
                    f.speedups_pct.len(),
                    origin.runs,
                    origin.measured_at,
                    path.display(),
                    other_kernel(&origin.kernel_sha256, kernel)
                ),
            }
        };
        let own = kernel_file.and_then(|k| {
            let g = file.paired_kernels.get(k)?.get(gpu)?;
            Some(measured(format!("{gpu} for {k}"), g, g.shapes.get(shape)?))
        });
        if let Some(choice) = own {
            return choice;
        }
        let Some(g) = file.paired.get(gpu) else {
            return fallback(format!(
                "no in-run floors measured on {gpu} in {} (`sdpa-runner noise --paired`)",
                path.display()
            ));
        };
        let Some(f) = g.shapes.get(shape) else {
            return fallback(format!("no in-run floor measured for {shape} on {gpu}"));
        };
        measured(gpu.to_string(), g, f)
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
        let origin = g.origin_of(f);
        let other_kernel = other_kernel(&origin.kernel_sha256, kernel);
        FloorChoice {
            pct: f.floor_pct,
            source: format!(
                "measured on {gpu}: {} processes of {} on {} (95% upper bound of their spread), {}{other_kernel}",
                origin.processes,
                origin.variant,
                origin.measured_at,
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
        // Equal medians (the timer's steps): a spread of 0, the floor the minimum.
        let flat = ShapeFloor::from_medians(&[9.344; 12]).unwrap();
        assert!(
            flat.sd_pct < 1e-9 && flat.floor_pct == MIN_FLOOR_PCT,
            "{flat:?}"
        );
        assert!(ShapeFloor::from_medians(&[1.0, 2.0, f64::NAN]).is_none());
    }

    #[test]
    fn the_in_run_floor_is_the_a_a_quantile_from_an_upper_bound_of_the_rms_never_below_the_minimum()
    {
        // A/A differences of ±0.3% around a bias of +0.1%: the rms about zero counts the bias.
        let aa: Vec<f64> = (0..20)
            .map(|i| 0.1 + if i % 2 == 0 { 0.3 } else { -0.3 })
            .collect();
        // Two comparisons per run: 10 runs, 10 degrees of freedom.
        let f = PairedShapeFloor::from_speedups(&aa, 10).unwrap();
        let rms = ((0.4f64.powi(2) + 0.2f64.powi(2)) / 2.0).sqrt();
        assert!((f.rms_pct - rms).abs() < 0.002, "{f:?}");
        let chi = ChiSquared::new(10.0).unwrap().inverse_cdf(0.05);
        let expected = 100.0 * (Z_975 * (f.rms_upper_pct / 100.0).ln_1p()).exp_m1();
        assert!(
            (f.rms_upper_pct / f.rms_pct - (10.0 / chi).sqrt()).abs() < 0.01,
            "{f:?}"
        );
        assert!((f.floor_pct - expected).abs() < 1e-9, "{f:?}");
        assert!(f.floor_pct > 0.9 && f.floor_pct < 1.1, "{f:?}");
        // The same values as 20 independent runs: a narrower bound.
        let independent = PairedShapeFloor::from_speedups(&aa, 20).unwrap();
        assert!(independent.floor_pct < f.floor_pct - 0.1, "{independent:?}");
        assert!((f.max_abs_pct - 0.4).abs() < 1e-12);
        // A/A differences far below the minimum: the minimum.
        let tight = PairedShapeFloor::from_speedups(&[0.01; 12], 6).unwrap();
        assert_eq!(tight.floor_pct, MIN_FLOOR_PCT);
        // Too few comparisons, or a non-finite one: no floor.
        assert!(PairedShapeFloor::from_speedups(&aa[..PAIRED_MIN_COMPARISONS - 1], 4).is_none());
        assert!(PairedShapeFloor::from_speedups(&aa, 0).is_none());
        assert!(PairedShapeFloor::from_speedups(&aa, 21).is_none());
        for bad_value in [f64::NAN, f64::INFINITY, -100.0, -150.0] {
            let mut bad = aa.clone();
            bad[3] = bad_value;
            assert!(
                PairedShapeFloor::from_speedups(&bad, 10).is_none(),
                "{bad_value}"
            );
        }
    }

    #[test]
    fn a_run_uses_the_in_run_floor_measured_on_its_gpu_model_else_the_gates_constant_saying_why() {
        let path = Path::new("gates/noise_floors.json");
        let mut file = FloorFile {
            version: 1,
            ..FloorFile::default()
        };
        file.paired.insert(
            "NVIDIA H100".into(),
            PairedFloors {
                measured_at: "2026-11-25".into(),
                runs: 20,
                seeds: vec![0, 1, 2],
                kernel_sha256: "k".into(),
                shapes: [(
                    "large".to_string(),
                    PairedShapeFloor::from_speedups(&[0.05; 40], 20).unwrap(),
                )]
                .into(),
            },
        );
        let got = FloorFile::choose_paired(
            Some(&file),
            path,
            ("NVIDIA H100", Some("k"), None),
            "large",
            1.0,
        );
        assert_eq!(got.pct, MIN_FLOOR_PCT);
        assert!(!got.source.contains("measured with kernel"), "{got:?}");
        let rebuilt = FloorFile::choose_paired(
            Some(&file),
            path,
            ("NVIDIA H100", Some("k2"), None),
            "large",
            1.0,
        );
        assert!(
            rebuilt.pct == got.pct
                && rebuilt
                    .source
                    .contains("measured with kernel k, these runs' is k2"),
            "{rebuilt:?}"
        );
        assert!(
            got.source
                .starts_with("measured on NVIDIA H100: 40 in-run A/A comparisons in 20 runs"),
            "{got:?}"
        );
        let other_gpu =
            FloorFile::choose_paired(Some(&file), path, ("NVIDIA H200", None, None), "large", 1.0);
        assert_eq!(other_gpu.pct, 1.0);
        assert!(
            other_gpu
                .source
                .contains("no in-run floors measured on NVIDIA H200")
                && other_gpu.source.contains("constant 1%"),
            "{other_gpu:?}"
        );
        let other_shape =
            FloorFile::choose_paired(Some(&file), path, ("NVIDIA H100", None, None), "small", 1.0);
        assert!(other_shape.pct == 1.0 && other_shape.source.contains("for small on NVIDIA H100"));
        let none = FloorFile::choose_paired(None, path, ("NVIDIA H100", None, None), "large", 1.0);
        assert!(none.pct == 1.0 && none.source.contains("no floors file"));
    }

    #[test]
    fn a_measurement_of_some_shapes_keeps_the_others_each_judged_by_its_own_origin() {
        let path = Path::new("gates/noise_floors.json");
        let paired = |at: &str, runs: usize, sha: &str, shapes: &[(&str, f64)]| PairedFloors {
            measured_at: at.into(),
            runs,
            seeds: vec![0, 1, 2],
            kernel_sha256: sha.into(),
            shapes: shapes
                .iter()
                .map(|(s, pct)| {
                    let f = PairedShapeFloor::from_speedups(&[*pct; 10], runs).unwrap();
                    (s.to_string(), f)
                })
                .collect(),
        };
        let first = paired("day1", 5, "k1", &[("a", 0.1), ("b", 0.5)]);
        let (second, kept) = first.merged(paired("day2", 6, "k2", &[("b", 1.0), ("c", 2.0)]));
        assert_eq!(kept, ["a"]);
        assert_eq!(second.shapes.keys().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!((second.measured_at.as_str(), second.runs), ("day2", 6));
        // b was measured again: the newer floor, under the entry's origin.
        assert!(second.shapes["b"].origin.is_none() && second.shapes["b"].floor_pct > 1.5);
        // a keeps its floor and says where it was measured; a third run keeps that, not day2.
        let (third, kept) = second.merged(paired("day3", 7, "k3", &[("c", 0.1)]));
        assert_eq!(kept, ["a", "b"]);
        let origin = |s: &str| third.origin_of(&third.shapes[s]);
        assert_eq!(
            (
                origin("a").measured_at,
                origin("a").runs,
                origin("a").kernel_sha256
            ),
            ("day1".to_string(), 5, "k1".to_string())
        );
        assert_eq!(
            (origin("b").measured_at, origin("b").runs),
            ("day2".to_string(), 6)
        );
        assert_eq!(
            (origin("c").measured_at, origin("c").runs),
            ("day3".to_string(), 7)
        );
        let mut file = FloorFile {
            version: 1,
            ..FloorFile::default()
        };
        file.paired.insert("G".into(), third);
        // The origins round-trip through the file, and a run judges a kept shape by its own.
        let text = serde_json::to_string(&file).unwrap();
        let read = serde_json::from_str::<FloorFile>(&text).unwrap();
        for s in ["a", "b", "c"] {
            assert_eq!(
                read.paired["G"].shapes[s].origin,
                file.paired["G"].shapes[s].origin
            );
        }
        let a = FloorFile::choose_paired(Some(&file), path, ("G", Some("k3"), None), "a", 1.0);
        assert!(
            a.source.contains("in 5 runs")
                && a.source.contains("day1")
                && a.source.contains("measured with kernel k1"),
            "{a:?}"
        );
        let c = FloorFile::choose_paired(Some(&file), path, ("G", Some("k3"), None), "c", 1.0);
        assert!(
            c.source.contains("in 7 runs")
                && c.source.contains("day3")
                && !c.source.contains("measured with"),
            "{c:?}"
        );

        // Between processes alike.
        let gpu = |at: &str, processes: usize, shapes: &[(&str, f64)]| GpuFloors {
            measured_at: at.into(),
            processes,
            variant: "cp0".into(),
            kernel_sha256: "k".into(),
            shapes: shapes
                .iter()
                .map(|(s, x)| {
                    (
                        s.to_string(),
                        ShapeFloor::from_medians(&[1.0, 1.0 + x, 1.0]).unwrap(),
                    )
                })
                .collect(),
        };
        let (both, kept) = gpu("day1", 12, &[("small", 0.01), ("long", 0.02)]).merged(gpu(
            "day2",
            3,
            &[("long", 0.05)],
        ));
        assert_eq!(kept, ["small"]);
        file.gpus.insert("G".into(), both);
        let small = FloorFile::choose(Some(&file), path, ("G", Some("k")), "small", 1.0);
        assert!(
            small.source.contains("12 processes of cp0 on day1"),
            "{small:?}"
        );
        let long = FloorFile::choose(Some(&file), path, ("G", Some("k")), "long", 1.0);
        assert!(
            long.source.contains("3 processes of cp0 on day2"),
            "{long:?}"
        );
    }

    #[test]
    fn a_run_of_another_kernel_uses_that_kernels_in_run_floor_before_the_default_kernels() {
        let path = Path::new("gates/noise_floors.json");
        let floors = |pct: f64, shape: &str| PairedFloors {
            measured_at: "2026-11-27".into(),
            runs: 5,
            seeds: vec![0, 1, 2],
            kernel_sha256: "k".into(),
            shapes: [(
                shape.to_string(),
                PairedShapeFloor::from_speedups(&[pct; 10], 5).unwrap(),
            )]
            .into(),
        };
        let mut file = FloorFile {
            version: 1,
            ..FloorFile::default()
        };
        file.paired.insert("H100".into(), floors(0.1, "large"));
        file.paired_kernels.insert(
            "sdpa_fp8_stage_d_wgmma.cu".into(),
            [("H100".to_string(), floors(1.0, "large"))].into(),
        );
        let choose = |file: &FloorFile, kernel_file: Option<&str>, shape: &str| {
            FloorFile::choose_paired(
                Some(file),
                path,
                ("H100", Some("k"), kernel_file),
                shape,
                1.0,
            )
        };
        let d = choose(&file, Some("sdpa_fp8_stage_d_wgmma.cu"), "large");
        assert!(
            d.pct > 1.5
                && d.source
                    .starts_with("measured on H100 for sdpa_fp8_stage_d_wgmma.cu"),
            "{d:?}"
        );
        let c = choose(&file, Some("sdpa_fp8_stage_c_mma.cu"), "large");
        assert!(
            c.pct < 0.5 && c.source.starts_with("measured on H100: 10"),
            "{c:?}"
        );
        // A shape the kernel's own entry lacks falls back to the default kernel's, then the
        // constant.
        file.paired_kernels
            .get_mut("sdpa_fp8_stage_d_wgmma.cu")
            .unwrap()
            .get_mut("H100")
            .unwrap()
            .shapes
            .clear();
        assert!(choose(&file, Some("sdpa_fp8_stage_d_wgmma.cu"), "large").pct < 0.5);
        assert_eq!(
            choose(&file, Some("sdpa_fp8_stage_d_wgmma.cu"), "small").pct,
            1.0
        );
        assert_eq!(
            kernel_file_name("git:main (0123456789ab):cuda/sdpa_fp8_stage_d_wgmma.cu").as_deref(),
            Some("sdpa_fp8_stage_d_wgmma.cu")
        );
        assert_eq!(
            kernel_file_name("/work/x/cuda/sdpa_fp8_stage_c_mma.cu").as_deref(),
            Some("sdpa_fp8_stage_c_mma.cu")
        );
    }

    #[test]
    fn a_runs_floors_are_those_of_its_kernel_under_test_not_its_base_kernel() {
        use crate::schema::{KernelRef, KernelRole};
        let floors = |pct: f64| PairedFloors {
            measured_at: "t".into(),
            runs: 5,
            seeds: vec![0],
            kernel_sha256: "k".into(),
            shapes: [(
                "large".to_string(),
                PairedShapeFloor::from_speedups(&[pct; 10], 5).unwrap(),
            )]
            .into(),
        };
        let mut file = FloorFile {
            version: 1,
            ..FloorFile::default()
        };
        file.paired.insert("H100".into(), floors(0.1));
        file.paired_kernels
            .insert("d.cu".into(), [("H100".to_string(), floors(1.0))].into());
        let mut perf = crate::perf::fixtures::perf_file(
            "H100",
            &["large"],
            &[0],
            &[("base-st2", 1.0), ("st2", 1.0)],
        );
        for (v, (role, source)) in perf.variants.iter_mut().zip([
            (KernelRole::Base, "git:main (0123456789ab):cuda/c.cu"),
            (KernelRole::Candidate, "/elsewhere/cuda/d.cu"),
        ]) {
            v.kernel = Some(KernelRef {
                role,
                source: source.into(),
                sha256: "k".into(),
            });
        }
        let f = Floors {
            path: "gates/noise_floors.json".into(),
            file: Some(file),
        };
        let got = f.paired_chooser(Some(&perf), 1.0)("large");
        assert!(
            got.pct > 1.5 && got.source.starts_with("measured on H100 for d.cu"),
            "{got:?}"
        );
    }

    #[test]
    fn compare_uses_the_measured_floor_and_otherwise_a_conservative_default_saying_why() {
        let path = Path::new("gates/noise_floors.json");
        let mut file = FloorFile {
            version: 1,
            ..FloorFile::default()
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
    fn the_committed_floors_name_both_gpu_models_and_every_measured_shape_in_run_and_across_processes()
     {
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
            // The in-run floors of the shapes the PR gate's power was proven on
            // (scripts/prove_power.sh), two A/A comparisons per run.
            let p = &file.paired[gpu];
            for shape in ["mission", "large", "llama-prefill"] {
                let f = &p.shapes[shape];
                assert_eq!(f.speedups_pct.len(), 2 * p.runs, "{gpu} {shape}");
                let again = PairedShapeFloor::from_speedups(&f.speedups_pct, p.runs).unwrap();
                assert!(
                    (again.floor_pct - f.floor_pct).abs() < 1e-9,
                    "{gpu} {shape}: recomputed"
                );
            }
            // Stage D's own, of issue 27's problems (stop 62).
            let d = &file.paired_kernels["sdpa_fp8_stage_d_wgmma.cu"][gpu];
            for shape in [
                "1x16x4096x64",
                "4x16x4096x64",
                "1x16x4096x128",
                "4x16x4096x128",
                "1x32x4096x128:hkv=8:causal",
            ] {
                let f = &d.shapes[shape];
                assert_eq!(f.speedups_pct.len(), 2 * d.runs, "{gpu} {shape}");
                let again = PairedShapeFloor::from_speedups(&f.speedups_pct, d.runs).unwrap();
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
            (
                r#"{"version": 1, "gpus": {}, "paired": {"G": {"measured_at": "x", "runs": 5, "seeds": [0], "kernel_sha256": "k", "shapes": {"s": {"floor_pct": 0.05, "rms_pct": 0, "rms_upper_pct": 0, "max_abs_pct": 0, "speedups_pct": []}}}}}"#,
                "paired.G.shapes.s.floor_pct",
            ),
            (
                r#"{"version": 1, "gpus": {}, "paired_kernels": {"k.cu": {"G": {"measured_at": "x", "runs": 5, "seeds": [0], "kernel_sha256": "k", "shapes": {"s": {"floor_pct": 0.05, "rms_pct": 0, "rms_upper_pct": 0, "max_abs_pct": 0, "speedups_pct": []}}}}}}"#,
                "paired_kernels.k.cu.G.shapes.s.floor_pct",
            ),
        ] {
            std::fs::write(&p, text).unwrap();
            let err = FloorFile::load(&p).unwrap_err().to_string();
            assert!(err.contains(key) && err.contains("f.json"), "{text}: {err}");
        }
    }
}
