//! The f64 CPU reference, softmax(scale·QKᵀ)V, with ndarray.
//!
//! Work is split into blocks of query rows of one (batch, head) and spread over all cores
//! with rayon; each block is f64 GEMMs (matrixmultiply) around a max-subtracted softmax whose
//! `exp` is vectorized ([`fastexp`]): two for the scores, three for the sums, and two more for
//! the implementation model's [`Spread`]. Each thread reuses one score buffer.

mod bound;
mod fastexp;
mod model;

use model::Reader;
pub use model::{Implementation, Model, OutputFormat, Precision, Reading, Spread};

use crate::emulation::Algorithm;

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

/// Where a yardstick is computed: the f64 references (`--references`) or the emulation
/// (`--emulation`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Engine {
    /// On the host, independent of the GPU, while that is cheap; on the GPU (when the backend
    /// has one) above [`AUTO_DEVICE_ABOVE`] checked (row, key) pairs, unless it has too little
    /// free memory for it or the runner's kernel did not build: then on the host.
    #[default]
    Auto,
    /// On the host's cores (the references: ndarray GEMMs; the emulation: src/emulation/).
    Host,
    /// On the GPU (cuda/reference_f64.cu, cuda/emulation_f32.cu); needs `--backend cuda`.
    Device,
}

/// Checked (row, key) pairs above which `auto` computes a yardstick on the GPU: 2^22, the
/// smallest power of two above every default shape but `long` and `large` (`mission`,
/// 1x8x512, has 2^21), so those keep yardsticks that share nothing with the GPU, while
/// `long`, `large`, the long contexts and mid-sized problems get theirs from the GPU. The GPU
/// is the faster engine there: on an H200 host of 32 cores a problem's yardsticks (with their
/// host finishing) took 12.5 ms on the host and 8.5 ms on the GPU between 2^20 and 2^22
/// pairs, 32 ms and 17 ms between 2^22 and 2^24 (fuzz's problems, one worker; `fuzz --count
/// 1000` on one GPU did its work 6-11% faster with this line than with 2^24 there, and 19%
/// faster on an H100 host of 16 cores, with the same verdicts); and host
/// yardsticks hold the host's cores, which the workers of several GPUs share (docs/DESIGN.md
/// "What limits throughput").
pub const AUTO_DEVICE_ABOVE: u64 = 1 << 22;

impl Engine {
    /// Whether the yardsticks of `rows` of a problem of `shape` are wanted on the device:
    /// under `auto` above [`AUTO_DEVICE_ABOVE`] checked (row, key) pairs. The GPU yardsticks
    /// take every problem the shapes allow, one module per head dim (docs/DESIGN.md
    /// "References on the GPU"); one that cannot be built or loaded is unavailable, and `auto`
    /// then computes on the host.
    pub fn wants_device(self, rows: &RowSet, shape: &Shape) -> bool {
        match self {
            Engine::Host => false,
            Engine::Device => true,
            Engine::Auto => rows.count() as u64 * shape.sk as u64 > AUTO_DEVICE_ABOVE,
        }
    }
}

/// The references' sums of the checked rows before the softmax totals divide them, in the
/// compact layout of [`RowSet`] (`d` values per row): what the device computes
/// (cuda/reference_f64.cu), and what [`References::compute`] computes on the host on its way.
#[derive(Clone)]
pub struct RowSums {
    /// Σ_j w_k(j) v̂_j, with w_k = exp(s_k − max s_k) the weights on the dequantized codes.
    pub o_k: Vec<f64>,
    /// Σ_j w_k(j) |v̂_j|.
    pub a: Vec<f64>,
    /// Σ_j w_e(j) v_j, with w_e the weights on the original inputs.
    pub o_e: Vec<f64>,
    /// One per checked row.
    pub totals: Vec<RowTotals>,
    /// Per element, where the reading asks for it ([`Reading::spread`]); else empty.
    pub spread: Vec<Spread>,
}

