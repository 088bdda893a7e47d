#!/usr/bin/env bash
# The configurations issue's device checks, on one GPU, with binaries staged by
# scripts/stage_device.sh:
#   scripts/prove_configs.sh OUT_DIR [check|perf|tests ...]   (default: check perf tests);
#   OUT_DIR.tgz holds every log and result directory, OUT_DIR/summary.txt the key lines
# check  the main job (twice, wall time), `--shapes llm --seeds 0,1`, FlashAttention's
#        (S_q, S_k) pairs (scripts/fa_pairs.sh), `fuzz --count 1000`, `selftest`, and
#        `stress` on the self-test's configuration shapes
# perf   ours against torch's flash and cuDNN fp16 (scripts/peer_torch_sdpa.py) on D 128 and
#        causal problems, the decode problem and mission, in one session
# tests  every GPU test executable with --include-ignored
# Full logs stay in OUT_DIR; a short table is printed last.
set -u
out=${1:?OUT_DIR}
shift
sections=${*:-check perf tests}
mkdir -p "$out"
runner=${SDPA_RUNNER_BIN:-$PWD/.device/sdpa-runner}
export SDPA_RUNNER_BIN=$runner
summary=$out/summary.txt
: >"$summary"
step() { # step NAME COMMAND...: runs COMMAND, logs to NAME.log, records exit code, seconds, key lines
  local name=$1 t0 rc
  shift
  t0=$(date +%s%N)
  "$@" >"$out/$name.log" 2>&1
  rc=$?
  printf '%-22s exit %-3s %7.2fs\n' "$name" "$rc" "$(((($(date +%s%N) - t0) / 10000000)))e-2" >>"$summary"
  grep -E '^[0-9]+/[0-9]+ PASS|GATE FAILED|speedup|^fuzz:|^stress|caught|test result|^MUTANT|^clean' "$out/$name.log" |
    grep -v '^\[' | sed 's/^/    /' | cut -c1-150 >>"$summary"
}

check() {
  step main_1 "$runner" --shapes small,mission --seeds 0,1,2 --results-dir "$out/main"
  step main_2 "$runner" --shapes small,mission --seeds 0,1,2 --results-dir "$out/main"
  step llm "$runner" --shapes llm --seeds 0,1 --results-dir "$out/llm"
  step fa_pairs scripts/fa_pairs.sh "$out/fa"
  step fuzz_1000 "$runner" fuzz --count 1000 --results-dir "$out/fuzz"
  step selftest "$runner" selftest --results-dir "$out/selftest"
  step stress_cfg "$runner" stress --shapes cfg-chunk,cfg-decode,cfg-tall,mission --seeds 0 --repeats 200 --results-dir "$out/stress"
}

perf() {
  local shapes=mission,1x16x4096x64,1x16x4096x128,1x32x4096x128:hkv=8:causal,16x32x1x128:sk=8192:hkv=8,1x32x512x128:sk=4096:hkv=8:causal
  step ours "$runner" --shapes "$shapes" --seeds 0 --results-dir "$out/perf"
  step peers python3 scripts/peer_torch_sdpa.py --shapes "$shapes" --seeds 0 --backends flash,cudnn --results-dir "$out/perf"
  step floors python3 scripts/perf_floors.py --shapes "$shapes" --json "$out/floors.json"
  # One table: p50 µs and TFLOP/s (unmasked pairs) per implementation, the floor beside it.
  python3 - "$out" >"$out/perf_table.md" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
rows = {}
for f in glob.glob(os.path.join(out, "perf", "*", "perf.json")):
    for m in json.load(open(f))["measurements"]:
        rows.setdefault(m["shape"], {})[m["variant"]] = m["summary"]["p50"]
sys.path.insert(0, "scripts")
from peer_torch_sdpa import load_shapes, unmasked_pairs
floors = {r["shape"]: r["floor_us"] for r in json.load(open(os.path.join(out, "floors.json")))["shapes"]}
names = ["cp0", "cp1", "torch-flash", "torch-cudnn"]
print("| shape | " + " | ".join(f"{n} µs (TFLOP/s)" for n in names) + " | floor µs | best ours / best torch |")
print("|---|" + "---|" * (len(names) + 2))
for shape, v in rows.items():
    s = load_shapes("shapes/default.json", shape)[0]
    flop = 4 * s["D"] * unmasked_pairs(s["B"], s["H"], s["S"], s.get("Sk", s["S"]), s.get("causal", False))
    cell = lambda n: f"{v[n]:.1f} ({flop / v[n] / 1e6:.0f})" if n in v else "-"
    ours = min(v.get("cp0", 1e30), v.get("cp1", 1e30))
    torch_best = min(v.get("torch-flash", 1e30), v.get("torch-cudnn", 1e30))
    print(f"| {shape} | " + " | ".join(cell(n) for n in names) +
          f" | {floors.get(shape, float('nan')):.1f} | {ours / torch_best:.2f} |")
PY
  cat "$out/perf_table.md" >>"$summary"
}

tests() {
  for t in .device/tests/gpu_*; do
    step "$(basename "$t")" "$t" --include-ignored --test-threads 1
  done
}

for s in $sections; do "$s"; done
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" | tee -a "$summary"
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")" 2>/dev/null
cat "$summary"
