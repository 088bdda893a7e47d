// scripts/stage_d/probe.cu — the Stage-D kernel (cuda/sdpa_fp8_stage_d_wgmma.cu) on its own, before
// the runner: builds the tensor maps as the runner will, runs each problem, checks sampled rows
// against a host f64 reference (rel. RMSE < 5%, no non-finite element, rows that see no key
// exactly 0) and, with `perf`, times it; with `timeline` (a build with -DDIAG_TIMELINE=X) it
// prints where CTA (X, 0) spends each tile; with `spans` (-DDIAG_SPANS) where a launch's SM time
// goes beside its tiles. Driven by scripts/stage_d/probe.sh on the device.

#include <cuda.h>
#include <cuda_runtime.h>
#include <cuda_fp8.h>
#include <cuda_fp16.h>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <cmath>
#include <vector>
#include <random>
#include <algorithm>
#include <string>
#include <climits>
#include "../../cuda/sdpa_fp8_stage_d_wgmma.cu"

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); exit(3);} } while (0)
#define CU(x) do { CUresult e = (x); if (e != CUDA_SUCCESS) { const char* s; cuGetErrorString(e, &s); printf("CU %s at %s:%d\n", s, __FILE__, __LINE__); exit(3);} } while (0)

struct Prob { int B, H, Hkv, Sq, Sk, D, causal; };

