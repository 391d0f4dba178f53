#!/usr/bin/env bash
# Builds the torch-free tuning harnesses here (no GPU needed: nvcc 13.0, the device's), strips
# them and packs them with xz into build/tune_bin (ignored by git, ~1-2 MB each), so that a
# device call carries them (carry ["build/tune_bin"]) and spends no device time on their ~2 min
# builds:
#   bash scripts/pack_harness.sh                 # tune_fwd90 and tune_fwd (side by side)
#   bash scripts/pack_harness.sh tune_fwd90      # tune_fwd90 alone
# The builds are scripts/device_lazy_ab.sh's (LAZY_STAGE=build: one place for their nvcc lines);
# on the device it unpacks build/tune_bin/*.xz:
#   LAZY_STAGE=run WORK=$PWD/build/tune_bin LAZY_SM80=0 LAZY_MODES=tailmods bash scripts/device_lazy_ab.sh
# The binaries link cudart statically and need only the driver; they are not the extension (which
# is always built on the device against its torch). Session 71 ran tune_fwd90 this way.
set -eu -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=build/tune_bin
mkdir -p "$out"
case "${*:-all}" in
    all|"tune_fwd90 tune_fwd"|"tune_fwd tune_fwd90") targets=(tune_fwd90 tune_fwd) ;;
    tune_fwd90) targets=(tune_fwd90) ;;
    *) echo "pack_harness: '$*': no arguments (both harnesses) or tune_fwd90 (device_lazy_ab.sh" \
            "always builds tune_fwd90)"; exit 2 ;;
esac
sm80=0
[ ${#targets[@]} -eq 2 ] && sm80=1
OUT=$out WORK=$out LAZY_STAGE=build LAZY_SM80=$sm80 bash scripts/device_lazy_ab.sh ||
    { echo "pack_harness: a build failed; see $out/*_build.log"; exit 1; }
at="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- csrc benchmarks/tune || echo ' plus uncommitted changes')"
for t in "${targets[@]}"; do
    strip "$out/$t" && rm -f "$out/$t.xz" && xz -T1 -1 "$out/$t"
    echo "pack_harness: $out/$t.xz ($(du -h "$out/$t.xz" | cut -f1)) at $at"
done
