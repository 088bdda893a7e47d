// sdpa_fp8_stage_d_wgmma.cu — Stage-D FP8 scaled-dot-product attention, Hopper-native (sm_90a):
// wgmma with e4m3 operands for both GEMMs, TMA loads into a shared-memory ring with mbarriers,
// a producer warpgroup and three consumer warpgroups (two in D 128's companion function) with
// register reallocation.
//
// Problem (the same as Stage C, cuda/sdpa_fp8_stage_c_mma.cu): O = softmax(softmax_scale · Q Kᵀ
// + mask) V for Q [B, H, S_q, D] and K, V [B, H_kv, S_k, D] as E4M3 codes with one f32 scale per
// (batch, head) per tensor (K and V per K/V head); O is f16 [B, H, S_q, D]. D is 64 or 128,
// causal bottom-right aligned (query i sees keys j <= i + S_k - S_q), GQA/MQA (query head h
// reads K/V head h / (H / H_kv)), any S_q, S_k >= 1. A row that sees no key is written as zeros.
//
// Tiles (all in the traits struct `Tiles<D, C>` below, one per function: a head dim's entries are
// Tiles<D>, its companion Tiles<D, COMPANION_D<D>>):
//   BLOCK_M = 64 x CONSUMERS query rows per CTA, CONSUMERS = 3 in the entries of both head dims
//     (192 rows): consumer warpgroup c owns rows [64c, 64c + 64). An entry without turns of its
//     own also runs fewer consumers, as many as the launch's warpgroups past the producer's
//     (Tiles::NARROWS, published as SDPA_NARROW_ROWS_D<D> = 64): at D 64 the host launches one
//     consumer (64 rows, 256 threads, two CTAs an SM) where those CTAs end sooner (docs/PERF.md
//     change 23). At D 128 the narrower tile is a function of its own, the entry's companion
//     `<entry>_m128` (two consumers with 224 registers and turns, where a two-consumer launch of
//     the entry would have 160 and P·V in halves: docs/PERF.md "Stage D, change 27"; published as
//     SDPA_COMPANION_ROWS_D128 = 128 and SDPA_COMPANION_THREADS_D128 = 384). A row's steps, and
//     so its bits, are the same in any CTA of either function.
//   BLOCK_N = 128 keys per KV tile. KV_STAGES (2 or 3) tiles in flight.
//
// Warp roles (THREADS = 128 x (1 + CONSUMERS): 512 in the entries (fewer for a narrower tile,
// above), 384 in the D 128 companion; registers by setmaxnreg within the launch's pool, producer
// / consumers: 32 / 160 with three consumers, 56 / 224 with two):
//   WG 0, producer (setmaxnreg.dec): thread 0 issues the TMA loads (Q once; per KV tile
//     its K tile and its V tile); all 128 threads then transpose each V tile into Vᵀ (below;
//     ldmatrix.trans, prmt, stmatrix: transpose_v_ldsm),
//     fence the async proxy and arrive on the tile's vt_full barrier.
//   WG 1 .. CONSUMERS, consumers (setmaxnreg.inc): per KV tile, S = Q Kᵀ (D/32 wgmma m64n128k32,
//     both operands from shared memory), mask (only in the tiles that need it: change 19), online
//     softmax in f32 (base 2, the scale fused into the exponent's fma; the row maxima as integers
//     in the entries without turns but D 128's causal one: INT_ROWMAX), P rounded to e4m3
//     (cvt.rn.satfinite) straight into wgmma A fragments, then Ô = P̂ Vᵀ (BLOCK_N/32 wgmma
//     m64nDk32, A from registers) into a per-tile accumulator that is added to O in f32 (the
//     tensor cores' FP8 accumulation keeps fewer than 24 bits: SageAttention2, arXiv 2411.10958,
//     "FP22 accumulator"); then they release the stage (empty barrier). In the D 128 companion the
//     two consumers take turns from the softmax to P·V's issue (TWO_TURNS_D128=3, turn_wait), as
//     the D 128 entry's two did before change 27 (PINGPONG_D128=3): one's softmax runs
//     while the other's GEMMs hold the tensor cores, and the two softmaxes never share the pipes
//     (docs/PERF.md change 21: without turns the two ran in step, their softmaxes at once, and a
//     D 128 tile took 2,900 cycles where it takes 2,460 with them). Three consumers (the
//     entries of both head dims) run without turns (docs/PERF.md change 22: 12-17% faster than two with turns at
//     4x16x4096x64 on an H100, but up to 25% slower on problems of less than one wave of CTAs,
//     which change 23 launches with one consumer a CTA instead: BLOCK_M above), and start
//     out of step: consumer c waits c x STAGGER_D<D> (500 at D 64, 800 at D 128) cycles once Q
//     has landed, so that their exponentials and GEMMs do not all fall on the same cycles
//     (change 24: 3-6% faster at 4x16x4096x64 and 1x16x4096x64 over 32 tiles a CTA, the same
//     bits; change 28 at D 128: 1-3%; that they stay apart is inferred from the time, not
//     traced).
//     Without turns, a consumer whose rows all lie past S_q only releases each stage.
//   Row sum l is summed from the f32 P before rounding (as FlashAttention-3 does; ROW_SUM_MMA=1,
//   off, would take it as P̂·1 on the tensor cores instead: the switch list); the end
//   writes f16(O · v_scale / l), zero where l = 0, through the consumer's Q tile (STAGED_O).
//
// Shared memory (dynamic, base aligned to 1024 bytes; every tile starts at a multiple of 1024):
//   Q      BLOCK_M x D codes, TMA swizzle of D bytes (64B or 128B), K-major for wgmma A. At the
//          end, consumer c's 64 x D bytes hold half of its O rows' dims at a time, as f16 in
//          16-byte chunks XOR-swizzled by row (STAGED_O), on their way to global memory.
//   per stage s < KV_STAGES:
//     K[s]   BLOCK_N x D codes, swizzle of D bytes, K-major for wgmma B of Q Kᵀ.
//     V[s]   BLOCK_N x D codes as TMA writes them, [key][dim]: unswizzled, or (V_SWIZZLE=1)
//            swizzled like K, which lets the transpose read and write with 2-way bank
//            conflicts instead of 16-way stores (transpose_v).
//     Vt[s]  D x BLOCK_N codes, 128B swizzle, K-major for wgmma B of P Vᵀ: FP8 wgmma reads only
//            K-major operands, so V must be transposed. Within each 32-key block, column
//            (logical key) 16h + 4t + i holds physical key 16h + 8(i / 2) + 2t + i % 2: the keys
//            a consumer thread holds in its S accumulators (cols 2t, 2t+1 of each 8-key group)
//            become its A fragment without any shuffle (the K dimension of P Vᵀ may be permuted
//            freely, as long as P and Vᵀ agree).
//     ones[s] (ROW_SUM_MMA only) 8 x BLOCK_N e4m3 ones right after Vt[s] (its 8-row group
//            after Vᵀ's last), which P·V's wider last wgmma reads as 8 more columns: P̂·1.
//   mbarriers (static): q_full; per stage k_full, v_full (TMA, count 1 + tx), vt_full (128
//   producer threads), empty (128 x the CTA's consumers' threads). Named barriers 1 .. the
//   launch's consumers: their turns (where PINGPONG_D<D> is not 0, or TWO_TURNS_D<D> in a
//   two-consumer launch).
//
// Causal: the CTA's KV tiles end at its last row's last visible key (tiles wholly above the
// diagonal are never loaded); the tiles the diagonal crosses, and the tile holding S_k, are
// masked per element. Causal CTAs are scheduled heaviest first over the whole grid (cta_work).
//
// Switches (build-time defines; the runner passes them from cuda/kernels.toml or --define):
//   KV_STAGES=2|3   the depth of the K/V ring (the A/B variants st2 and st3).
//   V_SWIZZLE=0|1   V's layout in shared memory (above); published as SDPA_V_SWIZZLE, from
//                   which the host builds V's tensor map. 1 is 15-20% faster at D 128 (15%
//                   causal) and 4% at D 64 on an H100 (docs/PERF.md, change 12); the default
//                   is 1 (0 is kept as the reference layout for A/Bs).
//   TRANSPOSE_LDSM=0|1  how the producer transposes V (transpose_v_ldsm): 1, the default (it
//                   follows V_SWIZZLE), ldmatrix.trans / prmt / stmatrix, 6 instructions a lane
//                   per 16 bytes; 0 the 32-bit words of transpose_v, 14. The same Vt bytes, so
//                   the same output bits; 1 is 17-20% faster at D 128, 10% at D 64 and causal on
//                   an H100 (docs/PERF.md change 18). 1 needs V_SWIZZLE=1.
//   INT_ROWMAX=0|1  1, the default: in the entries without turns of their own (D 64's, D 128's
//                   192-row entry but its causal one), a row's maximum over a tile's scores is
//                   taken as signed integers by three-input maxima (row_maxima_int: VIMNMX3,
//                   half of fmaxf's instructions), by three-input minima where a thread's
//                   scores of the row are all negative: the same bits. Against 0 on an H100:
//                   3-5% faster on those entries where no thread of a warp has a row all below
//                   zero, 2-5% slower where half of them do (dist=negative); 3% slower in the
//                   D 128 companion (turns), and the D 128 causal entry's st3 build spills with
//                   it (docs/PERF.md "Stage D, change 29").
//   TRANSPOSE_LANE_ORDER=0|1  (with TRANSPOSE_LDSM=0) 1: each lane takes the V transpose's four loads
//                   and four stores in a lane-dependent order, which makes both conflict-free
//                   (transpose_v); 0, the default: every lane in the same order, 2-way. 1 is
//                   3-6% slower on an H100 (docs/PERF.md, change 13): the transpose is not bound
//                   by its bank conflicts but by the producer's instructions, and 1 adds eight
//                   selects a unit. Kept as a switch so that the next attempt starts from it.
//   PINGPONG_D64, PINGPONG_D128 = 0|1|2|3  each head dim's consumer turns (turn_wait),
//                   published as SDPA_PINGPONG_D64 and _D128. 3, the default with two consumers:
//                   a turn runs from the softmax to P·V's issue; over 0 (and 2 at D 128 causal)
//                   with the same producer, +3-10% st2 and +5-13% st3 on an H100 (docs/PERF.md
//                   change 21). 0, the default with three: no turns (one turn at a time was no
//                   faster than two consumers with turns: change 21). 1: a turn at each GEMM's
//                   issue, slower than 0 (changes 12 and 21). 2: a turn at Q·Kᵀ's issue, the
//                   default of changes 16-20 for the D = 128 causal entry.
//   CONSUMERS_D64, CONSUMERS_D128 = 2|3  consumer warpgroups of each head dim's entries
//                   (BLOCK_M = 64 x consumers; defaults 3 and 3). Three at D 128 (160 registers
//                   each, the producer 32) run P·V in halves of D (Tiles::PV_HALVES: a whole Ô
//                   beside O, S and P spilled): 3-10% faster than two on problems of many CTAs
//                   on an H100, 5-9% slower on the rest (docs/PERF.md "Stage D, change 24 and a
//                   profile of D 128"), which the companion runs (COMPANION_D128). The geometry
//                   is published (SDPA_BLOCK_M and SDPA_THREADS for D 64, SDPA_BLOCK_M_D128 and
//                   SDPA_THREADS_D128) and checked against cuda/kernels.toml's tiles; with
//                   CONSUMERS_D128=2 (and no companion) the manifest's block_m_d128 must be 128.
//   COMPANION_D64, COMPANION_D128 = 0|2  the consumers of a second function each of the head
//                   dim's modules holds beside its entry, `<entry>_m128`: its own registers
//                   (224 a consumer with two), turns (TWO_TURNS_D<D>) and whole P·V. Defaults 0
//                   and 2 (2 where CONSUMERS_D128 is 3); the host launches it for the manifest's
//                   narrower tile of its rows (tiles.narrow_d128), with the entry's shared
//                   memory (Tiles<D, C>::SMEM_BYTES must not exceed it: checked below).
//   TWO_TURNS_D64, TWO_TURNS_D128 = 0|1|2|3  the turns (as PINGPONG) of two consumers where the
//                   head dim's entry has three: a two-consumer launch of the entry (taken only
//                   where both consumers have rows), and the companion's own turns; defaults 0
//                   and 3 (published as SDPA_TWO_TURNS_D64 and _D128, which are 0 unless the
//                   entry has three consumers).
//   STAGGER_D64, STAGGER_D128 = cycles  where consumers take no turns, consumer c starts c x
//                   STAGGER_D<D> cycles after the first (defaults 500 and 800; published as
//                   SDPA_STAGGER_D64 and _D128); a consumer with no rows never waits. At D 64,
//                   0 is 1.5-6% slower on problems of many 192-row CTAs (4x16x4096x64: 4-6%),
//                   300, 500 and 800 alike (docs/PERF.md change 24). At D 128 (the 192-row
//                   entry of change 27; the companion takes turns), 800 is 0.6-3% faster than
//                   0 on an H200, 600 0.3-2.3% on both GPUs (docs/PERF.md change 28).
//   SDPA_D=64|128, SDPA_CAUSAL=0|1   the entry this module holds (unset: all four).
//   MUTANT_*        planted bugs for `sdpa-runner selftest`, never set in normal builds.
//   SDPA_DELAY_CYCLES=N  test hook, never set in normal builds: thread 0 of every CTA spins N
//                   clock cycles after the barriers' init, before the CTA's first barrier, a
//                   planted slowdown for the PR gate's SLOWER verdict (as Stage C's).
//   CAUSAL_HEADS_FIRST=0|1  the grid of a causal launch (cta_work): 1, the default, (B·H,
//                   query tiles), every head's last query tile first; 0 (query tiles, B·H),
//                   each head's from its last, head after head. Published as
//                   SDPA_CAUSAL_HEADS_FIRST, from which the host builds the grid. 1 is up
//                   to 24% faster on causal problems of many query tiles, on an H100 and an
//                   H200, the same elsewhere (docs/PERF.md "Stage C and D, change 36").
//   STAGED_O=0|1    how the epilogue writes O: 1, the default, through the consumer's own Q tile
//                   in shared memory (swizzled 32-bit stores, then 16-byte loads and 16-byte
//                   global stores of each half row's D bytes, half the dims at a time); 0,
//                   straight from the accumulators, 4 bytes a thread a store (8 rows x 16 bytes
//                   a warp store). The same values, so the same bits. On an H200 1 is 2-6.6%
//                   faster on the 4,096-key, causal and GQA D 128 problems and up to 3.4% slower
//                   on problems of a few query rows (docs/PERF.md "Stage D, change 38"). Since
//                   change 39 the unmasked D 128 companion's warps of fewer than 16 rows store
//                   straight (DIRECT_FEW: cfg-pack 2.6-3.8% faster); D 64's few-row problems
//                   keep up to 2.7% of the loss.
//   ROW_SUM_MMA=0|1  how l is summed: 0, the default, from the f32 P in the softmax (64 FADD a
//                   tile, then the quad's shuffles at the end: the manifest's row_sum "f32-p");
//                   1, as P̂·1 on the tensor cores: the last (or only) P·V of a tile is 8
//                   columns wider (m64n72k32 or m64n136k32) and reads 8 rows of e4m3 ones kept
//                   after each stage's Vᵀ (Tiles::ONES_BYTES, 1 KB a stage), so its Ô carries l's
//                   tile sum in FP22 steps, folded in f32 as O's is (manifest row_sum "mma").
//                   Published as SDPA_ROW_SUM_MMA; the host refuses a build whose value the
//                   manifest does not describe. Not the default: its numerics are not yet in the
//                   FP8 error model (src/reference/model.rs sums l in f32), and NVRTC 13.0
//                   spills 12 and 24 bytes in D 64's entries at st2 (4 more accumulators at 160
//                   registers), and ptxas serializes the D 128 entry's wgmma pipeline (C7511,
//                   insufficient registers: st2 under NVRTC 13.0, st2 and st3 under the
//                   device's nvcc), which made it 5-9% slower than 0 on unmasked D 128
//                   problems in the probe and 2-3% faster causal; at D 64 1.5-3.6% faster at
//                   st2, not from the sums (dropping them bought nothing there); and at st3
//                   D 128 needs 176,240 bytes of shared memory, over the manifest's 173,168
//                   (docs/PERF.md "Stage D, stop 64"). 0 builds the same SASS as before the
//                   switch (NVRTC 13.0, the 6 functions of st2 and of st3).
//   DIAG_TIMELINE=X  diagnostic, never in normal builds: thread 0 of each warpgroup of CTA
//                   (X, 0) of the grid (causal: head X's last query tile) stamps clock64() at
//                   each step of its first TL_TILES tiles into sdpa_timeline, which
//                   scripts/stage_d/probe.cu `timeline` reads and prints.
//   DIAG_SPANS      diagnostic, never in normal builds: thread 0 of each warpgroup of every CTA
//                   stamps its SM, its start, Q's landing, its first and fifth S, each
//                   consumer's last tile and end into sdpa_spans, which scripts/stage_d/probe.cu
//                   `spans` reads: where a launch's SM time goes (start, tiles, ends, the gaps
//                   between CTAs on an SM, idle SMs at its start and end).
//   DIAG_NO_TRANSPOSE  skips the V transpose (wrong output): the bound on what the transpose
//                   costs, for scripts/stage_d/variants.sh only.
//
// Launch: grid (ceil(S_q / rows), B*H) (causal with SDPA_CAUSAL_HEADS_FIRST: (B*H, ceil(S_q /
// rows)); a mixed launch, unmasked: (B*H, T) with T > ceil(S_q / rows), cta_work) with THREADS
// threads and rows = BLOCK_M (each head dim's),
// or 128 x (1 + c) threads and rows = 64c for c < CONSUMERS (the entry narrowed), or the
// companion's SDPA_COMPANION_THREADS_D<D> and _ROWS_D<D> in its own function; SDPA_SMEM_BYTES_D<D>
// bytes of dynamic shared memory; tensor maps (3-D: dim, row, batch·head) over Q [D, S_q, B·H] with box
// (D, 64) and the Q swizzle, K [D, S_k, B·H_kv] with box (D, BLOCK_N) and the K swizzle, V the
// same shape, swizzled like K if SDPA_V_SWIZZLE is 1. The host reads the SDPA_* constants below
// from the module.
#include <cuda_fp16.h>

