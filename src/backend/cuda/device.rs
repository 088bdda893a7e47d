//! Opening the GPU and describing it. Every way this can fail is an environment error
//! (exit 3) that says what is missing.

use std::sync::Arc;

use cudarc::driver::CudaContext;
use cudarc::driver::sys::CUdevice_attribute as Attr;
use serde::{Deserialize, Serialize};

use crate::backend::BackendError;
use crate::devices::GpuId;

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

/// The GPUs the driver sees, in CUDA ordinal order, or why there are none usable; asked of
/// the driver without opening a context on any of them.
pub fn list() -> Result<Vec<GpuId>, BackendError> {
    use cudarc::driver::result::device;
    let count = device_count()?;
    (0..count)
        .map(|ordinal| {
            let queried = |e| no_gpu(&format!("cannot query GPU {ordinal}: {e}"));
            let dev = device::get(ordinal as i32).map_err(queried)?;
            Ok(GpuId {
                ordinal,
                name: device::get_name(dev).map_err(queried)?,
                uuid: uuid_text(
                    &device::get_uuid(dev)
                        .map_err(queried)?
                        .bytes
                        .map(|b| b as u8),
                ),
            })
        })
        .collect()
}

/// NVRTC's `--gpu-architecture` for the GPU of CUDA ordinal `ordinal` (as
/// [`DeviceInfo::arch`]), asked of the driver without opening a context, so that compiling
/// need not wait for one.
pub fn arch(ordinal: usize) -> Result<String, BackendError> {
    use cudarc::driver::result::device;
    exists(ordinal)?;
    let queried = |e| no_gpu(&format!("cannot query GPU {ordinal}: {e}"));
    let dev = device::get(ordinal as i32).map_err(queried)?;
    let attr = |a: Attr| unsafe { device::get_attribute(dev, a) }.map_err(queried);
    let major = attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    Ok(format!("sm_{major}{minor}"))
}

/// Opens the GPU of CUDA ordinal `ordinal`, or explains why it is not usable.
pub fn open(ordinal: usize) -> Result<(Arc<CudaContext>, DeviceInfo, GpuId), BackendError> {
    exists(ordinal)?;
    let ctx = CudaContext::new(ordinal)
        .map_err(|e| no_gpu(&format!("cannot open GPU {ordinal}: {e}")))?;
    let queried =
        |e: cudarc::driver::DriverError| no_gpu(&format!("cannot query GPU {ordinal}: {e}"));
    let info = describe(&ctx).map_err(queried)?;
    let id = gpu_id(&ctx).map_err(queried)?;
    Ok((ctx, info, id))
}

/// Whether the driver sees a GPU of ordinal `ordinal` (a config error, exit 2, if not).
fn exists(ordinal: usize) -> Result<(), BackendError> {
    let count = device_count()?;
    if ordinal >= count {
        return Err(BackendError::Config(format!(
            "there is no GPU {ordinal}: the CUDA driver sees {count}"
        )));
    }
    Ok(())
}

fn device_count() -> Result<usize, BackendError> {
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
    Ok(count as usize)
}

fn gpu_id(ctx: &Arc<CudaContext>) -> Result<GpuId, cudarc::driver::DriverError> {
    Ok(GpuId {
        ordinal: ctx.ordinal(),
        name: ctx.name()?,
        uuid: uuid_text(&ctx.uuid()?.bytes.map(|b| b as u8)),
    })
}

/// A UUID as nvidia-smi writes it (`nvidia-smi -i` takes it): `GPU-` and 8-4-4-4-12 hex digits.
fn uuid_text(bytes: &[u8; 16]) -> String {
    let hex = |r: std::ops::Range<usize>| {
        bytes[r]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    )
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

#[cfg(test)]
mod tests {
    #[test]
    fn a_uuid_is_written_as_nvidia_smi_writes_it() {
        let bytes: [u8; 16] = std::array::from_fn(|i| (i * 17) as u8);
        assert_eq!(
            super::uuid_text(&bytes),
            "GPU-00112233-4455-6677-8899-aabbccddeeff"
        );
    }
}
