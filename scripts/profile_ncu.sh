#!/usr/bin/env bash
# Nsight Compute on one shape and seed: the metrics of the kernel's performance plan (tensor
# pipe activity, SM throughput, DRAM bytes), achieved occupancy, duration and the warp stall
# reasons (WarpStateStats), for each variant, saved as CSV in the run directory with a
# side-by-side table of the variants. Clocks are left as they are (--clock-control none).
#   scripts/profile_ncu.sh SHAPE SEED [0|1|both]      (default both)
# Uses $SDPA_RUNNER_BIN (default target/release/sdpa-runner) and $RESULTS_DIR (default results).
set -eu
shape=$1
seed=$2
variant=${3:-both}
runner=${SDPA_RUNNER_BIN:-./target/release/sdpa-runner}
results=${RESULTS_DIR:-results}
metrics=smsp__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes.sum,sm__warps_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum,smsp__inst_executed.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,launch__occupancy_limit_shared_mem,launch__occupancy_limit_registers
tmp=$(mktemp -d)
# Correctness-only: exactly one checked launch per variant, in the order the run lists them.
ncu --clock-control none --kernel-name sdpa_fp8_stage_c_mma --metrics "$metrics" \
    --section WarpStateStats --csv --page raw --log-file "$tmp/ncu.csv" \
    "$runner" --shapes "$shape" --seeds "$seed" --iters 0 --cp-async "$variant" \
    --results-dir "$tmp/runs" >"$tmp/runner.log" 2>&1
run=$(ls -d "$tmp"/runs/2* | tail -n 1)
python3 - "$tmp/ncu.csv" "$run" <<'PY'
import csv, json, sys
path, run = sys.argv[1], sys.argv[2]
rows = [r for r in csv.reader(open(path)) if r and not r[0].startswith("==")]
header, units, launches = rows[0], rows[1], rows[2:]
variants = [r["variant"] for r in json.load(open(f"{run}/correctness.json"))["results"]]
with open(f"{run}/ncu.csv", "w", newline="") as f:
    csv.writer(f).writerows(rows)
keep = [i for i, h in enumerate(header) if "__" in h]
with open(f"{run}/ncu_side_by_side.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["metric", "unit"] + variants)
    for i in keep:
        w.writerow([header[i], units[i]] + [l[i] for l in launches])
print(f"{'metric':70} {'unit':10} " + " ".join(f"{v:>14}" for v in variants))
for i in keep:
    name = header[i]
    if any(k in name for k in ("tensor", "sm__throughput", "dram__bytes", "warps_active", "duration", "stalled", "inst_executed", "bank_conflicts", "occupancy_limit")):
        print(f"{name[:70]:70} {units[i][:10]:10} " + " ".join(f"{l[i][:14]:>14}" for l in launches))
print(f"saved {run}/ncu.csv and {run}/ncu_side_by_side.csv")
PY
mkdir -p "$results"
cp -r "$run" "$results/"
echo "run directory: $results/$(basename "$run")"
