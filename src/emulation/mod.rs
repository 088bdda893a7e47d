//! The Stage-C algorithm on the CPU, in the kernel's precisions. It mirrors
//! cuda/sdpa_fp8_stage_c_mma.cu step for step; keep the two in step.
//!
//! Per query row, the KV tiles of [`KV_TILE`] keys are dealt to `kv_split` splits (split k
//! takes tiles k, k + kv_split, ...). Within a split, for each of its tiles:
//! 1. scores: FP8 codes decoded exactly to f16; Q·Kᵀ in f32, one 16-wide k-step at a time
//!    (one tensor-core MMA per step), left unscaled (`acc`);
//! 2. online softmax in base 2, the scale `c = (q_scale * k_scale) * (softmax_scale * log2 e)`
//!    fused into the exponent (the manifest's `score = "fused"`): running max
//!    `m_new = t > m_old + τ ? t : m_old` for the tile's `t = max(acc) * c` and the manifest's
//!    `rescale_threshold` τ (8: the maximum lags by up to 8, a factor of 2^8, so O's rescale
//!    is rare),
//!    `alpha = exp2(m_old - m_new)`, `p = f16(exp2(fma(acc, c, -m_new)))` (up to 2^τ);
//! 3. `O = O * alpha` and `l = l * alpha`, then one 16-key step at a time `O += P·V` and
//!    `l += P·1` (`row_sum = "mma"`: the row sum is one more column of the MMA, of ones), f32
//!    accumulation (each step's sum from 0 in key order, then added).
//!
//! The splits merge as the kernel does:
//! `M = max m_k`, `O = O_0 * exp2(m_0 - M)` then `O = fma(O_k, exp2(m_k - M), O)`, likewise `l`;
//! finally `O * (v_scale / l)` rounded to f16. Keys past S_k score -inf (masked).
//!
//! Masks and GQA (docs/DESIGN.md "Problems"): query head h reads K/V head h / (H_q / H_kv);
//! under the causal mask row i sees keys j <= i + S_k - S_q, its other keys score -inf. A row
//! walks only the tiles it sees a key of: a tile the mask hides wholly from a row changes
//! nothing in the kernel either (its tile maximum is -inf, so alpha = 1 and P = 0: the state
//! keeps its bits), so skipping it is the same arithmetic. A row that sees no key is written
//! as zeros, as the kernel writes it (its l is 0).
//! Two roles: the `cpu` backend, and the same-precision yardstick of the relative gate.
//!
//! Other kernels (cuda/kernels.toml) are emulated by [`Algorithm`]: their tile, k-step, P's
//! precision, which P the row sum adds, how a tile's P·V reaches O and how the scale meets the
//! scores (`general.rs`; Stage D: 128-key tiles, k32, P in e4m3, l from the f32 P, Ô per tile
//! added as fma(O, alpha, Ô), the scale fused into the exponent's fma). For
//! a kernel whose products run on FP8 tensor cores (the manifest's `accumulator = "fp22"`), each
//! 32-deep step is aligned and truncated as those tensor cores do (`general::fp22_step`): on the
//! H100, 52-100% of Stage D's output elements are the emulation's bits, and its slope on them is
//! 1 within 1e-5 (src/scale_fit.rs).

mod algorithm;
mod exp2;
mod general;

pub use algorithm::{Algorithm, MAX_TILE};
use half::f16;
use rayon::prelude::*;

use exp2::exp2;

use crate::fp8;
use crate::problem::Problem;
use crate::rows::RowSet;

/// Query head `bh`'s factor from the raw Q·K sums to base-2 scores, as the kernel forms it:
/// `(q_scale * k_scale) * (softmax_scale * log2 e)`, K's scale that of the K/V head it reads
/// (the GPU emulation takes it from here).
pub fn qk_scale(p: &Problem, bh: usize) -> f32 {
    let kvh = p.shape.kv_head_of(bh);
    (p.q.scales[bh] * p.k.scales[kvh]) * (p.softmax_scale * std::f32::consts::LOG2_E)
}

/// Keys per KV tile; the kernel's BLOCK_N, checked against the compiled kernel at run time.
pub const KV_TILE: usize = crate::kernels::STAGE_C_BLOCK_N as usize;
/// The kernel's default KV_SPLIT. A GPU run emulates the split its kernel publishes
/// (`SDPA_KV_SPLIT`); the CPU backend uses this one.
pub const KV_SPLIT: usize = 2;
/// Lanes that share one row of an MMA accumulator (a quad): with `row_sum` rounded-p or f32-p
/// each keeps its own partial sum; with `mma` (Stage C) lane 0's share is the whole l and the
/// other three stay 0.
const QUAD: usize = 4;
/// Depth of one tensor-core MMA step (m16n8k16).
const K_STEP: usize = 16;
/// Query rows per parallel work item (not a numerical parameter: rows are independent).
pub const ROW_CHUNK: usize = 64;

