#!/usr/bin/env python3
"""The order causal CTAs start in, modeled (docs/PERF.md "Stage C and D, change 36").

A greedy list schedule: CTAs start in the grid's linear order (x first), each on the SM slot
that frees first; a CTA's time is the KV tiles it runs (a causal CTA of query tile m, `rows`
rows, runs the tiles up to its last row's last key). Prints, for each problem, the ideal time
(all work over all slots), the schedule of the old grid (query tiles, B·H) with each head's
tiles from the last, and of the heads-first grid (B·H, query tiles) with the tiles from the
last, as multiples of the ideal.

  [BLOCK_N=64] scripts/stage_d/schedule_model.py [B H S ROWS SLOTS] ...
  (default: the problems PERF.md cites, 132 SMs, one CTA an SM; BLOCK_N keys a KV tile, 128)
No GPU: a model, checked against the measured gains in PERF.md, not a measurement.
"""
import heapq
import os
import sys


def finish(jobs, slots):
    free = [0.0] * slots
    for work in jobs:
        t = heapq.heappop(free)
        heapq.heappush(free, t + work)
    return max(free)


def model(b, h, s, rows, slots, block_n):
    tiles = -(-s // rows)
    work = [-(-min(s, (m + 1) * rows) // block_n) for m in range(tiles)]  # KV tiles of tile m
    heads = b * h
    old = [work[tiles - 1 - x] for _ in range(heads) for x in range(tiles)]
    first = [work[tiles - 1 - y] for y in range(tiles) for _ in range(heads)]
    ideal = sum(old) / slots
    return ideal, finish(old, slots) / ideal, finish(first, slots) / ideal


def main(argv):
    problems = [(1, 16, 4096, 192, 132), (1, 32, 4096, 128, 132), (4, 16, 8192, 192, 132)]
    if argv:
        if len(argv) % 5 or not all(v.isdigit() and int(v) > 0 for v in argv):
            sys.exit("usage: schedule_model.py [B H S ROWS SLOTS] ... (positive integers)")
        problems = [tuple(int(v) for v in argv[i:i + 5]) for i in range(0, len(argv), 5)]
    block_n = int(os.environ.get("BLOCK_N", "128"))
    print("problem (rows a CTA, slots)        ideal  tiles first  heads first")
    for p in problems:
        ideal, old, first = model(*p, block_n)
        b, h, s, rows, slots = p
        print(f"{b}x{h}x{s} causal ({rows}, {slots})".ljust(34) + f"{ideal:7.1f}  {old:10.3f}x  {first:10.3f}x")


if __name__ == "__main__":
    main(sys.argv[1:])
