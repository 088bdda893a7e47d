//! The f64 CPU reference, softmax(scale·QKᵀ)V, with ndarray.
//!
//! Work is split into blocks of query rows of one (batch, head) and spread over all cores
//! with rayon; each block is two f64 GEMMs (matrixmultiply) around a max-subtracted softmax
//! whose `exp` is vectorized ([`fastexp`]). Each thread reuses one score buffer.

mod bound;
mod fastexp;

use std::cell::RefCell;

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};
use rayon::prelude::*;

use crate::problem::Problem;
use crate::rows::RowSet;
use crate::shapes::Shape;

/// Query rows per work item: big enough for efficient GEMMs, small enough that the
/// `ROW_BLOCK x S` score block stays in cache for common S.
const ROW_BLOCK: usize = 64;

/// The two references (docs/DESIGN.md "References and metrics") of the checked rows of one
/// problem, in the compact layout of [`RowSet`], and the error model's bound for every element
/// of each ([`bound`]).
pub struct References {
    /// On the dequantized FP8 values: isolates the kernel's own error.
    pub kernel: Vec<f64>,
    /// On the original f32 inputs: includes the quantization error.
    pub end_to_end: Vec<f64>,
    /// How far a correct kernel may be from `kernel`, per element.
    pub kernel_bound: Vec<f64>,
    /// How far a correct kernel on correctly quantized inputs may be from `end_to_end`.
    pub end_to_end_bound: Vec<f64>,
}

impl References {
    /// Both references and their bounds for the rows of `rows`, in one pass; `kv_split` is
    /// the kernel's (it sets the length of the f32 accumulation chains in the model). Heads
    /// are widened to f64 one at a time, so memory follows the checked rows, not B·H·S·D.
    pub fn compute(p: &Problem, kv_split: usize, rows: &RowSet) -> Self {
        let sh = &p.shape;
        let (s, d) = (sh.s, sh.d);
        let head_len = s * d;
        let zeros = || vec![0.0f64; rows.count() * d];
        let mut refs = References {
            kernel: zeros(),
            end_to_end: zeros(),
            kernel_bound: zeros(),
            end_to_end_bound: zeros(),
        };
        let scale = p.softmax_scale as f64;
        let table = crate::fp8::decode_table_f64();
        let References {
            kernel,
            end_to_end,
            kernel_bound,
            end_to_end_bound,
        } = &mut refs;
        let split = |v| rows.split_heads(v, d).into_iter();
        let heads: Vec<[&mut [f64]; 4]> = split(kernel)
            .zip(split(end_to_end))
            .zip(split(kernel_bound).zip(split(end_to_end_bound)))
            .map(|((k, e), (kb, eb))| [k, e, kb, eb])
            .collect();
        heads
            .into_par_iter()
            .enumerate()
            .for_each(|(bh, out_head)| {
                let range = bh * head_len..(bh + 1) * head_len;
                let decode = |t: &crate::fp8::Fp8Tensor| -> Vec<f64> {
                    let sc = t.scales[bh] as f64;
                    t.codes[range.clone()]
                        .iter()
                        .map(|&c| table[c as usize] * sc)
                        .collect()
                };
                let widen = |x: &[f32]| {
                    x[range.clone()]
                        .iter()
                        .map(|&v| v as f64)
                        .collect::<Vec<_>>()
                };
                let (kk, vk) = (decode(&p.k), decode(&p.v));
                let (ke, ve) = (widen(&p.inputs.k), widen(&p.inputs.v));
                let v_abs: Vec<f64> = vk.iter().map(|x| x.abs()).collect();
                let mine = rows.rows(bh);
                let facts = bound::HeadFacts {
                    qk_scale_log2: scale * std::f64::consts::LOG2_E,
                    k_norm_max: kk.chunks(d).map(norm).fold(0.0, f64::max),
                    v_abs_max: v_abs.iter().copied().fold(0.0, f64::max),
                    v_scale: p.v.scales[bh] as f64,
                    tiles: bound::HeadFacts::tiles(s, kv_split),
                };
                let head = Head {
                    q: &p.q,
                    qe: &p.inputs.q[range.clone()],
                    bh,
                    table: &table,
                    kk: head_view(&kk, s, d),
                    vk: head_view(&vk, s, d),
                    v_abs: head_view(&v_abs, s, d),
                    ke: head_view(&ke, s, d),
                    ve: head_view(&ve, s, d),
                    scale,
                    facts,
                };
                let [k, e, kb, eb] = out_head.map(|o| o.par_chunks_mut(ROW_BLOCK * d));
                k.zip(e)
                    .zip(kb.zip(eb))
                    .zip(mine.par_chunks(ROW_BLOCK))
                    .for_each(|(((k, e), (kb, eb)), blk_rows)| {
                        head.block(blk_rows, [k, e, kb, eb])
                    });
            });
        refs
    }
}

