//! `sdpa-runner [run]`: the main job. Validates everything it can before any work, opens the
//! backend, checks and times every (shape, seed, variant), writes the run directory (and
//! COMPARE.md when two variants ran), publishes for CI, and prints the run's path last.

use std::collections::BTreeMap;

use super::{Project, build_meta, open_backend, publish};
use crate::backend::{Backend, BackendKind};
use crate::cli::{RunArgs, TimingArgs};
use crate::clocks::{self, ClockReading};
use crate::console::{self, Widths};
use crate::error::{AppError, Outcome};
use crate::perf::compare::{TargetStatus, regressions, targets};
use crate::perf::markdown::{CompareDoc, Side};
use crate::perf::{self, PERF_SCHEMA_VERSION, PerfFile, VariantMeta};
use crate::progress::ConsoleProgress;
use crate::report::{self, CorrectnessFile, RunDir, SCHEMA_VERSION};
use crate::runner;
use crate::shapes;
use crate::timing::TimingPlan;
use crate::verdict::Verdict;

pub fn run(args: &RunArgs) -> Result<Outcome, AppError> {
    let started_at = report::now_rfc3339();
    let project = Project::load(&args.setup.project)?;
    let selected = project.catalog.select(&args.shapes)?;
    shapes::check_host_memory(&selected, shapes::available_host_memory())?;
    let plan = timing_plan(&args.timing, args.setup.backend);
    plan.validate()?;
    let mut backend = open_backend(
        args.setup.backend,
        &args.setup.kernel,
        args.emulation_defect,
        &project,
    )?;
    let results_root = args.setup.results_root(project.root.path());
    let run_dir = RunDir::create(&results_root)?;
    let gates = &project.gates.gates;

    let resources = backend.resource_verdicts(&gates.resources);
    println!("{}", backend.describe());
    let ids = backend.identities();
    if !ids.is_empty() {
        print!(
            "{}",
            console::identity_table(&ids.iter().collect::<Vec<_>>(), &resources)
        );
    }
    let widths = Widths::of(
        selected.iter().map(|s| s.name.as_str()),
        backend.variants().iter().map(String::as_str),
    );
    let gpu_clocks = || match args.setup.backend {
        BackendKind::Cuda if plan.enabled() => clocks::read_gpu(),
        _ => ClockReading::unknown("not a timed GPU run"),
    };
    let clocks_before = gpu_clocks();
    let mut progress = ConsoleProgress::new(widths);
    let out = runner::run_all(
        backend.as_mut(),
        &selected,
        &args.seeds.0,
        gates,
        &plan,
        &mut progress,
    )?;
    let clocks_after = gpu_clocks();

    let correctness = CorrectnessFile {
        schema_version: SCHEMA_VERSION,
        all_pass: out.records.iter().all(|r| r.pass) && resources.iter().all(|(_, v)| v.pass()),
        backend: backend.name().to_string(),
        resources: resources
            .iter()
            .cloned()
            .collect::<BTreeMap<String, Verdict>>(),
        results: out.records,
    };
    run_dir.write_json(
        "build_meta.json",
        &build_meta(&project, backend.as_ref(), started_at.clone()),
    )?;
    run_dir.write_json("correctness.json", &correctness)?;

    let perf = plan.enabled().then(|| PerfFile {
        peer: None,
        schema_version: PERF_SCHEMA_VERSION,
        backend: backend.name().to_string(),
        clock: backend.clock().to_string(),
        device_name: backend.device_name(),
        device: backend.device_json(),
        git: report::git_info(),
        started_at,
        plan: plan.clone(),
        clocks_before,
        clocks_after,
        variants: variant_meta(backend.as_ref(), &ids),
        comparisons: Vec::new(),
        measurements: out.measurements,
    });
    let perf = perf.map(|mut p| {
        p.comparisons = perf::paired_comparisons(
            &p,
            gates.performance.confidence,
            gates.performance.noise_floor_pct,
        );
        p
    });
    let mut compare_md = None;
    if let Some(p) = &perf {
        run_dir.write_json("perf.json", p)?;
        if !p.comparisons.is_empty() {
            let counts = |v: &str| correctness.passing(v);
            let doc = CompareDoc {
                design: "paired: both variants on the same inputs in one process, interleaved in rounds",
                base: Side {
                    run: "this run".into(),
                    perf: p,
                    variant: &p.variants[0],
                    correctness: Some(counts(&p.variants[0].name)),
                },
                cand: Side {
                    run: "this run".into(),
                    perf: p,
                    variant: &p.variants[1],
                    correctness: Some(counts(&p.variants[1].name)),
                },
                comparisons: &p.comparisons,
                gates: &gates.performance,
                warnings: &[],
                svg: Some("latency.svg"),
            };
            let md = crate::perf::markdown::render(&doc);
            run_dir.write_text("latency.svg", &publish::latency_svg(&p.comparisons, p, p))?;
            run_dir.write_text("COMPARE.md", &md)?;
            compare_md = Some(md);
        }
    }
    let path = run_dir.commit()?;
    let run_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if let Some(md) = &compare_md {
        publish::refresh_latest(&results_root, md, &run_name)?;
        publish::append_step_summary(md);
    }

    // Performance outcome: regressions are reported; --require-speedup makes targets a gate.
    let cmps = perf.as_ref().map_or(&[][..], |p| &p.comparisons[..]);
    let mut perf_failures = regressions(cmps, &gates.performance);
    let mut speedup_ok = true;
    for (shape, status) in targets(cmps, &gates.performance) {
        if status != TargetStatus::Met {
            speedup_ok = false;
            if args.require_speedup {
                perf_failures.push((shape.clone(), format!("target {shape}: {status:?}")));
            }
        }
    }
    if let Some(junit) = &args.ci.junit {
        publish::write_junit(
            junit,
            &perf::junit::render(&correctness.results, &resources, cmps, &perf_failures),
        )?;
    }

    if let Some(p) = &perf {
        println!(
            "timing: {} ({} warm-up, {} samples in {} rounds, batch {}, L2 {:?}), µs",
            p.clock, plan.warmup, plan.iters, plan.rounds, plan.batch, plan.l2
        );
        print!("{}", console::timing_table(&p.measurements, &widths));
        if !cmps.is_empty() {
            println!(
                "A/B verdicts ({} confidence, paired):",
                gates.performance.confidence
            );
            print!("{}", console::verdict_lines(cmps, &widths));
        }
    }
    println!("{}", console::summary(&correctness.results));
    if !resources.iter().all(|(_, v)| v.pass()) {
        println!("resource gates FAILED (see the variant table above)");
    }
    if args.require_speedup && !speedup_ok {
        println!(
            "performance gate FAILED: a target shape did not reach the required speedup (see COMPARE.md)"
        );
    }
    println!("results: {}", path.display());
    let pass = correctness.all_pass && (!args.require_speedup || speedup_ok);
    Ok(Outcome::from_pass(pass))
}

