// emulation_f32.cu — the runner's emulation of a kernel's algorithm on the GPU: the same
// arithmetic as src/emulation/ (mod.rs and general.rs), operation for operation, so the two give
// the same bits (tests/gpu_emulation.rs). Not part of the kernel under test; it is a yardstick,
// like reference_f64.cu, and reads its own copies of the codes.
//
// One module per (D, algorithm): the host compiles it with the defines below, taken from the
// kernel's manifest numerics (src/emulation/algorithm.rs), and checks the constants it
// publishes against them when it loads (src/backend/cuda/emulation.rs).
//   EMU_D            head dim, 64 or 128
//   EMU_KT           keys per KV tile (the manifest's block_n), at most 128
//   EMU_MMA_K        depth of one tensor-core step of both products (16 or 32)
//   EMU_P_E4M3       P rounded to e4m3 before P·V (else f16)
//   EMU_L_F32P       the row sum adds the f32 P (else the rounded P)
//   EMU_L_MMA        the manifest's `row_sum = "mma"`: l is one more column of P·V, of ones
//                    (l·alpha then each step's Σ p̂ added, or Ô's way with EMU_PV_PER_TILE;
//                    FP22 with EMU_FP22), not four lanes' partial sums
//   EMU_PV_PER_TILE  a tile's P·V into a tile accumulator Ô, then O = fma(O, alpha, Ô)
//                    (else O·alpha, then each step added into O)
//   EMU_FP22         each step aligned and truncated to 13 fraction bits as Hopper's FP8
//                    tensor cores keep a sum (src/emulation/general.rs `fp22_step`; else f32)
//   EMU_FUSED_SCALE  the manifest's `score = "fused"`: s_j = acc_j (unscaled), the tile's
//                    maximum scaled once, p_j = exp2(fma(acc_j, qk_scale, −base))
//   EMU_RESCALE_THRESHOLD  the manifest's `rescale_threshold` τ (log2 units, default 0): the
//                    running maximum moves to the tile's only where that passes m + τ
//
// What it computes, per checked query row: the KV tiles it sees a key of, dealt to `kv_split`
// splits (split k takes tiles k, k + kv_split, ...), each split an online softmax in base 2:
//   scores   per step of MMA_K: f32 (part = Σ q_x·k_jx from 0 in x order; acc += part) or
//            FP22 (acc = fp22_step(acc, the step's products)); s_j = acc_j · qk_scale (fused:
//            s_j = acc_j), or -inf for keys the row does not see (past S_k, or above its
//            causal diagonal)
//   softmax  with t = max_j s_j (fused: (max_j s_j) · qk_scale), m' = t where t > m + τ, else m
//            (τ = 0: max(m, t); src/emulation/algorithm.rs `next_max`), base = m' (0
//            while no key has a finite score), alpha = exp2(m − base), p_j = exp2(s_j − base)
//            (fused: exp2(fma(s_j, qk_scale, −base)), -inf staying -inf), p̂_j = P's rounding,
//            l_q = fma(l_q, alpha, Σ of lane q's p (or p̂) in block order), q < 4 (a quad),
//            but with EMU_L_MMA (below, in P·V's steps)
//   P·V      per MMA_K-key step, into O or Ô as above, f32 or FP22 (EMU_L_MMA: l as one
//            more column, of ones, in l_0; l_1 .. l_3 stay 0)
// A tile the row sees no key of is skipped: it would leave the state's bits as they are (the
// host's reasoning, src/emulation/mod.rs). A split ends with l = (l_0 + l_1) + (l_2 + l_3);
// the splits merge as the kernel's split 0 does; out = f16(o · (v_scale / l)), a NaN written as
// 0x7FFF (the host's NAN_BITS); a row that sees no key is written as zeros. Every operation
// is an explicit round-to-nearest intrinsic (__fadd_rn, __fmul_rn, fmaf, __dmul_rn): nothing
// is contracted or reordered, whatever the compiler's flags. exp2 is `exp2_portable`, the
// host's src/emulation/exp2.rs.
//
// Launch: one CTA per block of up to ROWS checked rows of one query head; the host's block
// table holds (query head, K/V head, first row, rows, keys) per CTA: heads numbered within the
// uploaded group, rows indexing the gathered Q rows and the output, keys the most any of the
// block's rows sees. `seen[row]` is each gathered row's own count (src/shapes/mod.rs
// `visible_keys`). K and V hold whole K/V heads of S_k × D codes; Q only the checked rows.
//
// Threads: ROWS, thread r owns row r of the block and walks its splits one after the other;
// every thread walks the same tiles, so the CTA loads each tile once for all rows. Its Q row
// lives in registers; its accumulators in shared memory, so that no loop over D needs
// unrolling (NVRTC compiles this file in about a second).
//
// Shared memory (dynamic, 4-byte words):
//   table[256]      the E4M3 decode table, the host's f32 one (identical decoding)
//   kt[KT][D]       the tile's keys, decoded; all threads read one key at a time (broadcast)
//   vt[KT][D]       the tile's values, decoded; keys past S_k are 0 in both, as on the host
//   sp[KT][ROWS]    each row's scores, then its weights  } column r is thread r's: no bank
//   so[D][ROWS]     each row's O accumulator             } conflicts
//   ot[D][ROWS]     each row's tile accumulator Ô (EMU_PV_PER_TILE only)
// ROWS is 128 where that fits sm_90's 227 KB (99,328 bytes for Stage C at D 64: two CTAs an
// SM), else 64 (230,400 bytes for Stage D at D 128).
// Global scratch: per row and split, its final (m, l, o[D]), read back by the merge.

