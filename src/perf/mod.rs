//! perf.json (all timings of a run, raw samples included) and the comparisons made from it:
//! in-run (paired: variant against variant, and against the base kernel) and across two
//! saved runs (unpaired), with the gates of the `performance` section applied.

pub mod compare;
pub mod same_code;

use crate::floors::FloorChoice;
use crate::gates::PerformanceGates;
use crate::schema::{BASE_PREFIX, Measurement, PairKind, PerfFile, ShapeComparison, VariantMeta};
use crate::timing::{MIN_ROUNDS, TimingPlan};

/// One in-run comparison: (kind, baseline variant, candidate variant).
pub type Pair = (PairKind, String, String);

/// The pairs a run compares, from its variants (baseline first): the second variant of the
/// kernel under test against its first (cp1 vs cp0, or a `--candidate-define` A/B), and each
/// variant of the kernel under test against the same variant of the base kernel
/// (`base-cp0` vs `cp0`).
pub fn pairs(variants: &[VariantMeta]) -> Vec<Pair> {
    let (base, cand): (Vec<&VariantMeta>, Vec<&VariantMeta>) =
        variants.iter().partition(|v| v.is_base());
    let mut out = Vec::new();
    if let [first, second, ..] = cand.as_slice() {
        out.push((PairKind::Variants, first.name.clone(), second.name.clone()));
    }
    for c in &cand {
        let base_name = format!("{BASE_PREFIX}{}", c.name);
        if base.iter().any(|b| b.name == base_name) {
            out.push((PairKind::BaseKernel, base_name, c.name.clone()));
        }
    }
    out
}

/// The median of every block's mean SM clock on `shape` in the run, MHz: the clock the
/// shape ran at (a heavy shape may run at a lower clock than a light one).
pub fn reference_clock(file: &PerfFile, shape: &str) -> Option<f64> {
    let clocks: Vec<f64> = file
        .measurements
        .iter()
        .filter(|m| m.shape == shape)
        .flat_map(|m| m.round_sm_mhz.iter().flatten().copied())
        .collect();
    (!clocks.is_empty()).then(|| crate::stats::median(&clocks))
}

/// Whether round `r` of a pair may be used: its baseline block did not run more than
/// `sag_pct` below `reference`. A sagging baseline makes the candidate look faster than it
/// is, so such rounds are left out; a candidate's own low clock is kept, because it may be
/// the candidate's doing (more power drawn) and keeping it can only make the gate stricter.
/// Unknown clocks are steady.
fn steady(b: &Measurement, r: usize, reference: Option<f64>, sag_pct: f64) -> bool {
    match (reference, b.round_sm_mhz.get(r).copied().flatten()) {
        (Some(reference), Some(x)) => x >= reference * (1.0 - sag_pct / 100.0),
        _ => true,
    }
}

/// Fewest paired rounds a verdict may rest on after sagged rounds are left out: a two-sided
/// sign test needs 6 to reach p < 0.05, and at least half of the rounds measured must remain.
fn enough_rounds(kept: usize, total: usize) -> bool {
    kept >= MIN_ROUNDS.max(6) && 2 * kept >= total
}

/// The samples of each round of `m`, split as the plan spread them; None when the split
/// does not add up (a file from elsewhere).
fn round_samples<'a>(m: &'a Measurement, file: &PerfFile) -> Option<Vec<&'a [f64]>> {
    // The problem's rounds: the plan's, or more where its blocks would have been long
    // (TimingPlan::for_launch), the samples spread over them the same way.
    let rounds = m.round_medians_us.len();
    let plan = TimingPlan {
        rounds,
        ..file.plan.clone()
    };
    let sizes: Vec<usize> = (0..rounds).map(|r| plan.samples_in_round(r)).collect();
    if rounds < file.plan.rounds || sizes.iter().sum::<usize>() != m.samples_us.len() {
        return None;
    }
    let mut out = Vec::with_capacity(rounds);
    let mut at = 0;
    for n in sizes {
        out.push(&m.samples_us[at..at + n]);
        at += n;
    }
    Some(out)
}

