//! One module per subcommand; each returns an [`Outcome`] or an [`AppError`], and main turns
//! those into exit codes.

mod bench;
mod build;
mod calibrate;
mod compare;
mod publish;
mod run;
mod shapes;

use std::path::PathBuf;

use crate::backend::cuda::variant::{self, VariantSpec};
use crate::cli::{Cli, Command, KernelArgs, ProjectArgs};
use crate::config::ConfigError;
use crate::error::{AppError, Outcome};
use crate::gates::GateFile;
use crate::paths::ProjectRoot;
use crate::shapes::ShapeCatalog;

pub fn dispatch(cli: Cli) -> Result<Outcome, AppError> {
    match cli.command {
        None => run::run(&cli.run),
        Some(Command::Run(args)) => run::run(&args),
        Some(Command::Shapes(args)) => shapes::list(&args),
        Some(Command::Build(args)) => build::build(&args),
        Some(Command::Bench(args)) => bench::bench(&args),
        Some(Command::Calibrate(args)) => calibrate::calibrate(&args),
        Some(Command::Compare(args)) => compare::compare(&args),
    }
}

/// The project's root, shapes and gates, loaded and validated.
pub struct Project {
    pub root: ProjectRoot,
    pub catalog: ShapeCatalog,
    pub gates: GateFile,
}

impl Project {
    pub fn load(args: &ProjectArgs) -> Result<Self, ConfigError> {
        let root = ProjectRoot::locate(args.root.as_deref())?;
        let catalog = ShapeCatalog::load(
            &args
                .shapes_file
                .clone()
                .unwrap_or_else(|| root.default_shapes()),
        )?;
        let gates = GateFile::load(&args.gates.clone().unwrap_or_else(|| root.default_gates()))?;
        Ok(Project {
            root,
            catalog,
            gates,
        })
    }

    pub fn kernel_path(&self, args: &KernelArgs) -> PathBuf {
        args.kernel.clone().unwrap_or_else(|| {
            self.root
                .cuda_dir()
                .join(crate::backend::cuda::kernel::KERNEL_FILE)
        })
    }
}

/// The variants a run builds: from `--cp-async` and `USE_CP_ASYNC`, each with the `--define`s;
/// with `--candidate-define`, the one selected variant without and with those defines.
pub fn variant_specs(args: &KernelArgs) -> Result<Vec<VariantSpec>, ConfigError> {
    let env = std::env::var("USE_CP_ASYNC").ok();
    let specs: Vec<VariantSpec> = variant::select(args.cp_async, env.as_deref())?
        .into_iter()
        .map(|on| VariantSpec::new(on, &args.defines))
        .collect();
    if args.candidate_defines.is_empty() {
        return Ok(specs);
    }
    match specs.as_slice() {
        [base] => Ok(vec![base.clone(), base.with_candidate_defines(&args.candidate_defines)]),
        _ => Err(ConfigError::Usage(
            "--candidate-define compares one variant without and with the define: choose the variant \
             with --cp-async 0 or 1"
                .into(),
        )),
    }
}
