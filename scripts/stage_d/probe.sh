#!/usr/bin/env bash
# The Stage-D kernel on its own, on a GPU machine with nvcc (sm_90a), from the repository root:
#   scripts/stage_d/probe.sh check|perf|san|peers...
#     check  correctness problems (D 64/128, causal, GQA/MQA, S_q != S_k, partial tiles)
#     perf   issue 27's benchmark shapes: sampled check + TFLOP/s
#     san    memcheck, racecheck, synccheck on the first two problems
#     geom   D 64 problems at each query tile the entry runs: bits against the widest, times
#     timeline  (a build with STAGE_D_DEFINES=-DDIAG_TIMELINE=X) where CTA (X, 0) spends each tile
#     peers  cuDNN FP8 (carry .whl/nvidia_cudnn_frontend-*.whl), cuDNN fp16, flash fp16
# Extra nvcc defines in STAGE_D_DEFINES (e.g. "-DKV_STAGES=3"). Logs go to $OUT (or /tmp/stage_d).
set -u
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/stage_d}
BIN=/tmp/stage_d_probe
mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -lineinfo -Xptxas -v ${STAGE_D_DEFINES:-} \
  -o "$BIN" probe.cu -lcuda > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
grep -E "Used|spill" "$OUT/build.log" | sort | uniq -c
rc=0
for m in "$@"; do
  case $m in
    san) for t in memcheck racecheck synccheck; do
           timeout 200 compute-sanitizer --tool "$t" --error-exitcode 9 "$BIN" quick > "$OUT/san_$t.log" 2>&1
           r=$?; [ $r = 0 ] || rc=1
           echo "sanitizer $t: rc=$r, $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_$t.log")"
         done ;;
    peers) mkdir -p /tmp/cudnn
           python3 -m pip install -q --no-deps --no-index --target /tmp/cudnn ../../.whl/nvidia_cudnn_frontend-*.whl > "$OUT/pip.log" 2>&1
           PYTHONPATH=/tmp/cudnn timeout 300 python3 peers.py 2>&1 | tee "$OUT/peers.log" ;;
    *) timeout 300 "$BIN" "$m" > "$OUT/run_$m.log" 2>&1; r=$?; [ $r = 0 ] || rc=1
       echo "$m: rc=$r"; cat "$OUT/run_$m.log" ;;
  esac
done
exit $rc
