"""benchmarks/bench.py's own code path on the host (--cpu-smoke: tiny shapes, host timings): the
interleaved rounds (--rounds) the GPU tables rest on. Each timed (shape, mode, backend) keeps one
time a round, and its reported time is their median; the table header says how it was timed."""

import json
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("rounds", [1, 3])
def test_bench_rounds_are_kept_and_their_median_reported(rounds):
    res = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench.py"), "--cpu-smoke", "--no-decode",
         "--no-memory", "--dims", "32", "--seqlens", "64", "--modes", "fwd,bwd", "--causal", "0,1",
         "--rounds", str(rounds)],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    found = re.search(r"flashattn_cu bench -> (\S+)/(\S+)\.\{md,json,png\}", res.stdout)
    assert found, res.stdout[-2000:]
    out_dir, name = Path(found.group(1)), found.group(2)
    data = json.loads((out_dir / f"{name}.json").read_text())
    timed = [row for row in data["attn"] if row.get("ms") is not None]
    assert len(timed) >= 4 * 2, data["attn"]  # 2 causal x 2 modes, at least two backends
    for row in timed:
        assert len(row["ms_rounds"]) == rounds, row
        assert row["ms"] == pytest.approx(statistics.median(row["ms_rounds"])), row
    backends = {row["backend"] for row in timed}
    assert "flashattn_cu" in backends and len(backends) >= 2, backends
    header = (out_dir / f"{name}.md").read_text()
    shutil.rmtree(out_dir, ignore_errors=True)  # --cpu-smoke writes to a fresh temporary folder
    assert f"the median of {rounds} interleaved rounds" in header


@pytest.mark.gpu
def test_bench_schedule_runs_and_checks_both_schedules(tmp_path):
    """benchmarks/bench_schedule.py on one small shape, every flush: a row per flush whose
    schedules (persistent, per tile, dynamic) agreed bitwise and with cuDNN ('ok'), and its
    SUMMARY lines (two a flush)."""
    out = tmp_path / "schedule.md"
    res = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_schedule.py"), "--shapes", "64:2048",
         "--flush", "memset,read,none", "--rounds", "2", "--reps", "3", "--warmup", "1",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ") and
            line.split("|")[1].strip() in ("memset", "read", "none")]
    assert [r.split("|")[1].strip() for r in rows] == ["memset", "read", "none"], rows
    assert all(r.rstrip(" |").endswith("ok") for r in rows), rows
    assert res.stdout.count("SUMMARY") == 6, res.stdout[-2000:]


@pytest.mark.gpu
def test_bench_bwd_stream_runs_and_checks_both_converts(tmp_path):
    """benchmarks/bench_bwd_stream.py on two small shapes (causal, a window): a row each whose
    two dQ converts agreed (dK / dV bitwise, dQ within the atomics' order: 'ok'), and its
    SUMMARY line."""
    out = tmp_path / "bwd_stream.md"
    res = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_bwd_stream.py"), "--shapes",
         "64:2048:1,128:2048:w256", "--rounds", "2", "--reps", "3", "--warmup", "1",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ") and
            line.split("|")[1].strip() in ("64", "128")]
    assert len(rows) == 2 and all(r.rstrip(" |").endswith("ok") for r in rows), rows
    assert res.stdout.count("SUMMARY") == 1, res.stdout[-2000:]


def _details(kernel, grid, duration_us, tensor, stalls):
    """A kernel's part of `ncu --print-details all` text, in ncu's layout (dashed column rules)."""
    rows = "\n".join(f"    Stall {name:<20} inst {value:>12}" for name, value in stalls)
    return f"""  void {kernel}(Params) ({grid}, 1, 1)x(256, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    ----------------------- ----------- ------------
    Metric Name             Metric Unit Metric Value
    ----------------------- ----------- ------------
    Elapsed Cycles                cycle    1,305,008
    Duration                         us     {duration_us:>8}
    ----------------------- ----------- ------------

    Table Name : Compute Throughput Breakdown
    ----------------------------- ----------- ------------
    Metric Name                   Metric Unit Metric Value
    ----------------------------- ----------- ------------
    SM: Pipe Tensor Cycles Active           %        {tensor:>5}
    ----------------------------- ----------- ------------

    Table Name : Warp State (All Cycles)
    -------------------------- ---- ------------
    Metric Name                Metric Unit Metric Value
    -------------------------- ---- ------------
{rows}
    -------------------------- ---- ------------
"""


