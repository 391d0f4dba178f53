#!/usr/bin/env bash
# ncu on the sm90a forward's tune_fwd90 "profile2" launches (plain against softcap on the
# library's static tiles; or MODE, e.g. "profile3": d = 64 plain against static ALiBi), through
# scripts/ncu_tune.sh: ncu_details.txt and ncu_source.csv.gz in $OUT. Device only; run from the
# repository root:
#   OUT=/tmp/o bash scripts/ncu_fwd90.sh [MODE]
NVCC_FLAGS=-DTUNE_FWD90_MODS2_ONLY exec bash "$(dirname "$0")/ncu_tune.sh" \
    benchmarks/tune/tune_fwd90.cu 4sm9010fwd_kernel ncu "${1:-profile2}"
