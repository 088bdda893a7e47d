#!/usr/bin/env bash
# Issue 13, `--devices`, on a GPU machine: several workers give GPU 0's verdicts, faster.
#   scripts/prove_devices.sh [OUT_DIR] [DEVICES]
# DEVICES is the choice compared with `--devices 0` (default: all; on a machine of one GPU,
# 0,0: two workers on GPU 0, which proves the records but not a second GPU's throughput).
# For `--shapes all --seeds 0-9 --iters 0` (and 0-29), `fuzz` (200 problems, and 1000) and a
# stress run it times each command on GPU 0 alone and on DEVICES (wall, from the shell) and
# compares the result files with every row's GPU taken out; then, with distinct GPUs, one
# timed main job on DEVICES. Prints a table last.
# Two speed-ups: `whole` is wall over wall of one command, start included (cuInit, the
# contexts and NVRTC: about a second, the same for one GPU or several, which no GPU count
# shortens); `throughput` is the rate at which the added work of the larger command is done,
# (wall_large - wall_small) on GPU 0 over the same on DEVICES, in which the start cancels.
# Uses $SDPA_RUNNER_BIN (default target/release/sdpa-runner).
set -u
runner=${SDPA_RUNNER_BIN:-./target/release/sdpa-runner}
out=${1:-./devices-proof}
gpus=$(nvidia-smi -L | grep -c '^GPU ')
devices=${2:-$([ "$gpus" -gt 1 ] && echo all || echo 0,0)}
mkdir -p "$out"
table=$out/table.txt
{
  echo "host: $(nproc) cores; GPUs: $gpus ($(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs)); compared: --devices 0 vs --devices $devices"
  printf '%-8s %-8s %5s %9s %8s  %s\n' command devices exit wall_s speedup "rows (GPU taken out)"
} >"$table"

ms() { echo $(($(date +%s%N) / 1000000)); }

# one NAME DEVICES FILE ARGS...: runs, prints "exit wall_ms run_dir"
one() {
  local name=$1 dev=$2
  shift 2
  local dir=$out/$name-${dev//,/_} t0 t1 code
  t0=$(ms)
  "$runner" "$@" --devices "$dev" --results-dir "$dir" >"$dir.log" 2>&1
  code=$?
  t1=$(ms)
  echo "$code $((t1 - t0)) $(ls -d "$dir"/*/ 2>/dev/null | head -1)"
}

# same FILE KEY DIR_A DIR_B: whether the rows of KEY are equal with each row's GPU removed
same() {
  python3 - "$@" <<'EOF'
import json, sys
file, key, a, b = sys.argv[1:5]
def rows(d):
    rows = json.load(open(d + "/" + file))[key]
    gpus = sorted({(r["gpu"]["index"], r["gpu"]["uuid"]) for r in rows})
    for r in rows:
        r.pop("gpu")
    return rows, gpus
(ra, ga), (rb, gb) = rows(a), rows(b)
print(f"{'EQUAL' if ra == rb else 'DIFFERENT'}: {len(ra)} rows; GPUs {[g[0] for g in ga]} vs {[g[0] for g in gb]}")
EOF
}

declare -A walls0 walls1 codes
compare() { # compare NAME FILE KEY ARGS...
  local name=$1 file=$2 key=$3
  shift 3
  read -r code0 wall0 dir0 <<<"$(one "$name" 0 "$@")"
  read -r code1 wall1 dir1 <<<"$(one "$name" "$devices" "$@")"
  walls0[$name]=$wall0
  walls1[$name]=$wall1
  codes[$name]="$code0$code1"
  local rows="no run directory"
  [ -n "$dir0" ] && [ -n "$dir1" ] && rows=$(same "$file" "$key" "$dir0" "$dir1")
  printf '%-8s %-8s %5s %9.2f %8s\n' "$name" 0 "$code0" "$(awk "BEGIN{print $wall0/1000}")" "" >>"$table"
  printf '%-8s %-8s %5s %9.2f %7.2fx  %s\n' "$name" "$devices" "$code1" \
    "$(awk "BEGIN{print $wall1/1000}")" "$(awk "BEGIN{print $wall0/$wall1}")" "$rows" >>"$table"
}

throughput() { # throughput SMALL LARGE: the rate of the added work, GPU 0 vs DEVICES
  local added0=$((walls0[$2] - walls0[$1])) added1=$((walls1[$2] - walls1[$1]))
  if [ "${codes[$1]}${codes[$2]}" != 0000 ] || [ "$added0" -le 0 ] || [ "$added1" -le 0 ]; then
    printf '%-8s %-8s %5s %9s %8s  %s\n' "$2" "$devices" "" "" n/a \
      "throughput: not measured (a run failed, or the larger run was not slower)" >>"$table"
    return
  fi
  printf '%-8s %-8s %5s %9s %7.2fx  %s\n' "$2" "$devices" "" "" \
    "$(awk "BEGIN{print $added0 / $added1}")" \
    "throughput: the work $2 adds to $1 (start cancels)" >>"$table"
}

compare run correctness.json results --shapes all --seeds 0-9 --iters 0
compare run30 correctness.json results --shapes all --seeds 0-29 --iters 0
throughput run run30
compare fuzz fuzz.json problems fuzz
compare fuzz1000 fuzz.json problems fuzz --count 1000
throughput fuzz fuzz1000
compare stress stress.json results stress --shapes small,mission,partial77,long --seeds 0-3 --repeats 100

if [ "$gpus" -gt 1 ]; then
  read -r code wall dir <<<"$(one timed "$devices" --shapes small,mission --seeds 0-5)"
  printf '%-8s %-8s %5s %9.2f %8s  %s\n' timed "$devices" "$code" "$(awk "BEGIN{print $wall/1000}")" "" \
    "$(grep -m1 -E 'FASTER|SLOWER|SAME' "$out/timed-${devices//,/_}.log" | cut -c1-90)" >>"$table"
else
  read -r code wall dir <<<"$(one refused 0,0 --shapes small --seeds 0)"
  printf '%-8s %-8s %5s %9s %8s  %s\n' timed 0,0 "$code" - "" "(want exit 2: a GPU twice is refused when timed)" >>"$table"
fi
cat "$table"
