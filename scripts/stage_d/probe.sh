#!/usr/bin/env bash
# The Stage-D kernel on its own, on a GPU machine with nvcc (sm_90a), from the repository root:
#   scripts/stage_d/probe.sh check|perf|san|peers...
#     check  correctness problems (D 64/128, causal, GQA/MQA, S_q != S_k, partial tiles)
#     perf   issue 27's benchmark shapes: sampled check + TFLOP/s
#     san    memcheck, racecheck, synccheck on the first two problems
#     geom   D 64 and D 128 problems at each query tile the entry runs: bits against the widest, times
#     mixed  unmasked problems at each grid of a mixed launch (MIXED_SPAN tiles past the unmixed): bits, times
#     timeline  (a build with STAGE_D_DEFINES=-DDIAG_TIMELINE=X) where CTA (X, 0) spends each tile
#     spans  (a build with STAGE_D_DEFINES=-DDIAG_SPANS) where each launch's SM time goes: CTA
#            starts, tiles, ends, gaps between CTAs on an SM, idle SMs, at S_k and 2 S_k
#     peers  cuDNN FP8 (carry .whl/nvidia_cudnn_frontend-*.whl), cuDNN fp16, flash fp16
#     stagnation  cuDNN FP8 and fp16 on near-equal scores with V > 0 and signed V, per S_k: whether
#            O stagnates in the FP8 tensor cores' FP22 accumulator (stagnation.py)
#     profile  Nsight Compute (--set full: clocks locked at base) on one launch of the entry
#            $PROFILE_ENTRY (default sdpa_fp8_stage_d_wgmma_d128) in `perf`'s first problem of
#            its head dim; saves the report and its source and raw pages, and prints where each
#            warp role waits (stalls.py)
# Extra nvcc defines in STAGE_D_DEFINES (e.g. "-DKV_STAGES=3"); PROBE_INPUTS=flat_positive_v gives
# check and perf near-equal scores and V > 0. Each problem's line has `bias`, Σ(got − ref) / Σ|ref|
# over the checked elements (on flat_positive_v, where every reference is positive, O's lean toward
# zero when negative). PROBE_SKIP_CHECK=1 skips the reference (a line then says SKIP, not PASS).
# PROBE_PROBLEMS="B,H,Hkv,Sq,Sk,D,causal;..." replaces a mode's problems.
# Logs go to $OUT (or /tmp/stage_d).
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
    profile) e=${PROFILE_ENTRY:-sdpa_fp8_stage_d_wgmma_d128}
           # The entry's second launch: the first warm-up after its checked launch.
           timeout 300 ncu --set full --import-source no -k "regex:^$e\$" --launch-skip 1 --launch-count 1 \
             -f -o "$OUT/profile_$e" "$BIN" perf > "$OUT/profile_$e.log" 2>&1
           r=$?; [ $r = 0 ] || { rc=1; tail -5 "$OUT/profile_$e.log"; }
           ncu -i "$OUT/profile_$e.ncu-rep" --page source --csv --print-source sass > "$OUT/profile_$e.source.csv"
           ncu -i "$OUT/profile_$e.ncu-rep" --page raw --csv > "$OUT/profile_$e.raw.csv"
           echo "profile $e: rc=$r"
           python3 stalls.py "$OUT/profile_$e.source.csv" "$OUT/profile_$e.raw.csv" ;;
    stagnation|peers) # cudnn-frontend from the carried wheel, then the script of the mode's name
           mkdir -p /tmp/cudnn
           python3 -m pip install -q --no-deps --no-index --target /tmp/cudnn ../../.whl/nvidia_cudnn_frontend-*.whl > "$OUT/pip.log" 2>&1
           PYTHONPATH=/tmp/cudnn timeout 300 python3 "$m.py" 2>&1 | tee "$OUT/$m.log" ;;
    *) timeout 300 "$BIN" "$m" > "$OUT/run_$m.log" 2>&1; r=$?; [ $r = 0 ] || rc=1
       echo "$m: rc=$r"; cat "$OUT/run_$m.log" ;;
  esac
done
exit $rc
