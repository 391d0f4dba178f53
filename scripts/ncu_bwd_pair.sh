#!/usr/bin/env bash
# ncu of one backward (NCU_MODE=fwd: one forward) of flashattn_cu and one of FlashAttention-4 on
# the same shape (scripts/ncu_bwd_pair.py; bf16, the benchmark's shapes), their details in $OUT:
# ncu_<mode>_pair_<backend>_details.txt (SOL, scheduler, warp states, pipes, memory tables of every
# kernel of the call: the backward's preprocess, main kernel and postprocess), and
# ncu_<mode>_pair_digest.txt, the longest kernel of each side by side (scripts/ncu_digest.py; its
# --all form in ncu_<mode>_pair_digest_all.txt). Device only, the second call of
# the FA4 protocol (../shared/tools/fa4_anchor.sh: the first call copied .fa4b/part_ab to
# /tmp/fa4parts and built the extension; this one carries .fa4a):
#   NCU_DIM=64 NCU_SEQLEN=16384 NCU_CAUSAL=1 OUT=/tmp/o bash scripts/ncu_bwd_pair.sh
#   NCU_MODE=fwd NCU_DIM=128 NCU_SEQLEN=8192 NCU_CAUSAL=1 OUT=/tmp/o bash scripts/ncu_bwd_pair.sh
set -u -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
OUT=${OUT:-./ncu_out}
WORK=${WORK:-/tmp/ncu_bwd_pair}
mkdir -p "$OUT" "$WORK"
if [ -f .fa4a/part_aa ] && [ -f /tmp/fa4parts/part_ab ] && [ ! -d /tmp/fa4/flash_attn ]; then
    cp .fa4a/part_aa /tmp/fa4parts/ && mkdir -p /tmp/fa4 &&
        cat /tmp/fa4parts/part_* | xz -d | tar -x -C /tmp/fa4
fi
mode=${NCU_MODE:-bwd}
shape=(--mode "$mode" --dim "${NCU_DIM:-64}" --seqlen "${NCU_SEQLEN:-16384}" --causal "${NCU_CAUSAL:-1}")
digest=()
for backend in flashattn_cu fa4; do
    extra=()
    [ "$backend" = fa4 ] && extra=(env PYTHONPATH=/tmp/fa4/nvidia_cutlass_dsl/dsl_packages:/tmp/fa4)
    # ncu's own output kept: at 13ce393 the d 64 run of flashattn_cu left no report and the
    # call's tail did not say why.
    "${extra[@]}" ncu --profile-from-start off --set full -f -o "$WORK/$backend" \
        python3 scripts/ncu_bwd_pair.py --backend "$backend" "${shape[@]}" \
        > "$OUT/ncu_${mode}_pair_${backend}.log" 2>&1 || {
        echo "ncu_bwd_pair: $backend failed (exit $?); the end of its log:"
        tail -n 20 "$OUT/ncu_${mode}_pair_${backend}.log"
        continue
    }
    ncu -i "$WORK/$backend.ncu-rep" --print-details all > "$OUT/ncu_${mode}_pair_${backend}_details.txt" 2>&1
    digest+=("$backend=$OUT/ncu_${mode}_pair_${backend}_details.txt")
done
if [ ${#digest[@]} -gt 0 ]; then
    python3 scripts/ncu_digest.py "${digest[@]}" > "$OUT/ncu_${mode}_pair_digest.txt" 2>&1
    python3 scripts/ncu_digest.py --all "${digest[@]}" > "$OUT/ncu_${mode}_pair_digest_all.txt" 2>&1
    cat "$OUT/ncu_${mode}_pair_digest.txt"
fi
ls -la "$OUT"
