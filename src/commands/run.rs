//! `sdpa-runner [run]`: the main job, one way through (docs/DESIGN.md "The spine"):
//! prepare (everything checked before any work) -> measure -> analyze (every gate decided
//! once) -> publish (the run directory, committed atomically; then the outputs outside it)
//! -> print.

use super::{
    Project, as_workers, build_meta, open_workers, plan_workers, worker_count, workers_line,
};
use crate::analysis::{self, RunAnalysis, RunMeasured, RunPolicy};
use crate::backend::{Backend, BackendKind};
use crate::cli::{RunArgs, TimingArgs};
use crate::clocks::{self, ClockReading};
use crate::console::{self, Widths};
use crate::error::{AppError, Outcome};
use crate::progress::ConsoleProgress;
use crate::publish::{self, CompareReport, Extras};
use crate::render::markdown::{CompareDoc, Side};
use crate::report::{self, RunDir};
use crate::runner;
use crate::schema::{PerfFile, SCHEMA_VERSION, VariantMeta};
use crate::shapes::Shape;
use crate::timing::TimingPlan;
use crate::usage::ConfigError;
use crate::{out, outln};

pub fn run(args: &RunArgs) -> Result<Outcome, AppError> {
    let started_at = report::now_rfc3339();
    let mut job = Job::prepare(args)?;
    let run_dir = RunDir::create(&job.results_root)?;
    job.print_header();
    let sanitizers = job.sanitize(args)?;
    let mut measured = crate::trace::work(|| job.measure(args, &started_at))?;
    measured.sanitizers = sanitizers;
    let policy = RunPolicy {
        require_speedup: args.require_speedup,
        gate: args.gate,
    };
    let gates = &job.project.gates.gates;
    let floor_of = job
        .floors
        .paired_chooser(measured.perf.as_ref(), gates.performance.noise_floor_pct);
    let analysis = analysis::analyze_run(measured, gates, policy, &floor_of);
    let report = compare_report(&analysis, &job.project);
    let meta = build_meta(&job.project, &job.backends, started_at);
    let path = publish::commit_run(run_dir, &meta, &analysis, report.as_ref())?;
    let run_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let warnings = job.extras.write(
        || {
            let resources: Vec<_> = analysis.correctness.resources.clone().into_iter().collect();
            crate::render::junit::render(
                &analysis.correctness.results,
                &resources,
                comparisons(&analysis),
                &analysis.decision,
            )
        },
        report
            .as_ref()
            .map(|r| (r.markdown.as_str(), run_name.as_str())),
    );
    print_outcome(&analysis, &job, &warnings, &path);
    crate::trace::mark(|| "published".into());
    Ok(analysis.decision.outcome())
}

/// The first line where the kernel under test's sources differ from the base's (both were
/// read and built already; a failure to read them again only drops the line).
fn first_source_difference(
    project: &Project,
    kernel: &crate::cli::KernelArgs,
    base: &crate::backend::cuda::kernel::KernelLocation,
) -> Option<String> {
    use crate::backend::cuda::kernel::KernelSource;
    let cuda_dir = project.root.cuda_dir();
    let chosen = project.kernel(kernel).ok()?;
    let ours = KernelSource::load(&chosen.path, &cuda_dir, &chosen.spec).ok()?;
    let theirs = KernelSource::locate(base, project.root.path(), &cuda_dir, &chosen.spec).ok()?;
    crate::backend::cuda::code::first_difference(&ours, &theirs)
}

/// A run with everything checked: the project, shapes, timing plan, the backend with its
/// variants, and where every output goes.
struct Job {
    project: Project,
    shapes: Vec<Shape>,
    plan: TimingPlan,
    check: runner::Check,
    /// One per GPU of `--devices`; the first speaks for all in headers and metadata (they
    /// are of one model and built the same code).
    backends: Vec<Box<dyn Backend>>,
    results_root: std::path::PathBuf,
    extras: Extras,
    widths: Widths,
    /// With `--base-kernel`: the first line where the two kernels' sources differ.
    source_difference: Option<String>,
    /// With `--sanitize`: the compute-sanitizer found and checked in preparation.
    sanitizer: Option<crate::sanitize::Sanitizer>,
    /// The measured noise floors (`--floors`): the in-run floor of each shape on this GPU model.
    floors: crate::floors::Floors,
}

