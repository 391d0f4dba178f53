#!/usr/bin/env bash
# Builds the torch-free tuning harnesses here (no GPU needed: nvcc 13.0, the device's), strips
# them and packs them with xz into build/tune_bin (ignored by git, ~1 MB each), so that a device
# call carries them (carry ["build/tune_bin"]) and spends no device time on their ~2 min builds:
#   bash scripts/pack_harness.sh [tune_fwd90] [tune_fwd]      (default: both; 2 cores ~2 min each)
# then on the device (scripts/device_lazy_ab.sh unpacks build/tune_bin/*.xz into WORK):
#   LAZY_STAGE=run WORK=$PWD/build/tune_bin LAZY_SM80=0 LAZY_MODES=tailmods bash scripts/device_lazy_ab.sh
# The binaries link cudart statically and need only the driver; they are not the extension (which
# is always built on the device against its torch). Session 71 ran tune_fwd90 this way.
set -eu -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=build/tune_bin
mkdir -p "$out"
nv=(nvcc -std=c++17 -O3 --use_fast_math --expt-relaxed-constexpr -DFLASHATTN_CU_HAS_SM90A=1
    -gencode arch=compute_90a,code=sm_90a -Icsrc/include -Icsrc/flash)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(tune_fwd90 tune_fwd)
pids=()
for t in "${targets[@]}"; do
    case $t in
        tune_fwd90) extra=(-DTUNE_FWD90_SERIAL_ONLY) ;;
        tune_fwd) extra=() ;;
        *) echo "pack_harness: unknown harness '$t' (tune_fwd90 or tune_fwd)"; exit 2 ;;
    esac
    ( "${nv[@]}" "${extra[@]}" "benchmarks/tune/$t.cu" csrc/flash/tma_host.cu -o "$out/$t" \
          > "$out/$t.build.log" 2>&1 &&
      strip "$out/$t" && rm -f "$out/$t.xz" && xz -T1 -1 "$out/$t" &&
      echo "pack_harness: $out/$t.xz ($(du -h "$out/$t.xz" | cut -f1)) at $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- csrc benchmarks/tune || echo ' plus uncommitted changes')" ) &
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
[ $rc -ne 0 ] && echo "pack_harness: a build failed; see $out/*.build.log"
exit $rc
