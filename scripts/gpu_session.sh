#!/usr/bin/env bash
# One session on a GPU machine, from the checkout, with binaries staged by stage_device.sh.
#   scripts/gpu_session.sh [OUT_DIR] [SECTION...]   (OUT_DIR defaults to $OUT, else ./gpu-session)
# Sections (default: all of them):
#   check     the default run (a baseline candidate), every shape, the USE_CP_ASYNC workflows
#             (restricted run; two runs + compare), batched and cold-L2 timing, a calibration
#             run (seeds 0-4) summarized by `sdpa-runner calibrate`
#   verdicts  the A/A and planted-slowdown proof of the performance verdicts
#   validate  stress --repeats 1000 on every shape, the mutation self-test, sanitize.sh on the
#             clean kernel and on the out-of-bounds mutant, the ncu profile of mission
#   tests     every test executable with --include-ignored, and compute-sanitizer on small shapes
# Full logs and result directories go into OUT_DIR/session.tgz; a short table is printed last.
set -u
out=${1:-${OUT:-./gpu-session}}
shift || true
sections=${*:-check verdicts validate tests}
mkdir -p "$out"
work=$(mktemp -d)
export SDPA_RUNNER_BIN=$PWD/.device/sdpa-runner
runner=$SDPA_RUNNER_BIN
summary=$work/summary.txt
keep=("$summary")

step() { # step NAME COMMAND...: runs COMMAND, logs to NAME.log, records exit code and seconds
  local name=$1
  shift
  local t0
  t0=$(date +%s)
  "$@" >"$work/$name.log" 2>&1
  local rc=$?
  printf '%-28s exit %-3s %4ss\n' "$name" "$rc" "$(($(date +%s) - t0))" >>"$summary"
}

check() {
  step main_default "$runner" --shapes small,mission --seeds 0,1,2 --results-dir "$work/baseline" --junit "$work/junit.xml"
  step main_all_shapes "$runner" --shapes all --seeds 0,1,2 --results-dir "$work/results"
  step use_cp_async_1 env USE_CP_ASYNC=1 "$runner" --shapes mission --seeds 0 --results-dir "$work/results"
  # The old two-run workflow, then compare: should agree with the in-run A/B verdicts.
  step seed_workflow_cp0 env USE_CP_ASYNC=0 "$runner" --shapes small,mission --seeds 0,1,2 --results-dir "$work/two-run/cp0"
  step seed_workflow_cp1 env USE_CP_ASYNC=1 "$runner" --shapes small,mission --seeds 0,1,2 --results-dir "$work/two-run/cp1"
  step seed_workflow_compare "$runner" compare "$work"/two-run/cp0/2* "$work"/two-run/cp1/2* --out "$work/two-run/COMPARE.md"
  step batched_and_cold_l2 sh -c "'$runner' --shapes mission,long --seeds 0 --batch 20 --iters 200 --results-dir '$work/modes' && '$runner' --shapes mission,long --seeds 0 --l2 flush --results-dir '$work/modes'"
  step calibration_seeds_0_4 "$runner" --shapes all --seeds 0-4 --results-dir "$work/calibration"
  step calibrate "$runner" calibrate "$work"/calibration/2*
  keep+=("$work/main_default.log" "$work/calibrate.log" "$work/seed_workflow_compare.log")
}

verdicts() {
  step prove_verdicts scripts/prove_verdicts.sh 20 "$work/verdicts"
  keep+=("$work/prove_verdicts.log")
}

validate() {
  step stress_all_shapes "$runner" stress --shapes all --seeds 0 --repeats 1000 --results-dir "$work/stress"
  step selftest "$runner" selftest --results-dir "$work/selftest"
  step sanitize_clean env SANITIZE_LOGS="$work/sanitize-clean" scripts/sanitize.sh
  step sanitize_oob_mutant env SANITIZE_LOGS="$work/sanitize-oob" scripts/sanitize.sh --define MUTANT_K_READ_PAST_END
  step sanitize_oob_small sh -c "compute-sanitizer --tool memcheck --padding 256 --error-exitcode 9 '$runner' --shapes small --seeds 0 --iters 0 --define MUTANT_K_READ_PAST_END --results-dir '$work/oob-small'; echo exit \$?"
  step profile_ncu_mission env RESULTS_DIR="$work/ncu" scripts/profile_ncu.sh mission 0
  keep+=("$work/selftest.log" "$work/profile_ncu_mission.log")
}

tests() {
  for t in .device/tests/*; do
    step "test_$(basename "$t")" "$t" --include-ignored --test-threads 1
  done
  step build_identity "$runner" build --arch sm_90
  for tool in memcheck racecheck synccheck; do
    step "sanitize_$tool" timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 9 \
      "$runner" --shapes small,partial77 --seeds 0 --iters 0 --results-dir "$work/sanitize"
  done
}

{
  nvidia-smi
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv
  ls /usr/local/cuda/include/mma.h
  ldconfig -p | grep -E 'libnvrtc|libcuda'
} >"$work/environment.log" 2>&1

for section in $sections; do
  "$section"
done

tar czf "$out/session.tgz" -C "$work" .
cp "${keep[@]}" "$out/" 2>/dev/null
for f in "${keep[@]}"; do
  [ "$f" = "$summary" ] && continue
  echo "=== $(basename "$f") (tail) ==="
  tail -n 14 "$f"
done
echo "=== summary ==="
cat "$summary"