static TmaDesc make_map(void* base, int D, int rows, int heads, int box_rows, bool swz) {
    CUtensorMap m;
    cuuint64_t dims[3] = {(cuuint64_t)D, (cuuint64_t)rows, (cuuint64_t)heads};
    cuuint64_t strides[2] = {(cuuint64_t)D, (cuuint64_t)D * rows};
    cuuint32_t box[3] = {(cuuint32_t)D, (cuuint32_t)box_rows, 1};
    cuuint32_t es[3] = {1, 1, 1};
    CUtensorMapSwizzle sw = !swz ? CU_TENSOR_MAP_SWIZZLE_NONE : D == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
    CU(cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, base, dims, strides, box, es,
        CU_TENSOR_MAP_INTERLEAVE_NONE, sw, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
    TmaDesc t; memcpy(&t, &m, sizeof t); return t;
}

static void quantize(std::mt19937& rng, int heads, size_t per_head, std::vector<unsigned char>& codes, std::vector<float>& scales, std::vector<float>& dec, bool positive = false) {
    std::normal_distribution<float> nd(0.f, 1.f);
    codes.resize(heads * per_head); scales.resize(heads); dec.resize(heads * per_head);
    std::vector<float> x(per_head);
    for (int h = 0; h < heads; ++h) {
        float amax = 0;
        for (auto& v : x) { v = positive ? std::fabs(nd(rng)) + 0.5f : nd(rng) * 2.f; amax = std::max(amax, std::fabs(v)); }
        float s = amax / 448.f; scales[h] = s;
        for (size_t i = 0; i < per_head; ++i) {
            __nv_fp8_e4m3 c(x[i] / s);
            codes[h * per_head + i] = *(unsigned char*)&c;
            dec[h * per_head + i] = (float)c;
        }
    }
}

// The mean time of one launch in µs: 3 warm-ups, then 10, 40, ... launches back to back between
// the events a and z until they take over 20 ms (or 20,000 launches).
template <class F>
static double mean_launch_us(F launch, cudaEvent_t a, cudaEvent_t z) {
    for (int w = 0; w < 3; ++w) launch();
    int iters = 10; float ms = 0;
    for (;;) {
        cudaEventRecord(a); for (int w = 0; w < iters; ++w) launch(); cudaEventRecord(z);
        CK(cudaEventSynchronize(z)); cudaEventElapsedTime(&ms, a, z);
        if (ms > 20 || iters >= 20000) break;
        iters *= 4;
    }
    return ms * 1000.0 / iters;
}

#ifdef DIAG_TIMELINE
// One CTA's clock64 stamps (the kernel's TL_STAMP): per tile, the producer's waits (empty,
// v_full), its transpose and its next issue; each consumer's waits (k_full, vt_full), Q·Kᵀ,
// softmax, P·V and O update, in cycles. Prints the first tiles and the mean over the middle ones.
template <class F>
static void print_timeline(F launch, const Prob& p) {
    static long long tl[4][TL_TILES][TL_EVENTS];
    const int BLOCK_M = p.D == 64 ? Tiles<64>::BLOCK_M : Tiles<128>::BLOCK_M;
    const int CONSUMERS = p.D == 64 ? Tiles<64>::CONSUMERS : Tiles<128>::CONSUMERS;
    // CTA (X, 0) of the grid: query tile X, or with the heads first (causal) head X's last tile.
    const int tiles = (p.Sq + BLOCK_M - 1) / BLOCK_M;
    const bool heads_x = p.causal && CAUSAL_HEADS_FIRST;
    if (DIAG_TIMELINE >= (heads_x ? p.B * p.H : tiles)) {
        printf("timeline: CTA (%d, 0) does not exist (%s %d)\n", DIAG_TIMELINE,
               heads_x ? "B*H" : "query tiles", heads_x ? p.B * p.H : tiles);
        return;
    }
    for (int w = 0; w < 3; ++w) launch();
    launch();
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpyFromSymbol(tl, sdpa_timeline, sizeof tl));
    int n = std::min(TL_TILES, (p.Sk + BLOCK_N - 1) / BLOCK_N);
    if (p.causal) {
        const int mb = heads_x ? tiles - 1 : tiles - 1 - DIAG_TIMELINE; // heaviest first
        n = std::min(n, (std::min(p.Sk, (mb + 1) * BLOCK_M + p.Sk - p.Sq) + BLOCK_N - 1) / BLOCK_N);
    }
    long long t0 = tl[0][0][0];
    // A consumer whose rows all lie past S_q stamps nothing (its stamps stay 0).
    for (int w = 1; w <= CONSUMERS; ++w)
        if (tl[w][0][0] != 0) t0 = std::min(t0, tl[w][0][0]);
    printf("timeline d=%d causal=%d, CTA (%d, 0), %d tiles, cycles from its first stamp\n", p.D, p.causal, DIAG_TIMELINE, n);
    printf("  tile | P: start, after: empty v_full transpose issue | C: start, after: k qk softmax vt pv update\n");
    for (int j = 0; j < std::min(n, 8); ++j) {
        printf("  %3d | P %6lld %6lld %6lld %6lld %6lld", j, tl[0][j][0] - t0, tl[0][j][1] - t0, tl[0][j][2] - t0, tl[0][j][3] - t0, tl[0][j][4] - t0);
        for (int w = 1; w <= CONSUMERS; ++w) {
            printf(" | C%d", w - 1);
            for (int e = 0; e < 7; ++e) printf(" %6lld", tl[w][j][e] - t0);
        }
        printf("\n");
    }
    // mean step durations over tiles [lo, hi)
    const int lo = std::min(4, n), hi = std::max(lo, n - 2);
    if (hi <= lo) return;
    const char* pn[] = {"wait empty", "wait v_full", "transpose+arrive", "wait empty+issue next"};
    const char* cn[] = {"wait k_full", "Q.K^T issue+wait", "softmax", "wait vt_full", "P.V issue+wait", "O update", "to next tile"};
    double per_tile = double(tl[1][hi][0] - tl[1][lo][0]) / (hi - lo);
    printf("  mean over tiles %d..%d: %.0f cycles a tile (consumer 0)\n", lo, hi - 1, per_tile);
    for (int e = 0; e < 4; ++e) {
        double sum = 0;
        for (int j = lo; j < hi; ++j) sum += tl[0][j][e + 1] - tl[0][j][e];
        printf("    producer %-22s %7.0f\n", pn[e], sum / (hi - lo));
    }
    for (int w = 1; w <= CONSUMERS; ++w) {
        for (int e = 0; e < 7; ++e) {
            double sum = 0;
            for (int j = lo; j < hi; ++j) sum += (e < 6 ? tl[w][j][e + 1] : tl[w][j + 1][0]) - tl[w][j][e];
            printf("    consumer %d %-20s %7.0f\n", w - 1, cn[e], sum / (hi - lo));
        }
        if (w == 1) continue;
        double lag = 0;
        for (int j = lo; j < hi; ++j) lag += tl[w][j][2] - tl[1][j][2];
        printf("    consumer %d Q.K^T done after consumer 0's by %.0f\n", w - 1, lag / (hi - lo));
    }
}
#endif

