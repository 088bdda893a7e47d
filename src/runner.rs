//! The pipeline, one way through: shape + seed -> inputs -> FP8 quantization -> backend run ->
//! metrics against the two references and the emulation -> gates -> one record per
//! (shape, seed, variant); then, with the inputs still loaded, the timing of every variant.

use half::f16;

use crate::backend::{Backend, BackendError};
use crate::emulation;
use crate::gates::Gates;
use crate::metrics::{self, ErrorMetrics};
use crate::problem::{HostDefect, Problem};
use crate::quantizer::{self, Audit};
use crate::reference::References;
use crate::report::f16_checksum;
use crate::schema::CorrectnessRecord;
use crate::schema::Measurement;
use crate::shapes::Shape;
use crate::stats::Summary;
use crate::timing::{self, TimingPlan, VariantTiming};
use crate::verdict::{self, ProblemFacts};

/// What the kernel is held against for one problem, shared by all variants.
pub struct Yardsticks {
    pub refs: References,
    /// The clean CPU emulation's output and its error against the kernel reference.
    pub emulation_out: Vec<f16>,
    pub emulation: ErrorMetrics,
    pub facts: ProblemFacts,
}

impl Yardsticks {
    /// `kv_split`: the backend's ([`Backend::kv_split`]), so the emulation sums as it does.
    pub fn compute(p: &Problem, kv_split: usize) -> Self {
        let refs = References::compute(p, kv_split);
        let emulation_out = emulation::clean(p, kv_split);
        let emulation =
            metrics::measure(&emulation_out, &refs.kernel, &refs.kernel_bound, &p.shape);
        let quantizer = [
            (&p.inputs.q, &p.q),
            (&p.inputs.k, &p.k),
            (&p.inputs.v, &p.v),
        ]
        .into_iter()
        .map(|(x, t)| quantizer::audit(x, t))
        .fold(Audit::default(), Audit::add);
        let n = refs.kernel.len().max(1) as f64;
        let facts = ProblemFacts {
            quantizer,
            out_abs_max: refs.kernel.iter().fold(0.0, |m, x| m.max(x.abs())),
            out_abs_mean: refs.kernel.iter().map(|x| x.abs()).sum::<f64>() / n,
        };
        Yardsticks {
            refs,
            emulation_out,
            emulation,
            facts,
        }
    }
}

/// Percent of elements whose f16 bits equal the emulation's: 100 means the emulation
/// reproduces the kernel exactly. A diagnostic, not a gate (a legitimate change of
/// accumulation order lowers it).
fn bits_equal_pct(out: &[f16], emulation: &[f16]) -> f64 {
    let same = out
        .iter()
        .zip(emulation)
        .filter(|(a, b)| a.to_bits() == b.to_bits())
        .count();
    100.0 * same as f64 / out.len().max(1) as f64
}

/// Judges one backend output and builds its record.
pub fn judge_output(
    backend: &str,
    variant: &str,
    p: &Problem,
    y: &Yardsticks,
    out: &[f16],
    gates: &Gates,
) -> CorrectnessRecord {
    let kernel_ref = metrics::measure(out, &y.refs.kernel, &y.refs.kernel_bound, &p.shape);
    let end_to_end = metrics::measure(out, &y.refs.end_to_end, &y.refs.end_to_end_bound, &p.shape);
    let v = verdict::judge(
        &kernel_ref,
        &end_to_end,
        &y.emulation,
        &y.facts,
        &gates.correctness,
    );
    let Shape {
        name, b, h, s, d, ..
    } = p.shape.clone();
    CorrectnessRecord {
        shape: name,
        b,
        h,
        s,
        d,
        seed: p.seed,
        variant: variant.to_string(),
        backend: backend.to_string(),
        input_checksum: p.inputs.checksum.clone(),
        output_checksum: f16_checksum(out),
        kernel_ref,
        end_to_end,
        emulation_ref: y.emulation.clone(),
        emulation_bits_equal_pct: bits_equal_pct(out, &y.emulation_out),
        pass: v.pass(),
        gates: v.checks,
        device: None,
    }
}

/// Hooks for showing progress; every method does nothing by default.
pub trait Progress {
    fn record(&mut self, _record: &CorrectnessRecord) {}
    fn timing_started(&mut self, _shape: &Shape, _seed: u64, _rounds: usize) {}
    fn timing_round(&mut self) {}
    fn timing_done(&mut self, _measurements: &[Measurement]) {}
}

