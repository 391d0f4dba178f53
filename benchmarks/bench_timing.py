"""Call timing that the GPU benchmark scripts share (bench_decode.py, bench_schedule.py,
bench_bwd_stream.py): each call between CUDA events after the L2 is emptied, the median of the
calls; and their SUMMARY lines' geometric means."""

import math

import torch

_BUFFER = []  # the 256 MB flush buffer, made on first use


def _flush_buffer():
    if not _BUFFER:
        # 256 MB: past the L2 of every GPU this runs on (50 MB H100, 60 MB H200).
        _BUFFER.append(torch.ones(2 ** 26, dtype=torch.int32, device="cuda"))
    return _BUFFER[0]


def flushed_median_ms(fn, flush="read", reps=100, warmup=10):
    """Median ms of fn over `reps` calls (after `warmup` untimed ones), each between CUDA events
    after the L2 is emptied by `flush`: "read" reads a 256 MB buffer (clean lines, as a model's
    preceding GEMMs leave; benchmarks/NOTES.md 13.16), "memset" zeroes it (dirty lines that the
    timed call's reads evict, as triton's do_bench does), "none" times the calls back to back."""
    if flush not in ("read", "memset", "none"):
        raise ValueError(f"flush must be 'read', 'memset' or 'none', got {flush!r}")
    buf = _flush_buffer()
    times = []
    for i in range(warmup + reps):
        if flush == "read":
            buf.amax()  # reads 256 MB, writes one element
        elif flush == "memset":
            buf.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def geo_summary(label, ratios):
    """A SUMMARY line: the geometric mean of `ratios` with their range and count."""
    g = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    return (f"SUMMARY {label} geo {g:.3f} [{min(ratios):.3f}..{max(ratios):.3f}] over "
            f"{len(ratios)} shapes")
