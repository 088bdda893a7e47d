//! Which error model bounds an output, and how an implementation read its inputs
//! (docs/DESIGN.md "Grading other implementations").
//!
//! Two families of models share the references and their sums:
//! - [`Model::StageC`]: the kernel under test's own algorithm, step for step
//!   ([`super::bound::element`]); the runner's gates.
//! - [`Model::Implementation`]: any attention implementation that read its inputs in one
//!   [`Precision`] and wrote its output in one [`OutputFormat`] (`sdpa-runner check`, and
//!   the runner's gates of a kernel that is not Stage C). It knows nothing of the
//!   implementation's tiles but, for a manifest kernel, the length of its FP8 accumulation
//!   chains, so every step is bounded for the worst algorithm of its class:
//!   - scores: f32 accumulation, (D + 8) u32 of the magnitudes' sum at 16-bit inputs
//!     (products exact, as on tensor cores), (2D + 8) u32 at fp32 (products rounded); at FP8
//!     add (⌈D / 32⌉ + 2) · 2^-13: Hopper's FP8 tensor cores keep about 14 bits while they
//!     accumulate (DeepSeek-V3, §3.3.2), one truncation per 32-deep step. With Cauchy-Schwarz
//!     the exponent is off by δ = that · qk_scale_log2 · ‖q̂_i‖ · max_j ‖k̂_j‖.
//!   - exp: 2^-21 relative (two f32 ulps: `ex2.approx` or `expf`).
//!   - P rounded to the precision's format for the second GEMM (FP8: e4m3 without a scale,
//!     the coarsest of the conventions in use; a P scaled by 448, as cuDNN's, rounds finer):
//!     relative half-ulp u_P, and each weight below the format's smallest normal is off by at
//!     most half its subnormal step h_P: ρ = (2^δ − 1) + 2^-21 + u_P moves the output by
//!     ρ (A + |O|), the small weights by n_small · h_P · (max |v̂| + |O|) / l.
//!   - P·V: f32 accumulation over the row's n keys with a rescale per tile,
//!     (1.0625 n + 16) u32 · A; at FP8 plus (⌈c / 32⌉ + 2) · 2^-13 · A (the same 14-bit
//!     accumulation) and the products' truncation, min(A′, c · 2^-13 · A′), in FP22 chains of
//!     c keys ([`Implementation::fp22_chain`]: every key where the tiles are unknown, a
//!     kernel's KV tile where its manifest says it promotes each tile to f32).
//!   - the row sum l in f32: (n + 16) u32 · |O|.
//!   - the output's rounding ([`OutputFormat`]): relative u_O · |O| plus half its smallest
//!     subnormal step (times the output's scale for e4m3).
//!   - end to end, the inputs' own rounding to the precision: each v̂ within u_in |v| + h_in of
//!     v (FP8: 2^-4 and 2^-10 of the head's scale; fp16 2^-11 and 2^-25; bf16 2^-8; fp32
//!     none), and the scores' measured shift Δ_i, as in the kernel's model.
//!
//!   Where V's signs are fair coins given Q, K and |V| (every distribution of src/inputs.rs
//!   but `flat_positive_v`: [`crate::shapes::Dist::v_signs_symmetric`]), the terms that V's
//!   signs carry also have a statistical bound (Hoeffding), and each takes the smaller of the
//!   two ([`implementation_element`], [`Spread`]); for the others `References::finish` passes
//!   no spread, and the worst case alone bounds them.

use half::{bf16, f16};
use serde::{Deserialize, Serialize};

use crate::emulation::Algorithm;
use crate::fp8::Fp8Tensor;
use crate::kernels::PvAccumulation;

const U32: f64 = 1.0 / (1u64 << 24) as f64;

