//! The tensor maps of the `tensor-maps` and `pointers-and-kv-maps` launch ABIs
//! (cuda/kernels.toml, docs/DESIGN.md "Kernel ABI"): Q, K and V as 3-D TMA descriptors over
//! their E4M3 codes, built on the host with the driver's `cuTensorMapEncodeTiled` and passed by
//! value (`const __grid_constant__ TmaDesc`, cuda/hopper_async.cuh; `tensor-maps`) or K's and
//! V's by their address in device memory (`pointers-and-kv-maps`). Each is (dim, row,
//! batch·head) with unit element strides:
//! - Q: [D, S_q, B·H_q], box (D, 64), swizzled by D bytes (64B or 128B): one consumer
//!   warpgroup's 64 rows, K-major for wgmma's A operand (Stage D's only);
//! - K: [D, S_k, B·H_kv], box (D, kv_rows), swizzled by D bytes: K-major for wgmma's B, and
//!   Stage C's code-tile layout (chunk c of row r at c ^ (r & 7) at D 128);
//! - V: [D, S_k, B·H_kv], box (D, kv_rows), unswizzled, or swizzled like K where the module
//!   publishes `SDPA_V_SWIZZLE = 1` (Stage D transposes it either way; [`MapLayout`]).
//!
//! Rows past S are zero-filled by the TMA unit, so partial tiles need no masking of loads.

use cudarc::driver::DeviceRepr;
use cudarc::driver::sys::{
    self, CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave,
    CUtensorMapL2promotion, CUtensorMapSwizzle,
};

/// Query rows per Q box: one consumer warpgroup's.
pub const Q_BOX_ROWS: u32 = 64;

/// A `CUtensorMap` as the kernel receives it: 128 bytes, 64-byte aligned.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct TmaDesc {
    opaque: [u64; 16],
}

// SAFETY: plain bytes with the layout the kernel's `TmaDesc` parameter declares; the driver
// copies kernel parameters by the sizes and offsets of the kernel's own signature.
unsafe impl DeviceRepr for TmaDesc {}

/// What a module asks of its maps: K and V boxes of `kv_rows` keys (one KV tile of Stage D,
/// one step of every KV split's tiles of Stage C: SDPA_BLOCK_N × SDPA_KV_SPLIT), and V swizzled
/// like K (its `SDPA_V_SWIZZLE`) or not. Variants of one run may differ (an A/B of the V
/// layout), so the maps are built per layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapLayout {
    pub kv_rows: u32,
    pub v_swizzled: bool,
}

/// Which of the three maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operand {
    Q,
    K,
    V,
}

/// The map of `operand` over `rows` × `heads` rows of `d` codes at `base` (a device
/// address), for the module's `layout`.
pub fn encode(
    operand: Operand,
    base: u64,
    d: usize,
    rows: usize,
    heads: usize,
    layout: MapLayout,
) -> Result<TmaDesc, String> {
    let dims = [d as u64, rows as u64, heads as u64];
    let strides = [d as u64, (d * rows) as u64];
    let box_rows = match operand {
        Operand::Q => Q_BOX_ROWS,
        Operand::K | Operand::V => layout.kv_rows,
    };
    let boxes = [d as u32, box_rows, 1];
    let unit = [1u32; 3];
    let swizzle = swizzle_of(operand, d, layout)?;
    let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
    // SAFETY: every pointer is to a live local array of the length the rank (3) requires;
    // the driver writes the 128-byte map.
    let result = unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            3,
            base as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            unit.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    result.result().map_err(|e| {
        format!(
            "cuTensorMapEncodeTiled refused the {operand:?} map ([{d}, {rows}, {heads}], box \
             [{d}, {box_rows}, 1]): {e}"
        )
    })?;
    // SAFETY: initialized by the successful call above.
    let map = unsafe { map.assume_init() };
    let mut desc = TmaDesc { opaque: [0; 16] };
    // SAFETY: both are 128 bytes of plain data.
    unsafe {
        std::ptr::copy_nonoverlapping(
            &map as *const sys::CUtensorMap as *const u8,
            desc.opaque.as_mut_ptr() as *mut u8,
            128,
        )
    };
    Ok(desc)
}

/// How `operand`'s rows of `d` codes are swizzled in shared memory: by D bytes (64B or 128B),
/// except V where the module asks for it unswizzled.
fn swizzle_of(operand: Operand, d: usize, layout: MapLayout) -> Result<CUtensorMapSwizzle, String> {
    Ok(match (operand, d) {
        (Operand::V, _) if !layout.v_swizzled => CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
        (_, 128) => CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
        (_, 64) => CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
        (_, other) => {
            return Err(format!(
                "no swizzle of {other} bytes for a tensor map's rows"
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_descriptor_has_the_kernels_size_and_alignment() {
        assert_eq!(std::mem::size_of::<TmaDesc>(), 128);
        assert_eq!(std::mem::align_of::<TmaDesc>(), 64);
        assert_eq!(std::mem::size_of::<sys::CUtensorMap>(), 128);
    }

    #[test]
    fn v_is_swizzled_like_k_only_where_the_module_asks_and_q_k_always_by_d_bytes() {
        use CUtensorMapSwizzle::*;
        let layout = |v_swizzled| MapLayout {
            kv_rows: 128,
            v_swizzled,
        };
        for v_swizzled in [false, true] {
            let l = layout(v_swizzled);
            for (d, by_d) in [
                (64, CU_TENSOR_MAP_SWIZZLE_64B),
                (128, CU_TENSOR_MAP_SWIZZLE_128B),
            ] {
                assert_eq!(swizzle_of(Operand::Q, d, l), Ok(by_d));
                assert_eq!(swizzle_of(Operand::K, d, l), Ok(by_d));
                let v = if v_swizzled {
                    by_d
                } else {
                    CU_TENSOR_MAP_SWIZZLE_NONE
                };
                assert_eq!(swizzle_of(Operand::V, d, l), Ok(v), "D {d}, {l:?}");
            }
        }
        let err = swizzle_of(Operand::K, 96, layout(false)).unwrap_err();
        assert!(err.contains("96 bytes"), "{err}");
    }
}
