//! Whether the two sides of a comparison ran the same machine code: for every seed, the same
//! launch (function, grid, threads, query rows) of a function whose machine code hashes alike
//! on both sides (`VariantMeta::machine_code`, src/backend/cuda/machine_code/), on inputs of
//! the same checksum. Such a comparison is an A/A by construction: whatever its timings say,
//! the change did not make that problem faster or slower, so a verdict other than SAME there
//! is noise beyond the floor (a false verdict), which neither fails the PR gate nor meets a
//! target (src/analysis.rs). A change that touches one function of a kernel leaves the
//! problems of its other functions as such controls in the same run.

use crate::schema::{Measurement, PerfFile, VariantMeta};

/// One side of a comparison: the file its timings are in and the variant's name.
pub type Side<'a> = (&'a PerfFile, &'a str);

/// Whether `base` and `cand` ran the same machine code in the same launches on the same
/// inputs for every seed of `shape`, the seeds the same on both sides: None where that cannot
/// be told (a side without recorded machine code or launches, a seed timed twice, no
/// timings of the shape). Meant for the two sides of one run: across runs the host code,
/// the driver and the plan may differ too.
pub fn same_machine_code(base: Side, cand: Side, shape: &str) -> Option<bool> {
    let (mb, mc) = (meta(base)?, meta(cand)?);
    let (bs, cs) = (by_seed(base, shape)?, by_seed(cand, shape)?);
    let mut same = bs.len() == cs.len();
    for (b, c) in bs.iter().zip(&cs) {
        let (lb, lc) = (b.launch.as_ref()?, c.launch.as_ref()?);
        let hb = code_of(mb, b, lb.function.as_deref()?)?;
        let hc = code_of(mc, c, lc.function.as_deref()?)?;
        same &= b.seed == c.seed && lb == lc && hb == hc && b.input_checksum == c.input_checksum;
    }
    Some(same)
}

fn meta<'a>((f, v): Side<'a>) -> Option<&'a VariantMeta> {
    f.variants.iter().find(|m| m.name == v)
}

/// A side's timings of `shape` in seed order; None where there are none or a seed is timed
/// twice.
fn by_seed<'a>((f, v): Side<'a>, shape: &'a str) -> Option<Vec<&'a Measurement>> {
    let mut ms: Vec<&Measurement> = f.measurements_of(shape, v).collect();
    ms.sort_by_key(|m| m.seed);
    let unique = ms.windows(2).all(|w| w[0].seed != w[1].seed);
    (unique && !ms.is_empty()).then_some(ms)
}

/// The hash of `function`'s machine code in the module of `m`'s problem (its head dim and
/// mask: `shapes::Entry::suffix`) among `v`'s; None where it is not recorded.
fn code_of<'a>(v: &'a VariantMeta, m: &Measurement, function: &str) -> Option<&'a str> {
    let module = crate::shapes::Entry {
        d: m.d,
        causal: m.causal,
    }
    .suffix();
    v.machine_code
        .iter()
        .find(|f| f.function == function && f.module == module)
        .map(|f| f.sha256.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::fixtures::{code, launch, perf_file};

    /// A run of `cp0` and `base-cp0` on "mission", seeds 0 and 1, both launching `entry` on
    /// a grid of 22 query tiles, with `entry`'s and `companion`'s code as given.
    fn run(ours: [&str; 2], theirs: [&str; 2]) -> PerfFile {
        let mut f = perf_file(
            "H100",
            &["mission"],
            &[0, 1],
            &[("base-cp0", 1.0), ("cp0", 1.0)],
        );
        for m in &mut f.measurements {
            m.launch = Some(launch("entry", 22));
        }
        for v in &mut f.variants {
            let [e, c] = if v.name == "cp0" { ours } else { theirs };
            v.machine_code = vec![code("entry", e), code("entry_m128", c)];
        }
        f
    }

    fn judge(f: &PerfFile) -> Option<bool> {
        same_machine_code((f, "base-cp0"), (f, "cp0"), "mission")
    }

    #[test]
    fn the_same_launches_of_the_same_code_are_the_same_code_whatever_else_moved() {
        // The companion changed; the problem launches only the entry.
        assert_eq!(judge(&run(["e1", "c2"], ["e1", "c1"])), Some(true));
    }

    #[test]
    fn a_launched_function_whose_code_moved_is_not_the_same_code() {
        assert_eq!(judge(&run(["e2", "c1"], ["e1", "c1"])), Some(false));
    }

    #[test]
    fn the_same_code_launched_on_another_grid_or_other_inputs_is_not_the_same() {
        let mut f = run(["e1", "c1"], ["e1", "c1"]);
        let last = f.measurements.len() - 1;
        f.measurements[last].launch = Some(launch("entry", 23));
        assert_eq!(judge(&f), Some(false), "another grid");
        let mut f = run(["e1", "c1"], ["e1", "c1"]);
        f.measurements[last].input_checksum = "other".into();
        assert_eq!(judge(&f), Some(false), "other inputs");
        let mut f = run(["e1", "c1"], ["e1", "c1"]);
        f.measurements[last].launch = Some(launch("entry_m128", 22));
        assert_eq!(judge(&f), Some(false), "another function");
    }

    #[test]
    fn other_seeds_or_another_count_of_seeds_are_not_the_same_work() {
        let mut f = run(["e1", "c1"], ["e1", "c1"]);
        let cand_seed_1 = f
            .measurements
            .iter()
            .position(|m| m.variant == "cp0" && m.seed == 1)
            .unwrap();
        f.measurements[cand_seed_1].seed = 2;
        assert_eq!(judge(&f), Some(false), "seeds 0, 1 against 0, 2");
        let mut f = run(["e1", "c1"], ["e1", "c1"]);
        f.measurements.remove(cand_seed_1);
        assert_eq!(judge(&f), Some(false), "seeds 0, 1 against 0");
    }

    #[test]
    fn without_recorded_code_or_launches_nothing_is_said() {
        let mut f = run(["e1", "c1"], ["e1", "c1"]);
        f.variants[0].machine_code.clear();
        assert_eq!(judge(&f), None, "no machine code");
        let mut f = run(["e1", "c1"], ["e1", "c1"]);
        f.measurements[0].launch = None;
        assert_eq!(judge(&f), None, "no launch");
        let mut f = run(["e1", "c1"], ["e1", "c1"]);
        for v in &mut f.variants {
            v.machine_code
                .iter_mut()
                .for_each(|c| c.module = "d128".into());
        }
        assert_eq!(judge(&f), None, "not in the problem's module");
        let mut f = run(["e1", "c1"], ["e1", "c1"]);
        let twice = f.measurements[0].clone();
        f.measurements.push(twice);
        assert_eq!(judge(&f), None, "a seed timed twice");
        let f = run(["e1", "c1"], ["e1", "c1"]);
        assert_eq!(
            same_machine_code((&f, "base-cp0"), (&f, "cp0"), "absent"),
            None,
            "no timings"
        );
    }
}
