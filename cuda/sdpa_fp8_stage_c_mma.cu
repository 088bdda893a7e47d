// sdpa_fp8_stage_c_mma.cu — Stage-C FP8 scaled-dot-product attention on the tensor cores.
//
// O = softmax(softmax_scale · Q Kᵀ) V for Q, K, V of shape [B, H, S, D] (row-major, D = 64),
// given as FP8 E4M3 codes with one f32 scale per (batch, head) per tensor. O is f16 [B, H, S, D].
// Any S >= 1 works: keys past S are masked, rows past S are neither read nor written.
//
// Switches (build-time defines only; the runner passes them to NVRTC and records them):
//   USE_CP_ASYNC=0  each step's K/V codes are loaded synchronously (16-byte loads, stored to
//                   shared memory), then computed.
//   USE_CP_ASYNC=1  a CP_STAGES-deep cp.async pipeline: the codes of steps j+1 .. j+CP_STAGES-1
//                   are in flight while step j is computed; a short tail's rows are zero-filled
//                   by the copy itself; one barrier per step (cp0 needs two: its single tile is
//                   rewritten every step). Numerics are identical: both variants compute from
//                   the same code tiles in the same order.
//   CP_STAGES=N     stages of the cp.async pipeline (default 2, measured best: docs/PERF.md).
//   ROW_WARPS=R, KV_SPLIT=K  the warp grid (defaults 2 x 2, chosen by measurement:
//                   docs/PERF.md; R·K <= 16 and a step's codes must split into whole 16-byte
//                   chunks per thread: R of 1, 2, 4 or 8). K changes the summation order;
//                   src/emulation/mod.rs follows the published SDPA_KV_SPLIT.
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
// K and V stay FP8 codes in shared memory; each warp decodes them on the way into its MMA
// fragments (every E4M3 value is an f16, so decoding is exact). Per tile, in registers
// (FlashAttention-2 style; mma.sync m16n8k16, f16 in, f32 accumulate):
//   1. The step's K and V codes land in a code tile (cp0: loads and stores; cp1: cp.async).
//   2. S = Q Kᵀ: 8 key blocks x 4 k-steps of 16. The k-steps' dims are taken in the order
//      that puts a lane's four fragment codes side by side: MMA k-index 2q, 2q+1, 2q+8, 2q+9
//      <-> dims 4q .. 4q+3 of the 16-dim chunk, for Q (its A fragment, from global memory) and
//      K alike, so each k-step still sums the same 16 products. One ldmatrix of K codes (as
//      b16) gives a key block's fragments for all 4 k-steps: 2 cvt e4m3x2 -> f16x2 each, the
//      second reading the register's upper half in place (no shift).
//   3. Online softmax in base 2 on the accumulators: s = acc · qk_scale, m_new = max(m, rowmax),
//      alpha = exp2(m - m_new), P = f16(exp2(s - m_new)) (ex2.approx.ftz: the same f16 bits as
//      exp2f); each lane of a row's quad keeps its own partial sum l_q = fma(l_q, alpha, sum
//      of its 16 P values).
//   4. O *= alpha; O += P V with P straight from the accumulators as A fragments. V codes
//      come by ldmatrix.trans (b16: a lane gets keys 2q, 2q+1 x dims 2g, 2g+1) and one prmt
//      per fragment sorts the bytes into keys 2q, 2q+1, 2q+8, 2q+9 of dim 2g (or 2g+1): the
//      two MMAs of a 16-dim chunk c own its even and odd dims, so a lane's accumulators hold
//      dims 16c + 4q .. 16c + 4q + 3 of rows g and g + 8.
// End: l = (l_0 + l_1) + (l_2 + l_3) over the quad; splits 1..K-1 park (m, l, O) in shared
// memory; split 0 merges: M = max m_k, a_k = exp2(m_k - M), O = O_0·a_0 then fma(O_k, a_k, O),
// likewise l; stores f16(O · (v_scale / l)), four adjacent dims per 8-byte store.
//
// Scales: codes are decoded exactly and the scales applied in f32 where it is cheapest:
//   qk_scale = (q_scale * k_scale) * (softmax_scale * log2 e) on the scores, v_scale at the end.
// src/emulation/mod.rs mirrors every step above in the same precisions and order (and
// cuda/emulation_f32.cu mirrors it, bit for bit); keep them in step.
//
// Shared memory (dynamic): code tiles of one step, K then V, each [STEP_KEYS][64] u8 with rows
// of 64 bytes and no padding; the 16-byte chunk c of row r lives at chunk c ^ ((r >> 1) & 3),
// so the 8 rows one ldmatrix matrix reads hit 8 different bank groups (conflict-free). Then
// each warp's Q fragments (decoded once, read back per tile, so they hold no registers across
// the P·V half of the loop: at 128 registers that is what keeps the kernel free of spills).
//   offset                 region                                    bytes (R = K = 2)
//   s·STAGE_BYTES          stage s: K codes [STEP_KEYS][64]            8192
//   + STEP_CODE_BYTES               V codes [STEP_KEYS][64]            8192
//   OFF_Q = STAGES·STAGE_BYTES  Q fragments [warp][k-step][lane] uint4  NUM_WARPS·2048 = 8192
//   stages: 1 (USE_CP_ASYNC=0), CP_STAGES (USE_CP_ASYNC=1)
//   total (R = K = 2): 24576 bytes (USE_CP_ASYNC=0), 40960 bytes (USE_CP_ASYNC=1, 2 stages).
//   After the last step the splits' (m, l, O) are parked from offset 0 for the merge
//   (PARK_BYTES: 9216 for R = K = 2; SMEM_BYTES grows to fit it for larger grids).

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
#ifndef CP_STAGES
#define CP_STAGES 2
#endif