/// What a run produced.
pub struct RunOutput {
    pub records: Vec<CorrectnessRecord>,
    /// Empty when the plan does no timing.
    pub measurements: Vec<Measurement>,
}

/// For every (shape, seed): checks every variant, then, while the inputs are loaded, times
/// them all in interleaved rounds.
pub fn run_all(
    backend: &mut dyn Backend,
    shapes: &[Shape],
    seeds: &[u64],
    host_defect: HostDefect,
    gates: &Gates,
    plan: &TimingPlan,
    progress: &mut dyn Progress,
) -> Result<RunOutput, BackendError> {
    let mut out = RunOutput {
        records: Vec::new(),
        measurements: Vec::new(),
    };
    for shape in shapes {
        for &seed in seeds {
            let p = Problem::with_host_defect(shape, seed, host_defect);
            // One yardstick per KV split: variants of a base kernel may sum in another order.
            let mut yardsticks: Vec<(usize, Yardsticks)> = Vec::new();
            backend.load(&p)?;
            let variants = backend.variants().to_vec();
            for (i, variant) in variants.iter().enumerate() {
                let split = backend.kv_split_of(i);
                if !yardsticks.iter().any(|(s, _)| *s == split) {
                    yardsticks.push((split, Yardsticks::compute(&p, split)));
                }
                let y = &yardsticks
                    .iter()
                    .find(|(s, _)| *s == split)
                    .expect("added above")
                    .1;
                let output = backend.launch_poisoned(i)?;
                let record = judge_output(backend.name(), variant, &p, y, &output, gates);
                progress.record(&record);
                out.records.push(record);
            }
            if plan.enabled() {
                progress.timing_started(shape, seed, plan.rounds);
                let timings = measure(backend, plan, |_| progress.timing_round())?;
                let measured: Vec<Measurement> = variants
                    .iter()
                    .zip(timings)
                    .map(|(variant, t)| measurement(&p, variant, t))
                    .collect();
                progress.timing_done(&measured);
                out.measurements.extend(measured);
            }
        }
    }
    Ok(out)
}

/// Runs the plan on the backend's loaded problem: warm-up, then the rounds.
fn measure(
    backend: &mut dyn Backend,
    plan: &TimingPlan,
    mut on_round: impl FnMut(usize),
) -> Result<Vec<VariantTiming>, BackendError> {
    let n = backend.variants().len();
    for v in 0..n {
        backend.warm_up(v, plan.warmup)?;
    }
    let mut timings = vec![VariantTiming::default(); n];
    for round in 0..plan.rounds {
        for v in plan.order(round, n) {
            let block = backend.time_samples(v, plan.samples_in_round(round), plan)?;
            timings[v].rounds.push(block);
        }
        on_round(round);
    }
    Ok(timings)
}

fn measurement(p: &Problem, variant: &str, t: timing::VariantTiming) -> Measurement {
    let samples = t.samples();
    Measurement {
        shape: p.shape.name.clone(),
        b: p.shape.b,
        h: p.shape.h,
        s: p.shape.s,
        d: p.shape.d,
        seed: p.seed,
        input_checksum: p.inputs.checksum.clone(),
        variant: variant.to_string(),
        summary: Summary::of(&samples),
        round_medians_us: t.round_medians(),
        samples_us: samples,
        round_sm_mhz: t.round_sm_mhz(),
        hold_retries: t.hold_retries(),
        hold_expired_blocks: t.hold_expired_blocks(),
    }
}

