//! `sdpa-runner build`: compiles the variants with NVRTC for an architecture and prints their
//! identity and ptxas resources. Needs NVRTC and the CUDA headers, not a GPU.

use super::{Project, variant_specs};
use crate::backend::BackendError;
use crate::backend::cuda::{headers, kernel};
use crate::cli::BuildArgs;
use crate::console;
use crate::error::{AppError, Outcome};
use crate::schema::VariantMeta;

pub fn build(args: &BuildArgs) -> Result<Outcome, AppError> {
    let project = Project::load(&args.project)?;
    let chosen = project.kernel(&args.kernel)?;
    let specs = variant_specs(&args.kernel, &chosen.spec)?;
    let source = kernel::KernelSource::load(&chosen.path, &project.root.cuda_dir(), &chosen.spec)?;
    let nvrtc_version = kernel::require_nvrtc()?;
    let include =
        headers::find_in_environment().map_err(|e| BackendError::Environment(e.to_string()))?;
    let mut ids = Vec::new();
    for spec in &specs {
        ids.push(
            kernel::build_variant(
                &source,
                &include,
                &args.arch,
                spec,
                &crate::shapes::Entry::all(),
            )?
            .identity,
        );
    }
    let verdicts: Vec<_> = ids
        .iter()
        .map(|id| {
            let gates = chosen.spec.resource_gates(&project.gates.gates);
            (id.name.clone(), id.resource_verdict(&gates))
        })
        .collect();
    crate::outln!(
        "kernel {} (sha256 {}), NVRTC {nvrtc_version}, {}, headers {}",
        source.path.display(),
        &source.sha256[..12],
        args.arch,
        include.display()
    );
    crate::out!(
        "{}",
        console::identity_table(
            &ids.iter().map(VariantMeta::from).collect::<Vec<_>>(),
            &verdicts
        )
    );
    crate::outln!(
        "(no GPU: registers and spills from ptxas, shared memory from the kernel; occupancy needs a device)"
    );
    Ok(Outcome::from_pass(verdicts.iter().all(|(_, v)| v.pass())))
}
