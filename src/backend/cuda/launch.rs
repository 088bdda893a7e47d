//! Device buffers of one problem and the kernel launch (docs/DESIGN.md "Kernel ABI"): Q, K and V
//! as pointers, or as tensor maps (`abi = "tensor-maps"`, src/backend/cuda/tensor_map.rs), as
//! the variant's manifest entry says.

use std::sync::Arc;

use cudarc::driver::{
    CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DriverError, LaunchConfig, PushKernelArg,
};
use half::f16;

use super::LoadedVariant;
use super::identity::{KernelConstants, LaunchShape};
use super::tensor_map::{self, MapLayout, Operand, TmaDesc};
use crate::kernels::Abi;
use crate::metrics::POISON;
use crate::problem::Problem;

/// Inputs and output of one problem on the device.
pub struct DeviceProblem {
    q: CudaSlice<u8>,
    k: CudaSlice<u8>,
    v: CudaSlice<u8>,
    q_scale: CudaSlice<f32>,
    k_scale: CudaSlice<f32>,
    v_scale: CudaSlice<f32>,
    /// Output buffers: one, or two for concurrent launches on two streams.
    outs: Vec<CudaSlice<f16>>,
    b: i32,
    h: i32,
    hkv: i32,
    sq: i32,
    sk: i32,
    causal: i32,
    entry: crate::shapes::Entry,
    /// The problem as the launch geometry reads it (the i32 fields above are the kernel's
    /// arguments).
    shape: LaunchShape,
    softmax_scale: f32,
    /// The Q, K and V tensor maps of each layout a `tensor-maps` variant asked for, built at
    /// its first launch.
    maps: Vec<(MapLayout, [TmaDesc; 3])>,
    /// The launch geometry of each module's constants (and SM count) that launched it.
    geometries: Vec<((KernelConstants, u32), Geometry)>,
    /// A split launch's workspace per output buffer (zeroed once; the kernel leaves its
    /// counters zero), so launches on two streams never share one.
    works: Vec<Option<CudaSlice<u8>>>,
}

/// What one module's launches of this problem need beyond its buffers.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    smem_bytes: u32,
    kv_ctas: u32,
    /// Bytes of the split's workspace (0: no split).
    work_bytes: usize,
}

impl DeviceProblem {
    /// Device bytes a problem needs: three code tensors, three scale vectors, the f16 output,
    /// and for a short query the bound of two split workspaces (one per output buffer).
    pub fn bytes_needed(p: &Problem) -> u64 {
        let n = p.output_len() as u64;
        let nkv = p.shape.kv_elements().unwrap_or(usize::MAX) as u64;
        let split = if p.shape.s <= SPLIT_MAX_ROWS {
            2 * SPLIT_WORK_BOUND + 2 * 4 * p.shape.heads() as u64
        } else {
            0
        };
        n + 2 * nkv + 2 * n + 4 * (p.shape.heads() + 2 * p.shape.kv_heads()) as u64 + split
    }

    pub fn upload(stream: &Arc<CudaStream>, p: &Problem) -> Result<Self, DriverError> {
        Ok(DeviceProblem {
            q: stream.clone_htod(&p.q.codes)?,
            k: stream.clone_htod(&p.k.codes)?,
            v: stream.clone_htod(&p.v.codes)?,
            q_scale: stream.clone_htod(&p.q.scales)?,
            k_scale: stream.clone_htod(&p.k.scales)?,
            v_scale: stream.clone_htod(&p.v.scales)?,
            outs: vec![unsafe { stream.alloc::<f16>(p.output_len())? }],
            b: p.shape.b as i32,
            h: p.shape.h as i32,
            hkv: p.shape.hkv as i32,
            sq: p.shape.s as i32,
            sk: p.shape.sk as i32,
            causal: i32::from(p.shape.causal),
            entry: p.shape.entry(),
            shape: LaunchShape::of(&p.shape),
            softmax_scale: p.softmax_scale,
            maps: Vec::new(),
            geometries: Vec::new(),
            works: Vec::new(),
        })
    }

