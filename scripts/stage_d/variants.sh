#!/usr/bin/env bash
# Kernel variants of Stage D side by side, on a GPU machine with nvcc, from the repository root:
#   scripts/stage_d/variants.sh MODE NAME=DEFINES...   e.g.  perf base= pp=-DPINGPONG=1
# Builds scripts/stage_d/probe.cu once per variant (in parallel), then runs MODE (check, perf,
# quick) of each in turn; logs under $OUT (or /tmp/stage_d_variants), a TFLOP/s table last.
set -u
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/stage_d_variants}
if [ $# -lt 2 ]; then echo "usage: variants.sh check|perf|quick NAME=DEFINES..." >&2; exit 2; fi
mode=$1; shift
for spec in "$@"; do
  case $spec in *=*) ;; *) echo "variants.sh: '$spec' is not NAME=DEFINES (NAME= for none)" >&2; exit 2;; esac
done
mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
names=()
for spec in "$@"; do
  name=${spec%%=*}; defs=${spec#*=}; names+=("$name")
  ( nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -lineinfo -Xptxas -v $defs \
      -o "/tmp/probe_$name" probe.cu -lcuda > "$OUT/build_$name.log" 2>&1 \
    || echo "BUILD FAILED $name" ) &
done
wait
for name in "${names[@]}"; do
  echo "== $name: $(grep -E 'registers|spill' "$OUT/build_$name.log" | grep -oE '[0-9]+ registers|[0-9]+ bytes spill stores' | sort -u | tr '\n' ' ')"
  [ -x "/tmp/probe_$name" ] || { tail -20 "$OUT/build_$name.log"; continue; }
  timeout 300 "/tmp/probe_$name" "$mode" > "$OUT/run_${mode}_$name.log" 2>&1
  echo "   rc=$? $(tail -1 "$OUT/run_${mode}_$name.log")"
done
echo "TFLOP/s ($mode)"
printf '%-44s' problem; for name in "${names[@]}"; do printf '%10s' "$name"; done; echo
first=$OUT/run_${mode}_${names[0]}.log
n=$(grep -c ' d=' "$first")
for i in $(seq 1 "$n"); do
  printf '%-44s' "$(grep ' d=' "$first" | sed -n "${i}p" | sed -E 's/^(PASS|FAIL) //; s/:.*//' | cut -c1-44)"
  for name in "${names[@]}"; do
    line=$(grep ' d=' "$OUT/run_${mode}_$name.log" | sed -n "${i}p")
    v=$(echo "$line" | grep -oE '[0-9.]+ TFLOP/s' | cut -d' ' -f1)
    case $line in FAIL*) v="${v}F";; esac
    printf '%10s' "${v:-?}"
  done; echo
done