/// One round of a pair: both medians, both rounds' samples, and whether the clock was steady.
struct PairedRound<'a> {
    medians: (f64, f64),
    samples: (&'a [f64], &'a [f64]),
    steady: bool,
}

/// Builds the in-run verdicts of every pair ([`pairs`]) on every shape, pairing the round
/// medians of the same seed and round. Rounds whose baseline block ran while the SM clock
/// sagged are left out (counted in `rounds_dropped_for_clock`), unless too few would remain
/// ([`enough_rounds`]): then all are used and the comparison is unsteady ([`unsteady`]).
/// Each shape's noise floor comes from `floor_of` (the in-run floors measured on the run's
/// GPU model: src/floors.rs `choose_paired`), with its source recorded.
pub fn paired_comparisons(
    file: &PerfFile,
    gates: &PerformanceGates,
    floor_of: &dyn Fn(&str) -> FloorChoice,
) -> Vec<ShapeComparison> {
    let mut out = Vec::new();
    for (kind, base, cand) in pairs(&file.variants) {
        for shape in file.shapes() {
            let reference = reference_clock(file, &shape);
            let mut rounds: Vec<PairedRound> = Vec::new();
            let mut seeds = Vec::new();
            for (b, c) in file
                .measurements_of(&shape, &base)
                .zip(file.measurements_of(&shape, &cand))
            {
                assert_eq!(
                    b.seed, c.seed,
                    "measurements are stored seed by seed for every variant"
                );
                seeds.push(b.seed);
                let split = round_samples(b, file).zip(round_samples(c, file));
                let n = b.round_medians_us.len().min(c.round_medians_us.len());
                for r in 0..n {
                    let samples = match &split {
                        Some((bs, cs)) => (bs[r], cs[r]),
                        // Unsplittable: every sample counts once, with the first round.
                        None if r == 0 => (&b.samples_us[..], &c.samples_us[..]),
                        None => (&[][..], &[][..]),
                    };
                    rounds.push(PairedRound {
                        medians: (b.round_medians_us[r], c.round_medians_us[r]),
                        samples,
                        steady: steady(b, r, reference, gates.clock_sag_pct),
                    });
                }
            }
            if rounds.is_empty() {
                continue;
            }
            let sagged = rounds.iter().filter(|r| !r.steady).count();
            let enough = enough_rounds(rounds.len() - sagged, rounds.len());
            let kept: Vec<&PairedRound> = rounds.iter().filter(|r| r.steady || !enough).collect();
            let side = |f: fn(&PairedRound) -> f64| kept.iter().map(|r| f(r)).collect::<Vec<f64>>();
            let (b_rounds, c_rounds) = (side(|r| r.medians.0), side(|r| r.medians.1));
            let b_all: Vec<f64> = kept
                .iter()
                .flat_map(|r| r.samples.0.iter().copied())
                .collect();
            let c_all: Vec<f64> = kept
                .iter()
                .flat_map(|r| r.samples.1.iter().copied())
                .collect();
            let estimate = crate::stats::paired_ratio(&b_rounds, &c_rounds, gates.confidence);
            let floor = floor_of(&shape);
            let mut cmp = ShapeComparison::new(
                &shape,
                seeds,
                (&base, &cand),
                (&b_all, &c_all),
                estimate,
                floor.pct,
            );
            cmp.noise_floor_source = floor.source;
            cmp.pair = kind;
            cmp.rounds_dropped_for_clock = sagged;
            cmp.rounds_total = rounds.len();
            cmp.same_machine_code =
                same_code::same_machine_code((file, &base), (file, &cand), &shape);
            out.push(cmp);
        }
    }
    out
}

