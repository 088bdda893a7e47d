//! The emulation on the GPU (cuda/emulation_f32.cu): the clean emulation's output of the
//! checked rows, bit for bit what `crate::emulation::clean` gives on the host. Heads are
//! uploaded in groups that fit a budget (as the references' are, `groups`); the buffers are
//! its own, not the ones the kernel under test reads and writes.
//!
//! This kernel is the runner's, not the one under test: its failures are never reported as
//! the kernel's (exit 4). See `CudaBackend::emulation_grouped`.

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaModule, CudaStream, DriverError, LaunchConfig, PushKernelArg,
};
use half::f16;

use super::{groups, nvrtc};
use crate::problem::Problem;
use crate::rows::RowSet;

const SOURCE: &str = include_str!("../../../cuda/emulation_f32.cu");
/// Floats of one split's state (m, l, o) in the kernel's scratch buffer (its
/// `EMU_STATE_FLOATS`, checked when it loads).
pub const STATE_FLOATS: usize = 2 + crate::reference::DEVICE_HEAD_DIM;
const ENTRY: &str = "sdpa_emulation_f32";

/// Compiles the emulation kernel (no headers needed); run beside the variants' builds. The
/// error is a message: it only matters when the emulation is asked for on the device.
pub fn compile(arch: &str) -> Result<nvrtc::Compiled, String> {
    let options = nvrtc::build_options(arch, &[], &[]);
    nvrtc::compile(SOURCE, "emulation_f32.cu", &options)
        .map_err(|e| format!("the emulation kernel failed to compile: {e}"))
}

/// Device bytes of one head of `s` keys with `rows` checked rows and `kv_split` splits: K and
/// V codes, and per checked row its Q codes, its f16 output and its splits' states.
pub fn head_bytes(s: usize, d: usize, rows: usize, kv_split: usize) -> u64 {
    let per_row = d + 2 * d + kv_split * STATE_FLOATS * 4;
    (2 * s * d + rows * per_row) as u64
}

/// The loaded emulation kernel and the geometry it publishes (`EMU_*`).
pub struct DeviceEmulation {
    function: CudaFunction,
    _module: Arc<CudaModule>,
    /// Query rows per CTA, one thread each.
    rows: usize,
    smem_bytes: u32,
}

impl DeviceEmulation {
    /// Loads the compiled kernel and checks that its tiles are the host emulation's.
    pub fn load(
        ctx: &Arc<cudarc::driver::CudaContext>,
        compiled: nvrtc::Compiled,
    ) -> Result<Self, String> {
        let kernel = groups::OwnKernel {
            what: "emulation kernel",
            compiled,
        };
        let constant = |name| kernel.constant(name);
        let (head_dim, kv_tile) = (
            constant("EMU_HEAD_DIM")? as usize,
            constant("EMU_KV_TILE")? as usize,
        );
        if (head_dim, kv_tile) != (crate::reference::DEVICE_HEAD_DIM, crate::emulation::KV_TILE) {
            return Err(format!(
                "the emulation kernel is built for D = {head_dim} and KV tiles of {kv_tile} \
                 keys, the host emulation's are {} and {}",
                crate::reference::DEVICE_HEAD_DIM,
                crate::emulation::KV_TILE
            ));
        }
        let (rows, threads, smem_bytes, state_floats) = (
            constant("EMU_ROWS")? as usize,
            constant("EMU_THREADS")?,
            constant("EMU_SMEM_BYTES")?,
            constant("EMU_STATE_FLOATS")? as usize,
        );
        if rows != threads as usize || state_floats != STATE_FLOATS {
            return Err(format!(
                "the emulation kernel publishes {rows} rows per CTA on {threads} threads and \
                 split states of {state_floats} floats; the launcher needs one thread per row \
                 and states of {STATE_FLOATS}"
            ));
        }
        let (module, function) = kernel.load(ctx, ENTRY, smem_bytes)?;
        Ok(DeviceEmulation {
            function,
            _module: module,
            rows,
            smem_bytes,
        })
    }

    /// The clean emulation of the checked rows of `p` with `kv_split` splits, in their compact
    /// layout: heads in groups of at most `group_bytes` of device memory (one head per group
    /// if a head needs more), at most `blocks_per_launch` row blocks per launch.
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
        let (s, d) = (p.shape.s, p.shape.d);
        assert_eq!(
            d,
            crate::reference::DEVICE_HEAD_DIM,
            "the emulation kernel is built for D = 64"
        );
        let mut out = vec![0u16; rows.count() * d];
        let table: Vec<f32> = (0..=255u8).map(crate::fp8::decode).collect();
        let table = stream.clone_htod(&table)?;
        let bytes = |bh: usize| {
            let n = rows.offset(bh + 1) - rows.offset(bh);
            head_bytes(s, d, n, kv_split)
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

/// One group of heads of one problem.
struct Group<'a> {
    p: &'a Problem,
    rows: &'a RowSet,
    heads: std::ops::Range<usize>,
    kv_split: usize,
}

impl Group<'_> {
    /// Uploads the group, launches, and reads its rows' output into `out`.
    fn run(
        &self,
        k: &DeviceEmulation,
        stream: &Arc<CudaStream>,
        table: &cudarc::driver::CudaSlice<f32>,
        blocks_per_launch: usize,
        out: &mut [u16],
    ) -> Result<(), DriverError> {
        let (p, heads) = (self.p, self.heads.clone());
        let (s, d) = (p.shape.s, p.shape.d);
        let span = heads.start * s * d..heads.end * s * d;
        let n = out.len() / d;
        let q = groups::gather(&p.q.codes, self.rows, heads.clone(), s, d);
        let blocks = groups::row_blocks(self.rows, heads.clone(), k.rows);
        // The host emulation's own per-head factors.
        let qk_scale: Vec<f32> = heads
            .clone()
            .map(|bh| crate::emulation::qk_scale(p, bh))
            .collect();
        let q_c = stream.clone_htod(&q)?;
        let k_c = stream.clone_htod(&p.k.codes[span.clone()])?;
        let v_c = stream.clone_htod(&p.v.codes[span])?;
        let qk_s = stream.clone_htod(&qk_scale)?;
        let v_s = stream.clone_htod(&p.v.scales[heads])?;
        let mut states = stream.alloc_zeros::<f32>(n * self.kv_split * STATE_FLOATS)?;
        let mut dev_out = stream.alloc_zeros::<u16>(n * d)?;
        let s_arg = i32::try_from(s).expect("S fits the kernel's int (shapes are checked)");
        let split_arg = self.kv_split as i32;
        for chunk in blocks.chunks(3 * blocks_per_launch) {
            let table_of_blocks = stream.clone_htod(chunk)?;
            let cfg = LaunchConfig {
                grid_dim: ((chunk.len() / 3) as u32, 1, 1),
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
                .arg(&s_arg)
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
    fn a_head_takes_its_codes_and_per_row_q_output_and_split_states() {
        // S = 100: K and V codes; 10 rows, each 64 Q codes, 64 f16 outputs, 2 states of 66 f32.
        assert_eq!(
            head_bytes(100, 64, 10, 2),
            2 * 100 * 64 + 10 * (64 + 128 + 2 * 66 * 4)
        );
    }
}
