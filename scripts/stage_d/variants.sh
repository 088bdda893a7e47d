#!/usr/bin/env bash
# Kernel variants of Stage D side by side, on a GPU machine with nvcc, from anywhere:
#   scripts/stage_d/variants.sh MODE NAME=DEFINES...   e.g.  perf base= st0=-DSTAGGER_D128=0
# Builds scripts/stage_d/probe.cu once per variant (in parallel, into $OUT), then runs MODE
# (check, perf, quick) of each in turn; logs under $OUT (or /tmp/stage_d_variants), a TFLOP/s
# table last (quick and check time nothing: their table says PASS or FAIL). Each cell is one
# sequential sample of 20 launches: differences of a few percent are noise. Exit 2 on bad
# arguments, 3 without nvcc or a GPU, 1 when a build failed or (check, quick) a run failed.
set -u
usage="usage: variants.sh check|perf|quick NAME=DEFINES...  (NAME= for no defines)"
[ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
mode=$1; shift
case $mode in check|perf|quick) ;; *) echo "variants.sh: mode '$mode' is not check, perf or quick; $usage" >&2; exit 2;; esac
names=()
for spec in "$@"; do
  case $spec in *=*) ;; *) echo "variants.sh: '$spec' is not NAME=DEFINES; $usage" >&2; exit 2;; esac
  name=${spec%%=*}
  case $name in ''|*/*|*[!A-Za-z0-9_.-]*) echo "variants.sh: variant name '$name' must be letters, digits, _ . -" >&2; exit 2;; esac
  for n in "${names[@]}"; do [ "$n" != "$name" ] || { echo "variants.sh: variant '$name' named twice" >&2; exit 2; }; done
  names+=("$name")
done
command -v nvcc > /dev/null || { echo "variants.sh: no nvcc on this machine" >&2; exit 3; }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null) || { echo "variants.sh: no GPU (nvidia-smi failed)" >&2; exit 3; }
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/stage_d_variants}
mkdir -p "$OUT"
echo "$gpu"
for spec in "$@"; do
  name=${spec%%=*}; defs=${spec#*=}
  rm -f "$OUT/probe_$name"
  # shellcheck disable=SC2086  # the defines are a list of arguments
  ( nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -lineinfo -Xptxas -v $defs \
      -o "$OUT/probe_$name" probe.cu -lcuda > "$OUT/build_$name.log" 2>&1 ) &
done
wait
failed=0
for name in "${names[@]}"; do
  rm -f "$OUT/run_${mode}_$name.log"
  if [ ! -x "$OUT/probe_$name" ]; then
    echo "== $name: BUILD FAILED"; tail -20 "$OUT/build_$name.log"; failed=1; continue
  fi
  echo "== $name: $(grep -oE '[0-9]+ registers|[0-9]+ bytes spill stores' "$OUT/build_$name.log" | sort -u | tr '\n' ' ')"
  timeout 300 "$OUT/probe_$name" "$mode" > "$OUT/run_${mode}_$name.log" 2>&1
  rc=$?
  echo "   rc=$rc $(tail -1 "$OUT/run_${mode}_$name.log")"
  # A failed check fails the script; in perf a variant may be wrong on purpose (F in the table).
  [ "$rc" = 0 ] || [ "$mode" = perf ] || failed=1
done
if [ "$mode" = perf ]; then echo "TFLOP/s (perf)"; else echo "PASS/FAIL ($mode)"; fi
printf '%-44s' problem; for name in "${names[@]}"; do printf '%10s' "$name"; done; echo
first=""
for name in "${names[@]}"; do [ -s "$OUT/run_${mode}_$name.log" ] && { first=$OUT/run_${mode}_$name.log; break; }; done
n=0; [ -n "$first" ] && n=$(grep -c ' d=' "$first")
for i in $(seq 1 "$n"); do
  printf '%-44s' "$(grep ' d=' "$first" | sed -n "${i}p" | sed -E 's/^(PASS|FAIL) //; s/:.*//' | cut -c1-44)"
  for name in "${names[@]}"; do
    line=$(grep ' d=' "$OUT/run_${mode}_$name.log" 2>/dev/null | sed -n "${i}p")
    if [ "$mode" = perf ]; then
      v=$(echo "$line" | grep -oE '[0-9.]+ TFLOP/s' | cut -d' ' -f1)
      case $line in FAIL*) v="${v}F";; esac
    else
      v=$(echo "$line" | cut -d' ' -f1)
    fi
    printf '%10s' "${v:-?}"
  done; echo
done
exit $failed
