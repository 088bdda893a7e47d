#!/usr/bin/env python3
"""peer_export.py — runs peer attention implementations on an exported folder, for grading.

    python3 scripts/peer_export.py DIR OUTROOT [--peers torch-flash-fp16,...,cudnn-fp8]

DIR is written by `sdpa-runner export`; each peer writes OUTROOT/<peer>/<id>.npy and
OUTROOT/<peer>/implementation.json (its name, what it read, its median time per problem, and
why it wrote no output where it could not run), so that

    sdpa-runner check DIR --outputs OUTROOT/torch-flash-fp16 --outputs OUTROOT/cudnn-fp8 ... --ours cuda

grades every peer and our kernel in one COMPARE.md.

Peers:
- torch-<math|flash|efficient|cudnn>-<fp16|bf16>: PyTorch SDPA on the f32 originals cast to
  fp16 or bf16 (precision fp16 / bf16); GQA through enable_gqa; causal by is_causal (S_q =
  S_k) or the bottom-right mask causal_lower_right (S_q != S_k). Outputs fp16, or bf16 as
  uint16.
- cudnn-fp8: cuDNN's FP8 SDPA through nvidia-cudnn-frontend (carry its wheel), on the
  exported e4m3 codes (precision fp8). cuDNN takes one descale per tensor, the export has one
  per (b, head): the output is computed one (b, head) at a time with that head's descales
  (and its K/V head), and the timing is of one call on the whole problem (all scales 1: the
  time does not depend on their values). P is scaled by 448 into e4m3 (descale 1/448); O is
  e4m3 (Hopper has no other FP8 output) with one scale per problem, max |v̂| / 448, which
  holds every output (a convex combination of V rows).
- fa4-<fp16|bf16|fp8>: FlashAttention-4 (`flash-attn-4`, CuTe DSL; install it and
  nvidia-cutlass-dsl with its libs) in the (b, s, h, d) layout it takes; causal is FlashAttention's
  bottom-right alignment. fp8 reads the e4m3 codes one query head at a time with that head's
  descales (FA4's descale is per (b, K/V head)) and writes bf16, as FA4 does. Where FA4 is not
  installed, or refuses (4.0.0b36 asserts "FP8 is only supported on SM100" on Hopper), each
  problem says why and writes nothing.

Timing: --warmup calls, then --iters calls each between CUDA events, preceded by a GPU hold
(the same Timer as scripts/peer_torch_sdpa.py), median in microseconds.
"""

import argparse
import json
import math
import os
import sys
import traceback

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_torch_sdpa import Timer, summary  # noqa: E402

