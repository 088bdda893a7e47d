#!/usr/bin/env bash
# One session on a GPU machine, from the checkout, with binaries staged by stage_device.sh.
#   scripts/gpu_session.sh [OUT_DIR] [SECTION...]   (OUT_DIR defaults to $OUT, else ./gpu-session)
# Sections (default: all of them):
#   check     the default run (a baseline candidate), every shape, the USE_CP_ASYNC workflows
#             (restricted run; two runs + compare), batched and cold-L2 timing, a calibration
#             run (seeds 0-4) summarized by `sdpa-runner calibrate`
#   verdicts  the A/A and planted-slowdown proof of the performance verdicts
#   power     (not in the default list: about 15 minutes) the in-run floors measured, then A/A
#             and planted 0.5%/1% slowdowns judged with them (scripts/prove_power.sh all)
#   prgate    the PR gate (scripts/prove_pr_gate.sh: A/A, planted 3%, a mutant), then the
#             workflow's commands (base git:HEAD where the checkout has history)
#   validate  stress --repeats 1000 on every shape, the mutation self-test, sanitize.sh on the
#             clean kernel and on the out-of-bounds mutant, the ncu profile of mission
#   perf      issue 6: our kernel beside PyTorch SDPA (scripts/peer_torch_sdpa.py) on mission,
#             long, large; the warp grids ROW_WARPS x KV_SPLIT; the kernel before (if staged)
#   tests     every test executable with --include-ignored, and compute-sanitizer on small shapes
# Full logs and result directories go into OUT_DIR/session.tgz; a short table is printed last.
set -u
out=${1:-${OUT:-./gpu-session}}
shift || true
sections=${*:-check verdicts prgate validate perf tests}
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

power() {
  step prove_power scripts/prove_power.sh all "$work/power"
  keep+=("$work/prove_power.log")
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

perf() { # issue 6: the kernel beside PyTorch, warp-grid choices, before/after
  local shp=${PERF_SHAPES:-mission,long,large}
  step perf_floors python3 scripts/perf_floors.py --shapes "$shp" --json "$work/perf/floors.json"
  step perf_ours "$runner" --shapes "$shp" --seeds 0 --results-dir "$work/perf/ours"
  step perf_peer_torch python3 scripts/peer_torch_sdpa.py --shapes "$shp" --seeds 0 --results-dir "$work/perf/peer"
  local ours peer
  ours=$(ls -d "$work"/perf/ours/2* | head -1)
  peer=$(ls -d "$work"/perf/peer/2*-peer-torch-* | head -1)
  for b in cudnn flash efficient; do
    for v in cp0 cp1; do
      step "perf_vs_torch_${b}_$v" "$runner" compare "$peer" "$ours" --base-variant "torch-$b" --cand-variant $v --out "$work/perf/COMPARE-torch-$b-vs-$v.md"
    done
  done
  for s in mission long; do
    step "perf_ncu_$s" env RESULTS_DIR="$work/perf/ncu-$s" scripts/profile_ncu.sh $s 0
  done
  # Warp grids (ROW_WARPS x KV_SPLIT), each its own run, compared with the default (2 x 2).
  for grid in ${PERF_GRIDS-"4x1 4x2 1x2"}; do
    grid=${grid/x/ }
    set -- $grid
    step "perf_grid_${1}x${2}" "$runner" --shapes "$shp" --seeds 0 --define "ROW_WARPS=$1" --define "KV_SPLIT=$2" --results-dir "$work/perf/grid-${1}x${2}"
    for v in cp0 cp1; do
      step "perf_grid_${1}x${2}_vs_default_$v" "$runner" compare "$ours" "$work"/perf/grid-${1}x${2}/2* --base-variant $v --cand-variant $v --out "$work/perf/COMPARE-grid-${1}x${2}-vs-2x2-$v.md"
    done
  done
  # An earlier kernel (copied to .device/kernel_before.cu by hand, when present).
  if [ -f .device/kernel_before.cu ]; then
    step perf_before "$runner" --shapes "$shp" --seeds 0 --kernel .device/kernel_before.cu --results-dir "$work/perf/before"
    for v in cp0 cp1; do
      step "perf_before_vs_now_$v" "$runner" compare "$work"/perf/before/2* "$ours" --base-variant $v --cand-variant $v --out "$work/perf/COMPARE-before-vs-now-$v.md"
    done
  fi
  for f in "$work"/perf/COMPARE-*.md; do
    echo "=== $(basename "$f")"
    grep -E '^\| *(mission|long|large|small)|WARNING|verdict' "$f" | head -12
  done >"$work/perf_digest.txt"
  keep+=("$work/perf_digest.txt" "$work/perf_ours.log" "$work/perf_peer_torch.log" "$work/perf_floors.log" "$work/perf_ncu_mission.log")
}

prgate() { # issue 12: the PR gate's proof, then the workflow's commands as CI runs them
  step prove_pr_gate scripts/prove_pr_gate.sh "${PR_GATE_REPEATS:-20}" "$work/pr-gate"
  local base=cuda/sdpa_fp8_stage_c_mma.cu
  git rev-parse --verify -q HEAD >/dev/null 2>&1 && base=git:HEAD
  step workflow_correctness "$runner" --shapes all --seeds 0,1,2 --iters 0 --results-dir "$work/wf/pr-all" --junit "$work/wf/junit-all.xml"
  step workflow_gate "$runner" --shapes small,mission --seeds 0,1,2 --base-kernel "$base" --gate --results-dir "$work/wf/pr" --junit "$work/wf/junit-gate.xml"
  step workflow_baseline sh -c "'$runner' baseline compare \"\$(ls -d '$work'/wf/pr/2* | tail -n1)\" --out '$work/wf/COMPARE-vs-baseline.md'"
  keep+=("$work/prove_pr_gate.log" "$work/workflow_gate.log" "$work/workflow_baseline.log")
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
