// reference_f64.cu — the runner's f64 reference on the GPU; not part of the kernel under test.
//
// For each checked query row i of a query head, with q̂ k̂ v̂ the dequantized FP8 codes and q k v
// the original f32 inputs, all in f64, over the keys j the row sees (all S_k, or under the
// causal mask j < seen[i], src/shapes/mod.rs `visible_keys`), from the K/V head the query head
// reads:
//   s_k(j) = scale · (q̂_i · k̂_j)      s_e(j) = scale · (q_i · k_j)
//   pass 1: m_k = max_j s_k,  m_e = max_j s_e,  shift = max_j |s_k − s_e|
//   pass 2: w_k = exp(s_k − m_k),  w_e = exp(s_e − m_e)
//           L_k = Σ w_k,  L_e = Σ w_e,  n_sub = #{j : w_k < small_weight}
//           O_k = Σ w_k v̂_j,  A = Σ w_k |v̂_j|,  O_e = Σ w_e v_j       (not yet divided by L)
//           with REF_SPREAD: pp = Σ w_k² v̂_j²,  rr = Σ r(w_k)² v̂_j², r(w) the most P's
//           rounding moves w (src/reference/model.rs `Reading::p_rounding`: rel·w at or above
//           the format's smallest normal, else min(w, half its subnormal step))
// A row that sees no key has every sum and total 0. The host (src/reference/mod.rs) divides,
// adds the error model's bounds, and holds the same figures computed on the CPU;
// docs/DESIGN.md "References on the GPU" says how they are proven equal. Two passes, because
// n_sub needs each row's final maximum.
//
// One module per (D, spread): the host compiles it with REF_D (64 or 128) and REF_SPREAD and
// checks the constants it publishes (src/backend/cuda/reference.rs).
//
// Launch: one CTA per block of up to ROWS query rows of one query head; the host's block
// table holds (query head, K/V head, first row, rows, keys) per CTA: heads numbered within
// the uploaded group, rows indexing the gathered Q rows and the outputs, keys the most any of
// the block's rows sees. K and V hold whole K/V heads of S_k × D; Q only the checked rows.
//
// Threads: 256. Thread t owns row r = t / 16 of the block and lane c = t % 16 of that row:
//   scores   keys c and c + 16 of each KT-key tile (both references: 4 dot products of D)
//   P·V      columns c + 16·n, n < D / 16, of O_k, A and O_e (and pp, rr)
// The 16 lanes of a row are 16 consecutive lanes of one warp; they combine with shuffles.
//
// Shared memory (dynamic, f64 words; 92,672 bytes at D 64, so two CTAs fit an SM; 174,592 at
// D 128):
//   table[256]                  the E4M3 decode table, the host's own (identical decoding)
//   qk[ROWS][D]   qe[ROWS][D]   the block's Q rows: dequantized, original
//   kk[KT][D+1]   ke[KT][D+1]   a key tile, one column of padding: the 16 keys a half-warp
//                               reads at one column fall in 16 distinct bank pairs
//   vk[KT][D]     ve[KT][D]     the matching value tile (pass 2)
//   wk[ROWS][KT]  we[ROWS][KT]  the tile's weights (pass 2)
// Keys past S_k are zero in the tiles; keys a row does not see are skipped in its maxima and
// sums.

#ifndef REF_D
#define REF_D 64
#endif
#ifndef REF_SPREAD
#define REF_SPREAD 0
#endif
#define D REF_D
#define ROWS 16
#define KT 32
#define KPAD (D + 1)
#define THREADS 256
#define LANES 16
#define COLS (D / LANES)
#define SMEM_BYTES ((256 + 2 * ROWS * D + 2 * KT * KPAD + 2 * KT * D + 2 * ROWS * KT) * 8)
#if D % LANES != 0 || KT != 2 * LANES
#error "a row's 16 lanes take two keys of a tile and D / 16 columns each"
#endif

// What the module was built for and its launch geometry, read by the host
// (src/backend/cuda/reference.rs).
extern "C" __constant__ int REF_HEAD_DIM = D;
extern "C" __constant__ int REF_WITH_SPREAD = REF_SPREAD;
extern "C" __constant__ int REF_ROWS = ROWS;
extern "C" __constant__ int REF_THREADS = THREADS;
extern "C" __constant__ int REF_SMEM_BYTES = SMEM_BYTES;

__device__ __forceinline__ double lanes_max(double x) {
    for (int m = LANES / 2; m > 0; m >>= 1) {
        x = fmax(x, __shfl_xor_sync(0xffffffffu, x, m, LANES));
    }
    return x;
}

