//! `sdpa-runner compare BASE CAND [--gate]`: the verdicts of CAND against BASE from two saved
//! runs, as COMPARE.md; with `--gate`, exit 1 when CAND failed any correctness or resource
//! gate, or regressed. The same spine as a run: load and check everything (nothing is
//! written on a refusal) -> analyze -> publish -> print.

use std::path::PathBuf;

use super::Project;
use crate::analysis::{self, Decision};
use crate::cli::CompareArgs;
use crate::console::{self, Widths};
use crate::error::{AppError, Outcome};
use crate::gates::PerformanceGates;
use crate::outln;
use crate::perf::compare::{SavedRun, check_comparable, pick_variants};
use crate::publish::{self, CompareReport, Extras};
use crate::render::markdown::{CompareDoc, Side};
use crate::report::write_atomic;
use crate::schema::{CorrectnessRecord, ShapeComparison};

pub fn compare(args: &CompareArgs) -> Result<Outcome, AppError> {
    let project = Project::load(&args.project)?;
    let gates = &project.gates.gates.performance;
    let base = SavedRun::load(&args.base)?;
    let cand = SavedRun::load(&args.cand)?;
    let (bv, cv) = pick_variants(
        &base.perf,
        &cand.perf,
        args.base_variant.as_deref(),
        args.cand_variant.as_deref(),
    )?;
    let warnings = check_comparable(&base.perf, &cand.perf, (&bv, &cv), args.allow_mismatch)?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| project.root.path().join("results/COMPARE.md"));
    let svg_path = svg_beside(&out);
    let extras = Extras {
        junit: args.ci.junit.clone(),
        latest_compare: None,
    };
    for path in [&out, &svg_path] {
        publish::check_writable(path)?;
    }
    extras.check()?;

    let floors_path = args
        .floors
        .clone()
        .unwrap_or_else(|| project.root.path().join(crate::floors::DEFAULT_FILE));
    let floors = crate::floors::FloorFile::load(&floors_path)?;
    let gpu = cand.perf.device_name.clone();
    let kernel = cand
        .perf
        .variants
        .iter()
        .find(|v| v.name == cv)
        .and_then(|v| v.kernel.as_ref())
        .map(|k| k.sha256.clone());
    let choose = |shape: &str| {
        crate::floors::FloorFile::choose(
            floors.as_ref(),
            &floors_path,
            (&gpu, kernel.as_deref()),
            shape,
            gates.unpaired_floor(shape),
        )
    };
    let notes: Vec<String> = base
        .perf
        .shapes()
        .iter()
        .map(|shape| {
            let c = choose(shape);
            format!("noise floor of {shape}: ±{:.2}% ({})", c.pct, c.source)
        })
        .collect();
    let cmps = crate::perf::compare::unpaired_comparisons_with(
        &base.perf,
        &cand.perf,
        (&bv, &cv),
        gates,
        &|shape| choose(shape).pct,
    );
    let decision = analysis::analyze_compare(&cand, &cv, &cmps, gates);

    let report = render(
        args,
        (&base, &cand),
        (&bv, &cv),
        (&cmps, &decision, gates),
        (&warnings, &notes),
        &svg_path,
    );
    write_atomic(&svg_path, report.svg.as_bytes())?;
    if let Err(e) = write_atomic(&out, report.markdown.as_bytes()) {
        let _ = std::fs::remove_file(&svg_path);
        return Err(e.into());
    }
    let records: &[CorrectnessRecord] = cand.correctness.as_ref().map_or(&[], |c| &c.results);
    let resources: Vec<(String, crate::verdict::Verdict)> = cand
        .correctness
        .as_ref()
        .map(|c| c.resources.clone().into_iter().collect())
        .unwrap_or_default();
    // Without --gate nothing fails, and the JUnit report says the same.
    let enforced = if args.gate {
        decision.clone()
    } else {
        analysis::Decision::default()
    };
    let extra_warnings = extras.write(
        || crate::render::junit::render(records, &resources, &cmps, &enforced),
        Some((report.markdown.as_str(), "")),
    );

    let widths = Widths::of(
        cmps.iter().map(|c| c.shape.as_str()),
        [bv.as_str(), cv.as_str()].into_iter(),
    );
    for w in &warnings {
        outln!("WARNING: {w}");
    }
    outln!(
        "{} ({}) vs {} ({}), unpaired:",
        cv,
        args.cand.display(),
        bv,
        args.base.display()
    );
    for n in &notes {
        outln!("{n}");
    }
    crate::out!("{}", console::verdict_lines(&cmps, &widths));
    for w in &extra_warnings {
        eprintln!("warning: {w}");
    }
    outln!("report: {}", out.display());
    if !args.gate {
        return Ok(Outcome::Pass);
    }
    for f in &decision.failures {
        outln!("GATE FAILED: {f}");
    }
    Ok(decision.outcome())
}

/// `<out stem>-latency.svg` beside COMPARE.md.
fn svg_beside(out: &std::path::Path) -> PathBuf {
    let stem = out
        .file_stem()
        .map_or("COMPARE".into(), |s| s.to_string_lossy().into_owned());
    out.with_file_name(format!("{stem}-latency.svg"))
}

fn render(
    args: &CompareArgs,
    (base, cand): (&SavedRun, &SavedRun),
    (bv, cv): (&str, &str),
    (cmps, decision, gates): (&[ShapeComparison], &Decision, &PerformanceGates),
    (warnings, notes): (&[String], &[String]),
    svg_path: &std::path::Path,
) -> CompareReport {
    let meta = |run: &SavedRun, v: &str| {
        run.perf
            .variants
            .iter()
            .find(|m| m.name == v)
            .cloned()
            .expect("picked variant exists")
    };
    let (bmeta, cmeta) = (meta(base, bv), meta(cand, cv));
    let svg_name = svg_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let doc = CompareDoc {
        others: Vec::new(),
        design: "unpaired: two saved runs, per-round medians of each",
        base: Side {
            run: args.base.display().to_string(),
            perf: &base.perf,
            variant: &bmeta,
            correctness: base.correctness_of(bv),
        },
        cand: Side {
            run: args.cand.display().to_string(),
            perf: &cand.perf,
            variant: &cmeta,
            correctness: cand.correctness_of(cv),
        },
        comparisons: cmps,
        gates,
        decision,
        gate_enforced: args.gate,
        warnings,
        notes,
        svg: Some(&svg_name),
    };
    CompareReport {
        markdown: crate::render::markdown::render(&doc),
        svg: publish::latency_svg(cmps, &base.perf, &cand.perf),
    }
}
