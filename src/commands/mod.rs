//! One module per subcommand; each returns an [`Outcome`] or an [`AppError`], and main turns
//! those into exit codes.

mod bench;
mod build;
mod calibrate;
mod run;
mod shapes;

use std::path::PathBuf;

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
