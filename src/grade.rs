//! Grading another implementation's output (`sdpa-runner check`, docs/DESIGN.md "Grading other
//! implementations"): the same references, metrics and bound gates as the runner, under the
//! error model of what the implementation read and wrote ([`crate::reference::Model`]). There
//! is no emulation of a foreign algorithm, so the relative gate does not apply.

use serde::{Deserialize, Serialize};

use crate::exchange::{ExportedProblem, Output, OutputFault};
use crate::gates::CorrectnessGates;
use crate::metrics::{self, ErrorMetrics};
use crate::problem::Problem;
use crate::reference::{Implementation, Model, Precision, References, RowSums};
use crate::rows::RowSet;
use crate::schema::{GitInfo, ToolInfo};
use crate::verdict::{Check, Verdict};

/// The format of the correctness.json `check` writes.
pub const CHECK_FORMAT: &str = "sdpa-runner check v1";

/// correctness.json of a check.
#[derive(Serialize)]
pub struct CheckFile<'a> {
    pub format: &'static str,
    pub tool: ToolInfo,
    pub git: GitInfo,
    pub created: String,
    pub export_dir: String,
    /// `--fp8-chain`: the most keys an FP8 implementation was allowed to sum in one FP22
    /// accumulator (absent: every key of the row).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fp8_chain: Option<usize>,
    pub implementations: Vec<ImplementationRecord>,
    pub problems: &'a [CheckedProblem],
    pub pass: bool,
}

#[derive(Serialize)]
pub struct ImplementationRecord {
    pub name: String,
    pub precision: Precision,
    pub outputs: String,
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub about: std::collections::BTreeMap<String, serde_json::Value>,
}

/// One problem and every implementation's grade on it.
#[derive(Serialize)]
pub struct CheckedProblem {
    #[serde(flatten)]
    pub problem: ExportedProblem,
    pub rows_checked: usize,
    pub row_rule: String,
    /// How the exported codes used E4M3's range.
    pub input_range: crate::quantizer::InputRange,
    pub grades: Vec<Grade>,
}

/// One implementation's grade on one problem.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Grade {
    pub implementation: String,
    pub precision: Precision,
    pub pass: bool,
    /// The output file graded (or that should have been).
    pub file: String,
    /// How the output was stored: f16, bf16, f32, e4m3.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// Why the output could not be graded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
    /// Against the f64 reference on the inputs as the implementation read them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<ErrorMetrics>,
    /// Against the f64 reference on the original f32 inputs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_to_end: Option<ErrorMetrics>,
    /// `[b, h, s]` of the largest error over its bound (the kernel reference's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worst_row: Option<[usize; 3]>,
    pub verdict: Verdict,
    /// Each failing gate, as printed.
    pub failures: Vec<String>,
    /// The implementation's own median time, as it reported it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p50_us: Option<f64>,
    /// Whether an all-zero output would pass the same gates: then the model's bound is wider
    /// than the output itself on this problem (long FP8 rows, large qk_std) and a PASS says
    /// little. Shown beside the verdict, never hidden.
    #[serde(default)]
    pub zeros_would_pass: bool,
}

/// The references of one problem's checked rows for each precision graded, computed once and
/// finished per output format.
pub struct ProblemTruth<'a> {
    problem: &'a Problem,
    rows: &'a RowSet,
    sums: Vec<(Precision, RowSums)>,
    /// The FP22 chain FP8 implementations are held to (`check --fp8-chain`).
    fp8_chain: Option<usize>,
}

