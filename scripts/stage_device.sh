#!/usr/bin/env bash
# Builds the runner and its test executables here and copies them into .device/ (git-ignored),
# ready to be carried to a GPU machine that has no Rust toolchain:
#   scripts/stage_device.sh            then run scripts/gpu_session.sh there
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
rm -rf .device && mkdir -p .device/tests
cp target/release/sdpa-runner .device/
cargo test --release --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, sys, shutil, os
for line in sys.stdin:
    m = json.loads(line)
    exe = m.get("executable")
    if m.get("reason") == "compiler-artifact" and exe and m["target"]["kind"] == ["test"]:
        shutil.copy(exe, os.path.join(".device/tests", m["target"]["name"]))
        print("staged", m["target"]["name"])
'
du -sh .device