/// What an implementation read and computed in (`check --precision`): FP8 reads the e4m3
/// codes and their descale factors; the others the f32 originals cast to that type.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    Fp8,
    Fp16,
    Bf16,
    Fp32,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp8 => "fp8",
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
            Precision::Fp32 => "fp32",
        }
    }

    /// The format P is rounded to before P·V.
    fn p_format(self) -> Format {
        match self {
            Precision::Fp8 => E4M3,
            Precision::Fp16 => F16,
            Precision::Bf16 => BF16,
            Precision::Fp32 => F32,
        }
    }

    /// The inputs' own rounding, (relative, absolute): the absolute part in units of the
    /// head's scale at FP8.
    fn input_rounding(self, head_scale: f64) -> (f64, f64) {
        match self {
            Precision::Fp8 => (E4M3.rel, E4M3.sub_half * head_scale),
            Precision::Fp16 => (F16.rel, F16.sub_half),
            Precision::Bf16 => (BF16.rel, BF16.sub_half),
            Precision::Fp32 => (0.0, 0.0),
        }
    }

    /// Relative error of a score's dot product of length `d`, of the sum of magnitudes.
    fn score_accumulation(self, d: usize) -> f64 {
        match self {
            Precision::Fp8 => (d as f64 + 8.0) * U32 + fp8_accumulation(d),
            Precision::Fp16 | Precision::Bf16 => (d as f64 + 8.0) * U32,
            Precision::Fp32 => (2.0 * d as f64 + 8.0) * U32,
        }
    }

    /// Relative error of P·V over `n` keys, at FP8 in FP22 chains of at most `chain` keys, of
    /// a magnitude that bounds the sum of the chains' partial sums (the worst case: each
    /// chain's steps are relative to its own partial sums, whose magnitudes add up to at most
    /// Σ |p̃ v̂|). Against a bound on every partial sum instead (the statistical branch's M),
    /// every step of the row counts: `chain` = `n`.
    fn pv_accumulation(self, n: usize, chain: usize) -> f64 {
        let f32_chain = (1.0625 * n as f64 + 16.0) * U32;
        match self {
            Precision::Fp8 => f32_chain + fp8_accumulation(chain),
            _ => f32_chain,
        }
    }
}

/// The relative step of Hopper's FP8 accumulation (FP22): 13 fraction bits kept.
const FP22_STEP: f64 = 1.0 / 8192.0;

/// Hopper's FP8 tensor cores: about 14 bits kept while accumulating, one truncation per
/// 32-deep step, over `len` products.
fn fp8_accumulation(len: usize) -> f64 {
    (len.div_ceil(32) as f64 + 2.0) * FP22_STEP
}

/// A floating-point format's rounding.
#[derive(Debug, Clone, Copy)]
struct Format {
    /// Half an ulp of a normal value, relative.
    rel: f64,
    /// The smallest normal value.
    min_normal: f64,
    /// Half the subnormal step.
    sub_half: f64,
}

const E4M3: Format = Format {
    rel: 1.0 / 16.0,
    min_normal: 1.0 / 64.0,
    sub_half: 1.0 / 1024.0,
};
const F16: Format = Format {
    rel: 1.0 / 2048.0,
    min_normal: 1.0 / 16384.0,
    sub_half: 1.0 / (1u64 << 25) as f64,
};
const BF16: Format = Format {
    rel: 1.0 / 256.0,
    min_normal: f32::MIN_POSITIVE as f64,
    sub_half: 1.0e-40,
};
const F32: Format = Format {
    rel: U32,
    min_normal: f32::MIN_POSITIVE as f64,
    sub_half: 1.0e-45,
};

/// How an implementation's output is stored (`check`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "dtype")]
pub enum OutputFormat {
    F16,
    Bf16,
    F32,
    /// e4m3 codes times `scale` (cuDNN's FP8 output on Hopper).
    E4m3 {
        scale: f64,
    },
}

