#!/usr/bin/env python3
"""Key-block steps of a forward's query blocks, at multiples of the tile or aligned to the last row.

A query block of block_m rows walks the key blocks [begin, end) that problem/mask.h's
key_blocks_of_queries gives for its first and last rows (this file mirrors Mask: flash_attn's
bottom-right aligned causal and window rules). Blocks at multiples of block_m leave a partial
block at the bottom; Mask::query_block_shift moves it to the top, where (causal, or a bounded
right side with the left side unbounded) its rows see fewest keys. Prints, per tile and mask kind,
the total steps over random shapes with the shift against without it, and on how many shapes the
shift walks more; `--rule any` shifts every bounded right side (the rule before the left side's
exception), `--check` also verifies that every row is stored once and its keys lie inside its
block's walk. benchmarks/NOTES.md 12.59 item 6 has the numbers.

    python3 benchmarks/tune/walk_model.py [--shapes 30000] [--rule library|any] [--check]
"""
from __future__ import annotations

import argparse
import collections
import random

TILES = [(128, 64), (128, 80), (128, 128), (128, 176), (192, 128)]


def ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


class Mask:
    """problem/mask.h Mask: keys [key_begin(row), key_end(row)) of each query row."""

    def __init__(self, sq: int, sk: int, causal: bool, left: int = -1, right: int = -1):
        self.sq, self.sk = sq, sk
        self.left = -1 if left < 0 or left >= sk else left
        self.right = 0 if causal else (-1 if right < 0 or right >= sq else right)

    def key_begin(self, row: int) -> int:
        if self.left < 0:
            return 0
        b = row + (self.sk - self.sq) - self.left
        return min(max(b, 0), self.sk)

    def key_end(self, row: int) -> int:
        if self.right < 0:
            return self.sk
        e = row + (self.sk - self.sq) + self.right + 1
        return min(max(e, 0), self.sk)

    def shift(self, block_m: int, rule: str) -> int:
        if self.right < 0 or (rule == "library" and self.left >= 0):
            return 0
        partial = self.sq % block_m
        return 0 if partial == 0 else block_m - partial

    def key_blocks(self, first: int, last: int, block_n: int) -> tuple[int, int]:
        begin = self.key_begin(first) // block_n  # key_begin >= 0
        end_key = self.key_end(last)
        end = ceil_div(end_key, block_n) if end_key > 0 else 0
        return begin, max(begin, end)


def steps(mask: Mask, block_m: int, block_n: int, shift: int, check: bool) -> int:
    total, stored = 0, 0
    for m in range(ceil_div(mask.sq, block_m)):
        m_start = m * block_m - shift
        if m_start >= mask.sq:
            continue
        begin, end = mask.key_blocks(m_start, m_start + block_m - 1, block_n)
        total += end - begin
        if check:
            for row in range(max(m_start, 0), min(m_start + block_m, mask.sq)):
                assert row == stored, (mask.sq, block_m, shift, row)
                stored += 1
                lo, hi = mask.key_begin(row), mask.key_end(row)
                assert lo >= hi or (begin * block_n <= lo and hi <= end * block_n), (row, lo, hi)
    if check:
        assert stored == mask.sq
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", type=int, default=30000)
    ap.add_argument("--max-len", type=int, default=5000)
    ap.add_argument("--rule", choices=["library", "any"], default="library")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    agg = collections.defaultdict(lambda: [0, 0, 0, 0])  # steps before, after, worse, shapes
    for _ in range(args.shapes):
        block_m, block_n = rng.choice(TILES)
        sq = rng.randint(1, args.max_len)
        sk = sq if rng.random() < 0.5 else rng.randint(1, args.max_len)
        kind = rng.choice(["causal", "causal+left", "right", "left+right"])
        left = right = -1
        if kind == "causal+left":
            left = rng.choice([128, 256, 1000, 1024, 2047])
        elif kind == "right":
            right = rng.randint(0, 2000)
        elif kind == "left+right":
            left, right = rng.randint(0, 2000), rng.randint(0, 2000)
        mask = Mask(sq, sk, kind.startswith("causal"), left, right)
        before = steps(mask, block_m, block_n, 0, args.check)
        after = steps(mask, block_m, block_n, mask.shift(block_m, args.rule), args.check)
        a = agg[(kind, block_m, block_n)]
        a[0] += before
        a[1] += after
        a[2] += after > before
        a[3] += 1
    print(f"{'mask':12s} {'tile':>9s}  steps after / before  shapes walking more")
    for (kind, block_m, block_n), (before, after, worse, n) in sorted(agg.items()):
        print(f"{kind:12s} {block_m:4d}x{block_n:<4d}  {after / before:20.4f}  {worse:5d} of {n}")


if __name__ == "__main__":
    main()