#ifndef EMU_D
#define EMU_D 64
#endif
#ifndef EMU_KT
#define EMU_KT 64
#endif
#ifndef EMU_MMA_K
#define EMU_MMA_K 16
#endif
#ifndef EMU_P_E4M3
#define EMU_P_E4M3 0
#endif
#ifndef EMU_L_F32P
#define EMU_L_F32P 0
#endif
#ifndef EMU_L_MMA
#define EMU_L_MMA 0
#endif
#ifndef EMU_PV_PER_TILE
#define EMU_PV_PER_TILE 0
#endif
#ifndef EMU_FUSED_SCALE
#define EMU_FUSED_SCALE 0
#endif
#ifndef EMU_RESCALE_THRESHOLD
#define EMU_RESCALE_THRESHOLD 0
#endif
#ifndef EMU_FP22
#define EMU_FP22 0
#endif

#define D EMU_D
#define KT EMU_KT
#define MMA_K EMU_MMA_K
#define QUAD 4
#define STATE (2 + D)
#define NAN_BITS 0x7FFF
#define SMEM_WORDS(rows) (256 + 2 * KT * D + KT * (rows) + D * (rows) * (1 + EMU_PV_PER_TILE))
#define SMEM_LIMIT 232448
#if SMEM_WORDS(128) * 4 <= SMEM_LIMIT
#define ROWS 128
#else
#define ROWS 64
#endif
#define THREADS ROWS
#define SMEM_BYTES (SMEM_WORDS(ROWS) * 4)

#if D % MMA_K != 0 || KT % MMA_K != 0 || KT % (2 * QUAD) != 0 || KT > 128 || MMA_K > 32
#error "the tile, the step and the quad must divide as the host emulation's do"
#endif
#if SMEM_BYTES > SMEM_LIMIT
#error "the tiles do not fit shared memory even at 64 rows"
#endif