#include "hopper_async.cuh"

#ifndef KV_STAGES
#define KV_STAGES 2
#endif
#ifndef STAGED_O
#define STAGED_O 1
#endif
#ifndef SDPA_D
#define SDPA_D 0
#endif
#ifndef SDPA_CAUSAL
#define SDPA_CAUSAL 2
#endif
#ifndef V_SWIZZLE
#define V_SWIZZLE 1
#endif
// Consumer warpgroups of each head dim's entries (BLOCK_M = 64 x consumers): three at both, D
// 128's with P·V in halves of D, where a whole Ô would spill (the switches' notes above), and a
// two-consumer companion at D 128 (COMPANION_D128). The single switches of stop 43 are gone:
// refused, so that an A/B of one of them cannot time two identical kernels.
#if defined(PINGPONG) || defined(CONSUMERS)
#error "PINGPONG and CONSUMERS are per head dim now: PINGPONG_D64, PINGPONG_D128, CONSUMERS_D64, CONSUMERS_D128"
#endif
#ifndef CONSUMERS_D64
#define CONSUMERS_D64 3
#endif
#ifndef CONSUMERS_D128
#define CONSUMERS_D128 3
#endif
// COMPANION_D<D>: the consumer warpgroups of a second function the head dim's modules hold
// beside its entries (0: none), named after its query tile (`<entry>_m128`): at D 128, two
// consumers with 224 registers each and turns, the query tile the launch takes where the
// entry's 192-row CTAs would run fewer, less full waves (docs/PERF.md "Stage D, change 27").
#ifndef COMPANION_D64
#define COMPANION_D64 0
#endif
#ifndef COMPANION_D128
#define COMPANION_D128 (CONSUMERS_D128 == 3 ? 2 : 0)
#endif
#if (COMPANION_D64 != 0 && COMPANION_D64 != 2) || (COMPANION_D128 != 0 && COMPANION_D128 != 2)
#error "COMPANION_D64 and COMPANION_D128 are 0 (none) or 2 (a two-consumer function, <entry>_m128)"
#endif
// PINGPONG_D<D>: the consumers' turns (turn_wait below): 3 with two consumers (docs/PERF.md change
// 21), none with three (change 22).
#ifndef PINGPONG_D64
#define PINGPONG_D64 (CONSUMERS_D64 == 2 ? 3 : 0)
#endif
#ifndef PINGPONG_D128
#define PINGPONG_D128 (CONSUMERS_D128 == 2 ? 3 : 0)
#endif
#if PINGPONG_D64 < 0 || PINGPONG_D64 > 3 || PINGPONG_D128 < 0 || PINGPONG_D128 > 3
#error "PINGPONG_D64 and PINGPONG_D128 must be 0, 1, 2 or 3"
#endif
// TWO_TURNS_D<D>: the turns of a two-consumer launch of an entry of three consumers (the header's
// switch list). 3 at D 128: with CONSUMERS_D128=3, two consumers with turns beat three on
// problems of few or unequal CTAs (docs/PERF.md change 24's section); 0 at D 64, whose narrower
// launch is one consumer.
#ifndef TWO_TURNS_D64
#define TWO_TURNS_D64 0
#endif
#ifndef TWO_TURNS_D128
#define TWO_TURNS_D128 3
#endif
#if TWO_TURNS_D64 < 0 || TWO_TURNS_D64 > 3 || TWO_TURNS_D128 < 0 || TWO_TURNS_D128 > 3
#error "TWO_TURNS_D64 and TWO_TURNS_D128 must be 0, 1, 2 or 3"
#endif
// STAGGER_D<D>: cycles between the starts of a CTA's consumers where they take no turns (consumer
// c waits c x STAGGER_D<D> after Q lands); published as SDPA_STAGGER_D64 and _D128.
#ifndef STAGGER_D64
#define STAGGER_D64 500
#endif
#ifndef STAGGER_D128
#define STAGGER_D128 800
#endif
#ifndef INT_ROWMAX
#define INT_ROWMAX 1
#endif
// ROW_SUM_MMA: l as P·1 on the tensor cores (the header's switch list), published as
// SDPA_ROW_SUM_MMA, which the host checks against the manifest's numerics.row_sum.
#ifndef ROW_SUM_MMA
#define ROW_SUM_MMA 0
#endif
#if ROW_SUM_MMA != 0 && ROW_SUM_MMA != 1
#error "ROW_SUM_MMA is 0 or 1"
#endif
#ifndef TRANSPOSE_LANE_ORDER
#define TRANSPOSE_LANE_ORDER 0
#endif
#ifndef SDPA_DELAY_CYCLES
#define SDPA_DELAY_CYCLES 0
#endif
// CAUSAL_HEADS_FIRST: the grid of a causal launch (cta_work), published as
// SDPA_CAUSAL_HEADS_FIRST, from which the host builds it. 1: (B·H, query tiles), the query tiles
// from the last; 0: (query tiles, B·H), each head's query tiles from the last.
#ifndef CAUSAL_HEADS_FIRST
#define CAUSAL_HEADS_FIRST 1
#endif
#if CAUSAL_HEADS_FIRST != 0 && CAUSAL_HEADS_FIRST != 1
#error "CAUSAL_HEADS_FIRST is 0 or 1"
#endif
// MIXED_TILES: whether an unmasked launch of an entry without turns of its own may mix query
// tiles of its consumers and of one fewer (cta_work), published as SDPA_MIXED_UNIT_ROWS (64, the
// rows of a consumer warpgroup; 0 where it may not), from which the host plans the grid.
#ifndef MIXED_TILES
#define MIXED_TILES 1
#endif
#if MIXED_TILES != 0 && MIXED_TILES != 1
#error "MIXED_TILES is 0 or 1"
#endif

