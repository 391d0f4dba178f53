#!/usr/bin/env python3
"""Side-by-side digest of ncu reports printed with `ncu -i REP --print-details all`.

    python3 scripts/ncu_digest.py ours=ncu_pair_flashattn_cu_details.txt fa4=ncu_pair_fa4_details.txt

For each input (LABEL=PATH, or a bare PATH labelled by its position) it takes the longest kernel
(largest "Duration"; --kernel REGEX picks among the kernels whose name matches instead) and prints
one row per metric: section (or table) | metric | unit | one value per input. The default rows are
the ones that said where a kernel's time goes in earlier comparisons (benchmarks/NOTES.md 12.43):
speed of light, pipe utilisation, issue, instruction counts, warp states, launch and occupancy;
--all prints every metric the inputs have. No ncu needed: it reads the text.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

# (section or table name prefix, metric name prefix) of the default rows, in print order.
DEFAULT_ROWS = [
    ("GPU Speed Of Light Throughput", "SM Frequency"),
    ("GPU Speed Of Light Throughput", "Elapsed Cycles"),
    ("GPU Speed Of Light Throughput", "Duration"),
    ("GPU Speed Of Light Throughput", "Compute (SM) Throughput"),
    ("GPU Speed Of Light Throughput", "Memory Throughput"),
    ("GPU Speed Of Light Throughput", "DRAM Throughput"),
    ("GPU Speed Of Light Throughput", "L2 Cache Throughput"),
    ("Compute Throughput Breakdown", "SM: Pipe Tensor Cycles Active"),
    ("Compute Throughput Breakdown", "SM: Issue Active"),
    ("Compute Throughput Breakdown", "SM: Pipe Alu Cycles Active"),
    ("Compute Throughput Breakdown", "SM: Pipe Fma Cycles Active"),
    ("Compute Throughput Breakdown", "SM: Pipe Fmaheavy Cycles Active"),
    ("Compute Throughput Breakdown", "SM: Inst Executed Pipe Xu"),
    ("Compute Throughput Breakdown", "SM: Inst Executed Pipe Lsu"),
    ("Compute Throughput Breakdown", "SM: Inst Executed Pipe Uniform"),
    ("Compute Throughput Breakdown", "SM: Mio Inst Issued"),
    ("Scheduler Statistics", "One or More Eligible"),
    ("Scheduler Statistics", "Active Warps Per Scheduler"),
    ("Scheduler Statistics", "Eligible Warps Per Scheduler"),
    ("Warp State Statistics", "Warp Cycles Per Issued Instruction"),
    ("Warp State (All Cycles)", "Stall"),
    ("Instruction Statistics", "Executed Instructions"),
    ("Instruction Statistics", "Issued Instructions"),
    ("Launch Statistics", "Grid Size"),
    ("Launch Statistics", "Block Size"),
    ("Launch Statistics", "Registers Per Thread"),
    ("Launch Statistics", "Dynamic Shared Memory Per Block"),
    ("Launch Statistics", "Waves Per SM"),
    ("Occupancy", "Achieved Occupancy"),
]

# A kernel's header: its name, then (grid)x(block), the context, stream, device and CC.
KERNEL_RE = re.compile(r"^  (\S.*?) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Context")


def number(text):
    """The float of an ncu value ('1,305,008', '971.55'), or None."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def parse(path):
    """{kernel header: {(section, metric): (unit, value text)}} of one details file, in file
    order; a kernel launched more than once keeps each launch (the header repeats)."""
    kernels, current, section, columns = [], None, "", None
    lines = Path(path).read_text(errors="replace").splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = KERNEL_RE.match(line)
        if m:
            current = {}
            kernels.append((m.group(1), current))
            columns = None
        elif current is not None:
            stripped = line.strip()
            if stripped.startswith("Section: "):
                section, columns = stripped[len("Section: "):], None
            elif stripped.startswith("Table Name : "):
                section, columns = stripped[len("Table Name : "):], None
            elif stripped.startswith("Metric Name") and i > 0 and set(lines[i - 1].strip()) <= {"-", " "}:
                # The dashed line above gives the column widths: name, unit, value.
                dashes = lines[i - 1]
                spans = [(mm.start(), mm.end()) for mm in re.finditer(r"-+", dashes)]
                columns = spans if len(spans) == 3 else None
                i += 1  # the dashed line under the header
            elif columns is not None and set(stripped) <= {"-"} and stripped:
                columns = None  # the table's closing line
            elif columns is not None and stripped:
                (n0, n1), (u0, u1), (v0, _) = columns
                name = line[n0:n1].strip()
                unit = line[u0:u1].strip()
                value = line[v0:].strip()
                if name:
                    current[(section, name)] = (unit, value)
        i += 1
    return kernels


def duration_us(metrics):
    for (section, name), (unit, value) in metrics.items():
        if section.startswith("GPU Speed Of Light Throughput") and name == "Duration":
            v = number(value)
            if v is None:
                return 0.0
            return v * {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}.get(unit, 1.0)
    return 0.0


def pick(kernels, pattern):
    """The longest launch among those whose name matches pattern (all when None)."""
    chosen = [k for k in kernels if pattern is None or re.search(pattern, k[0])]
    if not chosen:
        return None
    return max(chosen, key=lambda k: duration_us(k[1]))


def rows_for(metric_sets, show_all):
    """The (section, metric) keys to print: DEFAULT_ROWS' matches in their order, or every key
    any input has (in first-seen order)."""
    keys = []
    seen = set()
    if show_all:
        for metrics in metric_sets:
            for key in metrics:
                if key not in seen:
                    seen.add(key)
                    keys.append(key)
        return keys
    for sec, met in DEFAULT_ROWS:
        for metrics in metric_sets:
            for key in metrics:
                if key not in seen and key[0].startswith(sec) and key[1].startswith(met):
                    seen.add(key)
                    keys.append(key)
    return keys


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", help="LABEL=PATH or PATH of `ncu --print-details all` text")
    ap.add_argument("--kernel", help="regex: consider only kernels whose name matches")
    ap.add_argument("--all", action="store_true", help="every metric, not the default rows")
    args = ap.parse_args(argv)

    labels, picked = [], []
    for n, spec in enumerate(args.inputs):
        label, _, path = spec.rpartition("=") if "=" in spec else (f"#{n + 1}", "", spec)
        kernels = parse(path)
        k = pick(kernels, args.kernel)
        if k is None:
            print(f"ncu_digest: no kernel{' matching ' + args.kernel if args.kernel else ''} in "
                  f"{path} ({len(kernels)} kernels)", file=sys.stderr)
            return 2
        labels.append(label)
        picked.append(k)

    print("# ncu digest; " + "; ".join(f"{lab}: {name[:120]} ({duration_us(m):.2f} us)"
                                       for lab, (name, m) in zip(labels, picked)))
    print("section | metric | unit | " + " | ".join(labels))
    for key in rows_for([m for _, m in picked], args.all):
        unit = next((m[key][0] for _, m in picked if key in m), "")
        values = [m[key][1] if key in m else "-" for _, m in picked]
        print(f"{key[0][:28]} | {key[1]} | {unit} | " + " | ".join(values))
    return 0


if __name__ == "__main__":
    sys.exit(main())
