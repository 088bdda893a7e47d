#!/usr/bin/env bash
# Measured noise floors and their A/A false-verdict rate across processes, on one GPU:
#   scripts/prove_floors.sh OUT [MEASURE_PROCESSES] [CHECK_PROCESSES]   (default 12 and 10)
# 1. `sdpa-runner noise` times cp0 on small, mission and long in MEASURE separate processes
#    and writes the floors into OUT/floors.json;
# 2. CHECK more processes, never used for the floors, each a run of the same shapes;
# 3. every pair of them (45 for 10) through `compare --floors OUT/floors.json`: an A/A, so any
#    FASTER or SLOWER is false. The table gives, per shape, the floor and the false rate.
set -u
out=${1:?OUT}; measure=${2:-12}; check=${3:-10}
runner=${SDPA_RUNNER_BIN:-$PWD/.device/sdpa-runner}
shapes=small,mission,long
mkdir -p "$out/runs"
"$runner" noise --processes "$measure" --shapes "$shapes" --floors "$out/floors.json" >"$out/noise.log" 2>&1 ||
  { echo "noise failed"; tail -5 "$out/noise.log"; exit 1; }
for i in $(seq 1 "$check"); do
  "$runner" --shapes "$shapes" --seeds 0 --cp-async 0 --results-dir "$out/runs" >"$out/run$i.log" 2>&1 ||
    { echo "run $i failed"; exit 1; }
done
runs=("$out"/runs/2*)
: >"$out/verdicts.txt"
for ((i = 0; i < ${#runs[@]}; i++)); do
  for ((j = i + 1; j < ${#runs[@]}; j++)); do
    "$runner" compare "${runs[$i]}" "${runs[$j]}" --floors "$out/floors.json" --out "$out/cmp.md" 2>&1 |
      grep -E '^\[' >>"$out/verdicts.txt"
  done
done
tail -6 "$out/noise.log"
python3 - "$out/verdicts.txt" "$out/floors.json" <<'PY'
import json, re, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"\[(\S+)\s*\].*?(FASTER|SLOWER|SAME)", line)
    if m:
        rows.setdefault(m.group(1), []).append(m.group(2))
floors = json.load(open(sys.argv[2]))
gpu, entry = next(iter(floors["gpus"].items()))
print(f"A/A across processes on {gpu}: floors from {entry['processes']} processes, verdicts on other ones")
print("shape     floor %   pairs   false FASTER/SLOWER")
total = false = 0
for shape, vs in sorted(rows.items()):
    f = sum(v != "SAME" for v in vs)
    total += len(vs); false += f
    print(f"{shape:<9} {entry['shapes'][shape]['floor_pct']:7.2f} {len(vs):7d}   {f} ({100 * f / len(vs):.1f}%)")
print(f"all       {'':7} {total:7d}   {false} ({100 * false / max(total, 1):.1f}%)")
PY
