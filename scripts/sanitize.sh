#!/usr/bin/env bash
# compute-sanitizer memcheck, racecheck, synccheck and initcheck over the runner on small,
# mission and a partial-tile shape, both variants (correctness-only runs: each launch checked).
# One verdict line per tool; exit 1 on any finding, 2 if a tool did not run cleanly.
#   scripts/sanitize.sh [RUNNER ARGS...]   e.g. scripts/sanitize.sh --define MUTANT_K_READ_PAST_END
# Uses $SDPA_RUNNER_BIN (default target/release/sdpa-runner); logs go to $SANITIZE_LOGS or a
# temporary folder, named in the output; $SANITIZE_SHAPES replaces the shapes (e.g. the
# configuration problems: cfg-chunk,cfg-decode,cfg-tall).
set -u
runner=${SDPA_RUNNER_BIN:-./target/release/sdpa-runner}
logs=${SANITIZE_LOGS:-$(mktemp -d)}
shapes=${SANITIZE_SHAPES:-small,mission,partial77}
mkdir -p "$logs"
status=0
for tool in memcheck racecheck synccheck initcheck; do
  log="$logs/$tool.log"
  # Padding after every allocation: an overrun otherwise goes unseen when it lands in the
  # next allocation (memcheck only flags accesses outside every allocation).
  padding=()
  [ "$tool" = memcheck ] && padding=(--padding 256)
  compute-sanitizer --tool "$tool" "${padding[@]}" --error-exitcode 9 "$runner" --shapes "$shapes" \
    --seeds 0 --iters 0 --results-dir "$logs/runs" "$@" >"$log" 2>&1
  rc=$?
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -n 1 | sed 's/^========= //')
  case $rc in
    0) echo "$tool: CLEAN ($summary)" ;;
    9) echo "$tool: FINDINGS ($summary), see $log"; status=1 ;;
    *) echo "$tool: DID NOT RUN CLEANLY (exit $rc), see $log"; [ "$status" -eq 0 ] && status=2 ;;
  esac
done
exit "$status"
