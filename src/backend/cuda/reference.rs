//! The f64 references on the GPU (cuda/reference_f64.cu): the sums of
//! [`RowSums`] for the checked rows, which the host finishes exactly as it finishes its own
//! (`References::from_sums`). Heads are uploaded in groups that fit [`GROUP_BYTES`], so any
//! shape the kernel runs also gets its references; the buffers are the reference's own, not
//! the ones the kernel under test reads and writes.

use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute_enum as FnAttr;
use cudarc::driver::{
    CudaFunction, CudaModule, CudaStream, DriverError, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use super::{identity, nvrtc};
use crate::backend::BackendError;
use crate::problem::Problem;
use crate::reference::{RowSums, RowTotals};
use crate::rows::RowSet;

const SOURCE: &str = include_str!("../../../cuda/reference_f64.cu");
const ENTRY: &str = "sdpa_reference_f64";
/// Device memory one group of heads may take (inputs, gathered Q rows, sums).
pub const GROUP_BYTES: u64 = 2 << 30;
/// Row blocks per launch: bounds the work of one launch (a launch cannot be interrupted).
const BLOCKS_PER_LAUNCH: usize = 1 << 15;

/// Compiles the reference kernel (no headers needed); run beside the variants' builds.
pub fn compile(arch: &str) -> Result<nvrtc::Compiled, BackendError> {
    let options = nvrtc::build_options(arch, &[], &[]);
    nvrtc::compile(SOURCE, "reference_f64.cu", &options).map_err(|e| {
        BackendError::Kernel(format!("the f64 reference kernel failed to compile: {e}"))
    })
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
    pub fn load(
        ctx: &Arc<cudarc::driver::CudaContext>,
        compiled: nvrtc::Compiled,
    ) -> Result<Self, BackendError> {
        let failed = |e: DriverError| {
            BackendError::Kernel(format!("loading the f64 reference kernel failed: {e}"))
        };
        let constant = |name| {
            identity::ptx_constant(&compiled.ptx, name)
                .map_err(|e| BackendError::Kernel(format!("the f64 reference kernel: {e}")))
        };
        let head_dim = constant("REF_HEAD_DIM")? as usize;
        if head_dim != crate::shapes::HEAD_DIM {
            return Err(BackendError::Kernel(format!(
                "the f64 reference kernel is built for D = {head_dim}, the runner's is {}",
                crate::shapes::HEAD_DIM
            )));
        }
        let (rows, threads, smem_bytes) = (
            constant("REF_ROWS")? as usize,
            constant("REF_THREADS")?,
            constant("REF_SMEM_BYTES")?,
        );
        let module = ctx
            .load_module(Ptx::from_binary(compiled.cubin))
            .map_err(failed)?;
        let function = module.load_function(ENTRY).map_err(failed)?;
        function
            .set_attribute(
                FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem_bytes as i32,
            )
            .map_err(failed)?;
        Ok(DeviceReference {
            function,
            _module: module,
            rows,
            threads,
            smem_bytes,
        })
    }

    /// The sums of the checked rows of `p`, in groups of whole heads of at most
    /// `group_bytes` of device memory (one head per group if a head needs more).
    pub fn sums(
        &self,
        stream: &Arc<CudaStream>,
        p: &Problem,
        rows: &RowSet,
        group_bytes: u64,
    ) -> Result<RowSums, DriverError> {
        let (s, d) = (p.shape.s, p.shape.d);
        assert_eq!(
            d,
            crate::shapes::HEAD_DIM,
            "the f64 reference kernel is built for D = 64"
        );
        let n = rows.count();
        let mut sums = RowSums {
            o_k: vec![0.0; n * d],
            a: vec![0.0; n * d],
            o_e: vec![0.0; n * d],
            totals: Vec::with_capacity(n),
        };
        let table = stream.clone_htod(&crate::fp8::decode_table_f64())?;
        // K and V as codes and f32, Q rows as codes and f32, the sums in f64.
        let per_head = (s * d * 10) as u64;
        let per_row = (d * 5 + 3 * d * 8 + 4 * 8) as u64;
        let mut first = 0;
        while first < rows.heads() {
            let mut end = first + 1;
            let mut bytes = per_head + per_row * head_rows(rows, first) as u64;
            while end < rows.heads() {
                let more = per_head + per_row * head_rows(rows, end) as u64;
                if bytes + more > group_bytes {
                    break;
                }
                bytes += more;
                end += 1;
            }
            self.group(stream, &table, p, rows, first..end, &mut sums)?;
            first = end;
        }
        Ok(sums)
    }

    /// Heads `heads` of `p`: uploads them, launches, and reads their rows' sums into `sums`.
    fn group(
        &self,
        stream: &Arc<CudaStream>,
        table: &cudarc::driver::CudaSlice<f64>,
        p: &Problem,
        rows: &RowSet,
        heads: std::ops::Range<usize>,
        sums: &mut RowSums,
    ) -> Result<(), DriverError> {
        let (s, d) = (p.shape.s, p.shape.d);
        let span = heads.start * s * d..heads.end * s * d;
        let row_span = rows.offset(heads.start)..rows.offset(heads.end);
        let (mut q_codes, mut q_orig) = (Vec::new(), Vec::new());
        let mut blocks: Vec<i32> = Vec::new();
        for bh in heads.clone() {
            let mine = rows.rows(bh);
            for &r in mine.iter() {
                let at = (bh * s + r) * d..(bh * s + r + 1) * d;
                q_codes.extend_from_slice(&p.q.codes[at.clone()]);
                q_orig.extend_from_slice(&p.inputs.q[at]);
            }
            let base = rows.offset(bh) - row_span.start;
            for start in (0..mine.len()).step_by(self.rows) {
                let count = self.rows.min(mine.len() - start);
                blocks.extend([
                    (bh - heads.start) as i32,
                    (base + start) as i32,
                    count as i32,
                ]);
            }
        }
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
        let n = row_span.len();
        let mut o_k = stream.alloc_zeros::<f64>(n * d)?;
        let mut o_a = stream.alloc_zeros::<f64>(n * d)?;
        let mut o_e = stream.alloc_zeros::<f64>(n * d)?;
        let mut stats = stream.alloc_zeros::<f64>(n * 4)?;
        let (s_arg, scale) = (s as i32, p.softmax_scale as f64);
        for chunk in blocks.chunks(3 * BLOCKS_PER_LAUNCH) {
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

fn head_rows(rows: &RowSet, bh: usize) -> usize {
    rows.offset(bh + 1) - rows.offset(bh)
}
