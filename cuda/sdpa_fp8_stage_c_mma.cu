// sdpa_fp8_stage_c_mma.cu — Stage-C FP8 scaled-dot-product attention on the tensor cores.
//
// O = softmax(softmax_scale · Q Kᵀ + mask) V for Q of shape [B, H, S_q, D] and K, V of shape
// [B, H_kv, S_k, D] (row-major), given as FP8 E4M3 codes with one f32 scale per (batch, head)
// per tensor (K and V per K/V head). O is f16 [B, H, S_q, D]. D is 64 or 128, with or without
// the causal mask: one instantiation each (sdpa_entry<D, CAUSAL>), entries
// sdpa_fp8_stage_c_mma_d64, _d64_causal, _d128 and _d128_causal, and the D = 128 entries'
// companions _d128_m32 and _d128_causal_m32 ("Warps" below).
// GQA/MQA: query head h reads K/V head h / (H / H_kv). Any S_q, S_k >= 1 work: keys past S_k
// are masked, rows past S_q are neither read nor written.
// Causal (causal != 0) is bottom-right aligned: query i sees keys j <= i + S_k - S_q. A warp
// runs only the KV tiles its rows see a key of (tiles wholly above the diagonal are skipped,
// not masked; a CTA loads no step past its last row's keys); the tiles the diagonal crosses
// are masked per element. A row that sees no key (S_q > S_k) is written as zeros. Causal
// CTAs are scheduled heaviest first over the whole grid (CAUSAL_HEADS_FIRST: cta_head, cta_tile).
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
//   SHORT_Q_STAGES=N  stages of the pipeline of a short GQA/MQA query at D = 128 (default 4,
//                   measured: docs/PERF.md change 15), run where the launch gives its shared
//                   memory (SDPA_SMEM_BYTES_D128_SHORT; `deep_pipeline`); a depth no deeper
//                   than CP_STAGES, or one past 227 KB, builds no deeper body.
//   SHORT_Q_EXPECT_DEEP  test hook, never in normal builds: a short GQA/MQA query at D = 128
//                   that reaches the shallow body traps (tests/gpu_kernel.rs).
//   ROW_WARPS=R, KV_SPLIT=K  the warp grid (defaults 2 x 2, chosen by measurement:
//                   docs/PERF.md; R·K <= 16 and a step's codes must split into whole 16-byte
//                   chunks per thread: R of 1, 2, 4 or 8). K changes the summation order;
//                   src/emulation/mod.rs follows the published SDPA_KV_SPLIT.
//   CAUSAL_HEADS_FIRST=0|1  the grid of a causal launch (cta_head, cta_tile): 1, the default,
//                   (B·H, query tiles), every head's last query tile first; 0 (query tiles,
//                   B·H), each head's from its last, head after head. Published as
//                   SDPA_CAUSAL_HEADS_FIRST, from which the host builds the grid (launch.rs
//                   `launch_dims`); as Stage D's, docs/PERF.md "Stage C and D, change 36".
//   SDPA_DELAY_CYCLES=N  test hook, never set in normal builds: every CTA that runs (not
//                   those a packed group leaves idle) waits N clock cycles before its first load (thread 0 spins between two barriers), a
//                   fixed planted slowdown that proves the runner's SLOWER verdict and its
//                   power (scripts/prove_power.sh). Held before any work by every warp of
//                   the CTA, it costs about the wait per wave of CTAs, less what other CTAs
//                   and the launch's stagger hide (docs/DESIGN.md "Measured noise floors").
//                   Unset, it compiles to nothing.
//   SDPA_D=64|128, SDPA_CAUSAL=0|1  the entry this module holds (the runner builds one module
//                   per (D, causal), each only when a problem needs it; unset, all four):
//                   NVRTC's time per module stays that of one entry, and the plain path
//                   carries no mask logic of the causal one.
//   SPLIT_KV_CTAS=N, SPLIT_KV_CTAS_8=N8, SPLIT_KV_MAX=M  the working CTAs split KV aims for
//                   (128; with S_q <= 8, 2N: 256) and the most CTAs a query tile's steps go to
//                   (64), published as SDPA_SPLIT_KV_CTAS/_CTAS_8/_MAX (measured: docs/PERF.md
//                   changes 17 and 25); NO_SPLIT_KV publishes 0 (never split).
//   RESCALE_THRESHOLD=T  how far (log2 units) a tile's maximum must pass the running maximum
//                   before it moves (step 3; default 8, 0 the exact maximum), published as
//                   SDPA_RESCALE_THRESHOLD: it changes the output's bits, so the runner refuses a
//                   build whose value is not its manifest entry's `rescale_threshold`.
//   LAZY_TILE_MAX=0|1  1, the default: a 32-row warp takes its rows' quad maxima only where
//                   some lane's own maximum passes m + the threshold (step 3); the same bits.
//                   Against 0: +2% on D 128 causal prefill (cp1), SAME to +0.9% elsewhere
//                   (docs/PERF.md change 32).
//   INT_LANE_MAX=0|1|2  where a lane's row maxima of a tile are taken as integers, by
//                   three-input integer maxima of the scores' bits (lane_row_tree, VIMNMX3: 8
//                   instructions a row where fmaxf takes 16; minima where a lane's scores of a
//                   row are all below zero): the same floats, so the same bits. 1, the default:
//                   the 32-row bodies (D 128's entries), +0.4-1.6% on D 128 prefill against
//                   HEAD's kernel, SAME where half the rows' scores are all negative
//                   (dist=negative);
//                   2: every body, +0.7-1.6% on D 64's large but -0.4-0.9% on mission and -1%
//                   on cfg-chunk's companion (docs/PERF.md change 33); 0: fmaxf everywhere.
//   TMA_KV=0|1      1, the default: with USE_CP_ASYNC=1, the 32-row bodies (D 128 queries
//                   longer than SHORT_Q_ROWS) load each step's K and V codes by TMA (one thread
//                   issues two cp.async.bulk.tensor boxes of STEP_KEYS rows into the stage, an
//                   mbarrier a stage says when they landed) where every thread issued 16
//                   cp.async of 16 bytes and their addresses; 0: cp.async there too. The same
//                   codes in the same places (TMA's 128-byte swizzle is the layout's, below),
//                   so the same bits (docs/PERF.md change 35).
//   TMA_ISSUE_LATE  test hook, never in normal builds: a TMA body issues the copies of step
//                   n + stages - 1 at the end of step n (not at its start; with the default 2
//                   stages, the step before theirs), so they land after the barrier that begins
//                   their step: a missing mbarrier wait then reads a stale stage, which results
//                   show (`selftest` builds MUTANT_TMA_SKIP_WAIT with it).
//   MUTANT_*        planted bugs for `sdpa-runner selftest`, never set in normal builds; each
//                   sits in one #ifdef/#ifndef block, and the self-test proves the clean PTX is
//                   identical with those blocks removed. Their names say what they break.
//
// Arguments (cuda/kernels.toml abi = "pointers-and-kv-maps"): the pointers, sizes and workspace
// of SDPA_ARGS, then the address of K's and V's TMA tensor maps in global memory (dim, key,
// batch·K/V head; box D x STEP_KEYS, swizzled by D bytes; src/backend/cuda/tensor_map.rs),
// which only the TMA bodies read. By address, not by value: 256 more bytes of arguments a
// launch cost the main job's mission 1.4-1.5% (docs/PERF.md change 35).
// K/V by TMA (TMA_KV, the 32-row bodies of cp1): thread 0 initialises one mbarrier a stage,
// then per step arms the stage's barrier with the step's 2·STEP_KEYS·D bytes and issues K's and
// V's boxes at (0, first key, K/V head) into it; every thread waits on the barrier's phase
// (parity (n / stages) & 1 for the CTA's step n) before the step's barrier. Keys past S_k are
// zero-filled by the TMA unit, as the cp.async copies zero-fill them; under the causal mask
// keys past the CTA's last row's (which cp.async zero-fills) are loaded, and masked like every
// key a row does not see, so their P is 0 and the sums the same. The stages must begin at
// multiples of 1024 bytes (the 128-byte swizzle's period): the body aligns its shared memory
// up, and SDPA_SMEM_BYTES_D128 holds 1 KB of slack for it.
// Launch: grid (ceil(S_q / tile rows), B*H, C) (causal, with SDPA_CAUSAL_HEADS_FIRST: (B*H,
// ceil(S_q / tile rows), C): cta_head, cta_tile), C = 1 but for split KV (below), THREADS threads,
// SDPA_SMEM_BYTES_D<D> of dynamic
// shared memory (a short GQA/MQA query at D = 128: SDPA_SMEM_BYTES_D128_SHORT, where the
// build has a deeper body and the device allows it; "Short queries" below). The host reads the SDPA_* constants below from the module instead of
// repeating them.
//
// Short queries (S_q <= 16, GQA/MQA decode): consecutive query heads of one K/V head run in
// one CTA, a pack, and the pack's other CTAs exit at once (`pack_of`): with S_q <= 8, 2·R heads,
// each row warp holding two (its fragment rows g and g + 8 are query row g of heads y0 + 2rw
// and y0 + 2rw + 1); else R heads, row warp rw holding head y0 + rw. Each K/V step is loaded
// once for the pack, and the MMA rows S_q fills are real ones. Per row the arithmetic is
// unchanged (but split KV's C counts the packs: below). Every entry but the plain D = 64 one (held to 128 registers) does it;
// NO_HEAD_PACKING turns it off, NO_HEAD_PAIRS the packs of 2·R, for A/Bs.
// A pack streams its K/V head with few CTAs (spec-decode, 8×32×16×128 at S_k 4096, H_kv 8:
// 128 CTAs, one an SM; llama-decode, S_q 1, splits its keys over 256: below), so at D = 128
// a short GQA/MQA query whose CTAs fit one an SM runs a SHORT_Q_STAGES-deep pipeline: the
// host launches it with SDPA_SMEM_BYTES_D128_SHORT of shared memory (identity/geometry.rs
// `launch_smem_bytes`, from SDPA_PACK_HEADS_8/16 and the SM count; with more packs the entry's
// two CTAs an SM win), and the kernel takes the deep path only where the launch gave that much
// (`deep_pipeline`, %dynamic_smem_size). The depth changes when codes land, never what is
// computed.
// Split KV (SPLIT_KV_CTAS, SPLIT_KV_CTAS_8, SPLIT_KV_MAX, NO_SPLIT_KV): a short query at D = 128 whose working
// CTAs are few (1×32×1×128 at S_k 32768, H_kv 8: 8 packs on 132 SMs) has its query tile's KV
// steps dealt to C = gridDim.z CTAs, the host's choice (identity/geometry.rs `kv_ctas`: about 128
// working CTAs, 256 with S_q <= 8, at most SPLIT_KV_MAX, at most one per step). CTA z runs steps z, z + C, ...;
// its warps park their (O, m, l) in the launch's workspace, and the last CTA to arrive merges
// every chain in order and stores the rows (`split_kv_end`). Chain z·KV_SPLIT + split holds
// exactly the tiles t ≡ z·KV_SPLIT + split (mod C·KV_SPLIT), so the arithmetic is that of a
// CTA with C·KV_SPLIT splits, which the emulation follows. A launch with C = 1 runs a body
// compiled without the split (`sdpa_split_or_not`). The deep pipeline's rule counts all
// packs × C CTAs.
//
// Warps: a CTA owns BLOCK_M = 16·R query rows of one (b, h) and has R·K warps. Warp w owns the
// 16 rows [16·(w % R), +16) (packed, above: rows [0, 16) of head y0 + w % R, or rows [0, 8) of
// heads y0 + 2(w % R) and y0 + 2(w % R) + 1) and KV split w / R: split k takes KV tiles k, k + K, k + 2K, ...
// of BLOCK_N = 64 keys, so one CTA step brings STEP_KEYS = 64·K keys into shared memory and
// each warp eats one tile of it. Splitting the keys shortens each warp's serial chain K-fold
// and puts K times more warps on the SMs; the splits are merged once, at the end.
// D = 128, queries longer than SHORT_Q_ROWS (D128_WARP_ROWS=32, the default): each warp owns
// 32 rows, two MMA blocks (MB = 2: rows [32·(w % R), +32), query tiles of SDPA_BLOCK_M_D128 =
// 32·R rows), so every K and V fragment it decodes (and every ldmatrix) feeds two MMAs, one per
// block: per 16 rows and 64 keys the loop issues about 860 instructions where 16-row warps
// issue about 1,160 (NVRTC 13.0's SASS, docs/PERF.md change 30). Per row every operation and
// its order are those of a 16-row warp, so the output bits are the same. At 255 registers
// (128 O accumulators and 64 scores a lane) the body keeps nothing else across the loop: the
// running (m, l) live in shared memory between tiles, Q's fragments are parked once per row
// warp (split 0 writes them, every split reads them after the loop's first barrier), and the
// lane's addresses are computed again from %tid where used. Each D = 128 module also holds a
// companion `<entry>_m32` (WIDE = false: 16-row warps, 32-row tiles, the code of the entries
// before change 30), which the host launches where its CTAs end sooner (problems of few CTAs,
// decode: cuda/kernels.toml `narrow_d128`); short queries run one block a warp in either.
//
// K and V stay FP8 codes in shared memory; each warp decodes them on the way into its MMA
// fragments (every E4M3 value is an f16, so decoding is exact). Per tile, in registers
// (FlashAttention-2 style; mma.sync m16n8k16, f16 in, f32 accumulate):
//   1. The step's K and V codes land in a code tile (cp0: loads and stores; cp1: cp.async, or
//      at D 128 in the 32-row bodies TMA: TMA_KV and "K/V by TMA" below).
//   2. S = Q Kᵀ: 8 key blocks x 4 k-steps of 16. The k-steps' dims are taken in the order
//      that puts a lane's four fragment codes side by side: MMA k-index 2q, 2q+1, 2q+8, 2q+9
//      <-> dims 4q .. 4q+3 of the 16-dim chunk, for Q (its A fragment, from global memory) and
//      K alike, so each k-step still sums the same 16 products. One ldmatrix of K codes (as
//      b16) gives a key block's fragments for 4 k-steps (two blocks a warp: 4 key blocks'
//      fragments of one k-step): 2 cvt e4m3x2 -> f16x2 each, the second reading the
//      register's upper half in place (no shift).
//   3. Online softmax in base 2 on the unscaled accumulators, the scale fused into the
//      exponent (cuda/kernels.toml `score = "fused"`): with t = rowmax(acc) · qk_scale, the
//      running maximum moves to t only where t > m + RESCALE_THRESHOLD (8, `rescale_threshold`:
//      FlashAttention-4's conditional rescale), m_new = that or m; alpha = exp2(m - m_new),
//      P = f16(exp2(fma(acc, qk_scale, -m_new))), up to 2^8 where m lags (ex2.approx.ftz: the
//      same f16 bits as exp2f). The row sum is P·1 on the tensor cores (`row_sum = "mma"`):
//      l *= alpha, then per k-step one m16n8k16 of the step's P against a B of ones, whose
//      every column is the row's sum, on every lane of the quad. Against the scaled scores
//      and four lanes' f32 partial sums of before, 64 FMUL, 64 FADD and 64 conversions fewer
//      a tile (32 rows, 64 keys) for 8 HMMA: 3-8% faster (docs/PERF.md change 31).
//      Past a row's first tiles m rarely moves on real inputs, so a 32-row warp (D 128) asks
//      once whether any lane's own maximum passes m + the threshold (LAZY_TILE_MAX): where none
//      does, the quads' shuffles, the alphas and O's 128 FMUL are skipped, the same bits
//      (change 32: 3% faster at D 128 than the exact maximum, 2% more on causal ones). Its
//      lanes take their own maxima as integers (INT_LANE_MAX, change 33: the same floats).
//   4. O *= alpha; O += P V with P straight from the accumulators as A fragments. V codes
//      come by ldmatrix.trans (b16: a lane gets keys 2q, 2q+1 x dims 2g, 2g+1) and one prmt
//      per fragment sorts the bytes into keys 2q, 2q+1, 2q+8, 2q+9 of dim 2g (or 2g+1): the
//      two MMAs of a 16-dim chunk c own its even and odd dims, so a lane's accumulators hold
//      dims 16c + 4q .. 16c + 4q + 3 of rows g and g + 8.
// End: splits 1..K-1 park (m, l, O) in shared
// memory; split 0 merges: M = max m_k, a_k = exp2(m_k - M), O = O_0·a_0 then fma(O_k, a_k, O),
// likewise l; stores f16(O · (v_scale / l)), four adjacent dims per 8-byte store.
//
// Scales: codes are decoded exactly and the scales applied in f32 where it is cheapest:
//   qk_scale = (q_scale * k_scale) * (softmax_scale * log2 e) in the exponent's fma (and on
//   each tile's row maximum), v_scale at the end.
// src/emulation/mod.rs mirrors every step above in the same precisions and order (and
// cuda/emulation_f32.cu mirrors it, bit for bit); keep them in step.
//
// Shared memory (dynamic): code tiles of one step, K then V, each [STEP_KEYS][D] u8 with rows
// of D bytes and no padding; the 16-byte chunk c of row r lives at chunk c ^ swz(r), with
// swz(r) = (r >> 1) & 3 at D = 64 (two rows per 128-byte line) and r & 7 at D = 128, so the 8
// rows one ldmatrix matrix reads hit 8 different bank groups (conflict-free). At D = 128 a key
// block's K fragments take two ldmatrix (chunks 0-3, 4-7: offset XOR 64; two blocks a warp:
// k-step kk's chunk at offset XOR 16·kk) and P·V four chunk pairs (offset XOR 32·c2, c2 < 4). Then
// each warp's Q fragments (decoded once, read back per tile, so they hold no registers across
// the P·V half of the loop: at 128 registers that is what keeps the kernel free of spills).
//   offset                 region                              bytes (R = K = 2)  D=64   D=128
//   s·STAGE_BYTES          stage s: K codes [STEP_KEYS][D]                         8192   16384
//   + STEP_CODE_BYTES               V codes [STEP_KEYS][D]                         8192   16384
//   OFF_Q = STAGES·STAGE_BYTES  Q fragments [warp][k-step][lane] uint4  NUM_WARPS·D·32 8192 16384
//     (two blocks a warp: [row warp][block][k-step][lane], ROW_WARPS·2·D·32 = 16384 at D = 128)
//   OFF_STATE (D = 128, two blocks)  (m, l) [warp][block][lane] float4  NUM_WARPS·2·512    -   4096
//   stages: 1 (USE_CP_ASYNC=0), CP_STAGES (USE_CP_ASYNC=1), SHORT_Q_STAGES (cp1, short queries)
//   total (R = K = 2): D=64: 24576 (cp0), 40960 (cp1, 2 stages);
//                      D=128: 53248 (cp0), 86016 (cp1, 2 stages), 147456 (cp1, short: 4 stages);
//                      the companions launch with their entry's (they need 49152 and 81920).
//   After the last step the splits' (m, l, O) are parked from offset 0 for the merge
//   (PARK_BYTES: 9216 at D = 64, 17408 at D = 128 for R = K = 2, 34816 with two blocks a warp;
//   SMEM_BYTES grows to fit it for larger grids; each thread reads its own (m, l) before). A split launch's last CTA instead holds the merge's weights and row sums
//   there: BLOCK_M x (2 x C x KV_SPLIT + 1) floats, at most 32,896 bytes (a static_assert).
//
// Resources per entry (the resource gates, gates/default.json "resources" and
// "resources_by_entry"; every entry spill-free):
//   d64          32 O accumulators and 32 scores per lane: 128 registers, 4 CTAs of 128
//                threads per SM (the main job's kernel; the limit it always had).
//   d64_causal   the same plus the diagonal mask's two row limits and column indices in the
//                score phase: at 128 registers it spilled 16 (cp0) and 28 (cp1) bytes, so it
//                is allowed 168 (3 CTAs per SM).
//   d128, d128_causal  128 O accumulators and 64 scores a lane (two blocks): 246-255 of 255
//                registers (2 CTAs per SM, which 84 KB of shared memory for cp1 allows
//                anyway), up to 96 KB of shared memory; their companions (one block: 64 O
//                accumulators) 178-226. A short GQA/MQA
//                query whose CTAs fit one an SM launches with 144 KB: its packs are few (one
//                per K/V head), so it is the pipeline's depth, not the CTAs per SM, that feeds
//                them.
// D = 256 would need 128 accumulators per lane beside the scores: past 255 registers with this
// warp grid, so it is refused.

