//! `sdpa-runner build`: compiles the variants with NVRTC for an architecture and prints their
//! identity and ptxas resources; with `--base-kernel`, also the base kernel's twins, and which
//! functions' machine code differs from theirs (src/backend/cuda/machine_code/). Needs NVRTC
//! and the CUDA headers, not a GPU.

use super::{Project, variant_specs};
use crate::backend::BackendError;
use crate::backend::cuda::kernel::{self, BuiltVariant, KernelSource};
use crate::backend::cuda::machine_code::{self, Change, Compared};
use crate::backend::cuda::{headers, variant::VariantSpec};
use crate::cli::BuildArgs;
use crate::console;
use crate::error::{AppError, Outcome};
use crate::schema::VariantMeta;
use crate::shapes::Entry;

pub fn build(args: &BuildArgs) -> Result<Outcome, AppError> {
    let project = Project::load(&args.project)?;
    let chosen = project.kernel(&args.kernel)?;
    let specs = variant_specs(&args.kernel, &chosen.spec)?;
    let cuda_dir = project.root.cuda_dir();
    let source = KernelSource::load(&chosen.path, &cuda_dir, &chosen.spec)?;
    let base = args
        .base_kernel
        .as_ref()
        .map(|at| KernelSource::locate(at, project.root.path(), &cuda_dir, &chosen.spec))
        .transpose()?;
    let nvrtc_version = kernel::require_nvrtc()?;
    let include =
        headers::find_in_environment().map_err(|e| BackendError::Environment(e.to_string()))?;
    let jobs: Vec<(&KernelSource, VariantSpec)> = specs
        .iter()
        .map(|s| (&source, s.clone()))
        .chain(
            base.iter()
                .flat_map(|b| specs.iter().map(move |s| (b, s.of_base()))),
        )
        .collect();
    let built = std::thread::scope(|scope| {
        let handles: Vec<_> = jobs
            .iter()
            .map(|(src, spec)| {
                let include = &include;
                scope.spawn(move || {
                    kernel::build_variant(src, include, &args.arch, spec, &Entry::all())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a build thread panicked"))
            .collect::<Result<Vec<BuiltVariant>, BackendError>>()
    })?;
    let (ours, theirs) = built.split_at(specs.len());
    let ids: Vec<_> = built.iter().map(|b| b.identity.clone()).collect();
    let gates = chosen.spec.resource_gates(&project.gates.gates);
    let verdicts: Vec<_> = ids
        .iter()
        .map(|id| (id.name.clone(), id.resource_verdict(&gates)))
        .collect();
    crate::outln!(
        "kernel {} (sha256 {}), NVRTC {nvrtc_version}, {}, headers {}",
        source.path.display(),
        &source.sha256[..12],
        args.arch,
        include.display()
    );
    if let Some(base) = &base {
        crate::outln!(
            "base kernel {} (sha256 {})",
            base.origin,
            &base.sha256[..12]
        );
    }
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
    let mut same_code = true;
    if base.is_some() {
        let rows = compare_machine_code(ours, theirs)?;
        same_code = rows.iter().all(|(_, _, r)| r.change.is_same());
        crate::out!("{}", machine_code_table(&rows));
    }
    if args.require_same_code && !same_code {
        crate::outln!(
            "GATE FAILED: --require-same-code: the machine code differs from the base's (above)"
        );
    }
    // The base's resources are shown, not judged: the gates are today's.
    let resources_pass = verdicts[..ours.len()].iter().all(|(_, v)| v.pass());
    Ok(Outcome::from_pass(
        resources_pass && (same_code || !args.require_same_code),
    ))
}

/// Each variant's modules against its twin's, function by function: (variant, module, row).
fn compare_machine_code(
    ours: &[BuiltVariant],
    theirs: &[BuiltVariant],
) -> Result<Vec<(String, Entry, Compared)>, BackendError> {
    let mut rows = Vec::new();
    for (ours, theirs) in ours.iter().zip(theirs) {
        for (entry, cubin) in modules(ours) {
            let base_cubin = modules(theirs)
                .into_iter()
                .find(|(e, _)| *e == entry)
                .map(|(_, c)| c)
                .ok_or_else(|| {
                    BackendError::Kernel(format!(
                        "{} has no {} module to compare {}'s with",
                        theirs.spec.name,
                        entry.suffix(),
                        ours.spec.name
                    ))
                })?;
            let read = |cubin: &[u8], which: &str| {
                machine_code::parse(cubin).map_err(|e| {
                    BackendError::Kernel(format!(
                        "cannot read the CUBIN of {which}'s {} module: {e}",
                        entry.suffix()
                    ))
                })
            };
            let compared = machine_code::compare(
                &read(base_cubin, &theirs.spec.name)?,
                &read(cubin, &ours.spec.name)?,
            );
            rows.extend(
                compared
                    .into_iter()
                    .map(|row| (ours.spec.name.clone(), entry, row)),
            );
        }
    }
    Ok(rows)
}

fn modules(built: &BuiltVariant) -> Vec<(Entry, &[u8])> {
    std::iter::once((Entry::BASE, built.compiled.cubin.as_slice()))
        .chain(built.others.iter().map(|(e, c)| (*e, c.cubin.as_slice())))
        .collect()
}

fn machine_code_table(rows: &[(String, Entry, Compared)]) -> String {
    let fw = rows
        .iter()
        .map(|(_, _, r)| r.name.len())
        .max()
        .unwrap_or(0)
        .max(8);
    let vw = rows
        .iter()
        .map(|(v, _, _)| v.len())
        .max()
        .unwrap_or(0)
        .max(7);
    let mut out = format!(
        "\nmachine code against the base's, function by function (instructions, relocations, \
         registers, stack, attributes, shared memory, parameters, callees, the module's globals):\n{:<vw$}  {:<12} {:<fw$}  {:>8}  {:>10}  code\n",
        "variant", "module", "function", "bytes", "base bytes"
    );
    for (variant, entry, r) in rows {
        let code = match &r.change {
            Change::Same => "same".to_string(),
            Change::Differs(what) => format!("DIFFERS: {}", what.join(", ")),
            Change::OnlyInBase => "only in the base".into(),
            Change::OnlyInCandidate => "new: not in the base".into(),
        };
        out.push_str(&format!(
            "{variant:<vw$}  {:<12} {:<fw$}  {:>8}  {:>10}  {code}\n",
            entry.suffix(),
            r.name,
            r.bytes,
            r.base_bytes
        ));
    }
    let differ: Vec<&(String, Entry, Compared)> = rows
        .iter()
        .filter(|(_, _, r)| !r.change.is_same())
        .collect();
    out.push_str(&if differ.is_empty() {
        format!(
            "machine code: all {} functions are the base's\n",
            rows.len()
        )
    } else {
        format!(
            "machine code: {} of {} functions differ from the base's: {}\n",
            differ.len(),
            rows.len(),
            differ
                .iter()
                .map(|(v, e, r)| format!("{v} {} {}", e.suffix(), r.name))
                .collect::<Vec<_>>()
                .join(", ")
        )
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, change: Change) -> (String, Entry, Compared) {
        (
            "st2".into(),
            Entry {
                d: 128,
                causal: false,
            },
            Compared {
                name: name.into(),
                bytes: 100,
                base_bytes: 90,
                change,
            },
        )
    }

    #[test]
    fn the_table_names_each_function_that_differs_and_why_and_counts_them() {
        let t = machine_code_table(&[
            row("k_d128", Change::Same),
            row(
                "k_d128_m128",
                Change::Differs(vec!["instructions", "relocations"]),
            ),
        ]);
        assert!(t.contains("k_d128 ") && t.contains("  same"), "{t}");
        assert!(t.contains("DIFFERS: instructions, relocations"), "{t}");
        assert!(
            t.contains(
                "machine code: 1 of 2 functions differ from the base's: st2 d128 k_d128_m128"
            ),
            "{t}"
        );
        let all_same = machine_code_table(&[row("k_d128", Change::Same)]);
        assert!(
            all_same.contains("machine code: all 1 functions are the base's"),
            "{all_same}"
        );
    }
}
