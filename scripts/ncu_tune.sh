#!/usr/bin/env bash
# ncu on one torch-free tuning harness's kernels (scripts/ncu_fwd90.sh, ncu_bwd90.sh): builds
# HARNESS (a benchmarks/tune/*.cu, with NVCC_FLAGS), profiles the kernels whose mangled name
# matches REGEX with --set full while it runs with ARGS, and writes into $OUT the SOL / scheduler /
# warp-state / pipe-utilisation tables (PREFIX_details.txt) and the per-instruction SASS source
# view with its stall samples (PREFIX_source.csv.gz). Device only; from the repository root:
#   OUT=/tmp/o bash scripts/ncu_tune.sh HARNESS REGEX PREFIX [ARGS...]
# NCU_BIN: an already built harness to profile instead (e.g. device_run.sh's tune_bwd build in
# /tmp/flashattn_cu_run; built without -lineinfo, so the source view has no CUDA lines).
set -u -o pipefail
harness=$1 regex=$2 prefix=$3
shift 3
name=$(basename "$harness" .cu)
OUT=${OUT:-./ncu_out}
WORK=${WORK:-/tmp/ncu_$name}
mkdir -p "$OUT" "$WORK"
bin=${NCU_BIN:-$WORK/$name}
if [ -z "${NCU_BIN:-}" ]; then
    # shellcheck disable=SC2086
    nvcc -std=c++17 -O3 --use_fast_math --expt-relaxed-constexpr -DFLASHATTN_CU_HAS_SM90A=1 \
        -gencode arch=compute_90a,code=sm_90a -Icsrc/include -Icsrc/flash -lineinfo ${NVCC_FLAGS:-} \
        "$harness" csrc/flash/tma_host.cu -o "$bin" || exit 1
fi
ncu --kernel-name-base mangled -k "regex:$regex" --set full \
    --import-source no -f -o "$WORK/rep" "$bin" "$@" || exit 1
ncu -i "$WORK/rep.ncu-rep" --print-details all > "$OUT/${prefix}_details.txt" 2>&1
ncu -i "$WORK/rep.ncu-rep" --page source --csv --print-source sass 2> "$OUT/${prefix}_source.err" |
    gzip > "$OUT/${prefix}_source.csv.gz"
ls -la "$OUT"