fn head_view(x: &[f64], s: usize, d: usize) -> ArrayView2<'_, f64> {
    ArrayView2::from_shape((s, d), x).expect("head slice")
}

fn norm(x: &[f64]) -> f64 {
    x.iter().map(|v| v * v).sum::<f64>().sqrt()
}

/// One head's operands: the dequantized codes (`*k`), the original inputs (`*e`); Q rows are
/// read (and dequantized) as a block needs them.
struct Head<'a> {
    q: &'a crate::fp8::Fp8Tensor,
    /// This head's slice of the original Q.
    qe: &'a [f32],
    bh: usize,
    table: &'a [f64; 256],
    kk: ArrayView2<'a, f64>,
    vk: ArrayView2<'a, f64>,
    v_abs: ArrayView2<'a, f64>,
    ke: ArrayView2<'a, f64>,
    ve: ArrayView2<'a, f64>,
    scale: f64,
    facts: bound::HeadFacts,
}

thread_local! {
    /// The two `ROW_BLOCK x S` score blocks of the current thread, kept between blocks.
    static JOINT: RefCell<(Vec<f64>, Vec<f64>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

impl Head<'_> {
    /// The rows `which` of this head into `out`: kernel ref, e2e ref, kernel bound, e2e bound.
    fn block(&self, which: &[usize], out: [&mut [f64]; 4]) {
        let (s, d) = self.kk.dim();
        let rows = which.len();
        let head_off = self.bh * s * d;
        let q_scale = self.q.scales[self.bh] as f64;
        let mut qk = ndarray::Array2::<f64>::zeros((rows, d));
        let mut qe = ndarray::Array2::<f64>::zeros((rows, d));
        for (i, &r) in which.iter().enumerate() {
            let codes = &self.q.codes[head_off + r * d..][..d];
            for (x, &c) in codes.iter().enumerate() {
                qk[[i, x]] = self.table[c as usize] * q_scale;
                qe[[i, x]] = self.qe[r * d + x] as f64;
            }
        }
        JOINT.with_borrow_mut(|(bk, be)| {
            bk.resize(rows * s, 0.0);
            be.resize(rows * s, 0.0);
            let mut sk = ArrayViewMut2::from_shape((rows, s), &mut bk[..]).expect("scores");
            let mut se = ArrayViewMut2::from_shape((rows, s), &mut be[..]).expect("scores");
            general_mat_mul(self.scale, &qk, &self.kk.t(), 0.0, &mut sk);
            general_mat_mul(self.scale, &qe, &self.ke.t(), 0.0, &mut se);
            let mut row_facts = Vec::with_capacity(rows);
            let mut sums = Vec::with_capacity(rows);
            for (i, (mut rk, mut re)) in sk.rows_mut().into_iter().zip(se.rows_mut()).enumerate() {
                let rk = rk.as_slice_mut().expect("contiguous");
                let re = re.as_slice_mut().expect("contiguous");
                let score_shift = rk
                    .iter()
                    .zip(&*re)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f64::max);
                let max_k = rk.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let max_e = re.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let sum_k = fastexp::exp_shifted_sum(rk, max_k);
                let sum_e = fastexp::exp_shifted_sum(re, max_e);
                row_facts.push(bound::RowFacts {
                    q_norm: norm(qk.row(i).as_slice().expect("contiguous")),
                    subnormal_weights: rk.iter().filter(|&&w| w < bound::F16_MIN_NORMAL).count(),
                    score_shift,
                });
                sums.push((sum_k, sum_e));
            }
            let mut ok = ndarray::Array2::<f64>::zeros((rows, d));
            let mut a = ndarray::Array2::<f64>::zeros((rows, d));
            let mut oe = ndarray::Array2::<f64>::zeros((rows, d));
            general_mat_mul(1.0, &sk, &self.vk, 0.0, &mut ok);
            general_mat_mul(1.0, &sk, &self.v_abs, 0.0, &mut a);
            general_mat_mul(1.0, &se, &self.ve, 0.0, &mut oe);
            let [out_k, out_e, out_kb, out_eb] = out;
            for i in 0..rows {
                let (sum_k, sum_e) = sums[i];
                for x in 0..d {
                    let (o_k, o_e, a) = (ok[[i, x]] / sum_k, oe[[i, x]] / sum_e, a[[i, x]] / sum_k);
                    let (bk, be) = bound::element(&self.facts, &row_facts[i], a, o_k, o_e);
                    let at = i * d + x;
                    (out_k[at], out_e[at], out_kb[at], out_eb[at]) = (o_k, o_e, bk, be);
                }
            }
        });
    }
}

