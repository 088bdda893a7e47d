#!/usr/bin/env bash
# The grading issue's device checks, on one GPU, with binaries staged by
# scripts/stage_device.sh and the cudnn-frontend wheel carried in .whl/:
#   scripts/prove_grading.sh OUT_DIR [SETS...]   (default: llm outliers)
# Each set is exported (`sdpa-runner export`), run by the peers (scripts/peer_export.py:
# torch SDPA fp16/bf16 backends, cuDNN FP8 through cudnn-frontend), and graded with our kernel
# beside them (`sdpa-runner check ... --ours cuda`): OUT_DIR/<set>/COMPARE.md.
#   llm       `--shapes llm --seeds 0`
#   outliers  FlashAttention-3's outlier distribution at 1x16x4096x128, beside normal inputs
#   rotated   the same two problems with Q, K, V rotated by the Hadamard matrix (`:rotate`)
#   stagnation  near-equal scores and V > 0 at S_k 8192 and 16384 (`dist=flat_positive_v`), where
#             an O summed in FP22 steps over every key comes out short, beside normal inputs
# OUT_DIR/summary.txt holds the key lines, OUT_DIR.tgz everything.
set -u
out=${1:?OUT_DIR}
shift
sets=${*:-llm outliers}
mkdir -p "$out"
out=$(cd "$out" && pwd)
runner=${SDPA_RUNNER_BIN:-$PWD/.device/sdpa-runner}
summary=$out/summary.txt
: >"$summary"
if ls .whl/nvidia_cudnn_frontend-*.whl >/dev/null 2>&1; then
  python3 -m pip install --quiet --no-deps --no-index --target "$out/pylib" .whl/nvidia_cudnn_frontend-*.whl \
    >"$out/pip.log" 2>&1 || echo "cudnn-frontend did not install: see pip.log" >>"$summary"
  export PYTHONPATH="$out/pylib${PYTHONPATH:+:$PYTHONPATH}"
fi
step() { # step NAME COMMAND...: runs COMMAND, logs to NAME.log, records exit code and seconds
  local name=$1 t0 rc
  shift
  t0=$(date +%s%N)
  "$@" >"$out/$name.log" 2>&1
  rc=$?
  printf '%-22s exit %-3s %7.2fs\n' "$name" "$rc" "$(((($(date +%s%N) - t0) / 10000000)))e-2" | tee -a "$summary"
  grep -E '^check:|not run|FAIL|Error|error' "$out/$name.log" | sort | uniq -c | sort -rn | head -12 |
    sed 's/^/    /' | cut -c1-170 >>"$summary"
}
peers=${PEERS:-torch-flash-fp16,torch-flash-bf16,torch-cudnn-fp16,torch-cudnn-bf16,cudnn-fp8}

grade() { # grade SET SHAPES
  local set=$1 shapes=$2
  step "${set}_export" "$runner" export --shapes "$shapes" --seeds 0 --force "$out/$set/problems"
  step "${set}_peers" python3 scripts/peer_export.py "$out/$set/problems" "$out/$set/peers" --peers "$peers" \
    --warmup 5 --iters 30
  local outs=()
  for d in "$out/$set/peers"/*/; do outs+=(--outputs "$d"); done
  step "${set}_check" "$runner" check "$out/$set/problems" "${outs[@]}" --ours cuda --results-dir "$out/$set/results"
  cp "$out/$set"/results/*/COMPARE.md "$out/$set/COMPARE.md" 2>/dev/null
  rm -rf "$out/$set/problems" "$out/$set/peers"/*/*.npy # gigabytes of inputs and outputs
}

for set in $sets; do
  case $set in
    llm) grade llm llm ;;
    outliers) grade outliers 1x16x4096x128:dist=fa3_outliers,1x16x4096x128 ;;
    stagnation) grade stagnation 1x4x512x128:sk=16384:dist=flat_positive_v,1x4x512x64:sk=8192:dist=flat_positive_v,1x4x512x128:sk=16384 ;;
    rotated) grade rotated 1x16x4096x128:dist=fa3_outliers:rotate,1x16x4096x128:rotate ;;
    *) echo "unknown set $set" >>"$summary" ;;
  esac
done
tar -czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
# The short table: per problem and implementation, verdict, err/bound, RMSE, p50.
python3 - "$out" <<'PY'
import glob, json, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*", "results", "*", "correctness.json"))):
    d = json.load(open(f))
    for p in d["problems"]:
        for g in p["grades"]:
            k, e = g.get("kernel") or {}, g.get("end_to_end") or {}
            p50 = g.get("p50_us")
            print(f"{p['id'][:34]:<34} {g['implementation'][:20]:<20} {'PASS' if g['pass'] else 'FAIL'} "
                  f"k {k.get('max_err_over_bound', float('nan')):.3f} e {e.get('max_err_over_bound', float('nan')):.3f} "
                  f"rmse {e.get('rmse', float('nan')):.2e} p50 {p50 if p50 is None else round(p50, 1)}"
                  + (" NOT-DISCRIMINATING" if g.get("zeros_would_pass") else "")
                  + ("" if g["pass"] else f"  {g['failures'][0][:60]}"))
PY
cat "$summary"
