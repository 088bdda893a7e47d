// pipes.cu — which of the softmax's instructions share a pipe on sm_90: MUFU.EX2
// (ex2.approx), the conversion of P to e4m3 pairs (F2FP.SATFINITE.E4M3.F32.PACK_AB) and FFMA.
// Each kernel runs ITERS rounds of independent chains per thread (blocks of 512, four an SM's
// worth); the host prints the time and the warp-instructions per SM per cycle (at
// cudaDevAttrClockRate's clock: an estimate). Two pipes are shared where a kernel of both takes the
// sum of the two alone, apart where it takes the larger. The conversions' inputs come from integer
// work on their running sums (so that nothing is hoisted), which the "control" kernels run alone:
// the conversions' figure is a lower bound on their pipe's rate (the x32 control takes about three
// quarters of the cvt x32 kernel's time; the x8 control was reduced by the compiler, not read).
// The exponentials' chains climb to +inf within a few rounds (ftz; the rate is taken as
// independent of the value).
//   nvcc -O3 -gencode arch=compute_90a,code=sm_90a -o /tmp/pipes scripts/stage_d/pipes.cu && /tmp/pipes
// docs/PERF.md "Stage D, stop 65" has its H100 figures.
#include <cstdio>
#include <cuda_runtime.h>
#define ITERS 4096
__device__ __forceinline__ float ex2(float x) { float y; asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ unsigned short cvt8(float a, float b) { unsigned short r; asm volatile("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(a), "f"(b)); return r; }
__device__ __forceinline__ float ffma(float a, float b, float c) { float y; asm volatile("fma.rn.f32 %0, %1, %2, %3;" : "=f"(y) : "f"(a), "f"(b), "f"(c)); return y; }
template <int NE, int NC, int NF, bool CVT = true>
__global__ void k(float* out, float seed) {
    float x[8]; unsigned acc[8] = {0, 1, 2, 3, 4, 5, 6, 7}; float f[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = seed * (threadIdx.x + i), f[i] = x[i];
    for (int it = 0; it < ITERS; ++it) {
#pragma unroll
        for (int i = 0; i < NE; ++i) x[i % 8] = ex2(x[i % 8]);
#pragma unroll
        for (int i = 0; i < NC; ++i) {
            // inputs that change every round (from the running sum's bits), so nothing hoists
            unsigned& c = acc[i % 8]; // eight independent chains
            const float a = __uint_as_float(0x3c000000u | (c & 0x7fffffu));
            c += CVT ? cvt8(a, a) : (unsigned)__float_as_uint(a);
        }
#pragma unroll
        for (int i = 0; i < NF; ++i) f[i % 8] = ffma(f[i % 8], 1.0001f, 0.5f);
    }
    float s = acc[0] ^ acc[1] ^ acc[2] ^ acc[3] ^ acc[4] ^ acc[5] ^ acc[6] ^ acc[7];
#pragma unroll
    for (int i = 0; i < 8; ++i) s += x[i] + f[i];
    if (s == 12345.f) out[0] = s;
}
template <int NE, int NC, int NF, bool CVT = true>
void run(const char* name, int sms, float clk_ghz) {
    float* d; cudaMalloc(&d, 4);
    dim3 grid(sms * 4), block(512);
    k<NE, NC, NF, CVT><<<grid, block>>>(d, 1e-3f);
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    cudaEventRecord(a);
    for (int r = 0; r < 5; ++r) k<NE, NC, NF, CVT><<<grid, block>>>(d, 1e-3f);
    cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b); ms /= 5;
    double warps = grid.x * (block.x / 32.0);
    double per_sm_cycle = warps * ITERS / sms / (ms * 1e-3 * clk_ghz * 1e9);
    printf("%-22s %8.3f ms  per SM-cycle: ex2 %.2f  cvt %.2f  ffma %.2f warp-instr\n", name, ms,
           per_sm_cycle * NE, per_sm_cycle * NC, per_sm_cycle * NF);
    cudaFree(d);
}
int main() {
    int sms, khz; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    float ghz = khz / 1e6f; printf("SMs %d, clock attr %.3f GHz\n", sms, ghz);
    run<0, 8, 0, false>("control: no cvt x8", sms, ghz);
    run<16, 0, 0>("ex2 x16", sms, ghz);
    run<0, 8, 0>("cvt x8", sms, ghz);
    run<16, 8, 0>("ex2 x16 + cvt x8", sms, ghz);
    run<0, 32, 0>("cvt x32", sms, ghz);
    run<0, 32, 0, false>("control: no cvt x32", sms, ghz);
    run<16, 16, 0>("ex2 x16 + cvt x16", sms, ghz);
    run<0, 0, 32>("ffma x32", sms, ghz);
    run<16, 0, 32>("ex2 x16 + ffma x32", sms, ghz);
    run<16, 0, 0>("ex2 x16 (again)", sms, ghz);
    run<0, 8, 0>("cvt x8 (again)", sms, ghz);
    run<16, 8, 0>("ex2 x16 + cvt x8 (again)", sms, ghz);
    return 0;
}
