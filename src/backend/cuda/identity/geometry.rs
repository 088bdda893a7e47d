//! A module's launch geometry and switches, as it publishes them (`__constant__ int SDPA_*`),
//! and what a launch of one problem derives from them: query tiles, threads, shared memory,
//! the CTAs a short query's keys are dealt to, the tensor maps' layout.

use serde::{Deserialize, Serialize};

use super::ptx::{ptx_constant, ptx_constant_opt};
use crate::backend::cuda::tensor_map::MapLayout;
use crate::shapes::Entry;

/// The query rows at or below which Stage C's short queries pack two heads a row warp (the
/// rows g and g + 8 of an MMA fragment: cuda/sdpa_fp8_stage_c_mma.cu `pack_of`), and split
/// toward `split_kv_ctas_8`: the bound of `SDPA_PACK_HEADS_8` and `SDPA_SPLIT_KV_CTAS_8`.
const PAIR_ROWS: usize = 8;

/// The launch geometry and switches a kernel build publishes as `__constant__ int SDPA_*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelConstants {
    /// Query rows per CTA (`SDPA_BLOCK_M`; at D = 128 `block_m_d128` where published).
    pub block_m: u32,
    pub block_n: u32,
    /// KV splits per query-row block: the summation order the emulation must follow.
    pub kv_split: u32,
    pub threads: u32,
    /// The D = 128 entry's query rows per CTA and threads, where they differ from `block_m`
    /// and `threads` (`SDPA_BLOCK_M_D128`, `SDPA_THREADS_D128`; absent, 0: the same), as a
    /// kernel whose tiles follow the head dim publishes them ([`KernelConstants::block_m_of`]).
    #[serde(default)]
    pub block_m_d128: u32,
    #[serde(default)]
    pub threads_d128: u32,
    /// Where not 0, the D = 64 (D = 128) entry also runs query tiles of any multiple of this
    /// many rows below its own, with 128 threads (one warpgroup) fewer per such step
    /// (`SDPA_NARROW_ROWS_D64`, `_D128`; [`KernelConstants::narrowed`]).
    #[serde(default)]
    pub narrow_rows: u32,
    #[serde(default)]
    pub narrow_rows_d128: u32,
    /// Where not 0, the D = 64 (D = 128) modules also hold a function of its own for query tiles
    /// of this many rows, `<entry>_m<rows>`, of `companion_threads` threads
    /// (`SDPA_COMPANION_ROWS_D64`, `_D128`, `SDPA_COMPANION_THREADS_D64`, `_D128`;
    /// [`KernelConstants::companion`]); it launches with its entry's shared memory.
    #[serde(default)]
    pub companion_rows: u32,
    #[serde(default)]
    pub companion_threads: u32,
    #[serde(default)]
    pub companion_rows_d128: u32,
    #[serde(default)]
    pub companion_threads_d128: u32,
    /// Dynamic shared memory of the D = 64 entry.
    pub smem_bytes: u32,
    /// Dynamic shared memory of the D = 128 entry.
    #[serde(default)]
    pub smem_bytes_d128: u32,
    /// Short GQA/MQA queries (S_q at most this, H_kv < H; 0: none) launch the D = 128 entry
    /// with `smem_bytes_d128_short` instead (`SDPA_SHORT_Q_ROWS`, `SDPA_SMEM_BYTES_D128_SHORT`:
    /// Stage C's deeper pipeline for decode).
    #[serde(default)]
    pub short_q_rows: u32,
    #[serde(default)]
    pub smem_bytes_d128_short: u32,
    /// Query heads one D = 128 CTA packs with S_q <= 8 and with S_q <= 16
    /// (`SDPA_PACK_HEADS_8`, `SDPA_PACK_HEADS_16`). Absent (0): a module of the first change-15
    /// builds, which launched every short GQA/MQA query with the short figure; so does this
    /// host for it, so that a `--base-kernel` of those builds runs as its own runner ran it.
    #[serde(default)]
    pub pack_heads_8: u32,
    #[serde(default)]
    pub pack_heads_16: u32,
    /// Split KV (`SDPA_SPLIT_KV_CTAS`, `SDPA_SPLIT_KV_MAX`): a short query at D = 128 whose
    /// CTAs are fewer than its target (`split_kv_ctas`, or `split_kv_ctas_8` with S_q at most
    /// 8) has its KV steps dealt to up to `split_kv_max` CTAs each
    /// ([`KernelConstants::kv_ctas`]). Absent (0): the module never splits.
    #[serde(default)]
    pub split_kv_ctas: u32,
    /// The target of a query of at most 8 rows (`SDPA_SPLIT_KV_CTAS_8`; absent, 0:
    /// `split_kv_ctas`, as the modules before it had).
    #[serde(default)]
    pub split_kv_ctas_8: u32,
    #[serde(default)]
    pub split_kv_max: u32,
    /// The A/B switch's published value (cuda/kernels.toml `proof_constant`: Stage C's
    /// SDPA_USE_CP_ASYNC, Stage D's SDPA_KV_STAGES).
    #[serde(alias = "use_cp_async")]
    pub switch: u32,
    /// V's tensor map swizzled like K's (`SDPA_V_SWIZZLE`; absent: unswizzled). Only a
    /// `tensor-maps` kernel reads it.
    #[serde(default)]
    pub v_swizzle: bool,
    /// A causal launch's grid is (B·H, query tiles), its y counting the query tiles from the
    /// last, so that every head's heaviest CTAs start first (`SDPA_CAUSAL_HEADS_FIRST`, both
    /// kernels since stop 56; absent or 0: (query tiles, B·H), as every module before it;
    /// launch.rs `launch_dims`).
    #[serde(default)]
    pub causal_heads_first: bool,
    /// The rows of a unit of a mixed launch (`SDPA_MIXED_UNIT_ROWS`, Stage D since stop 57;
    /// absent or 0: the module never mixes): an unmasked launch of an entry's own tile of n
    /// units on the grid (B·H, T), T past the unmixed tiles' count, runs each head's first
    /// U - (n - 1) T tiles of n units and the rest of n - 1 (launch.rs `mixed_plan`).
    #[serde(default)]
    pub mixed_unit_rows: u32,
    /// How far a tile's maximum must pass the running maximum before it moves
    /// (`SDPA_RESCALE_THRESHOLD`; absent: 0, the exact running maximum), which must be the
    /// manifest's `numerics.rescale_threshold` (backend/cuda/kernel.rs `numerics_mismatch`).
    #[serde(default)]
    pub rescale_threshold: u32,
    /// Whether l is P·1 on the tensor cores (`SDPA_ROW_SUM_MMA`, Stage D's switch since stop
    /// 64; absent: the module does not say, as Stage C's and every older module), which must
    /// agree with the manifest's `numerics.row_sum` (backend/cuda/kernel.rs
    /// `numerics_mismatch`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_sum_mma: Option<bool>,
}