#include <cuda_fp16.h>
#include <cuda_pipeline_primitives.h>

#include "fp8_e4m3.cuh"
#include "hopper_async.cuh"

#ifndef USE_CP_ASYNC
#define USE_CP_ASYNC 0
#endif
#if USE_CP_ASYNC != 0 && USE_CP_ASYNC != 1
#error "USE_CP_ASYNC must be 0 or 1"
#endif
#ifndef SDPA_DELAY_CYCLES
#define SDPA_DELAY_CYCLES 0
#endif
#ifndef CAUSAL_HEADS_FIRST
#define CAUSAL_HEADS_FIRST 1
#endif
#if CAUSAL_HEADS_FIRST != 0 && CAUSAL_HEADS_FIRST != 1
#error "CAUSAL_HEADS_FIRST must be 0 or 1"
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
// The cp.async pipeline's depth for short GQA/MQA queries at D = 128 (the header's "Short
// queries"), where the host launches with SDPA_SMEM_BYTES_D128_SHORT of shared memory.
#ifndef SHORT_Q_STAGES
#define SHORT_Q_STAGES 4
#endif
// Rows a warp owns at D = 128 (the header's "Warps"): 32, or 16 for A/Bs.
#ifndef D128_WARP_ROWS
#define D128_WARP_ROWS 32
#endif
#if D128_WARP_ROWS != 16 && D128_WARP_ROWS != 32
#error "D128_WARP_ROWS must be 16 or 32"
#endif
#define SHORT_Q_ROWS 16 // S_q at or below which a query is short
// Split KV (the header's "Short queries"): a short query at D = 128 whose CTAs are few has its
// KV steps dealt to gridDim.z CTAs; the host picks gridDim.z <= SPLIT_KV_MAX so that about
// SPLIT_KV_CTAS (with S_q <= 8, SPLIT_KV_CTAS_8) CTAs work (src/backend/cuda/identity/geometry.rs
// `kv_ctas`). NO_SPLIT_KV publishes 0:
// the host then never splits.
#ifndef SPLIT_KV_CTAS
#define SPLIT_KV_CTAS 128
#endif
// The same for S_q <= 8: two CTAs an SM rather than one. Those queries' packs do the least
// arithmetic per K/V byte (at most 8 rows of each head), so their time is the cache's stream,
// which more CTAs in flight feed; with 9-16 rows the target above measured faster (docs/PERF.md
// change 25: spec-decode 4% slower at 256 on an H100 and an H200).
#ifndef SPLIT_KV_CTAS_8
#define SPLIT_KV_CTAS_8 (2 * SPLIT_KV_CTAS)
#endif
#ifndef SPLIT_KV_MAX
#define SPLIT_KV_MAX 64
#endif
// The entry this module holds: 64 or 128 (the runner compiles one module per D, each in its
// own NVRTC program, so a run builds only the D its problems need), 0 for both.
#ifndef SDPA_D
#define SDPA_D 0
#endif
#if SDPA_D != 0 && SDPA_D != 64 && SDPA_D != 128
#error "SDPA_D must be 64, 128 or 0 (both)"
#endif
// With or without the causal mask: 0, 1, or -1 for both.
#ifndef SDPA_CAUSAL
#define SDPA_CAUSAL -1
#endif

typedef unsigned char u8; // an FP8 E4M3 code (NVRTC has no <cstdint>)
#define NEG_INF (-__int_as_float(0x7f800000))
// The running maximum of a row that has seen no key yet: -FLT_MAX rather than -inf, so that a
// tile the mask hides wholly from a row gives alpha = exp2(0) = 1 and P = exp2(-inf) = 0 (the
// state keeps its bits) and the first visible tile alpha = exp2(-FLT_MAX - m) = 0, exactly as
// -inf would, with no branch and no NaN from -inf - -inf.
#define M_NONE (-3.40282347e38f)
// How far (log2 units) a tile's scaled maximum must pass a row's running maximum m before m
// moves to it (cuda/kernels.toml `rescale_threshold`, published as SDPA_RESCALE_THRESHOLD and
// checked against the manifest when the module loads): step 3 of the header. 0 is the exact
// running maximum; any other value changes the output's bits, which the emulation follows
// only through the manifest.
#ifndef RESCALE_THRESHOLD
#define RESCALE_THRESHOLD 8
#endif
#ifndef LAZY_TILE_MAX
#define LAZY_TILE_MAX 1
#endif
// Where a lane's row maxima of a tile are taken as integers (lane_row_tree; the same floats): 0
// nowhere, 1 in the 32-row bodies (D 128's entries), 2 in every body.
#ifndef INT_LANE_MAX
#define INT_LANE_MAX 1
#endif
// K/V by TMA in the 32-row bodies of cp1 (the header's "K/V by TMA"); sm_90 and up only.
#ifndef TMA_KV
#define TMA_KV 1
#endif
#if TMA_KV != 0 && TMA_KV != 1
#error "TMA_KV must be 0 or 1"
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define SM90_TMA 1
#else
#define SM90_TMA 0
#endif
#if INT_LANE_MAX < 0 || INT_LANE_MAX > 2
#error "INT_LANE_MAX is 0 (fmaxf), 1 (32-row bodies) or 2 (all bodies)"
#endif
#if RESCALE_THRESHOLD < 0 || RESCALE_THRESHOLD > 8
#error "RESCALE_THRESHOLD is 0 to 8 (weights below 2^9: the error model's range)"
#endif

#define BLOCK_N 64 // keys per tile (one warp's share of a step)
constexpr int NUM_WARPS = ROW_WARPS * KV_SPLIT;
constexpr int THREADS = 32 * NUM_WARPS;
constexpr int STEP_KEYS = BLOCK_N * KV_SPLIT;
constexpr int STAGES = USE_CP_ASYNC ? CP_STAGES : 1;
// The 16-row MMA blocks a warp owns: two (32 rows) in the D = 128 bodies of queries longer
// than SHORT_Q_ROWS (the header's "Warps"), one everywhere else. BLOCK_M follows.
template <int D>
constexpr int WARP_MB = D == 128 ? D128_WARP_ROWS / 16 : 1;
template <int MB>
constexpr int BLOCK_M_OF = 16 * MB * ROW_WARPS;
// Whether a body of MB blocks a warp at D loads K and V by TMA (TMA_KV).
template <int D, int MB>
constexpr bool KV_BY_TMA = USE_CP_ASYNC && TMA_KV && SM90_TMA && D == 128 && MB > 1;
// Shared memory a TMA body's launch holds beyond its layout: the alignment of its stages to
// 1024 bytes.
constexpr int TMA_SLACK = KV_BY_TMA<128, WARP_MB<128>> ? 1024 : 0;
constexpr int BLOCK_M = BLOCK_M_OF<1>;

