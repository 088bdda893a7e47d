//! One KV tile of any [`Algorithm`] the manifest can describe (the emulation's general path):
//! scores in `mma_k`-deep steps kept in f32 or, on FP8 tensor cores, aligned and truncated to
//! FP22 ([`fp22_step`]), online softmax in base 2 (the scale applied to the scores, or fused
//! into the exponent's fma), P rounded to its precision, the
//! row sum over four lanes' partial sums as the kernels' quads keep them (or, `row_sum =
//! "mma"`, as one more column of P·V against ones), and P·V either into O as it runs or into a
//! tile accumulator added as fma(O, alpha, Ô). On Stage C's algorithm it
//! gives the bits of the vectorized path (`general_path_is_stage_c_bit_for_bit`).

use super::exp2::exp2;
use super::{Algorithm, MAX_TILE, QUAD, Running, Tile};
use crate::kernels::{Accumulator, PvAccumulation, RowSum, ScoreScale};

/// One 32-deep step of Hopper's FP8 tensor cores (the manifest's `accumulator = "fp22"`): the
/// accumulator and the step's products (exact for E4M3 operands) are aligned to the largest
/// magnitude among them and each truncated toward zero to 13 fraction bits of it, summed, and
/// the sum truncated to 13 fraction bits ([`fp22`]). Measured, not documented: on the H100 this
/// reproduces Stage D's max and mean error to three digits where a model that sums the step
/// exactly was 5x off (a fuzz problem with scores near 200; docs/DESIGN.md "Error model").
pub(super) fn fp22_step(acc: f32, products: impl Iterator<Item = f64>) -> f32 {
    let mut terms = [0f64; 33];
    terms[0] = acc as f64;
    let mut len = 1;
    for p in products {
        terms[len] = p;
        len += 1;
    }
    let terms = &terms[..len];
    let largest = terms.iter().fold(0f64, |m, t| m.max(t.abs()));
    if largest == 0.0 || !largest.is_finite() {
        return fp22(terms.iter().sum());
    }
    // floor(log2(largest)), exactly: the exponent of a normal f64 (every term is one: an f32
    // widened, or a product of two). The GPU emulation takes it the same way.
    let exponent = ((largest.to_bits() >> 52) & 0x7ff) as i32 - 1023;
    let ulp = 2f64.powi(exponent - 13);
    fp22(terms.iter().map(|t| (t / ulp).trunc() * ulp).sum())
}

/// The base-2 exponent of a key's weight: its scaled score less the base, or (fused) the
/// unscaled score times the scale less the base in one rounding, as the kernel's FFMA. A key
/// the row does not see (score -inf) weighs 0 whatever the scale, as in the kernel.
fn exponent(score: ScoreScale, sc: f32, qk_scale: f32, base: f32) -> f32 {
    match score {
        ScoreScale::Scaled => sc - base,
        ScoreScale::Fused if sc == f32::NEG_INFINITY => sc,
        ScoreScale::Fused => sc.mul_add(qk_scale, -base),
    }
}

/// `x` truncated (toward zero) to 13 fraction bits, as an f32: what Hopper's FP8 tensor cores
/// keep of a running sum after each 32-deep step. NaN and infinities pass through.
pub(super) fn fp22(x: f64) -> f32 {
    if !x.is_finite() {
        return x as f32;
    }
    f64::from_bits(x.to_bits() & !((1u64 << (52 - 13)) - 1)) as f32
}

