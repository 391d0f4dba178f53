#!/usr/bin/env python3
"""A load model of the sm90 forward's static persistent walk for window (left, 0) calls.

Each query tile costs its key blocks plus a fixed cost in block-steps (its first step, last P V
and epilogue: ~2.25 from the phase clocks, benchmarks/NOTES.md 12.9); CTA c walks tiles
cta_tile_index(k, c, ctas) of the order (problem/scheduler.h). Prints, per sequence length, the
busiest CTA's load over the mean for: the grouped longest-first order (query_tile_at with
group_heads), the same with the light leading query blocks last (defer_m), the hardware's greedy
hand-out of the grouped order (one CTA per tile), and a greedy LPT bound. benchmarks/NOTES.md
12.14 has the numbers and what the H200 measured.

    python3 benchmarks/tune/schedule_model.py [--heads 16] [--window 1024] [--fixed 2.25]
"""
from __future__ import annotations

import argparse
import heapq


def key_blocks(m_block: int, block_m: int, block_n: int, window: int) -> int:
    first = max(0, m_block * block_m - window)
    last = m_block * block_m + block_m - 1
    return last // block_n - first // block_n + 1


def tile_costs(seqlen, heads, block_m, block_n, window, fixed, group, defer):
    """Tile costs in the kernel's order: query_tile_at(index, ..., group, heads, defer)."""
    num_m = seqlen // block_m
    lead = num_m - defer
    order = []
    for index in range(num_m * heads):
        if defer > 0 and index >= lead * heads:
            m_block = defer - 1 - (index - lead * heads) // heads
        else:
            g = index // (group * lead)
            rest = index - g * group * lead
            in_group = min(group, heads - g * group)
            m_block = num_m - 1 - rest // in_group
        order.append(key_blocks(m_block, block_m, block_n, window) + fixed)
    return order


def snake_max(costs, ctas):
    load = [0.0] * ctas
    for k in range((len(costs) + ctas - 1) // ctas):
        for c in range(ctas):
            index = k * ctas + (c if k % 2 == 0 else ctas - 1 - c)
            if index < len(costs):
                load[c] += costs[index]
    return max(load)


def greedy_max(costs, ctas):
    heap = [(0.0, c) for c in range(ctas)]
    for cost in costs:
        load, c = heapq.heappop(heap)
        heapq.heappush(heap, (load + cost, c))
    return max(load for load, _ in heap)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--window", type=int, default=1024)
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--fixed", type=float, default=2.25, help="fixed block-steps a tile")
    p.add_argument("--group", type=int, default=3, help="fwd_schedule's heads a group (L2)")
    p.add_argument("--ctas", type=int, default=132)
    args = p.parse_args()
    light = -(-args.window // args.block)
    print("seqlen  grouped  light-last  greedy  LPT   (busiest CTA / mean load)")
    for seqlen in (4096, 8192, 16384):
        base = tile_costs(seqlen, args.heads, args.block, args.block, args.window, args.fixed,
                          args.group, 0)
        deferred = tile_costs(seqlen, args.heads, args.block, args.block, args.window,
                              args.fixed, args.group, light)
        mean = sum(base) / args.ctas
        print(f"{seqlen:6d}  {snake_max(base, args.ctas) / mean:7.3f}  "
              f"{snake_max(deferred, args.ctas) / mean:10.3f}  "
              f"{greedy_max(base, args.ctas) / mean:6.3f}  "
              f"{greedy_max(sorted(base, reverse=True), args.ctas) / mean:5.3f}")


if __name__ == "__main__":
    main()