// Everything that depends on the head dimension D and the warp's rows: the tiles' sizes, the
// shared-memory layout (the header's table) and the swizzle.
template <int D, int ST = STAGES, int MB = 1>
struct Geo {
    static constexpr int HEAD_DIM = D;
    static constexpr int CHUNKS_PER_ROW = D / 16;
    static constexpr int STEP_CODE_BYTES = STEP_KEYS * D;   // codes of one step of K (or V)
    static constexpr int CHUNKS_PER_THREAD = STEP_CODE_BYTES / 16 / THREADS;
    static constexpr int STAGE_BYTES = 2 * STEP_CODE_BYTES;  // K codes, then V codes
    static constexpr int OFF_Q = ST * STAGE_BYTES;           // each warp's Q fragments
    static constexpr int Q_FRAG_BYTES = MB * D / 16 * 4 * 4 * 32; // per warp: MB·D/4 registers x 32 lanes
    // A parked split: per lane and MMA block D/2 O values, then m[2], l[2]; stored lane-major
    // (conflict-free).
    static constexpr int PARK_FLOATS = MB * (D / 2 + 4) * 32;
    static constexpr int PARK_BYTES = (KV_SPLIT - 1) * ROW_WARPS * PARK_FLOATS * 4;
    // After the loop nothing in shared memory is live (Q fragments included), so the parking
    // may use all of it; large grids (4 x 2 and up) need more than one stage.
    // Q's parked fragments: one copy per warp, or with two blocks one per row warp, which its
    // KV splits share (split 0 writes it): 96 KB at D = 128 with cp.async would not leave
    // room for the static shared memory within the resource gate's limit.
    static constexpr int Q_PARKS = MB == 1 ? NUM_WARPS : ROW_WARPS;
    // With two blocks each lane's running (m, l) of its four rows, one float4 per block, live
    // in shared memory between tiles (lane-major: conflict-free), so that the Q·Kᵀ half of the
    // loop, where O and S take 192 of the 255 registers, holds none of them.
    static constexpr int OFF_STATE = OFF_Q + Q_PARKS * Q_FRAG_BYTES;
    static constexpr int STATE_BYTES = MB == 1 ? 0 : NUM_WARPS * MB * 32 * 16;
    static constexpr int SMEM_BYTES = OFF_STATE + STATE_BYTES > PARK_BYTES ? OFF_STATE + STATE_BYTES
                                                                            : PARK_BYTES;
    static_assert(STEP_CODE_BYTES % (16 * THREADS) == 0, "each thread moves whole 16-byte chunks");
    // Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled code tile.
    static __device__ __forceinline__ int swizzled(int row, int chunk) {
        const int swz = D == 64 ? (row >> 1) & 3 : row & 7;
        return row * D + ((chunk ^ swz) << 4);
    }
};

static_assert(ROW_WARPS >= 1 && KV_SPLIT >= 1 && NUM_WARPS <= 16, "1..16 warps");
static_assert(CP_STAGES >= 2 && CP_STAGES <= 8, "2..8 cp.async stages");
static_assert(SHORT_Q_STAGES >= 2 && SHORT_Q_STAGES <= 8, "2..8 cp.async stages");
// The depth of a short query's pipeline: SHORT_Q_STAGES with cp.async (cp0 has one stage).
constexpr int SHORT_STAGES = USE_CP_ASYNC ? SHORT_Q_STAGES : 1;

// Read by the host after loading the module: launch geometry and identity of this build.
extern "C" __constant__ int SDPA_BLOCK_M = BLOCK_M;
// D = 128's query tile: its launch grid and the sampled check's tiles (a short query, one
// query tile either way, runs the 16-row body in it).
extern "C" __constant__ int SDPA_BLOCK_M_D128 = BLOCK_M_OF<WARP_MB<128>>;
extern "C" __constant__ int SDPA_BLOCK_N = BLOCK_N;
// A causal launch's grid is (B·H, query tiles) (cta_head, cta_tile).
extern "C" __constant__ int SDPA_CAUSAL_HEADS_FIRST = CAUSAL_HEADS_FIRST;
extern "C" __constant__ int SDPA_RESCALE_THRESHOLD = RESCALE_THRESHOLD;
extern "C" __constant__ int SDPA_KV_SPLIT = KV_SPLIT;
extern "C" __constant__ int SDPA_THREADS = THREADS;
extern "C" __constant__ int SDPA_SMEM_BYTES_D64 = Geo<64>::SMEM_BYTES;
// Both D = 128 bodies of this depth run in a launch of it (the entry's short queries and its
// companion have one block a warp), so it gets the larger of their layouts (the two-block one
// in the default grid; a grid of KV_SPLIT >= 3 parks more Q with one block a warp).
constexpr int SMEM_D128 = Geo<128, STAGES, WARP_MB<128>>::SMEM_BYTES > Geo<128, STAGES, 1>::SMEM_BYTES
                              ? Geo<128, STAGES, WARP_MB<128>>::SMEM_BYTES
                              : Geo<128, STAGES, 1>::SMEM_BYTES;
extern "C" __constant__ int SDPA_SMEM_BYTES_D128 = SMEM_D128 + TMA_SLACK;
// K's and V's tensor maps (the abi's) are swizzled alike, by D bytes.
extern "C" __constant__ int SDPA_V_SWIZZLE = 1;
// Whether this build has the deeper body at all: more stages than the entries' own, within
// the 227 KB a block may have on sm_90 (a grid such as KV_SPLIT=4 would need more: no deep body).
constexpr bool HAS_DEEP = SHORT_STAGES > STAGES && Geo<128, SHORT_STAGES>::SMEM_BYTES <= 232448;
// Short GQA/MQA queries at D = 128 (S_q <= SDPA_SHORT_Q_ROWS, H_kv < H) launch with this much
// instead (0: no deeper body, every launch gets SDPA_SMEM_BYTES_D128); the host launches with
// it only where the device allows a block that much, and the kernel checks what it got
// (`deep_pipeline`).
extern "C" __constant__ int SDPA_SHORT_Q_ROWS = SHORT_Q_ROWS;
// The query heads a D = 128 CTA packs with S_q <= 8 and with S_q <= 16 (`pack_of`): the host
// launches the deeper pipeline only where the packs fit one CTA an SM (identity/geometry.rs).
#if defined(NO_HEAD_PACKING)
extern "C" __constant__ int SDPA_PACK_HEADS_8 = 1;
extern "C" __constant__ int SDPA_PACK_HEADS_16 = 1;
#elif defined(NO_HEAD_PAIRS)
extern "C" __constant__ int SDPA_PACK_HEADS_8 = ROW_WARPS;
extern "C" __constant__ int SDPA_PACK_HEADS_16 = ROW_WARPS;
#else
extern "C" __constant__ int SDPA_PACK_HEADS_8 = 2 * ROW_WARPS;
extern "C" __constant__ int SDPA_PACK_HEADS_16 = ROW_WARPS;
#endif
extern "C" __constant__ int SDPA_SMEM_BYTES_D128_SHORT = HAS_DEEP ? Geo<128, SHORT_STAGES>::SMEM_BYTES : 0;
// Split KV: the CTAs a short D = 128 query's split aims for (with S_q <= 16, and with
// S_q <= 8) and the most CTAs one query tile's steps may be dealt to (0: no split; every
// launch has gridDim.z = 1).
#ifdef NO_SPLIT_KV
extern "C" __constant__ int SDPA_SPLIT_KV_CTAS = 0;
extern "C" __constant__ int SDPA_SPLIT_KV_CTAS_8 = 0;
extern "C" __constant__ int SDPA_SPLIT_KV_MAX = 0;
#else
extern "C" __constant__ int SDPA_SPLIT_KV_CTAS = SPLIT_KV_CTAS;
extern "C" __constant__ int SDPA_SPLIT_KV_CTAS_8 = SPLIT_KV_CTAS_8;
extern "C" __constant__ int SDPA_SPLIT_KV_MAX = SPLIT_KV_MAX;
#endif
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

// exp2 of a score for P, which is rounded to f16 at once: ex2.approx.ftz gives 0 for results
// below 2^-126 where exp2f returns a value of at most 2^-126, and both round to the same f16 +0
// (every value at or below 2^-25 does), so P's bits are exp2f's, without exp2f's range check.
__device__ __forceinline__ float exp2_for_p(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

// A lane's maximum (MIN: minimum) of its 16 scores of fragment row i (g or g + 8) of one MMA
// block, taken over the floats' bits as signed integers by three-input integer maxima (VIMNMX3,
// a DPX instruction of sm_90: 8 where fmaxf takes 16; on an older GPU, whose "native" build
// the manifest allows, CUDA emulates it in several instructions, where INT_LANE_MAX=0 is the
// switch). Why these give the floats' maximum: the tile maxima in the loop (INT_LANE_MAX).
template <bool MIN, int NB>
__device__ __forceinline__ int lane_row_tree(const float (&s)[NB][4], int i) {
    static_assert(NB == 8, "the tree is of a lane's 16 scores of a row");
    auto v = [&](int k) { return __float_as_int(s[k >> 1][2 * i + (k & 1)]); };
    auto m3 = [](int a, int b, int c) { return MIN ? __vimin3_s32(a, b, c) : __vimax3_s32(a, b, c); };
    const int a = m3(v(0), v(1), v(2)), b = m3(v(3), v(4), v(5)), c = m3(v(6), v(7), v(8)),
              d = m3(v(9), v(10), v(11)), e = m3(v(12), v(13), v(14));
    const int x = m3(a, b, c), y = m3(d, e, v(15));
    return MIN ? min(x, y) : max(x, y);
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

// ---- where a CTA and a warp are: read again where used, not held across the loop ----------
// At 128 registers (D = 64) nothing beyond the original S may stay live across the KV loop,
// so these are re-read from %ctaid / %tid (volatile: never hoisted) and recomputed from the
// kernel's parameters, which live in the constant bank, wherever they are needed.

__device__ __forceinline__ int ctaid_x() {
    int r;
    asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(r));
    return r;
}
__device__ __forceinline__ int ctaid_y() {
    int r;
    asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(r));
    return r;
}
__device__ __forceinline__ int tid_x() {
    int r;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(r));
    return r;
}
// The CTA's query head (batch included; a pack's first) and query tile. The GPU starts a grid's
// CTAs in the order of their linear index (x first). Without a mask the grid is (query tiles,
// B·H): a head's CTAs run together. A causal CTA of query tile m runs about m + 1 times the
// first's KV steps, so causal CTAs run heaviest first: with CAUSAL_HEADS_FIRST the grid is
// (B·H, query tiles), y counting the tiles from the last, so the last CTAs to start are every
// head's lightest; with 0 it is the unmasked grid with each head's tiles from its last, and
// the last head's heaviest CTAs start after every other's (docs/PERF.md "Stage C and D, change
// 36": 3-20% slower on causal prefill).
template <bool CAUSAL>
__device__ __forceinline__ int cta_head() {
    return CAUSAL && CAUSAL_HEADS_FIRST ? ctaid_x() : ctaid_y();
}
template <bool CAUSAL>
__device__ __forceinline__ int cta_tile() {
    if (!CAUSAL) return ctaid_x();
    return CAUSAL_HEADS_FIRST ? (int)gridDim.y - 1 - ctaid_y() : (int)gridDim.x - 1 - ctaid_x();
}
// The query tiles of the launch.
template <bool CAUSAL>
__device__ __forceinline__ unsigned grid_tiles() {
    return CAUSAL && CAUSAL_HEADS_FIRST ? gridDim.y : gridDim.x;
}

// ---- K/V steps: codes -> the code tiles of a stage -----------------------------------------

// Chunk i of a thread within a step of codes: 16 codes of row `row`, 16-byte chunk `chunk`.
struct Chunk {
    int row, chunk;
};
// REREAD: the thread's index read again from %tid (volatile), so that nothing derived from
// it stays live across the loop (the two-block D = 128 body, at 255 registers, spilled them).
template <int D, bool REREAD = false>
__device__ __forceinline__ Chunk chunk_of(int i) {
    const int c = (REREAD ? tid_x() : (int)threadIdx.x) + i * THREADS;
    return {c / Geo<D>::CHUNKS_PER_ROW, c % Geo<D>::CHUNKS_PER_ROW};
}

