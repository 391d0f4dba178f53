#!/usr/bin/env bash
# The benchmark call that follows a build call on a warm device machine (the build is kept
# there): unpack FlashAttention-4 (../shared/tools/fa4_anchor.sh: the first call copied
# .fa4b/part_ab to /tmp/fa4parts, this one carries .fa4a), run the forward side by side with it
# (benchmarks/bench_fa4.py), then the main benchmark and the feature benchmark through
# scripts/device_run.sh. FA4 is only on PYTHONPATH for its own script.
#   first call:   ... carry [".fa4b"]: mkdir -p /tmp/fa4parts && cp .fa4b/part_ab /tmp/fa4parts/ && <build, tests>
#   second call:  carry [".fa4a"]: bash scripts/device_bench_fa4.sh
# It spends up to ~570 s (the main benchmark's own time budget, then the features in what is
# left): wrap it in no `timeout` shorter than that (session 69's `timeout 380` cut bench.py at
# shape 28 of 36). DIAG=1 first runs scripts/diag_fwd_error.py --qscales 1,4 (its SUMMARY line
# into the call's output and $OUT/diag_fwd_error.txt, ~20 s), out of the same 570 s. BUDGET (s,
# default 570) bounds the whole script, for a call that spends some of its time first (an A/B).
set -u -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
OUT=${OUT:-$PWD/device_out}
mkdir -p "$OUT"
t0=$SECONDS
if [ "${DIAG:-0}" = 1 ]; then
    timeout 120 python3 scripts/diag_fwd_error.py --qscales 1,4 > "$OUT/diag_fwd_error.txt" 2>&1
    echo "diag_fwd_error: exit $? after $((SECONDS - t0)) s"
    grep SUMMARY "$OUT/diag_fwd_error.txt"
fi
if [ -f .fa4a/part_aa ] && [ -f /tmp/fa4parts/part_ab ]; then
    cp .fa4a/part_aa /tmp/fa4parts/ && mkdir -p /tmp/fa4 &&
        cat /tmp/fa4parts/part_* | xz -d | tar -x -C /tmp/fa4 && echo "fa4: unpacked after $((SECONDS - t0)) s"
else
    echo "fa4: parts missing (.fa4a/part_aa here, /tmp/fa4parts/part_ab from the first call): no FA4 column"
fi
PYTHONPATH=/tmp/fa4/nvidia_cutlass_dsl/dsl_packages:/tmp/fa4 PYTHONUNBUFFERED=1 \
    timeout "${FA4_TIMEOUT:-200}" python3 benchmarks/bench_fa4.py --out "$OUT/fa4_side_by_side.md" \
    --seqlens "${FA4_SEQLENS:-1024,4096,8192,16384}" --dtypes "${FA4_DTYPES:-bf16}" \
    --dims "${FA4_DIMS:-64,128,256}" --modes "${FA4_MODES:-fwd}" 2>&1 | tail -n 60
echo "fa4 bench: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s"
STEPS=${STEPS:-bench,features} DEADLINE=$((${BUDGET:-570} - (SECONDS - t0))) \
    BENCH_ARGS=${BENCH_ARGS:-"--dtypes bf16 --no-decode --no-memory"} bash scripts/device_run.sh 2>&1 |
    grep -E "^SUMMARY|^RESULT|=====|steps:" | tail -n 50
