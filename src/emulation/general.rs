//! One KV tile of any [`Algorithm`] the manifest can describe (the emulation's general path):
//! scores in `mma_k`-deep f32 steps, online softmax in base 2, P rounded to its precision, the
//! row sum over four lanes' partial sums as the kernels' quads keep them, and P·V either into
//! O as it runs or into a tile accumulator added as fma(O, alpha, Ô). On Stage C's algorithm it
//! gives the bits of the vectorized path (`general_path_is_stage_c_bit_for_bit`).

use super::exp2::exp2;
use super::{Algorithm, MAX_TILE, QUAD, Running, Tile};
use crate::kernels::{PvAccumulation, RowSum};

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
        let mut scores = [f32::NEG_INFINITY; MAX_TILE];
        for (sc, a) in scores.iter_mut().zip(acc).take(tile.valid) {
            *sc = a * qk_scale;
        }
        // 2. Online softmax (base 2); a row with no finite maximum yet keeps P = 0.
        let tile_max = scores[..n]
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, f32::max);
        let m_new = self.m.max(tile_max);
        let base = if m_new == f32::NEG_INFINITY {
            0.0
        } else {
            m_new
        };
        let alpha = exp2(self.m - base);
        let mut p = [0f32; MAX_TILE];
        for (pj, &sc) in p.iter_mut().zip(&scores[..n]) {
            *pj = exp2(sc - base);
        }
        let mut rounded = p;
        for x in rounded[..n].iter_mut() {
            *x = alg.round_p(*x);
        }
        let summed = match alg.row_sum {
            RowSum::RoundedP => &rounded,
            RowSum::F32P => &p,
        };
        for (lane, lq) in self.l_quad.iter_mut().enumerate() {
            let mut part = 0f32;
            for block in summed[..n].chunks(2 * QUAD) {
                part += block[2 * lane];
                part += block[2 * lane + 1];
            }
            *lq = lq.mul_add(alpha, part);
        }
        self.m = m_new;
        // 3. P·V, one step at a time.
        let steps = |o: &mut [f32; D]| {
            for ks in (0..n).step_by(alg.mma_k) {
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
        };
        match alg.pv {
            PvAccumulation::Running => {
                for x in self.o.iter_mut() {
                    *x *= alpha;
                }
                steps(&mut self.o);
            }
            PvAccumulation::PerTile => {
                let mut ot = [0f32; D];
                steps(&mut ot);
                for (x, t) in self.o.iter_mut().zip(ot) {
                    *x = x.mul_add(alpha, t);
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
    fn general_path_is_stage_c_bit_for_bit() {
        const D: usize = 64;
        let q: [f32; D] = std::array::from_fn(|x| values(D, 1)[x]);
        let (k1, v1, k2, v2) = (
            values(D * KV_TILE, 2),
            values(KV_TILE * D, 3),
            values(D * KV_TILE, 4),
            values(KV_TILE * D, 5),
        );
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
        let (mut fast, mut general) = (Running::<D>::new(), Running::<D>::new());
        for t in &tiles {
            fast.step(&q, t, 0.3);
            general.step_general(&q, t, 0.3, &Algorithm::STAGE_C);
        }
        assert_eq!(fast.m.to_bits(), general.m.to_bits());
        assert_eq!(
            fast.l_quad.map(f32::to_bits),
            general.l_quad.map(f32::to_bits)
        );
        assert_eq!(fast.o.map(f32::to_bits), general.o.map(f32::to_bits));
    }
}
