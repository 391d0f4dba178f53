#!/usr/bin/env bash
# One device call: scripts/device_validate.sh (the library's build, FIRST_TESTS, the suite if
# SUITE_TIMEOUT > 0) with benchmarks/tune/tune_fwd90.cu (-DTUNE_FWD90_SERIAL_ONLY, as
# scripts/device_lazy_ab.sh builds it) compiled beside the library's build, then the harness's
# A/B modes (AB_MODES, default "tailinexp"; fwd90_lazy_modes.h's) on the idle GPU, each under
# AB_TIMEOUT (s, default 200). For a warm machine's first call when the validation and one A/B
# must share it; every device_validate.sh knob passes through (its DEADLINE bounds it alone).
#   FIRST_TESTS="tests/test_window.py" SUITE_TIMEOUT=0 DEADLINE=300 AB_MODES=tailinexp \
#       bash scripts/device_validate_ab.sh
# Outputs: $OUT/{first,suite}/ (device_validate.sh), $OUT/ab/tune_fwd90_<mode>.txt.
set -u -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
base=${OUT:-$PWD/device_out}
work=${WORK:-/tmp/lazy_ab}
mkdir -p "$base/ab" "$work"
t0=$SECONDS
nvcc -std=c++17 -O3 --use_fast_math --expt-relaxed-constexpr -DFLASHATTN_CU_HAS_SM90A=1 \
    -gencode arch=compute_90a,code=sm_90a -Icsrc/include -Icsrc/flash -DTUNE_FWD90_SERIAL_ONLY \
    benchmarks/tune/tune_fwd90.cu csrc/flash/tma_host.cu -o "$work/tune_fwd90" \
    > "$base/ab/tune_fwd90_build.log" 2>&1 &
pid=$!
OUT=$base bash scripts/device_validate.sh
vrc=$?
wait $pid || { echo "tune_fwd90 build failed:"; grep -m 20 error "$base/ab/tune_fwd90_build.log"; exit 1; }
echo "device_validate_ab: validation rc $vrc, harness built, after $((SECONDS - t0)) s"
for mode in ${AB_MODES:-tailinexp}; do
    timeout "${AB_TIMEOUT:-200}" "$work/tune_fwd90" "$mode" 2>&1 |
        tee "$base/ab/tune_fwd90_$mode.txt" | grep -E "B/A|WRONG|failed|NOT BITWISE"
    echo "tune_fwd90 $mode: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s"
done
exit $vrc
