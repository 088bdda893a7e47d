//! Correctness verdicts: each gate of the gates file checked and recorded on its own.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::gates::CorrectnessGates;
use crate::metrics::ErrorMetrics;
use crate::quantizer::Audit;
use crate::scale_fit::ScaleFit;

/// One gate: the measured value, its limit, the rule between them, and the outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    #[serde(with = "crate::json::f64_or_inf")]
    pub value: f64,
    #[serde(with = "crate::json::f64_or_inf")]
    pub limit: f64,
    /// `"<="` (an upper limit) or `">="` (a lower limit).
    pub rule: String,
    pub pass: bool,
}

impl Check {
    pub fn at_most(value: f64, limit: f64) -> Self {
        Check {
            value,
            limit,
            rule: "<=".into(),
            pass: value <= limit,
        }
    }

    pub fn at_least(value: f64, limit: f64) -> Self {
        Check {
            value,
            limit,
            rule: ">=".into(),
            pass: value >= limit,
        }
    }
}

/// Every gate of one (shape, seed, variant), keyed by its dotted name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub checks: BTreeMap<String, Check>,
}

impl Verdict {
    pub fn add(&mut self, name: &str, check: Check) {
        self.checks.insert(name.to_string(), check);
    }

    pub fn pass(&self) -> bool {
        self.checks.values().all(|c| c.pass)
    }

    /// The failing gates, each as [`Failed`] prints it.
    pub fn failures(&self) -> Vec<String> {
        failed(&self.checks).map(|f| f.to_string()).collect()
    }
}

/// The failed checks of a set of named checks, in name order.
pub fn failed(checks: &BTreeMap<String, Check>) -> impl Iterator<Item = Failed<'_>> {
    checks
        .iter()
        .filter(|(_, c)| !c.pass)
        .map(|(gate, check)| Failed { gate, check })
}

/// A failed check as every report writes it (console, JUnit, stress, selftest):
/// `kernel.max_abs_err 2.100e-3 > 1.600e-3`, or `<` for a lower limit.
pub struct Failed<'a> {
    pub gate: &'a str,
    pub check: &'a Check,
}

impl std::fmt::Display for Failed<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let op = if self.check.rule == ">=" { "<" } else { ">" };
        write!(
            f,
            "{} {} {op} {}",
            self.gate,
            short(self.check.value),
            short(self.check.limit)
        )
    }
}

fn short(x: f64) -> String {
    if x == x.trunc() && x.abs() < 1e9 {
        format!("{x}")
    } else {
        format!("{x:.3e}")
    }
}

/// The figures of one problem that every output of it is judged with.
#[derive(Debug, Clone, Copy)]
pub struct ProblemFacts {
    /// The quantizer audit of Q, K and V together.
    pub quantizer: Audit,
    /// Largest and mean |O| of the kernel reference: the f16 ulps of the relative gate.
    pub out_abs_max: f64,
    pub out_abs_mean: f64,
}

/// One f16 ulp at magnitude `x` (normal range; the subnormal spacing below it).
pub fn f16_ulp(x: f64) -> f64 {
    let min_normal = 2f64.powi(-14);
    if x < min_normal {
        2f64.powi(-24)
    } else {
        2f64.powi(x.log2().floor() as i32 - 10)
    }
}

/// The two bound gates of an output: its error over the error model's bound against the
/// kernel reference and the end-to-end reference (`run` and `check` alike).
pub fn add_bound_checks(
    v: &mut Verdict,
    kernel: &ErrorMetrics,
    end_to_end: &ErrorMetrics,
    gates: &CorrectnessGates,
) {
    v.add(
        "kernel.max_err_over_bound",
        Check::at_most(kernel.max_err_over_bound, gates.kernel.max_err_over_bound),
    );
    v.add(
        "end_to_end.max_err_over_bound",
        Check::at_most(
            end_to_end.max_err_over_bound,
            gates.end_to_end.max_err_over_bound,
        ),
    );
}

