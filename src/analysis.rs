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
use crate::schema::{
    CorrectnessFile, CorrectnessRecord, PairKind, PerfFile, ShapeComparison, VariantMeta,
};
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
    /// compute-sanitizer's stage (`--sanitize`).
    Sanitizer,
}

impl fmt::Display for GateKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GateKind::Correctness => "correctness",
            GateKind::Inputs => "inputs",
            GateKind::Resources => "resources",
            GateKind::Performance => "performance",
            GateKind::Sanitizer => "sanitizer",
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
    pub baseline: String,
    pub candidate: String,
    pub pair: PairKind,
    pub slowdown_pct: f64,
    pub allowed_pct: f64,
}

impl Regression {
    fn failure(&self) -> GateFailure {
        GateFailure {
            kind: GateKind::Performance,
            subject: pair_subject(&self.shape, &self.candidate, &self.baseline),
            why: format!(
                "SLOWER by {:.1}% (more than the allowed {:.1}%)",
                self.slowdown_pct, self.allowed_pct
            ),
        }
    }
}

/// How a comparison is named as the subject of a failure (and of its JUnit case):
/// `mission: cp0 vs base-cp0`.
pub fn comparison_subject(c: &ShapeComparison) -> String {
    pair_subject(&c.shape, &c.candidate, &c.baseline)
}

fn pair_subject(shape: &str, candidate: &str, baseline: &str) -> String {
    format!("{shape}: {candidate} vs {baseline}")
}

impl fmt::Display for Regression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} vs {} on {} is SLOWER by {:.1}% (more than the allowed {:.1}%)",
            self.candidate, self.baseline, self.shape, self.slowdown_pct, self.allowed_pct
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
    /// What the reader must know but fails nothing: the base kernel's own failures, a
    /// verdict measured at an unsteady clock without `--gate`.
    pub notices: Vec<String>,
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
    /// Every variant that ran, the base kernel's included.
    pub variants: Vec<VariantMeta>,
    pub records: Vec<CorrectnessRecord>,
    pub resources: Vec<(String, Verdict)>,
    /// With an empty `comparisons`; None for a correctness-only run.
    pub perf: Option<PerfFile>,
    /// The sanitizer stage's results (`--sanitize`); empty without it.
    pub sanitizers: Vec<crate::sanitize::SanitizerResult>,
}

/// What turns a run's verdicts into failures beyond correctness and resources.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunPolicy {
    /// `--require-speedup`: every target shape must be FASTER by `min_speedup_pct`.
    pub require_speedup: bool,
    /// `--gate` (with `--base-kernel`): SLOWER than the base kernel beyond
    /// `max_regression_pct`, or a verdict measured at an unsteady clock, fails the run.
    pub gate: bool,
}

/// Every sanitizer result that is not clean, named by its tool, variant and problem.
fn sanitizer_failures(results: &[crate::sanitize::SanitizerResult]) -> Vec<GateFailure> {
    results
        .iter()
        .filter(|r| !r.clean())
        .map(|r| GateFailure {
            kind: GateKind::Sanitizer,
            subject: format!(
                "{} on {}{}",
                r.tool,
                r.variant,
                r.problem
                    .as_ref()
                    .map(|p| format!(", {p}"))
                    .unwrap_or_default()
            ),
            why: format!(
                "{}: {}{}",
                r.outcome,
                r.summary,
                r.first_report
                    .as_ref()
                    .map(|f| format!("; first report: {f}"))
                    .unwrap_or_default()
            ),
        })
        .collect()
}