impl<'a> ProblemTruth<'a> {
    /// The sums for every precision in `precisions` (the expensive part: seven f64 GEMMs per
    /// precision over the checked rows, src/reference/mod.rs).
    pub fn new(problem: &'a Problem, rows: &'a RowSet, precisions: &[Precision]) -> Self {
        let mut wanted = precisions.to_vec();
        wanted.sort();
        wanted.dedup();
        let sums = wanted
            .into_iter()
            .map(|precision| {
                let reading = Model::Implementation(Implementation::any(
                    precision,
                    crate::reference::OutputFormat::F32,
                ))
                .reading();
                (precision, RowSums::read(problem, rows, reading))
            })
            .collect();
        ProblemTruth {
            problem,
            rows,
            sums,
            fp8_chain: None,
        }
    }

    /// Holds FP8 implementations to FP22 sums of at most `chain` keys
    /// ([`Implementation::fp22_chain`]; `None`: every key of the row).
    pub fn with_fp8_chain(mut self, chain: Option<usize>) -> Self {
        self.fp8_chain = chain;
        self
    }

    /// Grades `output` (or its fault) of an implementation that read `precision`.
    pub fn grade(
        &self,
        implementation: &str,
        precision: Precision,
        output: Result<Output, OutputFault>,
        file: String,
        gates: &CorrectnessGates,
    ) -> Grade {
        let mut grade = Grade {
            implementation: implementation.to_string(),
            precision,
            pass: false,
            file,
            output: None,
            fault: None,
            kernel: None,
            end_to_end: None,
            worst_row: None,
            verdict: Verdict::default(),
            failures: Vec::new(),
            p50_us: None,
            zeros_would_pass: false,
        };
        let output = match output {
            Ok(o) => o,
            Err(fault) => {
                grade.fault = Some(fault.to_string());
                grade.failures = vec![fault.to_string()];
                return grade;
            }
        };
        let sums = self
            .sums
            .iter()
            .find(|(p, _)| *p == precision)
            .map(|(_, s)| s.clone())
            .expect("the sums of every graded precision were computed");
        let model = Model::Implementation(Implementation {
            fp22_chain: self.fp8_chain.filter(|_| precision == Precision::Fp8),
            ..Implementation::any(precision, output.format)
        });
        let refs = References::finish(self.problem, &model, self.rows, sums);
        let shape = &self.problem.shape;
        let measure = |reference: &[f64], bound: &[f64]| {
            metrics::measure_values(&output.values, reference, bound, self.rows, shape)
        };
        let kernel = measure(&refs.kernel, &refs.kernel_bound);
        let end_to_end = measure(&refs.end_to_end, &refs.end_to_end_bound);
        let zeros = vec![0.0; output.values.len()];
        let zero = |reference: &[f64], bound: &[f64]| {
            metrics::measure_values(&zeros, reference, bound, self.rows, shape).max_err_over_bound
        };
        grade.zeros_would_pass = zero(&refs.kernel, &refs.kernel_bound)
            <= gates.kernel.max_err_over_bound
            && zero(&refs.end_to_end, &refs.end_to_end_bound)
                <= gates.end_to_end.max_err_over_bound;
        let mut v = Verdict::default();
        v.add("nonfinite", Check::at_most(kernel.nonfinite as f64, 0.0));
        crate::verdict::add_bound_checks(&mut v, &kernel, &end_to_end, gates);
        let worst = match v.checks.get("kernel.max_err_over_bound") {
            Some(c) if !c.pass => kernel.worst_at,
            _ if !v.checks["end_to_end.max_err_over_bound"].pass => end_to_end.worst_at,
            _ => kernel.worst_at,
        };
        grade.worst_row = worst.map(|[b, h, s, _]| [b, h, s]);
        grade.failures = v.failures();
        if kernel.nonfinite > 0 {
            grade.failures.push(format!(
                "{} holds {} NaN or Inf values",
                output.path.display(),
                kernel.nonfinite
            ));
        }
        grade.pass = v.pass();
        grade.output = Some(output.format.name().to_string());
        grade.kernel = Some(kernel);
        grade.end_to_end = Some(end_to_end);
        grade.verdict = v;
        grade
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::OutputFormat;
    use crate::shapes::Shape;

    fn gates() -> CorrectnessGates {
        CorrectnessGates::at_the_model()
    }

    /// Textbook attention in f64 on the f32 originals, written as f32: what an fp32
    /// implementation produces.
    fn fp32_output(p: &Problem) -> Vec<f64> {
        let sh = &p.shape;
        let (s, sk, d) = (sh.s, sh.sk, sh.d);
        let mut out = vec![0.0; p.output_len()];
        for bh in 0..sh.heads() {
            let kvh = sh.kv_head_of(bh);
            for i in 0..s {
                let q = &p.inputs.q[(bh * s + i) * d..][..d];
                let seen = sh.visible_keys(i);
                let scores: Vec<f64> = (0..seen)
                    .map(|j| {
                        let k = &p.inputs.k[(kvh * sk + j) * d..][..d];
                        q.iter()
                            .zip(k)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>()
                            * p.softmax_scale as f64
                    })
                    .collect();
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
                let l: f64 = w.iter().sum();
                for x in 0..d {
                    let o: f64 = (0..seen)
                        .map(|j| w[j] * p.inputs.v[(kvh * sk + j) * d + x] as f64)
                        .sum();
                    out[(bh * s + i) * d + x] = if seen == 0 {
                        0.0
                    } else {
                        (o / l) as f32 as f64
                    };
                }
            }
        }
        out
    }

    fn graded(p: &Problem, values: Vec<f64>) -> Grade {
        let rows = RowSet::all(&p.shape);
        let truth = ProblemTruth::new(p, &rows, &[Precision::Fp32]);
        let output = Output {
            values,
            format: OutputFormat::F32,
            path: "o.npy".into(),
        };
        truth.grade("t", Precision::Fp32, Ok(output), "o.npy".into(), &gates())
    }

    #[test]
    fn a_correct_fp32_output_passes_and_one_row_scaled_by_a_percent_fails_naming_that_row() {
        let sh = Shape::parse_inline("1x4x40x64:sk=70:hkv=2:causal")
            .unwrap()
            .unwrap();
        let p = Problem::new(&sh, 5);
        let good = fp32_output(&p);
        let g = graded(&p, good.clone());
        assert!(g.pass, "{:?}", g.failures);
        assert!(
            !g.zeros_would_pass,
            "fp32 on ordinary inputs tells an output from zeros"
        );
        let mut bad = good;
        let row = (2 * 40 + 17) * 64;
        for x in &mut bad[row..row + 64] {
            *x *= 1.01;
        }
        let g = graded(&p, bad);
        assert!(!g.pass);
        assert_eq!(g.worst_row, Some([0, 2, 17]));
        assert!(g.failures[0].starts_with("end_to_end") || g.failures[0].starts_with("kernel"));
    }

    #[test]
    fn nan_in_the_output_fails_and_says_how_many() {
        let p = Problem::new(&Shape::new("t", 1, 1, 8, 64), 0);
        let mut out = fp32_output(&p);
        out[3] = f64::NAN;
        let g = graded(&p, out);
        assert!(!g.pass);
        assert!(
            g.failures.iter().any(|f| f.contains("1 NaN or Inf")),
            "{:?}",
            g.failures
        );
    }

    #[test]
    fn a_fault_is_a_fail_that_carries_its_message() {
        let p = Problem::new(&Shape::new("t", 1, 1, 8, 64), 0);
        let rows = RowSet::all(&p.shape);
        let truth = ProblemTruth::new(&p, &rows, &[Precision::Fp16]);
        let fault = OutputFault::Missing {
            path: "OUT/t.npy".into(),
            note: None,
        };
        let g = truth.grade(
            "x",
            Precision::Fp16,
            Err(fault),
            "OUT/t.npy".into(),
            &gates(),
        );
        assert!(
            !g.pass && g.failures == ["OUT/t.npy: missing"],
            "{:?}",
            g.failures
        );
    }
}