#if USE_CP_ASYNC
// Starts the copy of one step of K and V codes into a stage; rows >= valid are zero-filled by
// the copy (no bytes read), so a short last step never leaves an earlier step's codes behind.
template <int D, bool REREAD = false>
__device__ __forceinline__ void copy_step_async(const u8* __restrict__ k_bh,
                                                const u8* __restrict__ v_bh, int kv0, int valid,
                                                u8* stage) {
    using G = Geo<D>;
    // D = 128 only: a whole step, where every chunk is live, and chunk i lies a fixed distance
    // from chunk 0 in both global and shared memory (rows i·THREADS / CHUNKS_PER_ROW further;
    // the swizzle depends on the row mod 8, which THREADS / CHUNKS_PER_ROW rows keep), so the
    // copies take offsets from one address each and no per-chunk test or select: 2.4-4.2% on
    // D 128 prefill (docs/PERF.md change 26). At D = 64 the plain entry, held to 128 registers,
    // spilled 12 bytes with it and mission ran 1.5% slower: its copies keep the general form,
    // as do grids whose stride would not keep the row mod 8 (R = 1 with an odd K).
    constexpr bool FIXED_STRIDE =
        D == 128 && THREADS % G::CHUNKS_PER_ROW == 0 && THREADS / G::CHUNKS_PER_ROW % 8 == 0;
    if (FIXED_STRIDE && valid == STEP_KEYS) {
        const Chunk c0 = chunk_of<D, REREAD>(0);
        const size_t src0 = (size_t)(kv0 + c0.row) * D + c0.chunk * 16;
        const int dst0 = G::swizzled(c0.row, c0.chunk);
#pragma unroll
        for (int i = 0; i < G::CHUNKS_PER_THREAD; ++i) {
            constexpr int STRIDE = THREADS * 16; // bytes between a thread's chunks, both sides
            __pipeline_memcpy_async(stage + dst0 + i * STRIDE, k_bh + src0 + i * STRIDE, 16);
            __pipeline_memcpy_async(stage + G::STEP_CODE_BYTES + dst0 + i * STRIDE, v_bh + src0 + i * STRIDE, 16);
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < G::CHUNKS_PER_THREAD; ++i) {
        const Chunk ch = chunk_of<D, REREAD>(i);
        const bool live = ch.row < valid;
        const size_t src = live ? (size_t)(kv0 + ch.row) * D + ch.chunk * 16 : 0;
        const int dst = G::swizzled(ch.row, ch.chunk);
        __pipeline_memcpy_async(stage + dst, k_bh + src, 16, live ? 0 : 16);
        __pipeline_memcpy_async(stage + G::STEP_CODE_BYTES + dst, v_bh + src, 16, live ? 0 : 16);
    }
}
#else
// Loads one step of K and V codes from global memory into a stage (rows >= valid are zero).
template <int D, bool REREAD = false>
__device__ __forceinline__ void load_step(const u8* __restrict__ k_bh, const u8* __restrict__ v_bh,
                                          int kv0, int valid, u8* stage) {
    using G = Geo<D>;
    uint4 kc[G::CHUNKS_PER_THREAD], vc[G::CHUNKS_PER_THREAD];
#pragma unroll
    for (int i = 0; i < G::CHUNKS_PER_THREAD; ++i) { // all loads first: one memory latency, not N
        const Chunk ch = chunk_of<D, REREAD>(i);
        kc[i] = vc[i] = make_uint4(0, 0, 0, 0);
        if (ch.row < valid) {
            const size_t src = (size_t)(kv0 + ch.row) * D + ch.chunk * 16;
            kc[i] = *reinterpret_cast<const uint4*>(k_bh + src);
            vc[i] = *reinterpret_cast<const uint4*>(v_bh + src);
        }
    }
#pragma unroll
    for (int i = 0; i < G::CHUNKS_PER_THREAD; ++i) {
        const Chunk ch = chunk_of<D, REREAD>(i);
        const int dst = G::swizzled(ch.row, ch.chunk);
        *reinterpret_cast<uint4*>(stage + dst) = kc[i];
        *reinterpret_cast<uint4*>(stage + G::STEP_CODE_BYTES + dst) = vc[i];
    }
}
#endif

// Keys rows [0, rows_end) of a causal problem see: row rows_end - 1 sees keys
// j <= rows_end - 1 + diag, diag = S_k - S_q; clamped to [0, S_k].
__device__ __forceinline__ int keys_seen(int rows_end, int diag, int Sk) {
    return max(0, min(Sk, rows_end + diag));
}

// Keys row `row` sees (those below the returned index): all S_k, or under the causal mask up
// to its diagonal.
__device__ __forceinline__ int row_keys(int row, bool causal, int diag, int Sk) {
#ifdef MUTANT_NO_PARTIAL_MASK
    Sk = (Sk + BLOCK_N - 1) / BLOCK_N * BLOCK_N; // keys past S_k never masked
#endif
#ifdef MUTANT_CAUSAL_DIAG_OFF_BY_ONE
    return causal ? keys_seen(row, diag, Sk) : Sk; // the diagonal key masked
#else
    return causal ? keys_seen(row + 1, diag, Sk) : Sk;
#endif
}

// The first query row of this CTA: causal CTAs run heaviest first (the last query tiles
// see the most keys), so their tiles are taken in reverse.
template <bool CAUSAL, int MB = 1>
__device__ __forceinline__ int cta_row0() {
    const int tile = cta_tile<CAUSAL>();
    return tile * BLOCK_M_OF<MB>;
}
// The first of this warp's 16·MB rows: in a CTA that packs query heads (`pack_of`) every row
// warp runs rows 0 .. S_q - 1 of its own head.
template <bool CAUSAL, int MB = 1>
__device__ __forceinline__ int warp_row0(bool packed) {
    return cta_row0<CAUSAL, MB>() + (packed ? 0 : ((tid_x() >> 5) % ROW_WARPS) * 16 * MB);
}
// Row i sees keys j <= i + diag.
__device__ __forceinline__ int diagonal(int Sq, int Sk) {
#ifdef MUTANT_CAUSAL_TOP_LEFT
    return 0; // top-left alignment
#else
    return Sk - Sq;
#endif
}
// The K/V head (batch included) that query head `bh` (batch included) reads. Plain
// multi-head attention (H_kv = H) reads its own head, with no division: the cp.async prologue
// waits for this offset, and on a latency-bound problem (mission) the divisions' latency alone
// cost cp1 about 2%.
__device__ __forceinline__ int kv_head(int bh, int H, int Hkv) {
    if (Hkv == H) return bh;
    const int b = bh / H, h = bh % H;
#ifdef MUTANT_GQA_MODULO
    return b * Hkv + h % Hkv; // the wrong head map
#else
    return b * Hkv + h / (H / Hkv);
#endif
}
// Short queries: with S_q <= 16 one row warp holds every query row, and the CTA's other
// ROW_WARPS - 1 row warps would compute rows that do not exist. Then consecutive query heads
// that read one K/V head (GQA/MQA decode) share a CTA, the pack, at the first of them, y0 (a
// multiple of the pack's size), and the pack's other CTAs exit at once:
//   2·ROW_WARPS heads, when S_q <= 8: row warp rw holds heads y0 + 2rw (its rows 0..7) and
//            y0 + 2rw + 1 (its rows 8..15), each with query rows 0 .. S_q - 1, so a lane's
//            fragment rows g and g + 8 are query row g of two heads;
//   ROW_WARPS heads, when S_q <= 16 (or the pair does not fit): row warp rw holds head y0 + rw.
// Each K/V step is loaded once for the whole pack, and every MMA row that S_q fills is a real
// one. Per row nothing changes (the same tiles, KV splits and order of operations, the row's own
// head's scales), so neither does any output bit, but for one consequence: the packs are the
// working CTAs split KV counts, so at D = 128 packing can change a problem's C, and with it
// its chains and bits (the emulation follows the C of each build: identity/geometry.rs `kv_ctas`).
// The plain D = 64 entry, held to 128 registers, has no room for it (it spilled 12-24 bytes):
// only the other three entries pack.
template <int D, bool CAUSAL>
__device__ __forceinline__ constexpr bool can_pack() { return !(D == 64 && !CAUSAL); }
// Which entries split a short query's KV steps across CTAs when the launch asks for it
// (gridDim.z > 1): D = 128, the decode head dim of the models the split is for. The D = 64
// entries' loops keep their instructions.
template <int D>
__device__ __forceinline__ constexpr bool can_split() { return D == 128; }
// Whether the n heads y0 .. y0 + n - 1 exist and read one K/V head (kv_head is monotone in
// the head, so the first and the last decide).
__device__ __forceinline__ bool one_kv_head(int y0, int n, int BH, int H, int Hkv) {
#ifdef MUTANT_PACK_ACROSS_KV_HEADS
    // Packs heads that read different K/V heads: the later ones read the first's K and V.
    return y0 + n <= BH;
#else
    return y0 + n <= BH && kv_head(y0, H, Hkv) == kv_head(y0 + n - 1, H, Hkv);
#endif
}
// How many query heads the pack of CTA y holds: 2·ROW_WARPS, ROW_WARPS or 1 (no packing).
template <int D, bool CAUSAL>
__device__ __forceinline__ int pack_of(int y, int BH, int H, int Hkv, int Sq) {
#ifdef NO_HEAD_PACKING
    return 1;
#else
    if constexpr (!can_pack<D, CAUSAL>()) {
        return 1;
    } else {
        if (Hkv == H || Sq > 16) return 1;
#ifndef NO_HEAD_PAIRS
        constexpr int PAIRS = 2 * ROW_WARPS;
        if (Sq <= 8 && one_kv_head(y - y % PAIRS, PAIRS, BH, H, Hkv)) return PAIRS;
#endif
        if (ROW_WARPS > 1 && one_kv_head(y - y % ROW_WARPS, ROW_WARPS, BH, H, Hkv)) return ROW_WARPS;
        return 1;
    }
#endif
}
// Query heads one row warp of a pack holds: 2 in a pack of 2·ROW_WARPS, else 1.
__device__ __forceinline__ int heads_per_warp(int pack) { return pack > ROW_WARPS ? 2 : 1; }
// The query head of a lane's fragment row i (g + 8i) in the pack of `pack` heads at y0 (the
// CTA's own head when it does not pack).
__device__ __forceinline__ int row_head(int pack, int y0, int i) {
    const int hpw = heads_per_warp(pack);
#ifdef MUTANT_PAIR_FIRST_HEAD_SCALE
    i = 0; // both fragment rows take the first head of the pair (here: its Q scale)
#endif
    return pack > 1 ? y0 + ((tid_x() >> 5) % ROW_WARPS) * hpw + (hpw - 1) * i : y0;
}
// The query row of a lane's fragment row i, counted from the warp's first row.
__device__ __forceinline__ int row_in_head(int pack, int g, int i) {
    return heads_per_warp(pack) == 2 ? g : g + 8 * i;
}
// Keys this CTA loads: all S_k, or up to its last row's last visible key.
template <bool CAUSAL, int MB = 1>
__device__ __forceinline__ int cta_keys(int Sq, int Sk) {
    return CAUSAL ? keys_seen(min(cta_row0<CAUSAL, MB>() + BLOCK_M_OF<MB>, Sq), diagonal(Sq, Sk), Sk) : Sk;
}
// Keys this warp runs: all S_k, or up to its last row's last visible key.
template <bool CAUSAL, int MB = 1>
__device__ __forceinline__ int warp_keys(int Sq, int Sk, bool packed) {
    int keys = CAUSAL ? keys_seen(min(warp_row0<CAUSAL, MB>(packed) + 16 * MB, Sq), diagonal(Sq, Sk), Sk) : Sk;
#ifdef MUTANT_CAUSAL_SKIP_EARLY
    if (CAUSAL) keys = max(0, keys - BLOCK_N); // the diagonal's last tile skipped
#endif
#ifdef MUTANT_SKIP_LAST_KV_TILE
    keys = min(keys, (Sk - 1) / BLOCK_N * BLOCK_N); // every tile but the last
#endif
    return keys;
}

// ---- split KV: the end of a query tile whose steps several CTAs ran -----------------------

// Floats per (row, slot) in the split's workspace: O's D values, then m and l (16-byte rows).
template <int D>
constexpr int SPLIT_SLOT_FLOATS = D + 4;

// The merge parks a weight and an l per (row, slot) and an l per row in the dynamic shared
// memory of the smallest D = 128 launch (cp0's one stage): at most BLOCK_M rows (a pack's
// rows) and SPLIT_KV_MAX x KV_SPLIT slots.
static_assert(BLOCK_M * (2 * SPLIT_KV_MAX * KV_SPLIT + 1) * 4 <= Geo<128, 1>::SMEM_BYTES,
              "the split's merge must fit the D = 128 entries' shared memory");

// The end of a query tile whose KV steps gridDim.z = C CTAs ran (C > 1 only for short
// queries: one query tile, grid_tiles = 1). Every warp parks its rows' (O, m, l) in `work` at
// slot zc·KV_SPLIT + split, which is the chain t % (C·KV_SPLIT) of every tile t it ran (its
// tiles are t = (zc + nC)·KV_SPLIT + split), so the slots are the emulation's KV splits for
// C·KV_SPLIT of them. The CTA that arrives last merges every row's slots in slot order, as
// the in-CTA merge merges its splits (M = max m_s, O = O_0·exp2(m_0 - M), then
// fma(O_s, exp2(m_s - M), O), likewise l), and stores the pack's rows.
//   work: one arrival counter per query head (cta_head: B·H u32, padded to 16 bytes), zero
//         before a launch: the last CTA of a group resets its own; then [B·H query heads]
//         [S_q rows][C·KV_SPLIT slots][D + 4] floats (O, m, l, 2 unused), every slot
//         rewritten by every launch before it is read. The counters come first, where every
//         launch's are, whatever its C: a workspace that launches of different splits share
//         (a base kernel's and the candidate's) keeps them zero. The host allocates one
//         zeroed workspace per output buffer, so concurrent launches never share one
//         (src/backend/cuda/launch.rs).
template <int D, bool CAUSAL>
__device__ __forceinline__ void split_kv_end(const float (&o)[D / 8][4], const float (&m_run)[2],
                                             const float (&l_run)[2], __half* __restrict__ out,
                                             float* __restrict__ work, int BH, int Sq, float v_sc,
                                             int pack) {
    constexpr int STRIDE = SPLIT_SLOT_FLOATS<D>;
    if (grid_tiles<CAUSAL>() != 1 || Sq > SHORT_Q_ROWS)
        __trap(); // the host splits short queries only
    const int lane = tid_x() & 31, g = lane >> 2, qd = lane & 3;
    const int split = (tid_x() >> 5) / ROW_WARPS;
    const int slots = (int)gridDim.z * KV_SPLIT;
    const int slot = (int)blockIdx.z * KV_SPLIT + split;
    const int y0 = cta_head<CAUSAL>(); // only a pack's first CTA runs
    const int q0 = warp_row0<CAUSAL>(pack > 1);
    unsigned* arrivals = reinterpret_cast<unsigned*>(work);
    work += (BH + 3) / 4 * 4; // the parked states: 16-byte aligned after the counters
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int row = q0 + row_in_head(pack, g, i);
        if (row >= Sq) continue;
        float* dst = work + ((size_t)row_head(pack, y0, i) * Sq + row) * slots * STRIDE + (size_t)slot * STRIDE;
#pragma unroll
        for (int c = 0; c < D / 16; ++c)
            *reinterpret_cast<float4*>(dst + 16 * c + 4 * qd) =
                make_float4(o[2 * c][2 * i], o[2 * c + 1][2 * i], o[2 * c][2 * i + 1], o[2 * c + 1][2 * i + 1]);
        if (qd == 0) *reinterpret_cast<float2*>(dst + D) = make_float2(m_run[i], l_run[i]);
    }
    // The classic last-block pattern: parked state visible device-wide before the arrival,
    // the arrival seen before the last CTA reads (through L2: ld.cg) what the others parked.
    __threadfence();
    __syncthreads();
    __shared__ int last;
    if (tid_x() == 0) {
        last = atomicAdd(arrivals + y0, 1u) == gridDim.z - 1;
        if (last) arrivals[y0] = 0; // every CTA of the group has arrived: ready for the next launch
        __threadfence();
    }
    __syncthreads();
    if (!last) return;
    // The merge, in three passes over the pack's rows r = (head y0 + r / S_q, row r % S_q),
    // each with its loads in flight together (shared memory is free: the loop ended on a
    // barrier).
    extern __shared__ __align__(128) u8 smem[];
    const int rows = pack * Sq; // <= 32: 4 heads of 8 rows or 2 of 16
    float* weight = reinterpret_cast<float*>(smem); // [rows][slots]
    float* l_slot = weight + rows * slots;          // [rows][slots]
    float* l_row = l_slot + rows * slots;           // [rows]
#ifdef MUTANT_SPLIT_KV_DROP_LAST
    const int merged = slots - 1; // the last CTA's last split never merged
#else
    const int merged = slots;
#endif
    auto row_state = [&](int r) {
        return work + ((size_t)(y0 + r / Sq) * Sq + r % Sq) * slots * STRIDE;
    };
    // (1) Every (row, slot)'s m and l into shared memory, all loads in flight together.
    for (int i = tid_x(); i < rows * slots; i += THREADS) {
        const float2 ml = __ldcg(reinterpret_cast<const float2*>(row_state(i / slots) + i % slots * STRIDE + D));
        weight[i] = ml.x; // m, until (2) turns it into the slot's weight
        l_slot[i] = ml.y;
    }
    __syncthreads();
    // (2) A warp per row: M = max m_s, each slot's weight exp2(m_s - M) in place, then l in
    // slot order.
    for (int r = tid_x() >> 5; r < rows; r += NUM_WARPS) {
        float* a = weight + r * slots;
        float m_all = M_NONE; // a slot that saw no key has m = M_NONE: weight 0
        for (int s2 = lane; s2 < slots; s2 += 32) m_all = fmaxf(m_all, a[s2]);
#pragma unroll
        for (int w = 16; w > 0; w >>= 1) m_all = fmaxf(m_all, __shfl_xor_sync(0xffffffffu, m_all, w));
        for (int s2 = lane; s2 < slots; s2 += 32) a[s2] = exp2f(a[s2] - m_all);
        __syncwarp();
        if (lane == 0) {
            const float* ls = l_slot + r * slots;
            float l = __fmul_rn(ls[0], a[0]);
            for (int s2 = 1; s2 < merged; ++s2) l = __fmaf_rn(ls[s2], a[s2], l);
            l_row[r] = l;
        }
    }
    __syncthreads();
    // (3) O, four dims of two rows' elements a thread at a time (e0 and e0 + THREADS), so that
    // both chains' loads are in flight together.
    constexpr int QUADS = D / 4; // four dims: one 8-byte store
    const int elems = rows * QUADS;
    for (int e0 = tid_x(); e0 < elems; e0 += 2 * THREADS) {
        const bool two = e0 + THREADS < elems;
        const int es[2] = {e0, two ? e0 + THREADS : e0}; // one element: computed twice, stored once
        const float* src[2];
        const float* a[2];
        float o4[2][4];
#pragma unroll
        for (int k2 = 0; k2 < 2; ++k2) {
            const int r = es[k2] / QUADS;
            src[k2] = row_state(r) + es[k2] % QUADS * 4;
            a[k2] = weight + r * slots;
            const float4 o0 = __ldcg(reinterpret_cast<const float4*>(src[k2]));
            o4[k2][0] = __fmul_rn(o0.x, a[k2][0]);
            o4[k2][1] = __fmul_rn(o0.y, a[k2][0]);
            o4[k2][2] = __fmul_rn(o0.z, a[k2][0]);
            o4[k2][3] = __fmul_rn(o0.w, a[k2][0]);
        }
#pragma unroll 8
        for (int s2 = 1; s2 < merged; ++s2) {
            float4 os[2];
#pragma unroll
            for (int k2 = 0; k2 < 2; ++k2) os[k2] = __ldcg(reinterpret_cast<const float4*>(src[k2] + s2 * STRIDE));
#pragma unroll
            for (int k2 = 0; k2 < 2; ++k2) {
                o4[k2][0] = __fmaf_rn(os[k2].x, a[k2][s2], o4[k2][0]);
                o4[k2][1] = __fmaf_rn(os[k2].y, a[k2][s2], o4[k2][1]);
                o4[k2][2] = __fmaf_rn(os[k2].z, a[k2][s2], o4[k2][2]);
                o4[k2][3] = __fmaf_rn(os[k2].w, a[k2][s2], o4[k2][3]);
            }
        }
#pragma unroll
        for (int k2 = 0; k2 < 2; ++k2) {
            if (k2 == 1 && !two) break;
            const int r = es[k2] / QUADS, x = es[k2] % QUADS * 4;
            // A row that saw no key has l = 0 and is written as zeros, as the one-CTA end does.
            const float l = l_row[r];
            const float scale = l == 0.0f ? 0.0f : v_sc / l;
            const __half d0 = __float2half_rn(__fmul_rn(o4[k2][0], scale));
            const __half d1 = __float2half_rn(__fmul_rn(o4[k2][1], scale));
            const __half d2 = __float2half_rn(__fmul_rn(o4[k2][2], scale));
            const __half d3 = __float2half_rn(__fmul_rn(o4[k2][3], scale));
            *reinterpret_cast<uint2*>(out + ((size_t)(y0 + r / Sq) * Sq + r % Sq) * D + x) =
                make_uint2(pack_half2(d0, d1), pack_half2(d2, d3));
        }
    }
}

