//! How small a mistake the correctness gates catch: planted perturbations of a correct output
//! (the emulation, in the kernel's precisions), each scanned over relative sizes from 1e-6 up
//! until some gate fails. Three perturbations, each a classic kernel bug in miniature: the
//! softmax scale off by a factor (1 + ε), the V scale off by (1 + ε), and one output row
//! scaled by (1 + ε).

use half::f16;

use crate::emulation::{self, Defect};
use crate::gates::Gates;
use crate::problem::Problem;
use crate::runner::{Yardsticks, judge_output};

/// The perturbations, in the order the table shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Perturbation {
    SoftmaxScale,
    VScale,
    OneRow,
}

impl Perturbation {
    pub const ALL: [Perturbation; 3] = [
        Perturbation::SoftmaxScale,
        Perturbation::VScale,
        Perturbation::OneRow,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Perturbation::SoftmaxScale => "softmax scale",
            Perturbation::VScale => "V scale",
            Perturbation::OneRow => "one output row",
        }
    }
}

/// The smallest relative size caught, and the gates that caught it there.
#[derive(Debug, Clone, PartialEq)]
pub struct Caught {
    pub epsilon: f64,
    pub gates: Vec<String>,
}

/// Relative sizes tried: 10^(-6 + k/4), k = 0..=24 (1e-6 to 1).
fn sizes() -> impl Iterator<Item = f64> {
    (0..=24).map(|k| 10f64.powf(-6.0 + k as f64 / 4.0))
}

/// What a scan of one perturbation found.
#[derive(Debug, Clone, PartialEq)]
pub enum Scan {
    /// The smallest size that failed a gate.
    Caught(Caught),
    /// No size up to a factor of 2 failed one.
    NotCaught,
    /// Even a factor of 2 leaves the output's bits as they were (a softmax over one key, a
    /// row that sees none): nothing any gate could see.
    NoEffect,
}

/// The smallest size of `what` that fails a gate on `p`, for a kernel of algorithm `alg`
/// (its emulation stands in for the correct output, and its model bounds the error).
pub fn scan(p: &Problem, what: Perturbation, gates: &Gates, alg: emulation::Algorithm) -> Scan {
    let y = Yardsticks::full(p, alg);
    match caught_in(p, &y, what, gates, alg) {
        Some(c) => Scan::Caught(c),
        None if perturbed(p, &y, what, 1.0, alg) == y.emulation_out => Scan::NoEffect,
        None => Scan::NotCaught,
    }
}

/// As [`scan`], None where nothing is caught or the perturbation has no effect.
#[cfg(test)]
fn smallest_caught(
    p: &Problem,
    what: Perturbation,
    gates: &Gates,
    alg: emulation::Algorithm,
) -> Option<Caught> {
    match scan(p, what, gates, alg) {
        Scan::Caught(c) => Some(c),
        Scan::NotCaught | Scan::NoEffect => None,
    }
}

fn caught_in(
    p: &Problem,
    y: &Yardsticks,
    what: Perturbation,
    gates: &Gates,
    alg: emulation::Algorithm,
) -> Option<Caught> {
    sizes().find_map(|eps| {
        let out = perturbed(p, y, what, eps, alg);
        let r = judge_output("cpu", "perturbed", p, y, &out, gates);
        (!r.pass).then(|| Caught {
            epsilon: eps,
            gates: crate::verdict::failed(&r.gates)
                .map(|f| f.gate.to_string())
                .collect(),
        })
    })
}

