// sdpa_fp8_stage_c_mma.cu — Stage-C FP8 scaled-dot-product attention on the tensor cores.
//
// O = softmax(softmax_scale · Q Kᵀ) V for Q, K, V of shape [B, H, S, D] (row-major, D = 64),
// given as FP8 E4M3 codes with one f32 scale per (batch, head) per tensor. O is f16 [B, H, S, D].
// Any S >= 1 works: keys past S are masked, rows past S are neither read nor written.
//
// Switches (build-time defines only; the runner passes them to NVRTC and records them):
//   USE_CP_ASYNC=0  K/V tiles are loaded synchronously (16-byte loads, decoded on the fly).
//   USE_CP_ASYNC=1  a two-stage (ping-pong) cp.async pipeline copies the codes of step j+1
//                   into shared memory while step j is computed. Numerics are identical.
//   ROW_WARPS=R, KV_SPLIT=K  the warp grid (defaults 2 x 2, chosen by measurement:
//                   docs/PERF.md). K changes the summation order; src/emulation.rs follows
//                   the published SDPA_KV_SPLIT.
//   SDPA_DELAY_CYCLES=N  test hook, never set in normal builds: thread 0 of every CTA spins
//                   N clock cycles at the end, a fixed planted slowdown that proves the
//                   runner's SLOWER verdict. Unset, it compiles to nothing.
//   MUTANT_*        planted bugs for `sdpa-runner selftest`, never set in normal builds; each
//                   sits in one #ifdef/#ifndef block, and the self-test proves the clean PTX is
//                   identical with those blocks removed. Their names say what they break.
//
// Launch: grid (ceil(S / BLOCK_M), B*H), THREADS threads, SDPA_SMEM_BYTES of dynamic shared
// memory. The host reads the SDPA_* constants below from the module instead of repeating them.
//
// Warps: a CTA owns BLOCK_M = 16·R query rows of one (b, h) and has R·K warps. Warp w owns the
// 16 rows [16·(w % R), +16) and KV split w / R: split k takes KV tiles k, k + K, k + 2K, ...
// of BLOCK_N = 64 keys, so one CTA step brings STEP_KEYS = 64·K keys into shared memory and
// each warp eats one tile of it. Splitting the keys shortens each warp's serial chain K-fold
// and puts K times more warps on the SMs; the splits are merged once, at the end.
//
// Per tile, in registers (FlashAttention-2 style; mma.sync m16n8k16, f16 in, f32 accumulate —
// the instruction a WMMA 16x16x16 compiles to, used directly so the fragment layouts are the
// documented PTX ones and the softmax never leaves registers):
//   1. K, V codes -> f16 in sK, sV (every E4M3 value is an f16, so decoding is exact); rows
//      past S are zero.
//   2. S = Q Kᵀ: 8 key blocks of 8 x 4 k-steps of 16; K fragments by ldmatrix.
//   3. Online softmax in base 2 on the accumulators: s = acc · qk_scale, m_new = max(m, rowmax),
//      alpha = exp2(m - m_new), P = f16(exp2(s - m_new)); each lane of a row's quad keeps its
//      own partial sum l_q = fma(l_q, alpha, sum of its 16 P values).
//   4. O *= alpha; O += P V with P taken straight from the accumulators as A fragments and V
//      fragments by ldmatrix.trans.
// End: l = (l_0 + l_1) + (l_2 + l_3) over the quad; splits 1..K-1 park (m, l, O) in shared
// memory; split 0 merges: M = max m_k, a_k = exp2(m_k - M), O = O_0·a_0 then fma(O_k, a_k, O),
// likewise l; stores f16(O · (v_scale / l)).
//
// Scales: codes are decoded exactly and the scales applied in f32 where it is cheapest:
//   qk_scale = (q_scale * k_scale) * (softmax_scale * log2 e) on the scores, v_scale at the end.
// src/emulation.rs mirrors every step above in the same precisions and order; keep them in step.
//
// Shared memory (dynamic). sK, sV rows are 128 bytes (64 f16) with no padding; the 16-byte
// chunk c of row r lives at chunk c ^ (r & 7), so the 8 rows an ldmatrix reads hit 8 different
// bank groups (conflict-free) without padding.
//   offset            region                                           bytes (R = K = 2)
//   0                 sK     f16 [STEP_KEYS][64], swizzled             STEP_KEYS·128 = 16384
//   STEP_KEYS·128     sV     f16 [STEP_KEYS][64], swizzled             STEP_KEYS·128 = 16384
//   STEP_KEYS·256     stage  u8  [2 stages][K, V][STEP_KEYS][64]       STEP_KEYS·256 = 32768
//                            (USE_CP_ASYNC=1 only)
//   total (R = K = 2): 32768 bytes (USE_CP_ASYNC=0), 65536 bytes (USE_CP_ASYNC=1).
//   After the last step, sK/sV are reused to park the splits' (m, l, O) for the merge.

