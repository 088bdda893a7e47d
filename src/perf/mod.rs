//! perf.json (all timings of a run, raw samples included) and the comparisons made from it:
//! in-run A/B (paired) and across two saved runs (unpaired), with the gates of the
//! `performance` section applied.

pub mod compare;

use crate::schema::{PerfFile, ShapeComparison};

/// Builds the in-run A/B verdicts: for each shape, the candidate (second variant) against the
/// baseline (first), pairing round medians of the same seed and round.
pub fn paired_comparisons(
    file: &PerfFile,
    confidence: f64,
    noise_floor_pct: f64,
) -> Vec<ShapeComparison> {
    let names = file.variant_names();
    if names.len() < 2 {
        return Vec::new();
    }
    let (base, cand) = (&names[0], &names[1]);
    file.shapes()
        .iter()
        .map(|shape| {
            let (mut b_rounds, mut c_rounds, mut b_all, mut c_all, mut seeds) =
                (vec![], vec![], vec![], vec![], vec![]);
            for (b, c) in file
                .measurements_of(shape, base)
                .zip(file.measurements_of(shape, cand))
            {
                assert_eq!(
                    b.seed, c.seed,
                    "measurements are stored seed by seed for every variant"
                );
                seeds.push(b.seed);
                b_rounds.extend_from_slice(&b.round_medians_us);
                c_rounds.extend_from_slice(&c.round_medians_us);
                b_all.extend_from_slice(&b.samples_us);
                c_all.extend_from_slice(&c.samples_us);
            }
            let estimate = crate::stats::paired_ratio(&b_rounds, &c_rounds, confidence);
            ShapeComparison::new(
                shape,
                seeds,
                (base, cand),
                (&b_all, &c_all),
                estimate,
                noise_floor_pct,
            )
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Synthetic perf files for tests of the comparison logic.
    use crate::clocks::ClockReading;
    use crate::schema::{GitInfo, Measurement, PerfFile, SCHEMA_VERSION, VariantMeta};
    use crate::stats::Summary;
    use crate::timing::{L2Mode, TimingPlan};

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
                        seed,
                        input_checksum: format!("in-{shape}-{seed}"),
                        variant: name.to_string(),
                        summary: Summary::of(&rounds),
                        round_medians_us: rounds.clone(),
                        samples_us: rounds,
                    });
                }
            }
        }
        PerfFile {
            peer: None,
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
                    defines: vec![],
                    ptx_sha256: None,
                    ptx_has_cp_async: None,
                    registers: None,
                    smem_bytes: None,
                    spill_bytes: None,
                    blocks_per_sm: None,
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
    fn in_run_comparisons_judge_the_second_variant_against_the_first_per_shape() {
        let file = fixtures::perf_file(
            "GPU",
            &["small", "mission"],
            &[0, 1, 2],
            &[("cp0", 1.0), ("cp1", 0.8)],
        );
        let cmp = paired_comparisons(&file, 0.95, 1.0);
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

    #[test]
    fn a_single_variant_has_nothing_to_compare() {
        let file = fixtures::perf_file("GPU", &["small"], &[0], &[("cp1", 1.0)]);
        assert!(paired_comparisons(&file, 0.95, 1.0).is_empty());
    }
}
