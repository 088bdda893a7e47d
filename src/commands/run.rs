//! `sdpa-runner [run]`: the main job. Validates everything it can before any work, opens
//! the backend, checks every (shape, seed, variant), writes the run directory, and prints
//! its path last.

use std::collections::BTreeMap;

use super::Project;
use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::CudaBackend;
use crate::backend::cuda::kernel::KernelSource;
use crate::backend::cuda::variant::{self, VariantSpec};
use crate::backend::{Backend, BackendKind};
use crate::cli::RunArgs;
use crate::console;
use crate::error::{AppError, Outcome};
use crate::report::{self, BuildMeta, CorrectnessFile, RunDir, SCHEMA_VERSION};
use crate::runner;
use crate::shapes;
use crate::verdict::Verdict;

pub fn run(args: &RunArgs) -> Result<Outcome, AppError> {
    let started_at = report::now_rfc3339();
    let project = Project::load(&args.project)?;
    let selected = project.catalog.select(&args.shapes)?;
    shapes::check_host_memory(&selected, shapes::available_host_memory())?;
    let mut backend = open_backend(args, &project)?;
    let results_root = args
        .results_dir
        .clone()
        .unwrap_or_else(|| project.root.path().join("results"));
    let run_dir = RunDir::create(&results_root)?;

    let resources = backend.resource_verdicts(&project.gates.gates.resources);
    print_header(backend.as_ref(), &resources);
    let width = selected.iter().map(|s| s.name.len()).max().unwrap_or(0);
    let records = runner::check_all(
        backend.as_mut(),
        &selected,
        &args.seeds.0,
        &project.gates.gates,
        |r| println!("{}", console::correctness_row(r, width)),
    )?;

    let correctness_pass = records.iter().all(|r| r.pass);
    let resources_pass = resources.iter().all(|(_, v)| v.pass());
    let meta = BuildMeta {
        schema_version: SCHEMA_VERSION,
        tool: report::tool_info(),
        git: report::git_info(),
        backend: backend.name().to_string(),
        host: report::host_info(),
        command_line: std::env::args().collect(),
        started_at,
        project_root: project.root.path().display().to_string(),
        shapes_file: report::file_ref(project.catalog.path()),
        gates_file: report::file_ref(&project.gates.path),
        backend_details: backend.details(),
    };
    let file = CorrectnessFile {
        schema_version: SCHEMA_VERSION,
        all_pass: correctness_pass && resources_pass,
        backend: backend.name().to_string(),
        resources: resources.into_iter().collect::<BTreeMap<String, Verdict>>(),
        results: records,
    };
    run_dir.write_json("build_meta.json", &meta)?;
    run_dir.write_json("correctness.json", &file)?;
    let path = run_dir.commit()?;

    println!("{}", console::summary(&file.results));
    if !resources_pass {
        println!("resource gates FAILED (see the variant table above)");
    }
    println!("results: {}", path.display());
    Ok(Outcome::from_pass(file.all_pass))
}

fn open_backend(args: &RunArgs, project: &Project) -> Result<Box<dyn Backend>, AppError> {
    Ok(match args.backend {
        BackendKind::Cpu => Box::new(CpuBackend::new(args.emulation_defect)),
        BackendKind::Cuda => {
            let env = std::env::var("USE_CP_ASYNC").ok();
            let specs: Vec<VariantSpec> = variant::select(args.kernel.cp_async, env.as_deref())?
                .into_iter()
                .map(|on| VariantSpec::new(on, &args.kernel.defines))
                .collect();
            let source =
                KernelSource::load(&project.kernel_path(&args.kernel), &project.root.cuda_dir())?;
            Box::new(CudaBackend::new(source, &specs)?)
        }
    })
}

fn print_header(backend: &dyn Backend, resources: &[(String, Verdict)]) {
    println!("{}", backend.describe());
    let ids = backend.identities();
    if !ids.is_empty() {
        print!(
            "{}",
            console::identity_table(&ids.iter().collect::<Vec<_>>(), resources)
        );
    }
}