// ---- the kernel --------------------------------------------------------------------------

// The body's parameters (the entries' but `causal`, which picks the entry) and their names.
#define SDPA_BODY_PARAMS                                                                     \
    const u8 *__restrict__ q, const u8 *__restrict__ k, const u8 *__restrict__ v,           \
        const float *__restrict__ q_scale, const float *__restrict__ k_scale,                \
        const float *__restrict__ v_scale, __half *__restrict__ out, int B, int H, int Hkv,  \
        int Sq, int Sk, float softmax_scale, float *__restrict__ work, const TmaDesc *k_map,   \
        const TmaDesc *v_map
#define SDPA_PASS                                                                            \
    q, k, v, q_scale, k_scale, v_scale, out, B, H, Hkv, Sq, Sk, softmax_scale, work, k_map, v_map

// ST: the cp.async pipeline's stages; SPLIT: whether the launch deals the query tile's KV
// steps to gridDim.z CTAs (`split_kv_end`). A launch that does not split runs a body with no
// trace of it: C = 1 and zc = 0 are constants there.
// MB: the 16-row MMA blocks a warp owns (WARP_MB; a short query's body has one, and only it
// packs heads or splits KV).
template <int D, bool CAUSAL, int ST, bool SPLIT, int MB = 1>
__device__ __forceinline__ void sdpa_body(SDPA_BODY_PARAMS) {
    using G = Geo<D, ST, MB>;
    static_assert(MB == 1 || (D == 128 && !SPLIT), "two MMA blocks a warp: D = 128, no split KV");
    static_assert(!KV_BY_TMA<D, MB> || !SPLIT, "a TMA body runs every step of its query tile");
    static_assert(D != 128 || ST != STAGES || G::SMEM_BYTES <= SMEM_D128,
                  "a D = 128 launch of this depth gives every body its layout");
    constexpr bool CAN_PACK = can_pack<D, CAUSAL>() && MB == 1;
    constexpr bool TMA = KV_BY_TMA<D, MB>;
    extern __shared__ __align__(128) u8 smem_raw[];
    // A TMA body's stages begin at multiples of 1024 bytes (the header's "K/V by TMA"): its
    // whole layout moves up to the next one, within the launch's TMA_SLACK.
    u8* const smem = TMA ? smem_raw + (-(int)__cvta_generic_to_shared(smem_raw) & 1023) : smem_raw;
    // A TMA body's mbarriers, one a stage: the phase of step n's stage completes when its codes
    // have landed.
    __shared__ __align__(8) unsigned long long kv_landed[TMA ? ST : 1];

    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2; // fragment row (and row + 8)
    const int qd = lane & 3; // fragment column pair 2qd, 2qd + 1
    const int split = warp / ROW_WARPS;
    // The CTA's query head (cta_head; read here from blockIdx, later again from %ctaid).
    const unsigned y = CAUSAL && CAUSAL_HEADS_FIRST ? blockIdx.x : blockIdx.y;
    if (CAUSAL && CAUSAL_HEADS_FIRST && gridDim.x != (unsigned)(B * H))
        __trap(); // a causal grid of the query tiles first: not this module's (cta_head)
    if ((int)y >= B * H) return;
    const int pack = MB == 1 ? pack_of<D, CAUSAL>(y, B * H, H, Hkv, Sq) : 1;
    if (y % pack != 0) return; // its head runs in the CTA at y - y % pack
    const int y0 = y;
    const bool packed = pack > 1;
    const int bh = row_head(pack, y0, 0); // this warp's (first) query head
#if SDPA_DELAY_CYCLES > 0
    __syncthreads();
    if (threadIdx.x == 0) {
        const long long t0 = clock64();
        while (clock64() - t0 < SDPA_DELAY_CYCLES) {
        }
    }
    __syncthreads();
#endif
    const int bkv = kv_head(bh, H, Hkv);
    const int q0 = warp_row0<CAUSAL, MB>(packed); // this warp's first row

#ifdef MUTANT_I32_HEAD_OFFSET
    const int q_off = (int)((unsigned)bh * (unsigned)Sq * D); // wraps past 2^31
    const int kv_off = (int)((unsigned)bkv * (unsigned)Sk * D);
#else
    const size_t q_off = (size_t)bh * Sq * D;
    const size_t kv_off = (size_t)bkv * Sk * D;
#endif
    const u8* q_bh = q + q_off;
    const u8* k_bh = k + kv_off;
    const u8* v_bh = v + kv_off;
    // V's scale is needed only at the end, where all O accumulators are live: thread 0 parks
    // it in shared memory now (read after the loop's barriers) rather than a register or a
    // head-index division there.
    __shared__ float v_scale_shared;
    // The pack's size, likewise parked for the mask and the stores: the mask reads it after
    // the causal barrier below, the stores after the barrier that ends the loop (a causal CTA
    // whose rows see no key runs no step at all).
    __shared__ int pack_shared;
    if (threadIdx.x == 0) {
        v_scale_shared = v_scale[bkv];
        pack_shared = pack;
    }
    // Causal: the keys the CTA loads and each warp runs, computed once and read per step
    // from shared memory (at 128 registers a causal loop cannot hold them).
    __shared__ int keys_shared[1 + NUM_WARPS];
    if constexpr (CAUSAL) {
        if (threadIdx.x == 0) keys_shared[0] = cta_keys<CAUSAL, MB>(Sq, Sk);
        if (lane == 0) keys_shared[1 + warp] = warp_keys<CAUSAL, MB>(Sq, Sk, packed);
        __syncthreads();
    }
#define CTA_KEYS (CAUSAL ? keys_shared[0] : cta_keys<CAUSAL>(Sq, Sk))
#define WARP_KEYS (CAUSAL ? keys_shared[1 + (tid_x() >> 5)] : warp_keys<CAUSAL>(Sq, Sk, false))
    // Per fragment row i (g + 8i): the scale of its own head's scores (the two differ only
    // in a pack of head pairs).
    float qk_scale[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int h = row_head(pack, y0, i);
#ifdef MUTANT_K_SCALE_TWICE
        qk_scale[i] = (q_scale[h] * k_scale[bkv] * k_scale[bkv]) * (softmax_scale * 1.4426950408889634f);
#else
        qk_scale[i] = (q_scale[h] * k_scale[bkv]) * (softmax_scale * 1.4426950408889634f);
#endif
    }

    // Per lane and MMA block mb (rows 16mb .. 16mb + 15 of the warp's): rows g (index 0) and
    // g + 8 (index 1).
    float o[MB][D / 8][4];
    float m_run[MB][2], l_run[MB][2]; // l: the row sums (every lane of the quad the same)
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int n = 0; n < D / 8; ++n) o[mb][n][0] = o[mb][n][1] = o[mb][n][2] = o[mb][n][3] = 0.0f;
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) m_run[mb][0] = m_run[mb][1] = M_NONE;
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) l_run[mb][0] = l_run[mb][1] = 0.0f;

    const unsigned smem_addr = (unsigned)__cvta_generic_to_shared(smem);
    // The swizzle of a row depends on its index mod 8 only, so a lane's ldmatrix offsets are
    // fixed: K (matrix kk = lane / 8: key lane % 8, chunk kk of the chunk group; group cg at
    // XOR 64·cg) and V (matrix i = lane / 8: key lane % 8 + 8·(i & 1), chunk 2·c2 + i / 2, where
    // c2 flips chunk bits 1 and up: XOR 32·c2).
    // Folded with this warp's tile within a step (row split·BLOCK_N of stage 0) into one
    // address each: the base is a multiple of 128, so XORing a chunk offset (bits 4-6) into
    // the sum is XORing it into the lane's offset.
    const unsigned k_lane = smem_addr + split * BLOCK_N * D + G::swizzled(lane & 7, lane >> 3);
    const unsigned v_lane = smem_addr + G::STEP_CODE_BYTES + split * BLOCK_N * D +
                            G::swizzled((lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
    // Split KV: this CTA runs steps zc, zc + C, zc + 2C, ... of its query tile's keys (C = 1,
    // zc = 0 but in a launch that splits them: `split_kv_end`).
    const int kv_ctas = SPLIT ? (int)gridDim.z : 1;
    const int zc = SPLIT ? (int)blockIdx.z : 0;
    // Step `step`'s K and V codes by TMA into stage `stage` (thread 0), its barrier armed with
    // their bytes (a whole box each: rows past S_k are zero-filled and count).
    auto tma_step = [&](int stage, int step) {
        unsigned long long* bar = &kv_landed[stage];
        u8* dst = smem + stage * G::STAGE_BYTES;
        mbar_arrive_expect_tx(bar, 2 * G::STEP_CODE_BYTES);
        tma_load_3d(dst, k_map, bar, 0, step * STEP_KEYS, bkv);
        tma_load_3d(dst + G::STEP_CODE_BYTES, v_map, bar, 0, step * STEP_KEYS, bkv);
    };
    // Thread 0 issues step n + ST - 1 (if the CTA has it) into the stage step n - 1 used.
    auto tma_ahead = [&](int n) {
        if (threadIdx.x == 0) {
            const int ahead = n + ST - 1;
            if (ahead * STEP_KEYS < CTA_KEYS) tma_step(ahead % ST, ahead);
        }
    };
#if USE_CP_ASYNC
    if constexpr (TMA) {
        // The barriers, initialised before any thread waits on one; then the first ST - 1
        // steps in flight before Q's loads, as with cp.async.
        if (threadIdx.x == 0) {
#pragma unroll
            for (int st = 0; st < ST; ++st) mbar_init(&kv_landed[st], 1);
            mbar_init_fence();
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            tma_acquire_global_desc(k_map);
            tma_acquire_global_desc(v_map);
            tma_prefetch_desc(k_map);
            tma_prefetch_desc(v_map);
            const int keys_cta = CTA_KEYS;
#pragma unroll
            for (int st = 0; st < ST - 1; ++st)
                if (st * STEP_KEYS < keys_cta) tma_step(st, st);
        }
    } else {
    // Prologue: the first ST - 1 steps in flight, one commit group each (maybe empty),
    // before Q's loads, so Q's latency and theirs overlap.
#pragma unroll
    for (int st = 0; st < ST - 1; ++st) {
        const int keys_cta = CTA_KEYS;
        const int kv_first = (zc + st * kv_ctas) * STEP_KEYS;
        if (kv_first < keys_cta)
            copy_step_async<D, MB != 1>(k_bh, v_bh, kv_first, min(STEP_KEYS, keys_cta - kv_first), smem + st * G::STAGE_BYTES);
        __pipeline_commit();
    }
    }
#endif

    // Q: this warp's 16·MB rows as A fragments, decoded from global memory. k-step kk,
    // lane q: one 4-byte load of dims 16kk + 4q .. +3 per row (MMA k-indices 2q, 2q+1, 2q+8,
    // 2q+9: the header's order), the low pair to a0 (a1), the high pair to a2 (a3).
    // With two blocks split 0 parks its row warp's fragments for every split (they read them
    // after the loop's first barrier).
    const int q_slot = MB == 1 ? warp : warp % ROW_WARPS;
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) {
        if (MB > 1 && split != 0) break;
        const size_t q_pair = (size_t)(heads_per_warp(pack) - 1) * Sq * D;
        unsigned qa[D / 16][4];
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                // Row i of a head pair is the second head's (q_pair on), else this head's.
                const int row = q0 + 16 * mb + row_in_head(pack, g, i);
                unsigned codes = 0;
#ifdef MUTANT_Q_READ_PAST_END
                // Reads query row S_q too (its scores go nowhere: the output does not change).
                if (row <= Sq) codes = *reinterpret_cast<const unsigned*>(q_bh + i * q_pair + (size_t)row * D + kk * 16 + 4 * qd);
#else
                if (row < Sq) codes = *reinterpret_cast<const unsigned*>(q_bh + i * q_pair + (size_t)row * D + kk * 16 + 4 * qd);
#endif
                qa[kk][i] = decode2_e4m3(codes);
                qa[kk][i + 2] = decode2_e4m3_hi(codes);
            }
        }
        // Parked in shared memory and read back per tile (16 B per lane, block and k-step,
        // lane-major: conflict-free), so they hold no registers across the P·V half.
        uint4* q_park = reinterpret_cast<uint4*>(smem + G::OFF_Q) + (q_slot * MB + mb) * (D / 16) * 32 + lane;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            q_park[kk * 32] = make_uint4(qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3]);
    }
    const uint4* q_park = reinterpret_cast<const uint4*>(smem + G::OFF_Q) + q_slot * MB * (D / 16) * 32 + lane;
    // Two blocks: (m, l) of block mb at state(mb) between tiles (Geo::OFF_STATE), the lane's
    // address from %tid.
    auto state = [&](int mb) {
        return reinterpret_cast<float4*>(smem + G::OFF_STATE) + ((tid_x() >> 5) * MB + mb) * 32 + (tid_x() & 31);
    };
    auto load_state = [&] {
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) {
            const float4 st = *state(mb);
            m_run[mb][0] = st.x, m_run[mb][1] = st.y, l_run[mb][0] = st.z, l_run[mb][1] = st.w;
        }
    };
    if constexpr (MB > 1) {
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) *state(mb) = make_float4(M_NONE, M_NONE, 0.0f, 0.0f);
    }

    for (int n = 0; (zc + n * kv_ctas) * STEP_KEYS < CTA_KEYS; ++n) {
        const int j = zc + n * kv_ctas; // the step of the query tile's keys
        // 1. This step's K and V codes, landed in its stage.
#if USE_CP_ASYNC
        if constexpr (TMA) {
            // Step n's stage has landed when its barrier's phase n / ST has completed.
#ifndef MUTANT_SKIP_CP_WAIT
#ifndef MUTANT_TMA_SKIP_WAIT
#ifdef MUTANT_TMA_PARITY_FLIPPED
            mbar_wait(&kv_landed[n % ST], ((n / ST) & 1) ^ 1); // the phase before: at once
#else
            mbar_wait(&kv_landed[n % ST], (n / ST) & 1);
#endif
#endif
#endif
#ifndef MUTANT_NO_DEQUANT_BARRIER
            __syncthreads(); // every thread has seen step n land; step n - 1 is done
#endif
            // Into the stage step n - 1 used, whose barrier every thread has passed.
#ifndef TMA_ISSUE_LATE
            tma_ahead(n);
#endif
        } else {
        // Groups committed so far: ST - 1 + n; all but the newest ST - 2 have landed once
        // this CTA's step n has.
#ifndef MUTANT_SKIP_CP_WAIT
        __pipeline_wait_prior(ST - 2);
#endif
#ifndef MUTANT_NO_DEQUANT_BARRIER
        __syncthreads(); // every thread's copies of step j are visible; step j - 1 is done
#endif
        {
            // Into the stage step n - 1 used: every warp is past it (the barrier above), so
            // one barrier per step suffices.
            const int ahead = n + ST - 1;
            const int keys_cta = CTA_KEYS;
            const int kv_ahead = (zc + ahead * kv_ctas) * STEP_KEYS;
            if (kv_ahead < keys_cta)
                copy_step_async<D, MB != 1>(k_bh, v_bh, kv_ahead, min(STEP_KEYS, keys_cta - kv_ahead),
                                   smem + (ahead % ST) * G::STAGE_BYTES);
            __pipeline_commit(); // one group per iteration keeps the count uniform
        }
        }
#ifdef MUTANT_WRONG_STAGE
        const int cur = (n + 1) % ST; // a stage still being filled
#else
        const int cur = n % ST;
#endif
#else
        load_step<D, MB != 1>(k_bh, v_bh, j * STEP_KEYS, min(STEP_KEYS, CTA_KEYS - j * STEP_KEYS), smem);
        const int cur = 0;
#ifndef MUTANT_NO_DEQUANT_BARRIER
        __syncthreads(); // every thread's codes of this step are in shared memory
#endif
#endif
        const unsigned stage_off = cur * G::STAGE_BYTES; // a multiple of 128

        const int t = j * KV_SPLIT + split; // this warp's tile
        const int kv0 = t * BLOCK_N;
        if (kv0 < WARP_KEYS) {
            // 2. S = Q Kᵀ: 8 key blocks x D/16 k-steps, per MMA block.
            float s[MB][BLOCK_N / 8][4];
#pragma unroll
            for (int mb = 0; mb < MB; ++mb)
#pragma unroll
                for (int nb = 0; nb < BLOCK_N / 8; ++nb) s[mb][nb][0] = s[mb][nb][1] = s[mb][nb][2] = s[mb][nb][3] = 0.0f;
            if constexpr (MB == 1) {
                // One ldmatrix per key block and chunk group of 4: matrix kk is its 8 keys x
                // chunk 4cg + kk, so a lane gets dims 16(4cg + kk) + 4q .. +3 of key g: b0, b1.
                unsigned qa[D / 16][4];
#pragma unroll
                for (int kk = 0; kk < D / 16; ++kk) {
                    const uint4 f = q_park[kk * 32];
                    qa[kk][0] = f.x, qa[kk][1] = f.y, qa[kk][2] = f.z, qa[kk][3] = f.w;
                }
#pragma unroll
                for (int nb = 0; nb < BLOCK_N / 8; ++nb) {
#pragma unroll
                    for (int cg = 0; cg < D / 64; ++cg) {
                        unsigned kc[4];
#ifdef MUTANT_D128_HALF_STRIDE
                        const int group_off = 0; // every chunk group read from the first half
#else
                        const int group_off = cg * 64;
#endif
                        ldmatrix_x4(kc, (k_lane + stage_off + nb * 8 * D) ^ group_off);
#pragma unroll
                        for (int kk = 0; kk < 4; ++kk)
                            mma16816(s[0][nb], qa[4 * cg + kk], decode2_e4m3(kc[kk]), decode2_e4m3_hi(kc[kk]));
                    }
                }
            } else {
                // Two MMA blocks: k-step by k-step, both blocks' Q fragments of it, then one
                // ldmatrix per group of 4 key blocks (matrix i: key block 4ng + i x chunk kk),
                // each key block's fragments decoded once for both blocks. Every score still
                // sums its k-steps in order 0 .. D/16 - 1, as with one block.
                // Matrix i of a K ldmatrix: key lane % 8 + 8·(lane / 8) of the group, chunk 0 of
                // its swizzle, with a k-step's chunk XORed in (16·kk); from %tid, as the loop has
                // no register to hold it across the P·V half.
                const int tid = tid_x(), ln = tid & 31;
                const unsigned k_group = smem_addr + (tid >> 5) / ROW_WARPS * BLOCK_N * D + (ln >> 3) * 8 * D +
                                         G::swizzled(ln & 7, 0);
#ifdef MUTANT_Q_PARK_OTHER_ROWS
                const int q_rows = ((tid >> 5) + (tid >> 5) / ROW_WARPS) % ROW_WARPS; // split 1: the other row warp's Q
#else
                const int q_rows = (tid >> 5) % ROW_WARPS; // the row warp's Q, which split 0 parked
#endif
                const uint4* q_row = reinterpret_cast<const uint4*>(smem + G::OFF_Q) + q_rows * MB * (D / 16) * 32 + ln;
#pragma unroll
                for (int kk = 0; kk < D / 16; ++kk) {
                    unsigned qa[MB][4];
#pragma unroll
                    for (int mb = 0; mb < MB; ++mb) {
                        const uint4 f = q_row[(mb * (D / 16) + kk) * 32];
                        qa[mb][0] = f.x, qa[mb][1] = f.y, qa[mb][2] = f.z, qa[mb][3] = f.w;
                    }
#ifdef MUTANT_D128_HALF_STRIDE
                    const int chunk = kk % 4; // every k-step read from the first half's chunks
#else
                    const int chunk = kk;
#endif
#pragma unroll
                    for (int ng = 0; ng < BLOCK_N / 32; ++ng) {
                        unsigned kc[4];
                        ldmatrix_x4(kc, (k_group + stage_off + ng * 32 * D) ^ (chunk << 4));
#pragma unroll
                        for (int i = 0; i < 4; ++i) {
                            const unsigned b0 = decode2_e4m3(kc[i]), b1 = decode2_e4m3_hi(kc[i]);
#pragma unroll
                            for (int mb = 0; mb < MB; ++mb) mma16816(s[mb][4 * ng + i], qa[mb], b0, b1);
                        }
                    }
                }
            }

            // 3. Online softmax (base 2) on the unscaled scores (the scale is fused into the
            //    exponent's fma below). Keys past S_k, or past what a row sees under the causal
            //    mask, score -inf, so their P is exactly 0.
            // Only a tile that some row of the warp does not see whole pays for the mask: the
            // last tile (partial) or, causal, one the diagonal crosses (the warp's first row
            // sees least). Row r sees keys below row_keys(r).
            if constexpr (CAUSAL) {
                const int diag = diagonal(Sq, Sk);
                const int pk = CAN_PACK ? pack_shared : 1;
                const int w0 = warp_row0<CAUSAL, MB>(pk > 1);
                if (kv0 + BLOCK_N > row_keys(w0, true, diag, Sk)) {
                    if constexpr (MB == 1) {
                        const int lim[2] = {row_keys(w0 + row_in_head(pk, g, 0), true, diag, Sk),
                                            row_keys(w0 + row_in_head(pk, g, 1), true, diag, Sk)};
#pragma unroll
                        for (int nb = 0; nb < BLOCK_N / 8; ++nb)
#pragma unroll
                            for (int e = 0; e < 4; ++e)
                                if (kv0 + nb * 8 + 2 * qd + (e & 1) >= lim[e >> 1]) s[0][nb][e] = NEG_INF;
                    } else {
                        // Two blocks (255 registers): per row the keys it sees past this lane's
                        // first column, against constant offsets, the lane from %tid.
                        const int ln = tid_x() & 31;
                        const int col0 = kv0 + 2 * (ln & 3);
#pragma unroll
                        for (int mb = 0; mb < MB; ++mb)
#pragma unroll
                            for (int i = 0; i < 2; ++i) {
                                const int rel = row_keys(w0 + 16 * mb + (ln >> 2) + 8 * i, true, diag, Sk) - col0;
#pragma unroll
                                for (int nb = 0; nb < BLOCK_N / 8; ++nb)
#pragma unroll
                                    for (int e1 = 0; e1 < 2; ++e1)
                                        if (nb * 8 + e1 >= rel) s[mb][nb][2 * i + e1] = NEG_INF;
                            }
                    }
                }
            } else {
                const int lim = row_keys(0, false, 0, Sk); // S_k (or past it: a planted bug)
                if (kv0 + BLOCK_N > lim) {
#pragma unroll
                    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
                        for (int nb = 0; nb < BLOCK_N / 8; ++nb)
#pragma unroll
                            for (int e = 0; e < 4; ++e)
                                if (kv0 + nb * 8 + 2 * qd + (e & 1) >= lim) s[mb][nb][e] = NEG_INF;
                }
            }
            float alpha[MB][2];
            if constexpr (MB > 1) load_state();
            // Each row's maximum over this lane's scores (unscaled), then over its quad.
            float tile_max[MB][2];
            if constexpr (INT_LANE_MAX == 2 || (INT_LANE_MAX == 1 && MB > 1)) {
                // As integers (INT_LANE_MAX). The scores are sums of products of decoded E4M3
                // codes: finite, never NaN; -inf only where the mask put it. Among non-negative
                // floats the bits order as the floats, and every negative float's bits (-0 and
                // -inf included) lie below them, so where a lane's row has a score >= +0 the
                // integer maximum of the bits is the float maximum. Among negative floats the
                // bits order in reverse: where all of them are below zero (or -0), their
                // integer minimum is the float maximum. The warp asks once whether any lane
                // needs that. The result is the IEEE maximum, the sign of a zero included (+0
                // wherever a +0 occurs), so every later step sees fmaxf's value.
                int bits[MB][2];
                bool negative = false;
#pragma unroll
                for (int mb = 0; mb < MB; ++mb)
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        bits[mb][i] = lane_row_tree<false>(s[mb], i);
                        negative |= bits[mb][i] < 0;
                    }
#ifndef MUTANT_LANE_MAX_NO_FALLBACK
                if (__any_sync(0xffffffffu, negative)) {
#pragma unroll
                    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
                        for (int i = 0; i < 2; ++i)
                            if (bits[mb][i] < 0) bits[mb][i] = lane_row_tree<true>(s[mb], i);
                }
#endif
#pragma unroll
                for (int mb = 0; mb < MB; ++mb) tile_max[mb][0] = __int_as_float(bits[mb][0]), tile_max[mb][1] = __int_as_float(bits[mb][1]);
            } else {
#pragma unroll
                for (int mb = 0; mb < MB; ++mb) {
                    tile_max[mb][0] = tile_max[mb][1] = NEG_INF;
#pragma unroll
                    for (int nb = 0; nb < BLOCK_N / 8; ++nb)
#pragma unroll
                        for (int e = 0; e < 4; ++e) tile_max[mb][e >> 1] = fmaxf(tile_max[mb][e >> 1], s[mb][nb][e]);
                }
            }
            // The row's maximum over the quad, scaled (the scale is positive, so the scaled
            // maximum is the maximum scaled; -inf stays -inf), then m moves to it only past m
            // + the threshold. M_NONE + the threshold is M_NONE: the first tile with a visible
            // key moves it; a tile the mask hides (-inf) never does. Returns whether it moved.
            auto move_max = [&](int mb, int i) {
                float t = tile_max[mb][i];
                t = fmaxf(t, __shfl_xor_sync(0xffffffffu, t, 1));
                t = fmaxf(t, __shfl_xor_sync(0xffffffffu, t, 2));
                t = __fmul_rn(t, qk_scale[i]);
                const bool up = t > __fadd_rn(m_run[mb][i], (float)RESCALE_THRESHOLD);
                const float m_new = up ? t : m_run[mb][i];
#ifdef MUTANT_NO_RESCALE
                alpha[mb][i] = 1.0f;
#else
                alpha[mb][i] = exp2f(m_run[mb][i] - m_new);
#endif
                m_run[mb][i] = m_new;
                return up;
            };
            bool raised = false; // some row of the warp (MB > 1) or of this lane moved its maximum
#if LAZY_TILE_MAX
            if constexpr (MB > 1) {
                // A row's maximum passes m + the threshold only where one lane's own maximum
                // does (the quad's is the largest of its lanes', and scaling keeps the order),
                // which the warp asks once: where none does (most tiles past a row's first),
                // m stays, every alpha is 1 and the quads' shuffles never run.
                bool mine = false;
#pragma unroll
                for (int mb = 0; mb < MB; ++mb)
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        const bool past = __fmul_rn(tile_max[mb][i], qk_scale[i]) >
                                          __fadd_rn(m_run[mb][i], (float)RESCALE_THRESHOLD);
#ifdef MUTANT_RESCALE_VOTE_FIRST_BLOCK
                        if (mb == 0) mine |= past; // the warp's vote never hears the second block
#else
                        mine |= past;
#endif
                    }
                raised = __any_sync(0xffffffffu, mine);
                if (raised) {
#pragma unroll
                    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
                        for (int i = 0; i < 2; ++i) move_max(mb, i);
                } else {
#pragma unroll
                    for (int mb = 0; mb < MB; ++mb) alpha[mb][0] = alpha[mb][1] = 1.0f;
                }
            } else