impl KernelConstants {
    /// Reads the constants from PTX lines such as `.const .align 4 .u32 SDPA_BLOCK_M = 64;`,
    /// the switch's from `switch_constant`. A declaration without an initializer is zero, as
    /// PTX zero-initializes `.const` data.
    pub fn from_ptx(ptx: &str, switch_constant: &str) -> Result<Self, String> {
        let get = |name: &str| ptx_constant(ptx, name);
        Ok(KernelConstants {
            block_m: get("SDPA_BLOCK_M")?,
            block_n: get("SDPA_BLOCK_N")?,
            // A kernel that publishes no split runs one chain of KV tiles per row.
            kv_split: ptx_constant_opt(ptx, "SDPA_KV_SPLIT")?.unwrap_or(1),
            threads: get("SDPA_THREADS")?,
            block_m_d128: ptx_constant_opt(ptx, "SDPA_BLOCK_M_D128")?.unwrap_or(0),
            threads_d128: ptx_constant_opt(ptx, "SDPA_THREADS_D128")?.unwrap_or(0),
            narrow_rows: ptx_constant_opt(ptx, "SDPA_NARROW_ROWS_D64")?.unwrap_or(0),
            narrow_rows_d128: ptx_constant_opt(ptx, "SDPA_NARROW_ROWS_D128")?.unwrap_or(0),
            companion_rows: ptx_constant_opt(ptx, "SDPA_COMPANION_ROWS_D64")?.unwrap_or(0),
            companion_threads: ptx_constant_opt(ptx, "SDPA_COMPANION_THREADS_D64")?.unwrap_or(0),
            companion_rows_d128: ptx_constant_opt(ptx, "SDPA_COMPANION_ROWS_D128")?.unwrap_or(0),
            companion_threads_d128: ptx_constant_opt(ptx, "SDPA_COMPANION_THREADS_D128")?
                .unwrap_or(0),
            smem_bytes: get("SDPA_SMEM_BYTES_D64")?,
            smem_bytes_d128: get("SDPA_SMEM_BYTES_D128")?,
            short_q_rows: ptx_constant_opt(ptx, "SDPA_SHORT_Q_ROWS")?.unwrap_or(0),
            smem_bytes_d128_short: ptx_constant_opt(ptx, "SDPA_SMEM_BYTES_D128_SHORT")?
                .unwrap_or(0),
            pack_heads_8: ptx_constant_opt(ptx, "SDPA_PACK_HEADS_8")?.unwrap_or(0),
            pack_heads_16: ptx_constant_opt(ptx, "SDPA_PACK_HEADS_16")?.unwrap_or(0),
            split_kv_ctas: ptx_constant_opt(ptx, "SDPA_SPLIT_KV_CTAS")?.unwrap_or(0),
            split_kv_ctas_8: ptx_constant_opt(ptx, "SDPA_SPLIT_KV_CTAS_8")?.unwrap_or(0),
            split_kv_max: ptx_constant_opt(ptx, "SDPA_SPLIT_KV_MAX")?.unwrap_or(0),
            switch: get(switch_constant)?,
            v_swizzle: ptx_constant_opt(ptx, "SDPA_V_SWIZZLE")?.is_some_and(|v| v != 0),
            causal_heads_first: ptx_constant_opt(ptx, "SDPA_CAUSAL_HEADS_FIRST")?
                .is_some_and(|v| v != 0),
            mixed_unit_rows: ptx_constant_opt(ptx, "SDPA_MIXED_UNIT_ROWS")?.unwrap_or(0),
            rescale_threshold: ptx_constant_opt(ptx, "SDPA_RESCALE_THRESHOLD")?.unwrap_or(0),
            row_sum_mma: ptx_constant_opt(ptx, "SDPA_ROW_SUM_MMA")?.map(|v| v != 0),
        })
    }