impl Job {
    fn prepare(args: &RunArgs) -> Result<Self, AppError> {
        let project = Project::load(&args.setup.project)?;
        let shapes = project.catalog.select(&args.shapes)?;
        let check = args.setup.check().map_err(ConfigError::Usage)?;
        let plan = timing_plan(&args.timing, args.setup.backend);
        plan.validate()?;
        let results_root = args.setup.results_root(project.root.path());
        RunDir::check_root(&results_root)?;
        // Read only when there will be verdicts to judge: a correctness-only run needs none.
        let floors_path = args
            .floors
            .clone()
            .unwrap_or_else(|| project.root.path().join(crate::floors::DEFAULT_FILE));
        let floors = if plan.enabled() {
            crate::floors::Floors::load(floors_path)?
        } else {
            crate::floors::Floors {
                path: floors_path,
                file: None,
            }
        };
        let extras = Extras {
            junit: args.ci.junit.clone(),
            latest_compare: Some(results_root.join("COMPARE.md")),
        };
        extras.check()?;
        if args.gate && (args.base_kernel.is_none() || !plan.enabled()) {
            return Err(ConfigError::Usage(
                "--gate judges the kernel against a base kernel's timings: it needs \
                 --base-kernel FILE|git:REV and timing (--iters above 0); to gate two saved \
                 runs use `sdpa-runner compare BASE CAND --gate`"
                    .into(),
            )
            .into());
        }
        let sanitizer = match (args.sanitize, args.setup.backend) {
            (false, _) => None,
            (true, BackendKind::Cpu) => {
                return Err(ConfigError::Usage(
                    "--sanitize runs compute-sanitizer over the GPU kernel: it needs --backend cuda"
                        .into(),
                )
                .into());
            }
            (true, BackendKind::Cuda) => {
                Some(crate::sanitize::locate().map_err(crate::backend::BackendError::Environment)?)
            }
        };
        project.check_supported(&args.setup.kernel, &shapes)?;
        let gpus = plan_workers(&args.setup.devices, plan.enabled(), args.setup.backend)?;
        crate::rows::check_host_memory(
            &shapes,
            args.setup.check_rows,
            worker_count(&gpus),
            args.seeds.0.len(),
        )?;
        let backends = open_workers(
            gpus,
            args.setup.backend,
            &args.setup.kernel,
            args.base_kernel.as_ref(),
            args.emulation_defect,
            &project,
            &crate::shapes::Entry::of(&shapes),
        )?;
        let source_difference = args
            .base_kernel
            .as_ref()
            .filter(|_| args.setup.backend == BackendKind::Cuda)
            .and_then(|base| first_source_difference(&project, &args.setup.kernel, base));
        let backend = &backends[0];
        if args.require_speedup && (backend.variants().len() < 2 || !plan.enabled()) {
            return Err(ConfigError::Usage(
                "--require-speedup judges the candidate variant against the baseline: it needs two \
                 variants (--cp-async both, or --candidate-define) and timing (--iters above 0)"
                    .into(),
            )
            .into());
        }
        let widths = Widths::of(
            shapes.iter().map(|s| s.name.as_str()),
            backend.variants().iter().map(String::as_str),
        );
        Ok(Job {
            project,
            shapes,
            plan,
            check,
            backends,
            results_root,
            extras,
            widths,
            source_difference,
            sanitizer,
            floors,
        })
    }

    fn backend(&self) -> &dyn Backend {
        self.backends[0].as_ref()
    }

    fn print_header(&self) {
        outln!("{}", self.backend().describe());
        if let Some(line) = workers_line(&self.backends) {
            outln!("{line}");
        }
        let variants = self.backend().variant_meta();
        if variants.iter().any(|v| v.ptx_sha256.is_some()) {
            let resources = self.backend().resource_verdicts(&self.project.gates.gates);
            out!("{}", console::identity_table(&variants, &resources));
            for (name, differences) in crate::render::markdown::code_against_base(&variants) {
                outln!(
                    "{name} vs base-{name}: {}",
                    if differences.is_empty() {
                        "SAME CODE (the same source texts, defines and options): the change does \
                         not touch this variant"
                            .to_string()
                    } else {
                        format!("the code differs: {}", differences.join("; "))
                    }
                );
            }
            if let Some(hunk) = &self.source_difference {
                outln!("first source difference: {hunk}");
            }
        }
    }

