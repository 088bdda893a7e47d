// overlap.cu — can one warpgroup's exponentials run while another's wgmma (e4m3, m64n128k32,
// f32 accumulators, operands from shared memory) holds the same SM's tensor cores, and at what
// cost to each? One CTA an SM (4 waves), 3 warpgroups: WG 0 issues NG wgmma (two accumulator
// sets, one group in flight), WGs 1-2 run ex2.approx over 8 independent chains a thread (NE a
// thread). Modes: G (WG 0 alone), E (WGs 1-2 alone), GE (all three). Cycles are the clock64()
// spans of each CTA's WG 0 and WG 1, averaged over CTAs: a wgmma's cycles, and an ex2's per warp
// on its SM sub-partition (2 warps a sub-partition). In GE the exponentials outlast the wgmma: WG
// 1's figure averages in those that ran alone after WG 0 ended (docs/PERF.md "Stage D, stop 65"
// separates the two).
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o /tmp/overlap scripts/stage_d/overlap.cu && /tmp/overlap
// docs/PERF.md "Stage D, stop 65" has its H100 figures.
#include <cstdio>
#include <cuda_runtime.h>
#include "../../cuda/hopper_async.cuh"
__device__ __forceinline__ float ex2(float x) { float y; asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__global__ void __launch_bounds__(384, 1) k(int mode, int ng, int ne, long long* cyc, float* sink) {
    extern __shared__ __align__(1024) unsigned char smem[];
    unsigned char* base = (unsigned char*)(((size_t)smem + 1023) & ~(size_t)1023);
    for (int i = threadIdx.x; i < 24576; i += blockDim.x) base[i] = (unsigned char)(0x30 + (i * 7) % 16);
    __syncthreads();
    const int wg = threadIdx.x / 128;
    long long t0 = clock64();
    if (wg == 0 && (mode & 1)) {
        const WgmmaDesc a = WgmmaDesc::of<128>(smem_addr(base)), b = WgmmaDesc::of<128>(smem_addr(base + 8192));
        float d0[64], d1[64];
#pragma unroll
        for (int i = 0; i < 64; ++i) d0[i] = d1[i] = 0.f;
        for (int it = 0; it < ng; it += 2) {
            wgmma_fence();
            wgmma_ss_n128(d0, a.at(32 * (it & 3)), b.at(32 * (it & 3)), 1);
            wgmma_commit();
            wgmma_wait<1>();
            wgmma_hold(d1);
            wgmma_fence();
            wgmma_ss_n128(d1, a.at(32 * ((it + 1) & 3)), b.at(32 * ((it + 1) & 3)), 1);
            wgmma_commit();
            wgmma_wait<1>();
            wgmma_hold(d0);
        }
        wgmma_wait<0>();
        wgmma_hold(d0); wgmma_hold(d1);
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < 64; ++i) s += d0[i] + d1[i];
        if (s == 1234.5f) sink[0] = s;
    } else if (wg > 0 && (mode & 2)) {
        float x[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) x[i] = -1e-3f * (threadIdx.x + i);
        for (int it = 0; it < ne; it += 8) {
#pragma unroll
            for (int i = 0; i < 8; ++i) x[i] = ex2(x[i]) - 1.5f;
        }
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) s += x[i];
        if (s == 1234.5f) sink[0] = s;
    }
    long long t1 = clock64();
    if (threadIdx.x % 128 == 0 && wg < 2) cyc[(blockIdx.x * 2 + wg)] = t1 - t0;
}
int main() {
    int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    const int ctas = sms * 4, smem = 100 * 1024;
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    long long* cyc; float* sink; cudaMalloc(&cyc, ctas * 2 * 8); cudaMalloc(&sink, 4);
    long long* h = new long long[ctas * 2];
    const int NG = 4096, NE = 16384;
    const char* names[] = {"", "G  (wgmma only)", "E  (ex2 only)", "GE (both)"};
    for (int rep = 0; rep < 2; ++rep)
        for (int mode = 1; mode <= 3; ++mode) {
            k<<<ctas, 384, smem>>>(mode, NG, NE, cyc, sink);
            cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
            cudaMemset(cyc, 0, ctas * 2 * 8);
            cudaEventRecord(a);
            k<<<ctas, 384, smem>>>(mode, NG, NE, cyc, sink);
            cudaEventRecord(b); cudaEventSynchronize(b);
            float ms; cudaEventElapsedTime(&ms, a, b);
            cudaMemcpy(h, cyc, ctas * 2 * 8, cudaMemcpyDeviceToHost);
            double g = 0, e = 0;
            for (int i = 0; i < ctas; ++i) g += h[2 * i], e += h[2 * i + 1];
            g /= ctas; e /= ctas;
            printf("%-18s %7.3f ms  WG0 %8.0f cycles (%.1f a wgmma)  WG1 %8.0f cycles (%.2f a warp ex2 per SMSP)  %s\n",
                   names[mode], ms, g, g / NG, e, e / (NE * 2.0), cudaGetErrorString(cudaGetLastError()));
        }
    return 0;
}