/// softmax(scale·QKᵀ)V per (batch, head) for `[B, H, S, D]` row-major tensors.
pub fn attention(shape: &Shape, q: &[f64], k: &[f64], v: &[f64], scale: f64) -> Vec<f64> {
    let (s, d) = (shape.s, shape.d);
    let head_len = s * d;
    assert!(q.len() == shape.heads() * head_len && k.len() == q.len() && v.len() == q.len());
    let mut out = vec![0.0f64; q.len()];
    out.par_chunks_mut(head_len)
        .enumerate()
        .for_each(|(bh, out_head)| {
            let range = bh * head_len..(bh + 1) * head_len;
            let kh = ArrayView2::from_shape((s, d), &k[range.clone()]).expect("K slice");
            let vh = ArrayView2::from_shape((s, d), &v[range.clone()]).expect("V slice");
            let qh = &q[range];
            out_head
                .par_chunks_mut(ROW_BLOCK * d)
                .enumerate()
                .for_each(|(blk, out_blk)| {
                    let rows = out_blk.len() / d;
                    let r0 = blk * ROW_BLOCK;
                    let qb = ArrayView2::from_shape((rows, d), &qh[r0 * d..(r0 + rows) * d])
                        .expect("Q block");
                    let ob = ArrayViewMut2::from_shape((rows, d), out_blk).expect("O block");
                    attention_block(qb, kh, vh, scale, ob);
                });
        });
    out
}

thread_local! {
    /// The `ROW_BLOCK x S` score block of the current thread, kept between blocks.
    static SCORES: RefCell<Vec<f64>> = const { RefCell::new(Vec::new()) };
}

