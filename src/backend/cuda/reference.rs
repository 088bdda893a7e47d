//! The f64 references on the GPU (cuda/reference_f64.cu): the sums of
//! [`RowSums`] for the checked rows, which the host finishes exactly as it finishes its own
//! (`References::from_sums`). One module per [`RefBuild`] (head dim, and whether the spread
//! is summed). Query heads are uploaded in groups that fit [`GROUP_BYTES`] (and the device's
//! free memory) with the K/V heads they read, so any problem the kernel runs also gets its
//! references; the buffers are the reference's own, not the ones the kernel under test reads
//! and writes.
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
use crate::reference::{Precision, Reading, RowSums, RowTotals, Spread};
use crate::rows::RowSet;

const SOURCE: &str = include_str!("../../../cuda/reference_f64.cu");
const ENTRY: &str = "sdpa_reference_f64";
/// Device memory one group of heads may take (inputs, gathered Q rows, sums).
pub const GROUP_BYTES: u64 = 2 << 30;
/// Row blocks per launch: bounds the work of one launch (a launch cannot be interrupted).
pub const BLOCKS_PER_LAUNCH: usize = 1 << 15;

/// What one reference module is built for: its head dim, and whether it sums the spread
/// (the implementation model's statistical terms, [`Reading::spread`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RefBuild {
    pub d: usize,
    pub spread: bool,
}

/// Compiles the reference kernel of `build` (no headers needed); run beside the variants'
/// builds. The error is a message: a reference kernel that does not build only matters when
/// device references are asked for.
pub fn compile(build: RefBuild, arch: &str) -> Result<nvrtc::Compiled, String> {
    let defines = [
        ("REF_D".to_string(), build.d.to_string()),
        ("REF_SPREAD".to_string(), u8::from(build.spread).to_string()),
    ];
    let options = nvrtc::build_options(arch, &[], &defines);
    nvrtc::compile(SOURCE, "reference_f64.cu", &options).map_err(|e| {
        format!(
            "the f64 reference kernel (D = {}) failed to compile: {e}",
            build.d
        )
    })
}

/// Whether a driver error is an allocation that did not fit: the context stays usable (unlike
/// after a failed launch or synchronize), and the host can compute the references instead.
pub fn out_of_memory(e: &DriverError) -> bool {
    e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

/// Device bytes of one query head with `sk` keys and `rows` checked rows: K and V as codes and
/// f32 (counted per query head: with GQA, more than its share), and per checked row its Q row
/// as codes and f32, its seen keys, and its sums (five with the spread) and totals in f64.
pub fn head_bytes(sk: usize, d: usize, rows: usize, spread: bool) -> u64 {
    let per_head = (sk * d * 10) as u64;
    let sums = if spread { 5 } else { 3 };
    let per_row = (d * 5 + 4 + sums * d * 8 + 4 * 8) as u64;
    per_head + per_row * rows as u64
}

/// The loaded reference kernel and the geometry it publishes (`REF_*`).
pub struct DeviceReference {
    build: RefBuild,
    function: CudaFunction,
    _module: Arc<CudaModule>,
    /// Query rows per CTA.
    rows: usize,
    threads: u32,
    smem_bytes: u32,
}

impl DeviceReference {
    /// Loads the compiled kernel and checks that it was built for `build`; the error is a
    /// message, as for [`compile`].
    pub fn load(
        ctx: &Arc<cudarc::driver::CudaContext>,
        build: RefBuild,
        compiled: nvrtc::Compiled,
    ) -> Result<Self, String> {
        let kernel = groups::OwnKernel {
            what: "f64 reference kernel",
            compiled,
        };
        let built = RefBuild {
            d: kernel.constant("REF_HEAD_DIM")? as usize,
            spread: kernel.constant("REF_WITH_SPREAD")? != 0,
        };
        if built != build {
            return Err(format!(
                "the f64 reference module is built for {built:?}, the runner asked for {build:?}"
            ));
        }
        let (rows, threads, smem_bytes) = (
            kernel.constant("REF_ROWS")? as usize,
            kernel.constant("REF_THREADS")?,
            kernel.constant("REF_SMEM_BYTES")?,
        );
        let (module, function) = kernel.load(ctx, ENTRY, smem_bytes)?;
        Ok(DeviceReference {
            build,
            function,
            _module: module,
            rows,
            threads,
            smem_bytes,
        })
    }

    /// The sums of the checked rows of `p` read as `reading` says, in groups of whole query
    /// heads of at most `group_bytes` of device memory (one head per group if a head needs
    /// more), at most `blocks_per_launch` row blocks per launch.
    pub fn sums(
        &self,
        stream: &Arc<CudaStream>,
        p: &Problem,
        reading: Reading,
        rows: &RowSet,
        group_bytes: u64,
        blocks_per_launch: usize,
    ) -> Result<RowSums, DriverError> {
        assert!(blocks_per_launch > 0, "at least one row block per launch");
        let (sk, d) = (p.shape.sk, p.shape.d);
        assert_eq!(
            (d, reading.spread, reading.precision),
            (self.build.d, self.build.spread, Precision::Fp8),
            "the reference module must be the problem's and the reading's"
        );
        let n = rows.count();
        let zero = Spread { pp: 0.0, rr: 0.0 };
        let mut sums = RowSums {
            o_k: vec![0.0; n * d],
            a: vec![0.0; n * d],
            o_e: vec![0.0; n * d],
            totals: Vec::with_capacity(n),
            spread: vec![zero; if reading.spread { n * d } else { 0 }],
        };
        let table = stream.clone_htod(&crate::fp8::decode_table_f64())?;
        let bytes = |bh: usize| {
            let n = rows.offset(bh + 1) - rows.offset(bh);
            head_bytes(sk, d, n, reading.spread)
        };
        for heads in groups::head_groups(rows.heads(), group_bytes, bytes) {
            let group = Group {
                p,
                reading,
                rows,
                heads,
            };
            group.run(self, stream, &table, blocks_per_launch, &mut sums)?;
        }
        Ok(sums)
    }
}

/// One group of query heads of one problem.
struct Group<'a> {
    p: &'a Problem,
    reading: Reading,
    rows: &'a RowSet,
    heads: Range<usize>,
}

