//! Which algorithm the emulation follows: a kernel's numerics as cuda/kernels.toml describes
//! them (`[tiles]` block_n, `[numerics]`), plus the KV split its module publishes. A kernel
//! whose numerics are a combination of these needs no Rust to be emulated.

use serde::Serialize;

use crate::kernels::{
    Accumulator, KernelSpec, PPrecision, PvAccumulation, RowSum, STAGE_C_NUMERICS, ScoreScale,
};

/// Every choice of a kernel that its output's bits depend on, as far as the emulation models it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Algorithm {
    /// Chains a row's KV tiles are dealt to (split k takes tiles k, k + kv_split, ...).
    pub kv_split: usize,
    /// Keys per KV tile.
    pub block_n: usize,
    /// Depth of one tensor-core step of both products.
    pub mma_k: usize,
    pub p: PPrecision,
    pub row_sum: RowSum,
    pub pv: PvAccumulation,
    pub accumulator: Accumulator,
    pub score: ScoreScale,
    /// How far (log2 units) a tile's maximum must pass the running maximum before it moves
    /// (0: the exact running maximum).
    pub rescale_threshold: u32,
}

/// The largest tile the emulation's fixed buffers hold (cuda/kernels.toml allows up to 128).
pub const MAX_TILE: usize = 128;

impl Algorithm {
    /// Stage C as cuda/kernels.toml describes it, with the KV split its source defaults to: the
    /// `cpu` backend's algorithm without a manifest, and the tests'.
    pub const STAGE_C: Algorithm = Algorithm {
        kv_split: super::KV_SPLIT,
        block_n: super::KV_TILE,
        mma_k: STAGE_C_NUMERICS.mma_k,
        p: STAGE_C_NUMERICS.p_precision,
        row_sum: STAGE_C_NUMERICS.row_sum,
        pv: STAGE_C_NUMERICS.pv,
        accumulator: STAGE_C_NUMERICS.accumulator,
        score: STAGE_C_NUMERICS.score,
        rescale_threshold: STAGE_C_NUMERICS.rescale_threshold,
    };

    /// The algorithm of a manifest kernel, with the KV split of its default build
    /// (`tiles.kv_split`); a GPU run replaces it with the module's ([`Algorithm::with_split`]).
    pub fn of(spec: &KernelSpec) -> Self {
        let kv_split = spec.tiles.kv_split;
        Algorithm {
            kv_split: kv_split.max(1),
            block_n: spec.tiles.block_n as usize,
            mma_k: spec.numerics.mma_k,
            p: spec.numerics.p_precision,
            row_sum: spec.numerics.row_sum,
            pv: spec.numerics.pv,
            accumulator: spec.numerics.accumulator,
            score: spec.numerics.score,
            rescale_threshold: spec.numerics.rescale_threshold,
        }
    }

    /// The same algorithm with another KV split.
    pub fn with_split(self, kv_split: usize) -> Self {
        Algorithm {
            kv_split: kv_split.max(1),
            ..self
        }
    }

    /// Stage C's arithmetic, whatever its split and rescale threshold: the host runs it on its
    /// vectorized path (the general path gives the same bits), and its error model is Stage
    /// C's own.
    pub fn is_stage_c(&self) -> bool {
        let normalized = |a: Algorithm| Algorithm {
            rescale_threshold: 0,
            ..a.with_split(1)
        };
        normalized(*self) == normalized(Self::STAGE_C)
    }

    /// The rule by which the running maximum `m` meets a tile's (scaled) maximum: it moves
    /// only where the tile's passes `m + threshold` (in f32, as the kernel adds it), so `m`
    /// never exceeds the true running maximum and lags it by at most the threshold. At 0 it
    /// is `max(m, tile_max)` for every value that reaches it (no NaN: a NaN maximum leaves
    /// `m`, as `max` does).
    #[inline(always)]
    pub fn next_max(&self, m: f32, tile_max: f32) -> f32 {
        if tile_max > m + self.rescale_threshold as f32 {
            tile_max
        } else {
            m
        }
    }

    /// `x` rounded to the precision of P (a value in [0, 2^rescale_threshold] or NaN; with a
    /// fused scale the row maximum's own weight is 2 to the rounding residual of m, which may
    /// pass that by a few f32 ulps).
    pub fn round_p(&self, x: f32) -> f32 {
        match self.p {
            PPrecision::F16 => half::f16::from_f32(x).to_f32(),
            PPrecision::E4m3 => crate::fp8::decode(crate::fp8::encode(x)),
        }
    }

    /// One line for reports, e.g. `128-key tiles, k32 steps (FP22), fused scale, P e4m3, l from
    /// f32 P, per-tile P·V, 1 split` (`l as P·1` where the row sum is a column of the MMA).
    pub fn describe(&self) -> String {
        format!(
            "{}-key tiles, k{} steps{}{}{}, P {}, l {}, {} P·V, {} split{}",
            self.block_n,
            self.mma_k,
            match self.accumulator {
                Accumulator::F32 => "",
                Accumulator::Fp22 => " (FP22)",
            },
            match self.score {
                ScoreScale::Scaled => "",
                ScoreScale::Fused => ", fused scale",
            },
            match self.rescale_threshold {
                0 => String::new(),
                t => format!(", m lagging by up to {t} (log2)"),
            },
            match self.p {
                PPrecision::F16 => "f16",
                PPrecision::E4m3 => "e4m3",
            },
            match self.row_sum {
                RowSum::RoundedP => "from rounded P",
                RowSum::F32P => "from f32 P",
                RowSum::Mma => "as P·1",
            },
            match self.pv {
                PvAccumulation::Running => "running",
                PvAccumulation::PerTile => "per-tile",
            },
            self.kv_split,
            if self.kv_split == 1 { "" } else { "s" }
        )
    }
}
