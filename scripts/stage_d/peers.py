"""Times cuDNN FP8 SDPA (cudnn-frontend), cuDNN fp16 and FlashAttention-2 fp16 (torch) on
scripts/stage_d/probe.cu's perf shapes, in TFLOP/s over unmasked pairs. Run by probe.sh peers.

Two protocols, each a peer's figure: `burst`, the mean of 20 launches between two events after 3
warm-ups (probe.cu's `perf`, so the probe's figures for Stage D compare with it), and `p50`, the
median of PEER_SAMPLES (default 300, a multiple of 50) launches each between its own two
events, back to back after 10 warm-ups (the runner's default timing: one launch a sample, p50;
src/backend/cuda/timer.rs), so the runner's figures for Stage D compare with it. A long run may hold a lower clock than a
burst of 20 (power): compare Stage D and a peer only within one protocol."""
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

def p50_ms(fn, samples=int(os.environ.get("PEER_SAMPLES", "300")), block=50):
    # Each block of launches is enqueued behind a spin of the GPU (torch.cuda._sleep, about 10 ms),
    # as the runner's hold kernel does, so that no sample holds the host's time to enqueue the
    # next launch. A block whose spin ended before the host had enqueued it (its first event
    # already complete) is measured again, up to 3 times, as the runner does with an expired hold.
    assert samples >= block, f"PEER_SAMPLES must be at least {block}"
    for _ in range(10): fn()
    times = []
    for _ in range(samples // block):
        for attempt in range(3):
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(block + 1)]
            torch.cuda._sleep(20_000_000)
            ev[0].record()
            for i in range(block):
                fn()
                ev[i + 1].record()
            expired = ev[0].query()
            torch.cuda.synchronize()
            if not expired:
                break
        else:
            print("warning: a block's spin ended before it was enqueued, 3 times", file=sys.stderr)
        times += [ev[i].elapsed_time(ev[i + 1]) for i in range(block)]
    times.sort()
    return times[len(times) // 2]

def both(flops, fn):
    """`name burst (p50 X)` in TFLOP/s."""
    return f"{flops / time_ms(fn) / 1e9:.0f} (p50 {flops / p50_ms(fn) / 1e9:.0f})"

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
        row.append(f"cudnn-fp8 {both(flops, cud.run((b, h, hkv, sq, sk, d, bool(causal), d ** -0.5), codes, ones, out))}")
    except Exception as e:
        row.append(f"cudnn-fp8 n/a ({str(e).splitlines()[0][:80]})")
    q = torch.randn(b, h, sq, d, device="cuda", dtype=torch.float16)
    k = torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16)
    v = torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16)
    for name, be in (("cudnn-fp16", SDPBackend.CUDNN_ATTENTION), ("flash-fp16", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel([be]):
                fig = both(flops, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), enable_gqa=hkv != h))
            row.append(f"{name} {fig}")
        except Exception as e:
            row.append(f"{name} n/a")
    print("  ".join(row), flush=True)
