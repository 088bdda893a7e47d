#!/usr/bin/env bash
# The (S_q, S_k) pairs of FlashAttention's Hopper tests (hopper/test_flash_attn.py's
# test_flash_attn_output, whose FP8 runs use the same list), at D 64 and 128, causal and not,
# with MHA, GQA (H_kv = 3 of 6 heads) and MQA (H_kv = 1) in turn, checked (not timed) by the
# runner: every problem must PASS. FlashAttention skips causal problems with S_k < S_q; the
# runner checks them too (their first S_q - S_k rows see no key and must be exactly zero).
#   scripts/fa_pairs.sh [RESULTS_DIR] [extra runner arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
runner=${SDPA_RUNNER_BIN:-target/release/sdpa-runner}
results=${1:-results}
shift || true
pairs="1:1 64:128 128:192 256:256 239:1 799:3 113:203 113:128 128:217 113:211 108:256 256:512
384:256 640:128 512:256 1024:1024 1023:1024 1024:1023 4096:4096 4224:4224"
shapes=()
i=0
for d in 64 128; do
  for causal in "" ":causal"; do
    for pair in $pairs; do
      sq=${pair%:*} sk=${pair#*:}
      hkv=$((i % 3 == 0 ? 6 : (i % 3 == 1 ? 3 : 1)))
      b=$((sk <= 2048 ? 2 : 1))
      shapes+=("${b}x6x${sq}x${d}:sk=${sk}:hkv=${hkv}${causal}")
      i=$((i + 1))
    done
  done
done
list=$(IFS=,; echo "${shapes[*]}")
echo "fa_pairs: ${#shapes[@]} problems"
exec "$runner" --shapes "$list" --seeds 0 --iters 0 --results-dir "$results" "$@"
