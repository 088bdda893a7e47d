//! Device buffers of one problem and the kernel launch (docs/DESIGN.md "Kernel ABI"): Q, K and V
//! as pointers, or as tensor maps (`abi = "tensor-maps"`, src/backend/cuda/tensor_map.rs), as
//! the variant's manifest entry says.

use std::sync::Arc;

use cudarc::driver::{
    CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DriverError, LaunchConfig, PushKernelArg,
};
use half::f16;

use super::LoadedVariant;
use super::identity::LaunchShape;
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
    softmax_scale: f32,
    /// The Q, K and V tensor maps of each layout a `tensor-maps` variant asked for, built at
    /// its first launch.
    maps: Vec<(MapLayout, [TmaDesc; 3])>,
}

impl DeviceProblem {
    /// Device bytes a problem needs: three code tensors, three scale vectors, the f16 output.
    pub fn bytes_needed(p: &Problem) -> u64 {
        let n = p.output_len() as u64;
        let nkv = p.shape.kv_elements().unwrap_or(usize::MAX) as u64;
        n + 2 * nkv + 2 * n + 4 * (p.shape.heads() + 2 * p.shape.kv_heads()) as u64
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
            softmax_scale: p.softmax_scale,
            maps: Vec::new(),
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
        let d = self.entry.d;
        let (sq, sk) = (self.sq as usize, self.sk as usize);
        let (heads, kv_heads) = ((self.b * self.h) as usize, (self.b * self.hkv) as usize);
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
        let shape = LaunchShape {
            b: self.b as usize,
            h: self.h as usize,
            hkv: self.hkv as usize,
            sq: self.sq as usize,
        };
        let smem_bytes = consts.launch_smem_bytes(self.entry, shape, variant.sms);
        let cfg = LaunchConfig {
            grid_dim: (
                (self.sq as u32).div_ceil(consts.block_m),
                (self.b * self.h) as u32,
                1,
            ),
            block_dim: (consts.threads, 1, 1),
            shared_mem_bytes: smem_bytes,
        };
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
        unsafe { args.launch(cfg) }.map(|_| ())
    }

    pub fn download(&self, stream: &Arc<CudaStream>, slot: usize) -> Result<Vec<f16>, DriverError> {
        stream.clone_dtoh(&self.outs[slot])
    }
}
