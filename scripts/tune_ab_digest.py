#!/usr/bin/env python3
"""The tuning harnesses' A/B lines in one table: benchmarks/tune/tune_fwd90.cu's ab_sweep rows

    d128 128x176 skip        d=128 s= 4096 c=0: A  633.1  B  538.5 TFLOP/s  B/A time 1.175  max|diff| ...

and tune_fwd.cu's lazy_ab rows (`lazy d=128 seqlen= 2048 causal=0 128x 64 w4: A ... B/A time ...`),
grouped by label and shape over the passes: each shape's B / A times, their mean, and per label
the geometric mean and range of the shapes' means (< 1: B faster). Rows flagged WRONG or NOT
BITWISE, and tune_fwd90's `bits` rows that found differences, are listed first: a timing of two
kernels that do not compute the same thing is not an A/B.

    python3 scripts/tune_ab_digest.py OUT/ab/tune_fwd90_skipkept.txt [more files]
"""
import argparse
import math
import re
import sys
from collections import OrderedDict

# tune_fwd90's ab_sweep and tune_fwd's lazy_ab rows.
_FWD90 = re.compile(r"^(?P<label>.+?)\s+d=\s*(?P<d>\d+) s=\s*(?P<s>\d+) c=(?P<c>[01]): A\s+"
                    r"(?P<a>[\d.]+)\s+B\s+(?P<b>[\d.]+) TFLOP/s\s+B/A time (?P<ratio>[\d.]+)")
_FWD80 = re.compile(r"^(?P<label>lazy|skip) d=\s*(?P<d>\d+) seqlen=\s*(?P<s>\d+) causal=(?P<c>[01])"
                    r"\s+(?P<tile>\d+x\s*\d+) w(?P<w>\d+): A\s+(?P<a>[\d.]+)\s+B\s+(?P<b>[\d.]+) "
                    r"TFLOP/s\s+B/A time (?P<ratio>[\d.]+)")
_BITS = re.compile(r"^(?P<label>.+?)\s+d=\s*(?P<d>\d+) s=\s*(?P<s>\d+) c=(?P<c>[01]): B against A, "
                   r"(?P<od>\d+) of \d+ outputs and (?P<ld>\d+) of \d+ LSEs differ")


def parse(lines):
    """(rows, flagged): rows {label: {(d, s, c): [B/A of each pass]}}; flagged, the lines that
    say the two sides differ (WRONG, NOT BITWISE, a bits row with differences, a failed launch)."""
    rows, flagged = OrderedDict(), []
    for line in lines:
        line = line.rstrip("\n")
        if "WRONG" in line or "NOT BITWISE" in line or "failed" in line:
            flagged.append(line)
        m = _BITS.match(line)
        if m:
            if int(m["od"]) or int(m["ld"]):
                if line not in flagged:
                    flagged.append(line)
            continue
        m = _FWD90.match(line) or _FWD80.match(line)
        if not m:
            continue
        label = m["label"].strip()
        if "tile" in m.groupdict():
            label = f"{label} {m['tile'].replace(' ', '')} w{m['w']}"
        key = (int(m["d"]), int(m["s"]), int(m["c"]))
        rows.setdefault(label, OrderedDict()).setdefault(key, []).append(float(m["ratio"]))
    return rows, flagged


def digest(rows, flagged):
    """The table as text lines."""
    out = []
    if flagged:
        out.append(f"FLAGGED ({len(flagged)}): the sides differ; these timings are not an A/B")
        out += [f"  {line}" for line in flagged]
    for label, shapes in rows.items():
        means = []
        out.append(f"{label}")
        for (d, s, c), ratios in shapes.items():
            mean = sum(ratios) / len(ratios)
            means.append(mean)
            passes = " ".join(f"{r:.3f}" for r in ratios)
            out.append(f"  d={d:3d} s={s:5d} c={c}: B/A {passes}  mean {mean:.3f}")
        geo = math.exp(sum(math.log(m) for m in means) / len(means))
        out.append(f"  {label}: geo mean B/A {geo:.3f} [{min(means):.3f}..{max(means):.3f}] "
                   f"over {len(means)} shapes")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="harness outputs (tune_fwd90_<mode>.txt, ...)")
    args = ap.parse_args(argv)
    lines = []
    for path in args.files:
        with open(path) as f:
            lines += f.readlines()
    rows, flagged = parse(lines)
    if not rows and not flagged:
        print("no A/B rows found", file=sys.stderr)
        return 1
    print("\n".join(digest(rows, flagged)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
