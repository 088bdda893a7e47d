#!/usr/bin/env bash
# One session on a GPU machine, from the checkout, with binaries staged by stage_device.sh:
# the environment, the GPU tests, the main job on every shape, the USE_CP_ASYNC=1 workflow,
# and a calibration run (seeds 0-4) summarized by `sdpa-runner calibrate`.
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

step main_all_shapes        "$runner" --shapes all --seeds 0,1,2 --results-dir "$work/results"
step use_cp_async_1         env USE_CP_ASYNC=1 "$runner" --shapes mission --seeds 0 --results-dir "$work/results"
step calibration_seeds_0_4  "$runner" --shapes all --seeds 0-4 --results-dir "$work/calibration"
step calibrate              "$runner" calibrate "$work"/calibration/*
for t in .device/tests/*; do
  step "test_$(basename "$t")" "$t" --include-ignored --test-threads 1
done
step build_identity         "$runner" build --arch sm_90
for tool in memcheck racecheck synccheck; do
  step "sanitize_$tool" timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 9 \
    "$runner" --shapes small,partial77 --seeds 0 --results-dir "$work/sanitize"
done

tar czf "$out/session.tgz" -C "$work" .
cp "$work/main_all_shapes.log" "$work/calibrate.log" "$summary" "$out/" 2>/dev/null
echo "=== main job (tail) ==="; tail -n 4 "$work/main_all_shapes.log"
echo "=== summary ==="; cat "$summary"
