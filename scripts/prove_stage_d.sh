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
#   EXTRA     more arguments for the run, fuzz and stress steps, e.g. "--define V_SWIZZLE=1"
#             (the self-test and the gate build the checkout's defaults)
#   FUZZ      fuzz problems (default 1000); REPEATS stress repeats (default 1000)
#   LLM_SHAPES, ALL_SHAPES  the two correctness sets (default llm and all)
#   BACKEND   cpu: a smoke test of this script without a GPU (small counts and shapes; no
#             self-test, no gate, which need the GPU kernel)
# Full logs under OUT_DIR/l; a table last.
set -u
out=$1
R=${SDPA_RUNNER_BIN:-$PWD/.device/sdpa-runner}
[ -x "$R" ] || R=$PWD/target/release/sdpa-runner
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
mkdir -p "$out/l"
T=$out/table.txt
: > "$T"
{ nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo "no GPU (backend ${BACKEND:-cuda})"; } >> "$T"
echo "EXTRA: ${extra:-none}" >> "$T"
# step NAME CMD...: runs it, logs to l/NAME.log, records its exit code and seconds.
step() {
  local name=$1
  shift
  local t0
  t0=$(date +%s)
  "$@" > "$out/l/$name.log" 2>&1
  local rc=$?
  printf '%-9s exit %-3s %4ss  %s\n' "$name" "$rc" "$(($(date +%s) - t0))" \
    "$(grep -E '^[0-9]+/[0-9]+ PASS|^fuzz:|^stress:|mutation score|verdict|SAME|FAIL' "$out/l/$name.log" | tail -1 | cut -c1-110)" >> "$T"
}
# shellcheck disable=SC2086  # EXTRA is a list of arguments
{
  step main "$R" "${backend[@]}" --kernel stage-d --shapes small,mission --seeds 0,1,2 $extra --results-dir "$out/main"
  step llm "$R" "${backend[@]}" --kernel stage-d --shapes "$llm" --seeds 0,1 --iters 0 $extra --results-dir "$out/llm"
  step all "$R" "${backend[@]}" --kernel stage-d --shapes "$all" --seeds 0 --iters 0 $extra --results-dir "$out/all"
  step fuzz "$R" fuzz "${backend[@]}" --kernel stage-d --count "$fuzz" $extra --results-dir "$out/fuzz"
  step stress "$R" stress "${backend[@]}" --kernel stage-d --shapes small,mission,partial300 --seeds 0 --repeats "$repeats" $extra --results-dir "$out/stress"
}
if [ "${BACKEND:-cuda}" != cpu ]; then
  step selftest "$R" selftest --kernel stage-d --results-dir "$out/selftest"
  mkdir -p "$out/copy"
  cp cuda/sdpa_fp8_stage_d_wgmma.cu cuda/hopper_async.cuh "$out/copy/"
  step gate "$R" --kernel stage-d --shapes mission,llama-prefill --seeds 0,1,2 --base-kernel "$out/copy/sdpa_fp8_stage_d_wgmma.cu" --gate --results-dir "$out/gate"
  # A planted slowdown: the candidate's CTAs each wait SLOW cycles first (about 2 us at the
  # default: mission runs one wave, llama-prefill about eight), so the gate must say SLOWER
  # and exit 1.
  mkdir -p "$out/slow"
  { echo "#define SDPA_DELAY_CYCLES ${SLOW:-4000}"; cat cuda/sdpa_fp8_stage_d_wgmma.cu; } > "$out/slow/sdpa_fp8_stage_d_wgmma.cu"
  cp cuda/hopper_async.cuh "$out/slow/"
  step slower "$R" --kernel "$out/slow/sdpa_fp8_stage_d_wgmma.cu" --shapes mission,llama-prefill --seeds 0,1,2 --base-kernel cuda/sdpa_fp8_stage_d_wgmma.cu --gate --results-dir "$out/slower"
fi
runs=()
for d in main llm all; do
  for r in "$out/$d"/2*; do [ -f "$r/correctness.json" ] && runs+=("$r"); done
done
if [ ${#runs[@]} -gt 0 ]; then
  "$R" calibrate "${runs[@]}" > "$out/l/calibrate.log" 2>&1
  echo "calibrate (last column: max f16 ulps from the emulation):" >> "$T"
  grep -E '^\| \*\*all\*\*' "$out/l/calibrate.log" >> "$T"
  grep -E '^\| ' "$out/l/calibrate.log" | grep -v -E '^\| (shape|---|\*\*all)' \
    | awk -F'|' '{print $(NF-1)"|"$2"|"$3}' | sort -t'|' -k1,1 -n -r | head -5 \
    | sed 's/^/  largest: /' >> "$T"
fi
cat "$T"