#include <cuda_fp16.h>
#include <cuda_pipeline_primitives.h>

#include "fp8_e4m3.cuh"

#ifndef USE_CP_ASYNC
#define USE_CP_ASYNC 0
#endif
#if USE_CP_ASYNC != 0 && USE_CP_ASYNC != 1
#error "USE_CP_ASYNC must be 0 or 1"
#endif
#ifndef SDPA_DELAY_CYCLES
#define SDPA_DELAY_CYCLES 0
#endif
#ifndef ROW_WARPS
#define ROW_WARPS 2
#endif
#ifndef KV_SPLIT
#define KV_SPLIT 2
#endif

typedef unsigned char u8; // an FP8 E4M3 code (NVRTC has no <cstdint>)
#define NEG_INF (-__int_as_float(0x7f800000))

#define HEAD_DIM 64
#define BLOCK_N 64 // keys per tile (one warp's share of a step)
constexpr int NUM_WARPS = ROW_WARPS * KV_SPLIT;
constexpr int THREADS = 32 * NUM_WARPS;
constexpr int BLOCK_M = 16 * ROW_WARPS;
constexpr int STEP_KEYS = BLOCK_N * KV_SPLIT;
constexpr int ROW_BYTES = HEAD_DIM * 2;                 // one f16 row of sK / sV
constexpr int STEP_CODE_BYTES = STEP_KEYS * HEAD_DIM;   // codes of one step of K (or V)
constexpr int CHUNKS_PER_THREAD = STEP_CODE_BYTES / 16 / THREADS;
constexpr int OFF_SK = 0;
constexpr int OFF_SV = OFF_SK + STEP_KEYS * ROW_BYTES;
constexpr int OFF_STAGE = OFF_SV + STEP_KEYS * ROW_BYTES;
constexpr int SMEM_BYTES = OFF_STAGE + (USE_CP_ASYNC ? 2 * 2 * STEP_CODE_BYTES : 0);
// A parked split: per lane 32 O values, then m[2], l[2]; stored lane-major (conflict-free).
constexpr int PARK_FLOATS = 36 * 32;

static_assert(ROW_WARPS >= 1 && KV_SPLIT >= 1 && NUM_WARPS <= 16, "1..16 warps");
static_assert(STEP_CODE_BYTES % (16 * THREADS) == 0, "each thread moves whole 16-byte chunks");
static_assert((KV_SPLIT - 1) * ROW_WARPS * PARK_FLOATS * 4 <= OFF_STAGE, "parking fits in sK/sV");

// Read by the host after loading the module: launch geometry and identity of this build.
extern "C" __constant__ int SDPA_HEAD_DIM = HEAD_DIM;
extern "C" __constant__ int SDPA_BLOCK_M = BLOCK_M;
extern "C" __constant__ int SDPA_BLOCK_N = BLOCK_N;
extern "C" __constant__ int SDPA_KV_SPLIT = KV_SPLIT;
extern "C" __constant__ int SDPA_THREADS = THREADS;
extern "C" __constant__ int SDPA_SMEM_BYTES = SMEM_BYTES;
extern "C" __constant__ int SDPA_USE_CP_ASYNC = USE_CP_ASYNC;

// ---- tensor-core and shared-memory primitives (PTX ISA fragment layouts) -----------------

