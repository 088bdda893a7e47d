#!/usr/bin/env python3
"""peer_torch_sdpa.py — times PyTorch's fp16 SDPA backends with the runner's timing rules.

Writes results/<UTC>-peer-torch-<id>/perf.json in the runner's perf.json schema (with a
"peer" block saying what was timed), so that

    sdpa-runner compare results/<peer run> results/<our run> \
        --base-variant torch-cudnn --cand-variant cp1

puts PyTorch beside the kernel in one COMPARE.md. compare labels the peer and still refuses
a run from another GPU. The peer's inputs are its own fp16 draws of the same shapes (torch
seeded per seed), so only timings are compared, never outputs.

Timing rules, as src/timing.rs and src/backend/cuda/timer.rs: per (shape, seed) every
backend gets --warmup untimed calls, then --iters samples in --rounds rounds with the
backend order shuffled per round (always --rounds: the runner runs more where its blocks
would outlast 20 ms, src/timing.rs MAX_BLOCK_MS); each block of samples is preceded by a hold kernel
(torch.cuda._sleep) that keeps the GPU busy while the host enqueues the block, so each
sample (CUDA events around one call) measures GPU time, not host launch latency. Python
enqueues a call 10x slower than the runner (~30-50 us with the backend selection), so the
hold is sized from the measured enqueue time of the previous block (twice it, at least the
runner's), and a block whose enqueue outlasted its hold is measured again.
--l2 flush zeroes a buffer twice the L2 size before each sample, outside the events.

Problems are the runner's: shapes, `by_name` shapes and sets of the shapes file, or inline
BxHxSxD[:sk=N][:hkv=N][:causal]. GQA/MQA runs with enable_gqa (K and V of H_kv heads); a
causal problem with S_q = S_k passes is_causal, one with S_q != S_k the bottom-right mask
torch.nn.attention.bias.causal_lower_right (query i sees keys j <= i + S_k - S_q), as the
runner's kernel. TFLOP/s count 4·D FLOPs per unmasked (query, key) pair, as the runner does.
"""

import argparse
import datetime
import json
import os
import random
import secrets
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
HOLD_BASE_US, HOLD_PER_SAMPLE_US = 200, 20  # the runner's timer; a floor here
PERF_SCHEMA_VERSION = 2


def parse_args():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="small,mission")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--iters", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--l2", choices=["warm", "flush"], default="warm")
    ap.add_argument("--shapes-file", default=os.path.join(root, "shapes/default.json"))
    ap.add_argument("--results-dir", default=os.path.join(root, "results"))
    a = ap.parse_args()
    if a.rounds < 5 or a.iters < a.rounds:
        sys.exit("error: need --rounds >= 5 and --iters >= --rounds (the runner's rules)")
    return a, root


def inline_shape(text):
    """BxHxSxD[:sk=N][:hkv=N][:causal][:qk=F] as the runner reads it, or None."""
    dims, *options = text.split(":")
    parts = dims.lower().split("x")
    if len(parts) != 4 or not all(p.isdigit() for p in parts):
        return None
    b, h, s, d = map(int, parts)
    shape = {"name": text, "B": b, "H": h, "S": s, "D": d}
    for o in options:
        key, _, value = o.partition("=")
        if key == "causal" and not value:
            shape["causal"] = True
        elif key in ("sk", "hkv"):
            shape["Sk" if key == "sk" else "Hkv"] = int(value)
        elif key == "qk":
            shape["qk_std"] = float(value)
        else:
            sys.exit(f"error: `{o}` in {text} is not an option this script reads")
    return shape


def load_shapes(path, names):
    data = json.load(open(path))
    in_all = data["shapes"]
    shapes = {s["name"]: s for s in in_all + data.get("by_name", [])}
    sets = data.get("sets", {})
    out = []
    for name in names.split(","):
        if name == "all":
            out += in_all
        elif name in sets:
            out += [shapes[n] for n in sets[name]]
        elif name in shapes:
            out.append(shapes[name])
        elif inline_shape(name):
            out.append(inline_shape(name))
        else:
            sys.exit(f"error: unknown shape {name} in {path}; known: {sorted(shapes)}, sets {sorted(sets)}")
    return out