/// One checked row's softmax totals and the row facts the error model needs from its scores.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RowTotals {
    /// Σ_j w_k(j).
    pub l_k: f64,
    /// Σ_j w_e(j).
    pub l_e: f64,
    /// max_j |s_k(j) − s_e(j)|.
    pub score_shift: f64,
    /// Keys whose w_k is below f16's smallest normal (the reading's small weight, [`Reading`]).
    pub subnormal_weights: usize,
}

impl RowSums {
    /// The sums of the rows of `rows`, on the host's cores. Heads are widened to f64 one at a
    /// time, so memory follows the checked rows, not B·H·S·D. Query head `bh` reads K/V head
    /// [`Shape::kv_head_of`]; under a causal mask a row's sums run over its visible keys only
    /// ([`Shape::visible_keys`]), and a row that sees none has all sums and totals zero.
    pub fn on_host(p: &Problem, rows: &RowSet) -> Self {
        Self::read(p, rows, Reading::STAGE_C)
    }

    /// As [`RowSums::on_host`], with the inputs read as `reading` says (`check`: what the
    /// graded implementation read) and its small weights counted below its threshold.
    pub fn read(p: &Problem, rows: &RowSet, reading: Reading) -> Self {
        let sh = &p.shape;
        let (sk, d) = (sh.sk, sh.d);
        let kv_len = sk * d;
        let n = rows.count();
        let zero = Spread { pp: 0.0, rr: 0.0 };
        let mut sums = RowSums {
            o_k: vec![0.0; n * d],
            a: vec![0.0; n * d],
            o_e: vec![0.0; n * d],
            totals: vec![RowTotals::default(); n],
            spread: vec![zero; if reading.spread { n * d } else { 0 }],
        };
        let scale = p.softmax_scale as f64;
        let reader = Reader::new(reading.precision);
        let split = |v| rows.split_heads(v, d).into_iter();
        // Without spread, one empty slice per head.
        let spreads: Vec<&mut [Spread]> = if reading.spread {
            rows.split_heads(&mut sums.spread, d)
        } else {
            (0..rows.heads()).map(|_| &mut [][..]).collect()
        };
        let heads: Vec<_> = split(&mut sums.o_k)
            .zip(split(&mut sums.a))
            .zip(split(&mut sums.o_e))
            .zip(rows.split_heads(&mut sums.totals, 1))
            .zip(spreads)
            .collect();
        heads
            .into_par_iter()
            .enumerate()
            .for_each(|(bh, ((((o_k, a), o_e), totals), spread))| {
                let kvh = sh.kv_head_of(bh);
                let range = kvh * kv_len..(kvh + 1) * kv_len;
                let decode = |t: &crate::fp8::Fp8Tensor, orig: &[f32]| -> Vec<f64> {
                    reader.values(t, orig, kvh, range.clone()).collect()
                };
                let widen = |x: &[f32]| {
                    x[range.clone()]
                        .iter()
                        .map(|&v| v as f64)
                        .collect::<Vec<_>>()
                };
                let (kk, vk) = (decode(&p.k, &p.inputs.k), decode(&p.v, &p.inputs.v));
                let (ke, ve) = (widen(&p.inputs.k), widen(&p.inputs.v));
                let v_abs: Vec<f64> = vk.iter().map(|x| x.abs()).collect();
                let v_sq: Option<Vec<f64>> =
                    reading.spread.then(|| vk.iter().map(|x| x * x).collect());
                let mine = rows.rows(bh);
                let head = Head {
                    p,
                    bh,
                    reader: &reader,
                    reading,
                    v_sq: v_sq.as_deref().map(|v| head_view(v, sk, d)),
                    kk: head_view(&kk, sk, d),
                    vk: head_view(&vk, sk, d),
                    v_abs: head_view(&v_abs, sk, d),
                    ke: head_view(&ke, sk, d),
                    ve: head_view(&ve, sk, d),
                    scale,
                };
                let block = ROW_BLOCK * d;
                // Without spread, an empty chunk per block.
                let spread_chunks: Vec<&mut [Spread]> = if spread.is_empty() {
                    (0..mine.len().div_ceil(ROW_BLOCK))
                        .map(|_| &mut [][..])
                        .collect()
                } else {
                    spread.chunks_mut(block).collect()
                };
                o_k.par_chunks_mut(block)
                    .zip(a.par_chunks_mut(block))
                    .zip(o_e.par_chunks_mut(block))
                    .zip(totals.par_chunks_mut(ROW_BLOCK))
                    .zip(mine.par_chunks(ROW_BLOCK))
                    .zip(spread_chunks)
                    .for_each(|(((((o_k, a), o_e), totals), blk_rows), spread)| {
                        head.block(blk_rows, [o_k, a, o_e], totals, spread)
                    });
            });
        sums
    }
}

