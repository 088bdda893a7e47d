//! Deciding: every gate of a run or of a comparison of two runs is decided here, once, into a
//! [`Decision`]. The checks of one output are made in [`crate::verdict`]; this module turns
//! them, the resource checks and the performance comparisons into the outcome. What comes
//! after (the files of [`crate::publish`], COMPARE.md, JUnit, the console) formats a
//! decision and decides nothing.

use std::collections::BTreeMap;
use std::fmt;

use crate::error::Outcome;
use crate::gates::{Gates, PerformanceGates};
use crate::perf::compare::SavedRun;
use crate::schema::{CorrectnessFile, CorrectnessRecord, PerfFile, ShapeComparison};
use crate::stats::PerfVerdict;
use crate::verdict::Verdict;

/// Which kind of gate failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateKind {
    Correctness,
    /// The inputs of a run as a whole (fresh draws per seed).
    Inputs,
    Resources,
    Performance,
}

impl fmt::Display for GateKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GateKind::Correctness => "correctness",
            GateKind::Inputs => "inputs",
            GateKind::Resources => "resources",
            GateKind::Performance => "performance",
        })
    }
}

/// One reason the outcome is a failure: what failed, of what, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct GateFailure {
    pub kind: GateKind,
    /// A (shape, seed, variant), a variant or a shape.
    pub subject: String,
    pub why: String,
}

impl fmt::Display for GateFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} gate, {}: {}", self.kind, self.subject, self.why)
    }
}

/// Whether a target shape reached `min_speedup_pct` with a FASTER verdict.
#[derive(Debug, Clone, PartialEq)]
pub enum TargetStatus {
    Met,
    NotMet(String),
    NotMeasured,
}

/// A shape whose candidate is SLOWER by more than `max_regression_pct`.
#[derive(Debug, Clone, PartialEq)]
pub struct Regression {
    pub shape: String,
    pub slowdown_pct: f64,
    pub allowed_pct: f64,
}

impl fmt::Display for Regression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} is SLOWER by {:.1}% (more than the allowed {:.1}%)",
            self.shape, self.slowdown_pct, self.allowed_pct
        )
    }
}

/// Everything decided about a run or a comparison.
#[derive(Debug, Clone, Default)]
pub struct Decision {
    pub targets: Vec<(String, TargetStatus)>,
    pub regressions: Vec<Regression>,
    /// Every failure that counts; empty means the outcome is a pass.
    pub failures: Vec<GateFailure>,
}

impl Decision {
    pub fn outcome(&self) -> Outcome {
        Outcome::from_pass(self.failures.is_empty())
    }
}

/// A run's result files and its decision, ready to publish.
pub struct RunAnalysis {
    pub correctness: CorrectnessFile,
    /// With the in-run comparisons filled in; None for a correctness-only run.
    pub perf: Option<PerfFile>,
    pub decision: Decision,
}

/// What a run measured, before anything is decided.
pub struct RunMeasured {
    pub backend: String,
    pub records: Vec<CorrectnessRecord>,
    pub resources: Vec<(String, Verdict)>,
    /// With an empty `comparisons`; None for a correctness-only run.
    pub perf: Option<PerfFile>,
}

/// Decides a run: every correctness row and resource gate; with `require_speedup`, every
/// target shape's speedup. In-run regressions of the candidate variant are reported but are
/// no failure of the run (they are the question the run answers, not a gate).
pub fn analyze_run(measured: RunMeasured, gates: &Gates, require_speedup: bool) -> RunAnalysis {
    let RunMeasured {
        backend,
        records,
        resources,
        perf,
    } = measured;
    let perf = perf.map(|mut p| {
        p.comparisons = crate::perf::paired_comparisons(
            &p,
            gates.performance.confidence,
            gates.performance.noise_floor_pct,
        );
        p
    });
    let cmps = perf.as_ref().map_or(&[][..], |p| &p.comparisons[..]);
    let mut failures = correctness_failures(&records);
    failures.extend(repeated_inputs(&records));
    failures.extend(resource_failures(&resources, None));
    let targets = targets(cmps, &gates.performance);
    if require_speedup {
        failures.extend(target_failures(&targets));
    }
    let correctness = CorrectnessFile {
        schema_version: crate::schema::SCHEMA_VERSION,
        all_pass: failures.iter().all(|f| f.kind == GateKind::Performance),
        backend,
        resources: resources.into_iter().collect(),
        results: records,
    };
    RunAnalysis {
        decision: Decision {
            regressions: regressions(cmps, &gates.performance),
            targets,
            failures,
        },
        correctness,
        perf,
    }
}

/// Inputs must be drawn afresh for every seed: two seeds of one shape with the same input
/// checksum mean the seed never reached the generator (a correctness gate, exact).
fn repeated_inputs(records: &[CorrectnessRecord]) -> Vec<GateFailure> {
    let mut first: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    let mut failures = Vec::new();
    for r in records {
        let seed = *first
            .entry((r.shape.as_str(), r.input_checksum.as_str()))
            .or_insert(r.seed);
        if seed != r.seed && !failures.iter().any(|f: &GateFailure| f.subject == r.shape) {
            failures.push(GateFailure {
                kind: GateKind::Inputs,
                subject: r.shape.clone(),
                why: format!(
                    "inputs.redrawn: seeds {seed} and {} drew identical inputs (checksum {}…)",
                    r.seed,
                    &r.input_checksum[..r.input_checksum.len().min(12)]
                ),
            });
        }
    }
    failures
}