impl OutputFormat {
    pub fn name(&self) -> &'static str {
        match self {
            OutputFormat::F16 => "f16",
            OutputFormat::Bf16 => "bf16",
            OutputFormat::F32 => "f32",
            OutputFormat::E4m3 { .. } => "e4m3",
        }
    }

    /// (relative, absolute) rounding of one output element.
    fn rounding(&self) -> (f64, f64) {
        match *self {
            OutputFormat::F16 => (F16.rel, F16.sub_half),
            OutputFormat::Bf16 => (BF16.rel, BF16.sub_half),
            OutputFormat::F32 => (F32.rel, F32.sub_half),
            OutputFormat::E4m3 { scale } => (E4M3.rel, E4M3.sub_half * scale),
        }
    }
}

/// An implementation graded by `check`, or a kernel the runner bounds by this model
/// ([`Model::of`]): what it read and what it wrote, and at FP8 how long its accumulation
/// chains may be.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Implementation {
    pub precision: Precision,
    pub output: OutputFormat,
    /// At FP8, the most keys whose products of P·V one FP22 accumulator sums before it is
    /// promoted to f32 (a kernel's per-tile Ô: its KV tile); `None`, every key of the row
    /// (an implementation of unknown tiles, as `check` grades: cuDNN's FP8 SDPA is one).
    pub fp22_chain: Option<usize>,
}

impl Implementation {
    /// An implementation of unknown tiles: its FP8 accumulation may run over every key.
    pub fn any(precision: Precision, output: OutputFormat) -> Self {
        Implementation {
            precision,
            output,
            fp22_chain: None,
        }
    }

    /// The keys one FP22 chain of P·V sums at most on a row of `n` keys.
    fn chain(&self, n: usize) -> usize {
        self.fp22_chain.map_or(n, |c| c.min(n))
    }
}

/// The error model that bounds an output.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Model {
    /// The kernel under test (Stage C), with its KV split.
    StageC {
        kv_split: usize,
    },
    Implementation(Implementation),
}

impl Model {
    /// The model that bounds a kernel of algorithm `alg`: Stage C's own, step for step
    /// (`bound.rs`), for Stage C's arithmetic; for any other kernel, the model of an FP8
    /// implementation that writes f16 (P rounded to e4m3, FP8 tensor-core accumulation, f32
    /// chains over the row's keys): it bounds the worst algorithm of that class, and a P in
    /// f16 or a shorter chain only rounds finer. A kernel whose P·V sums each KV tile in FP22
    /// and adds it to O in f32 (`pv = per-tile`, `accumulator = fp22`: Stage D) is bounded with
    /// FP22 chains of its tile's keys, as its manifest says; a kernel that does not keep that
    /// promise (`MUTANT_NO_PROMOTION`) exceeds the bound where its sum stagnates.
    pub fn of(alg: Algorithm) -> Self {
        if alg.is_stage_c() {
            Model::StageC {
                kv_split: alg.kv_split,
            }
        } else {
            let promoted = alg.pv == PvAccumulation::PerTile;
            Model::Implementation(Implementation {
                fp22_chain: promoted.then_some(alg.block_n),
                ..Implementation::any(Precision::Fp8, OutputFormat::F16)
            })
        }
    }

    /// What the references read, and below which weight a weight is counted small.
    pub fn reading(&self) -> Reading {
        match self {
            Model::StageC { .. } => Reading::STAGE_C,
            Model::Implementation(i) => Reading {
                precision: i.precision,
                small_weight: i.precision.p_format().min_normal,
                spread: true,
            },
        }
    }
}

/// How the kernel reference reads the inputs, the threshold of the small weights it counts
/// per row, and whether it sums the spread of each element's terms ([`Spread`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    pub precision: Precision,
    pub small_weight: f64,
    /// Whether the sums include [`Spread`] (the implementation model's statistical terms).
    pub spread: bool,
}

