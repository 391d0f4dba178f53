#!/usr/bin/env bash
# The lazy row reference's A/Bs in one device call (benchmarks/NOTES.md 12.79 item 8, 12.80
# item 0): the two torch-free harnesses built side by side, then each one's `lazy` mode, the
# library's running max (A) against the lazy reference (B) on the same calls, interleaved:
#   benchmarks/tune/tune_fwd90.cu (sm90a forward; d 64 / 128 / 256 long tiles at 4k-16k, the
#   short tiles at 1k, d 64's static ALiBi), outputs checked against the sm80 kernel;
#   benchmarks/tune/tune_fwd.cu (sm80 forward; the shipped d 64 / 128 / 256 tiles at 2k / 8k),
#   the two outputs compared.
# B / A time < 1: the lazy reference is faster. Device only, from the repository root:
#   OUT=/tmp/o bash scripts/device_lazy_ab.sh   (LAZY_SM80=0: the sm90a A/B alone; LAZY_TIMEOUT;
#   LAZY_MODES="lazy lazydyn": tune_fwd90's modes, `lazy` alone when unset, none when empty, any of
#   fwd90_lazy_modes.h's: lazy, lazydyn, window256, skipkept, sumswgmma, tailinexp and tailmods
#   (FwdTraits kTailInExp), twop (kTwoP), pairkv (kPairKV); LAZY_SM80_MODES: tune_fwd's, `lazy`
#   when unset, "skipkept" its kSkipKept A/B)
# The bitwise modes' (skipkept, tailinexp, tailmods, twop, pairkv) "NOT BITWISE" rows are echoed
# with the B/A ones.
# LAZY_STAGE=build builds the harnesses and stops; LAZY_STAGE=run runs the modes on the binaries
# already in WORK (scripts/device_validate_ab.sh builds beside the library's build, runs after),
# or packed there by scripts/pack_harness.sh (WORK=$PWD/build/tune_bin carried: no device build).
set -u -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
OUT=${OUT:-$PWD/device_out}
WORK=${WORK:-/tmp/lazy_ab}
mkdir -p "$OUT" "$WORK"
t0=$SECONDS
stage=${LAZY_STAGE:-all}  # build: the harnesses alone; run: their modes on the built ones
sm80=${LAZY_SM80:-1}  # LAZY_SM80=0: the sm90a forward's A/B alone
rc=0
if [ "$stage" != run ]; then
    nv=(nvcc -std=c++17 -O3 --use_fast_math --expt-relaxed-constexpr -DFLASHATTN_CU_HAS_SM90A=1
        -gencode arch=compute_90a,code=sm_90a -Icsrc/include -Icsrc/flash)
    "${nv[@]}" -DTUNE_FWD90_SERIAL_ONLY benchmarks/tune/tune_fwd90.cu csrc/flash/tma_host.cu \
        -o "$WORK/tune_fwd90" > "$OUT/tune_fwd90_build.log" 2>&1 &
    pid90=$!
    pid80=
    if [ "$sm80" != 0 ]; then
        "${nv[@]}" benchmarks/tune/tune_fwd.cu csrc/flash/tma_host.cu -o "$WORK/tune_fwd" \
            > "$OUT/tune_fwd_build.log" 2>&1 &
        pid80=$!
    fi
    failed() { echo "$1 build failed:"; grep -m 20 error "$OUT/$1_build.log"; rc=1; }
    wait $pid90 || failed tune_fwd90
    if [ -n "$pid80" ]; then
        wait $pid80 || failed tune_fwd
    fi
    echo "builds done after $((SECONDS - t0)) s"
    [ "$stage" = build ] && exit $rc
fi
# Harnesses packed here by scripts/pack_harness.sh (WORK=$PWD/build/tune_bin, carried): unpack.
for t in tune_fwd90 tune_fwd; do
    if [ -f "$WORK/$t.xz" ] && [ ! -x "$WORK/$t" ]; then
        xz -dk "$WORK/$t.xz" && chmod +x "$WORK/$t" && echo "$t: unpacked from $WORK/$t.xz"
    fi
done
if [ -x "$WORK/tune_fwd90" ]; then
    for mode in ${LAZY_MODES-lazy}; do  # LAZY_MODES="lazy lazydyn": the other instances too
        timeout "${LAZY_TIMEOUT:-240}" "$WORK/tune_fwd90" "$mode" 2>&1 |
            tee "$OUT/tune_fwd90_$mode.txt" | grep -E "B/A|WRONG|failed|NOT BITWISE"
        echo "tune_fwd90 $mode: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s"
    done
fi
if [ "$sm80" != 0 ] && [ -x "$WORK/tune_fwd" ]; then
    for mode in ${LAZY_SM80_MODES-lazy}; do  # LAZY_SM80_MODES="skipkept": tune_fwd's other A/B
        timeout "${LAZY_TIMEOUT:-240}" "$WORK/tune_fwd" "$mode" 2>&1 | tee "$OUT/tune_fwd_$mode.txt"
        echo "tune_fwd $mode: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s"
    done
fi
exit $rc
