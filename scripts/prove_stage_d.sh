#!/usr/bin/env bash
# Issue 27's checks of Stage D through the runner, on one GPU, in one device call (about 6
# minutes on an H100 with the defaults), from the checkout with binaries staged by
# scripts/stage_device.sh:
#   scripts/prove_stage_d.sh OUT_DIR
# Steps: the main job, `--shapes llm --seeds 0,1`, `--shapes all --seeds 0` (correctness only),
# fuzz, stress, the self-test, the PR gate against a byte-identical copy of the kernel (SAME
# CODE, SAME) and against a planted slowdown (SDPA_DELAY_CYCLES=SLOW, default 4000: SLOWER,
# exit 1), and `calibrate` over the three correctness runs: its last column is the largest
# distance of a correct output from the emulation in f16 ulps, the evidence a gate on that
# distance needs (docs/DESIGN.md "How small a mistake they catch, per kernel").
# Environment:
#   EXTRA     more arguments for the run, fuzz and stress steps, e.g. "--define V_SWIZZLE=0"
#             (the self-test and the gate build the checkout's defaults)
#   FUZZ      fuzz problems (default 1000); REPEATS stress repeats (default 1000)
#   LLM_SHAPES, ALL_SHAPES  the two correctness sets (default llm and all)
#   BACKEND   cpu: a smoke test of this script without a GPU (small counts and shapes; no
#             self-test, no gate, which need the GPU kernel)
# Full logs under OUT_DIR/l; a table last.
# Exit 0 when every step exited as expected (0; 1 for the planted slowdown), 1 otherwise, 2 on
# bad arguments.
set -u
[ $# -eq 1 ] && [ -n "$1" ] || { echo "usage: scripts/prove_stage_d.sh OUT_DIR (a new or empty folder)" >&2; exit 2; }
if [ -e "$1" ] && [ ! -d "$1" ]; then
  echo "prove_stage_d.sh: $1 is not a folder; choose a new folder" >&2; exit 2
fi
if [ -n "$(ls -A "$1" 2>/dev/null)" ]; then
  echo "prove_stage_d.sh: $1 is not empty; choose a new folder (its runs would mix into calibrate)" >&2; exit 2
fi
if [ -n "${SDPA_RUNNER_BIN:-}" ]; then
  # Resolved where the command was given, before the script moves to the checkout.
  case $SDPA_RUNNER_BIN in /*) ;; *) SDPA_RUNNER_BIN=$PWD/$SDPA_RUNNER_BIN;; esac
  [ -x "$SDPA_RUNNER_BIN" ] || { echo "prove_stage_d.sh: SDPA_RUNNER_BIN=$SDPA_RUNNER_BIN is not an executable" >&2; exit 2; }
fi
case ${BACKEND:-cuda} in cpu|cuda) ;; *) echo "prove_stage_d.sh: BACKEND is cpu or cuda, not '$BACKEND'" >&2; exit 2;; esac
extra=${EXTRA:-}
backend=()
fuzz=${FUZZ:-1000}
repeats=${REPEATS:-1000}
llm=${LLM_SHAPES:-llm}
all=${ALL_SHAPES:-all}
if [ "${BACKEND:-cuda}" = cpu ]; then
  backend=(--backend cpu)
  fuzz=${FUZZ:-5}
  repeats=${REPEATS:-2}
  llm=${LLM_SHAPES:-1x4x77x128:hkv=2:causal,2x8x1x64:sk=300:hkv=1}
  all=${ALL_SHAPES:-small,1x2x113x64:sk=203:causal}
fi
case $repeats in ''|*[!0-9]*) echo "prove_stage_d.sh: REPEATS must be an integer of at least 2" >&2; exit 2;; esac
[ "$repeats" -ge 2 ] || { echo "prove_stage_d.sh: REPEATS must be at least 2 (stress compares repeats)" >&2; exit 2; }
mkdir -p "$1" || exit 2
out=$(cd "$1" && pwd)
cd "$(dirname "$0")/.." || exit 2
R=${SDPA_RUNNER_BIN:-$PWD/.device/sdpa-runner}
[ -x "$R" ] || R=$PWD/target/release/sdpa-runner
[ -x "$R" ] || { echo "prove_stage_d.sh: no sdpa-runner binary (stage it with scripts/stage_device.sh, or cargo build --release)" >&2; exit 2; }
mkdir -p "$out/l"
T=$out/table.txt
bad=0
: > "$T"
{ nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo "no GPU (backend ${BACKEND:-cuda})"; } >> "$T"
echo "runner: $R; EXTRA: ${extra:-none}" >> "$T"
# step NAME WANT CMD...: runs it, logs to l/NAME.log, records its exit code (WANT expected)
# and seconds.
step() {
  local name=$1 want=$2
  shift 2
  local t0
  t0=$(date +%s)
  "$@" > "$out/l/$name.log" 2>&1
  local rc=$?
  local mark=""
  [ "$rc" = "$want" ] || { mark=" (expected $want)"; bad=1; }
  printf '%-9s exit %-3s %4ss  %s\n' "$name" "$rc$mark" "$(($(date +%s) - t0))" \
    "$(grep -E '^[0-9]+/[0-9]+ PASS|^fuzz:|^stress:|mutation score|verdict|SAME|FAIL' "$out/l/$name.log" | tail -1 | cut -c1-110)" >> "$T"
}
# shellcheck disable=SC2086  # EXTRA is a list of arguments
{
  step main 0 "$R" "${backend[@]}" --kernel stage-d --shapes small,mission --seeds 0,1,2 $extra --results-dir "$out/main"
  step llm 0 "$R" "${backend[@]}" --kernel stage-d --shapes "$llm" --seeds 0,1 --iters 0 $extra --results-dir "$out/llm"
  step all 0 "$R" "${backend[@]}" --kernel stage-d --shapes "$all" --seeds 0 --iters 0 $extra --results-dir "$out/all"
  step fuzz 0 "$R" fuzz "${backend[@]}" --kernel stage-d --count "$fuzz" $extra --results-dir "$out/fuzz"
  step stress 0 "$R" stress "${backend[@]}" --kernel stage-d --shapes small,mission,partial300 --seeds 0 --repeats "$repeats" $extra --results-dir "$out/stress"
}
if [ "${BACKEND:-cuda}" != cpu ]; then
  step selftest 0 "$R" selftest --kernel stage-d --results-dir "$out/selftest"
  mkdir -p "$out/copy"
  cp cuda/sdpa_fp8_stage_d_wgmma.cu cuda/hopper_async.cuh "$out/copy/"
  step gate 0 "$R" --kernel stage-d --shapes mission,llama-prefill --seeds 0,1,2 --base-kernel "$out/copy/sdpa_fp8_stage_d_wgmma.cu" --gate --results-dir "$out/gate"
  # A planted slowdown: the candidate's CTAs each wait SLOW cycles first (about 2 us at the
  # default: mission runs one wave, llama-prefill about eight), so the gate must say SLOWER
  # and exit 1.
  mkdir -p "$out/slow"
  { echo "#define SDPA_DELAY_CYCLES ${SLOW:-4000}"; cat cuda/sdpa_fp8_stage_d_wgmma.cu; } > "$out/slow/sdpa_fp8_stage_d_wgmma.cu"
  cp cuda/hopper_async.cuh "$out/slow/"
  step slower 1 "$R" --kernel "$out/slow/sdpa_fp8_stage_d_wgmma.cu" --shapes mission,llama-prefill --seeds 0,1,2 --base-kernel cuda/sdpa_fp8_stage_d_wgmma.cu --gate --results-dir "$out/slower"
fi
runs=()
for d in main llm all; do
  for r in "$out/$d"/2*; do [ -f "$r/correctness.json" ] && runs+=("$r"); done
done
if [ ${#runs[@]} -gt 0 ]; then
  "$R" calibrate "${runs[@]}" > "$out/l/calibrate.log" 2>&1 || { echo "calibrate exit $?" >> "$T"; bad=1; }
  echo "calibrate (last column: max f16 ulps from the emulation):" >> "$T"
  grep -E '^\| \*\*all\*\*' "$out/l/calibrate.log" >> "$T"
  # The last column is a count, "non-finite" (worst of all) or "-" (not recorded).
  grep -E '^\| ' "$out/l/calibrate.log" | grep -v -E '^\| (shape|---|\*\*all)' \
    | awk -F'|' '{u=$(NF-1); gsub(/ /, "", u); k = u == "non-finite" ? 4294967296 : (u == "-" ? -1 : u); print k "\t" u " |" $2 "|" $3}' \
    | sort -t$'\t' -k1,1 -g -r | head -5 | cut -f2 | sed 's/^/  largest: /' >> "$T"
fi
cat "$T"
exit $bad
