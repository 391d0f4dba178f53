#!/usr/bin/env python3
"""scripts/device_commit_ab.sh's summary: the bench JSONs ab_A_r<n>.json / ab_B_r<n>.json in a
folder, for every (dtype, d, seqlen, causal, mode) and backend the median time of each side over
its rounds and B / A (< 1: B faster), then the geometric mean of B / A per backend. A backend
whose code is the same on both sides (SDPA's) measures the drift between the runs.

    python3 scripts/ab_summary.py OUT/ab --a 856d0ed --b f057217
"""
import argparse
import glob
import json
import math
import os
import re
import statistics
from collections import defaultdict


def load(folder):
    """{side: {(shape, backend): [ms of each round]}} from ab_<side>_r<n>.json."""
    times = {"A": defaultdict(list), "B": defaultdict(list)}
    for path in sorted(glob.glob(os.path.join(folder, "ab_*_r*.json"))):
        m = re.search(r"ab_([AB])_r(\d+)\.json$", path)
        if not m:
            continue
        with open(path) as f:
            rows = json.load(f)["attn"]
        for row in rows:
            if row.get("ms") is None or row.get("error"):
                continue
            shape = (row["dtype"], row["d"], row["seqlen"], int(row["causal"]), row["mode"])
            times[m.group(1)][(shape, row["backend"])].append(row["ms"])
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--a", default="A", help="label of side A (its commit)")
    ap.add_argument("--b", default="B", help="label of side B")
    args = ap.parse_args()
    times = load(args.folder)
    keys = sorted(set(times["A"]) & set(times["B"]), key=lambda k: (k[1], k[0]))
    if not keys:
        raise SystemExit(f"{args.folder}: no shape timed on both sides")
    print(f"# A/B: A = {args.a}, B = {args.b} (median ms over rounds; B / A < 1: B faster)\n")
    print("| backend | dtype | d | seqlen | causal | mode | A ms | B ms | B / A | rounds |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ratios = defaultdict(list)
    for shape, backend in keys:
        a = statistics.median(times["A"][(shape, backend)])
        b = statistics.median(times["B"][(shape, backend)])
        ratios[backend].append(b / a)
        n = f"{len(times['A'][(shape, backend)])} / {len(times['B'][(shape, backend)])}"
        print(f"| {backend} | {' | '.join(str(x) for x in shape)} | {a:.3f} | {b:.3f} | "
              f"{b / a:.3f} | {n} |")
    print("\n| backend | shapes | B / A geo mean [min..max] |")
    print("|---|---|---|")
    for backend, r in sorted(ratios.items()):
        geo = math.exp(sum(math.log(x) for x in r) / len(r))
        print(f"| {backend} | {len(r)} | {geo:.3f} [{min(r):.3f}..{max(r):.3f}] |")


if __name__ == "__main__":
    main()
