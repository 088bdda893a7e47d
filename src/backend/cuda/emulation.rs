//! The emulation on the GPU (cuda/emulation_f32.cu): the clean emulation's output of the
//! checked rows, bit for bit what `crate::emulation::clean` gives on the host. One module per
//! [`EmuBuild`] (head dim and algorithm; the KV split is an argument). Query heads are
//! uploaded in groups that fit a budget with the K/V heads they read (as the references' are,
//! `groups`); the buffers are its own, not the ones the kernel under test reads and writes.
//!
//! This kernel is the runner's, not the one under test: its failures are never reported as
//! the kernel's (exit 4). See `CudaBackend::emulation_grouped`.

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaModule, CudaStream, DriverError, LaunchConfig, PushKernelArg,
};
use half::f16;

use super::{groups, nvrtc};
use crate::emulation::Algorithm;
use crate::kernels::{Accumulator, PPrecision, PvAccumulation, RowSum, ScoreScale};
use crate::problem::Problem;
use crate::rows::RowSet;

const SOURCE: &str = include_str!("../../../cuda/emulation_f32.cu");
const ENTRY: &str = "sdpa_emulation_f32";

/// What one emulation module is built for: a head dim and an algorithm, its KV split set to
/// 1 (the split is a launch argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EmuBuild {
    pub d: usize,
    pub alg: Algorithm,
}

impl EmuBuild {
    pub fn new(d: usize, alg: Algorithm) -> Self {
        EmuBuild {
            d,
            alg: alg.with_split(1),
        }
    }

    /// The module's defines (cuda/emulation_f32.cu's header), and the constants it publishes
    /// for them, in the same order.
    fn defines(&self) -> [(&'static str, &'static str, usize); 10] {
        let a = &self.alg;
        [
            ("EMU_D", "EMU_HEAD_DIM", self.d),
            ("EMU_KT", "EMU_KV_TILE", a.block_n),
            ("EMU_MMA_K", "EMU_STEP", a.mma_k),
            (
                "EMU_P_E4M3",
                "EMU_P_IS_E4M3",
                usize::from(a.p == PPrecision::E4m3),
            ),
            (
                "EMU_L_F32P",
                "EMU_L_FROM_F32_P",
                usize::from(a.row_sum == RowSum::F32P),
            ),
            (
                "EMU_L_MMA",
                "EMU_L_IS_MMA",
                usize::from(a.row_sum == RowSum::Mma),
            ),
            (
                "EMU_PV_PER_TILE",
                "EMU_PV_IS_PER_TILE",
                usize::from(a.pv == PvAccumulation::PerTile),
            ),
            (
                "EMU_FP22",
                "EMU_ACC_IS_FP22",
                usize::from(a.accumulator == Accumulator::Fp22),
            ),
            (
                "EMU_FUSED_SCALE",
                "EMU_SCORE_IS_FUSED",
                usize::from(a.score == ScoreScale::Fused),
            ),
            (
                "EMU_RESCALE_THRESHOLD",
                "EMU_RESCALE_THRESHOLD_IS",
                a.rescale_threshold as usize,
            ),
        ]
    }

    /// Floats of one split's state (m, l, o) in the kernel's scratch buffer (its
    /// `EMU_STATE_FLOATS`, checked when it loads).
    fn state_floats(&self) -> usize {
        2 + self.d
    }
}

/// Compiles the emulation kernel of `build` (no headers needed); run beside the variants'
/// builds. The error is a message: it only matters when the emulation is asked for on the
/// device.
pub fn compile(build: EmuBuild, arch: &str) -> Result<nvrtc::Compiled, String> {
    let defines: Vec<(String, String)> = build
        .defines()
        .iter()
        .map(|(define, _, value)| (define.to_string(), value.to_string()))
        .collect();
    let options = nvrtc::build_options(arch, &[], &defines);
    nvrtc::compile(SOURCE, "emulation_f32.cu", &options).map_err(|e| {
        format!(
            "the emulation kernel (D = {}, {}) failed to compile: {e}",
            build.d,
            build.alg.describe()
        )
    })
}

/// Device bytes of one query head with `sk` keys, `rows` checked rows and `kv_split` splits:
/// K and V codes (counted per query head: with GQA, more than its share), and per checked row
/// its Q codes, its seen keys, its f16 output and its splits' states.
pub fn head_bytes(sk: usize, d: usize, rows: usize, kv_split: usize) -> u64 {
    let per_row = d + 4 + 2 * d + kv_split * (2 + d) * 4;
    (2 * sk * d + rows * per_row) as u64
}