constexpr int BLOCK_N = 128;
static_assert(KV_STAGES >= 2 && KV_STAGES <= 3, "2 or 3 stages");

// The consumer warpgroups of a head dim's own entries (CONSUMERS_D<D>).
__host__ __device__ constexpr int own_consumers(int d) { return d == 64 ? CONSUMERS_D64 : CONSUMERS_D128; }

// Everything one function is built from: warp roles, registers, tiles, shared memory. A head
// dim's entries are Tiles<D> (its own consumer count); its companion, where it has one, is
// Tiles<D, COMPANION_D<D>> (the header's switch list).
template <int D, int C = own_consumers(D)>
struct Tiles {
    static constexpr int DIM = D;
    static constexpr int CONSUMERS = C;
    // The turns: the entry's own (PINGPONG_D<D>), or a companion's (TWO_TURNS_D<D>: the turns
    // of a launch of two consumers).
    static constexpr int PINGPONG = C == own_consumers(D) ? (D == 64 ? PINGPONG_D64 : PINGPONG_D128)
                                                          : (D == 64 ? TWO_TURNS_D64 : TWO_TURNS_D128);
    static constexpr int BLOCK_M = 64 * CONSUMERS; // consumer warpgroup c owns rows [64c, 64c + 64)
    static constexpr int THREADS = 128 * (CONSUMERS + 1);
    // Without turns a CTA may run fewer consumers than CONSUMERS: as many as its launch has
    // warpgroups past the producer's (threads = 128 x (1 + consumers), rows 64 x consumers), so
    // that a problem of too few CTAs to fill the GPU runs more, narrower ones (the host picks:
    // src/backend/cuda/launch.rs `QueryTile`). An entry with turns of its own (PINGPONG) runs
    // exactly CONSUMERS; a narrowing one takes TWO_TURNS in a launch of two.
    static constexpr bool NARROWS = PINGPONG == 0;
    // Whether an unmasked launch may mix CTAs of the launch's consumers and of one fewer
    // (MIXED_TILES, cta_work): only where a CTA may leave a consumer without rows, NARROWS.
    static constexpr bool MIXES = MIXED_TILES && NARROWS;
    // Cycles between the starts of consumers without turns (STAGGER_D<D>).
    static constexpr int STAGGER = D == 64 ? STAGGER_D64 : STAGGER_D128;
    // The turns of a narrower launch of two consumers (TWO_TURNS_D<D>; 0: none).
    static constexpr int TWO_TURNS =
        NARROWS && CONSUMERS == 3 ? (D == 64 ? TWO_TURNS_D64 : TWO_TURNS_D128) : 0;
    // setmaxnreg moves registers within the CTA's pool, what the launch gave it: THREADS x the
    // launch figure (65536 / THREADS, rounded down to 8; ptxas's "Used" line).
    static constexpr int LAUNCH_REGS = 65536 / THREADS / 8 * 8;
    static constexpr int PRODUCER_REGS = CONSUMERS == 2 ? 56 : 32;
    static constexpr int CONSUMER_REGS = CONSUMERS == 2 ? 224 : 160;
    static_assert(CONSUMERS == 2 || CONSUMERS == 3, "two or three consumer warpgroups");
    static_assert(128 * PRODUCER_REGS + 128 * CONSUMERS * CONSUMER_REGS <= LAUNCH_REGS * THREADS,
                  "register pool");
    static constexpr int Q_BYTES = BLOCK_M * D;
    static constexpr int K_BYTES = BLOCK_N * D;
    static constexpr int V_BYTES = BLOCK_N * D;
    static constexpr int VT_BYTES = D * BLOCK_N;
    // ROW_SUM_MMA: each stage's Vᵀ is followed by ONES_BYTES, 8 rows of BLOCK_N e4m3 ones (one
    // 8-row core-matrix group), which P·V's last wgmma reads as 8 more output columns: P̂·1.
    static constexpr int ONES_BYTES = ROW_SUM_MMA ? 8 * BLOCK_N : 0;
    static constexpr int VT_STRIDE = VT_BYTES + ONES_BYTES; // a stage's Vᵀ and ones
    static constexpr int OFF_K = Q_BYTES;
    static constexpr int OFF_V = OFF_K + KV_STAGES * K_BYTES;
    static constexpr int OFF_VT = OFF_V + KV_STAGES * V_BYTES;
    static constexpr int SMEM_BYTES = 1024 + OFF_VT + KV_STAGES * VT_STRIDE; // + alignment slack
    static constexpr int QK_STEPS = D / 32;       // wgmma k32 steps of Q Kᵀ
    static constexpr int PV_STEPS = BLOCK_N / 32; // wgmma k32 steps of P Vᵀ
    static constexpr int O_REGS = D / 2;          // f32 accumulators per thread of 64 x D
    // P·V in halves of D (64 output dims each, one after the other, into a 32-register Ô) where
    // three consumers hold D 128 (CONSUMERS_D128=3): the live set is then O and S (128 registers)
    // at most, where a whole 64 x 128 Ô beside O and the P fragments spilled at 160 (docs/PERF.md
    // "Stage D, stop 46"). Each output element's sum is the same, step for step: the bits do not
    // change (checked on an H100 against the two-consumer kernel, 22 of 22 checksums).
    static constexpr bool PV_HALVES = D == 128 && CONSUMERS == 3;
    static constexpr int OT_REGS = PV_HALVES ? O_REGS / 2 : O_REGS;
    // ROW_SUM_MMA: the last (or only) P·V's Ô has 4 more registers, the ones' 8 columns: a
    // thread's OT_REGS + 2r is P̂·1 of its row g + 8r (and + 2r + 1 the same sum again).
    static constexpr int OTL_REGS = OT_REGS + (ROW_SUM_MMA ? 4 : 0);
    static_assert(Q_BYTES % 1024 == 0 && K_BYTES % 1024 == 0 && VT_STRIDE % 1024 == 0, "align");
    static_assert(!PV_HALVES || PINGPONG == 0,
                  "an entry of P·V in halves takes no turns of its own");
};
// A companion launches with its entry's shared memory (the host's one figure a head dim), so
// it must need no more, and it runs fewer rows than the entry.
template <int D, int C>
__host__ __device__ constexpr bool companion_fits() {
    if constexpr (C == 0)
        return true;
    else
        return C < own_consumers(D) && Tiles<D, C>::SMEM_BYTES <= Tiles<D>::SMEM_BYTES;
}
static_assert(companion_fits<64, COMPANION_D64>() && companion_fits<128, COMPANION_D128>(),
              "a companion runs fewer consumers than its entry, in no more shared memory");
constexpr int S_REGS = BLOCK_N / 2; // f32 accumulators per thread of 64 x BLOCK_N

// Every module publishes both head dims' geometry (the host checks that a variant's modules
// agree): SDPA_BLOCK_M and SDPA_THREADS are D 64's, the _D128 ones D 128's.
__constant__ int SDPA_BLOCK_M = Tiles<64>::BLOCK_M;
__constant__ int SDPA_BLOCK_M_D128 = Tiles<128>::BLOCK_M;
__constant__ int SDPA_BLOCK_N = BLOCK_N;
__constant__ int SDPA_THREADS = Tiles<64>::THREADS;
__constant__ int SDPA_THREADS_D128 = Tiles<128>::THREADS;
__constant__ int SDPA_KV_STAGES = KV_STAGES;
__constant__ int SDPA_KV_SPLIT = 1; // one chain of KV tiles per row (the emulation follows it)
__constant__ int SDPA_ROW_SUM_MMA = ROW_SUM_MMA; // l as P·1 on the tensor cores (numerics.row_sum)
__constant__ int SDPA_V_SWIZZLE = V_SWIZZLE; // the host swizzles V's tensor map like K's when 1
__constant__ int SDPA_CAUSAL_HEADS_FIRST = CAUSAL_HEADS_FIRST; // causal grid: x is B·H (cta_work)
// The rows of a unit of a mixed launch (cta_work), 0 where the entries do not mix.
__constant__ int SDPA_MIXED_UNIT_ROWS = MIXED_TILES ? 64 : 0;
__constant__ int SDPA_PINGPONG_D64 = PINGPONG_D64; // what the PTX proves of the turn-taking switch
__constant__ int SDPA_PINGPONG_D128 = PINGPONG_D128;
__constant__ int SDPA_TWO_TURNS_D64 = Tiles<64>::TWO_TURNS; // the turns of a two-consumer launch
__constant__ int SDPA_TWO_TURNS_D128 = Tiles<128>::TWO_TURNS;
__constant__ int SDPA_STAGGER_D64 = Tiles<64>::STAGGER; // cycles between consumers' starts
__constant__ int SDPA_STAGGER_D128 = Tiles<128>::STAGGER;
__constant__ int SDPA_SMEM_BYTES_D64 = Tiles<64>::SMEM_BYTES;
// Where not 0, the entry also runs query tiles of any multiple of this many rows below its own
// (one consumer warpgroup of 128 threads each, plus the producer's): Tiles<D>::NARROWS.
__constant__ int SDPA_NARROW_ROWS_D64 = Tiles<64>::NARROWS ? 64 : 0;
__constant__ int SDPA_NARROW_ROWS_D128 = Tiles<128>::NARROWS ? 64 : 0;
__constant__ int SDPA_SMEM_BYTES_D128 = Tiles<128>::SMEM_BYTES;
// Where not 0, the head dim's modules also hold `<entry>_m<rows>`, a function of its own for
// query tiles of this many rows and SDPA_COMPANION_THREADS_D<D> threads (COMPANION_D<D>).
__constant__ int SDPA_COMPANION_ROWS_D64 = 64 * COMPANION_D64;
__constant__ int SDPA_COMPANION_THREADS_D64 = COMPANION_D64 ? 128 * (1 + COMPANION_D64) : 0;
__constant__ int SDPA_COMPANION_ROWS_D128 = 64 * COMPANION_D128;
__constant__ int SDPA_COMPANION_THREADS_D128 = COMPANION_D128 ? 128 * (1 + COMPANION_D128) : 0;

typedef unsigned char u8;
#define NEG_INF __int_as_float(0xff800000)

#ifdef DIAG_TIMELINE
constexpr int TL_TILES = 64, TL_EVENTS = 8;
__device__ long long sdpa_timeline[4][TL_TILES][TL_EVENTS]; // the producer and up to 3 consumers
#define TL_STAMP(wg, j, e)                                                                      \
    do {                                                                                       \
        if (blockIdx.x == DIAG_TIMELINE && blockIdx.y == 0 && (threadIdx.x & 127) == 0 &&      \
            (j) < TL_TILES)                                                                    \
            sdpa_timeline[wg][j][e] = clock64();                                               \
    } while (0)
#else
#define TL_STAMP(wg, j, e) \
    do {               \
    } while (0)
#endif

