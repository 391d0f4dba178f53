"""The GPU's SM clock and board power while a benchmark runs, read through NVML in a thread.

A kernel that draws more power per unit of work runs at lower boost clocks once the board sits
at its power limit, so two kernels' times can differ by more than their instruction streams do
(ncu, which locks the clocks at base, then shows a smaller gap than the benchmark: benchmarks/
NOTES.md 12.99 item 3). ClockSampler records (SM MHz, W) every `period_s` while a tag is set:

    sampler = ClockSampler()          # sampler.available is False without NVML: records nothing
    with sampler.tagged("flashattn_cu"):
        do_bench(...)
    sampler.summary("flashattn_cu")   # (median SM MHz, median W, samples) or None

NVML through ctypes (libnvidia-ml.so.1, which the driver installs), no Python package needed.
The device: NVML's index of the current CUDA device, from CUDA_VISIBLE_DEVICES when it lists
integers (NVML ignores that variable), else the CUDA index.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import statistics
import threading

_NVML_CLOCK_SM = 1


def _nvml_index(cuda_index: int) -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible:
        parts = [p.strip() for p in visible.split(",")]
        if all(p.isdigit() for p in parts) and cuda_index < len(parts):
            return int(parts[cuda_index])
    return cuda_index


class ClockSampler:
    def __init__(self, cuda_index: int = 0, period_s: float = 0.005):
        self.available = False
        self.error = None
        self._period = period_s
        self._samples: dict[str, list[tuple[int, float]]] = {}
        self._tag = None
        self._lock = threading.Lock()
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                raise RuntimeError("nvmlInit_v2 failed")
            handle = ctypes.c_void_p()
            rc = lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(_nvml_index(cuda_index)),
                                                   ctypes.byref(handle))
            if rc != 0:
                raise RuntimeError(f"nvmlDeviceGetHandleByIndex_v2: {rc}")
        except Exception as exc:  # noqa: BLE001 - no NVML: the benchmark runs without clocks
            self.error = f"{type(exc).__name__}: {exc}"
            return
        self._lib, self._handle = lib, handle
        self.available = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _read(self):
        mhz, mw = ctypes.c_uint(), ctypes.c_uint()
        if self._lib.nvmlDeviceGetClockInfo(self._handle, _NVML_CLOCK_SM, ctypes.byref(mhz)) != 0:
            return None
        if self._lib.nvmlDeviceGetPowerUsage(self._handle, ctypes.byref(mw)) != 0:
            return None
        return mhz.value, mw.value / 1000.0

    def _run(self):
        while not self._stop.wait(self._period):
            tag = self._tag
            if tag is None:
                continue
            got = self._read()
            if got is not None:
                with self._lock:
                    self._samples.setdefault(tag, []).append(got)

    @contextlib.contextmanager
    def tagged(self, tag: str):
        """Samples taken inside the block count for `tag` (tags accumulate until reset)."""
        self._tag = tag
        try:
            yield
        finally:
            self._tag = None

    def reset(self):
        with self._lock:
            self._samples.clear()

    def summary(self, tag: str):
        """(median SM MHz, median W, samples) of `tag`'s samples, or None without any."""
        with self._lock:
            got = list(self._samples.get(tag, ()))
        if not got:
            return None
        return (statistics.median(m for m, _ in got), statistics.median(w for _, w in got),
                len(got))

    def close(self):
        if self.available:
            self._stop.set()
            self._thread.join(timeout=1.0)
