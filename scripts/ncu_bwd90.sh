#!/usr/bin/env bash
# ncu on the sm90a backward's main kernel: tune_bwd90 "profile" (one backward of window (1024, 0)
# and one of causal, bf16, d 128, 16 heads, 16k), through scripts/ncu_tune.sh:
# ncu_bwd_details.txt and ncu_bwd_source.csv.gz in $OUT. Device only; from the repository root:
#   OUT=/tmp/o bash scripts/ncu_bwd90.sh
exec bash "$(dirname "$0")/ncu_tune.sh" benchmarks/tune/tune_bwd90.cu 4sm9010bwd_kernel ncu_bwd \
    profile
