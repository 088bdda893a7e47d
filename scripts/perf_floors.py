#!/usr/bin/env python3
"""perf_floors.py — the speed floors of docs/PERF.md, measured on this GPU.

For each shape: the compute floor (attention FLOPs over the measured fp16 tensor-core rate),
the memory floor (bytes that must move over the measured DRAM bandwidth) and the launch
floor (a near-empty kernel timed with the runner's rules). No kernel can beat the largest.

  python3 scripts/perf_floors.py [--shapes mission,long,large] [--json FILE]

FLOPs = 4·D per unmasked (query, key) pair (Q·Kᵀ and P·V, 2 per multiply-add; B·H·S_q·S_k
without a mask); bytes = B·H·S_q·D (FP8 Q) + 2·B·H_kv·S_k·D (FP8 K and V, read once) +
2·B·H·S_q·D (f16 O written). Shapes are the runner's: names, sets or inline
BxHxSxD[:sk=N][:hkv=N][:causal] (scripts/peer_torch_sdpa.py reads them the same way). The tensor rate is cuBLAS's fp16 GEMM (8192³, wgmma on
Hopper), an upper bound for a kernel on mma.sync; the bandwidth is a device-to-device copy.
"""

import argparse
import json
import os
import statistics

import torch

from peer_torch_sdpa import load_shapes, unmasked_pairs


def timed_ms(fn, reps):
    """Median of `reps` event-timed calls after 3 warm-ups."""
    for _ in range(3):
        fn()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def launch_floor_us(clock_mhz, samples=500):
    """p50 of an (almost) empty kernel, each sample enqueued behind a hold kernel."""
    xs = []
    for _ in range(samples // 25):
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(25)]
        torch.cuda._sleep(int(2000 * clock_mhz))  # 2 ms: Python enqueues 25 samples well within it
        for a, b in ev:
            a.record()
            torch.cuda._sleep(0)
            b.record()
        torch.cuda.synchronize()
        xs += [a.elapsed_time(b) * 1e3 for a, b in ev]
    return statistics.median(xs)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="mission,long,large")
    ap.add_argument("--shapes-file", default=os.path.join(root, "shapes/default.json"))
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    clock_mhz = getattr(props, "clock_rate", 0) // 1000 or 1980

    n = 8192
    x = torch.randn(n, n, device="cuda", dtype=torch.half)
    y = torch.randn(n, n, device="cuda", dtype=torch.half)
    tflops = 2 * n**3 / (timed_ms(lambda: x @ y, 20) * 1e-3) / 1e12
    del x, y
    big = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(big)
    gbps = 2 * big.numel() / (timed_ms(lambda: dst.copy_(big), 10) * 1e-3) / 1e9
    del big, dst
    launch_us = launch_floor_us(clock_mhz)

    rows = []
    print(f"GPU {props.name}: fp16 tensor rate {tflops:.0f} TFLOP/s (cuBLAS 8192^3), "
          f"DRAM {gbps:.0f} GB/s (d2d copy), launch floor {launch_us:.2f} us (p50, empty kernel)")
    print("| shape | GFLOP | MB moved | compute floor µs | memory floor µs | launch floor µs | floor µs |")
    print("|---|---|---|---|---|---|---|")
    for s in load_shapes(a.shapes_file, a.shapes):
        name = s["name"]
        B, H, S, D = s["B"], s["H"], s["S"], s["D"]
        Hkv, Sk = s.get("Hkv", H), s.get("Sk", S)
        flops = 4 * D * unmasked_pairs(B, H, S, Sk, s.get("causal", False))
        bytes_ = B * H * S * D + 2 * B * Hkv * Sk * D + 2 * B * H * S * D
        fc, fm = flops / (tflops * 1e12) * 1e6, bytes_ / (gbps * 1e9) * 1e6
        floor = max(fc, fm, launch_us)
        rows.append({"shape": name, "gflop": flops / 1e9, "mbytes": bytes_ / 1e6, "compute_floor_us": fc,
                     "memory_floor_us": fm, "launch_floor_us": launch_us, "floor_us": floor})
        print(f"| {name} | {flops/1e9:.2f} | {bytes_/1e6:.2f} | "
              f"{fc:.2f} | {fm:.2f} | {launch_us:.2f} | {floor:.2f} |")
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump({"device": props.name, "tensor_tflops": tflops, "dram_gbps": gbps,
                       "launch_floor_us": launch_us, "shapes": rows}, f, indent=1)


if __name__ == "__main__":
    main()