/// Planted defects that let tests prove the gates catch a broken backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Defect {
    #[default]
    None,
    /// Never processes the last KV tile (a classic loop-bound bug).
    SkipLastKvTile,
    /// Never writes the last row of the last (batch, head).
    LeaveRowUnwritten,
    /// Multiplies V's scale by 1 + 2^-9 (0.2%): for Stage D's algorithm a scale slip below its
    /// bounds and relative gate, which only the slope on the emulation sees (src/scale_fit.rs);
    /// Stage C's tighter gates see it too.
    VScaleOff,
}

/// The clean emulation's output of the rows of `rows`, in their compact layout (the whole
/// output when every row is checked), computed once per problem, split and set of rows: the
/// yardstick of a run and the `cpu` backend's checked launch of the same problem are the same
/// O(S²) computation, so the second is a copy of the first.
pub fn clean(p: &Problem, alg: Algorithm, rows: &RowSet) -> Vec<f16> {
    type Memo = Option<((u64, Algorithm, [u8; 32]), std::sync::Arc<Vec<f16>>)>;
    static LAST: std::sync::Mutex<Memo> = std::sync::Mutex::new(None);
    let key = (p.id, alg, rows.fingerprint());
    if let Some((k, out)) = LAST.lock().unwrap_or_else(|e| e.into_inner()).as_ref()
        && *k == key
    {
        return out.to_vec();
    }
    let mut out = vec![crate::metrics::POISON; rows.count() * p.shape.d];
    run_rows(p, alg, Defect::None, rows, &mut out);
    *LAST.lock().unwrap_or_else(|e| e.into_inner()) = Some((key, std::sync::Arc::new(out.clone())));
    out
}

/// Runs the emulation into `out` (`[B, H, S, D]` f16). Elements the algorithm does not write
/// keep whatever `out` held, so a poisoned buffer exposes unwritten rows.
pub fn run(p: &Problem, alg: Algorithm, defect: Defect, out: &mut [f16]) {
    run_rows(p, alg, defect, &RowSet::all(&p.shape), out);
}

/// As [`run`], for the rows of `rows` only, into their compact layout.
pub fn run_rows(p: &Problem, alg: Algorithm, defect: Defect, rows: &RowSet, out: &mut [f16]) {
    match p.shape.d {
        64 => run_rows_d::<64>(p, alg, defect, rows, out),
        128 => run_rows_d::<128>(p, alg, defect, rows, out),
        d => panic!("D = {d} was refused when the shape was read"),
    }
}