fn perturbed(
    p: &Problem,
    y: &Yardsticks,
    what: Perturbation,
    eps: f64,
    kv: emulation::Algorithm,
) -> Vec<f16> {
    let rerun = |q: Problem| {
        let mut out = vec![crate::metrics::POISON; q.output_len()];
        emulation::run(&q, kv, Defect::None, &mut out);
        out
    };
    match what {
        Perturbation::SoftmaxScale => {
            let mut q = p.clone();
            q.softmax_scale *= (1.0 + eps) as f32;
            rerun(q)
        }
        Perturbation::VScale => {
            let mut q = p.clone();
            q.v.scales.iter_mut().for_each(|s| *s *= (1.0 + eps) as f32);
            rerun(q)
        }
        Perturbation::OneRow => {
            // The middle of the rows of the last head that see a key (all of them but under
            // a causal mask with S_q > S_k): not a tile edge, not the first block.
            let d = p.shape.d;
            let s = p.shape.s;
            let first = (0..s).find(|&r| p.shape.visible_keys(r) > 0).unwrap_or(0);
            let row = (p.shape.heads() - 1) * s + first + (s - first) / 2;
            let mut out = y.emulation_out.clone(); // every row: the full output
            for x in &mut out[row * d..(row + 1) * d] {
                *x = f16::from_f64(x.to_f64() * (1.0 + eps));
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gates::GateFile;
    use crate::shapes::Shape;

    fn gates() -> Gates {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("gates/default.json");
        GateFile::load(&path).unwrap().gates
    }

    #[test]
    fn every_perturbation_is_caught_somewhere_between_a_millionth_and_a_factor_two() {
        let shape = Shape::parse_inline("1x2x100x64").unwrap().unwrap();
        let p = Problem::new(&shape, 0);
        for what in Perturbation::ALL {
            let c = smallest_caught(&p, what, &gates(), emulation::Algorithm::STAGE_C)
                .unwrap_or_else(|| panic!("{what:?}"));
            // A correct output (eps far below the arithmetic's own error) passes...
            assert!(c.epsilon > 1e-6, "{what:?} caught at {}", c.epsilon);
            // ...and a one-percent mistake does not.
            assert!(c.epsilon <= 1e-2, "{what:?} only caught at {}", c.epsilon);
            assert!(!c.gates.is_empty());
        }
    }

    #[test]
    fn a_perturbation_that_cannot_change_the_output_is_no_effect_and_the_row_is_one_that_sees_keys()
    {
        let alg = emulation::Algorithm::STAGE_C;
        // One key: the softmax is 1 whatever its scale.
        let one_key = Problem::new(&Shape::parse_inline("1x1x4x64:sk=1").unwrap().unwrap(), 0);
        assert_eq!(
            scan(&one_key, Perturbation::SoftmaxScale, &gates(), alg),
            Scan::NoEffect
        );
        assert!(matches!(
            scan(&one_key, Perturbation::VScale, &gates(), alg),
            Scan::Caught(_)
        ));
        // Causal with S_q > S_k: the first 150 rows see no key, and the middle row of the head
        // is among them; the perturbed row must be one that sees keys.
        let tall = Shape::parse_inline("1x1x200x64:sk=50:causal")
            .unwrap()
            .unwrap();
        assert!(tall.visible_keys(100) == 0);
        let tall = Problem::new(&tall, 0);
        assert!(matches!(
            scan(&tall, Perturbation::OneRow, &gates(), alg),
            Scan::Caught(_)
        ));
    }

    #[test]
    fn the_perturbations_rerun_the_chosen_kernels_algorithm_so_size_zero_is_its_emulation() {
        let alg = emulation::Algorithm::of(&crate::kernels::project_spec("stage-d"));
        assert!(!alg.is_stage_c());
        let shape = Shape::parse_inline("1x2x100x64:sk=300:causal")
            .unwrap()
            .unwrap();
        let p = Problem::new(&shape, 1);
        let y = Yardsticks::full(&p, alg);
        for what in Perturbation::ALL {
            assert_eq!(
                perturbed(&p, &y, what, 0.0, alg),
                y.emulation_out,
                "{what:?} at size 0 is not Stage D's own output"
            );
        }
        // Stage C's output is another algorithm's: not what Stage D's perturbations start from.
        assert_ne!(
            perturbed(
                &p,
                &y,
                Perturbation::VScale,
                0.0,
                emulation::Algorithm::STAGE_C
            ),
            y.emulation_out
        );
    }

    #[test]
    fn stage_ds_scale_gate_catches_a_v_scale_error_as_finely_as_stage_cs_but_one_row_stays_blunt() {
        let alg = emulation::Algorithm::of(&crate::kernels::project_spec("stage-d"));
        let shape = Shape::parse_inline("1x2x100x64:sk=300:causal")
            .unwrap()
            .unwrap();
        let p = Problem::new(&shape, 1);
        let caught = |what, alg| {
            smallest_caught(&p, what, &gates(), alg).unwrap_or_else(|| panic!("{what:?}"))
        };
        // Stage D's own output passes: nothing is caught at 1e-6.
        for what in Perturbation::ALL {
            assert!(caught(what, alg).epsilon > 1e-6, "{what:?}");
        }
        // A V scale error scales every row: the slope on the emulation sees it at the
        // allowance (2^-10, here with no chance spread), as Stage C's gates do.
        let v = caught(Perturbation::VScale, alg);
        assert!(v.epsilon <= 2e-3, "{v:?}");
        assert_eq!(v.gates, ["emulation.scale"]);
        let c = caught(Perturbation::VScale, emulation::Algorithm::STAGE_C);
        assert!(v.epsilon <= c.epsilon, "{v:?} against Stage C's {c:?}");
        // One row moves the slope by its share only: the bounds must see it, and they sit
        // above e4m3's rounding of P, ten times and more blunter than Stage C's (docs/DESIGN.md
        // "How small a mistake they catch, per kernel").
        let d = caught(Perturbation::OneRow, alg);
        let c = caught(Perturbation::OneRow, emulation::Algorithm::STAGE_C);
        assert!(!d.gates.contains(&"emulation.scale".to_string()), "{d:?}");
        assert!(
            d.epsilon >= 10.0 * c.epsilon,
            "{d:?} against Stage C's {c:?}"
        );
    }
}