typedef unsigned char u8; // an FP8 E4M3 code (NVRTC has no <cstdint>)
#define NEG_INF (-__int_as_float(0x7f800000))

#define HEAD_DIM 64
#define BLOCK_N 64 // keys per tile (one warp's share of a step)
constexpr int NUM_WARPS = ROW_WARPS * KV_SPLIT;
constexpr int THREADS = 32 * NUM_WARPS;
constexpr int BLOCK_M = 16 * ROW_WARPS;
constexpr int STEP_KEYS = BLOCK_N * KV_SPLIT;
constexpr int STEP_CODE_BYTES = STEP_KEYS * HEAD_DIM;   // codes of one step of K (or V)
constexpr int CHUNKS_PER_THREAD = STEP_CODE_BYTES / 16 / THREADS;
constexpr int STAGES = USE_CP_ASYNC ? CP_STAGES : 1;
constexpr int STAGE_BYTES = 2 * STEP_CODE_BYTES;       // K codes, then V codes
constexpr int OFF_Q = STAGES * STAGE_BYTES;           // each warp's Q fragments
constexpr int Q_FRAG_BYTES = HEAD_DIM / 16 * 4 * 4 * 32; // per warp: 16 registers x 32 lanes
// A parked split: per lane 32 O values, then m[2], l[2]; stored lane-major (conflict-free).
constexpr int PARK_FLOATS = 36 * 32;
constexpr int PARK_BYTES = (KV_SPLIT - 1) * ROW_WARPS * PARK_FLOATS * 4;
// After the loop nothing in shared memory is live (Q fragments included), so the parking may
// use all of it; large grids (4 x 2 and up) need more than one stage.
constexpr int SMEM_BYTES = OFF_Q + NUM_WARPS * Q_FRAG_BYTES > PARK_BYTES
                               ? OFF_Q + NUM_WARPS * Q_FRAG_BYTES
                               : PARK_BYTES;

static_assert(ROW_WARPS >= 1 && KV_SPLIT >= 1 && NUM_WARPS <= 16, "1..16 warps");
static_assert(CP_STAGES >= 2 && CP_STAGES <= 8, "2..8 cp.async stages");
static_assert(STEP_CODE_BYTES % (16 * THREADS) == 0, "each thread moves whole 16-byte chunks");

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

// Byte offset of 16-byte chunk `chunk` (0..3) of row `row` in a swizzled code tile.
__device__ __forceinline__ int swizzled(int row, int chunk) {
    return row * HEAD_DIM + ((chunk ^ ((row >> 1) & 3)) << 4);
}

