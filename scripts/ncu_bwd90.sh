#!/usr/bin/env bash
# ncu on the sm90a backward's main kernel: tune_bwd90 "profile" (one backward of window (1024, 0)
# and one of causal, bf16, d 128, 16 heads, 16k): per kernel the SOL / scheduler / warp-state /
# pipe-utilisation tables (ncu_bwd_details.txt) and the per-instruction SASS source view with its
# stall samples (ncu_bwd_source.csv.gz), into $OUT. Device only; run from the repository root:
#   OUT=/tmp/o bash scripts/ncu_bwd90.sh
set -u -o pipefail
OUT=${OUT:-./ncu_out}
WORK=${WORK:-/tmp/ncu_bwd90}
mkdir -p "$OUT" "$WORK"
nvcc -std=c++17 -O3 --use_fast_math --expt-relaxed-constexpr -DFLASHATTN_CU_HAS_SM90A=1 \
    -gencode arch=compute_90a,code=sm_90a -Icsrc/include -Icsrc/flash -lineinfo \
    benchmarks/tune/tune_bwd90.cu csrc/flash/tma_host.cu -o "$WORK/tune_bwd90" || exit 1
ncu --kernel-name-base mangled -k regex:4sm9010bwd_kernel --set full \
    --import-source no -f -o "$WORK/rep" "$WORK/tune_bwd90" profile || exit 1
ncu -i "$WORK/rep.ncu-rep" --print-details all > "$OUT/ncu_bwd_details.txt" 2>&1
ncu -i "$WORK/rep.ncu-rep" --page source --csv --print-source sass 2> "$OUT/ncu_bwd_source.err" |
    gzip > "$OUT/ncu_bwd_source.csv.gz"
ls -la "$OUT"