/// Where each shape's noise floor came from, one line per shape in order, e.g. `noise floor of
/// mission: ±0.20% (measured on NVIDIA H100 ...)`; comparisons that carry no source add none.
pub fn floor_notes(cmps: &[ShapeComparison]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for c in cmps.iter().filter(|c| !c.noise_floor_source.is_empty()) {
        let line = format!(
            "noise floor of {}: ±{:.2}% ({})",
            c.shape, c.noise_floor_pct, c.noise_floor_source
        );
        if !out.contains(&line) {
            out.push(line);
        }
    }
    out
}

/// A comparison whose rounds ran at a sagging SM clock so often that too few steady ones
/// remained: its verdict used them all and cannot be trusted.
pub fn unsteady(c: &ShapeComparison) -> bool {
    c.rounds_dropped_for_clock > 0 && c.estimate.n == c.rounds_total
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Synthetic perf files for tests of the comparison logic.
    use crate::clocks::ClockReading;
    use crate::schema::{GitInfo, Measurement, PerfFile, SCHEMA_VERSION, VariantMeta};
    use crate::stats::Summary;
    use crate::timing::{L2Mode, TimingPlan};

    /// A launch of `function` on a grid of (`grid0`, 16, 1) 512-thread CTAs of 192 rows.
    pub fn launch(function: &str, grid0: u32) -> crate::schema::LaunchRecord {
        crate::schema::LaunchRecord {
            query_rows: 192,
            threads: 512,
            grid: [grid0, 16, 1],
            function: Some(function.into()),
        }
    }

    /// `function` of module d64 as machine code hashed `sha`.
    pub fn code(function: &str, sha: &str) -> crate::schema::FunctionCode {
        crate::schema::FunctionCode {
            module: "d64".into(),
            function: function.into(),
            sha256: sha.into(),
        }
    }

    /// The performance gates of gates/default.json's shape, with a 1% paired floor.
    /// The gates file's constant in-run floor, as a run without measured floors uses it.
    pub fn constant_floor(_shape: &str) -> crate::floors::FloorChoice {
        crate::floors::FloorChoice {
            pct: gates().noise_floor_pct,
            source: "the gates file's constant".into(),
        }
    }

    pub fn gates() -> crate::gates::PerformanceGates {
        crate::gates::PerformanceGates {
            min_speedup_pct: 10.0,
            max_regression_pct: 2.0,
            confidence: 0.95,
            noise_floor_pct: 1.0,
            unpaired_noise_floor_pct: 1.0,
            unpaired_noise_floor_by_shape: Default::default(),
            target_shapes: vec!["mission".into()],
            clock_sag_pct: 3.0,
        }
    }

    /// Marks each variant's kernel by its name: `base-*` the base kernel's, the others the
    /// kernel under test's (as a `--base-kernel` run records them).
    pub fn mark_base(file: &mut PerfFile) {
        use crate::schema::{BASE_PREFIX, KernelRef, KernelRole};
        for v in &mut file.variants {
            let role = if v.name.starts_with(BASE_PREFIX) {
                KernelRole::Base
            } else {
                KernelRole::Candidate
            };
            v.kernel = Some(KernelRef {
                role,
                source: format!("{role:?}.cu"),
                sha256: String::new(),
            });
        }
    }

    /// A perf file with one measurement per (shape, seed, variant) whose samples are
    /// `base_us * factor(variant)` with a small deterministic wobble.
    pub fn perf_file(
        device: &str,
        shapes: &[&str],
        seeds: &[u64],
        variants: &[(&str, f64)],
    ) -> PerfFile {
        let mut measurements = Vec::new();
        for shape in shapes {
            for &seed in seeds {
                for (i, (name, factor)) in variants.iter().enumerate() {
                    let rounds: Vec<f64> = (0..20)
                        .map(|r| {
                            20.0 * factor
                                * (1.0
                                    + 0.002 * (((r * 7 + i * 3 + seed as usize) % 5) as f64 - 2.0))
                        })
                        .collect();
                    measurements.push(Measurement {
                        shape: shape.to_string(),
                        b: 1,
                        h: 8,
                        s: 512,
                        d: 64,
                        hkv: None,
                        sk: None,
                        causal: false,
                        seed,
                        input_checksum: format!("in-{shape}-{seed}"),
                        variant: name.to_string(),
                        summary: Summary::of(&rounds),
                        round_medians_us: rounds.clone(),
                        samples_us: rounds,
                        round_sm_mhz: vec![Some(1980.0); 20],
                        hold_retries: 0,
                        hold_expired_blocks: 0,
                        gpu: None,
                        launch: None,
                    });
                }
            }
        }
        PerfFile {
            peer: None,
            gpus: Vec::new(),
            schema_version: SCHEMA_VERSION,
            backend: "cuda".into(),
            clock: "test".into(),
            device_name: device.into(),
            device: serde_json::json!({"name": device}),
            git: GitInfo {
                sha: "abc".into(),
                dirty: false,
            },
            started_at: "2026-11-21T00:00:00Z".into(),
            plan: TimingPlan {
                warmup: 1,
                iters: 20,
                rounds: 20,
                batch: 1,
                l2: L2Mode::Warm,
            },
            clocks_before: ClockReading::unknown("test"),
            clocks_after: ClockReading::unknown("test"),
            variants: variants
                .iter()
                .map(|(n, _)| VariantMeta {
                    name: n.to_string(),
                    ..VariantMeta::default()
                })
                .collect(),
            measurements,
            comparisons: vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::PerfVerdict;

    #[test]
    fn each_shape_is_judged_against_the_floor_chosen_for_it_and_records_where_it_came_from() {
        let file = fixtures::perf_file(
            "GPU",
            &["mission", "large"],
            &[0, 1, 2],
            &[("cp0", 1.0), ("cp1", 1.008)],
        );
        let measured = |shape: &str| FloorChoice {
            pct: if shape == "large" { 0.2 } else { 1.0 },
            source: format!("floor of {shape}"),
        };
        let cmps = paired_comparisons(&file, &fixtures::gates(), &measured);
        let got: Vec<(&str, PerfVerdict, &str)> = cmps
            .iter()
            .map(|c| (c.shape.as_str(), c.verdict, c.noise_floor_source.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("mission", PerfVerdict::Same, "floor of mission"),
                ("large", PerfVerdict::Slower, "floor of large"),
            ]
        );
        assert_eq!(
            floor_notes(&cmps),
            [
                "noise floor of mission: ±1.00% (floor of mission)",
                "noise floor of large: ±0.20% (floor of large)",
            ]
        );
        // Several pairs on one shape give one note; a comparison without a source none.
        let mut twice = [cmps.clone(), cmps.clone()].concat();
        twice[0].noise_floor_source.clear();
        assert_eq!(
            floor_notes(&twice),
            [
                "noise floor of large: ±0.20% (floor of large)",
                "noise floor of mission: ±1.00% (floor of mission)",
            ]
        );
    }

    #[test]
    fn in_run_comparisons_judge_the_second_variant_against_the_first_per_shape() {
        let file = fixtures::perf_file(
            "GPU",
            &["small", "mission"],
            &[0, 1, 2],
            &[("cp0", 1.0), ("cp1", 0.8)],
        );
        let cmp = paired_comparisons(&file, &fixtures::gates(), &fixtures::constant_floor);
        assert_eq!(cmp.len(), 2);
        assert_eq!(
            (
                cmp[1].shape.as_str(),
                cmp[1].baseline.as_str(),
                cmp[1].candidate.as_str()
            ),
            ("mission", "cp0", "cp1")
        );
        assert_eq!(cmp[1].seeds, vec![0, 1, 2]);
        assert_eq!(cmp[1].verdict, PerfVerdict::Faster);
        assert!(
            (cmp[1].speedup_pct - 25.0).abs() < 1.0,
            "{}",
            cmp[1].speedup_pct
        );
        assert_eq!(cmp[1].estimate.n, 60, "20 rounds x 3 seeds");
    }

    use crate::schema::PairKind;

    #[test]
    fn pairs_are_the_ab_of_the_kernel_under_test_and_each_variant_against_its_base_twin() {
        let mut file = fixtures::perf_file(
            "GPU",
            &["mission"],
            &[0],
            &[
                ("cp0", 1.0),
                ("cp1", 1.0),
                ("base-cp0", 1.0),
                ("base-cp1", 1.0),
            ],
        );
        fixtures::mark_base(&mut file);
        let got: Vec<(PairKind, String, String)> = pairs(&file.variants);
        let want = [
            (PairKind::Variants, "cp0", "cp1"),
            (PairKind::BaseKernel, "base-cp0", "cp0"),
            (PairKind::BaseKernel, "base-cp1", "cp1"),
        ]
        .map(|(k, b, c)| (k, b.to_string(), c.to_string()));
        assert_eq!(got, want);
        // A run without a base kernel has the A/B only; a name alone does not make a base.
        file.variants.iter_mut().for_each(|v| v.kernel = None);
        assert_eq!(pairs(&file.variants).len(), 1);
    }

    #[test]
    fn a_candidate_slower_than_its_base_twin_is_slower_per_variant() {
        let mut file = fixtures::perf_file(
            "GPU",
            &["mission"],
            &[0, 1],
            &[
                ("cp0", 1.0),
                ("cp1", 1.0),
                ("base-cp0", 1.0),
                ("base-cp1", 0.9),
            ],
        );
        fixtures::mark_base(&mut file);
        let cmps = paired_comparisons(&file, &fixtures::gates(), &fixtures::constant_floor);
        let find = |b: &str| cmps.iter().find(|c| c.baseline == b).unwrap();
        assert_eq!(find("base-cp0").verdict, PerfVerdict::Same);
        assert_eq!(find("base-cp1").pair, PairKind::BaseKernel);
        assert_eq!(find("base-cp1").verdict, PerfVerdict::Slower);
        assert_eq!(find("cp0").pair, PairKind::Variants);
    }

    /// In `n` rounds of every seed (of 20) one side's block ran `factor` times longer at
    /// `mhz` (the others at 1980 MHz): the baseline cp0's when `baseline`, else cp1's.
    fn sagging(n: usize, factor: f64, mhz: f64, baseline: bool) -> PerfFile {
        let mut file =
            fixtures::perf_file("GPU", &["mission"], &[0, 1], &[("cp0", 1.0), ("cp1", 1.0)]);
        let side = if baseline { "cp0" } else { "cp1" };
        for m in file.measurements.iter_mut().filter(|m| m.variant == side) {
            for r in 0..n {
                m.round_medians_us[r] *= factor;
                m.samples_us[r] *= factor;
                m.round_sm_mhz[r] = Some(mhz);
            }
        }
        file
    }

    #[test]
    fn rounds_whose_baseline_ran_at_a_sagging_clock_are_left_out_of_the_paired_verdict() {
        let g = fixtures::gates();
        // 9 of 20 baseline blocks 30% slower at a steady clock: measured as is.
        let steady = &paired_comparisons(
            &sagging(9, 1.3, 1980.0, true),
            &g,
            &fixtures::constant_floor,
        )[0];
        assert_eq!(steady.rounds_dropped_for_clock, 0);
        assert_eq!(steady.estimate.n, 40);
        // The same rounds at 1500 MHz: left out; 22 of 40 remain, and only steady samples.
        let sagged = &paired_comparisons(
            &sagging(9, 1.3, 1500.0, true),
            &g,
            &fixtures::constant_floor,
        )[0];
        assert_eq!(
            (sagged.rounds_dropped_for_clock, sagged.rounds_total),
            (18, 40)
        );
        assert_eq!((sagged.estimate.n, sagged.verdict), (22, PerfVerdict::Same));
        assert!(!unsteady(sagged));
        assert!(
            sagged.baseline_summary.max < 21.0,
            "dropped rounds' samples left out too"
        );
    }

    #[test]
    fn a_candidate_at_a_lower_clock_is_kept_because_it_may_be_its_own_doing() {
        let c = &paired_comparisons(
            &sagging(16, 1.3, 1500.0, false),
            &fixtures::gates(),
            &fixtures::constant_floor,
        )[0];
        assert_eq!((c.rounds_dropped_for_clock, c.estimate.n), (0, 40));
        assert_eq!(c.verdict, PerfVerdict::Slower);
    }

    #[test]
    fn too_few_steady_rounds_keep_them_all_and_mark_the_comparison_unsteady() {
        // 11 of 20 sagged: 18 of 40 would remain, under half.
        let c = &paired_comparisons(
            &sagging(11, 1.3, 1500.0, true),
            &fixtures::gates(),
            &fixtures::constant_floor,
        )[0];
        assert_eq!((c.rounds_dropped_for_clock, c.estimate.n), (22, 40));
        assert!(unsteady(c));
        assert!(enough_rounds(6, 12) && !enough_rounds(5, 10) && !enough_rounds(6, 13));
    }

    #[test]
    fn unknown_clocks_drop_nothing() {
        let mut file = sagging(16, 1.3, 1500.0, true);
        file.measurements
            .iter_mut()
            .for_each(|m| m.round_sm_mhz = vec![None; 20]);
        let c = &paired_comparisons(&file, &fixtures::gates(), &fixtures::constant_floor)[0];
        assert_eq!(
            (c.rounds_dropped_for_clock, c.verdict),
            (0, PerfVerdict::Faster)
        );
        assert_eq!(reference_clock(&file, "mission"), None);
    }

    #[test]
    fn the_samples_of_a_round_are_split_as_the_plan_spread_them() {
        let mut file = fixtures::perf_file("GPU", &["small"], &[0], &[("cp0", 1.0)]);
        file.plan.iters = 23;
        file.plan.rounds = 5;
        let m = &mut file.measurements[0];
        m.samples_us = (0..23).map(f64::from).collect();
        m.round_medians_us = vec![0.0; 5];
        let rounds = round_samples(&file.measurements[0], &file).unwrap();
        let sizes: Vec<usize> = rounds.iter().map(|r| r.len()).collect();
        assert_eq!(sizes, [5, 5, 5, 4, 4]);
        assert_eq!((rounds[1][0], rounds[4][3]), (5.0, 22.0));
        // A problem of long launches ran more rounds than the plan's (TimingPlan::for_launch):
        // split by its own count, the same way.
        file.plan.rounds = 4;
        let more = round_samples(&file.measurements[0], &file).unwrap();
        assert_eq!(more.iter().map(|r| r.len()).collect::<Vec<_>>(), sizes);
        // Fewer rounds than the plan's, or samples that do not add up: not split.
        file.plan.rounds = 6;
        assert!(round_samples(&file.measurements[0], &file).is_none());
        file.plan.rounds = 5;
        file.measurements[0].samples_us.pop();
        assert!(round_samples(&file.measurements[0], &file).is_none());
    }

    #[test]
    fn reports_name_the_extra_rounds_only_where_a_problem_ran_them() {
        let mut file = fixtures::perf_file("GPU", &["small", "long"], &[0], &[("cp0", 1.0)]);
        assert_eq!(file.rounds_text(), "20 rounds");
        file.measurements[1].round_medians_us.resize(72, 1.0);
        assert!(
            file.rounds_text()
                .starts_with("20-72 rounds (more on the problems")
        );
    }

    #[test]
    fn a_single_variant_has_nothing_to_compare() {
        let file = fixtures::perf_file("GPU", &["small"], &[0], &[("cp1", 1.0)]);
        assert!(
            paired_comparisons(&file, &fixtures::gates(), &fixtures::constant_floor).is_empty()
        );
    }
}