    /// The Q, K, V tensor maps over this problem's codes in `layout` (built once per layout,
    /// at the first call: `CudaBackend::load` builds them before any launch).
    pub fn tensor_maps(
        &mut self,
        stream: &Arc<CudaStream>,
        layout: MapLayout,
    ) -> Result<[TmaDesc; 3], String> {
        if let Some((_, maps)) = self.maps.iter().find(|(l, _)| *l == layout) {
            return Ok(*maps);
        }
        let (d, q) = (self.entry.d, self.shape);
        let (sq, sk) = (q.sq, q.sk);
        let (heads, kv_heads) = (q.b * q.h, q.b * q.hkv);
        let addr = |s: &CudaSlice<u8>| {
            let (ptr, _sync) = s.device_ptr(stream);
            ptr
        };
        let maps = [
            tensor_map::encode(Operand::Q, addr(&self.q), d, sq, heads, layout)?,
            tensor_map::encode(Operand::K, addr(&self.k), d, sk, kv_heads, layout)?,
            tensor_map::encode(Operand::V, addr(&self.v), d, sk, kv_heads, layout)?,
        ];
        self.maps.push((layout, maps));
        Ok(maps)
    }

    /// Makes sure `count` output buffers exist.
    pub fn ensure_outputs(
        &mut self,
        stream: &Arc<CudaStream>,
        count: usize,
    ) -> Result<(), DriverError> {
        while self.outs.len() < count {
            let len = self.outs[0].len();
            self.outs.push(unsafe { stream.alloc::<f16>(len)? });
        }
        Ok(())
    }

    /// Fills output `slot` with the poison pattern, so unwritten elements are detectable.
    pub fn poison(&mut self, stream: &Arc<CudaStream>, slot: usize) -> Result<(), DriverError> {
        let out = &mut self.outs[slot];
        let len = out.len();
        let (ptr, _sync) = out.device_ptr_mut(stream);
        unsafe {
            cudarc::driver::sys::cuMemsetD16Async(ptr, POISON.to_bits(), len, stream.cu_stream())
        }
        .result()
    }

    /// Enqueues one launch of `function` on `stream` writing output `slot` (asynchronous;
    /// errors of the launch itself are returned, faults surface at the next synchronization).
    pub fn launch(
        &mut self,
        stream: &Arc<CudaStream>,
        variant: &LoadedVariant,
        slot: usize,
    ) -> Result<(), DriverError> {
        // The entry of this problem (D, causal) and its shared memory (`CudaBackend::load`
        // refused a problem whose entry was not built).
        let consts = &variant.identity.constants;
        let function = variant
            .entry(self.entry)
            .expect("the entry of the problem was built");
        let geometry = self.geometry(consts, variant.sms);
        let (grid_dim, block_dim) = launch_dims(consts, self.entry, self.shape, geometry.kv_ctas);
        let cfg = LaunchConfig {
            grid_dim,
            block_dim,
            shared_mem_bytes: geometry.smem_bytes,
        };
        let work = self.work(stream, slot, geometry.work_bytes)?;
        let maps = match variant.kernel.abi {
            Abi::Pointers => None,
            Abi::TensorMaps => Some(self.tensor_maps(stream, consts.map_layout()).map_err(
                |why| {
                    crate::trace::mark(|| why.clone());
                    DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_VALUE)
                },
            )?),
        };
        let mut args = stream.launch_builder(function);
        match &maps {
            None => args.arg(&self.q).arg(&self.k).arg(&self.v),
            Some([q, k, v]) => args.arg(q).arg(k).arg(v),
        };
        args.arg(&self.q_scale)
            .arg(&self.k_scale)
            .arg(&self.v_scale)
            .arg(&mut self.outs[slot])
            .arg(&self.b)
            .arg(&self.h)
            .arg(&self.hkv)
            .arg(&self.sq)
            .arg(&self.sk)
            .arg(&self.causal)
            .arg(&self.softmax_scale);
        if variant.kernel.abi == Abi::Pointers {
            args.arg(&work);
        }
        unsafe { args.launch(cfg) }.map(|_| ())
    }

    /// The launch geometry of a module with `consts` on a GPU of `sms` SMs, worked out at its
    /// first launch of this problem (not in every timed launch).
    fn geometry(&mut self, consts: &KernelConstants, sms: u32) -> Geometry {
        let key = (*consts, sms);
        if let Some((_, g)) = self.geometries.iter().find(|(k, _)| *k == key) {
            return *g;
        }
        let shape = self.shape;
        let kv_ctas = consts.kv_ctas(self.entry, shape);
        let g = Geometry {
            smem_bytes: consts.launch_smem_bytes(self.entry, shape, sms),
            kv_ctas,
            work_bytes: if kv_ctas > 1 {
                split_work_bytes(shape, self.entry.d, consts.kv_split * kv_ctas)
            } else {
                0
            },
        };
        self.geometries.push((key, g));
        g
    }

    /// The device address of output `slot`'s split workspace of at least `bytes` (zeroed when
    /// allocated), or 0 where the launch does not split.
    fn work(
        &mut self,
        stream: &Arc<CudaStream>,
        slot: usize,
        bytes: usize,
    ) -> Result<u64, DriverError> {
        if bytes == 0 {
            return Ok(0);
        }
        if self.works.len() <= slot {
            self.works.resize_with(slot + 1, || None);
        }
        let fits = self.works[slot].as_ref().is_some_and(|w| w.len() >= bytes);
        if !fits {
            self.works[slot] = Some(stream.alloc_zeros::<u8>(bytes)?);
        }
        let work = self.works[slot].as_ref().expect("allocated above");
        let (ptr, _sync) = work.device_ptr(stream);
        Ok(ptr)
    }

    pub fn download(&self, stream: &Arc<CudaStream>, slot: usize) -> Result<Vec<f16>, DriverError> {
        stream.clone_dtoh(&self.outs[slot])
    }
}