// exp2 of a score for P, which is rounded to f16 at once: ex2.approx.ftz gives 0 for results
// below 2^-126 where exp2f returns a value of at most 2^-126, and both round to the same f16 +0
// (every value at or below 2^-25 does), so P's bits are exp2f's, without exp2f's range check.
__device__ __forceinline__ float exp2_for_p(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

// Bytes of {hi, lo} picked by `sel` (PTX prmt: result byte i = byte sel[4i + 3 : 4i]).
__device__ __forceinline__ unsigned prmt(unsigned lo, unsigned hi, unsigned sel) {
    unsigned r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(lo), "r"(hi), "r"(sel));
    return r;
}

__device__ __forceinline__ unsigned pack_half2(__half lo, __half hi) {
    return (unsigned)__half_as_ushort(lo) | ((unsigned)__half_as_ushort(hi) << 16);
}

// ---- K/V steps: codes -> the code tiles of a stage -----------------------------------------

// Chunk i of a thread within a step of codes: 16 codes of row `row`, 16-byte chunk `chunk`.
struct Chunk {
    int row, chunk;
};
__device__ __forceinline__ Chunk chunk_of(int i) {
    const int c = threadIdx.x + i * THREADS;
    return {c >> 2, c & 3};
}

#if USE_CP_ASYNC
// Starts the copy of one step of K and V codes into a stage; rows >= valid are zero-filled by
// the copy (no bytes read), so a short last step never leaves an earlier step's codes behind.
__device__ __forceinline__ void copy_step_async(const u8* __restrict__ k_bh,
                                                const u8* __restrict__ v_bh, int kv0, int valid,
                                                u8* stage) {
#pragma unroll
    for (int i = 0; i < CHUNKS_PER_THREAD; ++i) {
        const Chunk ch = chunk_of(i);
        const bool live = ch.row < valid;
        const size_t src = live ? (size_t)(kv0 + ch.row) * HEAD_DIM + ch.chunk * 16 : 0;
        const int dst = swizzled(ch.row, ch.chunk);
        __pipeline_memcpy_async(stage + dst, k_bh + src, 16, live ? 0 : 16);
        __pipeline_memcpy_async(stage + STEP_CODE_BYTES + dst, v_bh + src, 16, live ? 0 : 16);
    }
}
#else
// Loads one step of K and V codes from global memory into a stage (rows >= valid are zero).
__device__ __forceinline__ void load_step(const u8* __restrict__ k_bh, const u8* __restrict__ v_bh,
                                          int kv0, int valid, u8* stage) {
    uint4 kc[CHUNKS_PER_THREAD], vc[CHUNKS_PER_THREAD];
#pragma unroll
    for (int i = 0; i < CHUNKS_PER_THREAD; ++i) { // all loads first: one memory latency, not N
        const Chunk ch = chunk_of(i);
        kc[i] = vc[i] = make_uint4(0, 0, 0, 0);
        if (ch.row < valid) {
            const size_t src = (size_t)(kv0 + ch.row) * HEAD_DIM + ch.chunk * 16;
            kc[i] = *reinterpret_cast<const uint4*>(k_bh + src);
            vc[i] = *reinterpret_cast<const uint4*>(v_bh + src);
        }
    }
#pragma unroll
    for (int i = 0; i < CHUNKS_PER_THREAD; ++i) {
        const Chunk ch = chunk_of(i);
        const int dst = swizzled(ch.row, ch.chunk);
        *reinterpret_cast<uint4*>(stage + dst) = kc[i];
        *reinterpret_cast<uint4*>(stage + STEP_CODE_BYTES + dst) = vc[i];
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

    // Per lane: rows g (index 0) and g + 8 (index 1) of the warp's 16.
    float o[HEAD_DIM / 8][4];
#pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m_run[2] = {NEG_INF, NEG_INF};
    float l_run[2] = {0.0f, 0.0f}; // this lane's share of the row sums

    // Steps run while j * STEP_KEYS < S; tiles while t * BLOCK_N < keys_run (S itself is a
    // kernel argument, so these bounds cost no register across the loop).
#ifdef MUTANT_SKIP_LAST_KV_TILE
    const int keys_run = (S - 1) / BLOCK_N * BLOCK_N; // every tile but the last
#else
    const int keys_run = S;
#endif
    const unsigned smem_addr = (unsigned)__cvta_generic_to_shared(smem);
    const int tile_row0 = split * BLOCK_N; // this warp's tile within a step
    // The swizzle of a row depends on its index mod 8 only, so a lane's ldmatrix offsets are
    // fixed: K (matrix kk = lane / 8: key lane % 8, chunk kk) and V (matrix i = lane / 8: key
    // lane % 8 + 8·(i & 1), chunk 2·c2 + i / 2, where c2 = 1 flips chunk bit 1: XOR 32).
    const int k_lane = swizzled(lane & 7, lane >> 3);
    const int v_lane = swizzled((lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
#if USE_CP_ASYNC
    // Prologue: the first CP_STAGES - 1 steps in flight, one commit group each (maybe empty),
    // before Q's loads, so Q's latency and theirs overlap.
#pragma unroll
    for (int st = 0; st < CP_STAGES - 1; ++st) {
        if (st * STEP_KEYS < S) copy_step_async(k_bh, v_bh, st * STEP_KEYS, min(STEP_KEYS, S - st * STEP_KEYS), smem + st * STAGE_BYTES);
        __pipeline_commit();
    }
#endif

    // Q: this warp's 16 rows as A fragments, decoded from global memory. k-step kk,
    // lane q: one 4-byte load of dims 16kk + 4q .. +3 per row (MMA k-indices 2q, 2q+1, 2q+8,
    // 2q+9: the header's order), the low pair to a0 (a1), the high pair to a2 (a3).
    unsigned qa[HEAD_DIM / 16][4];
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int row = q0 + g + i * 8;
            unsigned codes = 0;
            if (row < S) codes = *reinterpret_cast<const unsigned*>(q_bh + (size_t)row * HEAD_DIM + kk * 16 + 4 * qd);
            qa[kk][i] = decode2_e4m3(codes);
            qa[kk][i + 2] = decode2_e4m3_hi(codes);
        }
    }
    // Parked in shared memory and read back per tile (16 B per lane and k-step, lane-major:
    // conflict-free), so they hold no registers across the P·V half of the loop.
    uint4* q_park = reinterpret_cast<uint4*>(smem + OFF_Q) + warp * (HEAD_DIM / 16) * 32 + lane;
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk)
        q_park[kk * 32] = make_uint4(qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3]);


    for (int j = 0; j * STEP_KEYS < S; ++j) {
        // 1. This step's K and V codes, landed in its stage.
#if USE_CP_ASYNC
        // Groups committed so far: CP_STAGES - 1 + j; all but the newest CP_STAGES - 2 have
        // landed once step j has.
#ifndef MUTANT_SKIP_CP_WAIT
        __pipeline_wait_prior(CP_STAGES - 2);
#endif
#ifndef MUTANT_NO_DEQUANT_BARRIER
        __syncthreads(); // every thread's copies of step j are visible; step j - 1 is done
#endif
        {
            // Into the stage step j - 1 used: every warp is past it (the barrier above), so
            // one barrier per step suffices.
            const int ahead = j + CP_STAGES - 1;
            if (ahead * STEP_KEYS < S)
                copy_step_async(k_bh, v_bh, ahead * STEP_KEYS, min(STEP_KEYS, S - ahead * STEP_KEYS),
                                smem + (ahead % CP_STAGES) * STAGE_BYTES);
            __pipeline_commit(); // one group per iteration keeps the count uniform
        }
#ifdef MUTANT_WRONG_STAGE
        const int cur = (j + 1) % CP_STAGES; // a stage still being filled
#else
        const int cur = j % CP_STAGES;
#endif
#else
        load_step(k_bh, v_bh, j * STEP_KEYS, min(STEP_KEYS, S - j * STEP_KEYS), smem);
        const int cur = 0;
#ifndef MUTANT_NO_DEQUANT_BARRIER
        __syncthreads(); // every thread's codes of this step are in shared memory
#endif
#endif
        const unsigned sK_addr = smem_addr + cur * STAGE_BYTES;
        const unsigned sV_addr = sK_addr + STEP_CODE_BYTES;

        const int t = j * KV_SPLIT + split; // this warp's tile
        if (t * BLOCK_N < keys_run) {
            const int valid = min(BLOCK_N, S - t * BLOCK_N);

            // 2. S = Q Kᵀ: 8 key blocks x 4 k-steps. One ldmatrix per key block: matrix kk is
            //    its 8 keys x chunk kk, so a lane gets dims 16kk + 4q .. +3 of key g: b0, b1.
            float s[BLOCK_N / 8][4];
#pragma unroll
            for (int nb = 0; nb < BLOCK_N / 8; ++nb) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
            unsigned qa[HEAD_DIM / 16][4];
#pragma unroll
            for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
                const uint4 f = q_park[kk * 32];
                qa[kk][0] = f.x, qa[kk][1] = f.y, qa[kk][2] = f.z, qa[kk][3] = f.w;
            }
#pragma unroll
            for (int nb = 0; nb < BLOCK_N / 8; ++nb) {
                unsigned kc[4];
                ldmatrix_x4(kc, sK_addr + (tile_row0 + nb * 8) * HEAD_DIM + k_lane);
#pragma unroll
                for (int kk = 0; kk < HEAD_DIM / 16; ++kk)
                    mma16816(s[nb], qa[kk], decode2_e4m3(kc[kk]), decode2_e4m3_hi(kc[kk]));
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
            //    ldmatrix.trans (b16) matrix i: keys 16kk + (i & 1)·8, chunk 2c2 + (i >> 1); a
            //    lane gets keys 2q, 2q+1 (+8) x dims 2g, 2g+1; prmt sorts them per dim into
            //    b0, b1 of the chunk's even-dim MMA (o[2c]) and odd-dim MMA (o[2c + 1]).
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
                        const __half p0 = __float2half_rn(exp2_for_p(s[nb][2 * i] - m_run[i]));
                        const __half p1 = __float2half_rn(exp2_for_p(s[nb][2 * i + 1] - m_run[i]));
                        part[i] += __half2float(p0);
                        part[i] += __half2float(p1);
                        pa[h * 2 + i] = pack_half2(p0, p1);
                    }
                }
