#!/usr/bin/env bash
# One device call while the sm90a forward is in development: build the extension (sm_90a, the
# forward's head dims) and the tuning harness side by side, a smoke run under a timeout (a
# pipeline deadlock fails fast), the forward-side GPU tests, then the configuration sweep.
#   bash scripts/dev_fwd90.sh                 # everything
#   TESTS="tests/test_forward.py" TUNE_DIMS=128 bash scripts/dev_fwd90.sh
# Logs under $OUT (build.log, tune.log, pytest.log).
set -u -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
OUT=${OUT:-$PWD/device_out}
mkdir -p "$OUT" build
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-14}
export FLASHATTN_CU_ARCHS=${FLASHATTN_CU_ARCHS:-90a}
export FLASHATTN_CU_HEAD_DIMS=${FLASHATTN_CU_HEAD_DIMS:-64,96,128,192,256}
TESTS=${TESTS:-tests/test_forward.py tests/test_numerics.py tests/test_varlen.py tests/test_softcap.py tests/test_window.py tests/test_alibi.py tests/test_hopper_ptx.py}
t0=$SECONDS
(nvcc -std=c++17 -O3 --use_fast_math --expt-relaxed-constexpr -DFLASHATTN_CU_HAS_SM90A=1 \
    -gencode arch=compute_90a,code=sm_90a -Icsrc/include -Icsrc/flash \
    benchmarks/tune/tune_fwd90.cu csrc/flash/tma_host.cu -o build/tune_fwd90 > "$OUT/tune_build.log" 2>&1) &
tune_pid=$!
python3 -m pip install --no-build-isolation --no-deps --no-index -e . -v > "$OUT/build.log" 2>&1
rc=$?
echo "build: exit $rc after $((SECONDS - t0)) s"
[ $rc -eq 0 ] || { grep -nE "error" "$OUT/build.log" | head -30; exit 1; }
wait $tune_pid; echo "tune harness build: exit $? after $((SECONDS - t0)) s"
timeout 150 python3 scripts/smoke_fwd.py 2>&1 | tee "$OUT/smoke.log" | tail -n 80
echo "smoke: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    # shellcheck disable=SC2086
    timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q $TESTS -p no:cacheprovider -x --timeout 120 \
        > "$OUT/pytest.log" 2>&1
    echo "pytest: exit $? after $((SECONDS - t0)) s"
    grep -E "passed|failed|Error|error" "$OUT/pytest.log" | tail -n 25
fi
if [ -x build/tune_fwd90 ] && [ "${SKIP_TUNE:-0}" != 1 ]; then
    timeout "${TUNE_TIMEOUT:-150}" build/tune_fwd90 ${TUNE_DIMS:-} 2>&1 | tee "$OUT/tune.log"
    echo "tune: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s"
fi
if [ -n "${BENCH_ARGS:-}" ]; then
    # shellcheck disable=SC2086
    timeout "${BENCH_TIMEOUT:-240}" python3 benchmarks/bench.py --out-dir "$OUT/bench" $BENCH_ARGS \
        > "$OUT/bench.log" 2>&1
    echo "bench: exit $? after $((SECONDS - t0)) s"
    grep -E "^SUMMARY|^\|" "$OUT/bench.log" | tail -n 60
fi
