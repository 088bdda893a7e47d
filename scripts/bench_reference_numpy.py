#!/usr/bin/env python3
"""Times softmax(scale * Q K^T) V in numpy float64, the math of sdpa-runner's CPU reference.

Used by `sdpa-runner bench` to put our reference beside numpy's on the same machine:

    python3 scripts/bench_reference_numpy.py --shape mission=1x8x512x64 --repeats 5 [--json]

Exits 3 with a message on stderr when numpy is not installed.
"""
import argparse
import json
import sys
import time


def attention(np, q, k, v, scale):
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return np.matmul(s, v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", required=True, help="NAME=BxHxSxD (repeatable)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="print {name: median_ms} as JSON")
    args = ap.parse_args()
    try:
        import numpy as np
    except ImportError:
        print("numpy is not installed (pip install numpy)", file=sys.stderr)
        sys.exit(3)

    rng = np.random.default_rng(0)
    results = {}
    for spec in args.shape:
        name, dims = spec.split("=")
        b, h, s, d = (int(x) for x in dims.lower().split("x"))
        q, k, v = (rng.standard_normal((b, h, s, d)) for _ in range(3))
        scale = 1.0 / d ** 0.5
        attention(np, q, k, v, scale)  # warm-up
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            attention(np, q, k, v, scale)
            times.append((time.perf_counter() - t) * 1e3)
        times.sort()
        results[name] = times[len(times) // 2]
    if args.json:
        print(json.dumps(results))
    else:
        for name, ms in results.items():
            print(f"{name}: {ms:.1f} ms")


if __name__ == "__main__":
    main()