    /// The sanitizer stage (`--sanitize`): each tool over each variant of the kernel under
    /// test, in child runs of this binary without timing (src/sanitize.rs). Empty without
    /// the flag.
    fn sanitize(&self, args: &RunArgs) -> Result<Vec<crate::sanitize::SanitizerResult>, AppError> {
        let Some(sanitizer) = &self.sanitizer else {
            return Ok(Vec::new());
        };
        let exe = std::env::current_exe().map_err(|e| {
            ConfigError::Usage(format!(
                "cannot find this program's path for the sanitizer: {e}"
            ))
        })?;
        // Its logs: removed when every tool is clean (or on a signal), kept for the reader
        // otherwise.
        let work = self.results_root.join(format!(
            "sanitize-{}-{}",
            crate::report::now_rfc3339().replace([':', '-'], ""),
            std::process::id()
        ));
        std::fs::create_dir_all(&work).map_err(|source| {
            crate::report::ReportError::Unwritable {
                path: self.results_root.clone(),
                source,
            }
        })?;
        crate::interrupt::register(&work);
        outln!(
            "sanitizer: compute-sanitizer {} ({}), {} on {}",
            sanitizer.version,
            sanitizer.path.display(),
            crate::sanitize::TOOLS.join(", "),
            crate::sanitize::SHAPES
        );
        let chosen = self.project.kernel(&args.setup.kernel)?;
        let kernel = chosen.path.clone();
        let mut results = Vec::new();
        for spec in super::variant_specs(&args.setup.kernel, &chosen.spec)? {
            let mut child_args: Vec<String> = [
                "--shapes",
                crate::sanitize::SHAPES,
                "--seeds",
                "0",
                "--iters",
                "0",
                "--references",
                "host",
                "--emulation",
                "host",
                "--cp-async",
                if spec.candidate { "1" } else { "0" },
            ]
            .map(String::from)
            .to_vec();
            child_args.extend([
                "--root".into(),
                self.project.root.path().display().to_string(),
            ]);
            child_args.extend(["--kernel".into(), kernel.display().to_string()]);
            child_args.extend([
                "--results-dir".into(),
                work.join("runs").display().to_string(),
            ]);
            for d in spec.define_strings().into_iter().skip(1) {
                child_args.extend(["--define".into(), d]);
            }
            for tool in crate::sanitize::TOOLS {
                let r = crate::sanitize::run_tool(
                    sanitizer,
                    tool,
                    &spec.name,
                    &exe,
                    &child_args,
                    &work,
                    std::time::Duration::from_secs(args.sanitize_timeout),
                );
                outln!(
                    "sanitizer {tool:<9} {:<6} {} ({:.1} s){}",
                    spec.name,
                    r.outcome.to_uppercase(),
                    r.seconds,
                    if r.clean() {
                        String::new()
                    } else {
                        format!(": {}", r.summary)
                    }
                );
                results.push(r);
            }
        }
        if results.iter().all(|r| r.clean()) {
            let _ = std::fs::remove_dir_all(&work);
        } else {
            outln!("sanitizer logs: {}", work.display());
        }
        crate::interrupt::unregister(&work);
        Ok(results)
    }

    /// Checks and times every (shape, seed, variant); nothing is decided yet.
    fn measure(&mut self, args: &RunArgs, started_at: &str) -> Result<RunMeasured, AppError> {
        // The first GPU's clocks (the others are of the same model, in the same host).
        let first_gpu = self.backend().gpu();
        let gpu_clocks = || match (&first_gpu, args.setup.backend) {
            (Some(gpu), BackendKind::Cuda) if self.plan.enabled() => clocks::read_gpu(&gpu.uuid),
            _ => ClockReading::unknown("not a timed GPU run"),
        };
        let clocks_before = gpu_clocks();
        let mut progress = ConsoleProgress::new(self.widths, self.backends.len());
        let work = runner::Work {
            shapes: &self.shapes,
            seeds: &args.seeds.0,
            host_defect: args.host_defect,
            check: self.check,
        };
        let out = runner::run_all(
            &mut as_workers(&mut self.backends),
            &work,
            &self.project.gates.gates,
            &self.plan,
            &mut progress,
        )?;
        let clocks_after = gpu_clocks();
        let backend = self.backend();
        let perf = self.plan.enabled().then(|| PerfFile {
            peer: None,
            schema_version: SCHEMA_VERSION,
            backend: backend.name().to_string(),
            clock: backend.clock().to_string(),
            device_name: backend.device_name(),
            device: backend.device_json(),
            git: report::git_info(),
            started_at: started_at.to_string(),
            plan: self.plan.clone(),
            clocks_before,
            clocks_after,
            variants: backend.variant_meta(),
            comparisons: Vec::new(),
            measurements: out.measurements,
            gpus: self.backends.iter().filter_map(|b| b.gpu()).collect(),
        });
        Ok(RunMeasured {
            backend: backend.name().to_string(),
            variants: backend.variant_meta(),
            records: out.records,
            resources: backend.resource_verdicts(&self.project.gates.gates),
            perf,
            sanitizers: Vec::new(),
        })
    }
}