#ifdef DIAG_SPANS
// Where one launch's SM time goes (the kernel's SP_STAMP): 3 warm-ups, then one launch between
// events with the stamps cleared. Each SM runs its CTAs one after another (one CTA an SM); its
// time from the launch's first CTA start to its last CTA end (%globaltimer) is split into: idle
// before its first CTA ("head"), each CTA's start (to its barriers set up, to the CTA's
// __syncthreads, to Q landed, then to consumer 0's first S),
// consumer 0's first four tiles after that and its later ones, the other consumers' last tiles
// after consumer 0's ("skew"), the epilogue (to the last consumer's first store, then its
// stores), the gaps between one CTA's end and the next one's
// start on the SM, and idle after its last CTA ("tail"). Cycles become ns at the clock the
// CTAs ran at (their clock64 over %globaltimer). The later tiles' figure a tile runs a little
// high: it divides tile 4's S to the end of the last tile, which holds the last tile's part
// after its S too, by the tiles after tile 4.
template <class F>
static void print_spans(F launch, const Prob& p, unsigned ctas, int sms) {
    static long long sp[SP_CTAS][SP_EVENTS];
    if (ctas > (unsigned)SP_CTAS) { printf("spans: %u CTAs, more than %d\n", ctas, SP_CTAS); return; }
    for (int w = 0; w < 3; ++w) launch();
    void* sym; CK(cudaGetSymbolAddress(&sym, sdpa_spans)); CK(cudaMemset(sym, 0, sizeof sp));
    cudaEvent_t a, z; cudaEventCreate(&a); cudaEventCreate(&z);
    cudaEventRecord(a); launch(); cudaEventRecord(z); CK(cudaEventSynchronize(z));
    float ms; cudaEventElapsedTime(&ms, a, z);
    CK(cudaMemcpyFromSymbol(sp, sdpa_spans, sizeof sp));
    struct Cta { long long sm, tiles, g0, g1, c0, init, synced, issued, q, s0, s4, last0, lastmax, prestore, end; };
    std::vector<Cta> v;
    long long G0 = LLONG_MAX, G1 = 0; double ck_sum = 0, ns_sum = 0;
    for (unsigned i = 0; i < ctas; ++i) {
        const long long* e = sp[i];
        if (e[SP_CK_ENTRY] == 0) { printf("spans: CTA %u has no start stamp\n", i); return; }
        Cta c{e[SP_SM], e[SP_TILES], e[SP_GT_ENTRY], 0, e[SP_CK_ENTRY], e[SP_CK_INIT], e[SP_CK_SYNCED], e[SP_CK_ISSUED], e[SP_CK_Q], e[SP_CK_FIRST_S], e[SP_CK_TILE4], e[SP_CK_LAST], 0, 0, 0};
        for (int k = 0; k < 3; ++k) {
            c.lastmax = std::max(c.lastmax, e[SP_CK_LAST + k]);
            if (e[SP_CK_END + k] > c.end) { c.end = e[SP_CK_END + k]; c.prestore = e[SP_CK_PRESTORE + k]; }
            c.g1 = std::max(c.g1, e[SP_GT_END + k]);
        }
        if (c.tiles == 0 || c.end == 0) continue; // a CTA without work (none in spans' problems)
        G0 = std::min(G0, c.g0); G1 = std::max(G1, c.g1);
        ck_sum += c.end - c.c0; ns_sum += c.g1 - c.g0;
        v.push_back(c);
    }
    const double ghz = ck_sum / ns_sum; // cycles a ns
    std::sort(v.begin(), v.end(), [](const Cta& x, const Cta& y) { return x.sm != y.sm ? x.sm < y.sm : x.c0 < y.c0; });
    // Shares of the SMs' time, ns.
    enum { HEAD, TO_INIT, TO_SYNC, TO_Q, TO_S, EARLY, LATER, SKEW, EPI_PRE, EPI_STORE, GAP, TAIL, N };
    const char* names[N] = {"idle before first CTA", "start: to barriers set up", "start: to the CTA's barrier",
                            "start: to Q landed",
                            "start: to first S", "consumer 0, tiles 1-4", "consumer 0, later tiles",
                            "others' last tiles after c0", "epilogue: to first store",
                            "epilogue: stores (last consumer)", "gaps between CTAs", "idle after last CTA"};
    double part[N] = {};
    int used_sms = 0; double later_tiles = 0, early_tiles = 0, issue_at = 0, q_after_issue = 0;
    for (size_t i = 0; i < v.size(); ++i) {
        const Cta& c = v[i];
        const bool first = i == 0 || v[i - 1].sm != c.sm, last = i + 1 == v.size() || v[i + 1].sm != c.sm;
        if (first) { part[HEAD] += c.g0 - G0; used_sms++; }
        if (last) part[TAIL] += G1 - c.g1;
        else part[GAP] += (v[i + 1].c0 - c.end) / ghz;
        part[TO_INIT] += (c.init - c.c0) / ghz;
        part[TO_SYNC] += (c.synced - c.init) / ghz;
        part[TO_Q] += (c.q - c.synced) / ghz;
        issue_at += c.issued - c.c0; q_after_issue += c.q - c.issued;
        part[TO_S] += (c.s0 - c.q) / ghz;
        const long long mid = c.tiles > 4 && c.s4 ? c.s4 : c.s0;
        part[EARLY] += (mid - c.s0) / ghz;
        part[LATER] += (c.last0 - mid) / ghz;
        part[SKEW] += (c.lastmax - c.last0) / ghz;
        part[EPI_PRE] += (c.prestore - c.lastmax) / ghz;
        part[EPI_STORE] += (c.end - c.prestore) / ghz;
        if (c.tiles > 4 && c.s4) { early_tiles += 4; later_tiles += c.tiles - 5; }
    }
    part[HEAD] += (double)(sms - used_sms) * (G1 - G0); // SMs that ran nothing
    const double total = (double)sms * (G1 - G0);
    double acc = 0; for (double x : part) acc += x;
    printf("spans %dx%dx%d sq=%d sk=%d d=%d causal=%d: %u CTAs on %d SMs, event %.1f us, first start to last end %.1f us, clock %.2f GHz\n",
           p.B, p.H, p.Hkv, p.Sq, p.Sk, p.D, p.causal, ctas, used_sms, ms * 1e3, (G1 - G0) * 1e-3, ghz);
    for (int k = 0; k < N; ++k)
        printf("    %-30s %6.2f%%  %8.0f cycles a CTA\n", names[k], 100 * part[k] / total, part[k] * ghz / v.size());
    printf("    %-30s %6.2f%%  (sum of the above)\n", "accounted", 100 * acc / total);
    printf("    first loads issued %.0f cycles after the CTA's start, Q landed %.0f cycles after that\n",
           issue_at / v.size(), q_after_issue / v.size());
    if (early_tiles > 0 && later_tiles > 0)
        printf("    consumer 0 a tile: %.0f cycles in tiles 1-4, %.0f after\n",
               part[EARLY] * ghz / early_tiles, part[LATER] * ghz / later_tiles);
    fflush(stdout);
}
#endif

