#!/usr/bin/env bash
# One session on a GPU machine, from the checkout, with binaries staged by stage_device.sh:
# the environment; the default run (the baseline candidate); every shape; the USE_CP_ASYNC
# workflows (restricted run; two runs + compare); batched and cold-L2 timing; the A/A and
# planted-slowdown proof of the verdicts; a calibration run (seeds 0-4) summarized by
# `sdpa-runner calibrate`; all tests with --include-ignored; compute-sanitizer checks.
#   scripts/gpu_session.sh [OUT_DIR]        (OUT_DIR defaults to $OUT, else ./gpu-session)
# Full logs and result directories go into OUT_DIR/session.tgz; a short table is printed last.
set -u
out=${1:-${OUT:-./gpu-session}}
mkdir -p "$out"
work=$(mktemp -d)
export SDPA_RUNNER_BIN=$PWD/.device/sdpa-runner
runner=$SDPA_RUNNER_BIN
summary=$work/summary.txt

step() { # step NAME COMMAND...: runs COMMAND, logs to NAME.log, records exit code and seconds
  local name=$1; shift
  local t0=$(date +%s)
  "$@" >"$work/$name.log" 2>&1
  local rc=$?
  printf '%-28s exit %-3s %4ss\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" >>"$summary"
}

{ nvidia-smi; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv
  ls /usr/local/cuda/include/mma.h; ldconfig -p | grep -E 'libnvrtc|libcuda' ; } >"$work/environment.log" 2>&1

step main_default           "$runner" --shapes small,mission --seeds 0,1,2 --results-dir "$work/baseline" --junit "$work/junit.xml"
step main_all_shapes        "$runner" --shapes all --seeds 0,1,2 --results-dir "$work/results"
step use_cp_async_1         env USE_CP_ASYNC=1 "$runner" --shapes mission --seeds 0 --results-dir "$work/results"
# The old two-run workflow, then compare: should agree with the in-run A/B verdicts.
step seed_workflow_cp0      env USE_CP_ASYNC=0 "$runner" --shapes small,mission --seeds 0,1,2 --results-dir "$work/two-run/cp0"
step seed_workflow_cp1      env USE_CP_ASYNC=1 "$runner" --shapes small,mission --seeds 0,1,2 --results-dir "$work/two-run/cp1"
step seed_workflow_compare  "$runner" compare "$work"/two-run/cp0/2* "$work"/two-run/cp1/2* --out "$work/two-run/COMPARE.md"
step batched_and_cold_l2    sh -c "'$runner' --shapes mission,long --seeds 0 --batch 20 --iters 200 --results-dir '$work/modes' && '$runner' --shapes mission,long --seeds 0 --l2 flush --results-dir '$work/modes'"
step prove_verdicts         scripts/prove_verdicts.sh 20 "$work/verdicts"
step calibration_seeds_0_4  "$runner" --shapes all --seeds 0-4 --results-dir "$work/calibration"
step calibrate              "$runner" calibrate "$work"/calibration/2*
for t in .device/tests/*; do
  step "test_$(basename "$t")" "$t" --include-ignored --test-threads 1
done
step build_identity         "$runner" build --arch sm_90
for tool in memcheck racecheck synccheck; do
  step "sanitize_$tool" timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 9 \
    "$runner" --shapes small,partial77 --seeds 0 --iters 0 --results-dir "$work/sanitize"
done

tar czf "$out/session.tgz" -C "$work" .
cp "$work/main_default.log" "$work/calibrate.log" "$work/prove_verdicts.log" "$work/seed_workflow_compare.log" "$summary" "$out/" 2>/dev/null
cp "$work"/baseline/2*/COMPARE.md "$out/COMPARE-default.md" 2>/dev/null
echo "=== default run (tail) ==="; tail -n 16 "$work/main_default.log"
echo "=== seed workflow compare ==="; tail -n 4 "$work/seed_workflow_compare.log"
echo "=== verdict proof ==="; tail -n 3 "$work/prove_verdicts.log"
echo "=== summary ==="; cat "$summary"