#pragma unroll
                for (int c2 = 0; c2 < HEAD_DIM / 32; ++c2) {
                    unsigned vc[4];
                    ldmatrix_x4_trans(vc, sV_addr + (tile_row0 + kk * 16) * HEAD_DIM + (v_lane ^ (c2 * 32)));
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int c = 2 * c2 + h;
                        const unsigned even = prmt(vc[2 * h], vc[2 * h + 1], 0x6420);
                        const unsigned odd = prmt(vc[2 * h], vc[2 * h + 1], 0x7531);
                        mma16816(o[2 * c], pa, decode2_e4m3(even), decode2_e4m3_hi(even));
                        mma16816(o[2 * c + 1], pa, decode2_e4m3(odd), decode2_e4m3_hi(odd));
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < 2; ++i) l_run[i] = __fmaf_rn(l_run[i], alpha[i], part[i]);
        }
#if !USE_CP_ASYNC
        __syncthreads(); // every warp is done with the stage before the next step's stores
#endif
    }
#if USE_CP_ASYNC
    __pipeline_wait_prior(0); // only empty groups remain; none may land in the parking area
    __syncthreads();          // every warp is done with the last stage before parking
#endif

    // Row sums over the quad: (l_0 + l_1) + (l_2 + l_3), the same on every lane.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 1);
        l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 2);
    }

    // Merge the KV splits into split 0 (shared memory is free: the loop ended on a barrier).
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

    // Normalize and store: per row (g, g + 8) and 16-dim chunk c a lane holds dims
    // 16c + 4q .. +3 as (o[2c][.], o[2c+1][.], o[2c][. + 1], o[2c+1][. + 1]): one 8-byte store.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#ifdef MUTANT_STORE_ROW_OFF_BY_ONE
        const int row = q0 + g + i * 8 + 1;
#else
        const int row = q0 + g + i * 8;
#endif
        if (row < S) {
            const float scale = v_scale[bh] / l_run[i];
            uint2* dst = reinterpret_cast<uint2*>(out + head_off + (size_t)row * HEAD_DIM + 4 * qd);
#pragma unroll
            for (int c = 0; c < HEAD_DIM / 16; ++c) {
                const __half d0 = __float2half_rn(__fmul_rn(o[2 * c][2 * i], scale));
                const __half d1 = __float2half_rn(__fmul_rn(o[2 * c + 1][2 * i], scale));
                const __half d2 = __float2half_rn(__fmul_rn(o[2 * c][2 * i + 1], scale));
                const __half d3 = __float2half_rn(__fmul_rn(o[2 * c + 1][2 * i + 1], scale));
                dst[c * 4] = make_uint2(pack_half2(d0, d1), pack_half2(d2, d3));
            }
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
