#!/usr/bin/env bash
# ncu on the sm90a forward's tune_fwd90 "profile2" launches (plain against softcap on the
# library's static tiles): per kernel the SOL / scheduler / warp-state / pipe-utilisation tables
# (ncu_details.txt) and the per-instruction SASS source view with its stall samples
# (ncu_source.csv.gz, every kernel in turn), into $OUT. Device only; run from the repository root:
#   OUT=/tmp/o bash scripts/ncu_fwd90.sh
set -u -o pipefail
OUT=${OUT:-./ncu_out}
WORK=${WORK:-/tmp/ncu_fwd90}
mkdir -p "$OUT" "$WORK"
nvcc -std=c++17 -O3 --use_fast_math --expt-relaxed-constexpr -DFLASHATTN_CU_HAS_SM90A=1 \
    -gencode arch=compute_90a,code=sm_90a -Icsrc/include -Icsrc/flash -lineinfo \
    -DTUNE_FWD90_MODS2_ONLY benchmarks/tune/tune_fwd90.cu csrc/flash/tma_host.cu \
    -o "$WORK/tune_fwd90" || exit 1
ncu --kernel-name-base mangled -k regex:4sm9010fwd_kernel --set full \
    --import-source no -f -o "$WORK/rep" "$WORK/tune_fwd90" profile2 || exit 1
ncu -i "$WORK/rep.ncu-rep" --print-details all > "$OUT/ncu_details.txt" 2>&1
ncu -i "$WORK/rep.ncu-rep" --page source --csv --print-source sass 2> "$OUT/ncu_source.err" |
    gzip > "$OUT/ncu_source.csv.gz"
ls -la "$OUT"