def test_ncu_digest_takes_each_reports_longest_kernel(tmp_path):
    """scripts/ncu_digest.py (the ncu pair's side-by-side table): per report the longest kernel
    (or the longest matching --kernel), its metrics read by ncu's column rules."""
    a = tmp_path / "a.txt"
    a.write_text("[1] python3@host\n" + _details("prep_kernel", 512, "101.40", "0.00", [("Wait", "9.00")])
                 + _details("main_kernel", 2048, "702.15", "66.45", [("Wait", "1.22"), ("Barrier", "0.40")]))
    b = tmp_path / "b.txt"
    b.write_text(_details("fa4_main", 132, "650.00", "77.17", [("Wait", "0.98")]))
    run = lambda *args: subprocess.run(  # noqa: E731
        [sys.executable, str(REPO / "scripts" / "ncu_digest.py"), *args],
        capture_output=True, text=True, timeout=60, cwd=REPO)
    res = run(f"ours={a}", f"fa4={b}")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "main_kernel" in lines[0] and "(702.15 us)" in lines[0] and "fa4_main" in lines[0], lines[0]
    assert lines[1] == "section | metric | unit | ours | fa4"
    assert "GPU Speed Of Light Throughpu | Duration | us | 702.15 | 650.00" in lines
    assert "Compute Throughput Breakdown | SM: Pipe Tensor Cycles Active | % | 66.45 | 77.17" in lines
    assert "Warp State (All Cycles) | Stall Barrier | inst | 0.40 | -" in lines
    assert "Warp State (All Cycles) | Stall Wait | inst | 1.22 | 0.98" in lines
    res = run("--kernel", "prep", str(a))
    assert res.returncode == 0 and "Stall Wait | inst | 9.00" in res.stdout, res.stdout + res.stderr
    res = run("--kernel", "nothing_like_it", str(a))
    assert res.returncode == 2 and "no kernel matching" in res.stderr
    # A real report (the sm90 backward at 476cf67 on the H200): its main kernel and warp states.
    real = REPO / "benchmarks" / "results" / "ncu_bwd90_h200_476cf67_details.txt"
    res = run(str(real))
    assert res.returncode == 0, res.stderr
    assert "bwd_kernel" in res.stdout.splitlines()[0]
    assert re.search(r"\| Stall Wait \| inst \| \d", res.stdout), res.stdout
    assert re.search(r"\| Registers Per Thread \| register/thread \| \d+", res.stdout), res.stdout


def test_tune_ab_digest_groups_passes_and_flags_unequal_sides(tmp_path):
    """scripts/tune_ab_digest.py (the harnesses' A/B lines in one table): tune_fwd90's and
    tune_fwd's rows grouped by label and shape over the passes, the geometric mean of the shapes'
    mean B / A per label; rows whose sides differ (WRONG, NOT BITWISE, a `bits` row with
    differences) listed first, a `bits` row without any kept out."""
    out = tmp_path / "ab.txt"
    out.write_text(
        "device: NVIDIA H100\n"
        "d128 128x176 skip bits   d=128 s= 4096 c=0: B against A, 0 of 33554432 outputs and 0 of "
        "262144 LSEs differ\n"
        "d64 192x128 skip bits    d= 64 s= 4096 c=1: B against A, 3 of 33554432 outputs and 0 of "
        "524288 LSEs differ  NOT BITWISE\n"
        "d128 128x176 skip        d=128 s= 4096 c=0: A  600.0  B  594.0 TFLOP/s  B/A time 0.990"
        "  max|diff| 2.4e-04 2.4e-04\n"
        "d128 128x176 skip        d=128 s=16384 c=0: A  650.0  B  630.0 TFLOP/s  B/A time 0.970"
        "  max|diff| 1.2e-04 1.2e-04\n"
        "d128 128x176 skip        d=128 s= 4096 c=0: A  601.0  B  590.0 TFLOP/s  B/A time 0.980"
        "  max|diff| 2.4e-04 2.4e-04\n"
        "skip d=128 seqlen= 2048 causal=1 128x 64 w4: A  300.0  B  297.0 TFLOP/s  B/A time 1.010"
        "  max|A - B| 0.0e+00\n"
        "lazy d=256 seqlen= 8192 causal=0  64x 64 w4: A  300.0  B  290.0 TFLOP/s  B/A time 0.970"
        "  max|A - B| 3.9e-03  WRONG\n")
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "tune_ab_digest.py"), str(out)],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("FLAGGED (2)"), lines
    assert "NOT BITWISE" in lines[1] and "WRONG" in lines[2] and "0 of 33554432" not in res.stdout
    assert "  d=128 s= 4096 c=0: B/A 0.990 0.980  mean 0.985" in lines
    assert "  d128 128x176 skip: geo mean B/A 0.977 [0.970..0.985] over 2 shapes" in lines
    assert "skip 128x64 w4" in lines and "  d=128 s= 2048 c=1: B/A 1.010  mean 1.010" in lines
    assert "lazy 64x64 w4" in lines
    empty = tmp_path / "none.txt"
    empty.write_text("nothing here\n")
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "tune_ab_digest.py"), str(empty)],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert res.returncode == 1 and "no A/B rows" in res.stderr


