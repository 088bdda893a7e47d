//! `sdpa-runner stress`: every variant relaunched `--repeats` times per (shape, seed) and mode,
//! each output compared bit for bit with the first; writes stress.json; exit 1 on any
//! divergence or gate failure.

use super::{Project, build_meta, open_backend};
use crate::cli::StressArgs;
use crate::console::Widths;
use crate::emulation::Defect;
use crate::error::{AppError, Outcome};
use crate::problem::Problem;
use crate::repeat;
use crate::report::{self, RunDir};
use crate::rows::RowSet;
use crate::runner::{self, Yardsticks};
use crate::schema::{SCHEMA_VERSION, StressFile};
use crate::usage::ConfigError;

pub fn stress(args: &StressArgs) -> Result<Outcome, AppError> {
    let started_at = report::now_rfc3339();
    let project = Project::load(&args.setup.project)?;
    let selected = project.catalog.select(&args.shapes)?;
    crate::rows::check_host_memory(&selected, args.setup.check_rows)?;
    let check = args.setup.check().map_err(ConfigError::Usage)?;
    let mut backend = open_backend(
        args.setup.backend,
        &args.setup.kernel,
        None,
        Defect::None,
        &project,
    )?;
    let results_root = args.setup.results_root(project.root.path());
    let run_dir = RunDir::create(&results_root)?;
    crate::outln!("{}", backend.describe());
    let widths = Widths::of(
        selected.iter().map(|s| s.name.as_str()),
        backend.variants().iter().map(String::as_str),
    );
    let gates = &project.gates.gates;
    let mut results = Vec::new();
    for shape in &selected {
        for &seed in &args.seeds.0 {
            let p = Problem::new(shape, seed);
            let rows = RowSet::choose(
                check.rows,
                shape,
                seed,
                &runner::query_tiles(backend.as_ref()),
            );
            let split = backend.kv_split();
            let y = Yardsticks::with_backend(backend.as_mut(), check.references, &p, split, rows)?;
            backend.load(&p)?;
            for v in 0..backend.variants().len() {
                for &mode in &args.modes {
                    let r = repeat::stress_variant(
                        backend.as_mut(),
                        v,
                        &p,
                        &y,
                        gates,
                        args.repeats as usize,
                        mode,
                    )?;
                    crate::outln!("{}", repeat::line(&r, &widths));
                    for failure in r.failed_gates.iter().take(3) {
                        crate::outln!("    {failure}");
                    }
                    results.push(r);
                }
            }
        }
    }
    let file = StressFile {
        schema_version: SCHEMA_VERSION,
        backend: backend.name().to_string(),
        all_pass: results.iter().all(|r| r.pass),
        results,
    };
    run_dir.write_json(
        "build_meta.json",
        &build_meta(&project, backend.as_ref(), started_at),
    )?;
    run_dir.write_json("stress.json", &file)?;
    let path = run_dir.commit()?;
    let passed = file.results.iter().filter(|r| r.pass).count();
    crate::outln!("{passed}/{} PASS", file.results.len());
    crate::outln!("results: {}", path.display());
    Ok(Outcome::from_pass(file.all_pass))
}
