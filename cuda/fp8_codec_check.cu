// fp8_codec_check.cu — device side of the host/device FP8 agreement test (tests/gpu_fp8.rs).
// Not part of the SDPA kernel; compiled by the runner's NVRTC path like the kernel is.
#include "fp8_e4m3.cuh"

// out[c] = f16 bits of code c, for all 256 codes, through the kernel's own decoders: codes
// 4w .. 4w+3 packed into one word, the low pair by decode2_e4m3, the high pair by
// decode2_e4m3_hi. Launch: 1 block of 64 threads, thread w decodes word w.
extern "C" __global__ void fp8_decode_all(unsigned short* out) {
    const unsigned int c = 4 * threadIdx.x;
    const unsigned int word = c | ((c + 1) << 8) | ((c + 2) << 16) | ((c + 3) << 24);
    const unsigned int lo = decode2_e4m3(word), hi = decode2_e4m3_hi(word);
    out[c] = (unsigned short)(lo & 0xFFFFu);
    out[c + 1] = (unsigned short)(lo >> 16);
    out[c + 2] = (unsigned short)(hi & 0xFFFFu);
    out[c + 3] = (unsigned short)(hi >> 16);
}

// out[i] = E4M3 code of in[i], CUDA's saturate-to-finite conversion (what the host encoder
// must reproduce bit for bit).
extern "C" __global__ void fp8_encode(const float* in, unsigned char* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = (unsigned char)__nv_cvt_float_to_fp8(in[i], __NV_SATFINITE, __NV_E4M3);
    }
}
