//! The error model (docs/DESIGN.md "Error model"): per output element, how far a correct
//! kernel may be from the kernel reference, and a correct kernel on correctly quantized inputs
//! from the end-to-end reference. Every limit of the correctness gates is one of these bounds,
//! computed from the problem's own data, so it holds for S = 1 as for S = 65536 and for any
//! input scale; nothing is keyed by a shape's name.
//!
//! Notation: u32 = 2^-24 and u16 = 2^-11 (unit roundoffs), p_j the kernel reference's softmax
//! weights (max 1 before normalization), A = Σ_j p_j |v̂_j| / Σ_j p_j, O the reference output,
//! n_i the keys row i sees (S_k, or fewer under a causal mask), T = ceil(ceil(n_i / 64) /
//! KV_SPLIT) the KV tiles one warp's chain sums for that row (a tile the mask hides wholly
//! changes no sum), D the head dimension.
//!
//! With a rescale threshold τ (cuda/kernels.toml `rescale_threshold`, Stage C's 8) the kernel's
//! running maximum lags the true one by at most τ, so its weights reach 2^τ instead of 1. No
//! term below changes: each is relative to the sums it bounds (the roundings of P, of the
//! steps and of the rescale, which then runs less often), a weight is still below f16's normal
//! range only where the reference's is (the kernel's weight is the larger), each f16 subnormal
//! error is at most 2^-25 in units of the lagging maximum and shrinks with every later rescale,
//! and l stays about 1 or more in those units (the f16 weight of the key that set m, as with
//! the exact maximum). Weights stay below 2^(τ+1) where |m| < 2^24 (there m + τ is exact in f32
//! and the rounding of a scaled maximum is under 1): the scaled scores the runner's inputs reach
//! stay near 2^16 at most (qk_std <= 100, shapes/mod.rs); far beyond, m + τ could round up by an
//! ulp of m and a weight pass f16's range.
//!
//! Kernel (against the reference on the dequantized codes), per element:
//! - scores: D / 16 MMA steps of 16 exact products (each step off by at most 16 u32 of the sum
//!   of magnitudes: products are exact, the alignment may truncate), the scale and the max
//!   subtraction (one fma, `score = "fused"`: one rounding of |acc·c − m| <= 2 max|s| where
//!   the scaled score and the subtraction took two) and `ex2.approx`: the exponent is off by
//!   at most
//!   δ = (D + 8) u32 · qk_scale_log2 · ‖q̂_i‖ · max_j ‖k̂_j‖ (Cauchy-Schwarz; 72 u32 at
//!   D = 64), so each weight by a
//!   factor within 2^±δ; P is rounded to f16 (u16) and `ex2.approx` adds 2^-22:
//!   ρ = (2^δ − 1) + 2^-22 + u16, and the output moves by at most ρ · (A + |O|).
//! - weights below f16's normal range (2^-14) are off by up to 2^-25 absolute each:
//!   n_sub · 2^-25 · (max|v̂| + |O|).
//! - P·V in f32: per tile 4 MMA steps (16 u32 each) and one rescale: 65 T u32 · A, and the
//!   merge of the row's S = KV_SPLIT chains (times the CTAs a split launch deals its keys
//!   to: src/backend/cuda/identity/geometry.rs `kv_ctas`), one product and S − 1 fmas, with slack:
//!   4 max(S, 2) u32 · A (8 u32 at S <= 2).
//! - the row sum l = P·1 on the tensor cores (`row_sum = "mma"`), as P·V: per tile 4 MMA
//!   steps (16 u32 each) and one rescale, and the same merge: (65 T + 4 max(S, 2)) u32 · |O|.
//! - the end: two f32 operations and the f16 rounding: (u16 + 4 u32) |O| + 2^-25.
//! - a row that sees no key (causal, S_q > S_k) is written as zeros: its bound is 0, so
//!   anything but an exact zero fails.
//!
//! End to end (against the reference on the original f32 inputs) adds the quantization of
//! correctly rounded E4M3 codes: each v̂ within 2^-4 |v| + 2^-10 s_v of v (s_v the head's V
//! scale; 2^-10 s_v is half the subnormal step), so Σ p̂ |v̂ − v| <= 2^-4/(1 − 2^-4) A +
//! 2^-10 s_v / (1 − 2^-4); and scores off by at most Δ_i = max_j |ŝ_ij − s_ij| (measured on the
//! actual data: the codes themselves are checked exactly by the quantizer gate), which moves
//! each weight by a factor within e^±2Δ, so the output by at most (e^{2Δ} − 1) Σ p̂ |v − O|.

