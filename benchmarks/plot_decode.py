#!/usr/bin/env python3
"""Chart of a bench_decode.py table: GB/s of K and V per shape for flashattn_cu (contiguous and
paged caches), SDPA flash and SDPA cuDNN, with the copy rate of the same run as a line; one panel
per head dim. Reads the markdown bench_decode.py writes (no GPU needed).

    python3 benchmarks/plot_decode.py benchmarks/results/decode_q1_h200_b80a679.md \
        --out benchmarks/results/decode_q1_h200_b80a679.png
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path


def read_table(path):
    """(title, copy GB/s, rows): rows as dicts d, batch, keys, cache, ours, flash, cudnn."""
    lines = Path(path).read_text().splitlines()
    title = lines[0].lstrip("# ").strip()
    match = re.search(r"copy rate (\d+) GB/s", title)
    copy = float(match.group(1)) if match else None
    rows = []
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 8 or not cells[0].isdigit():
            continue
        number = lambda c: float(c) if c not in ("-", "") else None  # noqa: E731
        rows.append(dict(d=int(cells[0]), batch=int(cells[1]), keys=cells[2], cache=cells[3],
                         ours=number(cells[4]), flash=number(cells[6]), cudnn=number(cells[7])))
    return title, copy, rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("table", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    title, copy, rows = read_table(args.table)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dims = sorted({r["d"] for r in rows})
    fig, axes = plt.subplots(len(dims), 1, figsize=(12, 4.2 * len(dims)), squeeze=False)
    series = [("flashattn_cu, contiguous", "contiguous", "ours"),
              ("flashattn_cu, paged 256", "paged 256", "ours"),
              ("flashattn_cu, paged 16", "paged 16", "ours"),
              ("SDPA flash", "contiguous", "flash"),
              ("SDPA cuDNN", "contiguous", "cudnn")]
    width = 0.16
    for ax, d in zip(axes[:, 0], dims):
        shapes = [(r["batch"], r["keys"]) for r in rows if r["d"] == d and r["cache"] == "contiguous"]
        for i, (label, cache, key) in enumerate(series):
            values = []
            for batch, keys in shapes:
                hit = [r[key] for r in rows if r["d"] == d and r["batch"] == batch and
                       r["keys"] == keys and r["cache"] == cache]
                values.append(hit[0] if hit and hit[0] is not None else 0.0)
            ax.bar([x + (i - 2) * width for x in range(len(shapes))], values, width, label=label)
        if copy:
            ax.axhline(copy, color="black", linestyle="--", linewidth=1,
                       label=f"device copy (read + write) {copy:.0f}")
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels([f"batch {b}\n{k} keys" for b, k in shapes])
        ax.set_ylabel("GB/s of K and V")
        ax.set_title(f"d = {d}")
        ax.legend(fontsize=8, ncol=3, loc="upper left")
        ax.set_ylim(0, (copy or 0) * 1.25 or None)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