TORCH = {
    "math": SDPBackend.MATH,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
ALL_PEERS = [f"torch-{b}-{d}" for b in TORCH for d in DTYPES] + ["cudnn-fp8"] + [
    f"fa4-{d}" for d in ("fp16", "bf16", "fp8")]


def load(dir_, p, name, device="cuda"):
    return torch.from_numpy(np.load(os.path.join(dir_, p["files"][name]))).to(device)


def timed(timer, fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return summary(timer.time(fn, iters))["p50"]


def torch_peer(backend, dtype, dir_, p, timer, args):
    q, k, v = (load(dir_, p, t).to(DTYPES[dtype]) for t in ("q", "k", "v"))
    kwargs = {"enable_gqa": p["Hkv"] != p["Hq"], "scale": p["softmax_scale"]}
    if p["causal"] and p["Sq"] == p["Sk"]:
        kwargs["is_causal"] = True
    elif p["causal"]:
        kwargs["attn_mask"] = causal_lower_right(p["Sq"], p["Sk"])
    call = lambda: F.scaled_dot_product_attention(q, k, v, **kwargs)  # noqa: E731
    with sdpa_kernel([TORCH[backend]]):
        o = call()
        p50 = timed(timer, call, args.warmup, args.iters)
    if dtype == "bf16":
        return o.contiguous().view(torch.int16).cpu().numpy().view(np.uint16), p50, {}
    return o.cpu().numpy(), p50, {}


class CudnnFp8:
    """One cudnn-frontend graph per problem geometry."""

    def __init__(self):
        import cudnn  # noqa: F401 — fails here, once, when the wheel is not carried

        self.cudnn = cudnn
        self.handle = cudnn.create_handle()
        self.graphs = {}

    def graph(self, b, hq, hkv, sq, sk, d, causal, scale):
        key = (b, hq, hkv, sq, sk, d, causal, scale)
        if key in self.graphs:
            return self.graphs[key]
        cudnn = self.cudnn
        cudnn.set_stream(handle=self.handle, stream=torch.cuda.current_stream().cuda_stream)
        e4m3, f32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
        g = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=f32,
                          compute_data_type=f32, handle=self.handle)
        dims = {"q": (b, hq, sq, d), "k": (b, hkv, sk, d), "v": (b, hkv, sk, d)}
        strides = {n: (s[1] * s[2] * s[3], s[2] * s[3], s[3], 1) for n, s in dims.items()}
        t = {n: g.tensor(name=n, dim=dims[n], stride=strides[n], data_type=e4m3) for n in dims}
        scalar = dict(dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=f32)
        names = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")
        s = {n: g.tensor(name=n, **scalar) for n in names}
        # Bottom-right needs its own flag: with use_causal_mask set, cuDNN keeps the top-left
        # diagonal whatever diagonal_alignment says (a first version of this script passed
        # both, and `check` failed its S_q != S_k causal rows at 41-45x the bound).
        if causal and sq != sk:
            mask = {"use_causal_mask_bottom_right": True}
        else:
            mask = {"use_causal_mask": causal}
        o, _, amax_s, amax_o = g.sdpa_fp8(
            q=t["q"], k=t["k"], v=t["v"], **{n: s[n] for n in names},
            is_inference=True, attn_scale=scale, name="sdpa_fp8", **mask)
        o.set_output(True).set_dim(dims["q"]).set_stride(strides["q"]).set_data_type(e4m3)
        for a in (amax_s, amax_o):
            a.set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1)).set_data_type(f32)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        ws = torch.empty(g.get_workspace_size(), device="cuda", dtype=torch.uint8)
        self.graphs[key] = (g, t, s, o, amax_s, amax_o, ws)
        return self.graphs[key]

    def run(self, key, codes, scales, out):
        g, t, s, o, amax_s, amax_o, ws = self.graph(*key)
        one = lambda x: torch.full((1, 1, 1, 1), float(x), device="cuda")  # noqa: E731
        pack = {t["q"]: codes["q"], t["k"]: codes["k"], t["v"]: codes["v"], o: out,
                amax_s: torch.empty(1, 1, 1, 1, device="cuda"),
                amax_o: torch.empty(1, 1, 1, 1, device="cuda")}
        for n in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o"):
            pack[s[n]] = one(scales[n])
        return lambda: g.execute(pack, ws, handle=self.handle)

    def __call__(self, dir_, p, timer, args):
        b, hq, hkv, sq, sk, d = p["B"], p["Hq"], p["Hkv"], p["Sq"], p["Sk"], p["D"]
        causal, scale = p["causal"], p["softmax_scale"]
        codes = {n: load(dir_, p, f"{n}_fp8").view(torch.float8_e4m3fn) for n in ("q", "k", "v")}
        sc = {n: load(dir_, p, f"{n}_scale").cpu().numpy() for n in ("q", "k", "v")}
        v_max = float(np.abs(codes["v"].float().cpu().numpy()).max(axis=(2, 3)).__mul__(sc["v"]).max())
        o_scale = max(v_max, 1e-30) / 448.0
        out = torch.empty(b, hq, sq, d, dtype=torch.float8_e4m3fn, device="cuda")
        head = torch.empty(1, 1, sq, d, dtype=torch.float8_e4m3fn, device="cuda")
        key = (1, 1, 1, sq, sk, d, causal, scale)
        for bi in range(b):
            for h in range(hq):
                kvh = h // (hq // hkv)
                one_head = {"q": codes["q"][bi:bi + 1, h:h + 1].contiguous(),
                            "k": codes["k"][bi:bi + 1, kvh:kvh + 1].contiguous(),
                            "v": codes["v"][bi:bi + 1, kvh:kvh + 1].contiguous()}
                scales = {"descale_q": sc["q"][bi, h], "descale_k": sc["k"][bi, kvh],
                          "descale_v": sc["v"][bi, kvh], "descale_s": 1 / 448.0,
                          "scale_s": 448.0, "scale_o": 1 / o_scale}
                self.run(key, one_head, scales, head)()
                out[bi, h] = head[0, 0]
        torch.cuda.synchronize()
        whole = (b, hq, hkv, sq, sk, d, causal, scale)
        ones = {"descale_q": 1, "descale_k": 1, "descale_v": 1, "descale_s": 1 / 448.0,
                "scale_s": 448.0, "scale_o": 1}
        scratch = torch.empty_like(out)
        extra = {"o_scale": o_scale}
        try:
            p50 = timed(timer, self.run(whole, codes, ones, scratch), args.warmup, args.iters)
        except Exception as e:  # noqa: BLE001 — the output stands; say why there is no time
            p50 = None
            extra["note"] = "not timed: " + (str(e).strip().splitlines() or ["?"])[0][:200]
        return out.view(torch.uint8).cpu().numpy(), p50, extra


