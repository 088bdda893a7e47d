//! `sdpa-runner stress`: every variant relaunched `--repeats` times per (shape, seed) and mode,
//! each output compared bit for bit with the first; writes stress.json; exit 1 on any
//! divergence or gate failure.

use super::{
    Project, as_workers, build_meta, open_workers, plan_workers, worker_count, workers_line,
};
use crate::backend::{Backend, BackendError};
use crate::cli::StressArgs;
use crate::console::Widths;
use crate::emulation::Defect;
use crate::error::{AppError, Outcome};
use crate::gates::Gates;
use crate::problem::{HostDefect, Problem};
use crate::repeat;
use crate::report::{self, RunDir};
use crate::rows::RowSet;
use crate::runner::{self, YardsticksByAlgorithm};
use crate::schema::{SCHEMA_VERSION, StressFile, StressRecord};
use crate::shapes::Shape;
use crate::usage::ConfigError;

pub fn stress(args: &StressArgs) -> Result<Outcome, AppError> {
    let started_at = report::now_rfc3339();
    let project = Project::load(&args.setup.project)?;
    let selected = project.catalog.select(&args.shapes)?;
    let check = args.setup.check().map_err(ConfigError::Usage)?;
    project.check_supported(&args.setup.kernel, &selected)?;
    let gpus = plan_workers(&args.setup.devices, false, args.setup.backend)?;
    crate::rows::check_host_memory(
        &selected,
        args.setup.check_rows,
        worker_count(&gpus),
        args.seeds.0.len(),
    )?;
    let mut backends = open_workers(
        gpus,
        args.setup.backend,
        &args.setup.kernel,
        None,
        Defect::None,
        &project,
        &crate::shapes::Entry::of(&selected),
    )?;
    let results_root = args.setup.results_root(project.root.path());
    let run_dir = RunDir::create(&results_root)?;
    crate::outln!("{}", backends[0].describe());
    if let Some(line) = workers_line(&backends) {
        crate::outln!("{line}");
    }
    let widths = Widths::of(
        selected.iter().map(|s| s.name.as_str()),
        backends[0].variants().iter().map(String::as_str),
    );
    let work = runner::Work {
        shapes: &selected,
        seeds: &args.seeds.0,
        host_defect: HostDefect::None,
        check,
    };
    let gates = &project.gates.gates;
    let name_gpu = backends.len() > 1;
    let per_problem = crate::trace::work(|| {
        runner::shared(
            &mut as_workers(&mut backends),
            &work.problems(),
            |(shape, _)| runner::predicted_cost(shape),
            |backend, &(shape, seed), emit| {
                stress_problem(backend, shape, seed, args, check, gates, emit)
            },
            |_, r: StressRecord| {
                let gpu = crate::console::on_gpu(r.gpu.as_ref(), name_gpu);
                crate::outln!("{}{gpu}", repeat::line(&r, &widths));
                for failure in r.failed_gates.iter().take(3) {
                    crate::outln!("    {failure}");
                }
            },
        )
    })?;
    let results: Vec<StressRecord> = per_problem.into_iter().flatten().collect();
    let file = StressFile {
        schema_version: SCHEMA_VERSION,
        backend: backends[0].name().to_string(),
        all_pass: results.iter().all(|r| r.pass),
        results,
    };
    run_dir.write_json(
        "build_meta.json",
        &build_meta(&project, &backends, started_at),
    )?;
    run_dir.write_json("stress.json", &file)?;
    let path = run_dir.commit()?;
    let passed = file.results.iter().filter(|r| r.pass).count();
    crate::outln!("{passed}/{} PASS", file.results.len());
    crate::outln!("results: {}", path.display());
    Ok(Outcome::from_pass(file.all_pass))
}

/// Every variant and mode of one (shape, seed) on one backend; each result is also sent to
/// `emit` as it is made.
fn stress_problem(
    backend: &mut dyn Backend,
    shape: &Shape,
    seed: u64,
    args: &StressArgs,
    check: runner::Check,
    gates: &Gates,
    emit: &dyn Fn(StressRecord),
) -> Result<Vec<StressRecord>, BackendError> {
    let p = Problem::new(shape, seed);
    let rows = RowSet::choose(check.rows, shape, seed, &runner::query_tiles(backend));
    // The yardsticks before the load (the host's work first, as before); each variant's own.
    let mut yardsticks = YardsticksByAlgorithm::default();
    for v in 0..backend.variants().len() {
        let alg = backend.algorithm_of(v, shape);
        yardsticks.get(backend, &check, &p, alg, &rows)?;
    }
    backend.load(&p)?;
    let mut results = Vec::new();
    for v in 0..backend.variants().len() {
        let alg = backend.algorithm_of(v, shape);
        let (y, _) = yardsticks.get(backend, &check, &p, alg, &rows)?;
        for &mode in &args.modes {
            let r = repeat::stress_variant(backend, v, &p, y, gates, args.repeats as usize, mode)?;
            emit(r.clone());
            results.push(r);
        }
    }
    Ok(results)
}
