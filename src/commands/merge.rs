//! `sdpa-runner merge RUN... [--results-dir DIR]`: shards of a CI job matrix made one run
//! (src/merge.rs checks and merges them), decided once per GPU model and published like a run:
//! one correctness.json, a perf file and a COMPARE.md section per GPU model, one verdict.

use super::Project;
use super::baseline::model_dir;
use super::run::compare_report;
use crate::analysis::{self, Decision, GateFailure, RunAnalysis, RunPolicy};
use crate::cli::MergeArgs;
use crate::console;
use crate::error::{AppError, Outcome};
use crate::merge::Shard;
use crate::outln;
use crate::report::{self, RunDir};
use crate::schema::{BuildMeta, CorrectnessFile, SCHEMA_VERSION};

pub fn merge(args: &MergeArgs) -> Result<Outcome, AppError> {
    let project = Project::load(&args.project)?;
    let shards = args
        .runs
        .iter()
        .map(|p| Shard::load(p))
        .collect::<Result<Vec<_>, _>>()?;
    let parts = crate::merge::merge(&shards)?;
    let backend = shards[0].meta.backend.clone();
    let results_root = args
        .results_dir
        .clone()
        .unwrap_or_else(|| project.root.path().join("results"));
    RunDir::check_root(&results_root)?;
    let started_at = report::now_rfc3339();

    let gates = &project.gates.gates;
    let floors = crate::floors::Floors::load(
        args.floors
            .clone()
            .unwrap_or_else(|| project.root.path().join(crate::floors::DEFAULT_FILE)),
    )?;
    let analyses: Vec<(String, RunAnalysis)> = parts
        .into_iter()
        .map(|(device, measured)| {
            let floor_of =
                floors.paired_chooser(measured.perf.as_ref(), gates.performance.noise_floor_pct);
            let analysis = analysis::analyze_run(measured, gates, RunPolicy::default(), &floor_of);
            (device, analysis)
        })
        .collect();
    let multi = analyses.len() > 1;
    let (correctness, decision) = combine(&backend, &analyses);

    let run_dir = RunDir::create(&results_root)?;
    run_dir.write_json(
        "build_meta.json",
        &meta(&project, &backend, &shards, started_at),
    )?;
    run_dir.write_json("correctness.json", &correctness)?;
    let mut markdown = String::new();
    for (device, a) in &analyses {
        let suffix = if multi {
            format!("-{}", model_dir(device))
        } else {
            String::new()
        };
        if let Some(perf) = &a.perf {
            run_dir.write_json(&format!("perf{suffix}.json"), perf)?;
        }
        if let Some(r) = compare_report(a, &project) {
            let svg = format!("latency{suffix}.svg");
            run_dir.write_text(&svg, &r.svg)?;
            let md = r.markdown.replace("](latency.svg)", &format!("]({svg})"));
            if multi {
                markdown.push_str(&format!("# {device}\n\n"));
                for line in md.lines() {
                    let demoted = if line.starts_with('#') {
                        format!("#{line}")
                    } else {
                        line.to_string()
                    };
                    markdown.push_str(&demoted);
                    markdown.push('\n');
                }
                markdown.push('\n');
            } else {
                markdown = md;
            }
        }
    }
    if !markdown.is_empty() {
        run_dir.write_text("COMPARE.md", &markdown)?;
    }
    let path = run_dir.commit()?;

    outln!(
        "merged {} runs ({} rows) of {}: {}",
        shards.len(),
        correctness.results.len(),
        analyses
            .iter()
            .map(|(d, _)| d.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        shards
            .iter()
            .map(|s| s.path.display().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    );
    for (device, a) in &analyses {
        if let Some(p) = a.perf.as_ref().filter(|p| !p.comparisons.is_empty()) {
            let widths = console::Widths::of(
                p.comparisons.iter().map(|c| c.shape.as_str()),
                p.variants.iter().map(|v| v.name.as_str()),
            );
            outln!("{device}, paired verdicts:");
            crate::out!("{}", console::verdict_lines(&p.comparisons, &widths));
            for n in crate::perf::floor_notes(&p.comparisons) {
                outln!("{n}");
            }
        }
    }
    outln!("{}", console::summary(&correctness.results));
    for f in decision
        .failures
        .iter()
        .filter(|f| f.kind != analysis::GateKind::Correctness)
    {
        outln!("GATE FAILED: {f}");
    }
    for n in &decision.notices {
        outln!("notice: {n}");
    }
    outln!("results: {}", path.display());
    Ok(decision.outcome())
}

/// One correctness file and one decision over every GPU model's analysis; with several
/// models, resources and failures name the model they are about.
fn combine(backend: &str, analyses: &[(String, RunAnalysis)]) -> (CorrectnessFile, Decision) {
    let multi = analyses.len() > 1;
    let name = |device: &str, what: &str| {
        if multi {
            format!("{device}: {what}")
        } else {
            what.to_string()
        }
    };
    let mut file = CorrectnessFile {
        schema_version: SCHEMA_VERSION,
        all_pass: analyses.iter().all(|(_, a)| a.correctness.all_pass),
        backend: backend.to_string(),
        resources: Default::default(),
        results: Vec::new(),
        sanitizers: Vec::new(),
    };
    let mut decision = Decision::default();
    for (device, a) in analyses {
        file.results.extend(a.correctness.results.iter().cloned());
        file.sanitizers
            .extend(a.correctness.sanitizers.iter().cloned());
        for (variant, v) in &a.correctness.resources {
            file.resources.insert(name(device, variant), v.clone());
        }
        let d = &a.decision;
        decision
            .failures
            .extend(d.failures.iter().map(|f| GateFailure {
                subject: name(device, &f.subject),
                ..f.clone()
            }));
        decision.regressions.extend(d.regressions.iter().cloned());
        decision.targets.extend(
            d.targets
                .iter()
                .map(|(shape, status)| (name(device, shape), status.clone())),
        );
        decision
            .notices
            .extend(d.notices.iter().map(|n| name(device, n)));
    }
    (file, decision)
}

/// build_meta.json of a merged run: this process, and every shard's provenance.
fn meta(project: &Project, backend: &str, shards: &[Shard], started_at: String) -> BuildMeta {
    let merged_from: Vec<serde_json::Value> = shards
        .iter()
        .map(|s| {
            serde_json::json!({
                "run": s.path.display().to_string(),
                "device": s.device(),
                "started_at": s.meta.started_at,
                "git": s.meta.git,
                "host": s.meta.host,
                "command_line": s.meta.command_line,
                "backend_details": s.meta.backend_details,
            })
        })
        .collect();
    super::provenance(
        project,
        backend,
        serde_json::json!({ "merged_from": merged_from }),
        started_at,
    )
}