/// The grid and block of a launch of `entry` on `q`: a CTA per query tile of the entry's rows,
/// head and KV split (`kv_ctas`), the entry's threads (a module may publish D 128's apart).
fn launch_dims(
    consts: &KernelConstants,
    entry: crate::shapes::Entry,
    q: LaunchShape,
    kv_ctas: u32,
) -> ((u32, u32, u32), (u32, u32, u32)) {
    let grid = (
        (q.sq as u32).div_ceil(consts.block_m_of(entry)),
        (q.b * q.h) as u32,
        kv_ctas,
    );
    (grid, (consts.threads_of(entry), 1, 1))
}

/// The query rows at or below which a launch may split (Stage C's `SDPA_SHORT_Q_ROWS`), and the
/// most bytes of parked states a split workspace holds: a split aims for about 128 working
/// CTAs (`SDPA_SPLIT_KV_CTAS`), so packs × C <= 128, each pack at most 32 query rows
/// (BLOCK_M) of 2C slots of D + 4 floats at D = 128: 128 × 32 × 2 × 132 × 4 bytes (4.3 MB).
/// For the memory check before a problem loads; the workspace itself is sized exactly.
const SPLIT_MAX_ROWS: usize = 16;
const SPLIT_WORK_BOUND: u64 = 128 * 32 * 2 * 132 * 4;

/// Bytes of a split launch's workspace (cuda/sdpa_fp8_stage_c_mma.cu `split_kv_end`): one u32
/// arrival counter per query head, padded to 16 bytes, then per query row and slot (`slots`
/// = the module's KV split times the CTAs) D + 4 floats.
fn split_work_bytes(q: LaunchShape, d: usize, slots: u32) -> usize {
    let heads = q.b * q.h;
    heads.div_ceil(4) * 16 + heads * q.sq * slots as usize * (d + 4) * 4
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shapes::Entry;

    #[test]
    fn each_head_dim_launches_its_own_query_tiles_and_threads() {
        let c = super::super::identity::per_head_dim_constants((192, 128), (512, 384));
        let q = LaunchShape {
            b: 2,
            h: 16,
            hkv: 4,
            sq: 4096,
            sk: 4096,
        };
        let d64 = Entry {
            d: 64,
            causal: true,
        };
        let d128 = Entry {
            d: 128,
            causal: true,
        };
        // 4096 rows: 22 tiles of 192 (the last partial), 32 of 128.
        assert_eq!(launch_dims(&c, d64, q, 1), ((22, 32, 1), (512, 1, 1)));
        assert_eq!(launch_dims(&c, d128, q, 3), ((32, 32, 3), (384, 1, 1)));
    }
}