def unmasked_pairs(B, H, S, Sk, causal):
    """(query, key) pairs a causal (bottom-right) or full mask leaves, over all heads."""
    if not causal:
        return B * H * S * Sk
    per_head = sum(min(Sk, max(0, r + Sk - S + 1)) for r in range(S))
    return B * H * per_head


def clocks():
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw",
             "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True, text=True, check=True).stdout.split(",")
        return {"sm_mhz": int(out[0]), "memory_mhz": int(out[1]),
                "temperature_c": int(out[2]), "power_w": float(out[3]), "source": "nvidia-smi"}
    except Exception as e:  # noqa: BLE001 — a reading is optional
        return {"sm_mhz": None, "memory_mhz": None, "temperature_c": None, "power_w": None,
                "source": f"unavailable: {e}"}


def git_info(root):
    try:
        sha = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", root, "status", "--porcelain"],
                                    capture_output=True, text=True).stdout.strip())
        return {"sha": sha, "dirty": dirty}
    except Exception:  # noqa: BLE001 — the device copy may have no .git
        return {"sha": "unknown", "dirty": True}


def summary(xs):
    ys = sorted(xs)
    q = lambda p: ys[min(len(ys) - 1, int(round(p * (len(ys) - 1))))]  # noqa: E731
    return {"n": len(xs), "p50": statistics.median(xs), "p90": q(0.9),
            "mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0,
            "min": ys[0], "max": ys[-1]}


class Timer:
    def __init__(self, l2_flush, l2_bytes, clock_mhz):
        self.flush = torch.empty(2 * l2_bytes, dtype=torch.uint8, device="cuda") if l2_flush else None
        self.cycles_per_us = clock_mhz
        self.per_sample_us = HOLD_PER_SAMPLE_US
        self.retries = 0

    def time(self, fn, count):
        """`count` samples of fn in µs, each enqueued while the GPU is still held."""
        while True:
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(count)]
            hold_us = HOLD_BASE_US + self.per_sample_us * count
            hold_done = torch.cuda.Event()
            torch.cuda._sleep(int(hold_us * self.cycles_per_us))
            hold_done.record()
            t0 = time.perf_counter()
            for start, end in events:
                if self.flush is not None:
                    self.flush.zero_()
                start.record()
                fn()
                end.record()
            enqueue_us = (time.perf_counter() - t0) * 1e6
            held = not hold_done.query()  # still spinning: every sample was enqueued in time
            torch.cuda.synchronize()
            self.per_sample_us = max(HOLD_PER_SAMPLE_US, 2 * enqueue_us / count)
            if held:
                return [s.elapsed_time(e) * 1e3 for s, e in events]
            self.retries += 1


