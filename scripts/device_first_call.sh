#!/usr/bin/env bash
# A session's first device call in one command: the validation (scripts/device_validate.sh: the
# extension's build, FIRST_TESTS, the suite) with the A/Bs of harnesses packed here
# (scripts/pack_harness.sh, carried as build/tune_bin) on the GPU while the extension builds
# (the build is CPU work; the A/B sees its CPU load, not the GPU's), and FlashAttention-4's second
# part kept for the next call (../shared/tools/fa4_anchor.sh: .fa4b carried now, .fa4a with
# scripts/device_bench_fa4.sh next):
#   here:    bash scripts/pack_harness.sh tune_fwd90
#   device:  carry [".fa4b", "build/tune_bin"]:
#            FLASHATTN_CU_COMMIT=<head> AB_MODES="twop" bash scripts/device_first_call.sh
#   then, within 30 s, carry [".fa4a"]: DIAG=1 bash scripts/device_bench_fa4.sh
# Knobs: AB_MODES (tune_fwd90 modes, default none), AB_SM80_MODES (tune_fwd modes, default none),
# AB_TIMEOUT (s a mode, default 150); every device_validate.sh knob (FIRST_TESTS, FIRST_TIMEOUT,
# SUITE_TIMEOUT, DEADLINE) passes through. Outputs: $OUT/{first,suite}/, $OUT/ab/ and $OUT/ab.log.
set -u -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
base=${OUT:-$PWD/device_out}
mkdir -p "$base/ab"
if [ -f .fa4b/part_ab ]; then
    mkdir -p /tmp/fa4parts && cp .fa4b/part_ab /tmp/fa4parts/ && echo "fa4: part_ab kept in /tmp/fa4parts"
fi
ab_pid=
if [ -n "${AB_MODES:-}${AB_SM80_MODES:-}" ]; then
    sm80=0
    [ -n "${AB_SM80_MODES:-}" ] && sm80=1
    (sleep 5; OUT=$base/ab LAZY_STAGE=run LAZY_SM80=$sm80 LAZY_MODES="${AB_MODES:-}" \
        LAZY_SM80_MODES="${AB_SM80_MODES:-}" LAZY_TIMEOUT=${AB_TIMEOUT:-150} \
        WORK=$PWD/build/tune_bin bash scripts/device_lazy_ab.sh > "$base/ab.log" 2>&1) &
    ab_pid=$!
fi
OUT=$base bash scripts/device_validate.sh
rc=$?
if [ -n "$ab_pid" ]; then
    wait "$ab_pid"
    echo "device_first_call: the A/Bs (AB_MODES='${AB_MODES:-}' AB_SM80_MODES='${AB_SM80_MODES:-}'):"
    grep -E "B/A|NOT BITWISE| differ|WRONG|failed|exit|unpacked" "$base/ab.log" | tail -n 80
fi
exit $rc