fn attention_block(
    q: ArrayView2<f64>,
    k: ArrayView2<f64>,
    v: ArrayView2<f64>,
    scale: f64,
    mut out: ArrayViewMut2<f64>,
) {
    let (rows, s) = (q.nrows(), k.nrows());
    SCORES.with_borrow_mut(|buf| {
        buf.resize(rows * s, 0.0);
        let mut scores = ArrayViewMut2::from_shape((rows, s), &mut buf[..]).expect("score block");
        general_mat_mul(scale, &q, &k.t(), 0.0, &mut scores);
        let mut sums = Vec::with_capacity(rows);
        for mut row in scores.rows_mut() {
            let row = row.as_slice_mut().expect("scores are contiguous");
            let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            sums.push(fastexp::exp_shifted_sum(row, max));
        }
        general_mat_mul(1.0, &scores, &v, 0.0, &mut out);
        for (mut row, sum) in out.rows_mut().into_iter().zip(sums) {
            row.mapv_inplace(|x| x / sum);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(b: usize, h: usize, s: usize) -> Shape {
        Shape {
            name: "t".into(),
            b,
            h,
            s,
            d: 64,
            qk_std: 1.0,
            purpose: String::new(),
            dist: Default::default(),
        }
    }

    /// Textbook attention, one row at a time, no blocking and no max subtraction.
    fn naive(shape: &Shape, q: &[f64], k: &[f64], v: &[f64], scale: f64) -> Vec<f64> {
        let (s, d) = (shape.s, shape.d);
        let mut out = vec![0.0; q.len()];
        for bh in 0..shape.heads() {
            let base = bh * s * d;
            for i in 0..s {
                let w: Vec<f64> = (0..s)
                    .map(|j| {
                        let dot: f64 = (0..d)
                            .map(|x| q[base + i * d + x] * k[base + j * d + x])
                            .sum();
                        (dot * scale).exp()
                    })
                    .collect();
                let total: f64 = w.iter().sum();
                for x in 0..d {
                    out[base + i * d + x] =
                        (0..s).map(|j| w[j] * v[base + j * d + x]).sum::<f64>() / total;
                }
            }
        }
        out
    }

    fn data(n: usize, salt: f64) -> Vec<f64> {
        (0..n)
            .map(|i| (i as f64 * 0.7 + salt).sin() * 1.3)
            .collect()
    }

    #[test]
    fn the_joint_pass_gives_both_references_as_textbook_attention_and_positive_bounds() {
        // S = 150: three row blocks, the last partial; two heads with their own scales.
        let sh = shape(1, 2, 150);
        let p = Problem::new(&sh, 3);
        let refs = References::compute(&p, 2, &RowSet::all(&sh));
        let scale = p.softmax_scale as f64;
        let widen = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<_>>();
        let kernel = naive(
            &sh,
            &p.q.dequantize_f64(),
            &p.k.dequantize_f64(),
            &p.v.dequantize_f64(),
            scale,
        );
        let e2e = naive(
            &sh,
            &widen(&p.inputs.q),
            &widen(&p.inputs.k),
            &widen(&p.inputs.v),
            scale,
        );
        let worst = |a: &[f64], b: &[f64]| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f64::max)
        };
        assert!(worst(&refs.kernel, &kernel) < 1e-12);
        assert!(worst(&refs.end_to_end, &e2e) < 1e-12);
        // Each e2e bound adds V's rounding (2^-4 of A >= 2^-4 |O|) to the kernel bound.
        for ((&bk, &be), &o) in refs
            .kernel_bound
            .iter()
            .zip(&refs.end_to_end_bound)
            .zip(&kernel)
        {
            assert!(bk > 0.0 && be >= bk + o.abs() / 16.0, "{bk} {be} {o}");
        }
        // The quantization is what separates the references: the model's bound covers it.
        for ((&k, &e), &be) in kernel.iter().zip(&e2e).zip(&refs.end_to_end_bound) {
            assert!((k - e).abs() <= be, "{k} {e} {be}");
        }
    }

    #[test]
    fn the_references_of_sampled_rows_are_those_rows_of_the_full_references() {
        // Two heads of S = 1000: rows of several blocks, each head its own random rows.
        let sh = shape(1, 2, 1000);
        let p = Problem::new(&sh, 1);
        let full = References::compute(&p, 2, &RowSet::all(&sh));
        let rows = RowSet::sampled(&sh, 1, &[32]);
        let part = References::compute(&p, 2, &rows);
        assert_eq!(part.kernel.len(), rows.count() * 64);
        for (full_row, compact_row) in rows.each() {
            let (f, c) = (
                full_row * 64..(full_row + 1) * 64,
                compact_row * 64..(compact_row + 1) * 64,
            );
            assert_eq!(full.kernel[f.clone()], part.kernel[c.clone()]);
            assert_eq!(full.end_to_end[f.clone()], part.end_to_end[c.clone()]);
            assert_eq!(full.kernel_bound[f.clone()], part.kernel_bound[c.clone()]);
            assert_eq!(full.end_to_end_bound[f], part.end_to_end_bound[c]);
        }
    }

    #[test]
    fn blocked_parallel_reference_matches_textbook_attention() {
        // S = 150 spans three row blocks, the last one partial; two batches and two heads.
        let sh = shape(2, 2, 150);
        let n = sh.elements().unwrap();
        let (q, k, v) = (data(n, 0.1), data(n, 0.2), data(n, 0.3));
        let fast = attention(&sh, &q, &k, &v, 0.125);
        let slow = naive(&sh, &q, &k, &v, 0.125);
        let worst = fast
            .iter()
            .zip(&slow)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(worst < 1e-12, "worst {worst}");
    }

    #[test]
    fn softmax_is_stable_for_huge_scores() {
        let sh = shape(1, 1, 8);
        let n = sh.elements().unwrap();
        let q = vec![100.0; n];
        let k = vec![100.0; n];
        let v = data(n, 0.5);
        // Every score is 100 * 100 * 64 = 640000: exp() of that overflows unless the row
        // maximum is subtracted first. All scores equal, so each row is the mean of V's rows.
        let out = attention(&sh, &q, &k, &v, 1.0);
        for s in 0..8 {
            for d in 0..64 {
                let mean = (0..8).map(|j| v[j * 64 + d]).sum::<f64>() / 8.0;
                let got = out[s * 64 + d];
                assert!(
                    (got - mean).abs() < 1e-12,
                    "row {s} col {d}: {got} vs {mean}"
                );
            }
        }
    }

    #[test]
    fn a_single_key_returns_its_value_row() {
        let sh = shape(1, 1, 1);
        let q = data(64, 0.1);
        let k = data(64, 0.2);
        let v = data(64, 0.3);
        assert_eq!(attention(&sh, &q, &k, &v, 0.125), v);
    }
}