class Fa4:
    """FlashAttention-4's forward (flash_attn.cute) in one precision."""

    def __init__(self, precision):
        from flash_attn.cute import interface  # fails here, once, when FA4 is not installed

        self.fwd = interface._flash_attn_fwd
        self.precision = precision

    def __call__(self, dir_, p, timer, args):
        scale, causal = p["softmax_scale"], p["causal"]
        bshd = lambda x: x.transpose(1, 2).contiguous()  # noqa: E731 — (b, h, s, d) -> (b, s, h, d)
        first = lambda r: r[0] if isinstance(r, tuple) else r  # noqa: E731
        if self.precision != "fp8":
            q, k, v = (bshd(load(dir_, p, t).to(DTYPES[self.precision])) for t in ("q", "k", "v"))
            call = lambda: first(self.fwd(q, k, v, softmax_scale=scale, causal=causal))  # noqa: E731
            o = call()
            p50 = timed(timer, call, args.warmup, args.iters)
            o = o.transpose(1, 2).contiguous()
        else:
            b, hq, hkv = p["B"], p["Hq"], p["Hkv"]
            codes = {n: load(dir_, p, f"{n}_fp8").view(torch.float8_e4m3fn) for n in ("q", "k", "v")}
            sc = {n: load(dir_, p, f"{n}_scale") for n in ("q", "k", "v")}
            o = torch.empty(b, hq, p["Sq"], p["D"], dtype=torch.bfloat16, device="cuda")
            for bi in range(b):
                for h in range(hq):
                    kvh = h // (hq // hkv)
                    one = lambda t, i: bshd(codes[t][bi:bi + 1, i:i + 1])  # noqa: E731
                    ds = lambda t, i: sc[t][bi:bi + 1, i:i + 1].float().contiguous()  # noqa: E731
                    r = self.fwd(one("q", h), one("k", kvh), one("v", kvh), softmax_scale=scale,
                                 causal=causal, q_descale=ds("q", h), k_descale=ds("k", kvh),
                                 v_descale=ds("v", kvh))
                    o[bi, h] = first(r)[0, :, 0]
            torch.cuda.synchronize()
            p50 = None
        if o.dtype == torch.bfloat16:
            return o.contiguous().view(torch.int16).cpu().numpy().view(np.uint16), p50, {}
        return o.cpu().numpy(), p50, {}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("outroot")
    ap.add_argument("--peers", default=",".join(ALL_PEERS))
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--iters", type=int, default=100)
    args = ap.parse_args()
    manifest = json.load(open(os.path.join(args.dir, "manifest.json")))
    props = torch.cuda.get_device_properties(0)
    timer = Timer(False, props.L2_cache_size, getattr(props, "clock_rate", 0) // 1000 or 1980)
    for peer in args.peers.split(","):
        if peer not in ALL_PEERS:
            sys.exit(f"error: unknown peer {peer}; known: {', '.join(ALL_PEERS)}")
        out = os.path.join(args.outroot, peer)
        os.makedirs(out, exist_ok=True)
        about = {"torch": torch.__version__, "cuda": torch.version.cuda,
                 "cudnn": torch.backends.cudnn.version(), "gpu": props.name}
        if peer == "cudnn-fp8":
            precision = "fp8"
            try:
                run = CudnnFp8()
                about["cudnn_frontend"] = getattr(run.cudnn, "__version__", "?")
                about["cudnn_backend"] = run.cudnn.backend_version()
            except Exception as e:  # noqa: BLE001 — reported, not fatal
                run, why = None, f"cudnn-frontend unavailable: {e}"
        elif peer.startswith("fa4-"):
            precision = peer.split("-")[1]
            try:
                run = Fa4(precision)
                import flash_attn.cute as fa4

                about["flash_attn_4"] = fa4.__version__
            except Exception as e:  # noqa: BLE001 — reported, not fatal
                run, why = None, f"flash-attn-4 unavailable: {type(e).__name__}: {e}"
        else:
            _, backend, precision = peer.split("-")
            run = lambda d, p, t, a, b=backend, dt=precision: torch_peer(b, dt, d, p, t, a)  # noqa: E731
        facts = {}
        for p in manifest["problems"]:
            try:
                if run is None:
                    raise RuntimeError(why)
                o, p50, extra = run(args.dir, p, timer, args)
                np.save(os.path.join(out, p["id"] + ".npy"), o)
                facts[p["id"]] = {"p50_us": p50, **extra}
                flop = 4 * p["D"] * pairs(p)
                rate = f"p50 {p50:9.1f} us {flop / p50 / 1e6:7.1f} TFLOP/s" if p50 else extra.get("note")
                print(f"{peer:<22} {p['id']:<44} {rate}")
            except Exception as e:  # noqa: BLE001 — a peer that cannot run says why
                first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
                facts[p["id"]] = {"note": f"not run: {first}"}
                print(f"{peer:<22} {p['id']:<44} not run: {first}")
                if os.environ.get("PEER_TRACE"):
                    traceback.print_exc()
            torch.cuda.empty_cache()
        info = {"name": peer, "precision": precision, "problems": facts, "about": about}
        if precision == "bf16" or peer == "fa4-fp8":
            info["u16"] = "bf16"
        with open(os.path.join(out, "implementation.json"), "w") as f:
            json.dump(info, f, indent=1)


def pairs(p):
    b, h, sq, sk = p["B"], p["Hq"], p["Sq"], p["Sk"]
    if not p["causal"]:
        return b * h * sq * sk
    return b * h * sum(min(sk, max(0, r + sk - sq + 1)) for r in range(sq))


if __name__ == "__main__":
    main()