impl References {
    /// Both references and their bounds for the rows of `rows`, on the host, under the error
    /// model of the kernel's algorithm ([`Model::of`]).
    pub fn compute(p: &Problem, alg: Algorithm, rows: &RowSet) -> Self {
        let model = Model::of(alg);
        Self::finish(p, &model, rows, RowSums::read(p, rows, model.reading()))
    }

    /// The references and bounds from the sums of either engine: the same finishing for both.
    /// The sums must be read as the model of `alg` reads ([`Model::reading`]; the device takes
    /// the reading as arguments).
    pub fn from_sums(p: &Problem, alg: Algorithm, rows: &RowSet, sums: RowSums) -> Self {
        Self::finish(p, &Model::of(alg), rows, sums)
    }

    /// The references and bounds under `model` from sums read as [`Model::reading`] says.
    pub fn finish(p: &Problem, model: &Model, rows: &RowSet, sums: RowSums) -> Self {
        let d = p.shape.d;
        let n = rows.count() * d;
        let RowSums {
            o_k,
            a,
            o_e,
            totals,
            spread,
        } = sums;
        assert!(o_k.len() == n && a.len() == n && o_e.len() == n && totals.len() == rows.count());
        let mut refs = References {
            kernel: o_k,
            end_to_end: o_e,
            kernel_bound: a,
            end_to_end_bound: vec![0.0; n],
        };
        let reader = Reader::new(model.reading().precision);
        let kv_split = match model {
            Model::StageC { kv_split } => *kv_split,
            Model::Implementation(_) => 1,
        };
        // A model that reads spread gets it: a missing one would silently keep the worst case.
        let mut spread = spread;
        let spreads: Vec<&[Spread]> = if model.reading().spread {
            assert_eq!(
                spread.len(),
                n,
                "the model reads spread: the sums must have it"
            );
            rows.split_heads(&mut spread, d)
                .into_iter()
                .map(|h| &*h)
                .collect()
        } else {
            assert!(spread.is_empty(), "sums with spread for a model without it");
            vec![&[][..]; rows.heads()]
        };
        let symmetric = p.shape.dist.v_signs_symmetric();
        refs.heads(rows, d)
            .into_par_iter()
            .zip(spreads)
            .enumerate()
            .for_each(|(bh, ([k, e, kb, eb], spread))| {
                let facts = head_facts(p, bh, kv_split, &reader);
                let first = rows.offset(bh);
                for (i, &r) in rows.rows(bh).iter().enumerate() {
                    let t = &totals[first + i];
                    let row = bound::RowFacts {
                        q_norm: q_norm(p, bh, r, &reader),
                        keys: p.shape.visible_keys(r),
                        subnormal_weights: t.subnormal_weights,
                        score_shift: t.score_shift,
                    };
                    let at = i * d..(i + 1) * d;
                    // The statistical terms assume V's signs are fair coins
                    // (Dist::v_signs_symmetric); where they are not, the worst case alone.
                    // (The sums still carry the spread: the reading is the model's, not the
                    // problem's, and the device's reference modules are built per reading.)
                    let spread = spread.get(at.clone()).filter(|_| symmetric);
                    let out = [
                        &mut k[at.clone()],
                        &mut e[at.clone()],
                        &mut kb[at.clone()],
                        &mut eb[at],
                    ];
                    finish_row(model, &facts, &row, (t.l_k, t.l_e), out, spread);
                }
            });
        refs
    }

