#!/usr/bin/env bash
# A kernel change on one GPU (docs/PERF.md): whether its outputs keep their bits on every shape,
# the in-run A/B against the previous kernel, the
# PyTorch peer through `compare`, stress x1000 on every shape, the self-test, the sanitizers and
# ncu on mission and long. Full logs under OUT_DIR; a table last.
#   scripts/validate_kernel.sh OUT_DIR BASE_KERNEL.cu     (binaries staged in .device/)
set -u
out=$1; base=$2; R=$PWD/.device/sdpa-runner; export SDPA_RUNNER_BIN=$R
mkdir -p $out/l; T=$out/table.txt; nvidia-smi --query-gpu=name --format=csv,noheader >> $T
step() { local n=$1; shift; local t0=$(date +%s); "$@" > $out/l/$n.log 2>&1; echo "$n exit $? $(($(date +%s)-t0))s" >> $T; }
# Same bits? Every shape, both variants of both kernels: equal output checksums per (shape, seed).
step bits $R --shapes all --seeds 0,1 --iters 0 --base-kernel $base --results-dir $out/bits
python3 - "$(ls -d $out/bits/2* | head -1)/correctness.json" >> $T <<'PY'
import json, sys, collections
sums = collections.defaultdict(set)
for r in json.load(open(sys.argv[1]))["results"]:
    sums[(r["shape"], r["seed"])].add(r["output_checksum"])
same = sum(len(v) == 1 for v in sums.values())
print(f"bits: {same} of {len(sums)} (shape, seed) have one output checksum across the 4 builds")
PY
step ab $R --shapes mission,long,large --seeds 0,1,2 --base-kernel $base --results-dir $out/ab
grep -E " vs .*speedup|^cp[01] " $out/l/ab.log >> $T
step ours $R --shapes mission,long,large --seeds 0 --results-dir $out/ours
step peer python3 scripts/peer_torch_sdpa.py --shapes mission,long,large --seeds 0 --results-dir $out/peer
ours=$(ls -d $out/ours/2* | head -1); peer=$(ls -d $out/peer/2*-peer-torch-* | head -1)
for b in cudnn flash efficient; do for v in cp0 cp1; do $R compare $peer $ours --base-variant torch-$b --cand-variant $v --out $out/COMPARE-torch-$b-vs-$v.md > $out/l/cmp-$b-$v.log 2>&1; echo "== torch-$b vs $v" >> $T; grep -E "^\| *(mission|long|large) " $out/COMPARE-torch-$b-vs-$v.md | head -3 | cut -c1-150 >> $T; done; done
step stress $R stress --shapes all --seeds 0 --repeats 1000 --results-dir $out/stress
tail -3 $out/l/stress.log >> $T
step selftest $R selftest --results-dir $out/selftest
grep -E "mutation score|^\| MUTANT" $out/l/selftest.log | cut -c1-160 >> $T
step sanitize env SANITIZE_LOGS=$out/sanitize scripts/sanitize.sh
cat $out/l/sanitize.log >> $T
step ncu env RESULTS_DIR=$out/ncu scripts/profile_ncu.sh mission 0
grep -E "gpu__time_duration.sum|inst_executed.sum|tensor_cycles_active.avg|long_scoreboard|bank_conflicts.*sum|occupancy_limit_(reg|shared)" $out/l/ncu.log >> $T
step ncu_long env RESULTS_DIR=$out/ncu-long scripts/profile_ncu.sh long 0
grep -E "gpu__time_duration.sum|inst_executed.sum|tensor_cycles_active.avg|sm__throughput.avg|warps_active.avg|long_scoreboard|short_scoreboard|stalled_wait|bank_conflicts.*sum|occupancy_limit_(reg|shared)" $out/l/ncu_long.log >> $T