fn run_rows_d<const D: usize>(
    p: &Problem,
    alg: Algorithm,
    defect: Defect,
    rows: &RowSet,
    out: &mut [f16],
) {
    let kv_split = alg.kv_split;
    let tile_keys = alg.block_n;
    assert!(kv_split >= 1 && tile_keys <= MAX_TILE && tile_keys.is_multiple_of(alg.mma_k));
    let sh = &p.shape;
    let sk = sh.sk;
    assert_eq!(sh.d, D);
    assert_eq!(out.len(), rows.count() * D);
    let (q_len, kv_len) = (sh.s * D, sk * D);
    let n_tiles = sk.div_ceil(tile_keys);
    let s_pad = n_tiles * tile_keys;
    let table: [f32; 256] = std::array::from_fn(|c| fp8::decode(c as u8));
    let heads = sh.heads();
    rows.split_heads(out, D)
        .into_par_iter()
        .enumerate()
        .for_each(|(bh, out_head)| {
            let kvh = sh.kv_head_of(bh);
            let kv = kvh * kv_len..(kvh + 1) * kv_len;
            let (qc, kc, vc) = (
                &p.q.codes[bh * q_len..(bh + 1) * q_len],
                &p.k.codes[kv.clone()],
                &p.v.codes[kv],
            );
            // K tile by tile, each transposed to [D][tile keys] so a k-step vectorizes over
            // keys; padded keys are 0. V as [S_pad][D].
            let mut kt = vec![0f32; D * s_pad];
            for (j, row) in kc.chunks(D).enumerate() {
                let tile = &mut kt[j / tile_keys * tile_keys * D..][..tile_keys * D];
                for (x, &c) in row.iter().enumerate() {
                    tile[x * tile_keys + j % tile_keys] = table[c as usize];
                }
            }
            let mut vd = vec![0f32; s_pad * D];
            for (slot, &c) in vd.iter_mut().zip(vc) {
                *slot = table[c as usize];
            }
            let qk_scale = qk_scale(p, bh);
            let v_scale = match defect {
                Defect::VScaleOff => p.v.scales[kvh] * (1.0 + 2f32.powi(-9)),
                _ => p.v.scales[kvh],
            };
            let tiles_run = match defect {
                Defect::SkipLastKvTile => n_tiles - 1,
                _ => n_tiles,
            };
            let mine = rows.rows(bh);
            out_head
                .par_chunks_mut(ROW_CHUNK * D)
                .zip(mine.par_chunks(ROW_CHUNK))
                .for_each(|(out_rows, chunk_rows)| {
                    let qs: Vec<[f32; D]> = chunk_rows
                        .iter()
                        .map(|&i| std::array::from_fn(|x| table[qc[i * D + x] as usize]))
                        .collect();
                    let seen: Vec<usize> = chunk_rows.iter().map(|&i| sh.visible_keys(i)).collect();
                    // A chunk's rows walk the tiles together, so each tile is read from cache
                    // once per chunk; each row's arithmetic is the same as alone. Tile t goes
                    // to split t % kv_split, in ascending order within the split; a row takes
                    // the tiles it sees a key of, its keys past what it sees masked.
                    let mut states: Vec<Running<D>> =
                        vec![Running::new(); chunk_rows.len() * kv_split];
                    for t in 0..tiles_run {
                        let first = t * tile_keys;
                        for (r, q) in qs.iter().enumerate() {
                            if seen[r] <= first {
                                continue;
                            }
                            let tile = Tile {
                                k: &kt[first * D..][..tile_keys * D],
                                v: &vd[first * D..][..tile_keys * D],
                                valid: tile_keys.min(seen[r] - first),
                            };
                            let state = &mut states[r * kv_split + t % kv_split];
                            if alg.is_stage_c() {
                                state.step(q, &tile, qk_scale, &alg);
                            } else {
                                state.step_general(q, &tile, qk_scale, &alg);
                            }
                        }
                    }
                    for (((out_row, &i), splits), &keys) in out_rows
                        .chunks_mut(D)
                        .zip(chunk_rows)
                        .zip(states.chunks(kv_split))
                        .zip(&seen)
                    {
                        if defect == Defect::LeaveRowUnwritten && bh == heads - 1 && i == sh.s - 1 {
                            continue;
                        }
                        if keys == 0 {
                            // A row that sees no key: the kernel's l is 0 and it writes zeros.
                            out_row.fill(f16::ZERO);
                            continue;
                        }
                        let splits: Vec<SplitState<D>> =
                            splits.iter().map(Running::finish).collect();
                        let (l, o) = merge(&splits);
                        let f = v_scale / l;
                        for (dst, x) in out_row.iter_mut().zip(o) {
                            *dst = output(x * f);
                        }
                    }
                });
        });
}

/// One KV tile: K as [D][tile keys], V as [tile keys][D]; keys from `valid` on are masked.
struct Tile<'a> {
    k: &'a [f32],
    v: &'a [f32],
    valid: usize,
}

/// One split's online-softmax state for one row, while its tiles stream by.
#[derive(Clone)]
struct Running<const D: usize> {
    m: f32,
    l_quad: [f32; QUAD],
    o: [f32; D],
}

/// A split's final state: `l = (l_0 + l_1) + (l_2 + l_3)` over the quad (l_0 itself, exactly,
/// where the row sum is P·1: the other three are 0).
struct SplitState<const D: usize> {
    m: f32,
    l: f32,
    o: [f32; D],
}

impl<const D: usize> Running<D> {
    fn new() -> Self {
        Running {
            m: f32::NEG_INFINITY,
            l_quad: [0.0; QUAD],
            o: [0.0; D],
        }
    }