    /// The four vectors split per head: kernel, end-to-end, kernel bound, end-to-end bound.
    fn heads(&mut self, rows: &RowSet, d: usize) -> Vec<[&mut [f64]; 4]> {
        let split = |v| rows.split_heads(v, d).into_iter();
        split(&mut self.kernel)
            .zip(split(&mut self.end_to_end))
            .zip(split(&mut self.kernel_bound).zip(split(&mut self.end_to_end_bound)))
            .map(|((k, e), (kb, eb))| [k, e, kb, eb])
            .collect()
    }
}

/// The error model's facts of query head `bh`, from the codes of the K/V head it reads.
fn head_facts(p: &Problem, bh: usize, kv_split: usize, reader: &Reader) -> bound::HeadFacts {
    let (sk, d) = (p.shape.sk, p.shape.d);
    let kvh = p.shape.kv_head_of(bh);
    let v_sc = p.v.scales[kvh] as f64;
    let k_norm_max = (0..sk)
        .map(|j| {
            let key = (kvh * sk + j) * d..(kvh * sk + j + 1) * d;
            reader
                .values(&p.k, &p.inputs.k, kvh, key)
                .map(|x| x * x)
                .sum::<f64>()
                .sqrt()
        })
        .fold(0.0, f64::max);
    let v_abs_max = reader
        .values(&p.v, &p.inputs.v, kvh, kvh * sk * d..(kvh + 1) * sk * d)
        .map(f64::abs)
        .fold(0.0, f64::max);
    bound::HeadFacts {
        qk_scale_log2: p.softmax_scale as f64 * std::f64::consts::LOG2_E,
        head_dim: d,
        k_norm_max,
        v_abs_max,
        v_scale: v_sc,
        kv_split,
    }
}

/// ‖q̂‖₂ of row `r` of head `bh`.
fn q_norm(p: &Problem, bh: usize, r: usize, reader: &Reader) -> f64 {
    let d = p.shape.d;
    let at = (bh * p.shape.s + r) * d;
    reader
        .values(&p.q, &p.inputs.q, bh, at..at + d)
        .map(|x| x * x)
        .sum::<f64>()
        .sqrt()
}

/// Turns one row's sums into its references and bounds, in place: `out` holds O_k, O_e and A
/// (and anything in the fourth) and gets the kernel reference, the end-to-end reference, the
/// kernel bound and the end-to-end bound; `spread` the row's [`Spread`] where it was summed.
fn finish_row(
    model: &Model,
    head: &bound::HeadFacts,
    row: &bound::RowFacts,
    (l_k, l_e): (f64, f64),
    out: [&mut [f64]; 4],
    spread: Option<&[Spread]>,
) {
    let [k, e, kb, eb] = out;
    if row.keys == 0 {
        // A row that sees no key is zero, exactly: reference and bound 0.
        for v in [k, e, kb, eb] {
            v.fill(0.0);
        }
        return;
    }
    for x in 0..k.len() {
        let (o_k, o_e, a) = (k[x] / l_k, e[x] / l_e, kb[x] / l_k);
        let (bk, be) = match model {
            Model::StageC { .. } => bound::element(head, row, a, o_k, o_e),
            Model::Implementation(imp) => model::implementation_element(
                imp,
                head,
                row,
                (a, o_k, o_e, l_k),
                spread.map(|s| s[x]),
            ),
        };
        (k[x], e[x], kb[x], eb[x]) = (o_k, o_e, bk, be);
    }
}

fn head_view(x: &[f64], s: usize, d: usize) -> ArrayView2<'_, f64> {
    ArrayView2::from_shape((s, d), x).expect("head slice")
}

