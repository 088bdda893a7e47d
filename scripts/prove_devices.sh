#!/usr/bin/env bash
# Issue 13, `--devices`, on a GPU machine: several workers give GPU 0's verdicts, faster.
#   scripts/prove_devices.sh [OUT_DIR] [DEVICES]
# DEVICES is the choice compared with `--devices 0` (default: all; on a machine of one GPU,
# 0,0: two workers on GPU 0, which proves the records but not a second GPU's throughput).
# For `--shapes all --seeds 0-9 --iters 0`, `fuzz` (200 problems, and 1000) and a stress run
# it times each command on GPU 0 alone and on DEVICES and compares the result files with
# every row's GPU taken out; then, with distinct GPUs, one timed main job on DEVICES. Prints
# a table last. One untimed command runs first on each side, so that neither pays the cold
# start of a fresh machine (the first process's driver and file-cache loading).
# Two speed-ups: `whole` is wall over wall of one command, start included (cuInit, the
# contexts and NVRTC: about 0.8 s, the same for one GPU or several, which no GPU count
# shortens); `throughput` is the rate of the work itself: the seconds between the runner's
# own `work begins` and `work done` marks (SDPA_RUNNER_TRACE, src/trace.rs) on GPU 0 over
# the same on DEVICES.
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
  printf '%-8s %-8s %5s %8s %8s %7s %10s  %s\n' command devices exit wall_s work_s whole throughput "rows (GPU taken out)"
} >"$table"

ms() { echo $(($(date +%s%N) / 1000000)); }
work() { awk '/^trace .* work begins$/{b=$2} /^trace .* work done$/{d=$2} END{if (b != "" && d != "") printf "%.3f", d - b; else print "-"}' "$1"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{if (a == "-" || b == "-" || b <= 0) print "-"; else printf "%.2fx", a / b}'; }

# one NAME DEVICES ARGS...: runs, prints "exit wall_ms work_s run_dir" (work_s: - without
# the runner's work marks)
one() {
  local name=$1 dev=$2
  shift 2
  local dir=$out/$name-${dev//,/_} t0 t1 code
  rm -rf "$dir" # a reused OUT_DIR must not offer an old run's files
  t0=$(ms)
  SDPA_RUNNER_TRACE=1 "$runner" "$@" --devices "$dev" --results-dir "$dir" >"$dir.log" 2>&1
  code=$?
  t1=$(ms)
  echo "$code $((t1 - t0)) $(work "$dir.log") $(ls -d "$dir"/*/ 2>/dev/null | head -1)"
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

row() { # row NAME DEVICES EXIT WALL_MS WORK_S WHOLE THROUGHPUT NOTE
  printf '%-8s %-8s %5s %8.2f %8s %7s %10s  %s\n' "$1" "$2" "$3" "$(awk "BEGIN{print $4/1000}")" \
    "$5" "$6" "$7" "$8" >>"$table"
}

compare() { # compare NAME FILE KEY ARGS...
  local name=$1 file=$2 key=$3
  shift 3
  read -r code0 wall0 work0 dir0 <<<"$(one "$name" 0 "$@")"
  read -r code1 wall1 work1 dir1 <<<"$(one "$name" "$devices" "$@")"
  local rows="no run directory" throughput
  [ -n "$dir0" ] && [ -n "$dir1" ] && rows=$(same "$file" "$key" "$dir0" "$dir1")
  throughput=$(ratio "$work0" "$work1")
  [ "$code0$code1" = 00 ] || throughput="- (exit)"
  row "$name" 0 "$code0" "$wall0" "$work0" "" "" ""
  row "$name" "$devices" "$code1" "$wall1" "$work1" "$(ratio "$wall0" "$wall1")" "$throughput" "$rows"
}

one warmup 0 --shapes small --seeds 0 --iters 0 >/dev/null
one warmup "$devices" --shapes small --seeds 0 --iters 0 >/dev/null
compare run correctness.json results --shapes all --seeds 0-9 --iters 0
compare fuzz fuzz.json problems fuzz
compare fuzz1000 fuzz.json problems fuzz --count 1000
compare stress stress.json results stress --shapes small,mission,partial77,long --seeds 0-3 --repeats 100

if [ "$gpus" -gt 1 ]; then
  read -r code wall work dir <<<"$(one timed "$devices" --shapes small,mission --seeds 0-5)"
  row timed "$devices" "$code" "$wall" "$work" "" "" \
    "$(grep -m1 -E 'FASTER|SLOWER|SAME' "$out/timed-${devices//,/_}.log" | cut -c1-90)"
else
  read -r code wall work dir <<<"$(one refused 0,0 --shapes small --seeds 0)"
  row timed 0,0 "$code" "$wall" "$work" "" "" "(want exit 2: a GPU twice is refused when timed)"
fi
cat "$table"