// D = A·B + D, m16n8k16, f16 inputs, f32 accumulators. Lane (g = lane/4, q = lane%4) holds
// A rows g, g+8 x cols 2q, 2q+1 (+8); B col g x rows 2q, 2q+1 (+8); C/D rows g, g+8 x cols 2q, 2q+1.
__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 f16 matrices; lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` in a swizzled sK / sV.
__device__ __forceinline__ int swizzled(int row, int chunk) {
    return row * ROW_BYTES + ((chunk ^ (row & 7)) << 4);
}

__device__ __forceinline__ unsigned pack_half2(__half lo, __half hi) {
    return (unsigned)__half_as_ushort(lo) | ((unsigned)__half_as_ushort(hi) << 16);
}

// Two adjacent E4M3 codes -> one f16x2 register (lower column in the low half).
__device__ __forceinline__ unsigned decode2_e4m3(unsigned short codes) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)codes, __NV_E4M3);
    return (unsigned)h.x | ((unsigned)h.y << 16);
}

// ---- K/V steps: codes -> f16 in sK, sV ---------------------------------------------------

// Chunk i of a thread within a step of codes: 16 codes at (row, col).
struct Chunk {
    int row, col;
};
__device__ __forceinline__ Chunk chunk_of(int i) {
    const int c = threadIdx.x + i * THREADS;
    return {c >> 2, (c & 3) << 4};
}

// Stores 16 decoded values (two 16-byte chunks) of row ch.row.
__device__ __forceinline__ void store16(u8* dst, Chunk ch, uint4 lo, uint4 hi) {
    *reinterpret_cast<uint4*>(dst + swizzled(ch.row, ch.col >> 3)) = lo;
    *reinterpret_cast<uint4*>(dst + swizzled(ch.row, (ch.col >> 3) + 1)) = hi;
}

#if USE_CP_ASYNC
// Starts the copy of one step of K and V codes into a stage (rows < valid only).
__device__ __forceinline__ void copy_step_async(const u8* __restrict__ k_bh,
                                                const u8* __restrict__ v_bh, int kv0, int valid,
                                                u8* stage_k, u8* stage_v) {
#pragma unroll
    for (int i = 0; i < CHUNKS_PER_THREAD; ++i) {
        const Chunk ch = chunk_of(i);
        if (ch.row < valid) {
            const size_t src = (size_t)(kv0 + ch.row) * HEAD_DIM + ch.col;
            __pipeline_memcpy_async(stage_k + ch.row * HEAD_DIM + ch.col, k_bh + src, 16);
            __pipeline_memcpy_async(stage_v + ch.row * HEAD_DIM + ch.col, v_bh + src, 16);
        }
    }
}

// Decodes a landed stage into sK, sV.
__device__ __forceinline__ void decode_stage(const u8* stage_k, const u8* stage_v, int valid,
                                             u8* sK, u8* sV) {
#pragma unroll
    for (int i = 0; i < CHUNKS_PER_THREAD; ++i) {
        const Chunk ch = chunk_of(i);
        uint4 klo = {0, 0, 0, 0}, khi = klo, vlo = klo, vhi = klo;
        if (ch.row < valid) {
            decode16_e4m3(*reinterpret_cast<const uint4*>(stage_k + ch.row * HEAD_DIM + ch.col), klo, khi);
            decode16_e4m3(*reinterpret_cast<const uint4*>(stage_v + ch.row * HEAD_DIM + ch.col), vlo, vhi);
        }
        store16(sK, ch, klo, khi);
        store16(sV, ch, vlo, vhi);
    }
}
#else
// Loads one step of K and V codes from global memory and decodes it into sK, sV.
__device__ __forceinline__ void load_step(const u8* __restrict__ k_bh, const u8* __restrict__ v_bh,
                                          int kv0, int valid, u8* sK, u8* sV) {
    uint4 kc[CHUNKS_PER_THREAD], vc[CHUNKS_PER_THREAD];
#pragma unroll
    for (int i = 0; i < CHUNKS_PER_THREAD; ++i) { // all loads first: one memory latency, not N
        const Chunk ch = chunk_of(i);
        kc[i] = vc[i] = make_uint4(0, 0, 0, 0);
        if (ch.row < valid) {
            const size_t src = (size_t)(kv0 + ch.row) * HEAD_DIM + ch.col;
            kc[i] = *reinterpret_cast<const uint4*>(k_bh + src);
            vc[i] = *reinterpret_cast<const uint4*>(v_bh + src);
        }
    }
#pragma unroll
    for (int i = 0; i < CHUNKS_PER_THREAD; ++i) {
        const Chunk ch = chunk_of(i);
        uint4 klo, khi, vlo, vhi;
        decode16_e4m3(kc[i], klo, khi); // a zero code decodes to +0: rows past S are zero
        decode16_e4m3(vc[i], vlo, vhi);
        store16(sK, ch, klo, khi);
        store16(sV, ch, vlo, vhi);
    }
}
#endif

// ---- the kernel --------------------------------------------------------------------------

// At most 128 registers (the resource gate): 4 CTAs of 128 threads fit in 64K registers.
extern "C" __global__ void __launch_bounds__(THREADS, 65536 / (THREADS * 128))
sdpa_fp8_stage_c_mma(const u8* __restrict__ q, const u8* __restrict__ k,
                      const u8* __restrict__ v, const float* __restrict__ q_scale,
                      const float* __restrict__ k_scale, const float* __restrict__ v_scale,
                      __half* __restrict__ out, int B, int H, int S, float softmax_scale) {
    extern __shared__ __align__(128) u8 smem[];
    u8* sK = smem + OFF_SK;
    u8* sV = smem + OFF_SV;

    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2; // fragment row (and row + 8)
    const int qd = lane & 3; // fragment column pair 2qd, 2qd + 1
    const int split = warp / ROW_WARPS;
    const int bh = blockIdx.y;
    if (bh >= B * H) return;
    const int q0 = blockIdx.x * BLOCK_M + (warp % ROW_WARPS) * 16; // this warp's first row

#ifdef MUTANT_I32_HEAD_OFFSET
    const int head_off = (int)((unsigned)bh * (unsigned)S * HEAD_DIM); // wraps past 2^31
#else
    const size_t head_off = (size_t)bh * S * HEAD_DIM;
#endif
    const u8* q_bh = q + head_off;
    const u8* k_bh = k + head_off;
    const u8* v_bh = v + head_off;
#ifdef MUTANT_K_SCALE_TWICE
    const float qk_scale = (q_scale[bh] * k_scale[bh] * k_scale[bh]) * (softmax_scale * 1.4426950408889634f);
#else
    const float qk_scale = (q_scale[bh] * k_scale[bh]) * (softmax_scale * 1.4426950408889634f);
#endif

    // Q: this warp's 16 rows as A fragments, decoded straight from global memory.
    unsigned qa[HEAD_DIM / 16][4];
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int row = q0 + g + (i & 1) * 8;
            const int col = kk * 16 + (i >> 1) * 8 + 2 * qd;
            unsigned short codes = 0;
            if (row < S) codes = *reinterpret_cast<const unsigned short*>(q_bh + (size_t)row * HEAD_DIM + col);
            qa[kk][i] = decode2_e4m3(codes);
        }
    }

    // Per lane: rows g (index 0) and g + 8 (index 1) of the warp's 16.
    float o[HEAD_DIM / 8][4];
#pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m_run[2] = {NEG_INF, NEG_INF};
    float l_run[2] = {0.0f, 0.0f}; // this lane's share of the row sums

    const int n_tiles = (S + BLOCK_N - 1) / BLOCK_N;
#ifdef MUTANT_SKIP_LAST_KV_TILE
    const int tiles_run = n_tiles - 1;
#else
    const int tiles_run = n_tiles;
#endif
    const int n_steps = (n_tiles + KV_SPLIT - 1) / KV_SPLIT;
    const unsigned sK_addr = (unsigned)__cvta_generic_to_shared(sK);
    const unsigned sV_addr = (unsigned)__cvta_generic_to_shared(sV);
    const int tile_row0 = split * BLOCK_N; // this warp's tile within a step
#if USE_CP_ASYNC
    u8* stage = smem + OFF_STAGE; // [stage][K = 0, V = 1][STEP_KEYS][HEAD_DIM]
    copy_step_async(k_bh, v_bh, 0, min(STEP_KEYS, S), stage, stage + STEP_CODE_BYTES);
    __pipeline_commit();
#endif

    for (int j = 0; j < n_steps; ++j) {
        const int kv0 = j * STEP_KEYS;

        // 1. This step's K and V, decoded into sK and sV.
#if USE_CP_ASYNC
        if (j + 1 < n_steps) {
            u8* next = stage + ((j + 1) & 1) * 2 * STEP_CODE_BYTES;
            copy_step_async(k_bh, v_bh, kv0 + STEP_KEYS, min(STEP_KEYS, S - kv0 - STEP_KEYS), next,
                            next + STEP_CODE_BYTES);
        }
        __pipeline_commit();       // one group per iteration (maybe empty) keeps the count uniform
#ifndef MUTANT_SKIP_CP_WAIT
        __pipeline_wait_prior(1);  // every group but the newest has landed: step j is here
#endif
        __syncthreads();
#ifdef MUTANT_WRONG_STAGE
        const u8* cur = stage + ((j + 1) & 1) * 2 * STEP_CODE_BYTES;
#else
        const u8* cur = stage + (j & 1) * 2 * STEP_CODE_BYTES;
#endif
        decode_stage(cur, cur + STEP_CODE_BYTES, min(STEP_KEYS, S - kv0), sK, sV);
#else
        load_step(k_bh, v_bh, kv0, min(STEP_KEYS, S - kv0), sK, sV);
#endif
#ifndef MUTANT_NO_DEQUANT_BARRIER
        __syncthreads();
#endif

        const int t = j * KV_SPLIT + split; // this warp's tile
        if (t < tiles_run) {
            const int valid = min(BLOCK_N, S - t * BLOCK_N);

            // 2. S = Q Kᵀ: 8 key blocks x 4 k-steps. ldmatrix matrix i of a pair: key block
            //    nb + (i >> 1), d chunk 2kk + (i & 1) -> b0, b1 of key blocks nb and nb + 1.
            float s[BLOCK_N / 8][4];
#pragma unroll
            for (int nb = 0; nb < BLOCK_N / 8; ++nb) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
#pragma unroll
                for (int nb = 0; nb < BLOCK_N / 8; nb += 2) {
                    const int i = lane >> 3;
                    const int row = tile_row0 + (nb + (i >> 1)) * 8 + (lane & 7);
                    unsigned b[4];
                    ldmatrix_x4(b, sK_addr + swizzled(row, 2 * kk + (i & 1)));
                    mma16816(s[nb], qa[kk], b[0], b[1]);
                    mma16816(s[nb + 1], qa[kk], b[2], b[3]);
                }
            }

            // 3. Online softmax (base 2). Keys past S score -inf, so their P is exactly 0.
#ifdef MUTANT_NO_PARTIAL_MASK
            const int unmasked = BLOCK_N;
#else
            const int unmasked = valid;
#endif
#pragma unroll
            for (int nb = 0; nb < BLOCK_N / 8; ++nb)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[nb][e] = __fmul_rn(s[nb][e], qk_scale);
            if (unmasked < BLOCK_N) { // only a last, partial tile pays for the mask
#pragma unroll
                for (int nb = 0; nb < BLOCK_N / 8; ++nb)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        if (nb * 8 + 2 * qd + (e & 1) >= unmasked) s[nb][e] = NEG_INF;
            }
            float tile_max[2] = {NEG_INF, NEG_INF};
#pragma unroll
            for (int nb = 0; nb < BLOCK_N / 8; ++nb)
#pragma unroll
                for (int e = 0; e < 4; ++e) tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[nb][e]);
            float alpha[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 1));
                tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 2));
                const float m_new = fmaxf(m_run[i], tile_max[i]);
#ifdef MUTANT_NO_RESCALE
                alpha[i] = 1.0f;
#else
                alpha[i] = exp2f(m_run[i] - m_new);
#endif
                m_run[i] = m_new;
            }
            // 4. O *= alpha, then O += P V, one k-step of 16 keys at a time (so only that
            //    k-step's P is live). P comes straight from the score accumulators as the A
            //    fragment: key block 2kk gives a0 (row g), a1 (row g+8); block 2kk+1 gives a2, a3.
            //    ldmatrix.trans matrix i: keys 16kk + (i & 1)·8, d chunk n + (i >> 1)
            //    -> b0, b1 of d blocks n and n + 1.
#pragma unroll
            for (int n = 0; n < HEAD_DIM / 8; ++n) {
                o[n][0] = __fmul_rn(o[n][0], alpha[0]);
                o[n][1] = __fmul_rn(o[n][1], alpha[0]);
                o[n][2] = __fmul_rn(o[n][2], alpha[1]);
                o[n][3] = __fmul_rn(o[n][3], alpha[1]);
            }
            float part[2] = {0.0f, 0.0f}; // this lane's P sums, key blocks in order
#pragma unroll
            for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
                unsigned pa[4];
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int nb = 2 * kk + h;
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        const __half p0 = __float2half_rn(exp2f(s[nb][2 * i] - m_run[i]));
                        const __half p1 = __float2half_rn(exp2f(s[nb][2 * i + 1] - m_run[i]));
                        part[i] += __half2float(p0);
                        part[i] += __half2float(p1);
                        pa[h * 2 + i] = pack_half2(p0, p1);
                    }
                }
#pragma unroll
                for (int n = 0; n < HEAD_DIM / 8; n += 2) {
                    const int i = lane >> 3;
                    const int row = tile_row0 + kk * 16 + (i & 1) * 8 + (lane & 7);
                    unsigned b[4];
                    ldmatrix_x4_trans(b, sV_addr + swizzled(row, n + (i >> 1)));
                    mma16816(o[n], pa, b[0], b[1]);
                    mma16816(o[n + 1], pa, b[2], b[3]);
                }
            }
#pragma unroll
            for (int i = 0; i < 2; ++i) l_run[i] = __fmaf_rn(l_run[i], alpha[i], part[i]);
        }
        __syncthreads(); // every warp is done with sK, sV before the next step overwrites them
    }
#if USE_CP_ASYNC
    __pipeline_wait_prior(0);
#endif

    // Row sums over the quad: (l_0 + l_1) + (l_2 + l_3), the same on every lane.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 1);
        l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 2);
    }

    // Merge the KV splits into split 0 (sK/sV are free: the loop ended on a barrier).
#if KV_SPLIT > 1
    float* park = reinterpret_cast<float*>(smem);
    const int rw = warp % ROW_WARPS;
    if (split > 0) {
        float* mine = park + ((split - 1) * ROW_WARPS + rw) * PARK_FLOATS + lane;
#pragma unroll
        for (int n = 0; n < HEAD_DIM / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) mine[(n * 4 + e) * 32] = o[n][e];
        mine[32 * 32] = m_run[0];
        mine[33 * 32] = m_run[1];
        mine[34 * 32] = l_run[0];
        mine[35 * 32] = l_run[1];
    }
    __syncthreads();
    if (split > 0) return;
    float m_all[2] = {m_run[0], m_run[1]};
#pragma unroll
    for (int k2 = 1; k2 < KV_SPLIT; ++k2) {
        const float* theirs = park + ((k2 - 1) * ROW_WARPS + rw) * PARK_FLOATS + lane;
        m_all[0] = fmaxf(m_all[0], theirs[32 * 32]);
        m_all[1] = fmaxf(m_all[1], theirs[33 * 32]);
    }
    float f[2]; // split 0's weight exp2(m_0 - M)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        f[i] = exp2f(m_run[i] - m_all[i]);
        l_run[i] = __fmul_rn(l_run[i], f[i]);
    }
#pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[n][e] = __fmul_rn(o[n][e], f[e >> 1]);
#pragma unroll
    for (int k2 = 1; k2 < KV_SPLIT; ++k2) {
        const float* theirs = park + ((k2 - 1) * ROW_WARPS + rw) * PARK_FLOATS + lane;
        float a[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            a[i] = exp2f(theirs[(32 + i) * 32] - m_all[i]);
            l_run[i] = __fmaf_rn(theirs[(34 + i) * 32], a[i], l_run[i]);
        }
#pragma unroll
        for (int n = 0; n < HEAD_DIM / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[n][e] = __fmaf_rn(theirs[(n * 4 + e) * 32], a[e >> 1], o[n][e]);
    }
#endif

    // Normalize and store: each lane writes 2 columns of rows g and g + 8 per d block.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#ifdef MUTANT_STORE_ROW_OFF_BY_ONE
        const int row = q0 + g + i * 8 + 1;
#else
        const int row = q0 + g + i * 8;
#endif
        if (row < S) {
            const float scale = v_scale[bh] / l_run[i];
            __half2* dst = reinterpret_cast<__half2*>(out + head_off + (size_t)row * HEAD_DIM + 2 * qd);
#pragma unroll
            for (int n = 0; n < HEAD_DIM / 8; ++n)
                dst[n * 4] = __halves2half2(__float2half_rn(__fmul_rn(o[n][2 * i], scale)),
                                            __float2half_rn(__fmul_rn(o[n][2 * i + 1], scale)));
        }
    }
#ifdef MUTANT_K_READ_PAST_END
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        (void)*(volatile const u8*)(k_bh + (size_t)S * HEAD_DIM); // past the last head's K
    }
#endif
#if SDPA_DELAY_CYCLES > 0
    if (threadIdx.x == 0) {
        const long long t0 = clock64();
        while (clock64() - t0 < SDPA_DELAY_CYCLES) {
        }
    }
#endif
}
