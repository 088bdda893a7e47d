//! Comparing two saved runs: loading them, refusing pairs that cannot be compared (different
//! GPUs or inputs, unless overridden; different shapes or seeds, always), the unpaired
//! verdicts, and the gate rules shared with the in-run A/B.

use std::path::{Path, PathBuf};

use crate::gates::PerformanceGates;
use crate::schema::CorrectnessFile;
use crate::schema::{PerfFile, ShapeComparison};
use crate::usage::ConfigError;

/// A saved run: its perf.json and, if present beside it, its correctness.json.
#[derive(Debug, Clone)]
pub struct SavedRun {
    pub perf_path: PathBuf,
    pub perf: PerfFile,
    pub correctness: Option<CorrectnessFile>,
}

impl SavedRun {
    /// Loads a run directory or a perf.json file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let (perf_path, dir) = if path.is_dir() {
            (path.join("perf.json"), path.to_path_buf())
        } else {
            (
                path.to_path_buf(),
                path.parent().map(Path::to_path_buf).unwrap_or_default(),
            )
        };
        if !perf_path.is_file() {
            let why = if dir.join("correctness.json").is_file() {
                "it is a correctness-only run (it ran with --iters 0); rerun with timing"
            } else {
                "pass a run directory (results/<run>) or its perf.json"
            };
            return Err(ConfigError::Usage(format!(
                "{}: no perf.json; {why}",
                path.display()
            )));
        }
        let perf: PerfFile = crate::schema::read_versioned(&perf_path)?;
        check_samples(&perf_path, &perf)?;
        let correctness_path = dir.join("correctness.json");
        // Optional: a run without correctness.json still compares; --gate then refuses it.
        let correctness = if correctness_path.is_file() {
            Some(crate::schema::read_versioned::<CorrectnessFile>(
                &correctness_path,
            )?)
        } else {
            None
        };
        Ok(SavedRun {
            perf_path,
            perf,
            correctness,
        })
    }

    /// (passing, total) correctness rows of `variant`, if the run has correctness results.
    pub fn correctness_of(&self, variant: &str) -> Option<(usize, usize)> {
        self.correctness.as_ref().map(|c| c.passing(variant))
    }
}

/// Refuses timings no measurement can produce: a measurement without samples or round
/// medians, or a sample that is not a finite positive number of microseconds.
fn check_samples(path: &Path, perf: &PerfFile) -> Result<(), ConfigError> {
    for m in &perf.measurements {
        let place = format!("{} seed {} {}", m.shape, m.seed, m.variant);
        if m.samples_us.is_empty() || m.round_medians_us.is_empty() {
            return Err(ConfigError::invalid_key(
                path,
                "measurements",
                format!("{place} has no samples; the file is damaged, rerun the timing"),
            ));
        }
        if let Some(bad) = m
            .samples_us
            .iter()
            .chain(&m.round_medians_us)
            .find(|x| !(x.is_finite() && **x > 0.0))
        {
            return Err(ConfigError::invalid_key(
                path,
                "measurements",
                format!(
                    "{place} has the sample {bad} µs; a time must be a finite number above 0 \
                     (the file is damaged or was edited by hand)"
                ),
            ));
        }
    }
    if perf.measurements.is_empty() {
        return Err(ConfigError::invalid_key(
            path,
            "measurements",
            "no measurements: nothing to compare".to_string(),
        ));
    }
    Ok(())
}

/// Picks the variant of each run: explicit names, else the only variant of the kernel under
/// test of each, else its last (candidate) variant when both runs name it the same.
pub fn pick_variants(
    base: &PerfFile,
    cand: &PerfFile,
    base_choice: Option<&str>,
    cand_choice: Option<&str>,
) -> Result<(String, String), ConfigError> {
    let pick = |file: &PerfFile,
                choice: Option<&str>,
                which: &str,
                other: &PerfFile|
     -> Result<String, ConfigError> {
        let names = file.variant_names();
        if let Some(c) = choice {
            return names.iter().find(|n| *n == c).cloned().ok_or_else(|| {
                ConfigError::Usage(format!(
                    "--{which}-variant {c}: the run has {}",
                    names.join(", ")
                ))
            });
        }
        // Unless named, a variant of the kernel under test: never one of a --base-kernel run's
        // base-* variants.
        let own = |f: &PerfFile| -> Vec<String> {
            f.variants
                .iter()
                .filter(|v| !v.is_base())
                .map(|v| v.name.clone())
                .collect()
        };
        let names = own(file);
        match (names.as_slice(), own(other).as_slice()) {
            ([only], [_]) => Ok(only.clone()),
            (mine, theirs) if mine.last().is_some() && mine.last() == theirs.last() => {
                Ok(mine.last().unwrap().clone())
            }
            (mine, _) => Err(ConfigError::Usage(format!(
                "cannot tell which variant to compare: the {which} run has {}; pass --{which}-variant NAME",
                mine.join(", ")
            ))),
        }
    };
    Ok((
        pick(base, base_choice, "base", cand)?,
        pick(cand, cand_choice, "cand", base)?,
    ))
}

