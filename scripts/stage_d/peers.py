"""Times cuDNN FP8 SDPA (cudnn-frontend), cuDNN fp16 and FlashAttention-2 fp16 (torch) on
scripts/stage_d/probe.cu's perf shapes, in TFLOP/s over unmasked pairs. Run by probe.sh peers."""
import sys, os, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from peer_export import CudnnFp8

SHAPES = [(1,16,16,4096,4096,64,0),(4,16,16,4096,4096,64,0),(1,16,16,4096,4096,128,0),(4,16,16,4096,4096,128,0),
          (1,16,16,16384,16384,128,0),(4,16,16,8192,8192,128,0),(4,16,16,8192,8192,128,1),(1,32,8,4096,4096,128,1)]
# PEER_SHAPES="B,H,H_kv,S_q,S_k,D,causal;..." replaces the list (probe.cu's fields).
if os.environ.get("PEER_SHAPES"):
    SHAPES = [tuple(int(x) for x in s.split(",")) for s in os.environ["PEER_SHAPES"].split(";") if s]

def time_ms(fn, iters=20):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters): fn()
    z.record(); torch.cuda.synchronize()
    return a.elapsed_time(z) / iters

def pairs(sq, sk, causal):
    return sum(max(0, min(sk, i + sk - sq + 1)) for i in range(sq)) if causal else sq * sk

cud = CudnnFp8()
for (b, h, hkv, sq, sk, d, causal) in SHAPES:
    flops = 4.0 * b * h * d * pairs(sq, sk, causal)
    row = [f"{b}x{h}x{hkv} s={sq} d={d} causal={causal}"]
    codes = {n: (torch.randn(b, h if n == "q" else hkv, sq if n == "q" else sk, d, device="cuda") * 100).to(torch.float8_e4m3fn) for n in "qkv"}
    ones = {"descale_q": 1/64, "descale_k": 1/64, "descale_v": 1/64, "descale_s": 1/448.0, "scale_s": 448.0, "scale_o": 1}
    out = torch.empty(b, h, sq, d, dtype=torch.float8_e4m3fn, device="cuda")
    try:
        ms = time_ms(cud.run((b, h, hkv, sq, sk, d, bool(causal), d ** -0.5), codes, ones, out))
        row.append(f"cudnn-fp8 {flops / ms / 1e9:.0f}")
    except Exception as e:
        row.append(f"cudnn-fp8 n/a ({str(e).splitlines()[0][:80]})")
    q = torch.randn(b, h, sq, d, device="cuda", dtype=torch.float16)
    k = torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16)
    v = torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16)
    for name, be in (("cudnn-fp16", SDPBackend.CUDNN_ATTENTION), ("flash-fp16", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel([be]):
                ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), enable_gqa=hkv != h))
            row.append(f"{name} {flops / ms / 1e9:.0f}")
        except Exception as e:
            row.append(f"{name} n/a")
    print("  ".join(row), flush=True)
