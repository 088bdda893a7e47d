// fp8_e4m3.cuh — FP8 E4M3 decoding shared by the SDPA kernel and the codec check kernel
// (cuda/fp8_codec_check.cu), so the GPU test of the host codec exercises the very functions the
// kernel decodes its fragments with.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

// The kernel's decoders, one f16x2 register from two adjacent E4M3 codes of a 32-bit word,
// exactly (every E4M3 value is an f16); the lower code lands in the low half.
// decode2_e4m3: the word's low code pair (bytes 0, 1).
__device__ __forceinline__ unsigned decode2_e4m3(unsigned codes) {
    const __half2_raw h =
        __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(codes & 0xFFFFu), __NV_E4M3);
    return (unsigned)h.x | ((unsigned)h.y << 16);
}

// decode2_e4m3_hi: the word's high code pair (bytes 2, 3). The convert reads the upper half in
// place (SASS F2FP ... R.H1), where decode2_e4m3(codes >> 16) spends a shift on it.
__device__ __forceinline__ unsigned decode2_e4m3_hi(unsigned codes) {
    unsigned r;
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;\n}"
        : "=r"(r)
        : "r"(codes));
    return r;
}
