#!/usr/bin/env bash
# A/B of two source trees of the whole extension in one device call: A = the tree in .ab_base/
# (scripts/make_ab_base.sh COMMIT, carried: run(..., carry=[".ab_base"])), B = this working
# tree. Each is built in place (setup.py build_ext --inplace; no install), then
# benchmarks/bench.py runs against each in turn (PYTHONPATH = that tree, checked), AB_ROUNDS
# rounds in alternating order (A B, B A, ...), and scripts/ab_summary.py prints, for every shape
# and backend, the median time over the rounds of each side and B / A: the backends whose code
# is the same on both sides (sdpa_flash, sdpa_cudnn) measure the drift between the runs.
#
#   AB_HEAD_DIMS=64,128 AB_BENCH_ARGS="--quick --modes bwd --dims 64,128 --dtypes bf16
#       --seqlens 1024,4096,16384 --backends flashattn_cu_sm80,sdpa_flash" \
#       bash scripts/device_commit_ab.sh
#
# Knobs: AB_BASE (.ab_base), AB_ARCHS (FLASHATTN_CU_ARCHS of both builds, default 90a),
# AB_HEAD_DIMS (FLASHATTN_CU_HEAD_DIMS, default all), AB_ROUNDS (2), AB_BENCH_ARGS (bench.py's
# arguments; default: the quick backward at d 64 / 128, both kernel paths and SDPA flash),
# MAX_JOBS (16). Results (each run's table and JSON, the build logs, the summary) under $OUT/ab.
# Each build leaves its extension in its own tree (flashattn_cu/_C*.so, git-ignored); make the
# base afresh before carrying it (a locally built one is far over the tool's 64 MiB). Measured on
# this machine (2 cores, d 64 alone, 90a): the flow end to end with bench.py --cpu-smoke, builds
# 189 s / 128 s; on the device with MAX_JOBS=16 a full build takes ~95 s.
set -u -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
REPO=$PWD
OUT=${OUT:-$PWD/device_out}
AB=$OUT/ab
mkdir -p "$AB"
BASE=$(cd "${AB_BASE:-.ab_base}" 2>/dev/null && pwd) || {
    echo "device_commit_ab: no ${AB_BASE:-.ab_base} (scripts/make_ab_base.sh COMMIT, then carry it)"
    exit 2
}
PY=${PY:-python3}
t0=$SECONDS
label_b=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
label_a=$(cat "$BASE/COMMIT" 2>/dev/null || echo base)
export FLASHATTN_CU_ARCHS=${AB_ARCHS:-90a} MAX_JOBS=${MAX_JOBS:-16}
[ -n "${AB_HEAD_DIMS:-}" ] && export FLASHATTN_CU_HEAD_DIMS=$AB_HEAD_DIMS

build() {  # $1 side, $2 root
    local s=$SECONDS
    if (cd "$2" && "$PY" setup.py build_ext --inplace) > "$AB/build_$1.log" 2>&1; then
        echo "build $1 ($2): $((SECONDS - s)) s"
    else
        echo "build $1 failed after $((SECONDS - s)) s:"; grep -m 20 -E "error|Error" "$AB/build_$1.log"
        return 1
    fi
}
build A "$BASE" || exit 1
build B "$REPO" || exit 1

for side in A B; do  # each side's import must come from its own tree
    root=$BASE; [ "$side" = B ] && root=$REPO
    got=$(cd /tmp && PYTHONPATH=$root "$PY" -c "import flashattn_cu; print(flashattn_cu.__file__)" 2>&1)
    case "$got" in
        "$root"/*) echo "side $side imports $got" ;;
        *) echo "side $side imports '$got', not from $root"; exit 1 ;;
    esac
done

read -r -a bench_args <<< "${AB_BENCH_ARGS:---quick --modes bwd --dims 64,128 --dtypes bf16 --seqlens 1024,4096,16384 --backends flashattn_cu,flashattn_cu_sm80,sdpa_flash}"
rounds=${AB_ROUNDS:-2}
for r in $(seq 1 "$rounds"); do
    order="A B"; [ $((r % 2)) -eq 0 ] && order="B A"
    for side in $order; do
        root=$BASE label=$label_a; [ "$side" = B ] && root=$REPO label=$label_b
        s=$SECONDS
        PYTHONPATH=$root FLASHATTN_CU_COMMIT=$label "$PY" benchmarks/bench.py "${bench_args[@]}" \
            --no-decode --no-memory --no-plot --no-ceilings --out-dir "$AB" --name "ab_${side}_r$r" \
            > "$AB/bench_${side}_r$r.log" 2>&1 || { echo "bench $side round $r failed:"; tail -5 "$AB/bench_${side}_r$r.log"; exit 1; }
        echo "bench $side round $r: $((SECONDS - s)) s"
    done
done
"$PY" scripts/ab_summary.py "$AB" --a "$label_a" --b "$label_b" | tee "$AB/summary.md"
rc=${PIPESTATUS[0]}
echo "device_commit_ab: done after $((SECONDS - t0)) s (summary rc $rc)"
exit "$rc"