/// Judges a backend output: `kernel` and `end_to_end` are its metrics against the two
/// references and their bounds, `emulation` the CPU emulation's metrics against the kernel
/// reference, `scale` the output's slope on the emulation's (none with fewer than two rows
/// of output: no gate).
pub fn judge(
    kernel: &ErrorMetrics,
    end_to_end: &ErrorMetrics,
    emulation: &ErrorMetrics,
    scale: Option<&ScaleFit>,
    facts: &ProblemFacts,
    gates: &CorrectnessGates,
) -> Verdict {
    let mut v = Verdict::default();
    // Exact checks: no threshold, nothing to loosen.
    v.add("unwritten", Check::at_most(kernel.unwritten as f64, 0.0));
    v.add("nonfinite", Check::at_most(kernel.nonfinite as f64, 0.0));
    let q = &facts.quantizer;
    v.add(
        "quantizer.not_nearest",
        Check::at_most(q.not_nearest as f64, 0.0),
    );
    v.add(
        "quantizer.scale_off",
        Check::at_most(q.scale_off as f64, 0.0),
    );
    v.add(
        "inputs.zero_slices",
        Check::at_most(q.zero_slices as f64, 0.0),
    );
    // The error model's bounds.
    add_bound_checks(&mut v, kernel, end_to_end, gates);
    // FlashAttention's rule against the same-precision emulation.
    let rel = &gates.relative;
    v.add(
        "relative.max_abs_err",
        Check::at_most(
            kernel.max_abs_err,
            rel.factor * emulation.max_abs_err + rel.eps_ulps * f16_ulp(facts.out_abs_max),
        ),
    );
    v.add(
        "relative.mean_abs_err",
        Check::at_most(
            kernel.mean_abs_err,
            rel.factor * emulation.mean_abs_err + rel.eps_ulps * f16_ulp(facts.out_abs_mean),
        ),
    );
    // The output's scale against the emulation's: a scale mistake moves every row at once.
    if let Some(fit) = scale {
        v.add(
            "emulation.scale",
            Check::at_most(
                fit.deviation(),
                fit.limit(gates.scale.allowance, gates.scale.p),
            ),
        );
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(max: f64, mean: f64, ratio: f64) -> ErrorMetrics {
        ErrorMetrics {
            max_abs_err: max,
            mean_abs_err: mean,
            rmse: mean,
            max_err_over_bound: ratio,
            nonfinite: 0,
            unwritten: 0,
            elements: 100,
            worst_at: None,
        }
    }

    fn gates() -> CorrectnessGates {
        CorrectnessGates::at_the_model()
    }

    const FACTS: ProblemFacts = ProblemFacts {
        quantizer: Audit {
            not_nearest: 0,
            scale_off: 0,
            zero_slices: 0,
        },
        out_abs_max: 1.0,
        out_abs_mean: 0.25,
    };

    fn failed_gates(v: &Verdict) -> Vec<&str> {
        super::failed(&v.checks).map(|f| f.gate).collect()
    }

    #[test]
    fn within_every_bound_passes_and_every_gate_is_recorded() {
        let v = judge(
            &metrics(4e-4, 4e-5, 0.3),
            &metrics(0.05, 0.005, 0.1),
            &metrics(3e-4, 3e-5, 0.2),
            None,
            &FACTS,
            &gates(),
        );
        assert!(v.pass(), "{:?}", v.failures());
        assert_eq!(v.checks.len(), 9);
    }

    #[test]
    fn unwritten_or_nonfinite_fails_even_with_zero_error() {
        let zero = metrics(0.0, 0.0, 0.0);
        let mut m = zero.clone();
        m.unwritten = 1;
        let v = judge(&m, &zero, &zero, None, &FACTS, &gates());
        assert_eq!(v.failures(), vec!["unwritten 1 > 0"]);
        let mut m = zero.clone();
        m.nonfinite = 3;
        assert_eq!(
            failed_gates(&judge(&m, &zero, &zero, None, &FACTS, &gates())),
            ["nonfinite"]
        );
    }

    #[test]
    fn a_quantizer_or_input_defect_fails_its_exact_gate_whatever_the_errors() {
        let zero = metrics(0.0, 0.0, 0.0);
        let mut facts = FACTS;
        facts.quantizer = Audit {
            not_nearest: 5,
            scale_off: 1,
            zero_slices: 2,
        };
        let v = judge(&zero, &zero, &zero, None, &facts, &gates());
        assert_eq!(
            failed_gates(&v),
            [
                "inputs.zero_slices",
                "quantizer.not_nearest",
                "quantizer.scale_off"
            ]
        );
    }

    #[test]
    fn an_error_beyond_the_model_bound_fails_that_gate_alone() {
        let v = judge(
            &metrics(4e-4, 4e-5, 1.2),
            &metrics(0.05, 0.005, 0.1),
            &metrics(3e-4, 3e-5, 0.2),
            None,
            &FACTS,
            &gates(),
        );
        assert_eq!(failed_gates(&v), ["kernel.max_err_over_bound"]);
        assert_eq!(v.failures(), ["kernel.max_err_over_bound 1.200e0 > 1"]);
    }

    #[test]
    fn kernel_error_beyond_twice_the_emulation_error_plus_one_ulp_fails_the_relative_gate() {
        // ulp(1.0) = 2^-10; 2 * 3e-4 + 2^-10 = 1.577e-3.
        let within = metrics(1.5e-3, 4e-5, 0.3);
        let beyond = metrics(1.6e-3, 4e-5, 0.3);
        let e2e = metrics(0.05, 0.005, 0.1);
        let emu = metrics(3e-4, 3e-5, 0.2);
        assert!(judge(&within, &e2e, &emu, None, &FACTS, &gates()).pass());
        let v = judge(&beyond, &e2e, &emu, None, &FACTS, &gates());
        assert_eq!(failed_gates(&v), ["relative.max_abs_err"]);
    }

    #[test]
    fn a_slope_off_by_more_than_allowance_plus_chance_fails_the_scale_gate_alone() {
        let ok = (
            metrics(4e-4, 4e-5, 0.3),
            metrics(0.05, 0.005, 0.1),
            metrics(3e-4, 3e-5, 0.2),
        );
        let judged = |slope: f64| {
            let fit = ScaleFit {
                slope,
                std_err: 1e-5,
                rows: 1000,
                dof: 999.0,
            };
            judge(&ok.0, &ok.1, &ok.2, Some(&fit), &FACTS, &gates())
        };
        // Limit: 2^-10 + t(1 - 5e-7, 999) * 1e-5 = 9.77e-4 + 4.95e-5.
        assert!(judged(1.001).pass());
        assert!(judged(1.0 - 1.0e-3).pass());
        let v = judged(1.0011);
        assert_eq!(failed_gates(&v), ["emulation.scale"]);
        assert_eq!(failed_gates(&judged(0.9989)), ["emulation.scale"]);
        // No fit (fewer than two rows of output): no gate.
        let none = judge(&ok.0, &ok.1, &ok.2, None, &FACTS, &gates());
        assert!(!none.checks.contains_key("emulation.scale"));
    }

    #[test]
    fn f16_ulps_follow_the_binade() {
        assert_eq!(f16_ulp(1.0), 2f64.powi(-10));
        assert_eq!(f16_ulp(1.999), 2f64.powi(-10));
        assert_eq!(f16_ulp(2.0), 2f64.powi(-9));
        assert_eq!(f16_ulp(0.3), 2f64.powi(-12));
        assert_eq!(f16_ulp(1e-6), 2f64.powi(-24));
    }
}