#ifdef DIAG_SPANS
// Every CTA of the launch (x + gridDim.x · y, the first SP_CTAS): its SM, its KV tiles, and
// when its warpgroups' thread 0 reach each point (clock64, which only compares within an SM,
// and %globaltimer at its start and ends), for scripts/stage_d/probe.cu `spans`: where a
// launch's SM time goes beside its tiles' steady work.
constexpr int SP_CTAS = 16384, SP_EVENTS = 22;
enum SpanEvent {
    SP_SM, SP_TILES, SP_GT_ENTRY, SP_CK_ENTRY, SP_CK_INIT, SP_CK_SYNCED, SP_CK_ISSUED, SP_CK_Q,
    SP_CK_FIRST_S, SP_CK_TILE4,
    SP_CK_LAST,                    // + c: consumer c's last tile done
    SP_CK_PRESTORE = SP_CK_LAST + 3, // + c: its epilogue's first store
    SP_CK_END = SP_CK_PRESTORE + 3,  // + c: its epilogue's stores issued
    SP_GT_END = SP_CK_END + 3,       // + c: the same, %globaltimer
};
static_assert(SP_GT_END + 3 == SP_EVENTS, "span events");
__device__ long long sdpa_spans[SP_CTAS][SP_EVENTS];
__device__ __forceinline__ long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return (long long)t;
}
__device__ __forceinline__ long long sm_id() {
    unsigned s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return s;
}
#define SP_STAMP(e, v)                                                                         \
    do {                                                                                       \
        const unsigned sp_cta = blockIdx.x + gridDim.x * blockIdx.y;                           \
        if (sp_cta < SP_CTAS) sdpa_spans[sp_cta][e] = (v);                                     \
    } while (0)
#else
#define SP_STAMP(e, v) \
    do {               \
    } while (0)
#endif

struct Barriers {
    unsigned long long q_full;
    unsigned long long k_full[KV_STAGES];
    unsigned long long v_full[KV_STAGES];
    unsigned long long vt_full[KV_STAGES];
    unsigned long long empty[KV_STAGES];
};

__device__ __forceinline__ float exp2_approx(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ unsigned prmt(unsigned a, unsigned b, unsigned sel) {
    unsigned r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}
// Four f32 to four e4m3 codes (round to nearest even, saturating at ±448), x0 in byte 0.
__device__ __forceinline__ unsigned to_e4m3x4(float x0, float x1, float x2, float x3) {
    unsigned short lo, hi;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(x1), "f"(x0));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(x3), "f"(x2));
    return (unsigned)lo | ((unsigned)hi << 16);
}

// The rows and the head (batch included) of this CTA: `units` units of 64 rows (a consumer
// warpgroup each) from unit `unit0`. The GPU starts a grid's CTAs in the order of their linear
// index (x fastest). Without a mask every CTA of a query tile runs the same KV tiles; the grid
// is (query tiles, B·H), so a head's CTAs run together and share its K and V in L2, and every
// CTA owns nc units (the launch's consumers), the last one's past S_q left to no consumer.
// A causal CTA of query tile m runs about m + 1 times the first one's KV tiles, so causal CTAs
// start heaviest first: with CAUSAL_HEADS_FIRST the grid is (B·H, query tiles), y counting
// query tiles from the last, and the last CTAs to start are the lightest of all (every head's
// first tile). With 0 the grid is the unmasked one and each head's query tiles run from its
// last, so the last head's heaviest CTAs start after all the others' (up to 24% slower:
// docs/PERF.md "Stage C and D, change 36"). The host swaps the grid, so that both come straight
// from %ctaid, which ptxas reads again where needed instead of holding it across the KV loop (a
// decode of the linear index by division cost the D 128 causal entry a spill at three stages).
// A mixed launch (MIXED_TILES, unmasked, an entry without turns of its own: Tiles::MIXES) is on
// the grid (B·H, T) with T more query tiles a head than its nc-unit tiles need, ceil(U / nc)
// for U = ceil(S_q / 64): a head's first W = U - (nc - 1) T tiles own nc units, the other T - W
// one unit fewer (W nc + (T - W)(nc - 1) = U), so the GPU starts every head's wide CTAs first
// and ends on the narrower ones, whose CTAs run sooner where the last wave of wide ones would
// leave SMs idle (docs/PERF.md "Stage D, change 37"). A row's steps, and so its bits, are the
// same in any CTA. The host never launches a W < 0; a kernel that sees one traps.
struct CtaWork {
    int m_block, bh; // query tile m_block of BLOCK_M = 64 nc rows, head bh
    // A mixed launch's narrower tiles: the rows start `back` units (of 64) before m_block's,
    // and hold `fewer` (1) unit fewer than the launch's nc; 0 and 0 elsewhere.
    int back, fewer;
};
// Whether this launch is mixed: an entry that mixes (T::MIXES), unmasked, on (B·H, T) with more
// tiles than ceil(units / nc), i.e. (T - 1) nc >= units (an unmixed launch has x = ceil(units /
// nc) and y = B·H).
template <class T, bool CAUSAL>
__device__ __forceinline__ bool mixed_launch(int heads, int Sq) {
    if (CAUSAL || !T::MIXES) return false;
    const int nc = (int)blockDim.x / 128 - 1, units = (Sq + 63) / 64;
    return nc > 1 && gridDim.x == (unsigned)heads && ((int)gridDim.y - 1) * nc >= units;
}
template <bool CAUSAL, bool MIXED>
__device__ __forceinline__ CtaWork cta_work(int Sq) {
    if (CAUSAL && CAUSAL_HEADS_FIRST) return {(int)(gridDim.y - 1 - blockIdx.y), (int)blockIdx.x, 0, 0};
    if (CAUSAL) return {(int)(gridDim.x - 1 - blockIdx.x), (int)blockIdx.y, 0, 0};
    if (!MIXED) return {(int)blockIdx.x, (int)blockIdx.y, 0, 0};
    const int nc = (int)blockDim.x / 128 - 1, units = (Sq + 63) / 64;
    const int wide = units - (nc - 1) * (int)gridDim.y, y = (int)blockIdx.y;
    if (wide < 0) __trap(); // more tiles than units of nc - 1
    // Tile y >= wide starts at unit wide + (nc - 1) y = nc y - (y - wide).
#ifdef MUTANT_MIXED_SHORT_START
    // Planted: every shorter tile but the first starts a unit late (the first unit of tile
    // W + 1 is never written).
    return {y, (int)blockIdx.x, max(0, y - wide - 1), y < wide ? 0 : 1};
#else
    return {y, (int)blockIdx.x, max(0, y - wide), y < wide ? 0 : 1};
#endif
}

// The KV tiles a CTA of query tile m_block (block_m rows) runs: [0, n) (causal: up to its last
// row's last key; a causal launch is never mixed).
__device__ __forceinline__ int kv_tiles(int m_block, int block_m, int Sq, int Sk, bool causal) {
    int keys = Sk;
    if (causal) keys = min(Sk, (m_block + 1) * block_m + Sk - Sq);
    return keys > 0 ? (keys + BLOCK_N - 1) / BLOCK_N : 0;
}

// ---- producer: TMA issue and the V transpose ------------------------------------------------

template <class T>
__device__ __forceinline__ void issue_kv(u8* smem, Barriers& bars, const TmaDesc* tm_k,
                                         const TmaDesc* tm_v, int tile, int kv_bh, int Sk) {
    [[maybe_unused]] constexpr int D = T::DIM; // the planted short box's row
    const int s = tile % KV_STAGES;
    // A box always delivers all its bytes (rows past S_k zero-filled), so each barrier expects
    // the whole box, partial tile or not.
#ifdef MUTANT_TMA_SHORT_BOX
    // Planted: a partial tile's transactions counted one row short.
    const unsigned short_by = (tile + 1) * BLOCK_N > Sk ? D : 0;
#else
    const unsigned short_by = 0;
    (void)Sk;
#endif
    mbar_arrive_expect_tx(&bars.k_full[s], T::K_BYTES - short_by);
    tma_load_3d(smem + T::OFF_K + s * T::K_BYTES, tm_k, &bars.k_full[s], 0, tile * BLOCK_N, kv_bh);
    mbar_arrive_expect_tx(&bars.v_full[s], T::V_BYTES);
    tma_load_3d(smem + T::OFF_V + s * T::V_BYTES, tm_v, &bars.v_full[s], 0, tile * BLOCK_N, kv_bh);
}

