// fp8_codec_check.cu — device side of the host/device FP8 agreement test (tests/gpu_fp8.rs).
// Not part of the SDPA kernel; compiled by the runner's NVRTC path like the kernel is.
#include "fp8_e4m3.cuh"

// out[c] = f16 bits of code c, for all 256 codes, through the kernel's own decoder.
// Launch: 1 block of 16 threads; thread t decodes codes 16t .. 16t+15.
extern "C" __global__ void fp8_decode_all(unsigned short* out) {
    const unsigned int t = threadIdx.x;
    unsigned int w[4];
    for (int i = 0; i < 4; ++i) {
        const unsigned int c = 16 * t + 4 * i;
        w[i] = c | ((c + 1) << 8) | ((c + 2) << 16) | ((c + 3) << 24);
    }
    uint4 lo, hi;
    decode16_e4m3(make_uint4(w[0], w[1], w[2], w[3]), lo, hi);
    const unsigned int h[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    for (int i = 0; i < 8; ++i) {
        out[16 * t + 2 * i] = (unsigned short)(h[i] & 0xFFFFu);
        out[16 * t + 2 * i + 1] = (unsigned short)(h[i] >> 16);
    }
}

// out[i] = E4M3 code of in[i], CUDA's saturate-to-finite conversion (what the host encoder
// must reproduce bit for bit).
extern "C" __global__ void fp8_encode(const float* in, unsigned char* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = (unsigned char)__nv_cvt_float_to_fp8(in[i], __NV_SATFINITE, __NV_E4M3);
    }
}