int main(int argc, char** argv) {
    std::vector<Prob> probs = {
        {1, 2, 2, 128, 128, 64, 0}, {1, 2, 2, 128, 128, 128, 0}, {1, 2, 1, 77, 300, 64, 0},
        {2, 4, 2, 129, 129, 128, 1}, {1, 2, 2, 1, 1, 64, 0}, {1, 4, 1, 113, 203, 128, 1},
        {1, 2, 2, 239, 1, 64, 1}, {1, 2, 2, 300, 100, 128, 1}, {2, 8, 1, 1, 8192, 128, 0},
        {1, 4, 4, 1000, 1000, 64, 1}, {1, 3, 3, 256, 512, 128, 0},
    };
    bool perf = argc > 1 && std::string(argv[1]) == "perf";
    const bool sampled = perf || (argc > 1 && std::string(argv[1]) == "spans"); // few rows checked
    bool quick = argc > 1 && std::string(argv[1]) == "quick";
    // timeline (a build with -DDIAG_TIMELINE=X): where one CTA's warpgroups spend each tile.
    bool timeline = argc > 1 && std::string(argv[1]) == "timeline";
#ifndef DIAG_TIMELINE
    if (timeline) {
        printf("timeline needs a build with STAGE_D_DEFINES=-DDIAG_TIMELINE=X (X: a query tile index)\n");
        return 2;
    }
#endif
    if (timeline) probs = {{1, 16, 16, 4096, 4096, 128, 0}, {1, 16, 16, 4096, 4096, 64, 0},
                           {1, 16, 16, 4096, 4096, 128, 1}};
    // spans (a build with -DDIAG_SPANS): where each launch's SM time goes, at S_k and 2 S_k.
    bool spans = argc > 1 && std::string(argv[1]) == "spans";
#ifndef DIAG_SPANS
    if (spans) {
        printf("spans needs a build with STAGE_D_DEFINES=-DDIAG_SPANS\n");
        return 2;
    }
#endif
    if (spans) probs = {
        {1, 16, 16, 4096, 4096, 128, 0}, {1, 16, 16, 4096, 8192, 128, 0}, {4, 16, 16, 4096, 4096, 128, 0},
        {4, 16, 16, 4096, 8192, 128, 0}, {1, 16, 16, 16384, 16384, 128, 0}, {1, 16, 16, 4096, 4096, 64, 0},
        {1, 16, 16, 4096, 8192, 64, 0}, {4, 16, 16, 8192, 8192, 128, 1},
    };
    if (perf) probs = {
        {1, 16, 16, 4096, 4096, 64, 0}, {4, 16, 16, 4096, 4096, 64, 0}, {1, 16, 16, 4096, 4096, 128, 0},
        {4, 16, 16, 4096, 4096, 128, 0}, {1, 16, 16, 16384, 16384, 128, 0}, {4, 16, 16, 8192, 8192, 128, 0},
        {4, 16, 16, 8192, 8192, 128, 1}, {1, 32, 8, 4096, 4096, 128, 1},
    };
    if (quick) probs.resize(2);
    // geom: D 64 and D 128 problems at each query tile the entry runs (Tiles<D>::NARROWS: 1, 2 or 3
    // consumer warpgroups), each output compared bit for bit with the widest's, and timed.
    bool geom = argc > 1 && std::string(argv[1]) == "geom";
    if (geom) probs = {
        {1, 8, 8, 512, 512, 64, 0}, {2, 8, 8, 1000, 3000, 64, 1}, {1, 2, 2, 77, 77, 64, 0},
        {1, 4, 4, 300, 300, 64, 0}, {1, 8, 8, 2048, 2048, 64, 0}, {2, 8, 8, 2048, 2048, 64, 0},
        {1, 16, 16, 1024, 1024, 64, 0}, {1, 32, 32, 1024, 1024, 64, 0}, {1, 12, 12, 4096, 4096, 64, 0},
        {1, 16, 16, 4096, 4096, 64, 0}, {1, 16, 16, 4096, 4096, 64, 1}, {4, 16, 16, 4096, 4096, 64, 0},
        {16, 32, 8, 1, 8192, 64, 0}, {1, 32, 8, 512, 4096, 64, 1}, {1, 8, 8, 16384, 16384, 64, 0},
        {1, 8, 8, 512, 512, 128, 0}, {2, 8, 8, 1000, 3000, 128, 1}, {1, 16, 16, 1024, 1024, 128, 0},
        {1, 12, 12, 4096, 4096, 128, 0}, {1, 16, 16, 4096, 4096, 128, 0}, {1, 16, 16, 4096, 4096, 128, 1},
        {4, 16, 16, 4096, 4096, 128, 0}, {16, 32, 8, 1, 8192, 128, 0}, {1, 32, 8, 512, 4096, 128, 1},
        {1, 32, 8, 4096, 4096, 128, 1}, {1, 8, 8, 16384, 16384, 128, 0},
    };
    // mixed: unmasked problems at each grid of a mixed launch (cuda/sdpa_fp8_stage_d_wgmma.cu
    // cta_work; src/backend/cuda/launch.rs `mixed_plan`): (B·H, T) for T from the unmixed
    // tiles' count + 1 up to MIXED_SPAN more, each output compared bit for bit with the unmixed
    // launch's, and timed (the best of 3 rounds), so that the host's schedule model can be
    // checked against the measured best T. The two 1x132 problems are one wave of 192-row CTAs
    // with three consumers' rows and with two (S_q 128): the time of a CTA one unit short.
    bool mixed = argc > 1 && std::string(argv[1]) == "mixed";
    if (mixed) probs = {
        {1, 132, 132, 192, 4096, 64, 0}, {1, 132, 132, 128, 4096, 64, 0},
        {1, 132, 132, 192, 4096, 128, 0}, {1, 132, 132, 128, 4096, 128, 0},
        {1, 16, 16, 4096, 4096, 64, 0}, {1, 32, 32, 4096, 4096, 64, 0}, {1, 8, 8, 16384, 16384, 64, 0},
        {4, 16, 16, 4096, 4096, 64, 0}, {1, 12, 12, 4096, 4096, 64, 0}, {2, 8, 8, 2048, 2048, 64, 0},
        {1, 16, 16, 4096, 4096, 128, 0}, {4, 16, 16, 4096, 4096, 128, 0}, {1, 16, 16, 16384, 16384, 128, 0},
    };
    // PROBE_PROBLEMS="B,H,Hkv,Sq,Sk,D,causal;..." replaces the mode's problems (e.g. perf at S_k
    // and 2 S_k on one grid: the time of a CTA's fixed work, its start and end, beside its tiles').
    if (const char* env = getenv("PROBE_PROBLEMS")) {
        probs.clear();
        for (const char* s = env; *s;) {
            Prob q{};
            if (sscanf(s, "%d,%d,%d,%d,%d,%d,%d", &q.B, &q.H, &q.Hkv, &q.Sq, &q.Sk, &q.D, &q.causal) != 7) {
                printf("PROBE_PROBLEMS: expected B,H,Hkv,Sq,Sk,D,causal;... at \"%s\"\n", s);
                return 2;
            }
            probs.push_back(q);
            const char* semi = strchr(s, ';');
            if (!semi) break;
            s = semi + 1;
        }
    }
    CU(cuInit(0));
    int fails = 0;
    for (auto p : probs) {
        std::mt19937 rng(1234 + p.Sq * 7 + p.Sk * 13 + p.D);
        std::vector<unsigned char> qc, kc, vc; std::vector<float> qs, ks, vs, qd, kd, vd;
        quantize(rng, p.B * p.H, (size_t)p.Sq * p.D, qc, qs, qd);
        quantize(rng, p.B * p.Hkv, (size_t)p.Sk * p.D, kc, ks, kd);
        // PROBE_INPUTS=flat_positive_v: near-equal scores (Q's scale x 1e-3) and V > 0, where an
        // O accumulated over every key in FP22 steps stagnates (a build with -DMUTANT_NO_PROMOTION).
        const bool flat_pos = getenv("PROBE_INPUTS") && std::string(getenv("PROBE_INPUTS")) == "flat_positive_v";
        quantize(rng, p.B * p.Hkv, (size_t)p.Sk * p.D, vc, vs, vd, flat_pos);
        if (flat_pos) for (auto& x : qs) x *= 1e-3f;
        unsigned char *dq, *dk, *dv; float *dqs, *dks, *dvs; __half* dout;
        size_t on = (size_t)p.B * p.H * p.Sq * p.D;
        CK(cudaMalloc(&dq, qc.size())); CK(cudaMalloc(&dk, kc.size())); CK(cudaMalloc(&dv, vc.size()));
        CK(cudaMalloc(&dqs, qs.size() * 4)); CK(cudaMalloc(&dks, ks.size() * 4)); CK(cudaMalloc(&dvs, vs.size() * 4));
        CK(cudaMalloc(&dout, on * 2));
        CK(cudaMemcpy(dq, qc.data(), qc.size(), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dk, kc.data(), kc.size(), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dv, vc.data(), vc.size(), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dqs, qs.data(), qs.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dks, ks.data(), ks.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dvs, vs.data(), vs.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemset(dout, 0xFF, on * 2));
        TmaDesc tq = make_map(dq, p.D, p.Sq, p.B * p.H, 64, true);
        TmaDesc tk = make_map(dk, p.D, p.Sk, p.B * p.Hkv, BLOCK_N, true);
        TmaDesc tv = make_map(dv, p.D, p.Sk, p.B * p.Hkv, BLOCK_N, V_SWIZZLE != 0);
        float sm = 1.f / std::sqrt((float)p.D);
        int smem = p.D == 64 ? Tiles<64>::SMEM_BYTES : Tiles<128>::SMEM_BYTES;
        int BLOCK_M = p.D == 64 ? Tiles<64>::BLOCK_M : Tiles<128>::BLOCK_M;
        int THREADS = p.D == 64 ? Tiles<64>::THREADS : Tiles<128>::THREADS;
        // The runner's grid (src/backend/cuda/launch.rs launch_dims): causal launches put the
        // heads on x where the kernel says so (CAUSAL_HEADS_FIRST, its cta_work).
        auto grid_of = [&](int rows) {
            const unsigned tiles = (p.Sq + rows - 1) / rows, heads = p.B * p.H;
            return p.causal && CAUSAL_HEADS_FIRST ? dim3(heads, tiles) : dim3(tiles, heads);
        };
        dim3 grid = grid_of(BLOCK_M);
        bool companion = false; // geom: the D 128 companion (<entry>_m128) instead of the entry
        auto launch = [&]() {
#define L(K) do { CK(cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize, smem)); \
            K<<<grid, THREADS, smem>>>(tq, tk, tv, dqs, dks, dvs, dout, p.B, p.H, p.Hkv, p.Sq, p.Sk, p.causal, sm); } while (0)
#if COMPANION_D128 == 2
            if (companion && !p.causal) { L(sdpa_fp8_stage_d_wgmma_d128_m128); return; }
            if (companion) { L(sdpa_fp8_stage_d_wgmma_d128_causal_m128); return; }
#endif
            if (p.D == 64 && !p.causal) L(sdpa_fp8_stage_d_wgmma_d64);
            else if (p.D == 64) L(sdpa_fp8_stage_d_wgmma_d64_causal);
            else if (!p.causal) L(sdpa_fp8_stage_d_wgmma_d128);
            else L(sdpa_fp8_stage_d_wgmma_d128_causal);
#undef L
        };
        if (mixed) {
            // T = 0 is the unmixed grid; then (B·H, T) for T past it.
            const int units = (p.Sq + 63) / 64, nc = BLOCK_M / 64, tn = (units + nc - 1) / nc;
            const int span = getenv("MIXED_SPAN") ? atoi(getenv("MIXED_SPAN")) : 10;
            std::vector<unsigned short> ref(on), got(on);
            cudaEvent_t a, z; cudaEventCreate(&a); cudaEventCreate(&z);
            printf("mixed %dx%dx%d sq=%d sk=%d d=%d (%d units, %d tiles of %d):", p.B, p.H, p.Hkv, p.Sq,
                   p.Sk, p.D, units, tn, nc);
            for (int T = tn; T <= std::min(tn + span, units / std::max(1, nc - 1)); ++T) {
                grid = T == tn ? grid_of(BLOCK_M) : dim3(p.B * p.H, T);
                double best = 1e30;
                for (int round = 0; round < 3; ++round) {
                    CK(cudaMemset(dout, 0xFF, on * 2));
                    launch(); CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
                    CK(cudaMemcpy(T == tn ? ref.data() : got.data(), dout, on * 2, cudaMemcpyDeviceToHost));
                    best = std::min(best, mean_launch_us(launch, a, z));
                }
                const bool same = T == tn || memcmp(ref.data(), got.data(), on * 2) == 0;
                if (!same) fails++;
                printf("  T=%d %.2f us%s", T, best, same ? "" : " BITS DIFFER");
            }
            printf("\n"); fflush(stdout);
            grid = grid_of(BLOCK_M);
            cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dqs); cudaFree(dks); cudaFree(dvs); cudaFree(dout);
            continue;
        }
        if (geom) {
            // Each consumer count in turn, 3 rounds, the best mean of each; at D 128 the
            // companion's two consumers too (slot 0: COMPANION_D128 consumers in their own function).
            const int widest = p.D == 64 ? Tiles<64>::CONSUMERS : Tiles<128>::CONSUMERS;
            const int narrowest = (p.D == 64 ? Tiles<64>::NARROWS : Tiles<128>::NARROWS) ? 1 : widest;
            const int last = p.D == 128 && COMPANION_D128 ? 0 : narrowest;
            std::vector<unsigned short> ref(on), got(on);
            double best[4] = {1e30, 1e30, 1e30, 1e30};
            bool same[4] = {true, true, true, true};
            cudaEvent_t a, z; cudaEventCreate(&a); cudaEventCreate(&z);
            for (int round = 0; round < 3; ++round)
                for (int nc = widest; nc >= last; --nc) {
                    if (nc < narrowest && nc > 0) continue;
                    companion = nc == 0;
                    const int cons = companion ? COMPANION_D128 : nc;
                    BLOCK_M = 64 * cons; THREADS = 128 * (cons + 1);
                    grid = grid_of(BLOCK_M);
                    CK(cudaMemset(dout, 0xFF, on * 2));
                    launch(); CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
                    CK(cudaMemcpy(nc == widest ? ref.data() : got.data(), dout, on * 2, cudaMemcpyDeviceToHost));
                    if (nc != widest && memcmp(ref.data(), got.data(), on * 2) != 0) same[nc] = false;
                    best[nc] = std::min(best[nc], mean_launch_us(launch, a, z));
                }
            int sms = 0; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
            printf("geom %dx%dx%d sq=%d sk=%d causal=%d:", p.B, p.H, p.Hkv, p.Sq, p.Sk, p.causal);
            for (int nc = widest; nc >= last; --nc) {
                if (nc < narrowest && nc > 0) continue;
                const int cons = nc == 0 ? COMPANION_D128 : nc;
                const int ctas = (p.Sq + 64 * cons - 1) / (64 * cons) * p.B * p.H;
                printf("  %s%d %d CTAs (%.2f waves) %.2f us%s", nc == 0 ? "companion" : "nc", cons, ctas,
                       (double)ctas / sms, best[nc],
                       nc == widest ? "" : same[nc] ? " same bits" : " BITS DIFFER");
                if (!same[nc]) fails++;
            }
            printf("\n"); fflush(stdout);
            companion = false;
            BLOCK_M = 64 * widest; THREADS = 128 * (widest + 1);
            grid = grid_of(BLOCK_M);
            cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dqs); cudaFree(dks); cudaFree(dvs); cudaFree(dout);
            continue;
        }
        launch();
        CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
        std::vector<__half> out(on);
        CK(cudaMemcpy(out.data(), dout, on * 2, cudaMemcpyDeviceToHost));
        // reference on sampled rows
        double max_err = 0, sum_err2 = 0, sum_ref2 = 0, sum_dev = 0, sum_abs = 0; long n = 0, bad = 0;
        int group = p.H / p.Hkv;
        std::vector<double> sc(p.Sk);
        // PROBE_SKIP_CHECK=1: no reference (timing rounds after a checked one); the line says SKIP.
        const bool skip_check = getenv("PROBE_SKIP_CHECK") && std::string(getenv("PROBE_SKIP_CHECK")) == "1";
        for (int bh = 0; !skip_check && bh < p.B * p.H; bh += sampled ? p.B * p.H / 3 + 1 : 1) {
            int b = bh / p.H, h = bh % p.H, kvh = b * p.Hkv + h / group;
            int stride = std::max(1, p.Sq / (sampled ? 16 : 64));
            for (int i = 0; i < p.Sq; ++i) {
                if (!(i % stride == 0 || i == p.Sq - 1 || (!sampled && ((i % BLOCK_M) < 2 || (i % BLOCK_M) > BLOCK_M - 3)))) continue;
                const float* q = &qd[((size_t)bh * p.Sq + i) * p.D];
                double mx = -1e300; int lim = p.causal ? std::min(p.Sk - 1, i + p.Sk - p.Sq) : p.Sk - 1;
                for (int j = 0; j <= lim; ++j) {
                    const float* k = &kd[((size_t)kvh * p.Sk + j) * p.D];
                    double s = 0; for (int d = 0; d < p.D; ++d) s += (double)q[d] * k[d];
                    s *= (double)qs[bh] * ks[kvh] * sm; sc[j] = s; mx = std::max(mx, s);
                }
                double den = 0;
                for (int j = 0; j <= lim; ++j) { sc[j] = std::exp(sc[j] - mx); den += sc[j]; }
                for (int d = 0; d < p.D; ++d) {
                    double num = 0;
                    for (int j = 0; j <= lim; ++j) num += sc[j] * vd[((size_t)kvh * p.Sk + j) * p.D + d];
                    double ref = lim >= 0 ? num / den * vs[kvh] : 0.0;
                    float got = __half2float(out[((size_t)bh * p.Sq + i) * p.D + d]);
                    if (!std::isfinite(got)) { bad++; continue; }
                    if (lim < 0 && got != 0.f) bad++;
                    sum_dev += got - ref; sum_abs += std::fabs(ref);
                    double e = std::fabs(got - ref); max_err = std::max(max_err, e); sum_err2 += e * e; sum_ref2 += ref * ref; n++;
                }
            }
        }
        double rel_rmse = std::sqrt(sum_err2 / std::max(1.0, sum_ref2));
        bool ok = bad == 0 && rel_rmse < 0.05;
        if (!ok) fails++;
        double us = 0, tflops = 0;
