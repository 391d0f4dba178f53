#!/usr/bin/env bash
# SASS of the kernel instances of two source trees, compared instruction by instruction: the
# no-device check that a refactor left the machine code alone.
#
#   scripts/sass_compare.sh /path/to/base_tree [/path/to/new_tree]      # new tree: this checkout
#   INSTS="sm80/inst/fwd_hdim128_bf16.cu:80 sm90/inst/bwd_hdim128_bf16.cu:90a" scripts/sass_compare.sh base
#
# Each INSTS entry is an instance file under csrc/flash and the arch to build it for. Both trees
# are compiled with setup.py's nvcc flags (no torch: the instance files are torch-free). The
# SASS is normalized before the diff: addresses and the kernel names' namespaces are dropped
# (a kernel moving between namespaces is not a change), the instruction text and encodings are
# kept, so a moved kernel-parameter offset (c[0x0][...]) shows up. Prints one line per instance
# (identical / N lines differ) and exits 1 when any differs; the diffs are kept under $WORK.
# BASE_RENAME (optional): a sed -E script applied to the base tree's normalized SASS before the
# diff, for kernel names a change renames on purpose; only names should match it. E.g. template
# arguments removed: BASE_RENAME='s/((BwdTraits|BwdSplitTraits)ILi[0-9]+ELi[0-9]+)(ELb1)+EE/\1EE/'
set -u -o pipefail

BASE=${1:?usage: sass_compare.sh BASE_TREE [NEW_TREE]}
NEW=${2:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
WORK=${WORK:-/tmp/sass_compare}
INSTS=${INSTS:-"sm80/inst/fwd_hdim128_bf16.cu:80 sm80/inst/fwd_hdim64_fp16.cu:80
sm80/inst/bwd_hdim64_fp16.cu:80 sm80/inst/bwd_hdim128_bf16.cu:80 sm80/inst/bwd_hdim256_fp16.cu:80
sm90/inst/bwd_hdim128_bf16.cu:90a sm90/inst/bwd_hdim256_fp16.cu:90a sm90/inst/bwd_hdim64_bf16.cu:90a"}
JOBS=${JOBS:-2}
CUOBJDUMP=${CUOBJDUMP:-$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null || python3 -c "import triton, os; print(os.path.join(os.path.dirname(triton.__file__), \"backends/nvidia/bin/cuobjdump\"))" 2>/dev/null)}
[ -x "$CUOBJDUMP" ] || { echo "cuobjdump not found (set CUOBJDUMP)" >&2; exit 2; }
mkdir -p "$WORK"

sass_of() {  # sass_of TREE INST ARCH OUT
    local tree=$1 inst=$2 arch=$3 out=$4
    local src=$tree/csrc/flash/$inst
    [ -f "$src" ] || { echo "missing $src" > "$out"; return 0; }
    nvcc -O3 -std=c++17 --use_fast_math -lineinfo --expt-relaxed-constexpr \
        -I"$tree/csrc/include" -I"$tree/csrc/flash" \
        -DFLASHATTN_CU_HAS_SM90A=1 -gencode "arch=compute_$arch,code=sm_$arch" \
        -cubin -o "$out.cubin" "$src" 2> "$out.log" || { echo "compile failed: $out.log" > "$out"; return 0; }
    "$CUOBJDUMP" -sass "$out.cubin" | python3 -c "$NORMALIZE" > "$out"
}

# Per-kernel blocks, sorted by kernel name (instantiation order is not a change), with addresses
# and the namespaces inside mangled and plain names removed.
NORMALIZE='
import re, sys
blocks, cur = {}, None
for line in sys.stdin:
    line = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line).rstrip()
    line = re.sub(r"(NS_|_ZN12flashattn_cu)[0-9]+(sm80|sm90|backward|problem)", r"\1", line)
    line = re.sub(r"NS[0-9]*_", "NS_", line)
    line = re.sub(r"flashattn_cu::(sm80|sm90|backward|problem)::", "flashattn_cu::", line)
    if not line.strip():
        continue
    m = re.search(r"Function : (\S+)", line)
    if m:
        cur = m.group(1)
        blocks[cur] = []
    if cur is not None:
        blocks[cur].append(line)
for name in sorted(blocks):
    print("\n".join(blocks[name]))
'

status=0
pids=()
for entry in $INSTS; do
    inst=${entry%:*}
    arch=${entry##*:}
    tag=$(echo "$inst" | tr '/' '_' | sed 's/\.cu$//')_$arch
    ( sass_of "$BASE" "$inst" "$arch" "$WORK/$tag.base"; sass_of "$NEW" "$inst" "$arch" "$WORK/$tag.new" ) &
    pids+=($!)
    if [ "${#pids[@]}" -ge "$JOBS" ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
done
wait
for entry in $INSTS; do
    inst=${entry%:*}
    arch=${entry##*:}
    tag=$(echo "$inst" | tr '/' '_' | sed 's/\.cu$//')_$arch
    base=$WORK/$tag.base
    if [ -n "${BASE_RENAME:-}" ]; then
        sed -E "$BASE_RENAME" "$base" > "$base.renamed"
        base=$base.renamed
    fi
    if diff -q "$base" "$WORK/$tag.new" > /dev/null; then
        echo "identical  $inst (sm_$arch, $(wc -l < "$WORK/$tag.new") lines)"
    else
        diff "$base" "$WORK/$tag.new" > "$WORK/$tag.diff"
        echo "DIFFERS    $inst (sm_$arch): $(grep -c '^[<>]' "$WORK/$tag.diff") lines, $WORK/$tag.diff"
        status=1
    fi
done
exit $status
