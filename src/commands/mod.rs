//! One module per subcommand; each returns an [`Outcome`] or an [`AppError`], and main turns
//! those into exit codes.

mod baseline;
mod bench;
mod build;
mod calibrate;
mod check;
mod compare;
mod export;
mod fuzz;
mod kernels;
mod merge;
mod noise;
mod run;
mod selftest;
mod sensitivity;
mod shapes;
pub(crate) mod stress;

use std::path::PathBuf;

use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::CudaBackend;
use crate::backend::cuda::kernel::{KernelLocation, KernelSource};
use crate::backend::cuda::variant::{self, VariantSpec};
use crate::backend::{Backend, BackendError, BackendKind};
use crate::cli::{Cli, Command, KernelArgs, ProjectArgs};
use crate::devices::{DeviceChoice, GpuId};
use crate::emulation::Defect;
use crate::error::{AppError, Outcome};
use crate::gates::GateFile;
use crate::kernels::{Chosen, KernelSpec, Manifest};
use crate::paths::ProjectRoot;
use crate::report;
use crate::schema::{BuildMeta, SCHEMA_VERSION};
use crate::shapes::{Shape, ShapeCatalog};
use crate::usage::ConfigError;

/// Appended to the cuda backend's environment errors by the commands that take `--backend`.
pub(crate) const CPU_BACKEND_ADVICE: &str = "The default backend is cuda; `--backend cpu` runs \
    the same pipeline on the CPU emulation of the kernel, with no GPU.";

pub fn dispatch(cli: Cli) -> Result<Outcome, AppError> {
    match cli.command {
        None => run::run(&cli.run),
        Some(Command::Run(args)) => run::run(&args),
        Some(Command::Shapes(args)) => shapes::list(&args),
        Some(Command::Build(args)) => build::build(&args),
        Some(Command::Bench(args)) => bench::bench(&args),
        Some(Command::Calibrate(args)) => calibrate::calibrate(&args),
        Some(Command::Compare(args)) => compare::compare(&args),
        Some(Command::Baseline(args)) => baseline::baseline(&args),
        Some(Command::Merge(args)) => merge::merge(&args),
        Some(Command::Stress(args)) => stress::stress(&args),
        Some(Command::Fuzz(args)) => fuzz::fuzz(&args),
        Some(Command::Sensitivity(args)) => sensitivity::sensitivity(&args),
        Some(Command::Selftest(args)) => selftest::selftest(&args),
        Some(Command::Export(args)) => export::export(&args),
        Some(Command::Check(args)) => check::check(&args),
        Some(Command::Noise(args)) => noise::noise(&args),
        Some(Command::Kernels(args)) => kernels::list(&args),
    }
}

/// The project's root, shapes and gates, loaded and validated.
pub struct Project {
    pub root: ProjectRoot,
    pub catalog: ShapeCatalog,
    pub gates: GateFile,
    /// cuda/kernels.toml, read once when a command first needs a kernel.
    manifest: std::sync::OnceLock<Manifest>,
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
        gates.check_shape_names(|name| catalog.get(name).is_some(), catalog.path())?;
        Ok(Project {
            root,
            catalog,
            gates,
            manifest: std::sync::OnceLock::new(),
        })
    }

    /// The kernel `--kernel` names (cuda/kernels.toml, [`crate::kernels::Manifest::choose`]),
    /// refused (exit 2) when the runner cannot check it.
    pub fn kernel(&self, args: &KernelArgs) -> Result<Chosen, ConfigError> {
        let chosen = self
            .manifest()?
            .choose(args.kernel.as_deref(), &self.root.cuda_dir())?;
        chosen.spec.require_checked()?;
        Ok(chosen)
    }

    fn manifest(&self) -> Result<&Manifest, ConfigError> {
        if let Some(m) = self.manifest.get() {
            return Ok(m);
        }
        let loaded = Manifest::load(&self.root.cuda_dir().join(crate::kernels::MANIFEST_FILE))?;
        Ok(self.manifest.get_or_init(|| loaded))
    }

    /// The kernel's source file ([`Project::kernel`]).
    pub fn kernel_path(&self, args: &KernelArgs) -> Result<PathBuf, ConfigError> {
        Ok(self.kernel(args)?.path)
    }

    /// Refuses (exit 2) a problem outside what the chosen kernel runs, naming the rule and the
    /// kernels that run it.
    pub fn check_supported(&self, args: &KernelArgs, shapes: &[Shape]) -> Result<(), ConfigError> {
        let chosen = self.kernel(args)?;
        let manifest = self.manifest()?;
        for shape in shapes {
            if let Some(why) = chosen.spec.unsupported(shape) {
                let others = manifest.supporting(shape);
                return Err(ConfigError::BadShape {
                    name: shape.name.clone(),
                    message: format!(
                        "kernel `{}` does not run {why}; {}",
                        chosen.spec.name,
                        if others.is_empty() {
                            "no kernel of the manifest does".to_string()
                        } else {
                            format!("--kernel {} does", others.join(" or --kernel "))
                        }
                    ),
                });
            }
        }
        Ok(())
    }
}