impl Reading {
    /// The runner's: FP8 codes, weights below f16's smallest normal, no spread (Stage C's
    /// model is step for step and needs none).
    pub const STAGE_C: Reading = Reading {
        precision: Precision::Fp8,
        small_weight: super::bound::F16_MIN_NORMAL,
        spread: false,
    };

    /// The most a weight `w` (relative to the row's maximum, so at most 1) moves when P is
    /// rounded to nearest in this reading's format: half an ulp of a normal, else up to half
    /// the subnormal step, and never more than `w` itself (a weight below half the smallest
    /// subnormal rounds to zero). Subnormal P is assumed, as `cvt.rn.satfinite.e4m3x2` and
    /// f16/bf16 conversions keep it; a conversion that flushed subnormals to zero would move a
    /// weight by up to the smallest normal, which neither this nor the worst case allows.
    pub fn p_rounding(&self, w: f64) -> f64 {
        let f = self.precision.p_format();
        if w >= f.min_normal {
            f.rel * w
        } else {
            w.min(f.sub_half)
        }
    }

    /// [`Reading::p_rounding`]'s three figures, (relative, smallest normal, half the subnormal
    /// step): the GPU references compute the same function from them (cuda/reference_f64.cu).
    pub fn p_rounding_figures(&self) -> [f64; 3] {
        let f = self.precision.p_format();
        [f.rel, f.min_normal, f.sub_half]
    }
}

/// Per element of a row, the squared sizes of its terms: `pp` = Σ_j w_j² v̂_j² and `rr` =
/// Σ_j r(w_j)² v̂_j² ([`Reading::p_rounding`]), over the row's visible keys, with the weights
/// relative to the row's maximum (divide their roots by l).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub pp: f64,
    pub rr: f64,
}

/// Per element, a statistical term fails to hold with probability at most this (three terms:
/// at most 3e-12 per element, 3e-6 for a problem of a million checked elements).
pub const SPREAD_ALPHA: f64 = 1e-12;

/// Hoeffding's factor for `events` sums of independent signs, each with coefficients of
/// root-sum-square σ: all of them stay within factor·σ but with probability at most
/// [`SPREAD_ALPHA`] (`P(|Σ| ≥ tσ) ≤ 2 exp(−t²/2)` for each, a union bound over them).
fn hoeffding(events: f64) -> f64 {
    (2.0 * (2.0 * events / SPREAD_ALPHA).ln()).sqrt()
}

/// Reads tensor elements as an implementation of one precision took them.
pub(crate) struct Reader {
    precision: Precision,
    table: [f64; 256],
}

impl Reader {
    pub fn new(precision: Precision) -> Self {
        Reader {
            precision,
            table: crate::fp8::decode_table_f64(),
        }
    }

    /// Elements `range` of `t` (whose originals are `orig`), all in slice `slice` (the index
    /// of its scale).
    pub fn values<'a>(
        &'a self,
        t: &'a Fp8Tensor,
        orig: &'a [f32],
        slice: usize,
        range: std::ops::Range<usize>,
    ) -> impl Iterator<Item = f64> + 'a {
        let scale = t.scales[slice] as f64;
        t.codes[range.clone()]
            .iter()
            .zip(&orig[range])
            .map(move |(&c, &x)| match self.precision {
                Precision::Fp8 => self.table[c as usize] * scale,
                Precision::Fp16 => f16::from_f32(x).to_f64(),
                Precision::Bf16 => bf16::from_f32(x).to_f64(),
                Precision::Fp32 => x as f64,
            })
    }
}