// What the module was built for, read and checked by the host (src/backend/cuda/emulation.rs).
extern "C" __constant__ int EMU_HEAD_DIM = D;
extern "C" __constant__ int EMU_KV_TILE = KT;
extern "C" __constant__ int EMU_STEP = MMA_K;
extern "C" __constant__ int EMU_P_IS_E4M3 = EMU_P_E4M3;
extern "C" __constant__ int EMU_L_FROM_F32_P = EMU_L_F32P;
extern "C" __constant__ int EMU_L_IS_MMA = EMU_L_MMA;
extern "C" __constant__ int EMU_PV_IS_PER_TILE = EMU_PV_PER_TILE;
extern "C" __constant__ int EMU_ACC_IS_FP22 = EMU_FP22;
extern "C" __constant__ int EMU_SCORE_IS_FUSED = EMU_FUSED_SCALE;
extern "C" __constant__ int EMU_RESCALE_THRESHOLD_IS = EMU_RESCALE_THRESHOLD;
extern "C" __constant__ int EMU_ROWS = ROWS;
extern "C" __constant__ int EMU_THREADS = THREADS;
extern "C" __constant__ int EMU_SMEM_BYTES = SMEM_BYTES;
extern "C" __constant__ int EMU_STATE_FLOATS = STATE;

// 2^x exactly as src/emulation/exp2.rs computes it: in f64, x clamped to [-200, 200]
// (NaN stays NaN), k = nearest integer (ties to even), r = x − k, the degree-12 Taylor series
// of 2^r by Horner's rule, times 2^k, rounded once to f32.
__device__ __forceinline__ float exp2_portable(float x) {
    const double ROUND = 6755399441055744.0;  // 1.5 · 2^52
    const unsigned long long C[13] = {
        0x3ff0000000000000ull, 0x3fe62e42fefa39efull, 0x3fcebfbdff82c58full,
        0x3fac6b08d704a0c0ull, 0x3f83b2ab6fba4e77ull, 0x3f55d87fe78a6731ull,
        0x3f2430912f86c787ull, 0x3eeffcbfc588b0c7ull, 0x3eb62c0223a5c824ull,
        0x3e7b5253d395e7c4ull, 0x3e3e4cf5158b8ecaull, 0x3dfe8cac7351bb25ull,
        0x3dbc3bd650fc2986ull};
    double xd = (double)x;
    xd = xd < -200.0 ? -200.0 : (xd > 200.0 ? 200.0 : xd);
    const double t = __dadd_rn(xd, ROUND);
    const double k = __dsub_rn(t, ROUND);
    const double r = __dsub_rn(xd, k);
    double p = __longlong_as_double((long long)C[12]);
#pragma unroll
    for (int i = 11; i >= 0; --i) {
        p = __dadd_rn(__dmul_rn(p, r), __longlong_as_double((long long)C[i]));
    }
    const long long k_int = __double_as_longlong(t) - __double_as_longlong(ROUND);
    const double scale = __longlong_as_double((long long)((unsigned long long)(k_int + 1023) << 52));
    return __double2float_rn(__dmul_rn(p, scale));
}

// f32 -> f16, round to nearest even (f16 subnormals kept), as the host's `half` does; PTX,
// so no header is needed.
__device__ __forceinline__ unsigned short to_f16_bits(float x) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}

__device__ __forceinline__ float f16_bits_to_f32(unsigned short h) {
    float x;
    asm("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(h));
    return x;
}

// P rounded to its precision: f16, or e4m3 by the saturating round-to-nearest conversion the
// host's encoder reproduces bit for bit (tests/gpu_fp8.rs), decoded by the host's table.
__device__ __forceinline__ float round_p(float x, const float* tab) {
#if EMU_P_E4M3
    unsigned short pair;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(x));
    return tab[pair & 0xFF];
#else
    (void)tab;
    return f16_bits_to_f32(to_f16_bits(x));
#endif
}

// x truncated toward zero to 13 fraction bits, as an f32 (src/emulation/general.rs `fp22`).
__device__ __forceinline__ float fp22(double x) {
    if (!isfinite(x)) {
        return __double2float_rn(x);
    }
    const long long mask = ~((1ll << (52 - 13)) - 1);
    return __double2float_rn(__longlong_as_double(__double_as_longlong(x) & mask));
}