impl Group<'_> {
    /// Uploads the group and the K/V heads it reads, launches, and reads its rows' sums into
    /// `sums`. A group without checked rows has nothing to compute (and no buffers to
    /// allocate).
    fn run(
        &self,
        k: &DeviceReference,
        stream: &Arc<CudaStream>,
        table: &cudarc::driver::CudaSlice<f64>,
        blocks_per_launch: usize,
        sums: &mut RowSums,
    ) -> Result<(), DriverError> {
        let (p, rows, heads) = (self.p, self.rows, self.heads.clone());
        let sh = &p.shape;
        let (s, sk, d) = (sh.s, sh.sk, sh.d);
        let kv = groups::kv_heads(sh, heads.clone());
        let span = kv.start * sk * d..kv.end * sk * d;
        let row_span = rows.offset(heads.start)..rows.offset(heads.end);
        let n = row_span.len();
        if n == 0 {
            return Ok(());
        }
        let q_codes = groups::gather(&p.q.codes, rows, heads.clone(), s, d);
        let q_orig = groups::gather(&p.inputs.q, rows, heads.clone(), s, d);
        let seen = groups::visible_keys(sh, rows, heads.clone());
        let blocks = groups::row_blocks(sh, rows, heads.clone(), k.rows);
        let up = |x: &[f32]| stream.clone_htod(x);
        // Per query head: its own Q scale, and K's and V's of the K/V head it reads.
        let per_query_head = |t: &crate::fp8::Fp8Tensor, of_kv: bool| {
            let scales: Vec<f32> = heads
                .clone()
                .map(|bh| t.scales[if of_kv { sh.kv_head_of(bh) } else { bh }])
                .collect();
            up(&scales)
        };
        let (q_c, q_f) = (stream.clone_htod(&q_codes)?, up(&q_orig)?);
        let (k_c, k_f) = (
            stream.clone_htod(&p.k.codes[span.clone()])?,
            up(&p.inputs.k[span.clone()])?,
        );
        let (v_c, v_f) = (
            stream.clone_htod(&p.v.codes[span.clone()])?,
            up(&p.inputs.v[span])?,
        );
        let (q_s, k_s, v_s) = (
            per_query_head(&p.q, false)?,
            per_query_head(&p.k, true)?,
            per_query_head(&p.v, true)?,
        );
        let seen_d = stream.clone_htod(&seen)?;
        let mut o_k = stream.alloc_zeros::<f64>(n * d)?;
        let mut o_a = stream.alloc_zeros::<f64>(n * d)?;
        let mut o_e = stream.alloc_zeros::<f64>(n * d)?;
        // Without the spread the kernel never touches these: one element each.
        let spread_len = if self.reading.spread { n * d } else { 1 };
        let mut o_pp = stream.alloc_zeros::<f64>(spread_len)?;
        let mut o_rr = stream.alloc_zeros::<f64>(spread_len)?;
        let mut stats = stream.alloc_zeros::<f64>(n * 4)?;
        let sk_arg = i32::try_from(sk).expect("S_k fits the kernel's int (shapes are checked)");
        let scale = p.softmax_scale as f64;
        let small = self.reading.small_weight;
        let [rel, min_normal, sub_half] = self.reading.p_rounding_figures();
        for chunk in blocks.chunks(groups::BLOCK_INTS * blocks_per_launch) {
            let table_of_blocks = stream.clone_htod(chunk)?;
            let cfg = LaunchConfig {
                grid_dim: ((chunk.len() / groups::BLOCK_INTS) as u32, 1, 1),
                block_dim: (k.threads, 1, 1),
                shared_mem_bytes: k.smem_bytes,
            };
            let mut args = stream.launch_builder(&k.function);
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
                .arg(&seen_d)
                .arg(&sk_arg)
                .arg(&scale)
                .arg(&small)
                .arg(&rel)
                .arg(&min_normal)
                .arg(&sub_half)
                .arg(&mut o_k)
                .arg(&mut o_a)
                .arg(&mut o_e)
                .arg(&mut o_pp)
                .arg(&mut o_rr)
                .arg(&mut stats);
            unsafe { args.launch(cfg) }?;
            stream.synchronize()?;
        }
        let at = row_span.start * d..row_span.end * d;
        stream.memcpy_dtoh(&o_k, &mut sums.o_k[at.clone()])?;
        stream.memcpy_dtoh(&o_a, &mut sums.a[at.clone()])?;
        stream.memcpy_dtoh(&o_e, &mut sums.o_e[at.clone()])?;
        if self.reading.spread {
            let (pp, rr) = (stream.clone_dtoh(&o_pp)?, stream.clone_dtoh(&o_rr)?);
            for ((s, pp), rr) in sums.spread[at].iter_mut().zip(pp).zip(rr) {
                *s = Spread { pp, rr };
            }
        }
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
            head_bytes(100, 64, 100, false),
            100 * 64 * 10 + 100 * (64 * 5 + 4 + 3 * 64 * 8 + 32)
        );
        // The spread adds two f64 sums per element.
        assert_eq!(
            head_bytes(100, 64, 100, true) - head_bytes(100, 64, 100, false),
            100 * 2 * 64 * 8
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