impl<const D: usize> Running<D> {
    pub(super) fn step_general(
        &mut self,
        q: &[f32; D],
        tile: &Tile,
        qk_scale: f32,
        alg: &Algorithm,
    ) {
        let n = alg.block_n;
        // 1. Scores, one tensor-core step at a time.
        let mut acc = [0f32; MAX_TILE];
        match alg.accumulator {
            Accumulator::F32 => {
                for ks in (0..D).step_by(alg.mma_k) {
                    let mut part = [0f32; MAX_TILE];
                    for (x, &qx) in q.iter().enumerate().skip(ks).take(alg.mma_k) {
                        let krow = &tile.k[x * n..][..n];
                        for (pj, &kj) in part.iter_mut().zip(krow) {
                            *pj += qx * kj;
                        }
                    }
                    for (a, pj) in acc.iter_mut().zip(&part[..n]) {
                        *a += pj;
                    }
                }
            }
            Accumulator::Fp22 => {
                for ks in (0..D).step_by(alg.mma_k) {
                    for (j, a) in acc[..n].iter_mut().enumerate() {
                        let products = q[ks..ks + alg.mma_k]
                            .iter()
                            .enumerate()
                            .map(|(i, &qx)| qx as f64 * tile.k[(ks + i) * n + j] as f64);
                        *a = fp22_step(*a, products);
                    }
                }
            }
        }
        // Scores: scaled (`score = "scaled"`), or left unscaled for the fused exponent. Keys
        // past what the row sees score -inf either way, and weigh 0 (`exponent`).
        let mut scores = [f32::NEG_INFINITY; MAX_TILE];
        for (sc, a) in scores.iter_mut().zip(acc).take(tile.valid) {
            *sc = match alg.score {
                ScoreScale::Scaled => a * qk_scale,
                ScoreScale::Fused => a,
            };
        }
        // 2. Online softmax (base 2); a row with no finite maximum yet keeps P = 0.
        let row_max = scores[..n]
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, f32::max);
        let tile_max = match alg.score {
            ScoreScale::Scaled => row_max,
            ScoreScale::Fused => row_max * qk_scale,
        };
        let m_new = alg.next_max(self.m, tile_max);
        let base = if m_new == f32::NEG_INFINITY {
            0.0
        } else {
            m_new
        };
        let alpha = exp2(self.m - base);
        let mut p = [0f32; MAX_TILE];
        for (pj, &sc) in p.iter_mut().zip(&scores[..n]) {
            *pj = exp2(exponent(alg.score, sc, qk_scale, base));
        }
        let mut rounded = p;
        for x in rounded[..n].iter_mut() {
            *x = alg.round_p(*x);
        }
        if alg.row_sum != RowSum::Mma {
            let summed = match alg.row_sum {
                RowSum::F32P => &p,
                _ => &rounded,
            };
            for (lane, lq) in self.l_quad.iter_mut().enumerate() {
                let mut part = 0f32;
                for block in summed[..n].chunks(2 * QUAD) {
                    part += block[2 * lane];
                    part += block[2 * lane + 1];
                }
                *lq = lq.mul_add(alpha, part);
            }
        }
        self.m = m_new;
        // 3. P·V, one step at a time; with `row_sum = "mma"` l is one more column, of ones
        //    (kept in l_quad[0], the other three lanes' shares 0, so that the quad's sum is l).
        let mma_l = alg.row_sum == RowSum::Mma;
        let steps = |o: &mut [f32; D], l: &mut f32| {
            for ks in (0..n).step_by(alg.mma_k) {
                let step = &rounded[ks..ks + alg.mma_k];
                if mma_l {
                    match alg.accumulator {
                        Accumulator::F32 => {
                            let mut part = 0f32;
                            for &pj in step {
                                part += pj; // p · 1, exact
                            }
                            *l += part;
                        }
                        Accumulator::Fp22 => *l = fp22_step(*l, step.iter().map(|&pj| pj as f64)),
                    }
                }
                match alg.accumulator {
                    Accumulator::F32 => {
                        let mut part = [0f32; D];
                        for (j, &pj) in rounded.iter().enumerate().skip(ks).take(alg.mma_k) {
                            let vrow = &tile.v[j * D..][..D];
                            for (px, &vx) in part.iter_mut().zip(vrow) {
                                *px += pj * vx;
                            }
                        }
                        for (x, px) in o.iter_mut().zip(part) {
                            *x += px;
                        }
                    }
                    Accumulator::Fp22 => {
                        for (d, x) in o.iter_mut().enumerate() {
                            let products = rounded[ks..ks + alg.mma_k]
                                .iter()
                                .enumerate()
                                .map(|(i, &pj)| pj as f64 * tile.v[(ks + i) * D + d] as f64);
                            *x = fp22_step(*x, products);
                        }
                    }
                }
            }
        };
        match alg.pv {
            PvAccumulation::Running => {
                for x in self.o.iter_mut() {
                    *x *= alpha;
                }
                let mut l = self.l_quad[0] * alpha;
                steps(&mut self.o, &mut l);
                if mma_l {
                    self.l_quad[0] = l;
                }
            }
            PvAccumulation::PerTile => {
                let mut ot = [0f32; D];
                let mut lt = 0f32;
                steps(&mut ot, &mut lt);
                for (x, t) in self.o.iter_mut().zip(ot) {
                    *x = x.mul_add(alpha, t);
                }
                if mma_l {
                    self.l_quad[0] = self.l_quad[0].mul_add(alpha, lt);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{KV_TILE, Running, Tile};
    use crate::emulation::Algorithm;

    /// Random-looking but fixed values in [-2, 2), as E4M3 decodes would give.
    fn values(n: usize, salt: u32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| {
                let h = (i.wrapping_mul(2_654_435_761) ^ salt.wrapping_mul(40_503)) >> 8;
                crate::fp8::decode(crate::fp8::encode((h % 4096) as f32 / 1024.0 - 2.0))
            })
            .collect()
    }

    #[test]
    fn a_fused_exponent_rounds_once_where_a_scaled_one_rounds_the_score_first() {
        use super::exponent;
        use crate::kernels::ScoreScale;
        // a·c = 1 + 2^-22 + 2^-46: f32 keeps 1 + 2^-22, so the scaled score less that base is 0,
        // while the fused exponent keeps the 2^-46 the product's rounding dropped.
        let (a, c) = (1.0 + f32::EPSILON, 1.0 + f32::EPSILON);
        let base = a * c;
        assert_eq!(exponent(ScoreScale::Scaled, a * c, c, base), 0.0);
        assert_eq!(exponent(ScoreScale::Fused, a, c, base), 2f32.powi(-46));
        // A key the row does not see stays -inf, whatever the scale (-inf · 0 would be NaN).
        for scale in [c, 0.0] {
            assert_eq!(
                exponent(ScoreScale::Fused, f32::NEG_INFINITY, scale, base),
                f32::NEG_INFINITY
            );
        }
    }

    #[test]
    fn a_fused_step_weighs_each_key_by_the_fused_exponent_not_the_scaled_one() {
        use super::super::exp2::exp2;
        use super::exponent;
        use crate::kernels::{RowSum, ScoreScale};
        const D: usize = 64;
        // Keys 0 and 2 score a0 (the maximum) and a1 exactly (q picks row 0 of K), key 1 scores
        // -1000 (weight 0), and a scale for which the two forms weigh key 2 differently, found
        // by search.
        let weight = |form, a1: f32, c: f32, base: f32| exp2(exponent(form, a1, c, base));
        let (a0, a1, c) = (1..400)
            .flat_map(|k| (1..64).map(move |a1| (k, a1)))
            .map(|(k, a1)| (64.0f32, a1 as f32, 1.0 + k as f32 * f32::EPSILON))
            .find(|&(a0, a1, c)| {
                let base = a0 * c;
                weight(ScoreScale::Fused, a1, c, base)
                    != weight(ScoreScale::Scaled, a1 * c, c, base)
            })
            .expect("a scale where one rounding fewer changes a weight");
        let mut q = [0f32; D];
        q[0] = 1.0;
        let mut k = vec![0f32; D * KV_TILE];
        k[0] = a0;
        k[1] = -1000.0;
        k[2] = a1;
        let v = values(KV_TILE * D, 7);
        let tile = Tile {
            k: &k,
            v: &v,
            valid: 3,
        };
        let alg = |score| Algorithm {
            row_sum: RowSum::F32P,
            score,
            ..Algorithm::STAGE_C
        };
        let (mut fused, mut scaled) = (Running::<D>::new(), Running::<D>::new());
        fused.step_general(&q, &tile, c, &alg(ScoreScale::Fused));
        scaled.step_general(&q, &tile, c, &alg(ScoreScale::Scaled));
        // Both take the maximum as a0 · c rounded once; the weights then part.
        let base = a0 * c;
        assert_eq!(fused.m.to_bits(), base.to_bits());
        assert_eq!(scaled.m.to_bits(), base.to_bits());
        // Lane 1 of the quad sums keys 2 and 3 (key 3 is past the valid ones): 0 + p2 + 0.
        let expect = weight(ScoreScale::Fused, a1, c, base);
        assert_eq!(fused.l_quad[1].to_bits(), expect.to_bits());
        assert_ne!(fused.l_quad[1].to_bits(), scaled.l_quad[1].to_bits());
    }

    #[test]
    fn fp22_keeps_thirteen_fraction_bits_truncated_toward_zero() {
        use super::fp22;
        assert_eq!(fp22(1.0), 1.0);
        // 1 + 2^-13 is kept, 1 + 2^-14 is not; negative values truncate toward zero too.
        assert_eq!(fp22(1.0 + 2f64.powi(-13)), 1.0 + 2f32.powi(-13));
        assert_eq!(fp22(1.0 + 2f64.powi(-14)), 1.0);
        assert_eq!(fp22(-(1.0 + 1.9 * 2f64.powi(-13))), -(1.0 + 2f32.powi(-13)));
        assert_eq!(fp22(3.0 * 2f64.powi(-20)), 3.0 * 2f32.powi(-20));
        assert!(fp22(f64::NAN).is_nan());
        assert_eq!(fp22(f64::NEG_INFINITY), f32::NEG_INFINITY);
    }

    #[test]
    fn an_fp22_step_truncates_every_term_to_the_largest_ones_thirteen_fraction_bits() {
        use super::fp22_step;
        // 2^-14 is below the 13th fraction bit of 1: dropped, however many of them.
        let small = std::iter::repeat_n(2f64.powi(-14), 8);
        assert_eq!(fp22_step(1.0, small), 1.0);
        // Summed exactly they would make 2^-11, which fits: the alignment is what drops them.
        assert_eq!(
            super::fp22(1.0 + 8.0 * 2f64.powi(-14)),
            1.0 + 2f32.powi(-11)
        );
        // Without a large term the same products are kept.
        assert_eq!(
            fp22_step(0.0, std::iter::repeat_n(2f64.powi(-14), 8)),
            2f32.powi(-11)
        );
        // Negative terms truncate toward zero; the largest may be a product.
        assert_eq!(fp22_step(2f32.powi(-14), [-1.0, 3.0].into_iter()), 2.0);
        // Symmetric in sign: negating every term negates the step (the implementation model's
        // statistical bound on the truncated products rests on it, src/reference/model.rs).
        let terms = [0.3, -1.7e-4, 2.5e-5, 1.1, -3.3e-6];
        let up = fp22_step(0.7, terms.into_iter());
        assert_eq!(fp22_step(-0.7, terms.iter().map(|t| -t)), -up);
        assert_ne!(
            up as f64,
            0.7 + terms.iter().sum::<f64>(),
            "the step truncated something"
        );
    }

    #[test]
    fn general_path_is_stage_c_bit_for_bit_whether_the_maximum_moves_or_lags() {
        const D: usize = 64;
        let q: [f32; D] = std::array::from_fn(|x| values(D, 1)[x]);
        let (k1, v1, v2) = (
            values(D * KV_TILE, 2),
            values(KV_TILE * D, 3),
            values(KV_TILE * D, 5),
        );
        // The second tile's keys scaled so that its maximum passes the first's by 4 (at
        // threshold 8 m lags, at 0 it moves) and by 40 (m moves at either).
        let k2_drawn = values(D * KV_TILE, 4);
        let max_of = |k: &[f32], valid: usize| {
            (0..valid)
                .map(|j| (0..D).map(|x| q[x] * k[x * KV_TILE + j]).sum::<f32>())
                .fold(f32::NEG_INFINITY, f32::max)
        };
        let (t1, t2) = (max_of(&k1, KV_TILE), max_of(&k2_drawn, 37));
        assert!(t1 > 1.0 && t2 > 1.0, "{t1} {t2}");
        let mut moved = Vec::new();
        for pass in [4.0f32, 40.0] {
            let boost = (t1 + pass) / t2;
            let k2: Vec<f32> = k2_drawn.iter().map(|x| x * boost).collect();
            let tiles = [
                Tile {
                    k: &k1,
                    v: &v1,
                    valid: KV_TILE,
                },
                Tile {
                    k: &k2,
                    v: &v2,
                    valid: 37,
                },
            ];
            for rescale_threshold in [0, 8] {
                let alg = Algorithm {
                    rescale_threshold,
                    ..Algorithm::STAGE_C
                };
                // A scale of 1 spreads the weights over enough binades that the order of l's
                // and O's sums shows in their bits (at 0.3 summing l key by key went unnoticed).
                let (mut fast, mut general) = (Running::<D>::new(), Running::<D>::new());
                let mut m_first = f32::NAN;
                for t in &tiles {
                    fast.step(&q, t, 1.0, &alg);
                    general.step_general(&q, t, 1.0, &alg);
                    if m_first.is_nan() {
                        m_first = fast.m;
                    }
                }
                assert_eq!(fast.m.to_bits(), general.m.to_bits());
                assert_eq!(
                    fast.l_quad.map(f32::to_bits),
                    general.l_quad.map(f32::to_bits)
                );
                assert_eq!(fast.o.map(f32::to_bits), general.o.map(f32::to_bits));
                moved.push((pass, rescale_threshold, fast.m != m_first));
            }
        }
        // Both ways of the rule ran: m lagged only where the tile passed it by less than 8.
        assert_eq!(
            moved,
            [
                (4.0, 0, true),
                (4.0, 8, false),
                (40.0, 0, true),
                (40.0, 8, true)
            ]
        );
    }

    #[test]
    fn with_l_on_the_tensor_cores_l_is_the_bits_of_a_column_of_o_whose_values_are_ones() {
        use crate::kernels::{Accumulator, PPrecision, PvAccumulation, RowSum};
        const D: usize = 64;
        const ONES: usize = 5; // the column of V that is all ones
        let q: [f32; D] = std::array::from_fn(|x| values(D, 11)[x]);
        let k: Vec<Vec<f32>> = (0..3).map(|t| values(D * KV_TILE, 12 + t)).collect();
        let v: Vec<Vec<f32>> = (0..3)
            .map(|t| {
                let mut v = values(KV_TILE * D, 15 + t);
                for row in v.chunks_mut(D) {
                    row[ONES] = 1.0;
                }
                v
            })
            .collect();
        for pv in [PvAccumulation::Running, PvAccumulation::PerTile] {
            for accumulator in [Accumulator::F32, Accumulator::Fp22] {
                for (p, mma_k) in [(PPrecision::F16, 16), (PPrecision::E4m3, 32)] {
                    let alg = Algorithm {
                        row_sum: RowSum::Mma,
                        pv,
                        accumulator,
                        p,
                        mma_k,
                        ..Algorithm::STAGE_C
                    };
                    let mut run = Running::<D>::new();
                    for (t, valid) in [KV_TILE, KV_TILE, 37].into_iter().enumerate() {
                        let tile = Tile {
                            k: &k[t],
                            v: &v[t],
                            valid,
                        };
                        run.step_general(&q, &tile, 1.0, &alg);
                    }
                    let what = format!("{pv:?} {accumulator:?} {p:?}");
                    assert_eq!(run.l_quad[0].to_bits(), run.o[ONES].to_bits(), "{what}");
                    assert_eq!(run.l_quad[1..], [0.0; 3], "{what}");
                    assert!(
                        run.l_quad[0] > 1.0,
                        "{what}: the maximum's own weight and more"
                    );
                }
            }
        }
    }

    #[test]
    fn a_first_tile_whose_scores_overflow_to_minus_infinity_leaves_both_paths_finite_and_equal() {
        // The first tile's scaled maximum is -inf (a huge factor times negative sums: with the
        // scale fused, so is every key's exponent), the second's scores are finite: neither
        // path may make exp2(-inf + inf) = NaN of the first.
        const D: usize = 64;
        let q = [1f32; D];
        let (k_neg, k_pos, v) = (
            vec![-1f32; D * KV_TILE],
            vec![0f32; D * KV_TILE],
            values(KV_TILE * D, 6),
        );
        let tiles = [
            Tile {
                k: &k_neg,
                v: &v,
                valid: KV_TILE,
            },
            Tile {
                k: &k_pos,
                v: &v,
                valid: KV_TILE,
            },
        ];
        let (mut fast, mut general) = (Running::<D>::new(), Running::<D>::new());
        for t in &tiles {
            fast.step(&q, t, 1e38, &Algorithm::STAGE_C);
            general.step_general(&q, t, 1e38, &Algorithm::STAGE_C);
        }
        assert!(fast.l_quad.iter().chain(&fast.o).all(|x| x.is_finite()));
        assert_eq!(fast.l_quad.iter().sum::<f32>(), KV_TILE as f32);
        assert_eq!(
            fast.l_quad.map(f32::to_bits),
            general.l_quad.map(f32::to_bits)
        );
        assert_eq!(fast.o.map(f32::to_bits), general.o.map(f32::to_bits));
    }
}
