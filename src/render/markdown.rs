//! COMPARE.md: what was compared, on what, how; per shape the timings side by side with the
//! speedup, its interval, the p-value and the verdict; correctness; and the outcome that
//! [`crate::analysis`] decided. Formatting only.

use std::fmt::Write;

use crate::analysis::{Decision, TargetStatus};
use crate::gates::PerformanceGates;
use crate::schema::{PerfFile, ShapeComparison, VariantMeta};

/// One side of a comparison.
pub struct Side<'a> {
    /// Where it came from: "this run" or a run directory.
    pub run: String,
    pub perf: &'a PerfFile,
    pub variant: &'a VariantMeta,
    /// (passing, total) correctness rows, if known.
    pub correctness: Option<(usize, usize)>,
}

pub struct CompareDoc<'a> {
    /// "paired: ..." or "unpaired: ...".
    pub design: &'a str,
    pub base: Side<'a>,
    pub cand: Side<'a>,
    pub comparisons: &'a [ShapeComparison],
    pub gates: &'a PerformanceGates,
    pub decision: &'a Decision,
    /// Whether the decision's failures set the exit code (`compare --gate`, a run).
    pub gate_enforced: bool,
    pub warnings: &'a [String],
    /// Relative link to the latency picture, if one was written.
    pub svg: Option<&'a str>,
}

pub fn render(doc: &CompareDoc) -> String {
    let mut s = String::new();
    let (b, c) = (&doc.base, &doc.cand);
    let _ = writeln!(
        s,
        "# COMPARE: {} (candidate) vs {} (baseline)\n",
        c.variant.name, b.variant.name
    );
    for w in doc.warnings {
        let _ = writeln!(s, "> **WARNING:** {w}\n");
    }
    header(&mut s, doc);
    variants(&mut s, b.variant, c.variant);
    timings(&mut s, doc);
    let _ = writeln!(s, "\n## Correctness\n");
    for (role, side) in [("baseline", b), ("candidate", c)] {
        let status = match side.correctness {
            Some((p, t)) => format!("{p}/{t} PASS{}", if p == t { "" } else { " — FAILURES" }),
            None => "not recorded with this run".into(),
        };
        let _ = writeln!(s, "- {role} {}: {status}", side.variant.name);
    }
    verdicts(&mut s, doc);
    s
}

fn header(s: &mut String, doc: &CompareDoc) {
    let (b, c) = (doc.base.perf, doc.cand.perf);
    let d = &b.device;
    let same_run = doc.base.run == doc.cand.run;
    let _ = writeln!(s, "| | |\n|---|---|");
    let _ = writeln!(
        s,
        "| device | {}{} |",
        b.device_name,
        d["compute_capability"]
            .as_str()
            .map_or(String::new(), |cc| format!(
                " (compute {cc}, {} SMs)",
                d["sm_count"]
            ))
    );
    if let Some(drv) = d["driver_cuda_version"].as_str() {
        let _ = writeln!(
            s,
            "| driver CUDA / NVRTC | {drv} / {} |",
            d["nvrtc_version"].as_str().unwrap_or("?")
        );
    }
    let git = |f: &PerfFile| {
        format!(
            "{}{}",
            &f.git.sha[..f.git.sha.len().min(12)],
            if f.git.dirty { " (dirty)" } else { "" }
        )
    };
    let _ = if same_run {
        writeln!(s, "| git | {} |", git(b))
    } else {
        writeln!(s, "| git | baseline {}, candidate {} |", git(b), git(c))
    };
    let _ = if same_run {
        writeln!(s, "| date | {} |", b.started_at)
    } else {
        writeln!(
            s,
            "| date | baseline {}, candidate {} |",
            b.started_at, c.started_at
        )
    };
    let p = &c.plan;
    let _ = writeln!(
        s,
        "| timing | {} warm-up, {} samples in {} rounds, {} launch{} per sample, L2 {}; {} |",
        p.warmup,
        p.iters,
        p.rounds,
        p.batch,
        if p.batch == 1 { "" } else { "es" },
        serde_json::to_value(p.l2)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default(),
        c.clock
    );
    let _ = writeln!(
        s,
        "| clocks | before {}; after {} |",
        b.clocks_before.brief(),
        c.clocks_after.brief()
    );
    let _ = writeln!(s, "| design | {} |", doc.design);
    if !same_run {
        let _ = writeln!(
            s,
            "| runs | baseline {}, candidate {} |",
            doc.base.run, doc.cand.run
        );
    }
}

fn variants(s: &mut String, b: &VariantMeta, c: &VariantMeta) {
    let opt = |x: Option<u32>| x.map_or("-".to_string(), |v| v.to_string());
    let _ = writeln!(s, "\n## Variants\n");
    let _ = writeln!(
        s,
        "| | baseline `{}` | candidate `{}` |\n|---|---|---|",
        b.name, c.name
    );
    let _ = writeln!(
        s,
        "| defines | {} | {} |",
        b.defines.join(" "),
        c.defines.join(" ")
    );
    let hash = |v: &VariantMeta| {
        v.ptx_sha256
            .as_deref()
            .map_or("-".to_string(), |h| format!("`{}`", &h[..12.min(h.len())]))
    };
    let _ = writeln!(s, "| PTX sha256 | {} | {} |", hash(b), hash(c));
    type Field = fn(&VariantMeta) -> Option<u32>;
    let rows: [(&str, Field); 4] = [
        ("registers / thread", |v| v.registers),
        ("shared memory, bytes", |v| v.smem_bytes),
        ("spills, bytes", |v| v.spill_bytes),
        ("blocks / SM", |v| v.blocks_per_sm),
    ];
    for (label, field) in rows {
        let _ = writeln!(s, "| {label} | {} | {} |", opt(field(b)), opt(field(c)));
    }
}

