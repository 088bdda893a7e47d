//! The f64 references on the GPU (cuda/reference_f64.cu): the sums of
//! [`RowSums`] for the checked rows, which the host finishes exactly as it finishes its own
//! (`References::from_sums`). Heads are uploaded in groups that fit [`GROUP_BYTES`] (and the
//! device's free memory), so any shape the kernel runs also gets its references; the buffers
//! are the reference's own, not the ones the kernel under test reads and writes.
//!
//! This kernel is the runner's, not the one under test: its failures are never reported as
//! the kernel's (exit 4). See `CudaBackend::reference_sums_grouped`.

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::sys::CUresult;
use cudarc::driver::{
    CudaFunction, CudaModule, CudaStream, DriverError, LaunchConfig, PushKernelArg,
};

use super::{groups, nvrtc};
use crate::problem::Problem;
use crate::reference::{RowSums, RowTotals};
use crate::rows::RowSet;

const SOURCE: &str = include_str!("../../../cuda/reference_f64.cu");
const ENTRY: &str = "sdpa_reference_f64";
/// Device memory one group of heads may take (inputs, gathered Q rows, sums).
pub const GROUP_BYTES: u64 = 2 << 30;
/// Row blocks per launch: bounds the work of one launch (a launch cannot be interrupted).
pub const BLOCKS_PER_LAUNCH: usize = 1 << 15;

/// Compiles the reference kernel (no headers needed); run beside the variants' builds. The
/// error is a message: a reference kernel that does not build only matters when device
/// references are asked for.
pub fn compile(arch: &str) -> Result<nvrtc::Compiled, String> {
    let options = nvrtc::build_options(arch, &[], &[]);
    nvrtc::compile(SOURCE, "reference_f64.cu", &options)
        .map_err(|e| format!("the f64 reference kernel failed to compile: {e}"))
}