/// One head's operands: the dequantized codes (`*k`), the original inputs (`*e`); Q rows are
/// read (and dequantized) as a block needs them.
struct Head<'a> {
    p: &'a Problem,
    bh: usize,
    reader: &'a Reader,
    /// Its small weights ([`RowTotals::subnormal_weights`]) and P's rounding.
    reading: Reading,
    /// v̂², where the reading sums the spread.
    v_sq: Option<ArrayView2<'a, f64>>,
    kk: ArrayView2<'a, f64>,
    vk: ArrayView2<'a, f64>,
    v_abs: ArrayView2<'a, f64>,
    ke: ArrayView2<'a, f64>,
    ve: ArrayView2<'a, f64>,
    scale: f64,
}

thread_local! {
    /// The two `ROW_BLOCK x S` score blocks of the current thread, kept between blocks.
    static JOINT: RefCell<(Vec<f64>, Vec<f64>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

impl<'a> Head<'a> {
    /// The sums of the rows `which` of this head: O_k, A and O_e into `out`, one total each
    /// into `totals`, and (where the reading asks for it) the spread of each element.
    fn block(
        &self,
        which: &[usize],
        out: [&mut [f64]; 3],
        totals: &mut [RowTotals],
        spread: &mut [Spread],
    ) {
        let (sk, d) = self.kk.dim();
        let shape = &self.p.shape;
        let rows = which.len();
        let head_off = self.bh * shape.s * d;
        let mut qk = ndarray::Array2::<f64>::zeros((rows, d));
        let mut qe = ndarray::Array2::<f64>::zeros((rows, d));
        for (i, &r) in which.iter().enumerate() {
            let at = head_off + r * d;
            let read = self
                .reader
                .values(&self.p.q, &self.p.inputs.q, self.bh, at..at + d);
            let orig = &self.p.inputs.q[at..at + d];
            for (x, (value, &o)) in read.zip(orig).enumerate() {
                qk[[i, x]] = value;
                qe[[i, x]] = o as f64;
            }
        }
        // Keys any row of the block sees (all S_k without a mask): the GEMMs stop there.
        let keys = which
            .iter()
            .map(|&r| shape.visible_keys(r))
            .max()
            .unwrap_or(0)
            .min(sk);
        let cut = |m: &ArrayView2<'a, f64>| (*m).slice_move(ndarray::s![..keys, ..]);
        JOINT.with_borrow_mut(|(bk, be)| {
            bk.resize(rows * keys, 0.0);
            be.resize(rows * keys, 0.0);
            let mut sk_ = ArrayViewMut2::from_shape((rows, keys), &mut bk[..]).expect("scores");
            let mut se = ArrayViewMut2::from_shape((rows, keys), &mut be[..]).expect("scores");
            let (kk, ke) = (cut(&self.kk), cut(&self.ke));
            general_mat_mul(self.scale, &qk, &kk.t(), 0.0, &mut sk_);
            general_mat_mul(self.scale, &qe, &ke.t(), 0.0, &mut se);
            for (((mut rk, mut re), total), &r) in sk_
                .rows_mut()
                .into_iter()
                .zip(se.rows_mut())
                .zip(&mut *totals)
                .zip(which)
            {
                let rk = rk.as_slice_mut().expect("contiguous");
                let re = re.as_slice_mut().expect("contiguous");
                let seen = shape.visible_keys(r).min(keys);
                let (rk, rk_masked) = rk.split_at_mut(seen);
                let (re, re_masked) = re.split_at_mut(seen);
                rk_masked.fill(0.0); // masked keys weigh nothing
                re_masked.fill(0.0);
                let score_shift = rk
                    .iter()
                    .zip(&*re)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f64::max);
                let max_k = rk.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let max_e = re.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let (l_k, l_e) = if seen == 0 {
                    (0.0, 0.0)
                } else {
                    (
                        fastexp::exp_shifted_sum(rk, max_k),
                        fastexp::exp_shifted_sum(re, max_e),
                    )
                };
                let subnormal_weights = rk
                    .iter()
                    .filter(|&&w| w < self.reading.small_weight)
                    .count();
                *total = RowTotals {
                    l_k,
                    l_e,
                    score_shift,
                    subnormal_weights,
                };
            }
            let [o_k, a, o_e] =
                out.map(|o| ArrayViewMut2::from_shape((rows, d), o).expect("a sum block"));
            let (vk, v_abs, ve) = (cut(&self.vk), cut(&self.v_abs), cut(&self.ve));
            for (weights, values, mut sums) in
                [(&sk_, &vk, o_k), (&sk_, &v_abs, a), (&se, &ve, o_e)]
            {
                general_mat_mul(1.0, weights, values, 0.0, &mut sums);
            }
            if let Some(v_sq) = &self.v_sq {
                let v_sq = cut(v_sq);
                let mut pp = ndarray::Array2::<f64>::zeros((rows, d));
                let mut rr = ndarray::Array2::<f64>::zeros((rows, d));
                general_mat_mul(1.0, &sk_.mapv(|w| w * w), &v_sq, 0.0, &mut pp);
                let r = |w: f64| self.reading.p_rounding(w).powi(2);
                general_mat_mul(1.0, &sk_.mapv(r), &v_sq, 0.0, &mut rr);
                for ((s, &pp), &rr) in spread.iter_mut().zip(&pp).zip(&rr) {
                    *s = Spread { pp, rr };
                }
            }
        });
    }
}

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
            rotate: false,
            hkv: h,
            sk: s,
            causal: false,
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
        let refs = References::compute(&p, Algorithm::STAGE_C, &RowSet::all(&sh));
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
        let full = References::compute(&p, Algorithm::STAGE_C, &RowSet::all(&sh));
        let rows = RowSet::sampled(&sh, 1, &[32]);
        let part = References::compute(&p, Algorithm::STAGE_C, &rows);
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
    fn subnormal_weights_are_counted_on_the_weights_not_the_scores() {
        // qk_std 3 at S = 1000 spreads the scores far enough that most weights, but not the
        // same number in every row, fall below f16's smallest normal.
        let mut sh = shape(1, 3, 1000);
        sh.qk_std = 3.0;
        let p = Problem::new(&sh, 0);
        let rows = RowSet::all(&sh);
        let sums = RowSums::on_host(&p, &rows);
        let counts: std::collections::BTreeSet<usize> =
            sums.totals.iter().map(|t| t.subnormal_weights).collect();
        assert!(counts.len() > 10 && counts.first() > Some(&0), "{counts:?}");
        // Recounted from the weights exp(s - max s) of a few rows.
        let (kk, qk) = (p.k.dequantize_f64(), p.q.dequantize_f64());
        let scale = p.softmax_scale as f64;
        for (i, total) in sums.totals.iter().enumerate().step_by(97) {
            let (bh, r) = (i / 1000, i % 1000);
            let q = &qk[(bh * 1000 + r) * 64..][..64];
            let scores: Vec<f64> = (0..1000)
                .map(|j| {
                    let k = &kk[(bh * 1000 + j) * 64..][..64];
                    scale * q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>()
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let below = scores
                .iter()
                .filter(|&&x| (x - max).exp() < bound::F16_MIN_NORMAL)
                .count();
            // The GEMM and the vectorized exp round differently: allow a weight at the edge.
            assert!(
                total.subnormal_weights.abs_diff(below) <= 1,
                "row {i}: {} vs {below}",
                total.subnormal_weights
            );
        }
    }

    #[test]
    fn auto_computes_yardsticks_on_the_device_only_above_2_pow_22_row_key_pairs_for_any_problem() {
        // 2048 rows of 2048 keys: exactly 2^22 pairs stays on the host; one more row does not.
        let at = shape(1, 1, 2048);
        let over = shape(1, 1, 2049);
        let (rows_at, rows_over) = (RowSet::all(&at), RowSet::all(&over));
        assert!(!Engine::Auto.wants_device(&rows_at, &at));
        assert!(Engine::Auto.wants_device(&rows_over, &over));
        // Sampled rows count, not the shape's.
        let long = shape(1, 1, 8192);
        let sampled = RowSet::sampled(&long, 0, &[64]);
        assert!(Engine::Auto.wants_device(&RowSet::all(&long), &long));
        assert!(sampled.count() * 8192 < 1 << 22);
        assert!(!Engine::Auto.wants_device(&sampled, &long));
        assert!(Engine::Device.wants_device(&rows_at, &at));
        assert!(!Engine::Host.wants_device(&rows_over, &over));
        // The configurations go by the same rule: D 128, GQA, causal, S_k != S_q.
        for other in [
            "1x1x2049x128",
            "1x2x2049x64:hkv=1",
            "1x1x2049x64:causal",
            "1x1x2049x64:sk=2050",
        ] {
            let sh = crate::shapes::Shape::parse_inline(other).unwrap().unwrap();
            assert!(Engine::Auto.wants_device(&RowSet::all(&sh), &sh), "{other}");
        }
        let small = crate::shapes::Shape::parse_inline("1x1x2048x128:sk=2048:causal")
            .unwrap()
            .unwrap();
        assert!(!Engine::Auto.wants_device(&RowSet::all(&small), &small));
    }

    #[test]
    fn auto_keeps_every_default_shape_on_the_host_but_long_and_large() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("shapes/default.json");
        let catalog = crate::shapes::ShapeCatalog::load(&path).unwrap();
        let all = catalog.select("all").unwrap();
        assert!(all.len() >= 9, "{} default shapes", all.len());
        for sh in &all {
            let on_device = Engine::Auto.wants_device(&RowSet::all(sh), sh);
            let expected = matches!(sh.name.as_str(), "long" | "large");
            assert_eq!(
                on_device,
                expected,
                "{}: B·H·S² = {}",
                sh.name,
                sh.b * sh.h * sh.s * sh.s
            );
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

    /// Every input the yardsticks read, for one query row: its visible keys' weights (relative
    /// to the row's maximum) and the K/V head's values, read in `precision`.
    fn row_by_hand(p: &Problem, precision: Precision, full: usize) -> (Vec<f64>, Vec<f64>) {
        let sh = &p.shape;
        let (bh, r, sk, d) = (full / sh.s, full % sh.s, sh.sk, sh.d);
        let kvh = sh.kv_head_of(bh);
        let reader = Reader::new(precision);
        let at = (bh * sh.s + r) * d;
        let q: Vec<f64> = reader.values(&p.q, &p.inputs.q, bh, at..at + d).collect();
        let kv = kvh * sk * d..(kvh + 1) * sk * d;
        let k: Vec<f64> = reader.values(&p.k, &p.inputs.k, kvh, kv.clone()).collect();
        let v: Vec<f64> = reader.values(&p.v, &p.inputs.v, kvh, kv).collect();
        let s: Vec<f64> = (0..sh.visible_keys(r))
            .map(|j| p.softmax_scale as f64 * (0..d).map(|x| q[x] * k[j * d + x]).sum::<f64>())
            .collect();
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (s.iter().map(|x| (x - m).exp()).collect(), v)
    }

    fn implementation(precision: Precision) -> Model {
        Model::Implementation(Implementation::any(precision, OutputFormat::F32))
    }

    #[test]
    fn the_spread_of_every_checked_element_is_its_sums_by_hand_under_masks_gqa_and_sampling() {
        for text in [
            "2x4x150x64:sk=200:hkv=2:causal",
            "1x3x70x64:sk=40:hkv=1:causal",
            "1x2x1x128:sk=513",
        ] {
            let sh = Shape::parse_inline(text).unwrap().unwrap();
            let p = Problem::new(&sh, 5);
            for rows in [RowSet::all(&sh), RowSet::sampled(&sh, 2, &[32])] {
                for precision in [Precision::Fp8, Precision::Fp16] {
                    let reading = implementation(precision).reading();
                    let sums = RowSums::read(&p, &rows, reading);
                    assert_eq!(sums.spread.len(), rows.count() * sh.d);
                    for (full, compact) in rows.each() {
                        let (w, v) = row_by_hand(&p, precision, full);
                        for x in 0..sh.d {
                            let sum = |f: &dyn Fn(f64) -> f64| -> f64 {
                                w.iter()
                                    .enumerate()
                                    .map(|(j, &w)| (f(w) * v[j * sh.d + x]).powi(2))
                                    .sum()
                            };
                            let (pp, rr) = (sum(&|w| w), sum(&|w| reading.p_rounding(w)));
                            let got = sums.spread[compact * sh.d + x];
                            let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs() + 1e-300;
                            assert!(
                                close(got.pp, pp) && close(got.rr, rr),
                                "{text} {precision:?} row {full} column {x}: {got:?}, {pp} {rr}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// An FP8 implementation of the coarsest kind the model allows, written out: P rounded
    /// to unscaled e4m3 relative to the row's final maximum, l in f32 of the unrounded P, P·V in
    /// steps of 32 keys, each product truncated toward zero to 13 fraction bits of the step's
    /// largest term (Hopper's FP22, src/emulation/general.rs), the sum kept in f32. Returns its
    /// worst kernel error over bound, and that of an all-zero output.
    fn coarse_fp8(sh: &Shape) -> (f64, f64) {
        let p = Problem::new(sh, 0);
        let rows = RowSet::all(sh);
        let model = implementation(Precision::Fp8);
        let refs = References::finish(&p, &model, &rows, RowSums::read(&p, &rows, model.reading()));
        let e4m3 = |x: f64| crate::fp8::decode(crate::fp8::encode(x as f32)) as f64;
        let truncate = |t: f64, largest: f64| {
            let ulp = 2f64.powf(largest.log2().floor() - 13.0);
            (t / ulp).trunc() * ulp
        };
        let (mut worst, mut zeros) = (0f64, 0f64);
        for (full, compact) in rows.each() {
            let (w, v) = row_by_hand(&p, Precision::Fp8, full);
            let l: f32 = w.iter().map(|&x| x as f32).sum();
            let pr: Vec<f64> = w.iter().map(|&x| e4m3(x)).collect();
            for x in 0..sh.d {
                let mut acc = 0f64;
                for step in (0..w.len()).step_by(32).map(|g| g..(g + 32).min(w.len())) {
                    let t: Vec<f64> = step.map(|j| pr[j] * v[j * sh.d + x]).collect();
                    let largest = t.iter().fold(acc.abs(), |m, t| m.max(t.abs()));
                    acc =
                        (acc + t.iter().map(|&t| truncate(t, largest)).sum::<f64>()) as f32 as f64;
                }
                let i = compact * sh.d + x;
                let o = (acc as f32 / l) as f64;
                worst = worst.max((o - refs.kernel[i]).abs() / refs.kernel_bound[i]);
                zeros = zeros.max(refs.kernel[i].abs() / refs.kernel_bound[i]);
            }
        }
        (worst, zeros)
    }

    #[test]
    fn a_coarse_fp8_implementation_stays_well_inside_its_bound_on_every_distribution() {
        for text in [
            "1x2x1x128:sk=8192",
            "1x2x2x64:sk=4096:qk=2",
            "1x2x1x128:sk=4096:rotate",
        ] {
            for dist in crate::shapes::Dist::ALL {
                let sh = Shape {
                    dist,
                    ..Shape::parse_inline(text).unwrap().unwrap()
                };
                let (worst, _) = coarse_fp8(&sh);
                // Measured up to 0.098 (huge_v, rotated decode) where the statistical terms
                // bound it. Hoeffding's factor c = 7.5 is what keeps it there: with c = 1 the
                // same implementation reaches 0.49. This implementation sums O in FP22 over
                // every key: on flat_positive_v, whose V signs are not fair coins, the bound
                // is the worst case alone (Dist::v_signs_symmetric) and it reaches 0.128
                // (S_k 8192); with the statistical terms it reached 1.88.
                assert!(worst < 0.25, "{text} {dist:?}: err/bound {worst}");
            }
        }
        // And zeros fail on a long decode row: the bound is below the output.
        let (_, zeros) = coarse_fp8(&Shape::parse_inline("1x2x1x128:sk=8192").unwrap().unwrap());
        assert!(zeros > 1.0, "{zeros}");
    }
}