// One MMA_K-deep step of an FP8 tensor core (src/emulation/general.rs `fp22_step`): the
// accumulator and the products a[i]·b[i·stride] (exact in f64) aligned to the largest
// magnitude's exponent less 13, each truncated toward zero, summed (exactly: every term is a
// multiple of the unit and the sum needs 20 bits), the sum truncated to FP22.
__device__ __forceinline__ float fp22_step(float acc, const float* a, const float* b,
                                           int stride) {
    double largest = fabs((double)acc);
#pragma unroll
    for (int i = 0; i < MMA_K; ++i) {
        largest = fmax(largest, fabs(__dmul_rn((double)a[i], (double)b[i * stride])));
    }
    double sum = (double)acc;
    if (largest == 0.0 || !isfinite(largest)) {
#pragma unroll
        for (int i = 0; i < MMA_K; ++i) {
            sum = __dadd_rn(sum, __dmul_rn((double)a[i], (double)b[i * stride]));
        }
        return fp22(sum);
    }
    const int exponent = (int)((__double_as_longlong(largest) >> 52) & 0x7ff) - 1023;
    const double ulp = __longlong_as_double((long long)(exponent - 13 + 1023) << 52);
    sum = __dmul_rn(trunc(__ddiv_rn(sum, ulp)), ulp);
#pragma unroll
    for (int i = 0; i < MMA_K; ++i) {
        const double t = __dmul_rn((double)a[i], (double)b[i * stride]);
        sum = __dadd_rn(sum, __dmul_rn(trunc(__ddiv_rn(t, ulp)), ulp));
    }
    return fp22(sum);
}

// Loads tile `tile` of the K/V head: keys past S_k are 0.
__device__ __forceinline__ void load_tile(const float* tab, const unsigned char* kc,
                                          const unsigned char* vc, int sk, int tile, float* kt,
                                          float* vt) {
    const int j0 = tile * KT;
    for (int i = threadIdx.x; i < KT * D; i += THREADS) {
        const bool live = j0 + i / D < sk;
        const size_t at = (size_t)j0 * D + i;
        kt[i] = live ? tab[kc[at]] : 0.0f;
        vt[i] = live ? tab[vc[at]] : 0.0f;
    }
}

