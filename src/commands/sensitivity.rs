//! `sdpa-runner sensitivity`: the smallest planted mistake each correctness gate catches, per
//! shape (src/sensitivity.rs). CPU only: the perturbations are of the emulation's output, which
//! stands in for a correct kernel (the GPU's outputs match it to the last bit, or nearly), in
//! the algorithm of `--kernel` (cuda/kernels.toml), judged by that kernel's gates and model.

use super::Project;
use crate::cli::{KernelArgs, SensitivityArgs};
use crate::emulation::Algorithm;
use crate::error::{AppError, Outcome};
use crate::problem::Problem;
use crate::sensitivity::{Caught, Perturbation, Scan, scan};

pub fn sensitivity(args: &SensitivityArgs) -> Result<Outcome, AppError> {
    let project = Project::load(&args.project)?;
    let selected = project.catalog.select(&args.shapes)?;
    let kernel = KernelArgs {
        kernel: args.kernel.clone(),
        ..KernelArgs::default()
    };
    let chosen = project.kernel(&kernel)?;
    project.check_supported(&kernel, &selected)?;
    let alg = Algorithm::of(&chosen.spec);
    // Every row of every shape, on one worker with every thread.
    crate::rows::check_host_memory(&selected, crate::rows::CheckRows::All, 1, 1)?;
    let gates = &project.gates.gates;
    crate::outln!("kernel {}: {}", chosen.spec.name, alg.describe());
    crate::outln!(
        "smallest relative error caught (largest over seeds {:?}; sizes 10^(k/4) from 1e-6)",
        args.seeds.0
    );
    crate::outln!("| shape | perturbation | smallest caught | caught by |");
    crate::outln!("|---|---|---|---|");
    let mut all_caught = true;
    for shape in &selected {
        for what in Perturbation::ALL {
            // The worst (largest) smallest-caught size over the seeds where the perturbation
            // changes the output; any seed where nothing catches it fails the table.
            let mut worst: Option<Caught> = None;
            let mut missed = false;
            for &seed in &args.seeds.0 {
                match scan(&Problem::new(shape, seed), what, gates, alg) {
                    Scan::Caught(c) => {
                        if worst.as_ref().is_none_or(|w| c.epsilon > w.epsilon) {
                            worst = Some(c);
                        }
                    }
                    Scan::NotCaught => missed = true,
                    Scan::NoEffect => {}
                }
            }
            let (eps, by) = match (missed, worst) {
                (true, _) => {
                    all_caught = false;
                    ("not caught up to 100%".into(), String::new())
                }
                (false, Some(c)) => (format!("{:.2}%", c.epsilon * 100.0), c.gates.join(", ")),
                (false, None) => ("n/a".into(), "no effect on this shape".into()),
            };
            crate::outln!("| {} | {} | {eps} | {by} |", shape.name, what.name());
        }
    }
    Ok(Outcome::from_pass(all_caught))
}
