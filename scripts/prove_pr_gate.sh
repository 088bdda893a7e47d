#!/usr/bin/env bash
# Proves the PR gate (`run --base-kernel --gate`) on a GPU, in one session:
#   A/A     base = candidate = cuda/sdpa_fp8_stage_c_mma.cu, REPEATS runs: every verdict
#           against the base should be SAME and the exit 0 (at most 1 false verdict allowed);
#   slow    the candidate plants SDPA_DELAY_CYCLES sized so that mission's cp0 measures 3% slower,
#           REPEATS runs: SLOWER and exit 1 every time;
#   mutant  the candidate defines MUTANT_NO_RESCALE: exit 1 naming the failed gate.
#   scripts/prove_pr_gate.sh [REPEATS] [OUT_DIR]      (defaults: 20, ./pr-gate-proof)
# Uses $SDPA_RUNNER_BIN (default target/release/sdpa-runner). Prints a tally last.
set -u
runner=${SDPA_RUNNER_BIN:-./target/release/sdpa-runner}
repeats=${1:-20}
out=${2:-./pr-gate-proof}
kernel=cuda/sdpa_fp8_stage_c_mma.cu
mkdir -p "$out/cand"
gate=(--shapes small,mission --seeds 0,1,2 --base-kernel "$kernel" --gate)

# Size the delay so that mission's cp0 measures 3% slower: first 3% of its p50 in SM cycles,
# then scaled by what that delay measured against the base (a wait at the start of each CTA
# shows up as about its length per wave, less what the launch's stagger hides).
"$runner" --shapes mission --seeds 0 --cp-async 0 --results-dir "$out/size" >"$out/size.log" 2>&1 || {
  cat "$out/size.log"
  exit 1
}
read -r p50 mhz cycles < <(python3 - "$out/size" <<'PY'
import glob, json, statistics, sys
perf = json.load(open(glob.glob(sys.argv[1] + "/*/perf.json")[0]))
m = perf["measurements"][0]
clocks = [c for c in m.get("round_sm_mhz", []) if c]
mhz = statistics.median(clocks) if clocks else (perf["clocks_after"]["sm_mhz"] or 1980)
p50 = m["summary"]["p50"]
print(f"{p50:.3f} {mhz:.0f} {round(0.03 * p50 * mhz)}")
PY
)
{ echo "#define SDPA_DELAY_CYCLES $cycles"; cat "$kernel"; } >"$out/cand/nominal.cu"
"$runner" --kernel "$out/cand/nominal.cu" --shapes mission --seeds 0 --cp-async 0 \
  --base-kernel "$kernel" --results-dir "$out/size" >>"$out/size.log" 2>&1
read -r measured scaled < <(python3 - "$out/size" "$cycles" <<'PY'
import glob, json, sys
for p in glob.glob(sys.argv[1] + "/*/perf.json"):
    for c in json.load(open(p))["comparisons"]:
        if c.get("pair") == "base_kernel":
            slow = -c["speedup_pct"]
            print(f"{slow:.2f} {round(int(sys.argv[2]) * 3.0 / max(slow, 0.5))}")
PY
)
if [ -z "${scaled:-}" ] || [ -z "${cycles:-}" ]; then
  echo "sizing the planted delay failed; see $out/size.log" >&2
  tail -n 20 "$out/size.log" >&2
  exit 1
fi
cycles=$scaled
echo "mission cp0 p50 ${p50} us at ${mhz} MHz; 3% of it measured ${measured}%; planted delay ${cycles} cycles" | tee "$out/plan.txt"
{ echo "#define SDPA_DELAY_CYCLES $cycles"; cat "$kernel"; } >"$out/cand/slow.cu"
{ echo "#define MUTANT_NO_RESCALE 1"; cat "$kernel"; } >"$out/cand/mutant.cu"

for i in $(seq "$repeats"); do
  "$runner" "${gate[@]}" --results-dir "$out/aa" >>"$out/aa.log" 2>&1
  echo $? >>"$out/aa.rc"
  "$runner" --kernel "$out/cand/slow.cu" "${gate[@]}" --results-dir "$out/slow" >>"$out/slow.log" 2>&1
  echo $? >>"$out/slow.rc"
done
"$runner" --kernel "$out/cand/mutant.cu" "${gate[@]}" --results-dir "$out/mutant" >"$out/mutant.log" 2>&1
echo $? >"$out/mutant.rc"

python3 - "$out" "$repeats" <<'PY'
import glob, json, re, sys
out, n = sys.argv[1], int(sys.argv[2])
met = True
for kind, want_exit in (("aa", 0), ("slow", 1)):
    rcs = [int(x) for x in open(f"{out}/{kind}.rc").read().split()]
    runs = [json.load(open(p)) for p in sorted(glob.glob(f"{out}/{kind}/*/perf.json"))]
    base = [[c for c in r["comparisons"] if c.get("pair") == "base_kernel"] for r in runs]
    off = sum(any(c["verdict"] != "SAME" for c in cs) for cs in base)
    for shape in ("small", "mission"):
        cs = [c for cs in base for c in cs if c["shape"] == shape]
        v = {k: sum(c["verdict"] == k for c in cs) for k in ("FASTER", "SAME", "SLOWER")}
        sp = [c["speedup_pct"] for c in cs]
        dropped = sum(c.get("rounds_dropped_for_clock", 0) for c in cs)
        print(f"{kind:4} {shape:8} comparisons={len(cs)} {v} speedup% {min(sp):+.2f}..{max(sp):+.2f} "
              f"rounds dropped for clock={dropped}")
    retries = sum(m.get("hold_retries", 0) for r in runs for m in r["measurements"])
    expired = sum(m.get("hold_expired_blocks", 0) for r in runs for m in r["measurements"])
    clocks = [c for r in runs for m in r["measurements"] for c in m.get("round_sm_mhz", []) if c]
    good = sum(rc == want_exit for rc in rcs)
    met &= good == n if kind == "slow" else (good == n and off <= 1)
    print(f"{kind:4} runs={len(runs)}/{n} exit {want_exit}: {good}/{len(rcs)} "
          f"runs with a verdict other than SAME: {off}; hold retries {retries}, expired kept {expired}; "
          f"block SM clock {min(clocks):.0f}..{max(clocks):.0f} MHz")
rc = open(f"{out}/mutant.rc").read().strip()
failed = [l.strip() for l in open(f"{out}/mutant.log") if "FAIL" in l][:2]
print(f"mutant MUTANT_NO_RESCALE exit {rc}: {failed}")
met &= rc == "1" and any("kernel.max_err_over_bound" in l for l in failed)
print("criteria (A/A exit 0 with at most 1 verdict other than SAME; slow exit 1 every run; mutant exit 1):",
      "MET" if met else "NOT MET")
sys.exit(0 if met else 1)
PY
