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
        "{:<width$}  {:>3} {:>4} {:>4} {:>6} {:>6} {:>3} {:>6}  {:>6}  purpose",
        "name",
        "B",
        "H",
        "Hkv",
        "S",
        "Sk",
        "D",
        "causal",
        "qk_std"
    );
    for s in shapes {
        let only = if project.catalog.in_all(&s.name) {
            ""
        } else {
            " (by name only, not in `all`)"
        };
        crate::outln!(
            "{:<width$}  {:>3} {:>4} {:>4} {:>6} {:>6} {:>3} {:>6}  {:>6}  {}{only}",
            s.name,
            s.b,
            s.h,
            s.hkv,
            s.s,
            s.sk,
            s.d,
            if s.causal { "yes" } else { "no" },
            s.qk_std,
            s.purpose
        );
    }
    for (set, members) in project.catalog.sets() {
        crate::outln!("set {set}: {}", members.join(", "));
    }
    crate::outln!(
        "inline shapes are written BxHxSxD[:sk=N][:hkv=N][:causal][:qk=F][:dist=NAME][:rotate], e.g. \
         --shapes 1x32x512x128:sk=4096:hkv=8:causal (D 64 or 128; causal is bottom-right \
         aligned)"
    );
    Ok(Outcome::Pass)
}