/// Refuses pairs whose timings cannot be compared; returns the warnings to print in the
/// report when `allow_mismatch` overrides a GPU or input mismatch.
pub fn check_comparable(
    base: &PerfFile,
    cand: &PerfFile,
    (bv, cv): (&str, &str),
    allow_mismatch: bool,
) -> Result<Vec<String>, ConfigError> {
    let mut warnings = Vec::new();
    // A peer (another library on the same GPU) has its own backend and its own inputs of
    // the same shapes: expected, and said in the report, but a different GPU still refuses.
    let peer = [base, cand].iter().find_map(|f| f.peer.as_ref());
    if let Some(p) = peer {
        warnings.push(format!(
            "peer comparison: one side is not this kernel but {p} on the same GPU, timed with \
             the runner's rules on its own fp16 inputs of the same shapes (timings only)"
        ));
    }
    let mut mismatch = |what: String| -> Result<(), ConfigError> {
        if allow_mismatch {
            warnings.push(format!(
                "compared despite a mismatch (--allow-mismatch): {what}"
            ));
            Ok(())
        } else {
            Err(ConfigError::Usage(format!(
                "{what}; such timings are not comparable (pass --allow-mismatch to compare anyway)"
            )))
        }
    };
    if base.device_name != cand.device_name || (peer.is_none() && base.backend != cand.backend) {
        mismatch(format!(
            "BASE was measured on {} ({}), CAND on {} ({})",
            base.device_name, base.backend, cand.device_name, cand.backend
        ))?;
    }
    // A row is its shape's name with its problem description: the same name for another
    // problem (another mask, H_kv or S_k) is another row.
    let keys = |f: &PerfFile, v: &str| -> Vec<(String, u64, String, String)> {
        f.measurements
            .iter()
            .filter(|m| m.variant == v)
            .map(|m| (m.shape.clone(), m.seed, m.input_checksum.clone(), m.dims()))
            .collect()
    };
    let (bk, ck) = (keys(base, bv), keys(cand, cv));
    let runs = |k: &[(String, u64, String, String)]| {
        k.iter()
            .map(|(s, seed, _, _)| format!("{s}/{seed}"))
            .collect::<Vec<_>>()
    };
    if runs(&bk) != runs(&ck) {
        return Err(ConfigError::Usage(format!(
            "BASE and CAND measured different shapes or seeds (BASE: {}; CAND: {}); rerun with the same --shapes and --seeds",
            runs(&bk).join(" "),
            runs(&ck).join(" ")
        )));
    }
    for ((shape, _, _, bd), (_, _, _, cd)) in bk.iter().zip(&ck) {
        if bd != cd {
            return Err(ConfigError::Usage(format!(
                "shape {shape} is the problem {bd} in BASE but {cd} in CAND: another problem \
                 under the same name; rerun both with the same shapes file"
            )));
        }
    }
    for ((shape, seed, a, _), (_, _, b, _)) in bk.iter().zip(&ck) {
        if a != b && peer.is_none() {
            mismatch(format!(
                "the inputs of {shape} seed {seed} differ between BASE and CAND (checksums {a:.12} and {b:.12})"
            ))?;
        }
    }
    Ok(warnings)
}

/// The verdict per shape of CAND's variant against BASE's, from per-round medians pooled over
/// seeds (the runs are independent: unpaired), with each shape's unpaired noise floor.
#[cfg(test)]
pub fn unpaired_comparisons(
    base: &PerfFile,
    cand: &PerfFile,
    (bv, cv): (&str, &str),
    gates: &PerformanceGates,
) -> Vec<ShapeComparison> {
    unpaired_comparisons_with(base, cand, (bv, cv), gates, &|shape| {
        gates.unpaired_floor(shape)
    })
}