    /// The dynamic shared memory a launch of `entry` on `q` gets on a GPU of `sms` SMs: a
    /// short GQA/MQA query at D = 128 whose packs fit one CTA an SM the short figure (where
    /// the module publishes one: the deeper pipeline, which holds an SM alone), any other the
    /// entry's. Measured (docs/PERF.md change 15): with more packs than SMs the deep launch's
    /// one CTA an SM loses to the entry's two (64×32×1×128 at S_k 4096, 512 packs: 27% slower).
    /// A split launch counts each pack's CTAs ([`KernelConstants::kv_ctas`]).
    pub fn launch_smem_bytes(&self, entry: Entry, q: LaunchShape, sms: u32) -> u32 {
        if entry.d != 128 {
            return self.smem_bytes;
        }
        let deep = match q.short_packs(self) {
            None => false,
            // A module that publishes no pack sizes: every short GQA/MQA query (its own rule).
            Some(_) if self.pack_heads_8 == 0 => true,
            Some(packs) => packs * self.kv_ctas(entry, q) as usize <= sms as usize,
        };
        if deep {
            // Never less than the entry's own, whatever the module publishes.
            self.smem_bytes_d128.max(self.smem_bytes_d128_short)
        } else {
            self.smem_bytes_d128
        }
    }

    /// The CTAs one query tile's KV steps are dealt to (the launch's `gridDim.z`; the kernel's
    /// `split_kv_end`): a short query (S_q at most `short_q_rows`) at D = 128 in a module that
    /// splits gets enough of them that its working CTAs (its packs, or one per head) reach
    /// about `split_kv_ctas` (`split_kv_ctas_8` with S_q at most 8, where published), at most
    /// `split_kv_max` and one per KV step; any other launch 1.
    /// A function of the problem and the module only, never of the GPU, so the summation
    /// order, and with it every output bit, is the same on every GPU
    /// ([`crate::emulation::Algorithm`] takes `kv_split` times this many chains).
    pub fn kv_ctas(&self, entry: Entry, q: LaunchShape) -> u32 {
        let short = q.sq >= 1 && q.sq <= self.short_q_rows as usize;
        if entry.d != 128 || !short || self.split_kv_ctas == 0 || self.split_kv_max == 0 {
            return 1;
        }
        let target = match self.split_kv_ctas_8 {
            t if q.sq <= PAIR_ROWS && t != 0 => t,
            _ => self.split_kv_ctas,
        };
        let working = q.short_packs(self).unwrap_or(q.b * q.h).max(1);
        let steps =
            q.sk.div_ceil((self.block_n * self.kv_split.max(1)) as usize);
        let cap = (self.split_kv_max as usize).min(steps).max(1);
        (target as usize / working).clamp(1, cap) as u32
    }

    /// These constants on a device that allows a block `optin` bytes of shared memory: a short
    /// figure past it is dropped (every launch then gets the entry's own).
    pub fn within_device_smem(self, optin: u32) -> Self {
        KernelConstants {
            smem_bytes_d128_short: if self.smem_bytes_d128_short <= optin {
                self.smem_bytes_d128_short
            } else {
                0
            },
            ..self
        }
    }

    /// Query rows one CTA of `entry` owns: the launch grid's query tiles and the sampled
    /// check's tiles.
    pub fn block_m_of(&self, entry: Entry) -> u32 {
        match self.block_m_d128 {
            m if entry.d == 128 && m != 0 => m,
            _ => self.block_m,
        }
    }

    /// Threads of one CTA of `entry`.
    pub fn threads_of(&self, entry: Entry) -> u32 {
        match self.threads_d128 {
            t if entry.d == 128 && t != 0 => t,
            _ => self.threads,
        }
    }

    /// The threads of a launch of `entry` with query tiles of `rows` (fewer than its own): its
    /// companion's where that function runs `rows` ([`KernelConstants::companion`]), else one
    /// warpgroup fewer per `SDPA_NARROW_ROWS_D<D>` rows. None where the entry runs no such
    /// tile (no companion of those rows, and no narrowing, or `rows` not a multiple of its step
    /// below its own).
    pub fn narrowed(&self, entry: Entry, rows: u32) -> Option<u32> {
        let step = self.narrow_step(entry);
        let own = self.block_m_of(entry);
        if rows == 0 || rows >= own {
            return None;
        }
        if let Some((_, threads)) = self.companion(entry).filter(|&(r, _)| r == rows) {
            return Some(threads);
        }
        if step == 0 || !rows.is_multiple_of(step) {
            return None;
        }
        let fewer = (own - rows) / step * 128;
        self.threads_of(entry).checked_sub(fewer).filter(|&t| t > 0)
    }

    /// The query rows and threads of `entry`'s companion, the function of its own its module
    /// holds for a narrower tile (`<entry>_m<rows>`), where it publishes one with fewer rows
    /// than the entry's own.
    pub fn companion(&self, entry: Entry) -> Option<(u32, u32)> {
        let (rows, threads) = if entry.d == 128 {
            (self.companion_rows_d128, self.companion_threads_d128)
        } else {
            (self.companion_rows, self.companion_threads)
        };
        (rows != 0 && threads != 0 && rows < self.block_m_of(entry)).then_some((rows, threads))
    }

    /// The rows of one narrowing step of `entry` (`SDPA_NARROW_ROWS_D<D>`; 0: it runs its own
    /// query tile only).
    pub fn narrow_step(&self, entry: Entry) -> u32 {
        if entry.d == 128 {
            self.narrow_rows_d128
        } else {
            self.narrow_rows
        }
    }

    /// The query-row tiles the module's entries may launch: each head dim's own and, where
    /// they narrow, every multiple of their step below it (the sampled check covers each).
    pub fn query_tiles(&self) -> Vec<usize> {
        let mut tiles: Vec<usize> = crate::shapes::HEAD_DIMS
            .iter()
            .flat_map(|&d| {
                let entry = Entry { d, ..Entry::BASE };
                let own = self.block_m_of(entry);
                (1..=own).filter(move |&r| r == own || self.narrowed(entry, r).is_some())
            })
            .map(|r| r as usize)
            .collect();
        tiles.sort_unstable();
        tiles.dedup();
        tiles
    }

