#!/usr/bin/env bash
# Proves the performance verdicts on a GPU: REPEATS independent A/A runs (cp1 against itself,
# compiled twice) must be SAME in >= 95% of repeats, and REPEATS runs with a planted slowdown
# of about 3% of the mission kernel's time (SDPA_DELAY_CYCLES) must be SLOWER in >= 95%.
# Then the two-run design: REPEATS/2 pairs of separate processes measuring cp1 on small and
# mission, each pair judged by `compare` (an A/A across processes: should be SAME).
#   scripts/prove_verdicts.sh [REPEATS] [OUT_DIR]      (defaults: 20, ./verdict-proof)
# Uses $SDPA_RUNNER_BIN (default target/release/sdpa-runner). Prints a tally last.
set -u
runner=${SDPA_RUNNER_BIN:-./target/release/sdpa-runner}
repeats=${1:-20}
out=${2:-./verdict-proof}
mkdir -p "$out"
ab=(--shapes mission --seeds 0 --cp-async 1)

# Size the delay: 3% of cp1's mission p50, in SM cycles at the clock measured after timing.
"$runner" "${ab[@]}" --results-dir "$out/size" >"$out/size.log" 2>&1 || { cat "$out/size.log"; exit 1; }
read -r p50 mhz cycles < <(python3 - "$out/size" <<'PY'
import glob, json, sys
perf = json.load(open(glob.glob(sys.argv[1] + "/*/perf.json")[0]))
p50 = perf["measurements"][0]["summary"]["p50"]
mhz = perf["clocks_after"]["sm_mhz"] or 1980
print(f"{p50:.3f} {mhz} {round(0.03 * p50 * mhz)}")
PY
)
echo "mission cp1 p50 ${p50} us at ${mhz} MHz: planted delay ${cycles} cycles (~3%)" | tee "$out/plan.txt"

for i in $(seq "$repeats"); do
  "$runner" "${ab[@]}" --candidate-define SDPA_AA=1 --results-dir "$out/aa" >>"$out/aa.log" 2>&1
  "$runner" "${ab[@]}" --candidate-define "SDPA_DELAY_CYCLES=$cycles" --results-dir "$out/slow" >>"$out/slow.log" 2>&1
done

for i in $(seq $((repeats / 2))); do
  for side in a b; do
    "$runner" --shapes small,mission --seeds 0 --cp-async 1 --results-dir "$out/unpaired/$i$side" >>"$out/unpaired.log" 2>&1
  done
  "$runner" compare "$out"/unpaired/"$i"a/2* "$out"/unpaired/"$i"b/2* --out "$out/unpaired/$i.md" >>"$out/unpaired-compare.log" 2>&1
done

python3 - "$out" "$repeats" <<'PY'
import glob, json, sys
out, n = sys.argv[1], int(sys.argv[2])
for kind, want in (("aa", "SAME"), ("slow", "SLOWER")):
    cmps = [json.load(open(p))["comparisons"][0] for p in sorted(glob.glob(f"{out}/{kind}/*/perf.json"))]
    hits = sum(c["verdict"] == want for c in cmps)
    sp = [c["speedup_pct"] for c in cmps]
    width = [c["speedup_ci_pct"][1] - c["speedup_ci_pct"][0] for c in cmps]
    verdicts = {v: sum(c["verdict"] == v for c in cmps) for v in ("FASTER", "SAME", "SLOWER")}
    print(f"{kind:5} runs={len(cmps)}/{n} {want}={hits} ({100*hits/max(len(cmps),1):.0f}%) verdicts={verdicts} "
          f"speedup% min={min(sp):+.2f} max={max(sp):+.2f} mean={sum(sp)/len(sp):+.2f} CI width% max={max(width):.2f}")
PY

python3 - "$out/unpaired-compare.log" <<'PY'
import re, sys
rows = [re.match(r"\[(\S+)\s*\] \S+ vs \S+: speedup ([-+][\d.]+)% \[([-+][\d.]+)%, ([-+][\d.]+)%\] p=\S+ (\w+)", l) for l in open(sys.argv[1])]
rows = [r.groups() for r in rows if r]
for shape in sorted({r[0] for r in rows}):
    rs = [r for r in rows if r[0] == shape]
    same = sum(r[4] == "SAME" for r in rs)
    sp = [float(r[1]) for r in rs]
    lo, hi = min(float(r[2]) for r in rs), max(float(r[3]) for r in rs)
    print(f"two-run A/A {shape:8} pairs={len(rs)} SAME={same} speedup% min={min(sp):+.2f} max={max(sp):+.2f} CI bounds {lo:+.2f}..{hi:+.2f}")
PY
