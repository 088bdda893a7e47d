//! `sdpa-runner compare BASE CAND [--gate]`: the verdicts of CAND against BASE from two saved
//! runs, as COMPARE.md; with `--gate`, exit 1 when CAND failed correctness or regressed.
//! Everything is checked before anything is written.

use super::{Project, publish};
use crate::cli::CompareArgs;
use crate::console::{self, Widths};
use crate::error::{AppError, Outcome};
use crate::perf::compare::{
    SavedRun, check_comparable, pick_variants, regressions, unpaired_comparisons,
};
use crate::perf::markdown::{CompareDoc, Side};
use crate::report::write_atomic;

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
    let cmps = unpaired_comparisons(&base.perf, &cand.perf, (&bv, &cv), gates);

    let out = args
        .out
        .clone()
        .unwrap_or_else(|| project.root.path().join("results/COMPARE.md"));
    let stem = out
        .file_stem()
        .map_or("COMPARE".into(), |s| s.to_string_lossy().into_owned());
    let svg_name = format!("{stem}-latency.svg");
    let meta = |run: &SavedRun, v: &str| {
        run.perf
            .variants
            .iter()
            .find(|m| m.name == v)
            .cloned()
            .expect("picked variant exists")
    };
    let (bmeta, cmeta) = (meta(&base, &bv), meta(&cand, &cv));
    let doc = CompareDoc {
        design: "unpaired: two saved runs, per-round medians of each",
        base: Side {
            run: args.base.display().to_string(),
            perf: &base.perf,
            variant: &bmeta,
            correctness: base.correctness_of(&bv),
        },
        cand: Side {
            run: args.cand.display().to_string(),
            perf: &cand.perf,
            variant: &cmeta,
            correctness: cand.correctness_of(&cv),
        },
        comparisons: &cmps,
        gates,
        warnings: &warnings,
        svg: Some(&svg_name),
    };
    let markdown = crate::perf::markdown::render(&doc);
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| crate::report::ReportError::Unwritable {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    write_atomic(
        &out.with_file_name(&svg_name),
        publish::latency_svg(&cmps, &base.perf, &cand.perf).as_bytes(),
    )?;
    write_atomic(&out, markdown.as_bytes())?;
    publish::append_step_summary(&markdown);

    // The gate: candidate correctness, then regressions beyond the allowed slowdown.
    let mut failures = regressions(&cmps, gates);
    match cand.correctness_of(&cv) {
        Some((pass, total)) if pass == total && total > 0 => {}
        Some((pass, total)) => failures.push((
            "correctness".into(),
            format!("candidate {cv}: {pass}/{total} correctness rows PASS"),
        )),
        None => failures.push((
            "correctness".into(),
            format!(
                "candidate run {} has no correctness.json",
                args.cand.display()
            ),
        )),
    }
    if let Some(junit) = &args.ci.junit {
        let records = cand
            .correctness
            .as_ref()
            .map_or(&[][..], |c| &c.results[..]);
        publish::write_junit(
            junit,
            &crate::perf::junit::render(records, &[], &cmps, &failures),
        )?;
    }

    let widths = Widths::of(
        cmps.iter().map(|c| c.shape.as_str()),
        [bv.as_str(), cv.as_str()].into_iter(),
    );
    for w in &warnings {
        println!("WARNING: {w}");
    }
    println!(
        "{} ({}) vs {} ({}), unpaired:",
        cv,
        args.cand.display(),
        bv,
        args.base.display()
    );
    print!("{}", console::verdict_lines(&cmps, &widths));
    println!("report: {}", out.display());
    if args.gate && !failures.is_empty() {
        for (_, why) in &failures {
            println!("GATE FAILED: {why}");
        }
        return Ok(Outcome::GateFailed);
    }
    Ok(Outcome::Pass)
}
