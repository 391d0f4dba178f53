#!/usr/bin/env bash
# One device call that validates a commit (scripts/device_run.sh three times, each into its own
# folder under $OUT): the build and the tests given first (fail fast, -x), then the whole suite,
# then extra steps (benchmarks) in the time left before DEADLINE.
#
#   FIRST_TESTS="tests/test_backward.py::test_streamed_dq_convert" \
#   EXTRA_STEPS=features,bwdstream FEATURES_ARGS="--skip modifiers --paths auto" \
#       bash scripts/device_validate.sh
#
# Knobs: FIRST_TESTS (pytest node ids or files, space-separated; default tests/test_api.py),
# FIRST_TIMEOUT (s, default 150), SUITE_TIMEOUT (s, default 360, at most the time left before
# DEADLINE; 0 skips the suite; the whole suite took ~315 s on session 68's H100), EXTRA_STEPS
# (device_run.sh steps after the suite, default none), DEADLINE (s from the start, default 570);
# every device_run.sh knob (FEATURES_ARGS, BWDSTREAM_ARGS, BENCH_ARGS, ...) passes through.
# Prints device_run.sh's summaries; the logs are in $OUT/{first,suite,extra}/.
set -u -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
base=${OUT:-$PWD/device_out}
deadline=${DEADLINE:-570}
t0=$SECONDS
summary() { grep -E "^SUMMARY|^RESULT|^steps:|^pytest:|FAILED|exit [1-9]" | tail -n 60; }

OUT=$base/first STEPS=env,build,test PYTEST_ARGS="${FIRST_TESTS:-tests/test_api.py} -q -x" \
    TEST_TIMEOUT=${FIRST_TIMEOUT:-150} DEADLINE=$deadline bash scripts/device_run.sh 2>&1 | summary
first_rc=${PIPESTATUS[0]}
if [ "$first_rc" -ne 0 ]; then
    echo "device_validate: the first step failed (rc $first_rc); no suite, no benchmarks"
    exit 1
fi

suite_timeout=${SUITE_TIMEOUT:-360}
if [ "$suite_timeout" -gt 0 ]; then
    # At most the time left before DEADLINE (less 10 s for the summaries).
    left=$((deadline - (SECONDS - t0) - 10))
    [ "$left" -lt "$suite_timeout" ] && suite_timeout=$left
    echo "device_validate: the suite with ${suite_timeout}s"
    OUT=$base/suite STEPS=test TEST_TIMEOUT=$suite_timeout \
        DEADLINE=$((deadline - (SECONDS - t0))) bash scripts/device_run.sh 2>&1 | summary
fi

left=$((deadline - (SECONDS - t0)))
if [ -n "${EXTRA_STEPS:-}" ]; then
    if [ "$left" -lt 30 ]; then
        echo "device_validate: ${left}s left before DEADLINE=$deadline: no extra steps"
    else
        OUT=$base/extra STEPS=$EXTRA_STEPS DEADLINE=$left bash scripts/device_run.sh 2>&1 | summary
    fi
fi
echo "device_validate: done after $((SECONDS - t0))s"