/// The two bounds of one element under an [`Implementation`]'s model: `a` = Σ p̂|v̂| / Σ p̂,
/// `o_k` and `o_e` the two references, `l` = Σ p̂ (weights relative to the row's maximum),
/// and the element's [`Spread`] where the sums have it.
///
/// The worst case (module docs) assumes every weight's error lines up with the sign of its
/// key's v̂. Those errors (P's rounding, the scores' accumulation, `exp`) are functions of Q
/// and K alone, and every distribution but `flat_positive_v` (whose elements get no spread:
/// [`crate::shapes::Dist::v_signs_symmetric`]) draws V independently of Q and K, its rows
/// independent and each row's distribution unchanged by v_j → −v_j (src/inputs.rs): given Q, K and each
/// row of V up to its sign, the elements of a column of V have independent fair signs. So
/// with `spread`, three terms are also bounded by Hoeffding's inequality over those signs,
/// and each takes the smaller of its two bounds:
/// - the weights' errors through V, Σ_j Δ_j v̂_j with |Δ_j| ≤ (2^δ − 1 + 2^-21) w_j + r(w_j):
///   c·((2^δ − 1 + 2^-21)·√pp + √rr) / l (Minkowski), c = [`hoeffding`] of one sum;
/// - the magnitude of every partial sum of P·V that the accumulation rounds: any subset of
///   the keys chosen without looking at V's signs (tiles, splits, their order), at most 2n of
///   them per element: M = c_M·√(Σ t̃_j²)/l, where |t̃_j| = |p̃_j v̂_j| is at most
///   ((2^δ + 2^-21) w_j + r(w_j))|v̂_j|. M replaces A in the accumulation terms (each step's
///   error is relative to the largest term it aligns to, a partial sum or a product);
/// - at FP8, the truncation of the products aligned to a larger partial sum (at most
///   min(|t̃|, 2^-13 M) each, toward zero, a martingale in the signs): c·min(√Σ t̃², √n·2^-13 M).
///
/// Terms that are not signed by V keep their worst case: the row sum's (ρ + small)·|O|, the
/// output's own rounding, and the end-to-end terms.
pub fn implementation_element(
    imp: &Implementation,
    head: &super::bound::HeadFacts,
    row: &super::bound::RowFacts,
    (a, o_k, o_e, l): (f64, f64, f64, f64),
    spread: Option<Spread>,
) -> (f64, f64) {
    let prec = imp.precision;
    let n = row.keys;
    let p = prec.p_format();
    let delta =
        prec.score_accumulation(head.head_dim) * head.qk_scale_log2 * row.q_norm * head.k_norm_max;
    let weight_rel = (delta.exp2() - 1.0) + 2f64.powi(-21);
    let rho = weight_rel + p.rel;
    let small = row.subnormal_weights as f64 * p.sub_half / l.max(1.0);
    let (ok, oe) = (o_k.abs(), o_e.abs());
    let (out_rel, out_abs) = imp.output.rounding();
    // The weights' errors through V, and the accumulation of P·V: its rounding steps relative
    // to the partial sums (at most A), and at FP8 each product truncated to 13 fraction bits of
    // the step's largest term, at most min(|t̃|, 2^-13 A') each with A' = Σ|t̃|/l bounding every
    // term.
    let mut through_v = rho * a + small * head.v_abs_max;
    let a_t = (1.0 + rho) * a + small * head.v_abs_max;
    // In FP22 chains of at most `chain` keys, each product is truncated to 2^-13 of its chain's
    // largest term, itself at most the chain's share of A'; the shares add up to A'.
    let chain = imp.chain(n);
    let truncated = match prec {
        Precision::Fp8 => a_t.min(chain as f64 * FP22_STEP * a_t),
        _ => 0.0,
    };
    let mut accumulation = prec.pv_accumulation(n, chain) * a_t + truncated;
    if let Some(Spread { pp, rr }) = spread.filter(|_| rho + small < 0.5) {
        // Second order: l̃ ≥ l (1 − ρ − small), and P is rounded from p̃ ≤ (1 + wr) w, whose
        // rounding is at most (1 + wr) r(w).
        let l_t = l * (1.0 - rho - small);
        let (root_pp, root_rr) = (pp.sqrt() / l_t, (1.0 + weight_rel) * rr.sqrt() / l_t);
        let c = hoeffding(1.0);
        through_v = through_v.min(c * (weight_rel * root_pp + root_rr));
        let root_t = (1.0 + weight_rel) * root_pp + root_rr;
        let m = hoeffding(2.0 * n as f64) * root_t;
        let products = match prec {
            Precision::Fp8 => c * root_t.min((n as f64).sqrt() * FP22_STEP * m),
            _ => 0.0,
        };
        // M bounds each partial sum, not their total over the chains: every step of the row.
        accumulation = accumulation.min(prec.pv_accumulation(n, n) * m + products);
    }
    let kernel = through_v
        + (rho + small) * ok
        + accumulation
        + (n as f64 + 16.0) * U32 * ok
        + out_rel * ok
        + out_abs;
    let (in_rel, in_abs) = prec.input_rounding(head.v_scale);
    let shrink = 1.0 - in_rel;
    let v_term = (in_rel * a + in_abs) / shrink;
    let a_orig = (a + in_abs) / shrink;
    let score_term = (2.0 * row.score_shift).exp_m1() * (a_orig + oe);
    (kernel, kernel + v_term + score_term)
}

