#!/usr/bin/env bash
# One device call: scripts/device_validate.sh (the library's build, FIRST_TESTS, the suite if
# SUITE_TIMEOUT > 0) with benchmarks/tune/tune_fwd90.cu compiled beside the library's build
# (scripts/device_lazy_ab.sh LAZY_STAGE=build; WORK passes through), then the harness's
# A/B modes (AB_MODES, default "tailinexp"; fwd90_lazy_modes.h's) on the idle GPU, each under
# AB_TIMEOUT (s, default 200). For a warm machine's first call when the validation and one A/B
# must share it; every device_validate.sh knob passes through (its DEADLINE bounds it alone).
#   FIRST_TESTS="tests/test_window.py" SUITE_TIMEOUT=0 DEADLINE=300 AB_MODES=tailinexp \
#       bash scripts/device_validate_ab.sh
# Outputs: $OUT/{first,suite}/ (device_validate.sh), $OUT/ab/tune_fwd90_<mode>.txt.
set -u -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
base=${OUT:-$PWD/device_out}
mkdir -p "$base/ab"
t0=$SECONDS
OUT=$base/ab LAZY_STAGE=build LAZY_SM80=0 bash scripts/device_lazy_ab.sh &
pid=$!
OUT=$base bash scripts/device_validate.sh
vrc=$?
wait $pid || exit 1
echo "device_validate_ab: validation rc $vrc, harness built, after $((SECONDS - t0)) s"
OUT=$base/ab LAZY_STAGE=run LAZY_SM80=0 LAZY_MODES="${AB_MODES:-tailinexp}" \
    LAZY_TIMEOUT=${AB_TIMEOUT:-200} bash scripts/device_lazy_ab.sh
exit $vrc