/// The variants a run builds of kernel `kernel`: its switch's baseline and candidate
/// (cuda/kernels.toml `[variants]`) as `--cp-async` and `USE_CP_ASYNC` select them (0 the
/// baseline, 1 the candidate), each with the `--define`s; with `--candidate-define`, the one
/// selected variant without and with those defines. `USE_CP_ASYNC` in the environment is
/// Stage C's old workflow: another kernel refuses it, and a `--define` of the switch is
/// refused for every kernel.
pub fn variant_specs(
    args: &KernelArgs,
    kernel: &KernelSpec,
) -> Result<Vec<VariantSpec>, ConfigError> {
    let switch = &kernel.variants;
    let env = std::env::var("USE_CP_ASYNC").ok();
    if env.is_some() && switch.define != "USE_CP_ASYNC" {
        return Err(ConfigError::Usage(format!(
            "USE_CP_ASYNC is set in the environment, but kernel `{}`'s A/B switch is {} ({} or \
             {}): unset it, and choose a variant with --cp-async 0 ({}) or 1 ({})",
            kernel.name,
            switch.define,
            switch.baseline.name,
            switch.candidate.name,
            switch.baseline.name,
            switch.candidate.name
        )));
    }
    let all_defines = args.defines.iter().map(|d| ("--define", d));
    let candidate = args
        .candidate_defines
        .iter()
        .map(|d| ("--candidate-define", d));
    if let Some((flag, (name, _))) = all_defines
        .chain(candidate)
        .find(|(_, (n, _))| *n == switch.define)
    {
        return Err(ConfigError::Usage(format!(
            "{flag} {name}: {name} is kernel `{}`'s A/B switch, which --cp-async 0|1|both \
             chooses ({} or {})",
            kernel.name, switch.baseline.name, switch.candidate.name
        )));
    }
    let specs: Vec<VariantSpec> = variant::select(args.cp_async, env.as_deref())?
        .into_iter()
        .map(|on| VariantSpec::of_switch(switch, on, &args.defines))
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

/// Opens the chosen backend: the CPU emulation (with an optional planted defect), or the GPU
/// with the variants the kernel arguments select; with `base`, each variant is also built
/// from the base kernel (`base-cp0`, ...), after the kernel under test's.
pub fn open_backend(
    kind: BackendKind,
    kernel: &KernelArgs,
    base: Option<&KernelLocation>,
    defect: Defect,
    project: &Project,
    entries: &[crate::shapes::Entry],
) -> Result<Box<dyn Backend>, AppError> {
    let mut one = open_backends_on(&[0], kind, kernel, base, defect, project, entries)?;
    Ok(one.pop().expect("one backend per GPU"))
}

/// [`open_backend`] once per GPU of CUDA ordinals `gpus` (the cpu backend, which ignores
/// them, is opened once): the GPUs open together and share one build per GPU model, with the
/// kernel's entries `entries` ([`crate::shapes::Entry::of`] the command's shapes).
fn open_backends_on(
    gpus: &[usize],
    kind: BackendKind,
    kernel: &KernelArgs,
    base: Option<&KernelLocation>,
    defect: Defect,
    project: &Project,
    entries: &[crate::shapes::Entry],
) -> Result<Vec<Box<dyn Backend>>, AppError> {
    Ok(match kind {
        BackendKind::Cpu => {
            if !kernel.candidate_defines.is_empty() || !kernel.defines.is_empty() {
                return Err(ConfigError::Usage(
                    "--define and --candidate-define change the GPU kernel; they need --backend cuda".into(),
                )
                .into());
            }
            if base.is_some() {
                return Err(ConfigError::Usage(
                    "--base-kernel compares two GPU kernels; it needs --backend cuda (the cpu \
                     backend emulates one algorithm)"
                        .into(),
                )
                .into());
            }
            // The emulation has one variant, but a bad or conflicting choice is still refused,
            // and so is a kernel the runner does not check. It emulates the chosen kernel.
            let chosen = project.kernel(kernel)?;
            variant_specs(kernel, &chosen.spec)?;
            let alg = crate::emulation::Algorithm::of(&chosen.spec);
            vec![Box::new(CpuBackend::new(defect).emulating(alg))]
        }
        BackendKind::Cuda => {
            let chosen = project.kernel(kernel)?;
            let specs = variant_specs(kernel, &chosen.spec)?;
            if base.is_some() && !kernel.candidate_defines.is_empty() {
                return Err(ConfigError::Usage(
                    "--base-kernel and --candidate-define are two different A/Bs; run them one at a time"
                        .into(),
                )
                .into());
            }
            let cuda_dir = project.root.cuda_dir();
            let source = KernelSource::load(&chosen.path, &cuda_dir, &chosen.spec)?;
            let mut sources = vec![(source, specs.clone())];
            if let Some(location) = base {
                let base =
                    KernelSource::locate(location, project.root.path(), &cuda_dir, &chosen.spec)?;
                sources.push((base, specs.iter().map(VariantSpec::of_base).collect()));
            }
            let opened = CudaBackend::on_gpus(gpus, sources, entries).map_err(|e| match e {
                BackendError::Environment(why) => {
                    BackendError::Environment(format!("{why}\n{CPU_BACKEND_ADVICE}"))
                }
                other => other,
            })?;
            opened
                .into_iter()
                .map(|b| Box::new(b) as Box<dyn Backend>)
                .collect()
        }
    })
}

/// The GPUs a command's workers will run on, checked before any work (src/devices.rs: they
/// exist, are of one model, and a GPU is listed twice only where nothing is `timed`); `None`
/// for the default, GPU 0 alone, or the cpu backend. `--devices` with `--backend cpu` is
/// refused (exit 2).
pub fn plan_workers(
    devices: &DeviceChoice,
    timed: bool,
    kind: BackendKind,
) -> Result<Option<Vec<GpuId>>, AppError> {
    if kind == BackendKind::Cpu && !devices.is_default() {
        return Err(ConfigError::Usage(
            "--devices chooses GPUs; it needs --backend cuda (the cpu backend already runs on \
             every core of the host)"
                .into(),
        )
        .into());
    }
    chosen_gpus(devices, timed).map_err(|e| match e {
        AppError::Backend(BackendError::Environment(why)) => BackendError::Environment(format!(
            "{why}\nWithout --devices, `--backend cpu` runs the same pipeline on the CPU \
             emulation of the kernel, with no GPU."
        ))
        .into(),
        other => other,
    })
}

/// How many workers a plan ([`plan_workers`]) makes.
pub fn worker_count(gpus: &Option<Vec<GpuId>>) -> usize {
    gpus.as_ref().map_or(1, Vec::len)
}

/// The workers of a command, one backend each: one per GPU of `gpus` ([`plan_workers`]),
/// opened together, each loading its GPU model's one build, and every GPU must report the
/// same variants (PTX and driver resources); without GPUs, the one backend [`open_backend`]
/// opens.
pub fn open_workers(
    gpus: Option<Vec<GpuId>>,
    kind: BackendKind,
    kernel: &KernelArgs,
    base: Option<&KernelLocation>,
    defect: Defect,
    project: &Project,
    entries: &[crate::shapes::Entry],
) -> Result<Vec<Box<dyn Backend>>, AppError> {
    crate::trace::mark(|| "opening the workers".into());
    let ordinals: Vec<usize> = match &gpus {
        Some(chosen) => chosen.iter().map(|g| g.ordinal).collect(),
        None => vec![0],
    };
    let workers = open_backends_on(&ordinals, kind, kernel, base, defect, project, entries)?;
    crate::trace::mark(|| "workers open".into());
    let first = workers[0].variant_meta();
    for w in &workers[1..] {
        if w.variant_meta() != first {
            return Err(BackendError::Environment(format!(
                "GPU {} built other code than GPU {} from the same kernel (its variants' PTX or \
                 resources differ); run on one of them with --devices",
                w.gpu().map_or(0, |g| g.index),
                workers[0].gpu().map_or(0, |g| g.index)
            ))
            .into());
        }
    }
    Ok(workers)
}

/// The GPUs `devices` names, checked against the driver's (src/devices.rs), before any work;
/// `None` for the default, GPU 0 alone, which needs no list.
pub(crate) fn chosen_gpus(
    devices: &DeviceChoice,
    timed: bool,
) -> Result<Option<Vec<GpuId>>, AppError> {
    if devices.is_default() {
        return Ok(None);
    }
    let seen = crate::backend::cuda::device::list().map_err(|e| match e {
        BackendError::Environment(why) => {
            BackendError::Environment(format!("--devices {}: {why}", devices.spec()))
        }
        other => other,
    })?;
    let chosen = crate::devices::resolve(devices, &seen, timed).map_err(ConfigError::Usage)?;
    Ok(Some(chosen))
}

/// The workers as the runner takes them.
pub(crate) fn as_workers(backends: &mut [Box<dyn Backend>]) -> Vec<&mut dyn Backend> {
    backends
        .iter_mut()
        .map(|b| b.as_mut() as &mut dyn Backend)
        .collect()
}

/// One line naming the workers' GPUs, when there are several (or one other than GPU 0).
pub(crate) fn workers_line(backends: &[Box<dyn Backend>]) -> Option<String> {
    let gpus: Vec<String> = backends
        .iter()
        .filter_map(|b| b.gpu())
        .map(|g| format!("GPU {} ({})", g.index, g.uuid))
        .collect();
    (backends.len() > 1 || backends[0].gpu().is_some_and(|g| g.index != 0)).then(|| {
        format!(
            "workers: {} ({}), problems shared costliest first",
            gpus.len(),
            gpus.join(", ")
        )
    })
}

/// build_meta.json of a run; with several workers, the first one's details and every
/// worker's GPU (`backend_details.gpus`).
pub fn build_meta(
    project: &Project,
    workers: &[Box<dyn Backend>],
    started_at: String,
) -> BuildMeta {
    let backend = workers[0].as_ref();
    let mut details = backend.details();
    let gpus: Vec<_> = workers.iter().filter_map(|w| w.gpu()).collect();
    if workers.len() > 1 && details.is_object() {
        details["gpus"] = serde_json::to_value(gpus).expect("GPU slots serialize");
    }
    provenance(project, backend.name(), details, started_at)
}

/// build_meta.json of this process: the tool, the checkout, the host, the command line, the
/// project files read, and what the backend says of itself (`backend_details`).
pub(crate) fn provenance(
    project: &Project,
    backend: &str,
    backend_details: serde_json::Value,
    started_at: String,
) -> BuildMeta {
    BuildMeta {
        schema_version: SCHEMA_VERSION,
        tool: report::tool_info(),
        git: report::git_info(),
        backend: backend.to_string(),
        host: report::host_info(),
        command_line: std::env::args_os()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        started_at,
        project_root: project.root.path().display().to_string(),
        shapes_file: report::file_ref(project.catalog.path()),
        gates_file: report::file_ref(&project.gates.path),
        backend_details,
    }
}