fn comparisons(a: &RunAnalysis) -> &[crate::schema::ShapeComparison] {
    a.perf.as_ref().map_or(&[][..], |p| &p.comparisons[..])
}

/// COMPARE.md and its picture, when the run compared variants: the first comparison's
/// pair is the headline; every other variant is shown beside it.
pub(super) fn compare_report(a: &RunAnalysis, project: &Project) -> Option<CompareReport> {
    let p = a.perf.as_ref().filter(|p| !p.comparisons.is_empty())?;
    let counts = |v: &str| a.correctness.passing(v);
    fn side<'a>(p: &'a PerfFile, v: &'a VariantMeta, counts: (usize, usize)) -> Side<'a> {
        Side {
            run: "this run".into(),
            perf: p,
            variant: v,
            correctness: Some(counts),
        }
    }
    let first = &p.comparisons[0];
    let find = |name: &str| p.variants.iter().find(|v| v.name == name);
    let (base, cand) = (find(&first.baseline)?, find(&first.candidate)?);
    let others = p
        .variants
        .iter()
        .filter(|v| v.name != base.name && v.name != cand.name)
        .map(|v| side(p, v, counts(&v.name)))
        .collect();
    let notes = crate::perf::floor_notes(&p.comparisons);
    let design = match p.gpus.len() {
        0 | 1 => "paired: every variant on the same inputs in one process, interleaved in rounds"
            .to_string(),
        n => format!(
            "paired: every variant on the same inputs in one process, interleaved in rounds; \
             {n} GPUs of one model, each (shape, seed) timed whole on one of them"
        ),
    };
    let doc = CompareDoc {
        design: &design,
        base: side(p, base, counts(&base.name)),
        cand: side(p, cand, counts(&cand.name)),
        others,
        comparisons: &p.comparisons,
        gates: &project.gates.gates.performance,
        decision: &a.decision,
        gate_enforced: true,
        warnings: &[],
        notes: &notes,
        svg: Some("latency.svg"),
    };
    Some(CompareReport {
        markdown: crate::render::markdown::render(&doc),
        svg: publish::latency_svg(&p.comparisons, p, p),
    })
}

fn print_outcome(a: &RunAnalysis, job: &Job, warnings: &[String], path: &std::path::Path) {
    if let Some(p) = &a.perf {
        let plan = &job.plan;
        outln!(
            "timing: {} ({} warm-up, {} samples in {}, batch {}, L2 {:?}), µs",
            p.clock,
            plan.warmup,
            plan.iters,
            p.rounds_text(),
            plan.batch,
            plan.l2
        );
        out!("{}", console::timing_table(&p.measurements, &job.widths));
        if !p.comparisons.is_empty() {
            outln!(
                "A/B verdicts ({} confidence, paired):",
                job.project.gates.gates.performance.confidence
            );
            out!("{}", console::verdict_lines(&p.comparisons, &job.widths));
            for n in crate::perf::floor_notes(&p.comparisons) {
                outln!("{n}");
            }
        }
    }
    outln!("{}", console::summary(&a.correctness.results));
    for f in a
        .decision
        .failures
        .iter()
        .filter(|f| f.kind != crate::analysis::GateKind::Correctness)
    {
        outln!("GATE FAILED: {f}");
    }
    for n in &a.decision.notices {
        outln!("notice: {n}");
    }
    for w in warnings {
        eprintln!("warning: {w}");
    }
    outln!("results: {}", path.display());
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
