//! JUnit XML for CI: one test case per (shape, seed, variant) correctness verdict, per
//! variant's resource verdict, and per shape's performance verdict; a case fails exactly when
//! the [`Decision`] holds a failure about it, and every failure of the decision that is about
//! none of those (the inputs of a run, a candidate run as a whole) is a failing case of its
//! own, so the report fails exactly when the outcome does.

use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};

use crate::analysis::{Decision, GateFailure, GateKind, comparison_subject, row_subject};
use crate::schema::CorrectnessRecord;
use crate::schema::ShapeComparison;
use crate::verdict::Verdict;

pub fn render(
    records: &[CorrectnessRecord],
    resources: &[(String, Verdict)],
    comparisons: &[ShapeComparison],
    decision: &Decision,
) -> String {
    let mut report = Report::new("sdpa-runner");
    let mut shown: Vec<&GateFailure> = Vec::new();
    let mut about = |kind: GateKind, subject: &str| -> Vec<String> {
        decision
            .failures
            .iter()
            .filter(|f| f.kind == kind && f.subject == subject)
            .map(|f| {
                shown.push(f);
                f.why.clone()
            })
            .collect()
    };
    if !records.is_empty() {
        let mut suite = TestSuite::new("correctness");
        for r in records {
            let subject = row_subject(r);
            let failures = about(GateKind::Correctness, &subject);
            let mut case = TestCase::new(subject, status(&failures));
            case.set_classname(format!("correctness.{}", r.variant));
            case.set_system_out(format!(
                "max_abs_err={:.3e} mean_abs_err={:.3e} err/bound={:.3} e2e/bound={:.3}",
                r.kernel_ref.max_abs_err,
                r.kernel_ref.mean_abs_err,
                r.kernel_ref.max_err_over_bound,
                r.end_to_end.max_err_over_bound
            ));
            suite.add_test_case(case);
        }
        report.add_test_suite(suite);
    }
    if !resources.is_empty() {
        let mut suite = TestSuite::new("resources");
        // A base kernel's failing resources are a notice, not a failure of the run: a case
        // fails only when the decision holds a failure about it.
        for (variant, _) in resources {
            let failures = about(GateKind::Resources, variant);
            let mut case = TestCase::new(variant.clone(), status(&failures));
            case.set_classname("resources");
            suite.add_test_case(case);
        }
        report.add_test_suite(suite);
    }
    if !comparisons.is_empty() {
        let mut suite = TestSuite::new("performance");
        for c in comparisons {
            let subject = comparison_subject(c);
            let failures = about(GateKind::Performance, &subject);
            let mut case = TestCase::new(subject, status(&failures));
            case.set_classname("performance");
            case.set_system_out(format!(
                "{} speedup {:+.2}% [{:+.2}%, {:+.2}%] p={:.1e}{}",
                c.verdict,
                c.speedup_pct,
                c.speedup_ci_pct[0],
                c.speedup_ci_pct[1],
                c.estimate.p_value,
                if c.false_verdict() {
                    " (both sides ran the same machine code: a false verdict, not gated)"
                } else {
                    ""
                }
            ));
            suite.add_test_case(case);
        }
        report.add_test_suite(suite);
    }
    let rest: Vec<&GateFailure> = decision
        .failures
        .iter()
        .filter(|f| !shown.iter().any(|s| std::ptr::eq(*s, *f)))
        .collect();
    if !rest.is_empty() {
        let mut suite = TestSuite::new("gates");
        for f in rest {
            let mut case = TestCase::new(
                format!("{} gate, {}", f.kind, f.subject),
                status(std::slice::from_ref(&f.why)),
            );
            case.set_classname("gates");
            suite.add_test_case(case);
        }
        report.add_test_suite(suite);
    }
    report.to_string().expect("JUnit serializes")
}

fn status(failures: &[String]) -> TestCaseStatus {
    if failures.is_empty() {
        TestCaseStatus::success()
    } else {
        let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
        s.set_message(failures.join("; "));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::fixtures::perf_file;
    use crate::perf::paired_comparisons;
    use crate::verdict::Check;

    #[test]
    fn failing_gates_become_failing_test_cases() {
        let file = perf_file("H200", &["mission"], &[0], &[("cp0", 1.0), ("cp1", 1.1)]);
        let cmps = paired_comparisons(
            &file,
            &crate::perf::fixtures::gates(),
            &crate::perf::fixtures::constant_floor,
        );
        let mut bad = Verdict::default();
        bad.add("resources.spill_bytes", Check::at_most(8.0, 0.0));
        let resources = [("cp0".into(), Verdict::default()), ("cp1".into(), bad)];
        let decision = Decision {
            failures: vec![
                crate::analysis::GateFailure {
                    kind: GateKind::Resources,
                    subject: "cp1".into(),
                    why: resources[1].1.failures().join("; "),
                },
                crate::analysis::GateFailure {
                    kind: GateKind::Performance,
                    subject: "mission: cp1 vs cp0".into(),
                    why: "mission is SLOWER by 10%".into(),
                },
            ],
            ..Decision::default()
        };
        let xml = render(&[], &resources, &cmps, &decision);
        assert!(
            xml.contains(r#"<testsuite name="resources" tests="2""#),
            "{xml}"
        );
        assert!(xml.contains(r#"failures="1""#));
        assert!(
            xml.contains("resources.spill_bytes 8 &gt; 0")
                || xml.contains("resources.spill_bytes 8 > 0"),
            "{xml}"
        );
        assert!(xml.contains("mission: cp1 vs cp0") && xml.contains("mission is SLOWER by 10%"));
    }

    #[test]
    fn a_failure_about_no_case_is_a_failing_case_of_its_own() {
        let decision = Decision {
            failures: vec![crate::analysis::GateFailure {
                kind: GateKind::Inputs,
                subject: "mission".into(),
                why: "inputs.redrawn: seeds 0 and 1 drew identical inputs".into(),
            }],
            ..Decision::default()
        };
        let xml = render(&[], &[], &[], &decision);
        assert!(
            xml.contains(r#"<testsuite name="gates" tests="1""#) && xml.contains(r#"failures="1""#),
            "{xml}"
        );
        assert!(
            xml.contains("inputs gate, mission") && xml.contains("inputs.redrawn"),
            "{xml}"
        );
        let clean = render(&[], &[], &[], &Decision::default());
        assert!(!clean.contains(r#"name="gates""#), "{clean}");
    }
}