fn timings(s: &mut String, doc: &CompareDoc) {
    let conf = doc
        .comparisons
        .first()
        .map_or(95.0, |c| c.estimate.confidence * 100.0);
    let _ = writeln!(s, "\n## Timing, µs per launch\n");
    let _ = writeln!(
        s,
        "| shape | seeds | p50 base | p50 cand | p90 base | p90 cand | mean base | mean cand | speedup | {conf:.0}% CI | p | floor | verdict |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for c in doc.comparisons {
        let (bs, cs) = (&c.baseline_summary, &c.candidate_summary);
        let _ = writeln!(
            s,
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:+.2}% | [{:+.2}%, {:+.2}%] | {:.1e} | ±{:.1}% | **{}** |",
            c.shape,
            c.seeds.len(),
            bs.p50,
            cs.p50,
            bs.p90,
            cs.p90,
            bs.mean,
            cs.mean,
            c.speedup_pct,
            c.speedup_ci_pct[0],
            c.speedup_ci_pct[1],
            c.estimate.p_value,
            c.noise_floor_pct,
            c.verdict
        );
    }
    let _ = writeln!(
        s,
        "\nSpeedup = baseline time / candidate time − 1 (median of {} ratios); a verdict other than SAME \
         needs the whole interval beyond the shape's noise floor and p < {:.2}.",
        if doc.design.starts_with("paired") {
            "per-round"
        } else {
            "round-median"
        },
        1.0 - doc.gates.confidence
    );
    if let Some(svg) = doc.svg {
        let _ = writeln!(s, "\n![latency distributions per shape]({svg})");
    }
}

fn verdicts(s: &mut String, doc: &CompareDoc) {
    let g = doc.gates;
    let _ = writeln!(s, "\n## Verdict\n");
    for (shape, status) in &doc.decision.targets {
        let text = match status {
            TargetStatus::Met => "**MET**".to_string(),
            TargetStatus::NotMet(why) => format!("**NOT MET**: {why}"),
            TargetStatus::NotMeasured => "not measured in this run".to_string(),
        };
        let _ = writeln!(
            s,
            "- target `{shape}` (needs ≥ {:+.1}% and FASTER): {text}",
            g.min_speedup_pct
        );
    }
    let regs = &doc.decision.regressions;
    if regs.is_empty() {
        let _ = writeln!(s, "- regressions beyond {:.1}%: none", g.max_regression_pct);
    } else {
        for r in regs {
            let _ = writeln!(s, "- **REGRESSION**: {r}");
        }
    }
    let failures = &doc.decision.failures;
    let _ = match (doc.gate_enforced, failures.is_empty()) {
        (_, true) => writeln!(s, "- gate: **PASS**"),
        (true, false) => writeln!(s, "- gate: **FAIL**"),
        (false, false) => writeln!(s, "- gate (not enforced: run `compare --gate`): would FAIL"),
    };
    for f in failures {
        let _ = writeln!(s, "  - {f}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::fixtures::perf_file;
    use crate::perf::paired_comparisons;

    #[test]
    fn the_report_has_header_variants_timings_correctness_and_verdicts() {
        let file = perf_file(
            "NVIDIA H200",
            &["small", "mission"],
            &[0, 1],
            &[("cp0", 1.0), ("cp1", 0.85)],
        );
        let cmps = paired_comparisons(&file, 0.95, 1.0);
        let gates = PerformanceGates {
            min_speedup_pct: 10.0,
            max_regression_pct: 3.0,
            confidence: 0.95,
            noise_floor_pct: 1.0,
            unpaired_noise_floor_pct: 1.0,
            unpaired_noise_floor_by_shape: Default::default(),
            target_shapes: vec!["mission".into()],
        };
        let doc = CompareDoc {
            design: "paired: A/B interleaved in one run",
            base: Side {
                run: "this run".into(),
                perf: &file,
                variant: &file.variants[0],
                correctness: Some((4, 4)),
            },
            cand: Side {
                run: "this run".into(),
                perf: &file,
                variant: &file.variants[1],
                correctness: Some((3, 4)),
            },
            comparisons: &cmps,
            gates: &gates,
            decision: &crate::analysis::Decision {
                targets: crate::analysis::targets(&cmps, &gates),
                regressions: crate::analysis::regressions(&cmps, &gates),
                failures: vec![],
            },
            gate_enforced: true,
            warnings: &["compared despite a mismatch".into()],
            svg: Some("latency.svg"),
        };
        let md = render(&doc);
        for needle in [
            "# COMPARE: cp1 (candidate) vs cp0 (baseline)",
            "**WARNING:** compared despite",
            "| device | NVIDIA H200",
            "| mission | 2 |",
            "**FASTER**",
            "95% CI",
            "![latency distributions per shape](latency.svg)",
            "candidate cp1: 3/4 PASS — FAILURES",
            "target `mission` (needs ≥ +10.0% and FASTER): **MET**",
            "regressions beyond 3.0%: none",
            "gate: **PASS**",
        ] {
            assert!(md.contains(needle), "missing `{needle}` in:\n{md}");
        }
    }
}