/// The loaded emulation kernel and the geometry it publishes (`EMU_*`).
pub struct DeviceEmulation {
    build: EmuBuild,
    function: CudaFunction,
    _module: Arc<CudaModule>,
    /// Query rows per CTA, one thread each.
    rows: usize,
    smem_bytes: u32,
}

impl DeviceEmulation {
    /// Loads the compiled kernel and checks that it was built for `build`: every constant it
    /// publishes is the one its define asked for.
    pub fn load(
        ctx: &Arc<cudarc::driver::CudaContext>,
        build: EmuBuild,
        compiled: nvrtc::Compiled,
    ) -> Result<Self, String> {
        let kernel = groups::OwnKernel {
            what: "emulation kernel",
            compiled,
        };
        for (_, constant, wanted) in build.defines() {
            let got = kernel.constant(constant)? as usize;
            if got != wanted {
                return Err(format!(
                    "the emulation module publishes {constant} = {got}, the algorithm needs \
                     {wanted} (D = {}, {})",
                    build.d,
                    build.alg.describe()
                ));
            }
        }
        let (rows, threads, smem_bytes, state_floats) = (
            kernel.constant("EMU_ROWS")? as usize,
            kernel.constant("EMU_THREADS")?,
            kernel.constant("EMU_SMEM_BYTES")?,
            kernel.constant("EMU_STATE_FLOATS")? as usize,
        );
        if rows != threads as usize || state_floats != build.state_floats() {
            return Err(format!(
                "the emulation kernel publishes {rows} rows per CTA on {threads} threads and \
                 split states of {state_floats} floats; the launcher needs one thread per row \
                 and states of {}",
                build.state_floats()
            ));
        }
        let (module, function) = kernel.load(ctx, ENTRY, smem_bytes)?;
        Ok(DeviceEmulation {
            build,
            function,
            _module: module,
            rows,
            smem_bytes,
        })
    }

    /// The clean emulation of the checked rows of `p` with `kv_split` splits, in their compact
    /// layout: query heads in groups of at most `group_bytes` of device memory (one head per
    /// group if a head needs more), at most `blocks_per_launch` row blocks per launch.
    pub fn run(
        &self,
        stream: &Arc<CudaStream>,
        p: &Problem,
        kv_split: usize,
        rows: &RowSet,
        group_bytes: u64,
        blocks_per_launch: usize,
    ) -> Result<Vec<f16>, DriverError> {
        assert!(blocks_per_launch > 0, "at least one row block per launch");
        assert!(kv_split >= 1, "at least one KV split");
        let (sk, d) = (p.shape.sk, p.shape.d);
        assert_eq!(
            d, self.build.d,
            "the emulation module must be the problem's"
        );
        let mut out = vec![0u16; rows.count() * d];
        let table: Vec<f32> = (0..=255u8).map(crate::fp8::decode).collect();
        let table = stream.clone_htod(&table)?;
        let bytes = |bh: usize| {
            let n = rows.offset(bh + 1) - rows.offset(bh);
            head_bytes(sk, d, n, kv_split)
        };
        for heads in groups::head_groups(rows.heads(), group_bytes, bytes) {
            let span = rows.offset(heads.start)..rows.offset(heads.end);
            if span.is_empty() {
                continue;
            }
            let at = span.start * d..span.end * d;
            let group = Group {
                p,
                rows,
                heads,
                kv_split,
            };
            group.run(self, stream, &table, blocks_per_launch, &mut out[at])?;
        }
        Ok(out.into_iter().map(f16::from_bits).collect())
    }
}

/// One group of query heads of one problem.
struct Group<'a> {
    p: &'a Problem,
    rows: &'a RowSet,
    heads: std::ops::Range<usize>,
    kv_split: usize,
}