/// Warm-up and sample counts default per backend: the emulation is far slower than the GPU.
fn timing_plan(t: &TimingArgs, backend: BackendKind) -> TimingPlan {
    let (warmup, iters) = match backend {
        BackendKind::Cuda => (100, 500),
        BackendKind::Cpu => (1, 20),
    };
    TimingPlan {
        warmup: t.warmup.unwrap_or(warmup),
        iters: t.iters.unwrap_or(iters),
        rounds: t.rounds,
        batch: t.batch,
        l2: t.l2,
    }
}

fn variant_meta(
    backend: &dyn Backend,
    ids: &[crate::backend::cuda::identity::VariantIdentity],
) -> Vec<VariantMeta> {
    backend
        .variants()
        .iter()
        .map(|name| {
            let id = ids.iter().find(|id| &id.name == name);
            VariantMeta {
                name: name.clone(),
                defines: id.map_or_else(Vec::new, |id| id.defines.clone()),
                ptx_sha256: id.map(|id| id.ptx_sha256.clone()),
                registers: id.and_then(|id| id.registers()),
                smem_bytes: id.map(|id| id.smem_bytes()),
                spill_bytes: id.and_then(|id| id.ptxas.spill_bytes()),
                blocks_per_sm: id.and_then(|id| id.driver.as_ref().map(|d| d.max_blocks_per_sm)),
            }
        })
        .collect()
}