/// f32 unit roundoff.
const U32: f64 = 1.0 / (1u64 << 24) as f64;
/// f16 unit roundoff.
const U16: f64 = 1.0 / 2048.0;
/// Half the spacing of f16 subnormals.
const F16_SUB_HALF: f64 = 1.0 / (1u64 << 25) as f64;
/// Weights below this are f16 subnormals.
pub const F16_MIN_NORMAL: f64 = 1.0 / 16384.0;
/// E4M3: relative half-ulp of normals and half the subnormal step (in units of the scale).
const E4M3_REL: f64 = 1.0 / 16.0;
const E4M3_SUB_HALF: f64 = 1.0 / 1024.0;

/// What the bounds of one head need beyond the per-row figures.
#[derive(Debug, Clone, Copy)]
pub struct HeadFacts {
    /// softmax_scale · log2(e): the kernel's scores are in base 2.
    pub qk_scale_log2: f64,
    /// D: the length of each score's dot product.
    pub head_dim: usize,
    /// max_j ‖k̂_j‖₂ over the head's keys.
    pub k_norm_max: f64,
    /// max |v̂| over the head.
    pub v_abs_max: f64,
    /// The head's V scale.
    pub v_scale: f64,
    /// The kernel's KV split: how many chains a row's tiles are dealt to.
    pub kv_split: usize,
}

impl HeadFacts {
    /// KV tiles in one warp's chain for a row that sees `keys` keys.
    pub fn tiles(&self, keys: usize) -> usize {
        keys.div_ceil(64).div_ceil(self.kv_split.max(1))
    }
}

/// Per query row.
#[derive(Debug, Clone, Copy)]
pub struct RowFacts {
    /// ‖q̂_i‖₂.
    pub q_norm: f64,
    /// Keys the row sees (S_k, or fewer under a causal mask).
    pub keys: usize,
    /// Keys whose weight is below the reading's small-weight threshold ([`F16_MIN_NORMAL`]
    /// for the kernel's f16 P; the format's smallest normal for `check`'s models).
    pub subnormal_weights: usize,
    /// max_j |ŝ_ij − s_ij| (natural-log units, scale applied).
    pub score_shift: f64,
}

