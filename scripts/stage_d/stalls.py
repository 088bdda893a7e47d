#!/usr/bin/env python3
"""Where a Stage-D launch's warps wait, from Nsight Compute's per-instruction samples.

    stalls.py SOURCE_CSV [RAW_CSV]

SOURCE_CSV is `ncu -i REPORT --page source --csv --print-source sass` of one launch (probe.sh
`profile` writes it); RAW_CSV, optional, is `ncu -i REPORT --page raw --csv` of the same launch.
The SASS is split by warp role where the kernel moves registers: the producer's code follows
`USETMAXREG.DEALLOC`, the consumers' `USETMAXREG.TRY_ALLOC` (cuda/sdpa_fp8_stage_d_wgmma.cu,
regs_dealloc / regs_alloc); what precedes both is the set-up. For each role it prints the
samples, the main stall reasons, and per opcode the instructions executed a warp and the
samples; with RAW_CSV, the pipes' utilization and the issue rate. Samples are a warp's state at
a sampling instant: an opcode's share of a role's samples is its share of that role's warps'
time, waits included.
"""
import collections
import csv
import sys

ROLES = ("set-up", "consumer", "producer")
PIPES = (
    "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "smsp__warps_eligible.avg.per_cycle_active",
    "gpc__cycles_elapsed.max",
    "sm__cycles_elapsed.avg.per_second",
)


def opcode(source):
    words = source.split()
    if not words:
        return "?"
    word = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return word.split(".")[0]


def read_source(path):
    rows = [r for r in csv.reader(open(path)) if r]
    header_at = next(i for i, r in enumerate(rows) if "Source" in r and "# Samples" in r)
    header, body = rows[header_at], rows[header_at + 1 :]
    col = {name: i for i, name in enumerate(header)}
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    return body, col, stalls


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    body, col, stalls = read_source(sys.argv[1])
    role = "set-up"
    samples = collections.defaultdict(collections.Counter)
    reasons = collections.defaultdict(collections.Counter)
    executed = collections.defaultdict(collections.Counter)
    for row in body:
        source = row[col["Source"]]
        if "USETMAXREG.TRY_ALLOC" in source:
            role = "consumer"
        elif "USETMAXREG.DEALLOC" in source:
            role = "producer"
        op = opcode(source)
        samples[role][op] += number(row[col["# Samples"]])
        executed[role][op] += number(row[col["Instructions Executed"]])
        for s in stalls:
            reasons[role][s[len("stall_") :]] += number(row[col[s]])
    for r in ROLES:
        total = sum(samples[r].values())
        if total == 0:
            continue
        top = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in reasons[r].most_common(6))
        print(f"{r}: {total:.0f} samples; stalls: {top}")
        # Warp instructions executed over the launch (a D 128 consumer tile issues 8 QGMMA, a
        # D 64 one 6: divide by the QGMMA line to get them a tile).
        print(f"  {'opcode':12} {'executed':>12} {'samples':>8} {'share':>6}")
        for op, v in samples[r].most_common(14):
            print(f"  {op:12} {executed[r][op]:12.0f} {v:8.0f} {100 * v / total:5.1f}%")
    if len(sys.argv) == 3:
        rows = [r for r in csv.reader(open(sys.argv[2])) if r]
        header, values = rows[0], rows[2] if len(rows) > 2 else []
        print("pipes and issue (raw page):")
        for name in PIPES:
            if name in header and values:
                print(f"  {name:66} {values[header.index(name)]:>14}")


if __name__ == "__main__":
    main()