/// Decides a comparison of two saved runs for `compare --gate`: the candidate's whole
/// correctness verdict (rows, resources, `all_pass`), then regressions beyond
/// `max_regression_pct`.
pub fn analyze_compare(
    cand: &SavedRun,
    cand_variant: &str,
    cmps: &[ShapeComparison],
    gates: &PerformanceGates,
) -> Decision {
    let mut failures = Vec::new();
    match &cand.correctness {
        None => failures.push(GateFailure {
            kind: GateKind::Correctness,
            subject: format!("candidate {cand_variant}"),
            why: format!(
                "the candidate run has no correctness.json beside {}",
                cand.perf_path.display()
            ),
        }),
        Some(c) => {
            let rows: Vec<CorrectnessRecord> = c
                .results
                .iter()
                .filter(|r| r.variant == cand_variant)
                .cloned()
                .collect();
            if rows.is_empty() {
                failures.push(GateFailure {
                    kind: GateKind::Correctness,
                    subject: format!("candidate {cand_variant}"),
                    why: "the candidate run has no correctness rows of this variant".into(),
                });
            }
            failures.extend(correctness_failures(&rows));
            let resources: Vec<(String, Verdict)> = c.resources.clone().into_iter().collect();
            failures.extend(resource_failures(&resources, Some(cand_variant)));
            if !c.all_pass && failures.is_empty() {
                failures.push(GateFailure {
                    kind: GateKind::Correctness,
                    subject: "candidate run".into(),
                    why: "its correctness.json says all_pass: false".into(),
                });
            }
        }
    }
    let regressions = regressions(cmps, gates);
    failures.extend(regressions.iter().map(|r| GateFailure {
        kind: GateKind::Performance,
        subject: r.shape.clone(),
        why: r.to_string(),
    }));
    Decision {
        targets: targets(cmps, gates),
        regressions,
        failures,
    }
}

/// How a correctness row is named as the subject of a failure (and of its JUnit case).
pub fn row_subject(r: &CorrectnessRecord) -> String {
    format!("{} seed={} {}", r.shape, r.seed, r.variant)
}

fn correctness_failures(records: &[CorrectnessRecord]) -> Vec<GateFailure> {
    records
        .iter()
        .filter(|r| !r.pass)
        .map(|r| GateFailure {
            kind: GateKind::Correctness,
            subject: row_subject(r),
            why: {
                let failed: Vec<String> = crate::verdict::failed(&r.gates)
                    .map(|f| f.to_string())
                    .collect();
                if failed.is_empty() {
                    "marked FAIL (no failed check recorded)".to_string()
                } else {
                    failed.join("; ")
                }
            },
        })
        .collect()
}

fn resource_failures(resources: &[(String, Verdict)], only: Option<&str>) -> Vec<GateFailure> {
    resources
        .iter()
        .filter(|(variant, v)| only.is_none_or(|o| o == variant) && !v.pass())
        .map(|(variant, v)| GateFailure {
            kind: GateKind::Resources,
            subject: variant.clone(),
            why: v.failures().join("; "),
        })
        .collect()
}

fn target_failures(targets: &[(String, TargetStatus)]) -> Vec<GateFailure> {
    targets
        .iter()
        .filter(|(_, status)| *status != TargetStatus::Met)
        .map(|(shape, status)| GateFailure {
            kind: GateKind::Performance,
            subject: shape.clone(),
            why: match status {
                TargetStatus::NotMet(why) => format!("target not met: {why}"),
                _ => "target shape not measured in this run".into(),
            },
        })
        .collect()
}

/// The shapes whose candidate is SLOWER by more than `max_regression_pct`.
pub fn regressions(cmps: &[ShapeComparison], gates: &PerformanceGates) -> Vec<Regression> {
    cmps.iter()
        .filter(|c| {
            c.verdict == PerfVerdict::Slower
                && (c.estimate.ratio - 1.0) * 100.0 > gates.max_regression_pct
        })
        .map(|c| Regression {
            shape: c.shape.clone(),
            slowdown_pct: (c.estimate.ratio - 1.0) * 100.0,
            allowed_pct: gates.max_regression_pct,
        })
        .collect()
}

/// Each target shape of the gates file, met or not.
pub fn targets(cmps: &[ShapeComparison], gates: &PerformanceGates) -> Vec<(String, TargetStatus)> {
    gates
        .target_shapes
        .iter()
        .map(|t| {
            let status = match cmps.iter().find(|c| &c.shape == t) {
                None => TargetStatus::NotMeasured,
                Some(c)
                    if c.verdict == PerfVerdict::Faster
                        && c.speedup_pct >= gates.min_speedup_pct =>
                {
                    TargetStatus::Met
                }
                Some(c) => TargetStatus::NotMet(format!(
                    "{:+.1}% ({}), needs at least {:+.1}% and FASTER",
                    c.speedup_pct, c.verdict, gates.min_speedup_pct
                )),
            };
            (t.clone(), status)
        })
        .collect()
}
