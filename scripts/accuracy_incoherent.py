#!/usr/bin/env python3
"""Does incoherent processing (a Hadamard rotation of Q, K, V along D) or per-block scales lower
the FP8 error of per-head e4m3 attention on FlashAttention-3's outlier inputs? A NumPy model:
e4m3 codes (round to nearest, saturating) of Q, K, V, attention in f64, RMSE against f64 on the
originals. Usage: accuracy_incoherent.py S HEADS (docs/ACCURACY.md)."""
import numpy as np, sys
rng = np.random.default_rng(0)
def e4m3(x):
    # round to nearest e4m3 (saturating), via a table of all finite values
    vals = []
    for e in range(16):
        for m in range(8):
            if e == 15 and m == 7: continue
            vals.append((m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    t = np.array(sorted(set(vals)))
    a = np.clip(np.abs(x), 0, 448)
    i = np.clip(np.searchsorted(t, a), 1, len(t) - 1)
    lo, hi = t[i - 1], t[i]
    r = np.where(a - lo <= hi - a, lo, hi)
    return np.sign(x) * r
def quant(x, block=None):
    # per-head (whole slice) or per block of `block` rows
    if block is None:
        s = np.abs(x).max() / 448
        return e4m3(x / s) * s
    out = np.empty_like(x)
    for i in range(0, x.shape[0], block):
        b = x[i:i + block]; s = np.abs(b).max() / 448
        out[i:i + block] = e4m3(b / s) * s
    return out
def hadamard(n):
    h = np.array([[1.0]])
    while h.shape[0] < n: h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)
def attn(q, k, v):
    s = q @ k.T / np.sqrt(q.shape[1]); s -= s.max(1, keepdims=True); w = np.exp(s)
    return (w @ v) / w.sum(1, keepdims=True)
S, D, heads = int(sys.argv[1]), 128, int(sys.argv[2])
H = hadamard(D)
res = {k: [] for k in ["per-head", "per-block-64", "hadamard", "hadamard+block"]}
for h in range(heads):
    q, k, v = (rng.standard_normal((S, D)) + 10 * rng.standard_normal((S, D)) * (rng.random((S, D)) < 1e-3) for _ in range(3))
    ref = attn(q, k, v)
    res["per-head"].append(attn(quant(q), quant(k), quant(v)) - ref)
    res["per-block-64"].append(attn(quant(q, 64), quant(k, 64), quant(v, 64)) - ref)
    qh, kh, vh = q @ H, k @ H, v @ H
    res["hadamard"].append(attn(quant(qh), quant(kh), quant(vh)) @ H.T - ref)
    res["hadamard+block"].append(attn(quant(qh, 64), quant(kh, 64), quant(vh, 64)) @ H.T - ref)
for k, e in res.items():
    e = np.concatenate(e); print(f"{k:<16} rmse {np.sqrt((e ** 2).mean()):.3e}  max {np.abs(e).max():.3e}")