#endif
            {
#pragma unroll
                for (int mb = 0; mb < MB; ++mb)
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        const bool up = move_max(mb, i);
                        // (MUTANT_RESCALE_VOTE_FIRST_BLOCK sits in LAZY_TILE_MAX's vote above,
                        // the default; without it a 32-row warp moves each row's maximum here
                        // and votes below on whether any moved, and the 16-row bodies never
                        // vote.)
                        raised |= up;
                    }
            }
            // 4. O *= alpha, then O += P V, one k-step of 16 keys at a time (so only that
            //    k-step's P is live). P comes straight from the score accumulators as the A
            //    fragment: key block 2kk gives a0 (row g), a1 (row g+8); block 2kk+1 gives a2, a3.
            //    ldmatrix.trans (b16) matrix i: keys 16kk + (i & 1)·8, chunk 2c2 + (i >> 1); a
            //    lane gets keys 2q, 2q+1 (+8) x dims 2g, 2g+1; prmt sorts them per dim into
            //    b0, b1 of the chunk's even-dim MMA (o[2c]) and odd-dim MMA (o[2c + 1]), each
            //    decoded once for every MMA block.
            auto rescale_o = [&] {
#pragma unroll
                for (int mb = 0; mb < MB; ++mb)
#pragma unroll
                    for (int n = 0; n < D / 8; ++n) {
                        o[mb][n][0] = __fmul_rn(o[mb][n][0], alpha[mb][0]);
                        o[mb][n][1] = __fmul_rn(o[mb][n][1], alpha[mb][0]);
                        o[mb][n][2] = __fmul_rn(o[mb][n][2], alpha[mb][1]);
                        o[mb][n][3] = __fmul_rn(o[mb][n][3], alpha[mb][1]);
                    }
            };
            // Where no row of the warp moved its maximum, every alpha is exp2(0) = 1 and O's
            // rescale would change no bit: a 32-row warp skips its 128 FMUL (D 128). The
            // 16-row bodies always rescale (a branch there measured 1-2% slower: docs/PERF.md
            // change 32).