/// Decides a run: every correctness row and resource gate of the kernel under test (the
/// base kernel's failures are notices); with `require_speedup`, every target shape's
/// speedup; with `gate`, every comparison against the base kernel. Regressions of one
/// variant against another are reported but fail nothing (they are the question the run
/// answers, not a gate).
pub fn analyze_run(
    measured: RunMeasured,
    gates: &Gates,
    policy: RunPolicy,
    floor_of: &dyn Fn(&str) -> crate::floors::FloorChoice,
) -> RunAnalysis {
    let RunMeasured {
        backend,
        variants,
        records,
        resources,
        perf,
        sanitizers,
    } = measured;
    let perf = perf.map(|mut p| {
        p.comparisons = crate::perf::paired_comparisons(&p, &gates.performance, floor_of);
        p
    });
    let cmps = perf.as_ref().map_or(&[][..], |p| &p.comparisons[..]);
    let is_base = |name: &str| variants.iter().any(|v| v.name == name && v.is_base());
    let (base_rows, rows): (Vec<_>, Vec<_>) =
        records.iter().cloned().partition(|r| is_base(&r.variant));
    let (base_resources, own_resources): (Vec<_>, Vec<_>) =
        resources.iter().cloned().partition(|(v, _)| is_base(v));
    let mut notices: Vec<String> = correctness_failures(&base_rows)
        .into_iter()
        .chain(resource_failures(&base_resources, None))
        .map(|f| format!("the base kernel fails: {f}"))
        .collect();
    let mut failures = correctness_failures(&rows);
    failures.extend(repeated_inputs(&records));
    failures.extend(resource_failures(&own_resources, None));
    failures.extend(sanitizer_failures(&sanitizers));
    let correctness_pass = failures.is_empty();
    let variant_cmps: Vec<ShapeComparison> = cmps
        .iter()
        .filter(|c| c.pair == PairKind::Variants)
        .cloned()
        .collect();
    let targets = targets(&variant_cmps, &gates.performance);
    if policy.require_speedup {
        failures.extend(target_failures(&targets, &variant_cmps));
    }
    let regressions = regressions(cmps, &gates.performance);
    for c in cmps.iter().filter(|c| crate::perf::unsteady(c)) {
        let why = format!(
            "the SM clock sagged in {} of {} rounds, too many to leave out; the verdict is \
             not trustworthy, rerun on an idle, cool GPU",
            c.rounds_dropped_for_clock, c.rounds_total
        );
        // Where both sides ran the same machine code the change cannot have moved the time,
        // so an untrustworthy verdict there is a notice even under the gate.
        if policy.gate && c.pair == PairKind::BaseKernel && c.same_machine_code != Some(true) {
            failures.push(GateFailure {
                kind: GateKind::Performance,
                subject: comparison_subject(c),
                why,
            });
        } else {
            notices.push(format!("{}: {why}", comparison_subject(c)));
        }
    }
    if policy.gate {
        for r in regressions
            .iter()
            .filter(|r| r.pair == PairKind::BaseKernel)
        {
            // Slower than a base that is wrong is no regression: a fix may cost time.
            if base_rows.iter().any(|b| !b.pass && b.variant == r.baseline) {
                notices.push(format!(
                    "{r}, but {} fails its checks: not gated",
                    r.baseline
                ));
            } else {
                failures.push(r.failure());
            }
        }
    }
    notices.extend(false_verdicts(cmps));
    if let Some(p) = &perf {
        notices.extend(timing_notices(p));
    }
    let correctness = CorrectnessFile {
        schema_version: crate::schema::SCHEMA_VERSION,
        all_pass: correctness_pass,
        backend,
        resources: resources.into_iter().collect(),
        results: records,
        sanitizers,
    };
    RunAnalysis {
        decision: Decision {
            regressions,
            targets,
            failures,
            notices,
        },
        correctness,
        perf,
    }
}

