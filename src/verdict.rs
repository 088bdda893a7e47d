//! Correctness verdicts: each gate of the gates file checked and recorded on its own.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::gates::{CorrectnessGates, ErrorGate};
use crate::metrics::ErrorMetrics;

/// One gate: the measured value, its limit, the rule between them, and the outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    pub value: f64,
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

/// Judges a backend output on `shape`: `kernel` and `end_to_end` are its metrics against the
/// two references, `emulation` the CPU emulation's metrics against the kernel reference.
pub fn judge(
    shape: &str,
    kernel: &ErrorMetrics,
    end_to_end: &ErrorMetrics,
    emulation: &ErrorMetrics,
    gates: &CorrectnessGates,
) -> Verdict {
    let mut checks = BTreeMap::new();
    // NaN, Inf and unwritten elements fail whatever the thresholds say.
    checks.insert(
        "unwritten".into(),
        Check::at_most(kernel.unwritten as f64, 0.0),
    );
    checks.insert(
        "nonfinite".into(),
        Check::at_most(kernel.nonfinite as f64, 0.0),
    );
    add_error_gate(&mut checks, "kernel", kernel, &gates.kernel);
    add_error_gate(
        &mut checks,
        "end_to_end",
        end_to_end,
        gates.end_to_end_for(shape),
    );
    let rel = &gates.relative;
    checks.insert(
        "relative.max_abs_err".into(),
        Check::at_most(
            kernel.max_abs_err,
            rel.factor * emulation.max_abs_err + rel.max_abs_eps,
        ),
    );
    checks.insert(
        "relative.mean_abs_err".into(),
        Check::at_most(
            kernel.mean_abs_err,
            rel.factor * emulation.mean_abs_err + rel.mean_abs_eps,
        ),
    );
    Verdict { checks }
}

fn add_error_gate(
    checks: &mut BTreeMap<String, Check>,
    name: &str,
    m: &ErrorMetrics,
    g: &ErrorGate,
) {
    checks.insert(
        format!("{name}.max_abs_err"),
        Check::at_most(m.max_abs_err, g.max_abs_err),
    );
    checks.insert(
        format!("{name}.mean_abs_err"),
        Check::at_most(m.mean_abs_err, g.mean_abs_err),
    );
    checks.insert(
        format!("{name}.pct_bad"),
        Check::at_most(m.pct_bad, g.pct_bad),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gates::RelativeGate;

    fn metrics(max: f64, mean: f64) -> ErrorMetrics {
        ErrorMetrics {
            max_abs_err: max,
            mean_abs_err: mean,
            rmse: mean,
            pct_bad: 0.0,
            nonfinite: 0,
            unwritten: 0,
            elements: 100,
            worst_at: None,
        }
    }

    fn gates() -> CorrectnessGates {
        let g = ErrorGate {
            max_abs_err: 0.01,
            mean_abs_err: 0.001,
            pct_bad: 0.0,
            bad_atol: 0.01,
            bad_rtol: 0.0,
        };
        CorrectnessGates {
            kernel: g.clone(),
            end_to_end: ErrorGate {
                max_abs_err: 0.1,
                mean_abs_err: 0.01,
                ..g
            },
            relative: RelativeGate {
                factor: 2.0,
                max_abs_eps: 1e-4,
                mean_abs_eps: 1e-5,
            },
            end_to_end_by_shape: Default::default(),
        }
    }

    #[test]
    fn within_every_threshold_passes() {
        let v = judge(
            "s",
            &metrics(0.004, 0.0004),
            &metrics(0.05, 0.005),
            &metrics(0.003, 0.0003),
            &gates(),
        );
        assert!(v.pass(), "{:?}", v.failures());
    }

    #[test]
    fn unwritten_or_nonfinite_fails_even_with_zero_error() {
        let mut m = metrics(0.0, 0.0);
        m.unwritten = 1;
        let v = judge("s", &m, &metrics(0.0, 0.0), &metrics(0.0, 0.0), &gates());
        assert_eq!(v.failures(), vec!["unwritten 1 > 0"]);
        let mut m = metrics(0.0, 0.0);
        m.nonfinite = 3;
        assert!(!judge("s", &m, &metrics(0.0, 0.0), &metrics(0.0, 0.0), &gates()).pass());
    }

    #[test]
    fn kernel_error_beyond_twice_the_emulation_error_fails_the_relative_gate() {
        let v = judge(
            "s",
            &metrics(0.009, 0.0004),
            &metrics(0.05, 0.005),
            &metrics(0.003, 0.0003),
            &gates(),
        );
        assert_eq!(v.failures().len(), 1);
        assert!(
            v.failures()[0].starts_with("relative.max_abs_err"),
            "{:?}",
            v.failures()
        );
    }

    #[test]
    fn each_absolute_gate_is_recorded_separately() {
        let v = judge(
            "s",
            &metrics(0.02, 0.0004),
            &metrics(0.2, 0.005),
            &metrics(0.02, 0.0003),
            &gates(),
        );
        let failed: Vec<_> = v
            .checks
            .iter()
            .filter(|(_, c)| !c.pass)
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(failed, ["end_to_end.max_abs_err", "kernel.max_abs_err"]);
        assert_eq!(v.checks.len(), 10);
    }
}