#if LAZY_TILE_MAX
            const bool rescale_any = MB == 1 || raised;
#else
            const bool rescale_any = MB == 1 || __any_sync(0xffffffffu, raised);
#endif
            if constexpr (MB == 1) rescale_o();
            // Row sums on the tensor cores, as O's: l · alpha, then each k-step's P against a B
            // of ones (every column of the 16 x 8 result is its row's sum, on each lane of the
            // quad), so l is P·1 in the precision and order of P·V.
            float l_acc[MB][4];
            auto rescale_l = [&] {
#pragma unroll
                for (int mb = 0; mb < MB; ++mb) {
                    l_acc[mb][0] = l_acc[mb][1] = __fmul_rn(l_run[mb][0], alpha[mb][0]);
                    l_acc[mb][2] = l_acc[mb][3] = __fmul_rn(l_run[mb][1], alpha[mb][1]);
                }
            };
            auto sum_rows = [&](const unsigned (&pa)[MB][4], int kk) {
#ifdef MUTANT_ROW_SUM_SKIP_STEP
                if (kk == BLOCK_N / 16 - 1) return; // the tile's last k-step never reaches l
#endif
                (void)kk;
                constexpr unsigned ONES = 0x3C003C00u; // f16 1.0, 1.0
#pragma unroll
                for (int mb = 0; mb < MB; ++mb) mma16816(l_acc[mb], pa[mb], ONES, ONES);
            };
            auto end_l = [&] {
#pragma unroll
                for (int mb = 0; mb < MB; ++mb) l_run[mb][0] = l_acc[mb][0], l_run[mb][1] = l_acc[mb][2];
            };
            // P of a k-step: key block 2kk + hh, fragment row i.
            auto p_of = [&](unsigned (&pa)[MB][4], int kk) {
#pragma unroll
                for (int mb = 0; mb < MB; ++mb)
#pragma unroll
                    for (int hh = 0; hh < 2; ++hh) {
                        const int nb = 2 * kk + hh;
#pragma unroll
                        for (int i = 0; i < 2; ++i) {
                            const __half p0 = __float2half_rn(exp2_for_p(__fmaf_rn(s[mb][nb][2 * i], qk_scale[i], -m_run[mb][i])));
                            const __half p1 = __float2half_rn(exp2_for_p(__fmaf_rn(s[mb][nb][2 * i + 1], qk_scale[i], -m_run[mb][i])));
                            pa[mb][hh * 2 + i] = pack_half2(p0, p1);
                        }
                    }
            };
            // With two MMA blocks every k-step's P first (32 registers of f16 where the scores
            // took 64), then the row sums and O's rescale, so that the scores, alpha and the
            // sums are dead before P·V (the same operations on the same values as with one).
            unsigned p_all[MB == 1 ? 1 : BLOCK_N / 16][MB][4];
            if constexpr (MB > 1) {
#pragma unroll
                for (int kk = 0; kk < BLOCK_N / 16; ++kk) p_of(p_all[kk], kk);
                rescale_l();
#pragma unroll
                for (int kk = 0; kk < BLOCK_N / 16; ++kk) sum_rows(p_all[kk], kk);
                end_l();
#pragma unroll
                for (int mb = 0; mb < MB; ++mb) *state(mb) = make_float4(m_run[mb][0], m_run[mb][1], l_run[mb][0], l_run[mb][1]);
                if (rescale_any) rescale_o();
            }
            // With two blocks (255 registers) V's lane address is computed again from %tid.
            unsigned v_base = v_lane;
            if constexpr (MB > 1) {
                const int tid = tid_x(), ln = tid & 31;
                v_base = smem_addr + G::STEP_CODE_BYTES + (tid >> 5) / ROW_WARPS * BLOCK_N * D +
                         G::swizzled((ln & 7) + ((ln >> 3) & 1) * 8, ln >> 4);
            }
            if constexpr (MB == 1) rescale_l();
#pragma unroll
            for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
                unsigned (&pa)[MB][4] = p_all[MB == 1 ? 0 : kk];
                if constexpr (MB == 1) {
                    p_of(pa, kk);
                    sum_rows(pa, kk);
                }
#pragma unroll
                for (int c2 = 0; c2 < D / 32; ++c2) {
                    unsigned vc[4];
                    ldmatrix_x4_trans(vc, (v_base + stage_off + kk * 16 * D) ^ (c2 * 32));
#pragma unroll
                    for (int hh = 0; hh < 2; ++hh) {
                        const int c = 2 * c2 + hh;
                        const unsigned even = prmt(vc[2 * hh], vc[2 * hh + 1], 0x6420);
                        const unsigned odd = prmt(vc[2 * hh], vc[2 * hh + 1], 0x7531);
                        const unsigned e0 = decode2_e4m3(even), e1 = decode2_e4m3_hi(even);
#pragma unroll
                        for (int mb = 0; mb < MB; ++mb) mma16816(o[mb][2 * c], pa[mb], e0, e1);
                        const unsigned o0 = decode2_e4m3(odd), o1 = decode2_e4m3_hi(odd);
#pragma unroll
                        for (int mb = 0; mb < MB; ++mb) mma16816(o[mb][2 * c + 1], pa[mb], o0, o1);
                    }
                }
            }
            if constexpr (MB == 1) end_l();
        }