#[cfg(test)]
mod tests {
    use super::super::bound::{HeadFacts, RowFacts};
    use super::*;

    const HEAD: HeadFacts = HeadFacts {
        qk_scale_log2: 0.125 * std::f64::consts::LOG2_E,
        head_dim: 64,
        k_norm_max: 10.0,
        v_abs_max: 4.0,
        v_scale: 4.0 / 448.0,
        kv_split: 1,
    };
    const ROW: RowFacts = RowFacts {
        q_norm: 8.0,
        keys: 4096,
        subnormal_weights: 0,
        score_shift: 0.0,
    };

    fn bounds(precision: Precision, output: OutputFormat, row: &RowFacts) -> (f64, f64) {
        let imp = Implementation::any(precision, output);
        implementation_element(&imp, &HEAD, row, (0.8, 0.3, 0.3, 100.0), None)
    }

    #[test]
    fn coarser_precisions_get_wider_bounds_in_the_order_of_their_p_rounding() {
        let f32_ = bounds(Precision::Fp32, OutputFormat::F32, &ROW).0;
        let f16_ = bounds(Precision::Fp16, OutputFormat::F32, &ROW).0;
        let bf = bounds(Precision::Bf16, OutputFormat::F32, &ROW).0;
        let fp8 = bounds(Precision::Fp8, OutputFormat::F32, &ROW).0;
        assert!(
            f32_ < f16_ && f16_ < bf && bf < fp8,
            "{f32_} {f16_} {bf} {fp8}"
        );
        // FP8's P alone: 2^-4 of A + |O|.
        assert!(fp8 > (0.8 + 0.3) / 16.0, "{fp8}");
        // fp32: thousands of u32 at 4096 keys, still far below a 1% change of O.
        assert!(f32_ < 0.3 * 0.01 / 5.0, "{f32_}");
    }

    #[test]
    fn the_output_format_adds_its_own_rounding() {
        let f32_out = bounds(Precision::Fp16, OutputFormat::F32, &ROW).0;
        let f16_out = bounds(Precision::Fp16, OutputFormat::F16, &ROW).0;
        let e4m3_out = bounds(Precision::Fp16, OutputFormat::E4m3 { scale: 0.01 }, &ROW).0;
        let f16_rounding = 0.3 / 2048.0 + F16.sub_half;
        let f32_rounding = 0.3 * U32 + F32.sub_half;
        assert!((f16_out - f32_out - (f16_rounding - f32_rounding)).abs() < 1e-12);
        assert!(e4m3_out > f32_out + 0.3 / 16.0);
    }

    #[test]
    fn end_to_end_adds_the_input_rounding_only_below_fp32() {
        let (k, e) = bounds(Precision::Fp32, OutputFormat::F32, &ROW);
        assert_eq!(k, e);
        let (k, e) = bounds(Precision::Fp16, OutputFormat::F32, &ROW);
        assert!(e - k >= 0.8 / 2048.0, "{}", e - k);
    }