/// Whether a driver error is an allocation that did not fit: the context stays usable (unlike
/// after a failed launch or synchronize), and the host can compute the references instead.
pub fn out_of_memory(e: &DriverError) -> bool {
    e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

/// Device bytes of one head of `s` keys with `rows` checked rows: K and V as codes and f32
/// (per head), and per checked row its Q row as codes and f32 and its sums and totals in f64.
pub fn head_bytes(s: usize, d: usize, rows: usize) -> u64 {
    let per_head = (s * d * 10) as u64;
    let per_row = (d * 5 + 3 * d * 8 + 4 * 8) as u64;
    per_head + per_row * rows as u64
}

/// The loaded reference kernel and the geometry it publishes (`REF_*`).
pub struct DeviceReference {
    function: CudaFunction,
    _module: Arc<CudaModule>,
    /// Query rows per CTA.
    rows: usize,
    threads: u32,
    smem_bytes: u32,
}

impl DeviceReference {
    /// Loads the compiled kernel; the error is a message, as for [`compile`].
    pub fn load(
        ctx: &Arc<cudarc::driver::CudaContext>,
        compiled: nvrtc::Compiled,
    ) -> Result<Self, String> {
        let kernel = groups::OwnKernel {
            what: "f64 reference kernel",
            compiled,
        };
        let head_dim = kernel.constant("REF_HEAD_DIM")? as usize;
        if head_dim != crate::reference::DEVICE_HEAD_DIM {
            return Err(format!(
                "the f64 reference kernel is built for D = {head_dim}, the runner's is {}",
                crate::reference::DEVICE_HEAD_DIM
            ));
        }
        let (rows, threads, smem_bytes) = (
            kernel.constant("REF_ROWS")? as usize,
            kernel.constant("REF_THREADS")?,
            kernel.constant("REF_SMEM_BYTES")?,
        );
        let (module, function) = kernel.load(ctx, ENTRY, smem_bytes)?;
        Ok(DeviceReference {
            function,
            _module: module,
            rows,
            threads,
            smem_bytes,
        })
    }

    /// The sums of the checked rows of `p`, in groups of whole heads of at most
    /// `group_bytes` of device memory (one head per group if a head needs more), at most
    /// `blocks_per_launch` row blocks per launch.
    pub fn sums(
        &self,
        stream: &Arc<CudaStream>,
        p: &Problem,
        rows: &RowSet,
        group_bytes: u64,
        blocks_per_launch: usize,
    ) -> Result<RowSums, DriverError> {
        assert!(blocks_per_launch > 0, "at least one row block per launch");
        let (s, d) = (p.shape.s, p.shape.d);
        assert_eq!(
            d,
            crate::reference::DEVICE_HEAD_DIM,
            "the f64 reference kernel is built for D = 64"
        );
        let n = rows.count();
        let mut sums = RowSums {
            o_k: vec![0.0; n * d],
            a: vec![0.0; n * d],
            o_e: vec![0.0; n * d],
            totals: Vec::with_capacity(n),
            // The device reads as Stage C's model does: no spread (Reading::STAGE_C).
            spread: Vec::new(),
        };
        let table = stream.clone_htod(&crate::fp8::decode_table_f64())?;
        let bytes = |bh: usize| head_bytes(s, d, rows.offset(bh + 1) - rows.offset(bh));
        for heads in groups::head_groups(rows.heads(), group_bytes, bytes) {
            self.group(stream, &table, p, rows, heads, blocks_per_launch, &mut sums)?;
        }
        Ok(sums)
    }

    /// Heads `heads` of `p`: uploads them, launches, and reads their rows' sums into `sums`.
    /// A group without checked rows has nothing to compute (and no buffers to allocate).
    #[allow(clippy::too_many_arguments)]
    fn group(
        &self,
        stream: &Arc<CudaStream>,
        table: &cudarc::driver::CudaSlice<f64>,
        p: &Problem,
        rows: &RowSet,
        heads: Range<usize>,
        blocks_per_launch: usize,
        sums: &mut RowSums,
    ) -> Result<(), DriverError> {
        let (s, d) = (p.shape.s, p.shape.d);
        let span = heads.start * s * d..heads.end * s * d;
        let row_span = rows.offset(heads.start)..rows.offset(heads.end);
        let n = row_span.len();
        if n == 0 {
            return Ok(());
        }
        let q_codes = groups::gather(&p.q.codes, rows, heads.clone(), s, d);
        let q_orig = groups::gather(&p.inputs.q, rows, heads.clone(), s, d);
        let blocks = groups::row_blocks(rows, heads.clone(), self.rows);
        let up = |x: &[f32]| stream.clone_htod(x);
        let scales = |t: &crate::fp8::Fp8Tensor| up(&t.scales[heads.clone()]);
        let (q_c, q_f) = (stream.clone_htod(&q_codes)?, up(&q_orig)?);
        let (k_c, k_f) = (
            stream.clone_htod(&p.k.codes[span.clone()])?,
            up(&p.inputs.k[span.clone()])?,
        );
        let (v_c, v_f) = (
            stream.clone_htod(&p.v.codes[span.clone()])?,
            up(&p.inputs.v[span])?,
        );
        let (q_s, k_s, v_s) = (scales(&p.q)?, scales(&p.k)?, scales(&p.v)?);
        let mut o_k = stream.alloc_zeros::<f64>(n * d)?;
        let mut o_a = stream.alloc_zeros::<f64>(n * d)?;
        let mut o_e = stream.alloc_zeros::<f64>(n * d)?;
        let mut stats = stream.alloc_zeros::<f64>(n * 4)?;
        let (s_arg, scale) = (s as i32, p.softmax_scale as f64);
        for chunk in blocks.chunks(3 * blocks_per_launch) {
            let table_of_blocks = stream.clone_htod(chunk)?;
            let cfg = LaunchConfig {
                grid_dim: ((chunk.len() / 3) as u32, 1, 1),
                block_dim: (self.threads, 1, 1),
                shared_mem_bytes: self.smem_bytes,
            };
            let mut args = stream.launch_builder(&self.function);
            args.arg(table)
                .arg(&q_c)
                .arg(&q_f)
                .arg(&k_c)
                .arg(&k_f)
                .arg(&v_c)
                .arg(&v_f)
                .arg(&q_s)
                .arg(&k_s)
                .arg(&v_s)
                .arg(&table_of_blocks)
                .arg(&s_arg)
                .arg(&scale)
                .arg(&mut o_k)
                .arg(&mut o_a)
                .arg(&mut o_e)
                .arg(&mut stats);
            unsafe { args.launch(cfg) }?;
            stream.synchronize()?;
        }
        let at = row_span.start * d..row_span.end * d;
        stream.memcpy_dtoh(&o_k, &mut sums.o_k[at.clone()])?;
        stream.memcpy_dtoh(&o_a, &mut sums.a[at.clone()])?;
        stream.memcpy_dtoh(&o_e, &mut sums.o_e[at])?;
        let stats = stream.clone_dtoh(&stats)?;
        sums.totals.extend(stats.chunks(4).map(|t| RowTotals {
            l_k: t[0],
            l_e: t[1],
            score_shift: t[2],
            subnormal_weights: t[3] as usize,
        }));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_takes_its_keys_and_values_and_its_checked_rows() {
        assert_eq!(
            head_bytes(100, 64, 100),
            100 * 64 * 10 + 100 * (64 * 5 + 3 * 64 * 8 + 32)
        );
    }

    #[test]
    fn an_out_of_memory_error_is_told_apart_from_a_fault() {
        assert!(out_of_memory(&DriverError(
            CUresult::CUDA_ERROR_OUT_OF_MEMORY
        )));
        assert!(!out_of_memory(&DriverError(
            CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
        )));
        assert!(!out_of_memory(&DriverError(
            CUresult::CUDA_ERROR_LAUNCH_FAILED
        )));
    }
}