__device__ __forceinline__ double lanes_sum(double x) {
    for (int m = LANES / 2; m > 0; m >>= 1) {
        x += __shfl_xor_sync(0xffffffffu, x, m, LANES);
    }
    return x;
}

// Loads keys [j0, j0 + KT) of the head: K always, V when `with_v`.
__device__ __forceinline__ void load_tile(const double* tab, const unsigned char* k_codes,
                                          const float* k_orig, const unsigned char* v_codes,
                                          const float* v_orig, double k_sc, double v_sc,
                                          int sk, int j0, bool with_v, double* kk, double* ke,
                                          double* vk, double* ve) {
    for (int i = threadIdx.x; i < KT * D; i += THREADS) {
        const int j = i / D, x = i % D;
        const bool live = j0 + j < sk;
        const size_t at = (size_t)(j0 + j) * D + x;
        kk[j * KPAD + x] = live ? tab[k_codes[at]] * k_sc : 0.0;
        ke[j * KPAD + x] = live ? (double)k_orig[at] : 0.0;
        if (with_v) {
            vk[j * D + x] = live ? tab[v_codes[at]] * v_sc : 0.0;
            ve[j * D + x] = live ? (double)v_orig[at] : 0.0;
        }
    }
}

// Row r's scores against keys c and c + 16 of the tile: {s_k, s_e} for each.
__device__ __forceinline__ void tile_scores(const double* qk, const double* qe, const double* kk,
                                            const double* ke, int r, int c, double scale,
                                            double s_k[2], double s_e[2]) {
    double dk0 = 0.0, dk1 = 0.0, de0 = 0.0, de1 = 0.0;
#pragma unroll 8
    for (int x = 0; x < D; ++x) {
        const double a = qk[r * D + x], b = qe[r * D + x];
        dk0 = fma(a, kk[c * KPAD + x], dk0);
        dk1 = fma(a, kk[(c + 16) * KPAD + x], dk1);
        de0 = fma(b, ke[c * KPAD + x], de0);
        de1 = fma(b, ke[(c + 16) * KPAD + x], de1);
    }
    s_k[0] = scale * dk0;
    s_k[1] = scale * dk1;
    s_e[0] = scale * de0;
    s_e[1] = scale * de1;
}

// Most P's rounding moves a weight w <= 1 (src/reference/model.rs `Reading::p_rounding`).
__device__ __forceinline__ double p_rounding(double w, double rel, double min_normal,
                                             double sub_half) {
    return w >= min_normal ? rel * w : fmin(w, sub_half);
}