/// The two bounds of one element: `a` = Σ p̂|v̂| / Σ p̂, `o_k` and `o_e` the two references.
pub fn element(head: &HeadFacts, row: &RowFacts, a: f64, o_k: f64, o_e: f64) -> (f64, f64) {
    let t = head.tiles(row.keys) as f64;
    let merge = 4.0 * head.kv_split.max(2) as f64;
    let steps = head.head_dim as f64 + 8.0;
    let delta = steps * U32 * head.qk_scale_log2 * row.q_norm * head.k_norm_max;
    let rho = (delta.exp2() - 1.0) + 2f64.powi(-22) + U16;
    let (ok, oe) = (o_k.abs(), o_e.abs());
    let kernel = rho * (a + ok)
        + row.subnormal_weights as f64 * F16_SUB_HALF * (head.v_abs_max + ok)
        + (65.0 * t + merge) * U32 * a
        + (65.0 * t + merge) * U32 * ok
        + (U16 + 4.0 * U32) * ok
        + F16_SUB_HALF;
    let shrink = 1.0 - E4M3_REL;
    let sub = E4M3_SUB_HALF * head.v_scale;
    let v_term = (E4M3_REL * a + sub) / shrink;
    let a_orig = (a + sub) / shrink;
    let score_term = (2.0 * row.score_shift).exp_m1() * (a_orig + oe);
    (kernel, kernel + v_term + score_term)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A head whose rows (of [`ROW`]'s 64 keys per tile) sum `tiles` tiles in one chain.
    fn head(tiles: usize) -> HeadFacts {
        HeadFacts {
            qk_scale_log2: 0.125 * std::f64::consts::LOG2_E,
            head_dim: 64,
            k_norm_max: 10.0,
            v_abs_max: 4.0,
            v_scale: 4.0 / 448.0,
            kv_split: tiles_split(tiles),
        }
    }

    /// [`ROW`] sees 1024 · 64 keys: a split of 1024 / tiles gives chains of `tiles` tiles.
    fn tiles_split(tiles: usize) -> usize {
        1024 / tiles
    }

    const ROW: RowFacts = RowFacts {
        q_norm: 8.0,
        keys: 1024 * 64,
        subnormal_weights: 0,
        score_shift: 0.0,
    };

    #[test]
    fn a_row_chain_counts_only_the_tiles_its_keys_reach() {
        let h = HeadFacts {
            kv_split: 2,
            ..head(1)
        };
        assert_eq!(
            [
                h.tiles(1),
                h.tiles(64),
                h.tiles(65),
                h.tiles(129),
                h.tiles(4096)
            ],
            [1, 1, 1, 2, 32]
        );
        let few = RowFacts { keys: 1, ..ROW };
        let many = RowFacts { keys: 8192, ..ROW };
        assert!(element(&h, &few, 0.8, 0.3, 0.3).0 < element(&h, &many, 0.8, 0.3, 0.3).0);
    }

    #[test]
    fn each_tile_of_a_chain_adds_65_u32_of_a_and_65_of_the_output_as_p_v_and_p_1_do() {
        // One split (the merge's 8 u32 fixed); rows of 64 and 128 keys: one tile and two.
        let h = HeadFacts {
            kv_split: 1,
            ..head(1)
        };
        let one = RowFacts { keys: 64, ..ROW };
        let two = RowFacts { keys: 128, ..ROW };
        let per_tile = |a: f64, o: f64| element(&h, &two, a, o, o).0 - element(&h, &one, a, o, o).0;
        // The output alone: l's steps (P·1 on the tensor cores, change 31) as P·V's.
        assert!(
            (per_tile(0.0, 1.0) / U32 - 65.0).abs() < 1e-6,
            "{}",
            per_tile(0.0, 1.0) / U32
        );
        assert!(
            (per_tile(1.0, 0.0) / U32 - 65.0).abs() < 1e-6,
            "{}",
            per_tile(1.0, 0.0) / U32
        );
    }

    #[test]
    fn merging_more_chains_widens_the_bound_by_four_u32_per_chain_past_two() {
        // One tile per chain at any split: only the merge differs.
        let row = RowFacts { keys: 64, ..ROW };
        let with = |kv_split| {
            let h = HeadFacts {
                kv_split,
                ..head(1)
            };
            element(&h, &row, 0.8, 0.3, 0.3).0
        };
        assert_eq!(
            with(1),
            with(2),
            "one or two chains: the 8 u32 it always had"
        );
        let widened = with(32) - with(2);
        let expected = (4.0 * 32.0 - 8.0) * U32 * (0.8 + 0.3);
        assert!(
            (widened - expected).abs() < 1e-3 * expected,
            "{widened} vs {expected}"
        );
    }

    #[test]
    fn a_longer_dot_product_widens_the_score_term() {
        let wide = HeadFacts {
            head_dim: 128,
            ..head(8)
        };
        let row = RowFacts {
            q_norm: 2000.0,
            ..ROW
        };
        let (d64, _) = element(&head(8), &row, 0.8, 0.3, 0.3);
        let (d128, _) = element(&wide, &row, 0.8, 0.3, 0.3);
        assert!(d128 > d64 * 1.3, "{d64} {d128}");
    }

    #[test]
    fn the_kernel_bound_is_a_few_f16_roundings_of_the_output_for_ordinary_data() {
        // Chains of 8 tiles, as the kernel's two splits sum 1024 keys.
        let h = HeadFacts {
            kv_split: 2,
            ..head(8)
        };
        let row = RowFacts {
            keys: 16 * 64,
            ..ROW
        };
        let (k, _) = element(&h, &row, 0.8, 0.3, 0.3);
        // ρ·(A + |O|) + u16·|O| ≈ 2^-11 · 1.4, plus small f32 terms.
        assert!(k > U16 * 1.4 && k < U16 * 1.6, "{k}");
    }

    #[test]
    fn longer_chains_and_subnormal_weights_widen_the_kernel_bound() {
        let (short, _) = element(&head(1), &ROW, 0.8, 0.3, 0.3);
        let (long, _) = element(&head(1024), &ROW, 0.8, 0.3, 0.3);
        assert!(long > short * 1.5, "{short} {long}");
        let many_tiny = RowFacts {
            subnormal_weights: 60_000,
            ..ROW
        };
        let (tiny, _) = element(&head(1), &many_tiny, 0.8, 0.3, 0.3);
        assert!(tiny > short + 60_000.0 * F16_SUB_HALF * 4.0, "{tiny}");
    }

    #[test]
    fn the_end_to_end_bound_adds_v_rounding_and_grows_with_the_score_shift() {
        let (k, e) = element(&head(8), &ROW, 0.8, 0.3, 0.3);
        assert!(
            e - k >= 0.8 / 16.0,
            "V rounding alone is up to 2^-4 of A: {}",
            e - k
        );
        let shifted = RowFacts {
            score_shift: 0.1,
            ..ROW
        };
        let (_, e2) = element(&head(8), &shifted, 0.8, 0.3, 0.3);
        let a_orig = (0.8 + 4.0 / 448.0 / 1024.0) / (15.0 / 16.0);
        let expected = 0.2f64.exp_m1() * (a_orig + 0.3);
        assert!(
            (e2 - e - expected).abs() < 1e-12,
            "{} vs {expected}",
            e2 - e
        );
    }
}