/// As [`unpaired_comparisons`], with each shape's noise floor from `floor_of` (the floors
/// measured on the runs' GPU model: src/floors.rs).
pub fn unpaired_comparisons_with(
    base: &PerfFile,
    cand: &PerfFile,
    (bv, cv): (&str, &str),
    gates: &PerformanceGates,
    floor_of: &dyn Fn(&str) -> f64,
) -> Vec<ShapeComparison> {
    base.shapes()
        .iter()
        .map(|shape| {
            let gather = |f: &PerfFile, v: &str| {
                let (mut rounds, mut all, mut seeds) = (vec![], vec![], vec![]);
                for m in f.measurements_of(shape, v) {
                    rounds.extend_from_slice(&m.round_medians_us);
                    all.extend_from_slice(&m.samples_us);
                    seeds.push(m.seed);
                }
                (rounds, all, seeds)
            };
            let (b_rounds, b_all, seeds) = gather(base, bv);
            let (c_rounds, c_all, _) = gather(cand, cv);
            let estimate = crate::stats::unpaired_ratio(&b_rounds, &c_rounds, gates.confidence);
            // No `same_machine_code` across runs: the runner's host code, the driver and the
            // plan may differ between two processes, so the same kernel code is no A/A there
            // (src/perf/same_code.rs).
            ShapeComparison::new(
                shape,
                seeds,
                (bv, cv),
                (&b_all, &c_all),
                estimate,
                floor_of(shape),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::{TargetStatus, regressions, targets};
    use crate::perf::fixtures::perf_file;
    use crate::stats::PerfVerdict;

    fn gates() -> PerformanceGates {
        PerformanceGates {
            min_speedup_pct: 10.0,
            max_regression_pct: 3.0,
            confidence: 0.95,
            noise_floor_pct: 1.0,
            unpaired_noise_floor_pct: 1.0,
            unpaired_noise_floor_by_shape: [("small".to_string(), 4.0)].into(),
            target_shapes: vec!["mission".into()],
            clock_sag_pct: 3.0,
        }
    }

    #[test]
    fn single_variant_runs_compare_their_only_variants() {
        let a = perf_file("H200", &["mission"], &[0], &[("cp0", 1.0)]);
        let b = perf_file("H200", &["mission"], &[0], &[("cp1", 0.8)]);
        assert_eq!(
            pick_variants(&a, &b, None, None).unwrap(),
            ("cp0".into(), "cp1".into())
        );
        let cmps = unpaired_comparisons(&a, &b, ("cp0", "cp1"), &gates());
        assert_eq!(cmps[0].verdict, PerfVerdict::Faster);
        assert_eq!(
            targets(&cmps, &gates()),
            vec![("mission".into(), TargetStatus::Met)]
        );
    }

    #[test]
    fn two_variant_runs_compare_the_candidate_variant_or_ask() {
        let a = perf_file("H200", &["mission"], &[0], &[("cp0", 1.0), ("cp1", 0.9)]);
        let b = perf_file("H200", &["mission"], &[0], &[("cp0", 1.0), ("cp1", 0.9)]);
        assert_eq!(
            pick_variants(&a, &b, None, None).unwrap(),
            ("cp1".into(), "cp1".into())
        );
        assert_eq!(
            pick_variants(&a, &b, Some("cp0"), Some("cp0")).unwrap(),
            ("cp0".into(), "cp0".into())
        );
        assert!(
            pick_variants(&a, &b, Some("cp9"), None)
                .unwrap_err()
                .to_string()
                .contains("cp0, cp1")
        );
        let c = perf_file("H200", &["mission"], &[0], &[("x", 1.0), ("y", 0.9)]);
        assert!(
            pick_variants(&a, &c, None, None)
                .unwrap_err()
                .to_string()
                .contains("--base-variant")
        );
    }

    #[test]
    fn a_base_kernel_runs_base_variants_are_never_picked_unless_named() {
        let plain = perf_file("H200", &["mission"], &[0], &[("cp0", 1.0), ("cp1", 0.9)]);
        let mut gated = perf_file(
            "H200",
            &["mission"],
            &[0],
            &[
                ("cp0", 1.0),
                ("cp1", 0.9),
                ("base-cp0", 1.0),
                ("base-cp1", 0.9),
            ],
        );
        crate::perf::fixtures::mark_base(&mut gated);
        assert_eq!(
            pick_variants(&plain, &gated, None, None).unwrap(),
            ("cp1".into(), "cp1".into())
        );
        assert_eq!(
            pick_variants(&gated, &plain, Some("base-cp1"), None).unwrap(),
            ("base-cp1".into(), "cp1".into())
        );
    }

    #[test]
    fn different_gpus_or_inputs_are_refused_unless_overridden() {
        let a = perf_file("NVIDIA H200", &["mission"], &[0], &[("cp1", 1.0)]);
        let b = perf_file("NVIDIA H100", &["mission"], &[0], &[("cp1", 1.0)]);
        let err = check_comparable(&a, &b, ("cp1", "cp1"), false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("H200") && err.contains("H100") && err.contains("--allow-mismatch"),
            "{err}"
        );
        let warnings = check_comparable(&a, &b, ("cp1", "cp1"), true).unwrap();
        assert_eq!(warnings.len(), 1);

        let mut c = perf_file("NVIDIA H200", &["mission"], &[0], &[("cp1", 1.0)]);
        c.measurements[0].input_checksum = "other".into();
        let err = check_comparable(&a, &c, ("cp1", "cp1"), false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("inputs of mission seed 0 differ"), "{err}");
    }

    #[test]
    fn a_peer_run_compares_on_the_same_gpu_with_a_label_but_not_across_gpus() {
        let ours = perf_file("NVIDIA H200", &["mission"], &[0], &[("cp1", 1.0)]);
        let mut peer = perf_file("NVIDIA H200", &["mission"], &[0], &[("torch-cudnn", 1.0)]);
        peer.backend = "torch".into();
        peer.measurements[0].input_checksum = "torch fp16 randn".into();
        peer.peer = Some(serde_json::json!({"library": "torch"}));
        let warnings = check_comparable(&peer, &ours, ("torch-cudnn", "cp1"), false).unwrap();
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("peer comparison"), "{warnings:?}");

        peer.device_name = "NVIDIA H100".into();
        let err = check_comparable(&peer, &ours, ("torch-cudnn", "cp1"), false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("H100"), "{err}");
    }

    #[test]
    fn different_shapes_or_seeds_are_refused_even_with_the_override() {
        let a = perf_file("H200", &["mission"], &[0, 1], &[("cp1", 1.0)]);
        let b = perf_file("H200", &["mission"], &[0], &[("cp1", 1.0)]);
        let err = check_comparable(&a, &b, ("cp1", "cp1"), true)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("mission/1") && err.contains("--seeds"),
            "{err}"
        );
    }

    #[test]
    fn the_gate_refuses_slowdowns_beyond_the_allowed_regression_only() {
        let base = perf_file("H200", &["small", "mission"], &[0], &[("cp1", 1.0)]);
        let slow = perf_file("H200", &["small", "mission"], &[0], &[("cp1", 1.05)]);
        let cmps = unpaired_comparisons(&base, &slow, ("cp1", "cp1"), &gates());
        assert!(cmps.iter().all(|c| c.verdict == PerfVerdict::Slower));
        assert_eq!(regressions(&cmps, &gates()).len(), 2);
        let slightly = perf_file("H200", &["small", "mission"], &[0], &[("cp1", 1.02)]);
        let cmps = unpaired_comparisons(&base, &slightly, ("cp1", "cp1"), &gates());
        let verdicts: Vec<_> = cmps
            .iter()
            .map(|c| (c.shape.as_str(), c.verdict, c.noise_floor_pct))
            .collect();
        assert_eq!(
            verdicts,
            [
                ("small", PerfVerdict::Same, 4.0),
                ("mission", PerfVerdict::Slower, 1.0)
            ],
            "2% is inside small's 4% unpaired floor and outside mission's 1%"
        );
        assert!(
            regressions(&cmps, &gates()).is_empty(),
            "2% is within the allowed 3%"
        );
        assert!(matches!(
            targets(&cmps, &gates())[0].1,
            TargetStatus::NotMet(_)
        ));
    }

    #[test]
    fn two_saved_runs_of_the_same_machine_code_are_no_control_and_a_slowdown_still_counts() {
        let run = |factor: f64| {
            let mut f = perf_file("H200", &["mission"], &[0], &[("cp1", factor)]);
            for m in &mut f.measurements {
                m.launch = Some(crate::perf::fixtures::launch("f", 8));
            }
            f.variants[0].machine_code = vec![crate::perf::fixtures::code("f", "same")];
            f
        };
        let cmps = unpaired_comparisons(&run(1.0), &run(1.05), ("cp1", "cp1"), &gates());
        assert_eq!(cmps[0].same_machine_code, None);
        assert_eq!(regressions(&cmps, &gates()).len(), 1);
    }
}
