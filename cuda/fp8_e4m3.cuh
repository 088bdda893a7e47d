// fp8_e4m3.cuh — FP8 E4M3 decoding shared by the SDPA kernel and the codec check kernels,
// so the GPU test of the host codec exercises the very code path the kernel uses.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

// 16 E4M3 codes (one 16-byte load) -> 16 f16 values (two 16-byte stores), exactly: every
// E4M3 value is an f16. Byte i of `codes` becomes f16 element i (little-endian order).
__device__ __forceinline__ void decode16_e4m3(uint4 codes, uint4& lo, uint4& hi) {
    const unsigned int words[4] = {codes.x, codes.y, codes.z, codes.w};
    unsigned int h[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const __half2_raw a =
            __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(words[i] & 0xFFFFu), __NV_E4M3);
        const __half2_raw b =
            __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(words[i] >> 16), __NV_E4M3);
        h[2 * i] = (unsigned int)a.x | ((unsigned int)a.y << 16);
        h[2 * i + 1] = (unsigned int)b.x | ((unsigned int)b.y << 16);
    }
    lo = make_uint4(h[0], h[1], h[2], h[3]);
    hi = make_uint4(h[4], h[5], h[6], h[7]);
}