// The P·V steps of one tile into the accumulator column `o` (stride ROWS): weights from the
// row's column of `sp`, values from the tile; with EMU_L_MMA also P·1 into `l`.
__device__ __forceinline__ void pv_steps(const float* sp, const float* vt, float* o, int r,
                                         float& l) {
    for (int ks = 0; ks < KT; ks += MMA_K) {
        float p[MMA_K];
#pragma unroll
        for (int j = 0; j < MMA_K; ++j) {
            p[j] = sp[(ks + j) * ROWS + r];
        }
#if EMU_L_MMA
        {
#if EMU_FP22
            float ones[MMA_K];
#pragma unroll
            for (int j = 0; j < MMA_K; ++j) {
                ones[j] = 1.0f;
            }
            l = fp22_step(l, p, ones, 1);
#else
            float part = 0.0f;
#pragma unroll
            for (int j = 0; j < MMA_K; ++j) {
                part = __fadd_rn(part, p[j]);  // p · 1, exact
            }
            l = __fadd_rn(l, part);
#endif
        }
#else
        (void)l;
#endif
        const float* v = vt + ks * D;
        for (int x = 0; x < D; ++x) {
#if EMU_FP22
            o[x * ROWS] = fp22_step(o[x * ROWS], p, v + x, D);
#else
            float part = 0.0f;
#pragma unroll
            for (int j = 0; j < MMA_K; ++j) {
                part = __fadd_rn(part, __fmul_rn(p[j], v[j * D + x]));
            }
            o[x * ROWS] = __fadd_rn(o[x * ROWS], part);
#endif
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
sdpa_emulation_f32(const float* __restrict__ table, const unsigned char* __restrict__ q_codes,
                   const unsigned char* __restrict__ k_codes,
                   const unsigned char* __restrict__ v_codes, const float* __restrict__ qk_scale,
                   const float* __restrict__ v_scale, const int* __restrict__ blocks,
                   const int* __restrict__ seen, int sk, int kv_split,
                   float* __restrict__ states, unsigned short* __restrict__ out) {
    extern __shared__ float smem[];
    float* tab = smem;
    float* kt = tab + 256;
    float* vt = kt + KT * D;
    float* sp = vt + KT * D;
    float* so = sp + KT * ROWS;
#if EMU_PV_PER_TILE
    float* ot = so + D * ROWS;
#endif

    const int r = threadIdx.x;
    const int* block = blocks + 5 * blockIdx.x;
    const int head = block[0], kv_head = block[1], first = block[2], n_rows = block[3];
    const int n_tiles = (block[4] + KT - 1) / KT;
    const bool mine = r < n_rows;
    const int my_keys = mine ? seen[first + r] : 0;
    const size_t kv_off = (size_t)kv_head * (size_t)sk * D;
    const unsigned char* kc = k_codes + kv_off;
    const unsigned char* vc = v_codes + kv_off;
    const float qk = qk_scale[head];
    const float neg_inf = __int_as_float(0xff800000);

    for (int i = r; i < 256; i += THREADS) {
        tab[i] = table[i];
    }
    __syncthreads();
    float q[D];
#pragma unroll
    for (int x = 0; x < D; ++x) {
        q[x] = mine ? tab[q_codes[(size_t)(first + r) * D + x]] : 0.0f;
    }
    float* my_states = states + (size_t)(first + (mine ? r : 0)) * kv_split * STATE;

    for (int split = 0; split < kv_split; ++split) {
        float m = neg_inf;
        float l_quad[QUAD] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int x = 0; x < D; ++x) {
            so[x * ROWS + r] = 0.0f;
        }
        for (int tile = split; tile < n_tiles; tile += kv_split) {
            __syncthreads();
            load_tile(tab, kc, vc, sk, tile, kt, vt);
            __syncthreads();
            const int j0 = tile * KT;
            if (my_keys <= j0) {
                continue;  // the row sees no key of this tile: its state keeps its bits
            }
            const int valid = min(KT, my_keys - j0);
            // 1. Scores, one tensor-core step at a time.
            float tile_max = neg_inf;
            for (int j = 0; j < KT; ++j) {
                const float* kj = kt + j * D;
                float acc = 0.0f;
#pragma unroll
                for (int ks = 0; ks < D; ks += MMA_K) {
#if EMU_FP22
                    acc = fp22_step(acc, q + ks, kj + ks, 1);
#else
                    float part = 0.0f;
#pragma unroll
                    for (int x = ks; x < ks + MMA_K; ++x) {
                        part = __fadd_rn(part, __fmul_rn(q[x], kj[x]));
                    }
                    acc = __fadd_rn(acc, part);
#endif
                }
#if EMU_FUSED_SCALE
                const float score = j < valid ? acc : neg_inf;
#else
                const float score = j < valid ? __fmul_rn(acc, qk) : neg_inf;
#endif
                sp[j * ROWS + r] = score;
                tile_max = fmaxf(tile_max, score);
            }
#if EMU_FUSED_SCALE
            tile_max = __fmul_rn(tile_max, qk);
#endif
            // 2. Online softmax in base 2: the f32 P, its row sum per quad lane (but with
            //    EMU_L_MMA: in P·V's steps), P rounded.
            const float m_new = tile_max > __fadd_rn(m, (float)EMU_RESCALE_THRESHOLD) ? tile_max : m;
            const float base = m_new == neg_inf ? 0.0f : m_new;
            const float alpha = exp2_portable(__fsub_rn(m, base));
            for (int j = 0; j < KT; ++j) {
#if EMU_FUSED_SCALE
                // A key the row does not see weighs 0 whatever the scale, as in the kernel.
                const float s = sp[j * ROWS + r];
                sp[j * ROWS + r] = exp2_portable(s == neg_inf ? neg_inf : __fmaf_rn(s, qk, -base));
#else
                sp[j * ROWS + r] = exp2_portable(__fsub_rn(sp[j * ROWS + r], base));
#endif
            }
#if !EMU_L_MMA
#pragma unroll
            for (int lane = 0; lane < QUAD; ++lane) {
                float part = 0.0f;
                for (int b = 0; b < KT; b += 2 * QUAD) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float p = sp[(b + 2 * lane + e) * ROWS + r];
                        part = __fadd_rn(part, EMU_L_F32P ? p : round_p(p, tab));
                    }
                }
                l_quad[lane] = fmaf(l_quad[lane], alpha, part);
            }
#endif
            for (int j = 0; j < KT; ++j) {
                sp[j * ROWS + r] = round_p(sp[j * ROWS + r], tab);
            }
            m = m_new;
            // 3. P·V.
#if EMU_PV_PER_TILE
            for (int x = 0; x < D; ++x) {
                ot[x * ROWS + r] = 0.0f;
            }
            float lt = 0.0f;
            pv_steps(sp, vt, ot + r, r, lt);
            for (int x = 0; x < D; ++x) {
                so[x * ROWS + r] = fmaf(so[x * ROWS + r], alpha, ot[x * ROWS + r]);
            }
            if (EMU_L_MMA) l_quad[0] = fmaf(l_quad[0], alpha, lt);
#else
            for (int x = 0; x < D; ++x) {
                so[x * ROWS + r] = __fmul_rn(so[x * ROWS + r], alpha);
            }
            float l_run = __fmul_rn(l_quad[0], alpha);
            pv_steps(sp, vt, so + r, r, l_run);
            if (EMU_L_MMA) l_quad[0] = l_run;
#endif
        }
        if (mine) {
            float* st = my_states + split * STATE;
            st[0] = m;
            st[1] = __fadd_rn(__fadd_rn(l_quad[0], l_quad[1]), __fadd_rn(l_quad[2], l_quad[3]));
            for (int x = 0; x < D; ++x) {
                st[2 + x] = so[x * ROWS + r];
            }
        }
    }
    if (!mine) {
        return;
    }
    unsigned short* row_out = out + (size_t)(first + r) * D;
    if (my_keys == 0) {
        // A row that sees no key: the kernel's l is 0 and it writes zeros.
        for (int x = 0; x < D; ++x) {
            row_out[x] = 0;
        }
        return;
    }

    // The merge of the splits, as the kernel's split 0 does (one split is taken as is),
    // into this row's column of `so`.
    float l = my_states[1];
    for (int x = 0; x < D; ++x) {
        so[x * ROWS + r] = my_states[2 + x];
    }
    if (kv_split > 1) {
        float m_all = neg_inf;
        for (int k = 0; k < kv_split; ++k) {
            m_all = fmaxf(m_all, my_states[k * STATE]);
        }
        const float f = exp2_portable(__fsub_rn(my_states[0], m_all));
        l = __fmul_rn(l, f);
        for (int x = 0; x < D; ++x) {
            so[x * ROWS + r] = __fmul_rn(so[x * ROWS + r], f);
        }
        for (int k = 1; k < kv_split; ++k) {
            const float* st = my_states + k * STATE;
            const float a = exp2_portable(__fsub_rn(st[0], m_all));
            l = fmaf(st[1], a, l);
            for (int x = 0; x < D; ++x) {
                so[x * ROWS + r] = fmaf(st[2 + x], a, so[x * ROWS + r]);
            }
        }
    }
    const float f = __fdiv_rn(v_scale[head], l);
    for (int x = 0; x < D; ++x) {
        const float v = __fmul_rn(so[x * ROWS + r], f);
        row_out[x] = isnan(v) ? NAN_BITS : to_f16_bits(v);  // one NaN, as on the host
    }
}
