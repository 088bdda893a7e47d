#!/usr/bin/env bash
# FlashAttention-4 for the device, which has no network: downloads flash-attn-4 and its CuTe DSL
# stack for Python 3.12 here, unpacks the wheels into one tree, compresses it (xz) and splits it
# in two halves under .fa4a/ and .fa4b/ (git-ignored): the tree is 298 MB, 78 MB as xz, over the
# 64 MiB a device call carries. Carry .fa4a in one call and .fa4b in the next on the same warm
# machine (ignored paths stay between calls), then there:
#   scripts/stage_fa4.sh --install DIR     (joins, checks the sha256, unpacks; PYTHONPATH=DIR)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--install" ]; then
  dir=${2:?--install DIR}
  mkdir -p "$dir"
  cat .fa4a/part_* .fa4b/part_* >"$dir.tar.xz"
  echo "$(cut -d' ' -f1 .fa4b/sha256)  $dir.tar.xz" | sha256sum -c -
  tar -C "$dir" -xJf "$dir.tar.xz" && rm "$dir.tar.xz"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pip download --quiet --no-deps --python-version 3.12 --only-binary=:all: -d "$tmp/w" \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
  nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 "cuda-bindings==13.*" \
  cuda-pathfinder "protobuf<7" einops "apache-tvm-ffi<0.2,>=0.1.11" torch-c-dlpack-ext quack-kernels
mkdir -p "$tmp/site"
for w in "$tmp"/w/*.whl; do unzip -q -o "$w" -d "$tmp/site"; done
tar -C "$tmp/site" -cf - . | xz -T0 -6 >"$tmp/fa4-site.tar.xz"
rm -rf .fa4a .fa4b && mkdir -p .fa4a .fa4b
(cd "$tmp" && split -b 40M fa4-site.tar.xz part_ && sha256sum fa4-site.tar.xz) >.fa4b/sha256
mv "$tmp/part_aa" .fa4a/ && mv "$tmp"/part_a[b-z] .fa4b/
du -sh .fa4a .fa4b