    /// The most dynamic shared memory any launch of `entry` asks for (the function's limit).
    pub fn max_smem_bytes(&self, entry: Entry) -> u32 {
        if entry.d == 128 {
            self.smem_bytes_d128.max(self.smem_bytes_d128_short)
        } else {
            self.smem_bytes
        }
    }

    /// The tensor-map layout this module asks for (src/backend/cuda/tensor_map.rs).
    pub fn map_layout(&self) -> MapLayout {
        MapLayout {
            kv_rows: self.block_n * self.kv_split.max(1),
            v_swizzled: self.v_swizzle,
        }
    }
}

/// A Stage-D-like module whose D 64 and D 128 entries launch their own query rows and threads
/// (`SDPA_BLOCK_M`/`_D128`, `SDPA_THREADS`/`_D128`), for the tests of per-head-dim geometry.
#[cfg(test)]
pub(in crate::backend::cuda) fn per_head_dim_constants(
    rows: (u32, u32),
    threads: (u32, u32),
) -> KernelConstants {
    KernelConstants::from_ptx(&per_head_dim_ptx(rows, threads), "SDPA_KV_STAGES").unwrap()
}

/// The PTX constants of [`per_head_dim_constants`].
#[cfg(test)]
fn per_head_dim_ptx(rows: (u32, u32), threads: (u32, u32)) -> String {
    format!(
        ".const .align 4 .u32 SDPA_BLOCK_M = {};\n.const .align 4 .u32 SDPA_BLOCK_M_D128 = {};\n\
         .const .align 4 .u32 SDPA_BLOCK_N = 128;\n.const .align 4 .b32 SDPA_THREADS = {};\n\
         .const .align 4 .u32 SDPA_THREADS_D128 = {};\n\
         .const .align 4 .u32 SDPA_SMEM_BYTES_D64 = 99328;\n\
         .const .align 4 .u32 SDPA_SMEM_BYTES_D128 = 115712;\n\
         .const .align 4 .u32 SDPA_KV_STAGES = 2;\n",
        rows.0, rows.1, threads.0, threads.1
    )
}

/// Stage D's module since stop 48, as far as its query tiles go: 192 rows and 512 threads at
/// both head dims, and at D 128 a companion of 128 rows and 384 threads.
#[cfg(test)]
pub(in crate::backend::cuda) fn stage_d_constants() -> KernelConstants {
    KernelConstants {
        companion_rows_d128: 128,
        companion_threads_d128: 384,
        ..per_head_dim_constants((192, 192), (512, 512))
    }
}

/// What a launch's geometry depends on: the problem's batch, heads, query rows and keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchShape {
    pub b: usize,
    pub h: usize,
    pub hkv: usize,
    pub sq: usize,
    pub sk: usize,
}

impl LaunchShape {
    pub fn of(shape: &crate::shapes::Shape) -> Self {
        LaunchShape {
            b: shape.b,
            h: shape.h,
            hkv: shape.hkv,
            sq: shape.s,
            sk: shape.sk,
        }
    }