// V[s] ([key][dim] as TMA writes it) -> Vt[s] ([dim][logical key], 128B swizzle), by the 128
// producer threads. A unit is 4 physical keys {2t, 2t+1, 8+2t, 9+2t} + 16h + 32kb (logical
// 16h + 4t .. +3 of block kb) x 4 dims 4dq .. 4dq+3: four 32-bit loads, a 4x4 byte transpose,
// four 32-bit stores.
#if V_SWIZZLE
// V is swizzled like K (D bytes). A lane holds t = lane % 4, dq % 4 = (lane / 4) % 4 and
// h = lane / 16; warp and iteration pick kb and dq / 4. Loads: the bank is ((dq / 4) ^ (2t + x))
// (mod 8) x 4 + dq % 4 at D 128 (x the key's offset within its pair), x' x 16 + ((dq / 4) ^ t) x 4
// + dq % 4 at D 64: in one order for every lane, 16 banks for 32 lanes, 2-way (h does not
// change the bank). Stores: the bank is ((2kb + h) ^ (d % 8)) x 4 + t with d % 8 = 4 (dq % 2) +
// i: 16 banks, 2-way (dq / 2 % 2 does not change it; the unswizzled version's stores were
// 16-way at D 128, 8-way at D 64). TRANSPOSE_LANE_ORDER=1 lets the lanes with h = 1 take each
// key pair in the other order (key 2t + 1 first: x ^ h) and the lanes with dq / 2 odd store the
// dims in the order i ^ 2: 32 banks for 32 lanes, conflict-free at both D (every bank formula
// above checked over all lanes, warps and iterations); selects put the words back. The bytes
// land where they did: the output's bits do not change. Measured slower (the switch's note).
template <int D>
__device__ __forceinline__ unsigned v_word(const u8* v, int key, int dq) {
    constexpr int SWZ_MASK = D == 128 ? 7 : 3; // 128B or 64B swizzle: chunk ^= address bits 7..
    const int swz = ((key * D) >> 7) & SWZ_MASK;
    return *(const unsigned*)(v + key * D + ((((dq >> 2) ^ swz) & (D / 16 - 1)) << 4) + 4 * (dq & 3));
}
template <int D>
__device__ __forceinline__ void transpose_v(const u8* v, u8* vt, int ptid) {
    constexpr int ITERS = (BLOCK_N / 4) * (D / 4) / 128;
    const int lane = ptid & 31, warp = ptid >> 5;
    const int t = lane & 3, dq_lo = (lane >> 2) & 3, h = lane >> 4;
#pragma unroll 2
    for (int it = 0; it < ITERS; ++it) {
        const int r = warp + 4 * it;
        const int kb = r & 3, dq = dq_lo + 4 * (r >> 2);
        const int key0 = 32 * kb + 16 * h + 2 * t;
#if TRANSPOSE_LANE_ORDER
        const int x = h;  // the lane's first key of each pair
        const unsigned a = v_word<D>(v, key0 + x, dq), b = v_word<D>(v, key0 + (1 - x), dq);
        const unsigned c = v_word<D>(v, key0 + 8 + x, dq), e = v_word<D>(v, key0 + 9 - x, dq);
        const unsigned w0 = x ? b : a, w1 = x ? a : b, w2 = x ? e : c, w3 = x ? c : e;
        const int i_flip = dq_lo & 2;  // the lane's first dim of each pair of stores
#else
        const unsigned w0 = v_word<D>(v, key0 + 0, dq);
        const unsigned w1 = v_word<D>(v, key0 + 1, dq);
        const unsigned w2 = v_word<D>(v, key0 + 8, dq);
        const unsigned w3 = v_word<D>(v, key0 + 9, dq);
        const int i_flip = 0;
#endif
#else
template <int D>
__device__ __forceinline__ void transpose_v(const u8* v, u8* vt, int ptid) {
    constexpr int UNITS = (BLOCK_N / 4) * (D / 4);
#pragma unroll 2
    for (int u = ptid; u < UNITS; u += 128) {
        const int dq = u % (D / 4);  // dims 4dq .. 4dq+3
        const int kg = u / (D / 4);  // logical 4-key group: kb = kg / 8, h = (kg / 4) % 2, t = kg % 4
        const int kb = kg >> 3, h = (kg >> 2) & 1, t = kg & 3;
        const int key0 = 32 * kb + 16 * h + 2 * t;
        const unsigned w0 = *(const unsigned*)(v + (key0 + 0) * D + 4 * dq);
        const unsigned w1 = *(const unsigned*)(v + (key0 + 1) * D + 4 * dq);
        const unsigned w2 = *(const unsigned*)(v + (key0 + 8) * D + 4 * dq);
        const unsigned w3 = *(const unsigned*)(v + (key0 + 9) * D + 4 * dq);
        const int i_flip = 0;
#endif
        const unsigned a_lo = prmt(w0, w1, 0x5140), a_hi = prmt(w0, w1, 0x7362);
        const unsigned b_lo = prmt(w2, w3, 0x5140), b_hi = prmt(w2, w3, 0x7362);
        const unsigned out[4] = {prmt(a_lo, b_lo, 0x5410), prmt(a_lo, b_lo, 0x7632),
                                 prmt(a_hi, b_hi, 0x5410), prmt(a_hi, b_hi, 0x7632)};
        const int chunk = 2 * kb + h; // 16-byte chunk of the 128-byte row
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int d = 4 * dq + (i ^ i_flip);
            const unsigned word = i_flip ? out[i ^ 2] : out[i];
            *(unsigned*)(vt + d * BLOCK_N + ((chunk ^ (d & 7)) << 4) + 4 * t) = word;
        }
    }
}

// The same Vt by ldmatrix / stmatrix (TRANSPOSE_LDSM=1, the default; FlashAttention-3's FP8 V
// transpose): a warp moves a 32-key block kb by 16 dims (16 dims from line dl of each key row)
// per step, 512 bytes in three shared-memory instructions a lane. `ldmatrix.x4.trans` over four
// 8 x 16-byte matrices, the keys 32kb + 8m .. + 7 of matrix m (lane l addresses key 32kb + l of
// the block: matrix l / 8, row l % 8), hands lane (c = lane / 4, t = lane % 4) per matrix the
// 2-byte pair of dims 2c, 2c + 1 of keys 8m + 2t and 8m + 2t + 1, as bytes (key 2t: dim 2c,
// 2c + 1; key 2t + 1: dim 2c, 2c + 1). Two `prmt` per matrix pair (m = 2h, 2h + 1) pick dim
// 2c + e of keys {2t, 2t + 1, 8 + 2t, 9 + 2t} + 16h: logical keys 16h + 4t .. + 3, one word of
// Vt row 16 dl + 2c + e. `stmatrix.x4` writes the four words (h, e) as four 8 x 16-byte matrices
// whose row c is Vt row 16 dl + 2c + e, 16-byte chunk 2kb + h (lane l addresses row l % 8 of
// matrix l / 8). Loads are conflict-free (the 8 key rows of a matrix fall on 8 different
// chunks under K's swizzle); stores are 2-way (rows 2 dims apart share a swizzle phase with
// the row 8 dims on). 6 instructions a lane per 16 bytes where the words take 14. The bytes
// land where transpose_v puts them (checked by simulating both for D 64 and 128).
#ifndef TRANSPOSE_LDSM
#define TRANSPOSE_LDSM V_SWIZZLE // V_SWIZZLE=0 falls back to the word transpose
#endif
#if TRANSPOSE_LDSM && !V_SWIZZLE
#error "TRANSPOSE_LDSM=1 reads V swizzled like K: build it with V_SWIZZLE=1"
#endif
template <class T>
__device__ __forceinline__ void transpose_v_ldsm(const u8* v, u8* vt, int ptid) {
    constexpr int D = T::DIM;
    constexpr int SWZ_MASK = D == 128 ? 7 : 3; // as v_word
    constexpr int STEPS = (BLOCK_N / 32) * (D / 16) / 4; // per warp: 8 at D 128, 4 at D 64
    const int lane = ptid & 31, warp = ptid >> 5;
    const int mrow = lane & 7, mat = lane >> 3;   // the matrix row this lane addresses
    const int h = mat >> 1, e = mat & 1;          // its store matrix: (half, dim parity)
    const unsigned v_base = smem_addr(v), vt_base = smem_addr(vt);
    // Two steps at a time at D 128 with three consumers: a whole unroll keeps eight source
    // addresses live, which spill in the producer's 32 registers.
#pragma unroll(D == 128 && T::CONSUMERS == 3 ? 2 : STEPS)
    for (int it = 0; it < STEPS; ++it) {
        const int u = warp + 4 * it;
        const int kb = u & 3, dl = u >> 2;
        const int key = 32 * kb + lane;
        const int swz = ((key * D) >> 7) & SWZ_MASK;
        const unsigned src = v_base + key * D + ((((dl ^ swz)) & (D / 16 - 1)) << 4);
        unsigned r0, r1, r2, r3;
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                     : "r"(src)
                     : "memory");
        const unsigned w0 = prmt(r0, r1, 0x6420), w1 = prmt(r0, r1, 0x7531);
        const unsigned w2 = prmt(r2, r3, 0x6420), w3 = prmt(r2, r3, 0x7531);
        const int d = 16 * dl + 2 * mrow + e;
        const unsigned dst = vt_base + d * BLOCK_N + (((2 * kb + h) ^ (d & 7)) << 4);
        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
                     ::"r"(dst), "r"(w0), "r"(w1), "r"(w2), "r"(w3)
                     : "memory");
    }
}

// ROW_SUM_MMA: the stage's 8 rows of e4m3 ones after its Vᵀ (1.0 is 0x38; the same bytes in
// any swizzle), 8 bytes a producer thread, written once a CTA, before the stage's first fence
// and vt_full arrival, and never again.
template <class T>
__device__ __forceinline__ void write_ones(u8* vt, int ptid) {
    static_assert(T::ONES_BYTES == 8 * 128 && BLOCK_N == 128, "8 rows of 128 keys");
    *(unsigned long long*)(vt + T::VT_BYTES + 8 * ptid) = 0x3838383838383838ull;
}

template <class T>
__device__ __forceinline__ void producer(u8* smem, Barriers& bars, const TmaDesc* tm_q,
                                         const TmaDesc* tm_k, const TmaDesc* tm_v, int nc,
                                         int m_block, int back, int fewer, int bh, int kv_bh,
                                         int n_tiles, int Sk) {
    constexpr int D = T::DIM;
    const int ptid = threadIdx.x;
    if (ptid == 0) { // Q of the CTA's units (a consumer without rows reads none)
        mbar_arrive_expect_tx(&bars.q_full, (nc - fewer) * 64 * D);
        for (int c = 0; c < nc - fewer; ++c)
            tma_load_3d(smem + c * 64 * D, tm_q, &bars.q_full, 0, (m_block * nc + c - back) * 64,
                        bh);
        for (int i = 0; i < KV_STAGES - 1 && i < n_tiles; ++i)
            issue_kv<T>(smem, bars, tm_k, tm_v, i, kv_bh, Sk);
        SP_STAMP(SP_CK_ISSUED, clock64());
    }
    // Tiles run LOOKAHEAD ahead of the transpose. Tile j is transposed into Vt of its stage as
    // soon as its V has landed (the stage's last Vt reader, tile j - KV_STAGES, was waited for
    // when tile j was issued; the wait below is the transpose's own guard and costs nothing);
    // only then is tile j + LOOKAHEAD issued, once its stage is free (the consumers finished
    // tile j - 1). Transposing first keeps the transpose of tile j off the end of tile j - 1: a
    // producer that first waited for tile j - 1 (both consumers) tied each consumer's P·V to
    // the slower one's previous tile (docs/PERF.md change 21: 1-6% faster).
    constexpr int LOOKAHEAD = KV_STAGES - 1;
    for (int j = 0; j < n_tiles; ++j) {
        const int s = j % KV_STAGES;
        TL_STAMP(0, j, 0);
        if (j >= KV_STAGES) mbar_wait(&bars.empty[s], ((j / KV_STAGES) - 1) & 1);
        TL_STAMP(0, j, 1);
        mbar_wait(&bars.v_full[s], (j / KV_STAGES) & 1);
        TL_STAMP(0, j, 2);
#if defined(DIAG_NO_TRANSPOSE)
#elif TRANSPOSE_LDSM
        transpose_v_ldsm<T>(smem + T::OFF_V + s * T::V_BYTES, smem + T::OFF_VT + s * T::VT_STRIDE,
                            ptid);
#else
        transpose_v<D>(smem + T::OFF_V + s * T::V_BYTES, smem + T::OFF_VT + s * T::VT_STRIDE, ptid);
#endif
        if constexpr (ROW_SUM_MMA != 0)
            if (j < KV_STAGES) write_ones<T>(smem + T::OFF_VT + s * T::VT_STRIDE, ptid);
#ifndef MUTANT_NO_PROXY_FENCE
        fence_proxy_async_smem();
#endif
        mbar_arrive(&bars.vt_full[s]);
        TL_STAMP(0, j, 3);
        const int next = j + LOOKAHEAD;
        if (next < n_tiles) {
            if (next >= KV_STAGES)
                mbar_wait(&bars.empty[next % KV_STAGES], ((next / KV_STAGES) - 1) & 1);
            if (ptid == 0) issue_kv<T>(smem, bars, tm_k, tm_v, next, kv_bh, Sk);
        }
        TL_STAMP(0, j, 4);
    }
}

// ---- consumers ----------------------------------------------------------------------------

// Turns (PINGPONG): the consumer warpgroups take turns at some steps of a tile, so that one's
// softmax runs while another's GEMMs hold the tensor cores. Warpgroup c waits on named barrier
// 1 + c (its turn) before its turn's first step and, once its last step is issued, arrives on
// the barrier of the next warpgroup, (c + 1) % nc (nc: the launch's consumers). The last
// warpgroup opens the first turn and skips its last arrival, so every barrier ends balanced.
// One turn at a time: a named barrier counts arrivals without knowing whose, so a round robin
// that let two warpgroups in at once could see one warpgroup's two arrivals complete a barrier
// nobody waits on yet, and hang.
// PINGPONG_D<D>=1: a turn at each GEMM's issue; 2: at Q·Kᵀ's issue alone; 3: from the softmax
// to P·V's issue, so that two softmaxes never share the MUFU and ALU pipes. A turn ends at a
// GEMM's issue because ptxas keeps the `wgmma` and the barrier in order, while it moves plain
// arithmetic across a barrier (with the arrival right after the softmax, the D 64 entry's SASS
// had its 66 MUFU.EX2 below the arrival).
enum TurnStep { TURN_QK, TURN_SOFTMAX, TURN_PV };
template <int PP>
__device__ __forceinline__ constexpr bool turn_waits_at(TurnStep step) {
    return PP == 1 ? step != TURN_SOFTMAX : PP == 2 ? step == TURN_QK : PP == 3 && step == TURN_SOFTMAX;
}
template <int PP>
__device__ __forceinline__ constexpr bool turn_passes_at(TurnStep step) {
    return PP == 1 ? step != TURN_SOFTMAX : PP == 2 ? step == TURN_QK : PP == 3 && step == TURN_PV;
}
template <int PP>
__device__ __forceinline__ constexpr TurnStep last_turn() {
    return PP == 2 ? TURN_QK : TURN_PV;
}
// A warpgroup's part in the turns of its launch: whether the launch takes turns (the entry's
// own, or TWO_TURNS in a launch of two consumers of an entry of three: a run-time choice, the
// same for the whole CTA), the next warpgroup's barrier, and whether this is the last
// warpgroup (which opens the first turn and skips the last pass).
struct Turns {
    bool on;
    int next; // 1 + (c + 1) % consumers
    bool last_wg;
};
template <int PP>
__device__ __forceinline__ void turn_open(const Turns& tn) {
    if (PP != 0 && tn.on && tn.last_wg)
        asm volatile("bar.arrive %0, 256;" ::"r"(tn.next) : "memory");
}
template <int PP>
__device__ __forceinline__ void turn_wait(int c, TurnStep step, const Turns& tn) {
    if (turn_waits_at<PP>(step) && tn.on) asm volatile("bar.sync %0, 256;" ::"r"(1 + c) : "memory");
}
template <int PP>
__device__ __forceinline__ void turn_pass(const Turns& tn, TurnStep step, bool last_tile) {
    if (turn_passes_at<PP>(step) && tn.on && !(tn.last_wg && last_tile && step == last_turn<PP>()))
        asm volatile("bar.arrive %0, 256;" ::"r"(tn.next) : "memory");
}