    #[test]
    fn small_weights_count_against_the_row_total() {
        let many = RowFacts {
            subnormal_weights: 1000,
            ..ROW
        };
        let (few, _) = bounds(Precision::Fp8, OutputFormat::F32, &ROW);
        let (lots, _) = bounds(Precision::Fp8, OutputFormat::F32, &many);
        // 1000 · 2^-10 · (4 + 0.3) / 100, and the FP8 products' truncation (4096 · 2^-13 = a
        // half of every term's magnitude, which the small weights raise by 1000 · 2^-10 · 4 / 100)
        // and the accumulation's steps, relative to the same magnitude.
        let raised = 1000.0 / 1024.0 * 4.0 / 100.0;
        let expected = 1000.0 / 1024.0 * 4.3 / 100.0
            + 0.5 * raised
            + Precision::Fp8.pv_accumulation(4096, 4096) * raised;
        assert!((lots - few - expected).abs() < 1e-12, "{}", lots - few);
    }

    #[test]
    fn with_spread_each_signed_term_takes_the_smaller_of_its_worst_case_and_hoeffdings_bound() {
        // A decode-like row: 8192 keys of similar weight, l = 300, A = 0.8, O = 0.01.
        let row = RowFacts { keys: 8192, ..ROW };
        let imp = Implementation::any(Precision::Fp8, OutputFormat::F32);
        let sums = (0.8, 0.01, 0.01, 300.0);
        let worst = implementation_element(&imp, &HEAD, &row, sums, None).0;
        // Σ w² v̂² = 11 (8192 weights of about l / 8192, v̂² about 1), P's rounding 2^-4 of
        // their roots.
        let spread = Spread {
            pp: 11.0,
            rr: 11.0 / 256.0,
        };
        let tight = implementation_element(&imp, &HEAD, &row, sums, Some(spread)).0;
        // By hand: c = √(2 ln(2/α)), c_M = √(2 ln(4n/α)).
        let delta = Precision::Fp8.score_accumulation(64) * HEAD.qk_scale_log2 * 8.0 * 10.0;
        let wr = delta.exp2() - 1.0 + 2f64.powi(-21);
        let (c, c_m) = (
            (2.0 * (2.0 / SPREAD_ALPHA).ln()).sqrt(),
            (2.0 * (4.0 * 8192.0 / SPREAD_ALPHA).ln()).sqrt(),
        );
        let small = 0.0; // ROW has no subnormal weights
        let l_t = 300.0 * (1.0 - (wr + E4M3.rel) - small);
        let (rpp, rrr) = (
            11f64.sqrt() / l_t,
            (1.0 + wr) * (11.0f64 / 256.0).sqrt() / l_t,
        );
        let through_v = c * (wr * rpp + rrr);
        let root_t = (1.0 + wr) * rpp + rrr;
        let m = c_m * root_t;
        let products = c * root_t.min(8192f64.sqrt() * 2f64.powi(-13) * m);
        let expected = through_v
            + (wr + E4M3.rel) * 0.01
            + Precision::Fp8.pv_accumulation(8192, 8192) * m
            + products
            + (8192.0 + 16.0) * U32 * 0.01
            + U32 * 0.01
            + F32.sub_half;
        assert!((tight - expected).abs() < 1e-15, "{tight} {expected}");
        // A third of the worst case, which is eight times the output.
        assert!(tight < worst / 3.0 && worst > 0.08, "{tight} {worst}");
        // A spread larger than the worst case leaves the worst case: never looser.
        let wide = Spread { pp: 1e8, rr: 1e8 };
        let same = implementation_element(&imp, &HEAD, &row, sums, Some(wide)).0;
        assert_eq!(same, worst);
        // Chains of 128 keys tighten the worst case only: M bounds each partial sum, not
        // their total, so the statistical terms count every step of the row whatever the chain.
        let chained = Implementation {
            fp22_chain: Some(128),
            ..imp
        };
        let chained_tight = implementation_element(&chained, &HEAD, &row, sums, Some(spread)).0;
        let chained_worst = implementation_element(&chained, &HEAD, &row, sums, None).0;
        assert!(
            chained_worst < worst && tight < chained_worst,
            "{tight} {chained_worst}"
        );
        assert_eq!(chained_tight, tight);
    }