    /// One tile of this split for query row `q`. With AVX2 and FMA on the CPU the same code is
    /// compiled wider: IEEE operations round the same at any width, Rust never contracts
    /// `a * b + c`, and `mul_add` is exact either way, so the bits do not change
    /// (`the_emulation_output_is_pinned_bit_for_bit`).
    fn step(&mut self, q: &[f32; D], tile: &Tile, qk_scale: f32, alg: &Algorithm) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has both features, checked just above.
            return unsafe { self.step_avx2(q, tile, qk_scale, alg) };
        }
        self.step_any(q, tile, qk_scale, alg)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn step_avx2(&mut self, q: &[f32; D], tile: &Tile, qk_scale: f32, alg: &Algorithm) {
        self.step_any(q, tile, qk_scale, alg)
    }

    #[inline(always)]
    fn step_any(&mut self, q: &[f32; D], tile: &Tile, qk_scale: f32, alg: &Algorithm) {
        // 1. Scores, one MMA k-step at a time.
        let mut acc = [0f32; KV_TILE];
        for ks in (0..D).step_by(K_STEP) {
            let mut part = [0f32; KV_TILE];
            for (x, &qx) in q.iter().enumerate().skip(ks).take(K_STEP) {
                let krow = &tile.k[x * KV_TILE..][..KV_TILE];
                for (pj, &kj) in part.iter_mut().zip(krow) {
                    *pj += qx * kj;
                }
            }
            for (a, pj) in acc.iter_mut().zip(part) {
                *a += pj;
            }
        }
        // Unscaled: the scale meets the scores in the exponent's fma.
        let mut scores = [f32::NEG_INFINITY; KV_TILE];
        for (sc, a) in scores.iter_mut().zip(acc).take(tile.valid) {
            *sc = a;
        }
        // 2. Online softmax (base 2), P rounded to f16. The scale is positive, so the maximum
        // scaled is the scaled maximum.
        // A row with no finite maximum yet keeps P = 0 and alpha = 0 (not exp2(-inf + inf) =
        // NaN): the kernel's running maximum starts at -FLT_MAX, and the general path and the
        // GPU emulation take base 0 there too. Only a scaled maximum that overflows to -inf
        // reaches it.
        // The maximum moves only past the rescale threshold (`Algorithm::next_max`).
        let tile_max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max) * qk_scale;
        let m_new = alg.next_max(self.m, tile_max);
        let base = if m_new == f32::NEG_INFINITY {
            0.0
        } else {
            m_new
        };
        let alpha = exp2(self.m - base);
        let mut p = [0f32; KV_TILE];
        for (pj, sc) in p.iter_mut().zip(scores) {
            // A key the row does not see weighs 0 whatever the scale (general.rs `exponent`).
            *pj = exp2(if sc == f32::NEG_INFINITY {
                sc
            } else {
                sc.mul_add(qk_scale, -base)
            });
        }
        for pj in p.iter_mut() {
            *pj = round_weight_to_f16(*pj);
        }
        self.m = m_new;
        // 3. Rescale O and l, then P·V and P·1 one 16-key step at a time (l in l_quad[0], the
        // other three shares 0: the quad's sum is l).
        for x in self.o.iter_mut() {
            *x *= alpha;
        }
        self.l_quad[0] *= alpha;
        for ks in (0..KV_TILE).step_by(K_STEP) {
            let mut l_part = 0f32;
            for &pj in &p[ks..ks + K_STEP] {
                l_part += pj; // p · 1, exact
            }
            self.l_quad[0] += l_part;
            let mut part = [0f32; D];
            for (j, &pj) in p.iter().enumerate().skip(ks).take(K_STEP) {
                let vrow = &tile.v[j * D..][..D];
                for (px, &vx) in part.iter_mut().zip(vrow) {
                    *px += pj * vx;
                }
            }
            for (x, px) in self.o.iter_mut().zip(part) {
                *x += px;
            }
        }
    }

    fn finish(&self) -> SplitState<D> {
        let l = (self.l_quad[0] + self.l_quad[1]) + (self.l_quad[2] + self.l_quad[3]);
        SplitState {
            m: self.m,
            l,
            o: self.o,
        }
    }
}

/// `f16::from_f32(x).to_f32()` for x in [0, 2^9) (a P value: at most 2^rescale_threshold,
/// [`crate::kernels::MAX_RESCALE_THRESHOLD`] = 8, where the maximum is allowed to lag; with the
/// scale fused into the exponent the row maximum's own weight may pass that by a few f32 ulps),
/// without branches so it vectorizes:
/// round to nearest even at 10 mantissa bits, or to a multiple of 2^-24 below 2^-14 (f16's
/// subnormals). Proven equal to `half` on every f32 in [0, 2^9) by a test.
#[inline(always)]
fn round_weight_to_f16(x: f32) -> f32 {
    const MIN_NORMAL: f32 = 1.0 / 16384.0; // 2^-14
    const SUB_STEP: f32 = 16_777_216.0; // 2^24
    let b = x.to_bits();
    let normal = f32::from_bits((b + 0x0FFF + ((b >> 13) & 1)) & !0x1FFF);
    let subnormal = (x * SUB_STEP).round_ties_even() * (1.0 / SUB_STEP);
    if x < MIN_NORMAL { subnormal } else { normal }
}

