#!/usr/bin/env bash
# Issue 13 on a GPU: verdict time at long S with sampled rows, every planted kernel bug caught at
# long S under that sample, and the past-2^31 shape.
#   scripts/prove_long_context.sh [OUT_DIR] [timing] [index64]
# Times `--shapes ctx16k|ctx64k --seeds 0 --iters 0` (wall, twice for ctx16k; then once each
# with `--references host`; `timing` stops there), runs every
# MUTANT_* of the self-test on 1x16x16381x64 (sampled rows; a partial last tile of 61 keys)
# down the self-test's ladder: the gates (exit 1, or 4 for a fault), else stress (exit 1),
# else memcheck (exit 9); racecheck stays with `selftest`, on mission (too slow at long S). With `index64` it runs the 130x16x16384x64 shape clean (exit 0) and
# with MUTANT_I32_HEAD_OFFSET (exit 1 or 4). Prints a table last.
# Uses $SDPA_RUNNER_BIN (default target/release/sdpa-runner).
set -u
runner=${SDPA_RUNNER_BIN:-./target/release/sdpa-runner}
out=${1:-./long-context-proof}
mkdir -p "$out"
table=$out/table.txt
: >"$table"
flags=$(grep -m1 -o -w -E 'avx2|fma|avx512f' /proc/cpuinfo | sort -u | tr '\n' ' ')
echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); flags: ${flags:-none of avx2 fma avx512f}" >>"$table"

timed() { # timed NAME EXPECT ARGS...: wall time, exit code, the verdict line
  local name=$1 expect=$2
  shift 2
  local t0 t1 code verdict
  t0=$(date +%s.%N)
  "$runner" "$@" --results-dir "$out/results" >"$out/$name.log" 2>&1
  code=$?
  t1=$(date +%s.%N)
  verdict=$(grep -E 'PASS \(|^[0-9]+/[0-9]+ PASS|FAIL|failed' "$out/$name.log" | tail -1 | cut -c1-110)
  local ok=no
  [[ " $expect " == *" $code "* ]] && ok=yes
  printf '%-34s exit %s (want %s) %s  %6.2f s  %s\n' "$name" "$code" "$expect" "$ok" \
    "$(awk "BEGIN{print $t1 - $t0}")" "$verdict" >>"$table"
}

for s in ctx16k ctx16k ctx64k; do
  timed "time-$s" 0 --shapes "$s" --seeds 0 --iters 0
done
# The same with the references on the host's cores instead of the GPU.
for s in ctx16k ctx64k; do
  timed "time-$s-host-references" 0 --shapes "$s" --seeds 0 --iters 0 --references host
done
grep -h 'checking' "$out"/time-ctx16k.log "$out"/time-ctx64k.log | cut -c1-80 >>"$table"
[[ " $* " == *" timing "* ]] && { cat "$table"; exit 0; }

long=1x16x16381x64
timed clean-$long 0 --shapes "$long" --seeds 0 --iters 0
# The self-test's ladder at long S: the gates, then (if they pass) stress, then memcheck.
for m in MUTANT_SKIP_CP_WAIT:1 MUTANT_WRONG_STAGE:1 MUTANT_NO_DEQUANT_BARRIER:both \
  MUTANT_NO_PARTIAL_MASK:both MUTANT_SKIP_LAST_KV_TILE:both MUTANT_NO_RESCALE:both \
  MUTANT_STORE_ROW_OFF_BY_ONE:both MUTANT_K_SCALE_TWICE:both MUTANT_K_READ_PAST_END:0; do
  name=${m%%:*} cp=${m##*:}
  args=(--shapes "$long" --seeds 0 --cp-async "$cp" --define "$name")
  timed "$name" "0 1 4" "${args[@]}" --iters 0
  if grep -q 'exit 0 ' <(tail -1 "$table"); then
    timed "$name-stress" "0 1 4" stress "${args[@]}" --repeats 20
    if grep -q 'exit 0 ' <(tail -1 "$table"); then
      t0=$(date +%s.%N)
      compute-sanitizer --tool memcheck --error-exitcode 9 "$runner" "${args[@]}" --iters 0 \
        --results-dir "$out/results" >"$out/$name-memcheck.log" 2>&1
      printf '%-34s exit %s (memcheck; 9 = error found)  %6.2f s\n' "$name-memcheck" "$?" \
        "$(awk "BEGIN{print $(date +%s.%N) - $t0}")" >>"$table"
    fi
  fi
done

if [[ " $* " == *" index64 "* ]]; then
  timed index64-clean 0 --shapes index64 --seeds 0 --iters 0
  timed index64-MUTANT_I32_HEAD_OFFSET "1 4" --shapes index64 --seeds 0 --iters 0 --cp-async 0 \
    --define MUTANT_I32_HEAD_OFFSET
fi
cat "$table"
