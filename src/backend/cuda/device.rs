//! Opening the GPU and describing it. Every way this can fail is an environment error
//! (exit 3) that says what is missing.

use std::sync::Arc;

use cudarc::driver::CudaContext;
use cudarc::driver::sys::CUdevice_attribute as Attr;
use serde::{Deserialize, Serialize};

use crate::backend::BackendError;

/// The device facts recorded with every result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub name: String,
    pub compute_capability: String,
    pub sm_count: u32,
    pub l2_bytes: u32,
    pub total_memory_bytes: u64,
    /// Highest SM and memory clocks the device reports (not the current clocks).
    pub max_sm_clock_mhz: u32,
    pub max_memory_clock_mhz: u32,
    /// CUDA version the driver supports, e.g. "13.0".
    pub driver_cuda_version: String,
}

impl DeviceInfo {
    /// NVRTC's `--gpu-architecture` for this device, e.g. `sm_90`.
    pub fn arch(&self) -> String {
        format!("sm_{}", self.compute_capability.replace('.', ""))
    }
}

/// Opens device 0, or explains why there is no usable GPU.
pub fn open() -> Result<(Arc<CudaContext>, DeviceInfo), BackendError> {
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(no_gpu(
            "the NVIDIA driver library (libcuda.so.1) could not be loaded, so this machine has no \
             usable NVIDIA driver",
        ));
    }
    let count = CudaContext::device_count()
        .map_err(|e| no_gpu(&format!("the CUDA driver failed to start: {e}")))?;
    if count < 1 {
        return Err(no_gpu("the CUDA driver sees no GPU"));
    }
    let ctx = CudaContext::new(0).map_err(|e| no_gpu(&format!("cannot open GPU 0: {e}")))?;
    let info = describe(&ctx).map_err(|e| no_gpu(&format!("cannot query GPU 0: {e}")))?;
    Ok((ctx, info))
}

fn no_gpu(what: &str) -> BackendError {
    BackendError::Environment(format!("no usable GPU: {what}"))
}

fn describe(ctx: &Arc<CudaContext>) -> Result<DeviceInfo, cudarc::driver::DriverError> {
    let (major, minor) = ctx.compute_capability()?;
    let attr = |a: Attr| ctx.attribute(a).map(|v| v.max(0) as u32);
    let mut driver_version = 0i32;
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_version) }.result()?;
    Ok(DeviceInfo {
        name: ctx.name()?,
        compute_capability: format!("{major}.{minor}"),
        sm_count: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        l2_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?,
        total_memory_bytes: ctx.total_mem()? as u64,
        max_sm_clock_mhz: attr(Attr::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)? / 1000,
        max_memory_clock_mhz: attr(Attr::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)? / 1000,
        driver_cuda_version: format!("{}.{}", driver_version / 1000, (driver_version % 1000) / 10),
    })
}
