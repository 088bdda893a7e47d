//! `sdpa-runner shapes`: the named shapes and what each is for.

use super::Project;
use crate::cli::ShapesArgs;
use crate::error::{AppError, Outcome};

pub fn list(args: &ShapesArgs) -> Result<Outcome, AppError> {
    let project = Project::load(&args.project)?;
    let shapes = project.catalog.shapes();
    let width = shapes
        .iter()
        .map(|s| s.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    crate::outln!("shapes in {}:", project.catalog.path().display());
    crate::outln!(
        "{:<width$}  {:>3} {:>4} {:>6} {:>3}  {:>6}  purpose",
        "name",
        "B",
        "H",
        "S",
        "D",
        "qk_std"
    );
    for s in shapes {
        let only = if project.catalog.in_all(&s.name) {
            ""
        } else {
            " (by name only, not in `all`)"
        };
        crate::outln!(
            "{:<width$}  {:>3} {:>4} {:>6} {:>3}  {:>6}  {}{only}",
            s.name,
            s.b,
            s.h,
            s.s,
            s.d,
            s.qk_std,
            s.purpose
        );
    }
    crate::outln!("inline shapes are written BxHxSxD, e.g. --shapes 1x8x512x64 (D must be 64)");
    Ok(Outcome::Pass)
}