extern "C" __global__ void __launch_bounds__(THREADS, D == 64 ? 2 : 1)
sdpa_reference_f64(const double* __restrict__ table, const unsigned char* __restrict__ q_codes,
                   const float* __restrict__ q_orig, const unsigned char* __restrict__ k_codes,
                   const float* __restrict__ k_orig, const unsigned char* __restrict__ v_codes,
                   const float* __restrict__ v_orig, const float* __restrict__ q_scale,
                   const float* __restrict__ k_scale, const float* __restrict__ v_scale,
                   const int* __restrict__ blocks, const int* __restrict__ seen, int sk,
                   double scale, double small_weight, double p_rel, double p_min_normal,
                   double p_sub_half, double* __restrict__ o_k, double* __restrict__ o_a,
                   double* __restrict__ o_e, double* __restrict__ o_pp,
                   double* __restrict__ o_rr, double* __restrict__ stats) {
    extern __shared__ double smem[];
    double* tab = smem;
    double* qk = tab + 256;
    double* qe = qk + ROWS * D;
    double* kk = qe + ROWS * D;
    double* ke = kk + KT * KPAD;
    double* vk = ke + KT * KPAD;
    double* ve = vk + KT * D;
    double* wk = ve + KT * D;
    double* we = wk + ROWS * KT;

    const int t = threadIdx.x, r = t / LANES, c = t % LANES;
    const int* block = blocks + 5 * blockIdx.x;
    const int head = block[0], kv_head = block[1], first = block[2], n_rows = block[3];
    const int keys = block[4];
    const int my_keys = r < n_rows ? seen[first + r] : 0;
    const size_t kv_off = (size_t)kv_head * (size_t)sk * D;
    // The scales are per query head: K's and V's those of the K/V head it reads.
    const double q_sc = q_scale[head], k_sc = k_scale[head], v_sc = v_scale[head];
    const unsigned char* kc = k_codes + kv_off;
    const unsigned char* vc = v_codes + kv_off;
    const float* kf = k_orig + kv_off;
    const float* vf = v_orig + kv_off;
#if !REF_SPREAD
    (void)p_rel, (void)p_min_normal, (void)p_sub_half, (void)o_pp, (void)o_rr;
#endif

    for (int i = t; i < 256; i += THREADS) {
        tab[i] = table[i];
    }
    __syncthreads();
    for (int i = t; i < ROWS * D; i += THREADS) {
        const bool live = i / D < n_rows;
        const size_t at = (size_t)first * D + i;
        qk[i] = live ? tab[q_codes[at]] * q_sc : 0.0;
        qe[i] = live ? (double)q_orig[at] : 0.0;
    }

    const double neg_inf = __longlong_as_double(0xfff0000000000000ll);
    double m_k = neg_inf, m_e = neg_inf, shift = 0.0;
    for (int j0 = 0; j0 < keys; j0 += KT) {
        __syncthreads();
        load_tile(tab, kc, kf, vc, vf, k_sc, v_sc, sk, j0, false, kk, ke, vk, ve);
        __syncthreads();
        double s_k[2], s_e[2];
        tile_scores(qk, qe, kk, ke, r, c, scale, s_k, s_e);
        for (int n = 0; n < 2; ++n) {
            if (j0 + c + 16 * n < my_keys) {
                m_k = fmax(m_k, s_k[n]);
                m_e = fmax(m_e, s_e[n]);
                shift = fmax(shift, fabs(s_k[n] - s_e[n]));
            }
        }
    }
    m_k = lanes_max(m_k);
    m_e = lanes_max(m_e);
    shift = lanes_max(shift);

    double l_k = 0.0, l_e = 0.0, n_sub = 0.0;
    double acc_k[COLS], acc_a[COLS], acc_e[COLS];
#if REF_SPREAD
    double acc_pp[COLS], acc_rr[COLS];
#endif
#pragma unroll
    for (int n = 0; n < COLS; ++n) {
        acc_k[n] = acc_a[n] = acc_e[n] = 0.0;
#if REF_SPREAD
        acc_pp[n] = acc_rr[n] = 0.0;
#endif
    }
    for (int j0 = 0; j0 < keys; j0 += KT) {
        __syncthreads();
        load_tile(tab, kc, kf, vc, vf, k_sc, v_sc, sk, j0, true, kk, ke, vk, ve);
        __syncthreads();
        double s_k[2], s_e[2];
        tile_scores(qk, qe, kk, ke, r, c, scale, s_k, s_e);
        for (int n = 0; n < 2; ++n) {
            const bool live = j0 + c + 16 * n < my_keys;
            const double w_k = live ? exp(s_k[n] - m_k) : 0.0;
            const double w_e = live ? exp(s_e[n] - m_e) : 0.0;
            l_k += w_k;
            l_e += w_e;
            n_sub += (live && w_k < small_weight) ? 1.0 : 0.0;
            wk[r * KT + c + 16 * n] = w_k;
            we[r * KT + c + 16 * n] = w_e;
        }
        __syncthreads();
#pragma unroll 4
        for (int j = 0; j < KT; ++j) {
            const double a = wk[r * KT + j], b = we[r * KT + j];
#if REF_SPREAD
            const double a2 = a * a;
            const double ra = p_rounding(a, p_rel, p_min_normal, p_sub_half);
            const double r2 = ra * ra;
#endif
#pragma unroll
            for (int n = 0; n < COLS; ++n) {
                const double v = vk[j * D + c + 16 * n];
                acc_k[n] = fma(a, v, acc_k[n]);
                acc_a[n] = fma(a, fabs(v), acc_a[n]);
                acc_e[n] = fma(b, ve[j * D + c + 16 * n], acc_e[n]);
#if REF_SPREAD
                acc_pp[n] = fma(a2, v * v, acc_pp[n]);
                acc_rr[n] = fma(r2, v * v, acc_rr[n]);
#endif
            }
        }
    }
    l_k = lanes_sum(l_k);
    l_e = lanes_sum(l_e);
    n_sub = lanes_sum(n_sub);

    if (r < n_rows) {
        const size_t row = (size_t)first + r;
        for (int n = 0; n < COLS; ++n) {
            const size_t at = row * D + c + 16 * n;
            o_k[at] = acc_k[n];
            o_a[at] = acc_a[n];
            o_e[at] = acc_e[n];
#if REF_SPREAD
            o_pp[at] = acc_pp[n];
            o_rr[at] = acc_rr[n];
#endif
        }
        if (c == 0) {
            stats[row * 4 + 0] = l_k;
            stats[row * 4 + 1] = l_e;
            stats[row * 4 + 2] = shift;
            stats[row * 4 + 3] = n_sub;
        }
    }
}