    #[test]
    fn a_kernel_that_promotes_each_tile_to_f32_is_bounded_by_fp22_chains_of_its_tile() {
        let stage_d = Algorithm::of(&crate::kernels::project_spec("stage-d"));
        let Model::Implementation(promoted) = Model::of(stage_d) else {
            panic!("Stage D is bounded as an FP8 implementation")
        };
        assert_eq!(promoted.fp22_chain, Some(128), "its 128-key tiles");
        let running = Algorithm {
            pv: PvAccumulation::Running,
            ..stage_d
        };
        let Model::Implementation(unknown) = Model::of(running) else {
            panic!("an FP8 implementation")
        };
        assert_eq!(unknown.fp22_chain, None, "every key of the row");
        // A long row of one sign: 8192 keys, O = A = 0.8.
        let row = RowFacts { keys: 8192, ..ROW };
        let sums = (0.8, 0.8, 0.8, 8000.0);
        let bound = |imp: &Implementation| implementation_element(imp, &HEAD, &row, sums, None).0;
        let (tight, wide) = (bound(&promoted), bound(&unknown));
        // Every key in one chain: its truncation alone may take all of A' (8192 · 2^-13 = 1), and
        // zeros pass. In chains of 128 keys, 128 · 2^-13 of A' and six steps a chain, beside
        // P's rounding through V and O (2ρA, about 0.1).
        assert!(wide > 0.8 && tight < wide / 6.0, "{tight} {wide}");
        let delta = Precision::Fp8.score_accumulation(64) * HEAD.qk_scale_log2 * 8.0 * 10.0;
        let rho = delta.exp2() - 1.0 + 2f64.powi(-21) + E4M3.rel;
        let a_t = (1.0 + rho) * 0.8;
        let expected = a_t * (1.0 - 128.0 * FP22_STEP)
            + (fp8_accumulation(8192) - fp8_accumulation(128)) * a_t;
        assert!(
            (wide - tight - expected).abs() < 1e-12,
            "{} {expected}",
            wide - tight
        );
    }

    #[test]
    fn p_rounding_is_half_an_ulp_of_a_normal_weight_half_a_subnormal_step_or_the_weight() {
        let fp8 = Reading {
            precision: Precision::Fp8,
            small_weight: E4M3.min_normal,
            spread: true,
        };
        assert_eq!(fp8.p_rounding(0.5), 0.5 / 16.0);
        assert_eq!(fp8.p_rounding(0.01), 1.0 / 1024.0);
        assert_eq!(fp8.p_rounding(1e-4), 1e-4);
    }

    #[test]
    fn each_precision_reads_the_originals_or_the_codes() {
        let orig = [1.0f32 / 3.0, -2.7, 1e-3];
        let t = Fp8Tensor::quantize(&orig, 3);
        let read = |p| -> Vec<f64> { Reader::new(p).values(&t, &orig, 0, 0..3).collect() };
        assert_eq!(read(Precision::Fp32), orig.map(|x| x as f64).to_vec());
        assert_eq!(
            read(Precision::Fp16),
            orig.map(|x| f16::from_f32(x).to_f64()).to_vec()
        );
        assert_eq!(
            read(Precision::Bf16),
            orig.map(|x| bf16::from_f32(x).to_f64()).to_vec()
        );
        assert_eq!(read(Precision::Fp8), t.dequantize_f64());
    }
}
