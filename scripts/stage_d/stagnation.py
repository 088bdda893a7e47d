"""Does an FP8 attention keep O out of the tensor cores' FP22 accumulator across many keys?

Hopper's FP8 tensor cores align each 32-deep step's products and the accumulator to the largest
magnitude among them and keep 13 fraction bits (docs/DESIGN.md "FP22, measured"). An O summed
over every key in the accumulator loses each product below 2^-13 of it; on near-equal scores
with V > 0 the losses add up, and past 2^13 keys a product is lost whole, so the output comes
out short by a share that grows with S_k. A kernel that promotes O to f32 every tile (Stage D's
per-tile Ô, DeepSeek-V3's every 128 elements) stays within its FP8 roundings.

Runs cuDNN's FP8 SDPA (cudnn-frontend, carried wheel) and cuDNN fp16 (torch) on such inputs
and on signed V, and prints, per S_k, each one's lean against an f64 reference of the same
decoded codes: mean((out - ref) · sign(ref)) / mean|ref|, negative where the output shrinks
toward zero. cuDNN's FP8 output is e4m3 (3 mantissa bits: steps of 1/16 to 1/8 of a value), so
each column of V gets its own offset (V > 0: |x| + c, c from 1/2 to 4 across the columns) and
O · SCALE_O spans three binades, where the rounding of near-equal outputs would otherwise all
fall the same way; `e4m3(ref)` is the lean the output's rounding alone gives the reference.
Run by scripts/stage_d/probe.sh stagnation.
"""
import sys, os, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from peer_export import CudnnFp8

B, H, SQ = 1, 4, 128
SCALE_O = 64.0


def inputs(sk, d, positive, gen):
    q = torch.randn(B, H, SQ, d, generator=gen, device="cuda")
    k = torch.randn(B, H, sk, d, generator=gen, device="cuda")
    v = torch.randn(B, H, sk, d, generator=gen, device="cuda")
    if positive:
        v = v.abs() + torch.linspace(0.5, 4.0, d, device="cuda")
    return {n: x.to(torch.float8_e4m3fn) for n, x in (("q", q), ("k", k), ("v", v))}


def reference(codes, descale_q, scale):
    q, k, v = (codes[n].to(torch.float64) for n in "qkv")
    s = (q @ k.transpose(-1, -2)) * (descale_q * scale)
    return torch.softmax(s, dim=-1) @ v


def lean(out, ref):
    """mean((out - ref) sign(ref)) / mean|ref|: negative where out shrinks toward zero."""
    return float(((out.double() - ref) * ref.sign()).mean() / ref.abs().mean())


def main():
    cud = CudnnFp8()
    gen = torch.Generator(device="cuda").manual_seed(7)
    print(f"B={B} H={H} S_q={SQ}; lean = mean((out - ref) sign(ref)) / mean|ref|; q descaled by 1e-3 "
          f"(near-equal scores); e4m3(ref): the output's rounding alone")
    for d in (64, 128):
        for sk in (512, 2048, 4096, 8192, 16384, 32768):
            row = [f"d={d:3d} s_k={sk:5d}"]
            for positive in (True, False):
                codes = inputs(sk, d, positive, gen)
                scale = d ** -0.5
                descale_q = 1e-3
                ref = reference(codes, descale_q, scale)
                out = torch.empty(B, H, SQ, d, dtype=torch.float8_e4m3fn, device="cuda")
                scales = {"descale_q": descale_q, "descale_k": 1.0, "descale_v": 1.0,
                          "descale_s": 1 / 448.0, "scale_s": 448.0, "scale_o": SCALE_O}
                tag = "V>0" if positive else "V+-"
                rounded = (ref * SCALE_O).float().to(torch.float8_e4m3fn).double() / SCALE_O
                row.append(f"{tag} e4m3(ref) {lean(rounded, ref):+.4f}")
                try:
                    cud.run((B, H, H, SQ, sk, d, False, scale), codes, scales, out)()
                    torch.cuda.synchronize()
                    got = out.to(torch.float64) / SCALE_O
                    row.append(f"cudnn-fp8 {lean(got, ref):+.4f}")
                except Exception as e:  # noqa: BLE001 — report and go on
                    row.append(f"cudnn-fp8 n/a ({str(e).splitlines()[0][:60]})")
                q16, k16, v16 = (codes[n].to(torch.float16) for n in "qkv")
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    o16 = F.scaled_dot_product_attention(q16, k16, v16, scale=scale * descale_q)
                row.append(f"cudnn-fp16 {lean(o16, ref):+.4f}")
            print("  ".join(row), flush=True)


if __name__ == "__main__":
    main()