// The thread's maximum of a row's 32 scores (sc[4n + 2r], sc[4n + 2r + 1]) by fmaxf.
__device__ __forceinline__ float row_max_f(const float (&sc)[S_REGS], int r) {
    float mx = NEG_INF;
#pragma unroll
    for (int n = 0; n < BLOCK_N / 8; ++n)
        mx = fmaxf(mx, fmaxf(sc[4 * n + 2 * r], sc[4 * n + 2 * r + 1]));
    return mx;
}
// The same maxima of both rows, the same bits, as signed integers: trees of three-input maxima
// (VIMNMX3, depth 4: 32, 11, 4, 2, 1), half of row_max_f's instructions. A float's bits order as
// a signed integer like the float itself among non-negative floats, every negative float's bits
// lie below every non-negative one's, and among negative floats the order is reversed. So where
// a thread's maximum of a row's bits is not negative, it is the float maximum; where it is (all
// its scores of the row below zero, or -0), the float maximum is the least of the bits, which
// the warp then takes by the same tree of minima (the fallback: the cost of both trees, about
// row_max_f's). The scores are sums of e4m3 products: never NaN, infinite or subnormal (a
// masked -inf is only in the tiles with a mask, which take row_max_f).
template <bool MIN>
__device__ __forceinline__ int row_tree(const float (&sc)[S_REGS], int r) {
    static_assert(BLOCK_N == 128, "the tree is of 32 scores a row");
    auto v = [&](int i) { return __float_as_int(sc[4 * (i >> 1) + 2 * r + (i & 1)]); };
    auto m3 = [](int a, int b, int c) { return MIN ? __vimin3_s32(a, b, c) : __vimax3_s32(a, b, c); };
    auto m2 = [](int a, int b) { return MIN ? min(a, b) : max(a, b); };
    int w[11];
#pragma unroll
    for (int k = 0; k < 10; ++k) w[k] = m3(v(3 * k), v(3 * k + 1), v(3 * k + 2));
    w[10] = m2(v(30), v(31));
    const int x0 = m3(w[0], w[1], w[2]), x1 = m3(w[3], w[4], w[5]), x2 = m3(w[6], w[7], w[8]),
              x3 = m2(w[9], w[10]);
    return m2(m3(x0, x1, x2), x3);
}
__device__ __forceinline__ void row_maxima_int(const float (&sc)[S_REGS], float (&row_mx)[2]) {
    int mi[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        mi[r] = row_tree<false>(sc, r);
        row_mx[r] = __int_as_float(mi[r]);
    }
#ifndef MUTANT_INT_MAX_NO_FALLBACK
    if (__any_sync(0xffffffff, (mi[0] | mi[1]) < 0)) {
#pragma unroll
        for (int r = 0; r < 2; ++r)
            if (mi[r] < 0) row_mx[r] = __int_as_float(row_tree<true>(sc, r));
    }
#endif
}

// Mask one tile's S (f32, as the wgmma left it) and run the online softmax (m, l and alpha =
// exp2(m_old - m_new) per row of the thread's two), leaving P in sc (p_fragments rounds it to
// e4m3 A fragments). The scale
// is fused into the exponent (the manifest's `score = "fused"`): the row maximum is taken over
// the unscaled scores and scaled once, and p = exp2(fma(s, qk_scale, -m)), one FFMA an element
// where a scaled score takes an FMUL and an FADD (5-7% faster, 12-13% causal: docs/PERF.md
// change 20).
// MASK: the tile holds a key past S_k or above the diagonal for some row of the CTA (a
// compile-time choice: a run-time one is if-converted by ptxas into a select and a compare
// per element on every tile, 19% of the loop's instructions at D 128).
// Whether P·V's last wgmma sums l (ROW_SUM_MMA; not where MUTANT_NO_PROMOTION accumulates
// into O itself, which keeps l in f32 as before): then the softmax sums no l.
#ifdef MUTANT_NO_PROMOTION
constexpr bool L_ON_TENSOR_CORES = false;
#else
constexpr bool L_ON_TENSOR_CORES = ROW_SUM_MMA != 0;
#endif

template <int D, bool CAUSAL, bool MASK, bool INT_MAXIMA>
__device__ __forceinline__ void softmax_tile(float (&sc)[S_REGS], int j, int t, int row0, int Sk,
                                             int diag, float qk_scale, float (&m)[2],
                                             float (&l)[2], float (&alpha)[2]) {
    // Thread (g, t) holds, per 8-key group n, keys 8n + 2t + {0, 1} of rows row0 (sc[4n],
    // sc[4n+1]) and row0 + 8 (sc[4n+2], sc[4n+3]).
    const int key0 = j * BLOCK_N;
#pragma unroll
    for (int i = 0; i < S_REGS; ++i) {
        float x = sc[i]; // unscaled: the scale is fused into the exponent's fma below
        if (MASK) {
            const int key = key0 + 8 * (i >> 2) + 2 * t + (i & 1);
            const int row = row0 + ((i >> 1) & 1) * 8;
            if (key >= Sk || (CAUSAL && key > row + diag)) x = NEG_INF;
        }
        sc[i] = x;
    }
    // INT_MAXIMA: the row maxima as integers (row_maxima_int), in the tiles without a mask.
    constexpr bool INT = INT_MAXIMA && !MASK;
    float row_mx[2];
    if constexpr (INT) row_maxima_int(sc, row_mx);
    // Online softmax, per row r of the two.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float mx = INT ? row_mx[r] : row_max_f(sc, r);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
        mx = fmaxf(m[r], mx * qk_scale); // the scale is positive: the scaled maximum
        const float base = mx == NEG_INF ? 0.f : mx; // a row with no key yet: P = 0
#ifdef MUTANT_SKIP_RESCALE
        alpha[r] = 1.f;
#else
        alpha[r] = exp2_approx(m[r] - base);
#endif
        m[r] = mx;
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < BLOCK_N / 8; ++n) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float& x = sc[4 * n + 2 * r + e];
                float arg = fmaf(x, qk_scale, -base);
                // A key the row does not see weighs 0 whatever the scale (-inf · 0 is NaN).
                if (MASK && x == NEG_INF) arg = NEG_INF;
                x = exp2_approx(arg);
            }
            if (!L_ON_TENSOR_CORES) sum += sc[4 * n + 2 * r] + sc[4 * n + 2 * r + 1];
        }
        if (!L_ON_TENSOR_CORES) l[r] = l[r] * alpha[r] + sum;
    }
}

// P (f32, in sc) -> e4m3 A fragments: block kb (keys 32kb ..), a0/a2 row g, a1/a3 row g + 8.
template <int D>
__device__ __forceinline__ void p_fragments(const float (&sc)[S_REGS],
                                            unsigned (&pa)[Tiles<D>::PV_STEPS][4]) {
#pragma unroll
    for (int kb = 0; kb < Tiles<D>::PV_STEPS; ++kb) {
        const float* p = sc + 16 * kb;
        pa[kb][0] = to_e4m3x4(p[0], p[1], p[4], p[5]);
        pa[kb][1] = to_e4m3x4(p[2], p[3], p[6], p[7]);
        pa[kb][2] = to_e4m3x4(p[8], p[9], p[12], p[13]);
        pa[kb][3] = to_e4m3x4(p[10], p[11], p[14], p[15]);
    }
}

// S = Q Kᵀ, Q's descriptor q and the K tile's k (its stage's), into sc (issued and committed, not
// waited for).
template <int D>
__device__ __forceinline__ void issue_qk(float (&sc)[S_REGS], WgmmaDesc q, WgmmaDesc k) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Tiles<D>::QK_STEPS; ++kk)
        wgmma_ss_n128(sc, q.at(32 * kk), k.at(32 * kk), kk > 0);
    wgmma_commit();
}

// Ô = P̂ Vᵀ, P̂ from the A fragments pa and the Vt tile's descriptor vt, into ot (issued and
// committed, not waited for).
// With PV_HALVES, the half `half` of the output dims: Vt rows 64 half .. (8 KB on).
// ROW_SUM_MMA: the last (or only) P·V, into an Ô of OTL_REGS (N = its dims + 8), reads the
// stage's ones after Vᵀ's rows as well (the 8-row groups are 1 KB apart: Vᵀ's last is followed
// by the ones).
// Waits for the P·V just issued (the only wgmma group in flight) and ties its accumulators there.
template <int N>
__device__ __forceinline__ void pv_wait(float (&acc)[N]) {
#ifdef MUTANT_EARLY_ACCUMULATOR_READ
    wgmma_wait<1>();
#else
    wgmma_wait<0>();
#endif
    wgmma_hold(acc);
}

// O = O · alpha + Ô, in f32, for the half `half` of the dims (PV_HALVES; else 0); accumulator i
// is row g + 8·((i >> 1) & 1). An Ô with l (N = OT_REGS + 4, ROW_SUM_MMA) also folds l the same
// way: l = l · alpha + P̂·1.
template <class T, int N>
__device__ __forceinline__ void fold_pv(float (&o)[T::O_REGS], float (&l)[2], const float (&ot)[N],
                                        const float (&alpha)[2], int half) {
#pragma unroll
    for (int i = 0; i < T::OT_REGS; ++i)
        o[T::OT_REGS * half + i] = fmaf(o[T::OT_REGS * half + i], alpha[(i >> 1) & 1], ot[i]);
    if constexpr (N > T::OT_REGS) {
#pragma unroll
        for (int r = 0; r < 2; ++r) l[r] = fmaf(l[r], alpha[r], ot[T::OT_REGS + 2 * r]);
    }
}

template <class T, int N>
__device__ __forceinline__ void issue_pv(float (&ot)[N], const unsigned (&pa)[T::PV_STEPS][4],
                                         WgmmaDesc vt, int half = 0) {
    static_assert(N == T::OT_REGS || N == T::OT_REGS + 4, "Ô, or Ô and l");
    wgmma_fence();
#pragma unroll
    for (int kb = 0; kb < T::PV_STEPS; ++kb) {
        const unsigned long long b = vt.at(64 * BLOCK_N * half + 32 * kb);
        if constexpr (N == 32)
            wgmma_rs_n64(ot, pa[kb], b, kb > 0);
        else if constexpr (N == 36)
            wgmma_rs_n72(ot, pa[kb], b, kb > 0);
        else if constexpr (N == 64)
            wgmma_rs_n128(ot, pa[kb], b, kb > 0);
        else
            wgmma_rs_n136(ot, pa[kb], b, kb > 0);
    }
    wgmma_commit();
}