def test_bench_fa4_round_ratios_pair_each_round():
    """benchmarks/bench_fa4.py's 'ours/FA4 rounds' column: each interleaved round's own ratio
    (the other backend's time over ours, > 1 where ours is faster), nothing where either side
    lost a round."""
    import importlib.util

    pytest.importorskip("triton")
    spec = importlib.util.spec_from_file_location("bench_fa4", REPO / "benchmarks" / "bench_fa4.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.round_ratios([2.0, 3.0, 1.0], [1.0, 2.0, 2.0]) == [2.0, 1.5, 0.5]
    assert mod.round_ratios(None, [1.0]) == [] and mod.round_ratios([1.0], []) == []
    assert mod.round_ratios([1.0, 2.0], [1.0]) == []  # a round lost on one side: no pairing


def test_gpu_clocks_sampler_tags_and_medians(monkeypatch):
    """benchmarks/gpu_clocks.py (bench_fa4.py --clocks): samples taken while a tag is set count
    for that tag only, their medians are reported, the NVML device index follows
    CUDA_VISIBLE_DEVICES, and without NVML the sampler says so and records nothing. A fake
    libnvidia-ml (ctypes.CDLL) stands in for the driver's."""
    import ctypes
    import importlib.util
    import time

    spec = importlib.util.spec_from_file_location("gpu_clocks", REPO / "benchmarks" / "gpu_clocks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    class FakeNvml:
        def __init__(self):
            self.index, self.mhz, self.mw = None, 1500, 400_000

        def nvmlInit_v2(self):
            return 0

        def nvmlDeviceGetHandleByIndex_v2(self, index, handle_ref):
            self.index = index.value
            return 0

        def nvmlDeviceGetClockInfo(self, handle, clock_type, mhz_ref):
            assert clock_type == 1  # NVML_CLOCK_SM
            mhz_ref._obj.value = self.mhz
            return 0

        def nvmlDeviceGetPowerUsage(self, handle, mw_ref):
            mw_ref._obj.value = self.mw
            return 0

    fake = FakeNvml()
    monkeypatch.setattr(ctypes, "CDLL", lambda name: fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    sampler = mod.ClockSampler(cuda_index=1, period_s=0.001)
    try:
        assert sampler.available and fake.index == 5
        time.sleep(0.02)  # no tag: nothing recorded
        assert sampler.summary("a") is None
        with sampler.tagged("a"):
            time.sleep(0.1)
        fake.mhz, fake.mw = 1200, 650_000
        with sampler.tagged("b"):
            time.sleep(0.1)
        a, b = sampler.summary("a"), sampler.summary("b")
        assert a is not None and b is not None, (a, b)
        assert a[:2] == (1500, 400.0) and b[:2] == (1200, 650.0), (a, b)
        sampler.reset()
        assert sampler.summary("a") is None
    finally:
        sampler.close()

    def no_lib(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", no_lib)
    missing = mod.ClockSampler()
    assert not missing.available and "cannot open" in missing.error
    with missing.tagged("a"):
        pass
    assert missing.summary("a") is None
    missing.close()