def main():
    args, root = parse_args()
    if not torch.cuda.is_available():
        print("error: no CUDA GPU visible to torch; run this on the GPU machine", file=sys.stderr)
        sys.exit(3)
    props = torch.cuda.get_device_properties(0)
    clock_mhz = getattr(props, "clock_rate", 0) // 1000 or 1980
    shapes = load_shapes(args.shapes_file, args.shapes)
    seeds = [int(s) for s in args.seeds.split(",")]
    wanted = args.backends.split(",")
    timer = Timer(args.l2 == "flush", props.L2_cache_size, clock_mhz)
    per_round = [args.iters // args.rounds + (r < args.iters % args.rounds) for r in range(args.rounds)]

    before = clocks()
    measurements, available, refused = [], [], {}
    for shape in shapes:
        B, H, S, D = shape["B"], shape["H"], shape["S"], shape["D"]
        Hkv, Sk, causal = shape.get("Hkv", H), shape.get("Sk", S), shape.get("causal", False)
        std = shape.get("qk_std", 1.0)
        flop = 4 * D * unmasked_pairs(B, H, S, Sk, causal)
        kwargs = {"enable_gqa": Hkv != H}
        if causal and S == Sk:
            kwargs["is_causal"] = True
        elif causal:
            kwargs["attn_mask"] = causal_lower_right(S, Sk)
        for seed in seeds:
            g = torch.Generator(device="cuda").manual_seed(seed)
            q = (torch.randn(B, H, S, D, generator=g, device="cuda") * std).half()
            k = (torch.randn(B, Hkv, Sk, D, generator=g, device="cuda") * std).half()
            v = torch.randn(B, Hkv, Sk, D, generator=g, device="cuda").half()
            # The f32 reference materializes the scores: only where they fit a few GiB.
            small = B * H * S * Sk <= 1 << 29
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **kwargs) if small else None
            usable = {}  # name -> SDPBackend, for the backends that ran and were right
            for name in wanted:
                if name in refused:
                    continue
                try:
                    with sdpa_kernel([BACKENDS[name]]):
                        out = F.scaled_dot_product_attention(q, k, v, **kwargs).float()
                        # Rows that see no key: torch may write NaN there (the runner writes 0).
                        err = 0.0 if ref is None else (out - ref).nan_to_num().abs().max().item()
                        del out
                except RuntimeError as e:
                    refused[name] = str(e).splitlines()[0]
                    print(f"[{shape['name']}] torch-{name}: not available here: {refused[name]}")
                    continue
                if not err < 2e-2:
                    sys.exit(f"error: torch-{name} is wrong on {shape['name']} (max err {err}); "
                             "refusing to time a broken backend")
                usable[name] = BACKENDS[name]
                if name not in available:
                    available.append(name)
            names = list(usable)
            call = lambda: F.scaled_dot_product_attention(q, k, v, **kwargs)  # noqa: E731
            for name in names:
                with sdpa_kernel([usable[name]]):
                    for _ in range(args.warmup):
                        call()
            rounds = {n: [] for n in names}
            for r in range(args.rounds):
                order = names[:]
                random.Random(r).shuffle(order)
                for name in order:
                    with sdpa_kernel([usable[name]]):  # selected once per block, outside the events
                        rounds[name].append(timer.time(call, per_round[r]))
            for name in names:
                samples = [x for rr in rounds[name] for x in rr]
                measurements.append({
                    "shape": shape["name"], "B": B, "H": H, "S": S, "D": D,
                    "Hkv": Hkv, "Sk": Sk, "causal": causal, "seed": seed,
                    "input_checksum": f"torch fp16 randn (generator seed {seed}, qk_std {std})",
                    "variant": f"torch-{name}", "summary": summary(samples),
                    "round_medians_us": [statistics.median(rr) for rr in rounds[name]],
                    "samples_us": samples})
                s = measurements[-1]["summary"]
                tflops = flop / (s["p50"] * 1e-6) / 1e12
                print(f"[{shape['name']:<9}] seed={seed} torch-{name:<9} p50={s['p50']:.2f}us "
                      f"p90={s['p90']:.2f}us {tflops:.0f} TFLOP/s")
    after = clocks()

    perf = {
        "schema_version": PERF_SCHEMA_VERSION,
        "backend": "torch",
        "clock": "GPU time per call from CUDA events (PyTorch SDPA, fp16)",
        "device_name": props.name,
        "device": {"name": props.name, "compute_capability": f"{props.major}.{props.minor}",
                   "sm_count": props.multi_processor_count, "l2_bytes": props.L2_cache_size,
                   "total_memory_bytes": props.total_memory},
        "git": git_info(root),
        "started_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "plan": {"warmup": args.warmup, "iters": args.iters, "rounds": args.rounds, "batch": 1,
                 "l2": args.l2},
        "clocks_before": before, "clocks_after": after,
        "variants": [{"name": f"torch-{n}", "defines": [f"SDPBackend.{BACKENDS[n].name}"],
                      "ptx_sha256": None, "registers": None, "smem_bytes": None,
                      "spill_bytes": None, "blocks_per_sm": None} for n in available],
        "measurements": measurements,
        "comparisons": [],
        "peer": {"hold_retries": timer.retries, "library": f"torch {torch.__version__}", "cuda": torch.version.cuda,
                 "cudnn": torch.backends.cudnn.version(), "precision": "fp16",
                 "not_available": refused},
    }
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out_dir = os.path.join(args.results_dir, f"{stamp}-peer-torch-{secrets.token_hex(3)}")
    staging = out_dir + ".partial"
    os.makedirs(staging)
    with open(os.path.join(staging, "perf.json"), "w") as f:
        json.dump(perf, f, indent=1)
    os.rename(staging, out_dir)  # all or nothing, as the runner's run directories
    print(f"results: {out_dir}")


if __name__ == "__main__":
    main()