template <class T, bool CAUSAL, bool MIXED>
__device__ __forceinline__ void consumer(u8* smem, Barriers& bars, int c, int nc, int m_block, int back, int fewer, int bh,
                                         int b, int h, int H, int kv_bh, int Sq, int Sk,
                                         int n_tiles, float qk_scale, float v_scale,
                                         __half* __restrict__ out) {
    constexpr int D = T::DIM;
    // The turn-taking: the entry's own (PINGPONG), or TWO_TURNS where this launch runs two
    // consumers of an entry of three.
    constexpr int PP = T::PINGPONG != 0 ? T::PINGPONG : T::TWO_TURNS;
    const int ctid = threadIdx.x - 128 * (c + 1);
    const int warp = ctid >> 5, lane = ctid & 31, g = lane >> 2, t = lane & 3;
    const int cta_row0 = (m_block * nc - back) * 64; // the CTA's units of 64 rows, a consumer each
    // Whether consumer k has any row: one of the CTA's units, before S_q (the last query tile of
    // a short S_q may leave the later consumers none, as may a mixed launch's narrower tiles).
    auto has_rows = [&](int k) {
        return (!MIXED || k < nc - fewer) && cta_row0 + 64 * k < Sq;
    };
    // A launch of two consumers takes turns only where both have rows: where the second's lie
    // past S_q (decode) it only releases each stage (below) and the first runs alone.
    const Turns turns{T::PINGPONG != 0 || (T::TWO_TURNS != 0 && nc == 2 && has_rows(1)),
                      1 + (c + 1) % nc, c >= nc - 1};
    const int row0 = cta_row0 + 64 * c + 16 * warp + g; // and row0 + 8
    const int diag = Sk - Sq; // query i sees keys j <= i + diag

    float o[T::O_REGS];
#pragma unroll
    for (int i = 0; i < T::O_REGS; ++i) o[i] = 0.f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};

    if (n_tiles > 0) mbar_wait(&bars.q_full, 0);
    if (c == 0 && ctid == 0) SP_STAMP(SP_CK_Q, clock64());
    // Without turns, consumer c starts c x STAGGER cycles after the first (T::STAGGER), so that
    // the consumers' exponentials and GEMMs do not all fall on the same cycles (docs/PERF.md
    // change 24).
    if (T::STAGGER > 0 && !turns.on && c > 0 && n_tiles > 0 && has_rows(c)) {
        const long long t0 = clock64();
        while (clock64() - t0 < (long long)c * T::STAGGER) {
        }
    }
    if (n_tiles > 0) turn_open<PP>(turns);
    // Descriptors: Q's, and stage 0's K and Vt, which the stages offset (WgmmaDesc::at).
#ifdef MUTANT_THIRD_CONSUMER_SECOND_Q
    // Planted: the third consumer reads the second's Q rows (only CTAs of three consumers).
    const WgmmaDesc q_desc = WgmmaDesc::of<D>(smem_addr(smem + (c == 2 ? 1 : c) * 64 * D));
#else
    const WgmmaDesc q_desc = WgmmaDesc::of<D>(smem_addr(smem + c * 64 * D));
#endif
    const WgmmaDesc k_desc0 = WgmmaDesc::of<D>(smem_addr(smem + T::OFF_K));
    const WgmmaDesc vt_desc0 = WgmmaDesc::of<BLOCK_N>(smem_addr(smem + T::OFF_VT));
    auto k_ready = [&](int j) {
        const unsigned parity = (j / KV_STAGES) & 1;
#ifdef MUTANT_WRONG_PARITY
        mbar_wait(&bars.k_full[j % KV_STAGES], parity ^ 1u);
#else
        mbar_wait(&bars.k_full[j % KV_STAGES], parity);
#endif
        return WgmmaDesc{k_desc0.lo + (((j % KV_STAGES) * T::K_BYTES) >> 4), k_desc0.hi};
    };
    auto vt_ready = [&](int j) {
        mbar_wait(&bars.vt_full[j % KV_STAGES], (j / KV_STAGES) & 1);
        return WgmmaDesc{vt_desc0.lo + (((j % KV_STAGES) * T::VT_STRIDE) >> 4), vt_desc0.hi};
    };
    // The row maxima as integers (INT_ROWMAX, row_maxima_int) in the functions without turns of
    // their own but the D 128 causal entry: the D 128 companion, with turns, measured 3% slower
    // with them, and the causal entry's st3 build spills a register with them (NVRTC 13.0: 4
    // bytes; docs/PERF.md "Stage D, change 29").
    constexpr bool INT_MAXIMA = INT_ROWMAX && T::PINGPONG == 0 && !(D == 128 && CAUSAL);
    auto softmax = [&](float (&sc)[S_REGS], int j, bool masked, float (&alpha)[2]) {
        if (masked)
            softmax_tile<D, CAUSAL, true, INT_MAXIMA>(sc, j, t, row0, Sk, diag, qk_scale, m, l, alpha);
        else
            softmax_tile<D, CAUSAL, false, INT_MAXIMA>(sc, j, t, row0, Sk, diag, qk_scale, m, l, alpha);
    };
    // The tiles below n_full need no mask: every key is below S_k and, causal, at or below the
    // diagonal of the CTA's first row; the tiles from n_full on (the last, and causal the
    // diagonal's) are masked per element. `masked` is a constant at each call of a step, so each
    // loop gets its own body.
    int n_full = min(n_tiles, Sk / BLOCK_N);
    if (CAUSAL) n_full = min(n_full, max(0, (cta_row0 + diag + 1) / BLOCK_N));
    // One KV tile, in order: Q·Kᵀ, softmax, P·V, O.
    auto tile = [&](int j, bool masked) {
        float sc[S_REGS], alpha[2];
        TL_STAMP(1 + c, j, 0);
        const WgmmaDesc k_desc = k_ready(j);
        TL_STAMP(1 + c, j, 1);
        const bool last = j + 1 == n_tiles;
        turn_wait<PP>(c, TURN_QK, turns);
        issue_qk<D>(sc, q_desc, k_desc);
        turn_pass<PP>(turns, TURN_QK, last);
        wgmma_wait<0>();
        wgmma_hold(sc);
        TL_STAMP(1 + c, j, 2);
        if (c == 0 && ctid == 0 && (j == 0 || j == 4))
            SP_STAMP(j == 0 ? SP_CK_FIRST_S : SP_CK_TILE4, clock64());
        unsigned pa[T::PV_STEPS][4];
        turn_wait<PP>(c, TURN_SOFTMAX, turns);
        softmax(sc, j, masked, alpha);
        p_fragments<D>(sc, pa);
        turn_pass<PP>(turns, TURN_SOFTMAX, last);
        TL_STAMP(1 + c, j, 3);
        const WgmmaDesc vt_desc = vt_ready(j);
        TL_STAMP(1 + c, j, 4);
#ifdef MUTANT_NO_PROMOTION
        // Planted: P·V accumulates straight into O on the tensor cores (O·alpha first, skipped
        // where no row of the warp moved), without the per-tile Ô promoted to f32: O in FP22
        // steps over every key, as a kernel that drops the promotion for speed does. It
        // stagnates once O is 2^13 times one key's product (dist=flat_positive_v: 13% short at
        // S_k 8192; docs/PERF.md "Stage D, stop 58"). scripts/stage_d/probe.sh times it.
        if (__any_sync(0xffffffff, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
            for (int i = 0; i < T::O_REGS; ++i) o[i] *= alpha[(i >> 1) & 1];
        }
        turn_wait<PP>(c, TURN_PV, turns);
        wgmma_fence();
#pragma unroll
        for (int kb = 0; kb < T::PV_STEPS; ++kb) {
            if constexpr (T::O_REGS == 32)
                wgmma_rs_n64(o, pa[kb], vt_desc.at(32 * kb), 1);
            else
                wgmma_rs_n128(o, pa[kb], vt_desc.at(32 * kb), 1);
        }
        wgmma_commit();
        turn_pass<PP>(turns, TURN_PV, last);
        wgmma_wait<0>();
        wgmma_hold(o);
        mbar_arrive(&bars.empty[j % KV_STAGES]);
#else
        // Ô of the first half (PV_HALVES) and Ô with l (OTL_REGS) of the last or only P·V.
        float otl[T::OTL_REGS];
        turn_wait<PP>(c, TURN_PV, turns);
        if constexpr (T::PV_HALVES) { // the first half's Ô added, then the second half's (after
                                      // the turn, where the launch takes turns)
            // The first half's Ô in the registers of the second's, as before ROW_SUM_MMA (the
            // wgmma's "+f" operands keep the registers they are given live from its issue; a
            // fresh array for the second half spilled 4-8 bytes in the D 128 entries at st2,
            // NVRTC 13.0, with either ROW_SUM_MMA).
            float(&ot)[T::OT_REGS] = reinterpret_cast<float(&)[T::OT_REGS]>(otl);
            issue_pv<T>(ot, pa, vt_desc);
            turn_pass<PP>(turns, TURN_PV, last);
            pv_wait(ot);
            TL_STAMP(1 + c, j, 5);
            fold_pv<T>(o, l, ot, alpha, 0);
            issue_pv<T>(otl, pa, vt_desc, 1);
            pv_wait(otl);
            mbar_arrive(&bars.empty[j % KV_STAGES]);
            fold_pv<T>(o, l, otl, alpha, 1);
        } else {
            issue_pv<T>(otl, pa, vt_desc);
            turn_pass<PP>(turns, TURN_PV, last);
            pv_wait(otl);
            TL_STAMP(1 + c, j, 5);
            mbar_arrive(&bars.empty[j % KV_STAGES]);
            fold_pv<T>(o, l, otl, alpha, 0);
        }
#endif
        TL_STAMP(1 + c, j, 6);
    };
    // A warpgroup whose rows all lie past S_q (in the last query tile of a short S_q) only keeps
    // the ring going: it releases each stage once the tile's Vᵀ has landed (the `empty` barrier
    // counts every consumer thread; the wait keeps its arrivals in the stage's phase order).
    // Without turns only: with them it would have to take its turns as well.
    if (!turns.on && !has_rows(c)) {
        for (int j = 0; j < n_tiles; ++j) {
            vt_ready(j);
            mbar_arrive(&bars.empty[j % KV_STAGES]);
        }
        return;
    }
    int j = 0;
    for (; j < n_full; ++j) tile(j, false);
    for (; j < n_tiles; ++j) tile(j, true);
    if (ctid == 0) SP_STAMP(SP_CK_LAST + c, clock64());

    // Epilogue: l over the quad, O · v_scale / l (0 for a row that saw no key), f16 stores.
    // (With l on the tensor cores every thread of a quad already holds its rows' whole l.)
    if (!L_ON_TENSOR_CORES) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            l[r] += __shfl_xor_sync(0xffffffff, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffff, l[r], 2);
        }
    }
    const float inv[2] = {l[0] > 0.f ? v_scale / l[0] : 0.f, l[1] > 0.f ? v_scale / l[1] : 0.f};
    __half* o_bh = out + (size_t)bh * Sq * D;
    if (ctid == 0) SP_STAMP(SP_CK_PRESTORE + c, clock64());
    // STAGED_O: each warp's 16 rows go out through the consumer's own Q tile (64 rows x D bytes,
    // free since its last Q·Kᵀ ended), half the dims at a time (D/2 f16: D bytes a row). A
    // thread's words land in 16-byte chunk n ^ key(row), so that a warp's 32 stores fall in 32
    // banks; each lane then reads back 16-byte chunks and stores those of rows before S_q to
    // global, each half row's D bytes. A warp reads only its own rows: __syncwarp orders it.
    // DIRECT_FEW: in the unmasked D 128 companion (and the D 128 entry itself where
    // CONSUMERS_D128=2: no P·V in halves), a warp with fewer than 16 rows before S_q stores
    // straight from its accumulators instead (the branch below), as every warp does with
    // STAGED_O=0. That function runs D 128's problems of a few query rows (decode, draft tokens),
    // which the staging made 2.6-3.8% slower (cfg-pack; docs/PERF.md "Stage D, change 39"). The
    // other functions stage every warp: the same branch changed far more than the epilogue's
    // code in D 64's entries and the causal companion and cost them up to 7%, and spilled 4
    // bytes in the 192-row D 128 causal entry (NVRTC 13.0).
    constexpr bool DIRECT_FEW = D == 128 && !CAUSAL && !T::PV_HALVES;
    if (STAGED_O && (!DIRECT_FEW || Sq - (cta_row0 + 64 * c + 16 * warp) >= 16)) {
        // NCH chunks a row of a half, RPL rows a 128-byte line; a row's key is (row / RPL) % NCH,
        // which is (g / RPL) % NCH for both of a thread's rows (8 / RPL is a multiple of NCH)
        // and depends on f alone for a read (16 warp / RPL is one too).
        constexpr unsigned NCH = D / 16, RPL = 128 / D;
        const unsigned wrows = smem_addr(smem + c * 64 * D + 16 * warp * D); // the warp's 16 rows
        const unsigned key_w = ((unsigned)g / RPL) % NCH;
        __half* const o_rows = o_bh + (size_t)(cta_row0 + 64 * c + 16 * warp) * D;
        const int rows_left = Sq - (cta_row0 + 64 * c + 16 * warp);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
#pragma unroll
                for (unsigned nl = 0; nl < NCH; ++nl) {
                    const int n = half * NCH + nl;
                    const __half2 v2 = __floats2half2_rn(o[4 * n + 2 * r] * inv[r],
                                                         o[4 * n + 2 * r + 1] * inv[r]);
                    st_shared_u32(wrows + (g + 8 * r) * D + ((nl ^ key_w) * 16) + 4 * t,
                                  *(const unsigned*)&v2);
                }
            }
            __syncwarp();