#ifdef DIAG_TIMELINE
        if (timeline) print_timeline(launch, p);
#endif
#ifdef DIAG_SPANS
        if (spans) {
            int sms = 0; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
            print_spans(launch, p, grid.x * grid.y, sms);
        }
#endif
        if (perf) {
            cudaEvent_t a, z; cudaEventCreate(&a); cudaEventCreate(&z);
            for (int w = 0; w < 3; ++w) launch();
            int iters = 20; cudaEventRecord(a);
            for (int w = 0; w < iters; ++w) launch();
            cudaEventRecord(z); CK(cudaEventSynchronize(z)); float ms; cudaEventElapsedTime(&ms, a, z); us = ms * 1000 / iters;
            double pairs = 0; for (int i = 0; i < p.Sq; ++i) pairs += p.causal ? std::max(0, std::min(p.Sk, i + p.Sk - p.Sq + 1)) : p.Sk;
            tflops = 4.0 * p.B * p.H * p.D * pairs / (us * 1e-6) / 1e12;
        }
        printf("%s %dx%dx%d sq=%d sk=%d d=%d causal=%d: rel_rmse=%.4f bias=%+.4f max_err=%.4g nonfinite=%ld checked=%ld  %.1f us %.1f TFLOP/s\n",
               !ok ? "FAIL" : skip_check ? "SKIP" : "PASS", p.B, p.H, p.Hkv, p.Sq, p.Sk, p.D, p.causal, rel_rmse, sum_dev / std::max(1e-30, sum_abs), max_err, bad, n, us, tflops);
        fflush(stdout);
        cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dqs); cudaFree(dks); cudaFree(dvs); cudaFree(dout);
    }
    printf("%d failed\n", fails);
    return fails ? 1 : 0;
}