impl Group<'_> {
    /// Uploads the group and the K/V heads it reads, launches, and reads its rows' output
    /// into `out`.
    fn run(
        &self,
        k: &DeviceEmulation,
        stream: &Arc<CudaStream>,
        table: &cudarc::driver::CudaSlice<f32>,
        blocks_per_launch: usize,
        out: &mut [u16],
    ) -> Result<(), DriverError> {
        let (p, heads) = (self.p, self.heads.clone());
        let sh = &p.shape;
        let (s, sk, d) = (sh.s, sh.sk, sh.d);
        let kv = groups::kv_heads(sh, heads.clone());
        let span = kv.start * sk * d..kv.end * sk * d;
        let n = out.len() / d;
        let q = groups::gather(&p.q.codes, self.rows, heads.clone(), s, d);
        let seen = groups::visible_keys(sh, self.rows, heads.clone());
        let blocks = groups::row_blocks(sh, self.rows, heads.clone(), k.rows);
        // The host emulation's own per-head factors; V's scale that of the K/V head read.
        let qk_scale: Vec<f32> = heads
            .clone()
            .map(|bh| crate::emulation::qk_scale(p, bh))
            .collect();
        let v_scale: Vec<f32> = heads
            .clone()
            .map(|bh| p.v.scales[sh.kv_head_of(bh)])
            .collect();
        let q_c = stream.clone_htod(&q)?;
        let k_c = stream.clone_htod(&p.k.codes[span.clone()])?;
        let v_c = stream.clone_htod(&p.v.codes[span])?;
        let qk_s = stream.clone_htod(&qk_scale)?;
        let v_s = stream.clone_htod(&v_scale)?;
        let seen_d = stream.clone_htod(&seen)?;
        let states_len = n * self.kv_split * k.build.state_floats();
        let mut states = stream.alloc_zeros::<f32>(states_len)?;
        let mut dev_out = stream.alloc_zeros::<u16>(n * d)?;
        let sk_arg = i32::try_from(sk).expect("S_k fits the kernel's int (shapes are checked)");
        let split_arg = self.kv_split as i32;
        for chunk in blocks.chunks(groups::BLOCK_INTS * blocks_per_launch) {
            let table_of_blocks = stream.clone_htod(chunk)?;
            let cfg = LaunchConfig {
                grid_dim: ((chunk.len() / groups::BLOCK_INTS) as u32, 1, 1),
                block_dim: (k.rows as u32, 1, 1),
                shared_mem_bytes: k.smem_bytes,
            };
            let mut args = stream.launch_builder(&k.function);
            args.arg(table)
                .arg(&q_c)
                .arg(&k_c)
                .arg(&v_c)
                .arg(&qk_s)
                .arg(&v_s)
                .arg(&table_of_blocks)
                .arg(&seen_d)
                .arg(&sk_arg)
                .arg(&split_arg)
                .arg(&mut states)
                .arg(&mut dev_out);
            unsafe { args.launch(cfg) }?;
            stream.synchronize()?;
        }
        stream.memcpy_dtoh(&dev_out, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_takes_its_codes_and_per_row_q_seen_keys_output_and_split_states() {
        // S_k = 100: K and V codes; 10 rows, each 64 Q codes, its seen keys, 64 f16 outputs,
        // 2 states of 66 f32.
        assert_eq!(
            head_bytes(100, 64, 10, 2),
            2 * 100 * 64 + 10 * (64 + 4 + 128 + 2 * 66 * 4)
        );
    }

    #[test]
    fn a_build_asks_for_the_algorithms_every_choice_and_ignores_its_split() {
        let stage_c = EmuBuild::new(64, Algorithm::STAGE_C.with_split(4));
        assert_eq!(stage_c, EmuBuild::new(64, Algorithm::STAGE_C));
        let values = |b: EmuBuild| b.defines().map(|(_, _, v)| v);
        // Stage C: f16 P, l as P·1 on the tensor cores, running P·V in f32, the scale fused,
        // the maximum moved only where a tile's passes it by 8 (log2 units).
        assert_eq!(values(stage_c), [64, 64, 16, 0, 0, 1, 0, 0, 1, 8]);
        let fp8 = Algorithm {
            block_n: 128,
            mma_k: 32,
            p: PPrecision::E4m3,
            row_sum: RowSum::F32P,
            pv: PvAccumulation::PerTile,
            accumulator: Accumulator::Fp22,
            score: ScoreScale::Fused,
            rescale_threshold: 0,
            ..Algorithm::STAGE_C
        };
        assert_eq!(
            values(EmuBuild::new(128, fp8)),
            [128, 128, 32, 1, 1, 0, 1, 1, 1, 0]
        );
    }
}