/// The f16 NaN every NaN output is written as, on the host and on the GPU: a NaN's sign and
/// payload are not the same on both (nor promised by Rust), its NaN-ness is.
pub const NAN_BITS: u16 = 0x7FFF;

/// An output element: `x` rounded to f16 (to nearest, ties to even), NaN as [`NAN_BITS`].
fn output(x: f32) -> f16 {
    if x.is_nan() {
        f16::from_bits(NAN_BITS)
    } else {
        f16::from_f32(x)
    }
}

/// Merges the splits' states into (l, O) as the kernel's split 0 does. One split is taken
/// as is (the kernel skips the merge then).
fn merge<const D: usize>(splits: &[SplitState<D>]) -> (f32, [f32; D]) {
    let first = &splits[0];
    if splits.len() == 1 {
        return (first.l, first.o);
    }
    let m_all = splits.iter().map(|s| s.m).fold(f32::NEG_INFINITY, f32::max);
    let f = exp2(first.m - m_all);
    let mut l = first.l * f;
    let mut o = first.o.map(|x| x * f);
    for other in &splits[1..] {
        let a = exp2(other.m - m_all);
        l = other.l.mul_add(a, l);
        for (x, &y) in o.iter_mut().zip(&other.o) {
            *x = y.mul_add(a, *x);
        }
    }
    (l, o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::POISON;
    use crate::reference::References;
    use crate::shapes::Shape;

    fn problem(b: usize, h: usize, s: usize, qk_std: f64) -> Problem {
        let shape = Shape {
            qk_std,
            ..Shape::new("t", b, h, s, 64)
        };
        Problem::new(&shape, 0)
    }

    #[test]
    fn the_clean_output_is_memoized_per_problem_not_per_shape_and_seed() {
        let shape = problem(1, 2, 70, 1.0).shape;
        let p = Problem::new(&shape, 0);
        let other = crate::problem::Problem::with_host_defect(
            &shape,
            0,
            crate::problem::HostDefect::Scale447,
        );
        let first = clean(&p, Algorithm::STAGE_C, &all(&p));
        assert_eq!(first, emulate(&p, Defect::None));
        let theirs = clean(&other, Algorithm::STAGE_C, &all(&other));
        assert_ne!(
            theirs, first,
            "same shape and seed, other codes: not the memo's answer"
        );
        assert_eq!(theirs, emulate(&other, Defect::None));
        assert_eq!(
            clean(&p.clone(), Algorithm::STAGE_C, &all(&p.clone())),
            first
        );
    }

    fn all(p: &Problem) -> RowSet {
        RowSet::all(&p.shape)
    }

    fn emulate(p: &Problem, defect: Defect) -> Vec<f16> {
        let mut out = vec![POISON; p.output_len()];
        run(p, Algorithm::STAGE_C, defect, &mut out);
        out
    }

    /// The self-test's `cfg-rescale` must make rows' maxima climb by more than the rescale
    /// threshold after the first tile of their chain, in both 16-row blocks of a 32-row warp
    /// (normal inputs seldom do since change 32): else `MUTANT_NO_RESCALE` and
    /// `MUTANT_RESCALE_VOTE_FIRST_BLOCK` would hide on it.
    #[test]
    fn cfg_rescale_moves_maxima_after_the_first_tile_in_both_halves_of_a_32_row_warp() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("shapes/default.json");
        let catalog = crate::shapes::ShapeCatalog::load(&path).unwrap();
        let shape = catalog.select("cfg-rescale").unwrap().remove(0);
        let p = Problem::new(&shape, 0);
        let (d, sk) = (shape.d, shape.sk);
        let tau = Algorithm::STAGE_C.rescale_threshold as f32;
        let mut late_moves = [0usize; 2]; // rows whose maximum moved after its chain's first tile
        for bh in 0..shape.heads() {
            let kvh = shape.kv_head_of(bh);
            let c = qk_scale(&p, bh);
            let q = &p.q.codes[bh * shape.s * d..][..shape.s * d];
            let k = &p.k.codes[kvh * sk * d..][..sk * d];
            for i in 0..shape.s {
                let scores: Vec<f32> = (0..shape.visible_keys(i))
                    .map(|j| {
                        let dot: f32 = (0..d)
                            .map(|x| fp8::decode(q[i * d + x]) * fp8::decode(k[j * d + x]))
                            .sum();
                        dot * c
                    })
                    .collect();
                let mut moved_late = false;
                for split in 0..KV_SPLIT {
                    let mut m = f32::NEG_INFINITY;
                    for (n, tile) in scores
                        .chunks(KV_TILE)
                        .skip(split)
                        .step_by(KV_SPLIT)
                        .enumerate()
                    {
                        let t = tile.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                        let next = Algorithm::STAGE_C.next_max(m, t);
                        moved_late |= n > 0 && next != m;
                        m = next;
                    }
                }
                late_moves[(i % 32) / 16] += usize::from(moved_late);
            }
        }
        let rows = shape.heads() * shape.s / 2;
        assert!(tau > 0.0);
        for (half, &n) in late_moves.iter().enumerate() {
            assert!(n * 20 >= rows, "block {half}: {n} of {rows} rows move late");
        }
    }

    /// The emulation is the yardstick of the relative gate and the cpu backend: a change to
    /// its arithmetic (order, precision, rounding) must show here, not pass unnoticed.
    #[test]
    fn the_emulation_output_is_pinned_bit_for_bit() {
        let checksum =
            |p: &Problem| crate::report::f16_checksum(&emulate(p, Defect::None))[..16].to_string();
        // Two heads, two batches, a partial last tile of 6 keys, wide scores: every path.
        assert_eq!(
            checksum(&problem(2, 2, 70, 2.0)),
            "58d598da88bd0e11",
            "the emulation's output changed"
        );
        // Those 17,920 outputs did not see change 31 (the scale fused into the exponent, l as
        // P·1): a change at f32's last bits moves about 1% of f16 outputs; nor change 32 (the
        // maximum lagging by up to 8, log2): each split's chain is one tile. These 51,200 see both
        // (01608d4ad931e488 before change 31, a9d590ad48056eba before change 32).
        assert_eq!(
            checksum(&problem(2, 2, 200, 1.0)),
            "a7f27a728b1d3bfd",
            "the emulation's output changed"
        );
    }

    fn max_err(out: &[f16], reference: &[f64]) -> f64 {
        out.iter()
            .zip(reference)
            .map(|(o, r)| (o.to_f64() - r).abs())
            .fold(
                0.0,
                |a, b| if b.is_nan() { f64::INFINITY } else { a.max(b) },
            )
    }

    #[test]
    fn every_nan_output_is_written_as_the_one_nan_both_engines_write() {
        // The seed system's quantizer writes the E4M3 NaN codes (0x7F, 0xFF): rows that read
        // one come out NaN, through NaNs of whatever sign and payload on the way.
        let shape = problem(1, 2, 100, 1.0).shape;
        let p = Problem::with_host_defect(&shape, 0, crate::problem::HostDefect::SeedQuantizer);
        let out = emulate(&p, Defect::None);
        let nans: Vec<u16> = out
            .iter()
            .filter(|x| x.is_nan())
            .map(|x| x.to_bits())
            .collect();
        assert!(!nans.is_empty(), "the witness: NaN codes give NaN outputs");
        assert!(nans.iter().all(|&b| b == NAN_BITS), "{:#06x?}", &nans[..4]);
    }

    #[test]
    fn only_rows_that_see_no_key_are_zero_and_a_row_of_nan_scores_stays_nan() {
        // S_q 80 > S_k 30, causal: rows 0..=49 see no key. Row 60's Q codes all NaN (0x7F):
        // every score NaN, so its running maximum never moves, as in a row that sees no key,
        // but its output is NaN, not zero (the kernel's l is NaN there, not 0).
        let sh = Shape::parse_inline("1x1x80x64:sk=30:causal")
            .unwrap()
            .unwrap();
        let mut p = Problem::new(&sh, 0);
        p.q.codes[60 * 64..61 * 64].fill(0x7F);
        let out = emulate(&p, Defect::None);
        assert!(
            out[..50 * 64].iter().all(|x| x.to_bits() == 0),
            "rows 0..50 zero"
        );
        assert!(
            out[50 * 64..51 * 64].iter().any(|x| x.to_bits() != 0),
            "row 50 sees a key"
        );
        assert!(
            out[60 * 64..61 * 64]
                .iter()
                .all(|x| x.to_bits() == NAN_BITS),
            "row 60 NaN"
        );
    }

    #[test]
    fn emulation_tracks_the_kernel_reference_closely_on_partial_tiles() {
        // S = 77: two KV tiles, the second with 13 keys; two batches, two heads.
        let p = problem(2, 2, 77, 1.0);
        let refs = References::compute(&p, Algorithm::STAGE_C, &all(&p));
        let err = max_err(&emulate(&p, Defect::None), &refs.kernel);
        assert!(err < 4e-3, "max err {err}");
    }

    #[test]
    fn emulation_handles_a_single_key() {
        let p = problem(1, 1, 1, 1.0);
        let refs = References::compute(&p, Algorithm::STAGE_C, &all(&p));
        let err = max_err(&emulate(&p, Defect::None), &refs.kernel);
        assert!(err < 4e-3, "max err {err}");
    }

    #[test]
    fn online_rescale_keeps_wide_score_ranges_accurate() {
        let p = problem(1, 1, 300, 2.0);
        let refs = References::compute(&p, Algorithm::STAGE_C, &all(&p));
        let err = max_err(&emulate(&p, Defect::None), &refs.kernel);
        assert!(err < 1e-2, "max err {err}");
    }

    #[test]
    fn stage_ds_algorithm_rounds_p_to_e4m3_and_stays_within_the_fp8_models_bound() {
        let d = Algorithm::of(&crate::kernels::project_spec("stage-d"));
        assert!(!d.is_stage_c());
        for text in [
            "1x2x300x64",
            "1x4x77x128:sk=300:hkv=2:causal",
            "2x2x3x64:sk=700",
            "1x2x200x64:sk=70:causal",
        ] {
            let sh = Shape::parse_inline(text).unwrap().unwrap();
            let p = Problem::new(&sh, 1);
            let rows = all(&p);
            let refs = References::compute(&p, d, &rows);
            let out = clean(&p, d, &rows);
            let worst = out
                .iter()
                .zip(&refs.kernel)
                .zip(&refs.kernel_bound)
                .map(|((o, r), b)| {
                    let e = (o.to_f64() - r).abs();
                    if *b > 0.0 {
                        e / b
                    } else if e == 0.0 {
                        0.0
                    } else {
                        f64::INFINITY
                    }
                })
                .fold(0.0, f64::max);
            assert!(worst > 0.0 && worst < 1.0, "{text}: error/bound {worst}");
            // P in e4m3 (3 mantissa bits) moves the output more than P in f16 (10 bits).
            let c = clean(&p, Algorithm::STAGE_C, &rows);
            let (err_d, err_c) = (max_err(&out, &refs.kernel), max_err(&c, &refs.kernel));
            assert!(
                err_d > 1.5 * err_c,
                "{text}: stage D {err_d:.2e}, stage C {err_c:.2e}"
            );
        }
    }

    #[test]
    fn on_flat_positive_v_an_fp22_sum_over_every_key_stagnates_where_per_tile_promotion_does_not() {
        // Stage D promotes each 128-key tile's Ô to f32 (pv = per-tile); a kernel that sums O
        // in the FP8 tensor cores' FP22 steps over every key (pv = running) loses the products
        // below 2^-13 of O. With every product positive that loss only grows: at S_k 16384
        // cuDNN's FP8 SDPA measured 35% short (scripts/stage_d/stagnation.py, its inputs) and
        // Stage D's MUTANT_NO_PROMOTION 28.4% (scripts/stage_d/probe.cu, flat_positive_v).
        use crate::kernels::PvAccumulation;
        let d = Algorithm::of(&crate::kernels::project_spec("stage-d"));
        assert_eq!(d.pv, PvAccumulation::PerTile);
        let unpromoted = Algorithm {
            pv: PvAccumulation::Running,
            ..d
        };
        let sh = Shape::parse_inline("1x1x2x64:sk=16384:dist=flat_positive_v")
            .unwrap()
            .unwrap();
        let p = Problem::new(&sh, 1);
        let rows = all(&p);
        let refs = References::compute(&p, d, &rows);
        assert!(
            refs.kernel.iter().all(|&r| r > 0.5),
            "O is a mean of values above 1/2"
        );
        // How far the output leans from the reference, over the reference's mean.
        let lean = |out: &[f16]| {
            let dev: f64 = out
                .iter()
                .zip(&refs.kernel)
                .map(|(o, r)| o.to_f64() - r)
                .sum();
            dev / refs.kernel.iter().sum::<f64>()
        };
        let (ours, theirs) = (clean(&p, d, &rows), clean(&p, unpromoted, &rows));
        let (promoted, running) = (lean(&ours), lean(&theirs));
        assert!(running < -0.2, "running FP22: {running}");
        assert!(promoted.abs() < 0.03, "per-tile: {promoted}");
        // Stage D's bound has FP22 chains of its 128-key tiles (Model::of): the f64 gate holds
        // the kernel to its promotion, and a kernel that drops it fails there once its loss
        // passes the worst case of P's rounding (2^-4 of A through V and of |O|; at S_k 8192 the
        // running sum is 13.8% short and reaches 0.98 of the bound: the relative gate's catch).
        let worst = |out: &[f16]| {
            out.iter()
                .zip(&refs.kernel)
                .zip(&refs.kernel_bound)
                .map(|((o, r), b)| (o.to_f64() - r).abs() / b)
                .fold(0.0, f64::max)
        };
        let (ours, theirs) = (worst(&ours), worst(&theirs));
        assert!(
            ours < 0.5 && theirs > 1.0,
            "err/bound: {ours} per-tile, {theirs} running"
        );
    }

    #[test]
    fn every_kv_split_gives_the_same_answer_up_to_rounding() {
        // S = 300: five tiles, so 2 and 3 splits get unequal shares and a split may be empty.
        let p = problem(1, 2, 300, 1.0);
        let refs = References::compute(&p, Algorithm::STAGE_C, &all(&p));
        let outs: Vec<Vec<f16>> = [1, 2, 3, 8]
            .iter()
            .map(|&k| {
                let mut out = vec![POISON; p.output_len()];
                run(&p, Algorithm::STAGE_C.with_split(k), Defect::None, &mut out);
                out
            })
            .collect();
        for out in &outs {
            assert!(max_err(out, &refs.kernel) < 4e-3);
        }
        let differing = outs[0].iter().zip(&outs[1]).filter(|(a, b)| a != b).count();
        assert!(
            differing > 0,
            "the split must change the summation order somewhere"
        );
    }

    #[test]
    fn the_emulation_of_sampled_rows_is_those_rows_of_the_whole_emulation() {
        let p = problem(2, 1, 1000, 1.0);
        let whole = emulate(&p, Defect::None);
        let rows = RowSet::sampled(&p.shape, 0, &[32]);
        let part = clean(&p, Algorithm::STAGE_C, &rows);
        assert_eq!(part.len(), rows.count() * 64);
        for (full_row, compact_row) in rows.each() {
            assert_eq!(
                whole[full_row * 64..][..64],
                part[compact_row * 64..][..64],
                "row {full_row}"
            );
        }
        assert_ne!(
            clean(&p, Algorithm::STAGE_C, &all(&p)).len(),
            part.len(),
            "not the memo of all rows"
        );
    }

    #[test]
    fn skipping_the_last_kv_tile_changes_the_answer() {
        let p = problem(1, 1, 130, 1.0);
        let refs = References::compute(&p, Algorithm::STAGE_C, &all(&p));
        let err = max_err(&emulate(&p, Defect::SkipLastKvTile), &refs.kernel);
        assert!(err > 0.05, "max err {err}");
    }

    #[test]
    fn p_is_rounded_to_f16_exactly_as_half_does_on_every_f32_from_0_to_2_to_the_9() {
        // Weights reach 2^8 where the maximum lags by the rescale threshold (and pass it by a
        // few ulps with the fused scale): the proof runs one binade past it.
        let top = 512.0f32.to_bits();
        let edges = [1.0f32, 2.0, 256.0, 512.0].map(f32::to_bits);
        let wrong = (0..top)
            .step_by(3) // a third of the 1.14e9 values, every kind of rounding among them
            .chain(edges.iter().flat_map(|&b| [b - 1, b + 1]))
            .chain([0x3880_0000, 0x387F_FFFF, 0x3380_0000, 0x337F_FFFF])
            .filter(|&b| b < top)
            .map(f32::from_bits)
            .find(|&x| round_weight_to_f16(x).to_bits() != f16::from_f32(x).to_f32().to_bits());
        assert_eq!(wrong, None);
        assert_eq!(
            2f32.powi(crate::kernels::MAX_RESCALE_THRESHOLD as i32 + 1)
                .to_bits(),
            top,
            "the proof's range follows the largest threshold"
        );
    }

    #[test]
    fn leaving_a_row_unwritten_leaves_exactly_that_row_poisoned() {
        let p = problem(1, 2, 40, 1.0);
        let out = emulate(&p, Defect::LeaveRowUnwritten);
        let poisoned: Vec<usize> = (0..out.len())
            .filter(|&i| out[i].to_bits() == POISON.to_bits())
            .collect();
        assert_eq!(
            poisoned,
            ((2 * 40 - 1) * 64..2 * 40 * 64).collect::<Vec<_>>()
        );
    }
}