#ifdef TMA_ISSUE_LATE
        // Test hook, never in normal builds: step n + ST - 1's TMA (the next step's with two
        // stages) issued after thread 0's warp has computed step n, where it has keys in it
        // (into the stage step n - 1 used, free since step n's barrier), so it lands after its
        // step's barrier: the window a missing wait leaves open, which results then show
        // (cuda/kernels.toml MUTANT_TMA_SKIP_WAIT's hooks).
        if constexpr (TMA) tma_ahead(n);
#endif
#if !USE_CP_ASYNC
        __syncthreads(); // every warp is done with the stage before the next step's stores
#endif
    }
    // Each thread's own (m, l), read before the barrier after which other warps may park over
    // them (grids whose PARK_BYTES reach OFF_STATE).
    if constexpr (MB > 1) load_state();
#if USE_CP_ASYNC
    __pipeline_wait_prior(0); // only empty groups remain; none may land in the parking area
#endif
    __syncthreads();          // every warp is done with the last stage (and Q) before parking

    // Every lane of a row's quad holds the row's whole sum (the MMA against ones).

    // Split KV: the query tile's other CTAs hold the rest of its keys.
    if constexpr (SPLIT) {
        split_kv_end<D, CAUSAL>(o[0], m_run[0], l_run[0], out, work, B * H, Sq, v_scale_shared,
                                CAN_PACK ? pack_shared : 1);
        return;
    }

    // Merge the KV splits into split 0 (shared memory is free: the loop ended on a barrier).
#if KV_SPLIT > 1
    float* park = reinterpret_cast<float*>(smem);
    const int rw = warp % ROW_WARPS;
    constexpr int PB = D / 2 + 4; // parked floats per lane and MMA block: O, then m[2], l[2]
    constexpr int PM = D / 2;     // m at PM, l at PM + 2
    if (split > 0) {
        float* mine = park + ((split - 1) * ROW_WARPS + rw) * G::PARK_FLOATS + lane;
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) {
#pragma unroll
            for (int n = 0; n < D / 8; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) mine[(mb * PB + n * 4 + e) * 32] = o[mb][n][e];
            mine[(mb * PB + PM) * 32] = m_run[mb][0];
            mine[(mb * PB + PM + 1) * 32] = m_run[mb][1];
            mine[(mb * PB + PM + 2) * 32] = l_run[mb][0];
            mine[(mb * PB + PM + 3) * 32] = l_run[mb][1];
        }
    }
    __syncthreads();
    if (split > 0) return;
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) {
        float m_all[2] = {m_run[mb][0], m_run[mb][1]};
#pragma unroll
        for (int k2 = 1; k2 < KV_SPLIT; ++k2) {
            const float* theirs = park + ((k2 - 1) * ROW_WARPS + rw) * G::PARK_FLOATS + mb * PB * 32 + lane;
            m_all[0] = fmaxf(m_all[0], theirs[PM * 32]);
            m_all[1] = fmaxf(m_all[1], theirs[(PM + 1) * 32]);
        }
        // A split that saw no key has m = M_NONE: its weight exp2(M_NONE - M) is 0 (1 when no
        // split saw one: then every l and O is 0 and the row is written as zeros below).
        float f[2]; // split 0's weight exp2(m_0 - M)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            f[i] = exp2f(m_run[mb][i] - m_all[i]);
            l_run[mb][i] = __fmul_rn(l_run[mb][i], f[i]);
        }
#pragma unroll
        for (int n = 0; n < D / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[mb][n][e] = __fmul_rn(o[mb][n][e], f[e >> 1]);
#pragma unroll
        for (int k2 = 1; k2 < KV_SPLIT; ++k2) {
            const float* theirs = park + ((k2 - 1) * ROW_WARPS + rw) * G::PARK_FLOATS + mb * PB * 32 + lane;
            float a[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                a[i] = exp2f(theirs[(PM + i) * 32] - m_all[i]);
                l_run[mb][i] = __fmaf_rn(theirs[(PM + 2 + i) * 32], a[i], l_run[mb][i]);
            }
#pragma unroll
            for (int n = 0; n < D / 8; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) o[mb][n][e] = __fmaf_rn(theirs[(n * 4 + e) * 32], a[e >> 1], o[mb][n][e]);
        }
    }
#endif

    // Normalize and store (the head and rows read again: nothing held across the loop).
    const float v_sc = v_scale_shared;
    const int pack_out = CAN_PACK ? pack_shared : 1;
    __half* out_bh = out + (size_t)row_head(pack_out, cta_head<CAUSAL>(), 0) * Sq * D;
    const size_t out_pair = (size_t)(heads_per_warp(pack_out) - 1) * Sq * D; // row i's head
    const int q0_out = warp_row0<CAUSAL, MB>(pack_out > 1);
    // Per row (g, g + 8) of block mb and 16-dim chunk c a lane holds dims 16c + 4q .. +3 as
    // (o[mb][2c][.], o[mb][2c+1][.], o[mb][2c][. + 1], o[mb][2c+1][. + 1]): one 8-byte store.
    // A row that saw no key has l = 0 and is written as zeros.
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
#ifdef MUTANT_STORE_ROW_OFF_BY_ONE
            const int row = q0_out + 16 * mb + row_in_head(pack_out, g, i) + 1;
#else
            const int row = q0_out + 16 * mb + row_in_head(pack_out, g, i);
#endif
            if (row < Sq) {
                const float scale = l_run[mb][i] == 0.0f ? 0.0f : v_sc / l_run[mb][i];
                uint2* dst = reinterpret_cast<uint2*>(out_bh + i * out_pair + (size_t)row * D + 4 * qd);
#pragma unroll
                for (int c = 0; c < D / 16; ++c) {
                    const __half d0 = __float2half_rn(__fmul_rn(o[mb][2 * c][2 * i], scale));
                    const __half d1 = __float2half_rn(__fmul_rn(o[mb][2 * c + 1][2 * i], scale));
                    const __half d2 = __float2half_rn(__fmul_rn(o[mb][2 * c][2 * i + 1], scale));
                    const __half d3 = __float2half_rn(__fmul_rn(o[mb][2 * c + 1][2 * i + 1], scale));
                    dst[c * 4] = make_uint2(pack_half2(d0, d1), pack_half2(d2, d3));
                }
            }
        }
#ifdef MUTANT_K_READ_PAST_END
    // blockIdx.x is the query tile of an unmasked grid (its shape, partial77, is unmasked).
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        (void)*(volatile const u8*)(k_bh + (size_t)Sk * D); // past the last head's K
    }
#endif
}

__device__ __forceinline__ unsigned dynamic_smem_size() {
    unsigned r;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));
    return r;
}
// Whether this launch runs the deeper pipeline: a short query at D = 128 whose launch gave
// the deeper stages' shared memory (the host does for GQA/MQA whose packs fit one CTA an SM:
// src/backend/cuda/identity/geometry.rs `launch_smem_bytes`). The depth changes
// when codes land, not what is computed: the outputs are the same bits.
template <int D>
__device__ __forceinline__ bool deep_pipeline(int Sq) {
    if constexpr (D == 128 && HAS_DEEP) {
        return Sq <= SHORT_Q_ROWS && dynamic_smem_size() >= (unsigned)Geo<D, SHORT_STAGES>::SMEM_BYTES;
    } else {
        return false;
    }
}
// The body of ST stages for this launch: one that splits the KV steps where the launch has
// gridDim.z > 1 (the host asks only at D = 128: identity/geometry.rs `kv_ctas`), else the one
// with no split.
template <int D, bool CAUSAL, int ST>
__device__ __forceinline__ void sdpa_split_or_not(SDPA_BODY_PARAMS) {
    if constexpr (can_split<D>()) {
        if (gridDim.z > 1) {
            sdpa_body<D, CAUSAL, ST, true>(SDPA_PASS);
            return;
        }
    }
    sdpa_body<D, CAUSAL, ST, false>(SDPA_PASS);
}
// WIDE: queries longer than SHORT_Q_ROWS run the body of WARP_MB<D> blocks a warp (the
// entries); the D = 128 companions run one block a warp everywhere (16-row warps, 32-row
// query tiles).
template <int D, bool CAUSAL, bool WIDE = true>
__device__ __forceinline__ void sdpa_entry(SDPA_BODY_PARAMS) {
    if constexpr (D == 128 && HAS_DEEP) {
        if (deep_pipeline<D>(Sq)) {
            sdpa_split_or_not<D, CAUSAL, SHORT_STAGES>(SDPA_PASS);
            return;
        }
    }
#ifdef SHORT_Q_EXPECT_DEEP
    // Test hook (tests/gpu_kernel.rs), never in normal builds: a short GQA/MQA query at D = 128
    // that reaches the shallow body traps, so a test whose problems' packs all fit the SMs
    // (the host then launches them deep) knows the deep body ran.
    if (D == 128 && Sq <= SHORT_Q_ROWS && Hkv < H) __trap();
#endif
    // Queries longer than SHORT_Q_ROWS at D = 128: warps of 32 rows (their query tiles are
    // SDPA_BLOCK_M_D128 rows; a short query's one tile holds its rows either way).
    if constexpr (WIDE && WARP_MB<D> > 1) {
        if (Sq > SHORT_Q_ROWS) {
            if (gridDim.z > 1) __trap(); // the host splits short queries only
            sdpa_body<D, CAUSAL, STAGES, false, WARP_MB<D>>(SDPA_PASS);
            return;
        }
    }
    sdpa_split_or_not<D, CAUSAL, STAGES>(SDPA_PASS);
}

// The entries, one per D. D = 64 is held to 128 registers (4 CTAs of 128 threads in 64K
// registers), D = 128 to 255 (2 CTAs): the header's "Resources per D".
#define SDPA_ARGS                                                                            \
    const u8 *__restrict__ q, const u8 *__restrict__ k, const u8 *__restrict__ v,           \
        const float *__restrict__ q_scale, const float *__restrict__ k_scale,                \
        const float *__restrict__ v_scale, __half *__restrict__ out, int B, int H, int Hkv,  \
        int Sq, int Sk, int causal, float softmax_scale, float *__restrict__ work,          \
        const TmaDesc *__restrict__ kv_maps

// One entry per (D, causal); a module holds those SDPA_D and SDPA_CAUSAL select. The causal
// argument is the same for every entry (the host picks the entry by it), so one ABI serves all.
// Registers per entry (gates/default.json, "resources" and "resources_by_entry"): see the
// header's "Resources per entry".
#define D64_BOUNDS __launch_bounds__(THREADS, 65536 / (THREADS * 128))
#define D64_CAUSAL_BOUNDS __launch_bounds__(THREADS, 3)
#define D128_BOUNDS __launch_bounds__(THREADS, 2)
#define ENTRY_OF(NAME, BOUNDS, DIM, CAUSAL_, WIDE) \
    extern "C" __global__ void BOUNDS NAME(SDPA_ARGS) {                                    \
        const TmaDesc *k_map = kv_maps, *v_map = kv_maps + 1;                                  \
        sdpa_entry<DIM, CAUSAL_, WIDE>(SDPA_PASS);                                             \
    }
#define ENTRY(NAME, BOUNDS, DIM, CAUSAL_) ENTRY_OF(NAME, BOUNDS, DIM, CAUSAL_, true)

#if (SDPA_D == 0 || SDPA_D == 64) && SDPA_CAUSAL != 1
ENTRY(sdpa_fp8_stage_c_mma_d64, D64_BOUNDS, 64, false)
#endif
#if (SDPA_D == 0 || SDPA_D == 64) && SDPA_CAUSAL != 0
ENTRY(sdpa_fp8_stage_c_mma_d64_causal, D64_CAUSAL_BOUNDS, 64, true)
#endif
#if (SDPA_D == 0 || SDPA_D == 128) && SDPA_CAUSAL != 1
ENTRY(sdpa_fp8_stage_c_mma_d128, D128_BOUNDS, 128, false)
#endif
#if (SDPA_D == 0 || SDPA_D == 128) && SDPA_CAUSAL != 0
ENTRY(sdpa_fp8_stage_c_mma_d128_causal, D128_BOUNDS, 128, true)
#endif

// The D = 128 companions (the header's "Warps"): the entries' code with 16-row warps, for
// problems whose 64-row CTAs would be too few to fill the GPU. The host launches one where
// its waves of CTAs end sooner (cuda/kernels.toml `narrow_d128`, src/backend/cuda/launch.rs
// `plan_tiles`), with its entry's shared memory; both compute every row by the same steps.
// The name carries the rows (`<entry>_m<rows>`), so only the default grid (2 row warps) has
// them; another grid's launches all take the entry's own tile.
#if D128_WARP_ROWS > 16 && ROW_WARPS == 2
static_assert(BLOCK_M == 32, "the companions' names say 32 rows");
extern "C" __constant__ int SDPA_COMPANION_ROWS_D128 = BLOCK_M;
extern "C" __constant__ int SDPA_COMPANION_THREADS_D128 = THREADS;
#if (SDPA_D == 0 || SDPA_D == 128) && SDPA_CAUSAL != 1
ENTRY_OF(sdpa_fp8_stage_c_mma_d128_m32, D128_BOUNDS, 128, false, false)
#endif
#if (SDPA_D == 0 || SDPA_D == 128) && SDPA_CAUSAL != 0
ENTRY_OF(sdpa_fp8_stage_c_mma_d128_causal_m32, D128_BOUNDS, 128, true, false)
#endif
#endif
#undef CTA_KEYS
#undef WARP_KEYS