/// What the timer saw that a reader must know: blocks kept with an expired hold, and a GPU
/// run without SM clocks (sagging rounds cannot be told apart).
fn timing_notices(p: &PerfFile) -> Vec<String> {
    let mut out = Vec::new();
    let expired: u32 = p.measurements.iter().map(|m| m.hold_expired_blocks).sum();
    if expired > 0 {
        out.push(format!(
            "{expired} timed blocks were kept although their hold expired in every attempt \
             (the host stalled while enqueuing them); their first samples may include launch \
             latency"
        ));
    }
    let clockless = p
        .measurements
        .iter()
        .all(|m| m.round_sm_mhz.iter().all(Option::is_none));
    if p.backend == "cuda" && !p.measurements.is_empty() && clockless {
        out.push(
            "no timed block has an SM clock (no stamp ran on SM 0): rounds measured at a \
             sagging clock cannot be told apart"
                .into(),
        );
    }
    out
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
    failures.extend(regressions.iter().map(Regression::failure));
    Decision {
        targets: targets(cmps, gates),
        regressions,
        failures,
        notices: false_verdicts(cmps),
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

/// Each target not met, about its comparison (or its shape, when it was not measured).
fn target_failures(
    targets: &[(String, TargetStatus)],
    cmps: &[ShapeComparison],
) -> Vec<GateFailure> {
    targets
        .iter()
        .filter(|(_, status)| *status != TargetStatus::Met)
        .map(|(shape, status)| GateFailure {
            kind: GateKind::Performance,
            subject: cmps
                .iter()
                .find(|c| &c.shape == shape)
                .map_or_else(|| shape.clone(), comparison_subject),
            why: match status {
                TargetStatus::NotMet(why) => format!("target not met: {why}"),
                _ => "target shape not measured in this run".into(),
            },
        })
        .collect()
}

/// The shapes whose candidate is SLOWER by more than `max_regression_pct`, except where both
/// sides ran the same machine code ([`ShapeComparison::false_verdict`]: noise, not the
/// change; [`false_verdicts`] names them).
pub fn regressions(cmps: &[ShapeComparison], gates: &PerformanceGates) -> Vec<Regression> {
    cmps.iter()
        .filter(|c| {
            c.verdict == PerfVerdict::Slower
                && !c.false_verdict()
                && (c.estimate.ratio - 1.0) * 100.0 > gates.max_regression_pct
        })
        .map(|c| Regression {
            shape: c.shape.clone(),
            baseline: c.baseline.clone(),
            candidate: c.candidate.clone(),
            pair: c.pair,
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
                Some(c) if c.same_machine_code == Some(true) => TargetStatus::NotMet(format!(
                    "{:+.1}% ({}), but both sides ran the same machine code: no speedup is \
                     possible",
                    c.speedup_pct, c.verdict
                )),
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

/// One notice per comparison whose two sides ran the same machine code in the same launches
/// on the same inputs yet whose verdict is not SAME: an A/A by construction that the
/// statistics called a difference, so this run's noise exceeded that shape's floor.
pub fn false_verdicts(cmps: &[ShapeComparison]) -> Vec<String> {
    cmps.iter()
        .filter(|c| c.false_verdict())
        .map(|c| {
            format!(
                "{}: {} {:+.2}% although both sides ran the same machine code in the same \
                 launches on the same inputs: a false verdict (this run's noise exceeded the \
                 ±{:.2}% floor; `sdpa-runner noise --paired` measures this GPU's), neither a \
                 regression nor a speedup",
                comparison_subject(c),
                c.verdict,
                c.speedup_pct,
                c.noise_floor_pct
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gates::GateFile;
    use crate::perf::fixtures::perf_file;
    use crate::schema::fixtures::record;

    fn gates() -> Gates {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("gates/default.json");
        GateFile::load(&path).unwrap().gates
    }

    /// A timed run of cp0, cp1 and their base twins; `factors` are the time factors of
    /// (cp0, cp1, base-cp0, base-cp1), `passing` whether each one's row passes.
    fn measured(factors: [f64; 4], passing: [bool; 4]) -> RunMeasured {
        let names = ["cp0", "cp1", "base-cp0", "base-cp1"];
        let variants: Vec<(&str, f64)> = names.iter().copied().zip(factors).collect();
        let mut perf = perf_file("GPU", &["mission"], &[0, 1], &variants);
        crate::perf::fixtures::mark_base(&mut perf);
        RunMeasured {
            backend: "cuda".into(),
            variants: perf.variants.clone(),
            records: names
                .iter()
                .zip(passing)
                .map(|(n, pass)| record(n, pass))
                .collect(),
            resources: Vec::new(),
            perf: Some(perf),
            sanitizers: Vec::new(),
        }
    }

    #[test]
    fn a_sanitizer_finding_or_failure_fails_the_run_naming_tool_variant_and_problem() {
        let mut m = measured([1.0, 1.0, 1.0, 1.0], [true; 4]);
        let result = |tool: &str, outcome: &str| crate::sanitize::SanitizerResult {
            tool: tool.into(),
            variant: "cp1".into(),
            outcome: outcome.into(),
            summary: "ERROR SUMMARY: 1 error".into(),
            first_report: Some("Invalid __global__ read of size 4 bytes".into()),
            problem: Some("1x2x77x64".into()),
            seconds: 1.0,
        };
        m.sanitizers = vec![result("racecheck", "clean"), result("memcheck", "findings")];
        let a = analyze_run(m, &gates(), GATE, &crate::perf::fixtures::constant_floor);
        let text: Vec<String> = a.decision.failures.iter().map(|f| f.to_string()).collect();
        assert_eq!(text.len(), 1, "{text:?}");
        assert!(
            text[0].starts_with("sanitizer gate, memcheck on cp1, 1x2x77x64: findings")
                && text[0].contains("first report: Invalid __global__ read"),
            "{text:?}"
        );
        assert_eq!(a.correctness.sanitizers.len(), 2, "both recorded");
        assert!(!a.correctness.all_pass);
    }

    const GATE: RunPolicy = RunPolicy {
        require_speedup: false,
        gate: true,
    };

    #[test]
    fn with_the_gate_a_kernel_slower_than_its_base_fails_and_without_it_is_only_reported() {
        let slow = [1.05, 1.05, 1.0, 1.0];
        let gated = analyze_run(
            measured(slow, [true; 4]),
            &gates(),
            GATE,
            &crate::perf::fixtures::constant_floor,
        );
        let subjects: Vec<&str> = gated
            .decision
            .failures
            .iter()
            .map(|f| f.why.as_str())
            .collect();
        assert_eq!(subjects.len(), 2, "{subjects:?}");
        assert!(
            subjects[0].starts_with("SLOWER by")
                && subjects[0].ends_with("(more than the allowed 2.0%)"),
            "{subjects:?}"
        );
        assert_eq!(
            gated.decision.failures[0].subject,
            "mission: cp0 vs base-cp0"
        );
        assert!(gated.correctness.all_pass, "slow, but correct");
        let reported = analyze_run(
            measured(slow, [true; 4]),
            &gates(),
            RunPolicy::default(),
            &crate::perf::fixtures::constant_floor,
        );
        assert!(reported.decision.failures.is_empty());
        assert_eq!(reported.decision.regressions.len(), 2);
    }

    /// `m` with every timing launching `f` on one grid, and each variant's `f` of the code
    /// `codes` gives it, in the order (cp0, cp1, base-cp0, base-cp1).
    fn with_code(mut m: RunMeasured, codes: [&str; 4]) -> RunMeasured {
        let p = m.perf.as_mut().unwrap();
        for x in &mut p.measurements {
            x.launch = Some(crate::perf::fixtures::launch("f", 8));
        }
        for (v, code) in p.variants.iter_mut().zip(codes) {
            v.machine_code = vec![crate::perf::fixtures::code("f", code)];
        }
        m.variants = p.variants.clone();
        m
    }

    #[test]
    fn slower_on_the_same_machine_code_is_a_false_verdict_not_a_regression() {
        // cp0 kept its base's code, cp1's moved; both read 5% slower.
        let m = with_code(
            measured([1.05, 1.05, 1.0, 1.0], [true; 4]),
            ["a", "b", "a", "c"],
        );
        let a = analyze_run(m, &gates(), GATE, &crate::perf::fixtures::constant_floor);
        let failed: Vec<&str> = a
            .decision
            .failures
            .iter()
            .map(|f| f.subject.as_str())
            .collect();
        assert_eq!(failed, ["mission: cp1 vs base-cp1"]);
        assert_eq!(a.decision.regressions.len(), 1);
        let notices: Vec<&String> = a
            .decision
            .notices
            .iter()
            .filter(|n| n.contains("same machine code"))
            .collect();
        assert_eq!(notices.len(), 1, "{:?}", a.decision.notices);
        assert!(
            notices[0].starts_with("mission: cp0 vs base-cp0: SLOWER")
                && notices[0].contains("a false verdict"),
            "{notices:?}"
        );
        let cmps = &a.perf.as_ref().unwrap().comparisons;
        let same: Vec<(&str, &str, Option<bool>)> = cmps
            .iter()
            .map(|c| {
                (
                    c.baseline.as_str(),
                    c.candidate.as_str(),
                    c.same_machine_code,
                )
            })
            .collect();
        assert_eq!(
            same,
            [
                ("cp0", "cp1", Some(false)),
                ("base-cp0", "cp0", Some(true)),
                ("base-cp1", "cp1", Some(false)),
            ]
        );
    }

    #[test]
    fn faster_on_the_same_machine_code_does_not_meet_a_target() {
        let policy = RunPolicy {
            require_speedup: true,
            gate: false,
        };
        let fast = [1.0, 0.8, 1.0, 0.8];
        let run = |codes| {
            let m = with_code(measured(fast, [true; 4]), codes);
            analyze_run(m, &gates(), policy, &crate::perf::fixtures::constant_floor)
        };
        let moved = run(["a", "b", "a", "b"]);
        assert!(
            moved.decision.failures.is_empty(),
            "{:?}",
            moved.decision.failures
        );
        let same = run(["a", "a", "a", "a"]);
        assert_eq!(
            same.decision.failures.len(),
            1,
            "{:?}",
            same.decision.failures
        );
        assert!(
            same.decision.failures[0]
                .why
                .contains("both sides ran the same machine code"),
            "{:?}",
            same.decision.failures
        );
    }

    #[test]
    fn a_slowdown_within_the_allowed_regression_passes_the_gate() {
        let a = analyze_run(
            measured([1.015, 1.0, 1.0, 1.0], [true; 4]),
            &gates(),
            GATE,
            &crate::perf::fixtures::constant_floor,
        );
        assert!(a.decision.failures.is_empty(), "{:?}", a.decision.failures);
    }

    #[test]
    fn cp1_slower_than_cp0_is_the_question_of_the_run_not_a_failure_of_the_gate() {
        let a = analyze_run(
            measured([1.0, 1.2, 1.0, 1.2], [true; 4]),
            &gates(),
            GATE,
            &crate::perf::fixtures::constant_floor,
        );
        assert!(a.decision.failures.is_empty(), "{:?}", a.decision.failures);
        assert_eq!(a.decision.regressions[0].pair, PairKind::Variants);
    }

    #[test]
    fn the_base_kernels_own_failures_are_notices_and_the_candidates_are_failures() {
        let base_broken = analyze_run(
            measured([1.0; 4], [true, true, false, true]),
            &gates(),
            GATE,
            &crate::perf::fixtures::constant_floor,
        );
        assert!(base_broken.decision.failures.is_empty());
        assert!(base_broken.correctness.all_pass);
        assert!(
            base_broken.decision.notices[0]
                .starts_with("the base kernel fails: correctness gate, mission seed=0 base-cp0"),
            "{:?}",
            base_broken.decision.notices
        );
        let cand_broken = analyze_run(
            measured([1.0; 4], [true, false, true, true]),
            &gates(),
            GATE,
            &crate::perf::fixtures::constant_floor,
        );
        assert_eq!(cand_broken.decision.failures.len(), 1);
        assert!(cand_broken.decision.failures[0].subject.contains("cp1"));
        assert!(!cand_broken.correctness.all_pass);
    }

    #[test]
    fn slower_than_a_base_that_fails_its_checks_is_a_notice_not_a_regression() {
        let a = analyze_run(
            measured([1.05, 1.0, 1.0, 1.0], [true, true, false, true]),
            &gates(),
            GATE,
            &crate::perf::fixtures::constant_floor,
        );
        assert!(a.decision.failures.is_empty(), "{:?}", a.decision.failures);
        assert!(
            a.decision
                .notices
                .iter()
                .any(|n| n.contains("base-cp0 fails its checks: not gated")),
            "{:?}",
            a.decision.notices
        );
    }

    #[test]
    fn expired_holds_and_a_gpu_run_without_clocks_are_notices() {
        let mut m = measured([1.0; 4], [true; 4]);
        let p = m.perf.as_mut().unwrap();
        p.measurements[0].hold_expired_blocks = 2;
        p.measurements
            .iter_mut()
            .for_each(|x| x.round_sm_mhz = vec![None; 20]);
        let a = analyze_run(m, &gates(), GATE, &crate::perf::fixtures::constant_floor);
        let n = a.decision.notices.join("\n");
        assert!(
            n.contains("2 timed blocks were kept although their hold expired")
                && n.contains("no timed block has an SM clock"),
            "{n}"
        );
    }

    #[test]
    fn a_verdict_against_the_base_at_an_unsteady_clock_fails_the_gate() {
        let mut m = measured([1.0; 4], [true; 4]);
        for x in &mut m.perf.as_mut().unwrap().measurements {
            if x.variant == "base-cp0" {
                x.round_sm_mhz[..18].fill(Some(1500.0));
            }
        }
        let a = analyze_run(m, &gates(), GATE, &crate::perf::fixtures::constant_floor);
        let why: Vec<String> = a.decision.failures.iter().map(|f| f.to_string()).collect();
        assert!(
            why.iter().any(|w| w.contains(
                "performance gate, mission: cp0 vs base-cp0: the SM clock sagged in 36 of 40 rounds"
            )),
            "{why:?}"
        );
        // The same clocks without the gate: a notice.
        let mut m = measured([1.0; 4], [true; 4]);
        for x in &mut m.perf.as_mut().unwrap().measurements {
            if x.variant == "base-cp0" {
                x.round_sm_mhz[..18].fill(Some(1500.0));
            }
        }
        let a = analyze_run(
            m,
            &gates(),
            RunPolicy::default(),
            &crate::perf::fixtures::constant_floor,
        );
        assert!(a.decision.failures.is_empty());
        assert_eq!(a.decision.notices.len(), 1, "{:?}", a.decision.notices);
        // With the gate, where cp0 ran its base's machine code: a notice too.
        let mut m = with_code(measured([1.0; 4], [true; 4]), ["a", "b", "a", "c"]);
        for x in &mut m.perf.as_mut().unwrap().measurements {
            if x.variant == "base-cp0" {
                x.round_sm_mhz[..18].fill(Some(1500.0));
            }
        }
        let a = analyze_run(m, &gates(), GATE, &crate::perf::fixtures::constant_floor);
        assert!(a.decision.failures.is_empty(), "{:?}", a.decision.failures);
        assert!(
            a.decision
                .notices
                .iter()
                .any(|n| n.starts_with("mission: cp0 vs base-cp0: the SM clock sagged")),
            "{:?}",
            a.decision.notices
        );
    }
}
