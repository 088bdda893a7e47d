#!/usr/bin/env python3
"""An independent NumPy attention over an exported folder (`sdpa-runner export`), written as
an implementation's outputs for `sdpa-runner check`.

    python3 scripts/peer_numpy.py DIR OUT [--precision fp32|fp16|fp8] [--scale-row ID:B:H:S:F]

It shares no code with sdpa-runner: it reads the manifest and the .npy files, decodes e4m3
by the OCP formula, and computes softmax(scale * Q K^T + bottom-right causal mask) V in
float64 per (b, h), GQA by h // (Hq // Hkv); a row that sees no key is zeros. The output is
written as float32 (fp32, fp8) or float16 (fp16), with OUT/implementation.json saying what
it read. `--scale-row` multiplies one output row by F (a planted error, to see check fail).
"""

import argparse
import json
import os
import sys
import time

import numpy as np


def e4m3_decode(codes):
    """OCP e4m3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; 0x7F/0xFF NaN."""
    c = codes.astype(np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    exp = (c >> 3) & 0xF
    man = c & 0x7
    normal = (1.0 + man / 8.0) * np.power(2.0, exp - 7)
    sub = (man / 8.0) * 2.0 ** -6
    val = np.where(exp == 0, sub, normal) * sign
    return np.where((c & 0x7F) == 0x7F, np.nan, val)


def load(dir_, problem, name):
    return np.load(os.path.join(dir_, problem["files"][name]))


def operands(dir_, p, precision):
    if precision == "fp8":
        out = []
        for t in ("q", "k", "v"):
            codes = load(dir_, p, f"{t}_fp8")
            scale = load(dir_, p, f"{t}_scale").astype(np.float64)
            out.append(e4m3_decode(codes) * scale[:, :, None, None])
        return out
    cast = {"fp32": np.float32, "fp16": np.float16}[precision]
    return [load(dir_, p, t).astype(cast).astype(np.float64) for t in ("q", "k", "v")]


def attention(p, q, k, v):
    b_, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    group = hq // hkv
    out = np.zeros((b_, hq, sq, d))
    visible = np.arange(sk)[None, :] <= (np.arange(sq)[:, None] + sk - sq)
    for b in range(b_):
        for h in range(hq):
            s = (q[b, h] @ k[b, h // group].T) * float(p["softmax_scale"])
            if p["causal"]:
                s = np.where(visible, s, -np.inf)
            seen = np.isfinite(s).any(axis=1)
            m = np.where(seen, s.max(axis=1, initial=-np.inf), 0.0)
            w = np.exp(s - m[:, None])
            l = w.sum(axis=1)
            o = (w @ v[b, h // group]) / np.where(seen, l, 1.0)[:, None]
            out[b, h] = np.where(seen[:, None], o, 0.0)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("out")
    ap.add_argument("--precision", choices=["fp32", "fp16", "fp8"], default="fp32")
    ap.add_argument("--scale-row", action="append", default=[], metavar="ID:B:H:S:F")
    args = ap.parse_args()
    with open(os.path.join(args.dir, "manifest.json")) as f:
        manifest = json.load(f)
    os.makedirs(args.out, exist_ok=True)
    planted = {}
    for spec in args.scale_row:
        pid, b, h, s, f = spec.rsplit(":", 4)
        planted.setdefault(pid, []).append((int(b), int(h), int(s), float(f)))
    facts = {}
    for p in manifest["problems"]:
        q, k, v = operands(args.dir, p, args.precision)
        t0 = time.perf_counter()
        o = attention(p, q, k, v)
        elapsed = (time.perf_counter() - t0) * 1e6
        for b, h, s, f in planted.get(p["id"], []):
            o[b, h, s] *= f
        dtype = np.float16 if args.precision == "fp16" else np.float32
        np.save(os.path.join(args.out, p["id"] + ".npy"), o.astype(dtype))
        facts[p["id"]] = {"p50_us": elapsed}
        print(f"{p['id']}: {elapsed / 1e3:.1f} ms", file=sys.stderr)
    with open(os.path.join(args.out, "implementation.json"), "w") as f:
        json.dump(
            {
                "name": f"numpy-{args.precision}",
                "precision": args.precision,
                "problems": facts,
                "about": {"numpy": np.__version__, "planted": args.scale_row},
            },
            f,
            indent=2,
        )


if __name__ == "__main__":
    main()