#pragma unroll
            for (unsigned i = 0; i < 16 * NCH / 32; ++i) {
                const unsigned f = 32 * i + lane, rl = f / NCH, cl = f % NCH;
                const uint4 v = ld_shared_v4(wrows + rl * D + ((cl ^ ((rl / RPL) % NCH)) * 16));
                if ((int)rl < rows_left)
                    *(uint4*)(o_rows + (size_t)rl * D + half * (D / 2) + cl * 8) = v;
            }
            __syncwarp();
        }
    } else {
        // Straight from the accumulators: 4 bytes a thread a store, 8 rows x 16 bytes a warp store.
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = row0 + 8 * r;
            if (row >= Sq) continue;
            __half* dst = o_bh + (size_t)row * D + 2 * t;
#pragma unroll
            for (int n = 0; n < D / 8; ++n) {
                const __half2 v2 = __floats2half2_rn(o[4 * n + 2 * r] * inv[r],
                                                     o[4 * n + 2 * r + 1] * inv[r]);
                *(__half2*)(dst + 8 * n) = v2;
            }
        }
    }
    if (ctid == 0) {
        SP_STAMP(SP_CK_END + c, clock64());
        SP_STAMP(SP_GT_END + c, global_ns());
    }
}

// One CTA's work, a mixed launch's (MIXED) or any other's: two copies of an unmasked entry's
// body, so that the others' read %ctaid as before mixed launches existed (one body that chose
// its tile and head at run time held them in registers, and ran mission 1% slower on an H100).
template <class T, bool CAUSAL, bool MIXED>
__device__ __forceinline__ void sdpa_cta(u8* smem, Barriers& bars, const TmaDesc* tm_q,
                                         const TmaDesc* tm_k, const TmaDesc* tm_v,
                                         const float* __restrict__ q_scale,
                                         const float* __restrict__ k_scale,
                                         const float* __restrict__ v_scale,
                                         __half* __restrict__ out, int B, int H, int Hkv, int Sq,
                                         int Sk, float softmax_scale) {
    if (threadIdx.x == 0) {
        SP_STAMP(SP_GT_ENTRY, global_ns());
        SP_STAMP(SP_CK_ENTRY, clock64());
        SP_STAMP(SP_SM, sm_id());
    }
    const CtaWork work = cta_work<CAUSAL, MIXED>(Sq);
    const int m_block = work.m_block, bh = work.bh, b = bh / H, h = bh % H;
    const int kv_bh = b * Hkv + h / (H / Hkv);
    // Consumer warpgroups: the launch's (Tiles::NARROWS), else the entry's own count.
    const int nc = T::NARROWS ? (int)blockDim.x / 128 - 1 : T::CONSUMERS;
    if (blockDim.x % 128 != 0 || nc < 1 || nc > T::CONSUMERS ||
        (!T::NARROWS && blockDim.x != T::THREADS) ||
        (CAUSAL && CAUSAL_HEADS_FIRST && gridDim.x != (unsigned)(B * H)))
        __trap(); // a launch of another geometry than the module publishes
    const int n_tiles = kv_tiles(m_block, 64 * nc, Sq, Sk, CAUSAL);
    const int wg = threadIdx.x / 128;
    if (threadIdx.x == 0) SP_STAMP(SP_TILES, n_tiles);

    if (threadIdx.x == 0) {
        tma_prefetch_desc(tm_q);
        tma_prefetch_desc(tm_k);
        tma_prefetch_desc(tm_v);
        mbar_init(&bars.q_full, 1);
        for (int s = 0; s < KV_STAGES; ++s) {
            mbar_init(&bars.k_full[s], 1);
            mbar_init(&bars.v_full[s], 1);
            mbar_init(&bars.vt_full[s], 128);
            mbar_init(&bars.empty[s], 128 * nc);
        }
        mbar_init_fence();
        SP_STAMP(SP_CK_INIT, clock64());
#if SDPA_DELAY_CYCLES > 0
        const long long t0 = clock64();
        while (clock64() - t0 < SDPA_DELAY_CYCLES) {
        }
#endif
    }
    __syncthreads();
    if (threadIdx.x == 0) SP_STAMP(SP_CK_SYNCED, clock64());

    if (wg == 0) {
        regs_dealloc<T::PRODUCER_REGS>();
        if (n_tiles > 0)
            producer<T>(smem, bars, tm_q, tm_k, tm_v, nc, m_block, work.back, work.fewer, bh, kv_bh,
                        n_tiles, Sk);
    } else {
        regs_alloc<T::CONSUMER_REGS>();
        const float qk_scale = q_scale[bh] * k_scale[kv_bh] * (softmax_scale * 1.4426950408889634f);
        consumer<T, CAUSAL, MIXED>(smem, bars, wg - 1, nc, m_block, work.back, work.fewer, bh, b, h, H, kv_bh, Sq, Sk, n_tiles,
                            qk_scale, v_scale[kv_bh], out);
    }
}

template <class T, bool CAUSAL>
__device__ __forceinline__ void sdpa_body(const TmaDesc* tm_q, const TmaDesc* tm_k,
                                          const TmaDesc* tm_v, const float* __restrict__ q_scale,
                                          const float* __restrict__ k_scale,
                                          const float* __restrict__ v_scale,
                                          __half* __restrict__ out, int B, int H, int Hkv, int Sq,
                                          int Sk, float softmax_scale) {
    extern __shared__ u8 smem_raw[];
    __shared__ Barriers bars;
    u8* smem = (u8*)(((size_t)smem_raw + 1023) & ~(size_t)1023);
    if constexpr (!CAUSAL && T::MIXES) {
        if (mixed_launch<T, CAUSAL>(B * H, Sq)) {
            sdpa_cta<T, CAUSAL, true>(smem, bars, tm_q, tm_k, tm_v, q_scale, k_scale, v_scale, out,
                                      B, H, Hkv, Sq, Sk, softmax_scale);
            return;
        }
    }
    sdpa_cta<T, CAUSAL, false>(smem, bars, tm_q, tm_k, tm_v, q_scale, k_scale, v_scale, out, B, H,
                               Hkv, Sq, Sk, softmax_scale);
}

#define SDPA_ARGS                                                                              \
    const __grid_constant__ TmaDesc tm_q, const __grid_constant__ TmaDesc tm_k,                \
        const __grid_constant__ TmaDesc tm_v, const float *__restrict__ q_scale,               \
        const float *__restrict__ k_scale, const float *__restrict__ v_scale,                  \
        __half *__restrict__ out, int B, int H, int Hkv, int Sq, int Sk, int causal,           \
        float softmax_scale
#define SDPA_PASS &tm_q, &tm_k, &tm_v, q_scale, k_scale, v_scale, out, B, H, Hkv, Sq, Sk, softmax_scale
#define FUNCTION(NAME, TILES, CAUSAL_)                                                         \
    extern "C" __global__ void __launch_bounds__(TILES::THREADS, 1) NAME(SDPA_ARGS) {          \
        sdpa_body<TILES, CAUSAL_>(SDPA_PASS);                                                  \
    }
#define ENTRY(NAME, DIM, CAUSAL_) FUNCTION(NAME, Tiles<DIM>, CAUSAL_)
// A companion: Tiles<D, COMPANION_D<D>>, named <entry>_m<rows> (rows = 64 x COMPANION_D<D>).
#define COMPANION(NAME, DIM, C, CAUSAL_) FUNCTION(NAME, SDPA_COMPANION_TILES(DIM, C), CAUSAL_)
#define SDPA_COMPANION_TILES(DIM, C) Tiles<DIM, C>

#if (SDPA_D == 0 || SDPA_D == 64) && SDPA_CAUSAL != 1
ENTRY(sdpa_fp8_stage_d_wgmma_d64, 64, false)
#endif
#if (SDPA_D == 0 || SDPA_D == 64) && SDPA_CAUSAL != 0
ENTRY(sdpa_fp8_stage_d_wgmma_d64_causal, 64, true)
#endif
#if (SDPA_D == 0 || SDPA_D == 128) && SDPA_CAUSAL != 1
ENTRY(sdpa_fp8_stage_d_wgmma_d128, 128, false)
#endif
#if (SDPA_D == 0 || SDPA_D == 128) && SDPA_CAUSAL != 0
ENTRY(sdpa_fp8_stage_d_wgmma_d128_causal, 128, true)
#endif
#if (SDPA_D == 0 || SDPA_D == 64) && SDPA_CAUSAL != 1 && COMPANION_D64 == 2
COMPANION(sdpa_fp8_stage_d_wgmma_d64_m128, 64, 2, false)
#endif
#if (SDPA_D == 0 || SDPA_D == 64) && SDPA_CAUSAL != 0 && COMPANION_D64 == 2
COMPANION(sdpa_fp8_stage_d_wgmma_d64_causal_m128, 64, 2, true)
#endif
#if (SDPA_D == 0 || SDPA_D == 128) && SDPA_CAUSAL != 1 && COMPANION_D128 == 2
COMPANION(sdpa_fp8_stage_d_wgmma_d128_m128, 128, 2, false)
#endif
#if (SDPA_D == 0 || SDPA_D == 128) && SDPA_CAUSAL != 0 && COMPANION_D128 == 2
COMPANION(sdpa_fp8_stage_d_wgmma_d128_causal_m128, 128, 2, true)
#endif
