// emulation_f32.cu — the runner's emulation of the kernel's algorithm on the GPU: the same
// arithmetic as src/emulation/mod.rs, operation for operation, so the two give the same bits
// (tests/gpu_emulation.rs). Not part of the kernel under test; it is a yardstick, like
// reference_f64.cu, and reads its own copies of the codes.
//
// What it computes (src/emulation/mod.rs says why each step is what the kernel does): per
// checked query row, KV tiles of KT = 64 keys dealt to `kv_split` splits (split k takes tiles
// k, k + kv_split, ...), each split an online softmax in base 2 over its tiles:
//   scores   acc_j = Σ over 4 k-steps of (Σ over 16 x of q_x·k_jx, from 0 in x order), from 0;
//            s_j = acc_j · qk_scale, or -inf for keys past S
//   softmax  m' = max(m, max_j s_j), alpha = exp2(m − m'), p_j = f16(exp2(s_j − m')),
//            l_q = fma(l_q, alpha, Σ of lane q's P in block order), q < 4 (a quad's lanes)
//   P·V      o = o·alpha, then per 16-key step o_x += (Σ over its keys of p_j·v_jx, from 0)
// A split ends with l = (l_0 + l_1) + (l_2 + l_3); the splits merge as the kernel's split 0
// does; out = f16(o · (v_scale / l)), a NaN written as 0x7FFF (the host's NAN_BITS). Every
// operation is an explicit round-to-nearest intrinsic (__fadd_rn, __fmul_rn, fmaf): nothing
// is contracted or reordered, whatever the compiler's flags. exp2 is `exp2_portable`, the host's src/emulation/exp2.rs.
//
// Launch: one CTA per block of up to ROWS checked rows of one head; the host's block table
// holds (head, first row, rows) per CTA, rows indexing the gathered Q rows and the output.
// K and V hold `heads` whole heads of S × 64 codes; Q only the checked rows.
//
// Threads: ROWS = 128, thread r owns row r of the block and walks its splits one after the
// other; every thread walks the same tiles, so the CTA loads each tile once for all rows.
// Its Q row lives in registers; its O accumulator in shared memory, so that no loop over
// the 64 columns needs unrolling (NVRTC compiles this file in well under a second).
//
// Shared memory (dynamic, 4-byte words; 99,328 bytes, so two CTAs fit an SM of sm_90):
//   table[256]      the E4M3 decode table, the host's f32 one (identical decoding)
//   kt[KT][64]      the tile's keys, decoded; all threads read one key at a time (broadcast)
//   vt[KT][64]      the tile's values, decoded; keys past S are 0 in both, as on the host
//   sp[KT][ROWS]    each row's scores, then its weights  } column r is thread r's: no bank
//   so[64][ROWS]    each row's O accumulator             } conflicts
// Global scratch: per row and split, its final (m, l, o[64]), read back by the merge.

#define D 64
#define KT 64
#define ROWS 128
#define THREADS ROWS
#define K_STEP 16
#define QUAD 4
#define STATE (2 + D)
#define NAN_BITS 0x7FFF
#define SMEM_BYTES ((256 + 2 * KT * D + KT * ROWS + D * ROWS) * 4)

// The launch geometry, read by the host from the module (src/backend/cuda/emulation.rs).
extern "C" __constant__ int EMU_HEAD_DIM = D;
extern "C" __constant__ int EMU_KV_TILE = KT;
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