    /// Where the problem is a short GQA/MQA query (S_q at most the module's short rows,
    /// H_kv < H), the CTAs that work on it, counted by the kernel's own rule
    /// (cuda/sdpa_fp8_stage_c_mma.cu `pack_of`): the CTA at head y runs a pack of n heads when
    /// y is a multiple of n and heads y .. y + n - 1 exist and read one K/V head, n the pack of
    /// S_q <= 8 (`SDPA_PACK_HEADS_8`) where that holds, else the pack of S_q <= 16; a head in
    /// neither runs alone. Packs align across all B·H heads, not per K/V head, so an odd group
    /// breaks into smaller packs at its edges (groups of 7: 1.5 times B·H_kv·⌈7/4⌉ CTAs).
    pub fn short_packs(&self, c: &KernelConstants) -> Option<usize> {
        if self.sq > c.short_q_rows as usize || self.hkv >= self.h || self.hkv == 0 {
            return None;
        }
        let (bh, group) = (self.b * self.h, self.h / self.hkv);
        let kv = |y: usize| (y / self.h) * self.hkv + (y % self.h) / group;
        let packs = |y0: usize, n: usize| n > 1 && y0 + n <= bh && kv(y0) == kv(y0 + n - 1);
        let (p8, p16) = (c.pack_heads_8 as usize, c.pack_heads_16 as usize);
        let pack = |y: usize| {
            if self.sq <= PAIR_ROWS && packs(y - y % p8.max(1), p8) {
                p8
            } else if packs(y - y % p16.max(1), p16) {
                p16
            } else {
                1
            }
        };
        Some((0..bh).filter(|&y| y % pack(y) == 0).count())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_are_read_from_the_ptx() {
        let ptx = ".const .align 4 .u32 SDPA_BLOCK_M = 64;\n\
                   .const .align 4 .u32 SDPA_BLOCK_N = 32;\n\
                   .const .align 4 .u32 SDPA_KV_SPLIT = 2;\n.const .align 4 .b32 SDPA_THREADS = 128;\n\
                   .const .align 4 .u32 SDPA_SMEM_BYTES_D64 = 61440;\n\
                   .const .align 4 .u32 SDPA_SMEM_BYTES_D128 = 98304;\n\
                   .const .align 4 .u32 SDPA_USE_CP_ASYNC = 1;\n";
        let c = KernelConstants::from_ptx(ptx, "SDPA_USE_CP_ASYNC").unwrap();
        // A module that publishes no D = 128 geometry launches both entries with its own.
        let (d64, d128) = (
            Entry::BASE,
            Entry {
                d: 128,
                ..Entry::BASE
            },
        );
        assert_eq!((c.block_m_of(d64), c.block_m_of(d128)), (64, 64));
        assert_eq!((c.threads_of(d64), c.threads_of(d128)), (128, 128));
        assert_eq!(c.query_tiles(), vec![64]);
        assert_eq!(
            (
                c.block_n,
                c.kv_split,
                c.threads,
                c.smem_bytes,
                c.smem_bytes_d128,
                c.switch
            ),
            (32, 2, 128, 61440, 98304, 1)
        );
        let zero = ptx.replace("SDPA_USE_CP_ASYNC = 1;", "SDPA_USE_CP_ASYNC;");
        assert_eq!(
            KernelConstants::from_ptx(&zero, "SDPA_USE_CP_ASYNC")
                .unwrap()
                .switch,
            0,
            "uninitialized .const is 0"
        );
        let err =
            KernelConstants::from_ptx(".const .align 4 .u32 SDPA_BLOCK_N = 64;", "X").unwrap_err();
        assert!(err.contains("SDPA_BLOCK_M"), "{err}");
        let err = KernelConstants::from_ptx(ptx, "SDPA_KV_STAGES").unwrap_err();
        assert!(
            err.contains("SDPA_KV_STAGES"),
            "the switch's constant is required: {err}"
        );
    }

    #[test]
    fn a_module_that_publishes_a_d128_geometry_gives_each_head_dim_its_own_rows_and_threads() {
        // A module whose head dims differ: 192 rows (512 threads) at D 64, 128 (384) at D 128
        // (Stage D from stop 44 to stop 47).
        let c = per_head_dim_constants((192, 128), (512, 384));
        for causal in [false, true] {
            let (d64, d128) = (Entry { d: 64, causal }, Entry { d: 128, causal });
            assert_eq!((c.block_m_of(d64), c.threads_of(d64)), (192, 512));
            assert_eq!((c.block_m_of(d128), c.threads_of(d128)), (128, 384));
        }
        assert_eq!(c.query_tiles(), vec![128, 192]);
    }

    #[test]
    fn an_entry_that_narrows_runs_each_multiple_of_its_step_with_a_warpgroup_less_per_step() {
        let wide = per_head_dim_constants((192, 128), (512, 384));
        let c = KernelConstants {
            narrow_rows: 64,
            ..wide
        };
        let (d64, d128) = (
            Entry::BASE,
            Entry {
                d: 128,
                causal: true,
            },
        );
        assert_eq!(c.narrowed(d64, 64), Some(256));
        assert_eq!(c.narrowed(d64, 128), Some(384));
        // Its own rows, more, or not a multiple of the step: not a narrower tile.
        for rows in [0, 192, 256, 96] {
            assert_eq!(c.narrowed(d64, rows), None, "{rows}");
        }
        // The D 128 entry publishes no step; neither does the module without the constant.
        assert_eq!(c.narrowed(d128, 64), None);
        assert_eq!(wide.narrowed(d64, 64), None);
        // The sampled check covers every tile a launch may run.
        assert_eq!(c.query_tiles(), vec![64, 128, 192]);
        // As the kernel publishes it.
        let ptx = ".const .align 4 .u32 SDPA_BLOCK_M = 192;\n.const .align 4 .u32 SDPA_BLOCK_N = 128;\n\
                   .const .align 4 .b32 SDPA_THREADS = 512;\n\
                   .const .align 4 .u32 SDPA_SMEM_BYTES_D64 = 1;\n.const .align 4 .u32 SDPA_SMEM_BYTES_D128 = 1;\n\
                   .const .align 4 .u32 SDPA_KV_STAGES = 2;\n\
                   .const .align 4 .u32 SDPA_NARROW_ROWS_D64 = 64;\n.const .align 4 .u32 SDPA_NARROW_ROWS_D128;\n";
        let read = KernelConstants::from_ptx(ptx, "SDPA_KV_STAGES").unwrap();
        assert_eq!((read.narrow_rows, read.narrow_rows_d128), (64, 0));
    }

    #[test]
    fn a_companion_runs_its_rows_with_its_own_threads_beside_any_narrowing() {
        // Stage D's D 128 with CONSUMERS_D128=3: the entry's 192 rows (512 threads), which
        // narrows by 64, and a companion of 128 rows whose threads the module publishes.
        let ptx = ".const .align 4 .u32 SDPA_BLOCK_M = 192;\n.const .align 4 .u32 SDPA_BLOCK_M_D128 = 192;\n\
                   .const .align 4 .u32 SDPA_BLOCK_N = 128;\n.const .align 4 .b32 SDPA_THREADS = 512;\n\
                   .const .align 4 .u32 SDPA_THREADS_D128 = 512;\n\
                   .const .align 4 .u32 SDPA_SMEM_BYTES_D64 = 1;\n.const .align 4 .u32 SDPA_SMEM_BYTES_D128 = 1;\n\
                   .const .align 4 .u32 SDPA_KV_STAGES = 2;\n.const .align 4 .u32 SDPA_NARROW_ROWS_D128 = 64;\n\
                   .const .align 4 .u32 SDPA_COMPANION_ROWS_D64;\n.const .align 4 .u32 SDPA_COMPANION_THREADS_D64;\n\
                   .const .align 4 .u32 SDPA_COMPANION_ROWS_D128 = 128;\n\
                   .const .align 4 .u32 SDPA_COMPANION_THREADS_D128 = 320;\n";
        let c = KernelConstants::from_ptx(ptx, "SDPA_KV_STAGES").unwrap();
        let d128 = Entry {
            d: 128,
            causal: false,
        };
        assert_eq!(c.companion(d128), Some((128, 320)));
        assert_eq!(c.companion(Entry::BASE), None, "D 64 publishes none");
        // The companion's rows take its threads (320 here, to tell them from the 384 that
        // narrowing by one warpgroup would give); other multiples of the step still narrow.
        assert_eq!(c.narrowed(d128, 128), Some(320));
        assert_eq!(c.narrowed(d128, 64), Some(256));
        assert_eq!(c.query_tiles(), vec![64, 128, 192]);
        // A companion no narrower than its entry is none.
        let wide = KernelConstants {
            companion_rows_d128: 192,
            ..c
        };
        assert_eq!(wide.companion(d128), None);
        assert_eq!(wide.narrowed(d128, 192), None);
        // A module before companions (no constants) has none.
        let before: String = ptx
            .lines()
            .filter(|l| !l.contains("COMPANION"))
            .map(|l| format!("{l}\n"))
            .collect();
        let old = KernelConstants::from_ptx(&before, "SDPA_KV_STAGES").unwrap();
        assert_eq!(old.companion(d128), None);
        assert_eq!(old.narrowed(d128, 128), Some(384));
    }

    /// A Stage C cp1 module's launch constants (2 x 2 warp grid; its D 128 figures from before
    /// change 30's 64-row tiles, which the launch logic under test does not depend on), and those
    /// of its short queries.
    const STAGE_C_PTX: &str = ".const .align 4 .u32 SDPA_BLOCK_M = 32;\n\
                   .const .align 4 .u32 SDPA_BLOCK_N = 64;\n.const .align 4 .b32 SDPA_THREADS = 128;\n\
                   .const .align 4 .u32 SDPA_SMEM_BYTES_D64 = 40960;\n\
                   .const .align 4 .u32 SDPA_SMEM_BYTES_D128 = 81920;\n\
                   .const .align 4 .u32 SDPA_USE_CP_ASYNC = 1;\n";
    const SHORT_Q_PTX: &str = ".const .align 4 .u32 SDPA_SHORT_Q_ROWS = 16;\n\
             .const .align 4 .u32 SDPA_SMEM_BYTES_D128_SHORT = 147456;\n\
             .const .align 4 .u32 SDPA_PACK_HEADS_8 = 4;\n\
             .const .align 4 .u32 SDPA_PACK_HEADS_16 = 2;\n";

    #[test]
    fn short_gqa_queries_at_d128_whose_packs_fit_the_sms_launch_with_the_short_shared_memory() {
        let ptx = STAGE_C_PTX;
        let short = format!("{ptx}{SHORT_Q_PTX}");
        let c = KernelConstants::from_ptx(&short, "SDPA_USE_CP_ASYNC").unwrap();
        let d128 = Entry {
            d: 128,
            causal: false,
        };
        let d128c = Entry {
            d: 128,
            causal: true,
        };
        let d64c = Entry {
            d: 64,
            causal: true,
        };
        let q = |b, h, hkv, sq| LaunchShape {
            b,
            h,
            hkv,
            sq,
            sk: 8192,
        };
        const SMS: u32 = 132;
        // The CTAs that work: packs of 4 heads with S_q <= 8, of 2 up to 16.
        assert_eq!(q(16, 32, 8, 1).short_packs(&c), Some(128));
        assert_eq!(q(8, 32, 8, 16).short_packs(&c), Some(128));
        // cfg-pack, groups of 5: heads 0-3 and 16-19 in packs of 4; 6-7, 8-9, 10-11, 12-13 in
        // packs of 2; 4, 5, 14, 15 alone (a pack may not span two K/V heads).
        assert_eq!(q(2, 10, 2, 5).short_packs(&c), Some(10));
        assert_eq!(
            q(2, 10, 2, 9).short_packs(&c),
            Some(12),
            "S_q 9: packs of 2 only"
        );
        assert_eq!(
            q(16, 28, 4, 1).short_packs(&c),
            Some(192),
            "groups of 7, not 128"
        );
        assert_eq!(q(2, 6, 2, 3).short_packs(&c), Some(8), "groups of 3");
        assert_eq!(q(16, 32, 8, 17).short_packs(&c), None, "S_q past 16");
        assert_eq!(
            q(16, 32, 32, 1).short_packs(&c),
            None,
            "no GQA: nothing packs"
        );
        // (entry, problem) -> bytes
        assert_eq!(
            c.launch_smem_bytes(d128, q(16, 32, 8, 1), SMS),
            147456,
            "llama-decode"
        );
        assert_eq!(
            c.launch_smem_bytes(d128c, q(8, 32, 1, 16), SMS),
            147456,
            "S_q 16, MQA"
        );
        assert_eq!(
            c.launch_smem_bytes(d128, q(33, 32, 8, 1), SMS),
            81920,
            "264 packs"
        );
        assert_eq!(
            c.launch_smem_bytes(d128, q(33, 32, 8, 1), 264),
            147456,
            "a wider GPU"
        );
        assert_eq!(c.launch_smem_bytes(d128, q(16, 32, 8, 17), SMS), 81920);
        assert_eq!(c.launch_smem_bytes(d128, q(16, 32, 32, 1), SMS), 81920);
        assert_eq!(
            c.launch_smem_bytes(d64c, q(16, 32, 8, 1), SMS),
            40960,
            "D 64: none"
        );
        assert_eq!(c.max_smem_bytes(d128), 147456);
        assert_eq!(c.max_smem_bytes(d64c), 40960);
        // A device that allows less than the short figure drops it.
        let small_gpu = c.within_device_smem(101376);
        assert_eq!(
            small_gpu.launch_smem_bytes(d128, q(16, 32, 8, 1), SMS),
            81920
        );
        assert_eq!(small_gpu.max_smem_bytes(d128), 81920);
        assert_eq!(c.within_device_smem(232448), c, "sm_90 keeps it");
        // A short figure below the entry's (a build without the deeper body publishes 0)
        // never shrinks a launch.
        let shallow = KernelConstants {
            smem_bytes_d128_short: 40960,
            ..c
        };
        assert_eq!(shallow.launch_smem_bytes(d128, q(16, 32, 8, 1), SMS), 81920);
        // A module of the first change-15 builds (a short figure, no pack sizes) launches
        // every short GQA query with it, as its own runner did.
        let first = KernelConstants {
            pack_heads_8: 0,
            pack_heads_16: 0,
            ..c
        };
        assert_eq!(first.launch_smem_bytes(d128, q(64, 32, 8, 1), SMS), 147456);
        assert_eq!(first.launch_smem_bytes(d128, q(64, 32, 32, 1), SMS), 81920);
        // A module that publishes none (Stage D, older builds) launches every problem alike.
        let plain = KernelConstants::from_ptx(ptx, "SDPA_USE_CP_ASYNC").unwrap();
        assert_eq!(plain.launch_smem_bytes(d128, q(16, 32, 8, 1), SMS), 81920);
        assert_eq!(plain.max_smem_bytes(d128), 81920);
    }

    #[test]
    fn short_queries_at_d128_split_their_keys_across_enough_ctas_to_fill_about_128() {
        let ptx = format!("{STAGE_C_PTX}.const .align 4 .u32 SDPA_KV_SPLIT = 2;\n{SHORT_Q_PTX}");
        let split = format!(
            "{ptx}.const .align 4 .u32 SDPA_SPLIT_KV_CTAS = 128;\n\
             .const .align 4 .u32 SDPA_SPLIT_KV_MAX = 64;\n"
        );
        let c = KernelConstants::from_ptx(&split, "SDPA_USE_CP_ASYNC").unwrap();
        assert_eq!((c.split_kv_ctas, c.split_kv_max), (128, 64));
        let (d128, d64) = (
            Entry {
                d: 128,
                causal: false,
            },
            Entry {
                d: 64,
                causal: true,
            },
        );
        let q = |b, h, hkv, sq, sk| LaunchShape { b, h, hkv, sq, sk };
        // (entry, problem, CTAs per query tile, why): working CTAs (packs, or heads) times the
        // CTAs ~ 128.
        let cases = [
            (d128, q(16, 32, 8, 1, 8192), 1, "llama-decode: 128 packs"),
            (d128, q(1, 32, 8, 1, 32768), 16, "8 packs"),
            (d128, q(1, 32, 32, 1, 32768), 4, "MHA: 32 heads"),
            (d128, q(1, 8, 1, 1, 131072), 64, "two packs"),
            (d128, q(1, 4, 1, 1, 131072), 64, "one pack: the most"),
            (d128, q(1, 4, 1, 1, 1000), 8, "one CTA per step"),
            (d128, q(2, 10, 2, 5, 200), 2, "cfg-pack: two 128-key steps"),
            (d128, q(1, 8, 1, 1, 1), 1, "one step: one CTA"),
            (d128, q(1, 8, 8, 17, 32768), 1, "S_q past 16"),
            (d128, q(64, 32, 8, 1, 8192), 1, "512 packs"),
            (d64, q(1, 32, 8, 1, 32768), 1, "D 64 never splits"),
        ];
        for (entry, shape, ctas, why) in cases {
            assert_eq!(c.kv_ctas(entry, shape), ctas, "{why}");
        }
        // The deep pipeline counts every CTA of a split: 8 packs x 16 fit 132 SMs.
        assert_eq!(
            c.launch_smem_bytes(d128, q(1, 32, 8, 1, 32768), 132),
            147456
        );
        assert_eq!(
            c.launch_smem_bytes(d128, q(1, 32, 8, 1, 32768), 100),
            81920,
            "128 CTAs on 100 SMs: the entry's two an SM"
        );
        // A module that publishes no split (NO_SPLIT_KV, older builds, Stage D) never splits.
        let none = KernelConstants::from_ptx(&ptx, "SDPA_USE_CP_ASYNC").unwrap();
        assert_eq!(none.kv_ctas(d128, q(1, 32, 8, 1, 32768)), 1);
    }

    #[test]
    fn queries_of_at_most_8_rows_split_toward_the_s_q_8_target_and_longer_ones_toward_the_other() {
        let ptx = format!(
            "{STAGE_C_PTX}.const .align 4 .u32 SDPA_KV_SPLIT = 2;\n{SHORT_Q_PTX}\
             .const .align 4 .u32 SDPA_SPLIT_KV_CTAS = 128;\n\
             .const .align 4 .u32 SDPA_SPLIT_KV_CTAS_8 = 256;\n\
             .const .align 4 .u32 SDPA_SPLIT_KV_MAX = 64;\n"
        );
        let c = KernelConstants::from_ptx(&ptx, "SDPA_USE_CP_ASYNC").unwrap();
        assert_eq!(c.split_kv_ctas_8, 256);
        let d128 = Entry {
            d: 128,
            causal: false,
        };
        let q = |b, h, hkv, sq, sk| LaunchShape { b, h, hkv, sq, sk };
        let cases = [
            (
                q(16, 32, 8, 1, 8192),
                2,
                "llama-decode: 128 packs, two CTAs each",
            ),
            (q(1, 32, 8, 1, 32768), 32, "long-decode: 8 packs"),
            (q(1, 32, 32, 1, 32768), 8, "MHA: 32 heads"),
            (q(4, 32, 1, 4, 8192), 8, "MQA, S_q 4: 32 packs of 4"),
            (q(16, 32, 8, 8, 8192), 2, "S_q 8: still the S_q-8 target"),
            (
                q(8, 32, 8, 9, 4096),
                1,
                "S_q 9: 128 packs of 2, the other target (256: 2)",
            ),
            (
                q(2, 32, 8, 9, 4096),
                4,
                "S_q 9, 32 packs: 128 / 32 (256: 8)",
            ),
            (
                q(8, 32, 8, 16, 4096),
                1,
                "spec-decode: 128 packs of 2, the other target",
            ),
            (q(2, 32, 8, 16, 4096), 4, "S_q 16, 32 packs: 128 / 32"),
            (q(1, 4, 1, 1, 131072), 64, "one pack: the cap"),
        ];
        for (shape, ctas, why) in cases {
            assert_eq!(c.kv_ctas(d128, shape), ctas, "{why}");
        }
        // The deep pipeline counts every CTA: llama-decode's 256 no longer fit 132 SMs.
        assert_eq!(c.launch_smem_bytes(d128, q(16, 32, 8, 1, 8192), 132), 81920);
        // Without the S_q-8 target (modules before it) every short query aims at 128.
        let before = KernelConstants {
            split_kv_ctas_8: 0,
            ..c
        };
        assert_eq!(before.kv_ctas(d128, q(16, 32, 8, 1, 8192)), 1);
        assert_eq!(before.kv_ctas(d128, q(1, 32, 8, 1, 32768)), 16);
    }

    #[test]
    fn a_module_that_publishes_v_swizzle_gets_a_swizzled_v_map_and_one_that_does_not_an_unswizzled_one()
     {
        let ptx = ".const .align 4 .u32 SDPA_BLOCK_M = 128;\n\
                   .const .align 4 .u32 SDPA_BLOCK_N = 128;\n.const .align 4 .b32 SDPA_THREADS = 384;\n\
                   .const .align 4 .u32 SDPA_SMEM_BYTES_D64 = 1;\n\
                   .const .align 4 .u32 SDPA_SMEM_BYTES_D128 = 1;\n\
                   .const .align 4 .u32 SDPA_KV_STAGES = 2;\n";
        let layout = |ptx: &str| {
            KernelConstants::from_ptx(ptx, "SDPA_KV_STAGES")
                .unwrap()
                .map_layout()
        };
        let unswizzled = MapLayout {
            kv_rows: 128,
            v_swizzled: false,
        };
        assert_eq!(layout(ptx), unswizzled, "absent: unswizzled");
        let with = |v: &str| format!("{ptx}.const .align 4 .u32 SDPA_V_SWIZZLE{v};\n");
        assert_eq!(layout(&with(" = 0")), unswizzled);
        assert_eq!(layout(&with("")), unswizzled, "uninitialized .const is 0");
        // Present but not a number: refused, never read as absent.
        let err = KernelConstants::from_ptx(&with(" = x"), "SDPA_KV_STAGES").unwrap_err();
        assert!(
            err.contains("SDPA_V_SWIZZLE") && err.contains("not an unsigned"),
            "{err}"
        );
        assert_eq!(
            layout(&with(" = 1")),
            MapLayout {
                kv_rows: 128,
                v_swizzled: true
            }
        );
    }

    #[test]
    fn causal_heads_first_is_read_as_published_and_false_where_absent_or_zero() {
        let ptx = per_head_dim_ptx((192, 192), (512, 512));
        let first = |line: &str| {
            KernelConstants::from_ptx(&format!("{ptx}{line}"), "SDPA_KV_STAGES")
                .map(|c| c.causal_heads_first)
        };
        let name = ".const .align 4 .u32 SDPA_CAUSAL_HEADS_FIRST";
        assert_eq!(first(""), Ok(false), "absent: the modules before stop 56");
        assert_eq!(first(&format!("{name} = 0;\n")), Ok(false));
        assert_eq!(
            first(&format!("{name};\n")),
            Ok(false),
            "uninitialized .const is 0"
        );
        assert_eq!(first(&format!("{name} = 1;\n")), Ok(true));
        let err = first(&format!("{name} = yes;\n")).unwrap_err();
        assert!(err.contains("SDPA_CAUSAL_HEADS_FIRST"), "{err}");
    }

    #[test]
    fn mixed_unit_rows_is_read_as_published_and_zero_where_absent() {
        let ptx = per_head_dim_ptx((192, 192), (512, 512));
        let unit = |line: &str| {
            KernelConstants::from_ptx(&format!("{ptx}{line}"), "SDPA_KV_STAGES")
                .map(|c| c.mixed_unit_rows)
        };
        let name = ".const .align 4 .u32 SDPA_MIXED_UNIT_ROWS";
        assert_eq!(unit(""), Ok(0), "absent: the modules before stop 57");
        assert_eq!(
            unit(&format!("{name};\n")),
            Ok(0),
            "uninitialized .const is 0"
        );
        assert_eq!(unit(&format!("{name} = 64;\n")), Ok(64));
        let err = unit(&format!("{name} = -1;\n")).unwrap_err();
        assert!(err.contains("SDPA_MIXED_UNIT_ROWS"), "{err}");
    }
}