/// Checks every (shape, seed, variant) without timing, calling `on_record` as records are made.
pub fn check_all(
    backend: &mut dyn Backend,
    shapes: &[Shape],
    seeds: &[u64],
    gates: &Gates,
    on_record: impl FnMut(&CorrectnessRecord),
) -> Result<Vec<CorrectnessRecord>, BackendError> {
    struct Rows<F>(F);
    impl<F: FnMut(&CorrectnessRecord)> Progress for Rows<F> {
        fn record(&mut self, r: &CorrectnessRecord) {
            (self.0)(r)
        }
    }
    let plan = TimingPlan {
        warmup: 0,
        iters: 0,
        rounds: 0,
        batch: 1,
        l2: timing::L2Mode::Warm,
    };
    Ok(run_all(
        backend,
        shapes,
        seeds,
        HostDefect::None,
        gates,
        &plan,
        &mut Rows(on_record),
    )?
    .records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::emulation::Defect;
    use crate::gates::GateFile;

    fn gates() -> Gates {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("gates/default.json");
        GateFile::load(&path).unwrap().gates
    }

    fn shape(s: usize) -> Shape {
        Shape {
            name: format!("s{s}"),
            b: 2,
            h: 2,
            s,
            d: 64,
            qk_std: 1.0,
            purpose: String::new(),
            dist: Default::default(),
        }
    }

    fn run(defect: Defect, shapes: &[Shape]) -> Vec<CorrectnessRecord> {
        let mut backend = CpuBackend::new(defect);
        check_all(&mut backend, shapes, &[0, 1], &gates(), |_| {}).unwrap()
    }

    #[test]
    fn the_clean_emulation_passes_every_gate_on_awkward_shapes() {
        let records = run(Defect::None, &[shape(1), shape(77), shape(130)]);
        assert_eq!(records.len(), 6);
        for r in &records {
            assert!(r.pass, "{} seed {}: {:?}", r.shape, r.seed, r.gates);
        }
    }

    #[test]
    fn a_skipped_last_kv_tile_is_caught_by_the_error_gates() {
        let records = run(Defect::SkipLastKvTile, &[shape(130)]);
        for r in &records {
            assert!(!r.pass);
            assert!(
                !r.gates["kernel.max_err_over_bound"].pass && !r.gates["relative.max_abs_err"].pass
            );
        }
    }

    #[test]
    fn an_unwritten_row_is_caught_by_the_unwritten_count() {
        let records = run(Defect::LeaveRowUnwritten, &[shape(40)]);
        for r in &records {
            assert_eq!(r.kernel_ref.unwritten, 64);
            assert!(!r.gates["unwritten"].pass && !r.pass);
        }
    }

    #[test]
    fn bits_equal_counts_the_share_of_identical_f16_bit_patterns() {
        let a: Vec<f16> = (0..8).map(|i| f16::from_f32(i as f32 * 0.25)).collect();
        assert_eq!(bits_equal_pct(&a, &a), 100.0);
        let mut b = a.clone();
        b[3] = f16::from_bits(b[3].to_bits() ^ 1); // one last-bit difference
        assert_eq!(bits_equal_pct(&a, &b), 87.5);
        // +0 and -0 are equal numbers but different bits.
        let (z, nz) = ([f16::from_f32(0.0)], [f16::from_f32(-0.0)]);
        assert_eq!(bits_equal_pct(&z, &nz), 0.0);
    }

    #[test]
    fn a_defect_lowers_the_share_of_bits_equal_to_the_emulation() {
        let broken = run(Defect::LeaveRowUnwritten, &[shape(70)]);
        assert!(broken.iter().all(|r| r.emulation_bits_equal_pct < 100.0));
    }

    #[test]
    fn timing_measures_every_variant_per_shape_and_seed() {
        let plan = TimingPlan {
            warmup: 1,
            iters: 5,
            rounds: 5,
            batch: 1,
            l2: timing::L2Mode::Warm,
        };
        let mut backend = CpuBackend::new(Defect::None);
        let out = run_all(
            &mut backend,
            &[shape(20)],
            &[0, 1],
            HostDefect::None,
            &gates(),
            &plan,
            &mut NoProgress,
        )
        .unwrap();
        assert_eq!(out.measurements.len(), 2);
        let m = &out.measurements[1];
        assert_eq!(
            (
                m.seed,
                m.variant.as_str(),
                m.samples_us.len(),
                m.round_medians_us.len()
            ),
            (1, "cpu-emu", 5, 5)
        );
        assert!(m.summary.p50 > 0.0 && m.input_checksum == out.records[1].input_checksum);
    }

    struct NoProgress;
    impl Progress for NoProgress {}

    #[test]
    fn records_carry_checksums_that_repeat_across_runs() {
        let a = run(Defect::None, &[shape(33)]);
        let b = run(Defect::None, &[shape(33)]);
        assert_eq!(a[0].input_checksum, b[0].input_checksum);
        assert_eq!(a[0].output_checksum, b[0].output_checksum);
        assert_ne!(
            a[0].input_checksum, a[1].input_checksum,
            "seeds 0 and 1 differ"
        );
    }
}