// Loads tile `tile` of the head: keys past S are 0.
__device__ __forceinline__ void load_tile(const float* tab, const unsigned char* kc,
                                          const unsigned char* vc, int s, int tile, float* kt,
                                          float* vt) {
    const int j0 = tile * KT;
    for (int i = threadIdx.x; i < KT * D; i += THREADS) {
        const bool live = j0 + i / D < s;
        const size_t at = (size_t)j0 * D + i;
        kt[i] = live ? tab[kc[at]] : 0.0f;
        vt[i] = live ? tab[vc[at]] : 0.0f;
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
sdpa_emulation_f32(const float* __restrict__ table, const unsigned char* __restrict__ q_codes,
                   const unsigned char* __restrict__ k_codes,
                   const unsigned char* __restrict__ v_codes, const float* __restrict__ qk_scale,
                   const float* __restrict__ v_scale, const int* __restrict__ blocks, int s,
                   int kv_split, float* __restrict__ states, unsigned short* __restrict__ out) {
    extern __shared__ float smem[];
    float* tab = smem;
    float* kt = tab + 256;
    float* vt = kt + KT * D;
    float* sp = vt + KT * D;
    float* so = sp + KT * ROWS;

    const int r = threadIdx.x;
    const int head = blocks[3 * blockIdx.x];
    const int first = blocks[3 * blockIdx.x + 1];
    const int n_rows = blocks[3 * blockIdx.x + 2];
    const bool mine = r < n_rows;
    const size_t head_off = (size_t)head * (size_t)s * D;
    const unsigned char* kc = k_codes + head_off;
    const unsigned char* vc = v_codes + head_off;
    const float qk = qk_scale[head];
    const float neg_inf = __int_as_float(0xff800000);
    const int n_tiles = (s + KT - 1) / KT;

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
            load_tile(tab, kc, vc, s, tile, kt, vt);
            __syncthreads();
            const int valid = min(KT, s - tile * KT);
            // 1. Scores, one MMA k-step at a time.
            float tile_max = neg_inf;
            for (int j = 0; j < KT; ++j) {
                const float* kj = kt + j * D;
                float acc = 0.0f;
#pragma unroll
                for (int ks = 0; ks < D; ks += K_STEP) {
                    float part = 0.0f;
#pragma unroll
                    for (int x = ks; x < ks + K_STEP; ++x) {
                        part = __fadd_rn(part, __fmul_rn(q[x], kj[x]));
                    }
                    acc = __fadd_rn(acc, part);
                }
                const float score = j < valid ? __fmul_rn(acc, qk) : neg_inf;
                sp[j * ROWS + r] = score;
                tile_max = fmaxf(tile_max, score);
            }
            // 2. Online softmax in base 2; P rounded to f16; one partial sum per quad lane.
            const float m_new = fmaxf(m, tile_max);
            const float alpha = exp2_portable(__fsub_rn(m, m_new));
            for (int j = 0; j < KT; ++j) {
                const float p = exp2_portable(__fsub_rn(sp[j * ROWS + r], m_new));
                sp[j * ROWS + r] = f16_bits_to_f32(to_f16_bits(p));
            }
#pragma unroll
            for (int lane = 0; lane < QUAD; ++lane) {
                float part = 0.0f;
                for (int b = 0; b < KT; b += 8) {
                    part = __fadd_rn(part, sp[(b + 2 * lane) * ROWS + r]);
                    part = __fadd_rn(part, sp[(b + 2 * lane + 1) * ROWS + r]);
                }
                l_quad[lane] = fmaf(l_quad[lane], alpha, part);
            }
            m = m_new;
            // 3. Rescale, then P·V one 16-key step at a time.
            for (int x = 0; x < D; ++x) {
                so[x * ROWS + r] = __fmul_rn(so[x * ROWS + r], alpha);
            }
            for (int ks = 0; ks < KT; ks += K_STEP) {
                float p[K_STEP];
#pragma unroll
                for (int j = 0; j < K_STEP; ++j) {
                    p[j] = sp[(ks + j) * ROWS + r];
                }
                const float* v = vt + ks * D;
                for (int x = 0; x < D; ++x) {
                    float part = 0.0f;
#pragma unroll
                    for (int j = 0; j < K_STEP; ++j) {
                        part = __fadd_rn(part, __fmul_rn(p[j], v[j * D + x]));
                    }
                    so[x * ROWS + r] = __fadd_rn(so[x * ROWS + r], part);
                }
            }
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
    unsigned short* row_out = out + (size_t)(first + r) * D;
    for (int x = 0; x < D; ++x) {
        const float v = __fmul_rn(so[x * ROWS + r], f);
        row_out[x] = isnan(v) ? NAN_BITS : to_f16_bits(v);  // one NaN, as on the host
    }
}
