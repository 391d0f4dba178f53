#!/usr/bin/env bash
# The one script to run on the GPU machine: build, check, test, benchmark, examples, sanitizers.
#
#   bash scripts/device_run.sh                                  # every step
#   STEPS=build,check,test bash scripts/device_run.sh           # a subset, in this fixed order:
#                                                               #   env,diag,build,check,test,bench,features,schedule,bwdstream,decode,example,cp,sanitize,sanitize_kv,tune_decode,tune_bwd,tune
#                                                               # (diag, not in the default set: the TORCH_CHECK
#                                                               #  crash diagnosis, scripts/diag_torch_check.py)
#   FLASHATTN_CU_COMMIT=abc1234 STEPS=build,bench BENCH_ARGS="--quick" bash scripts/device_run.sh
#
# Run from anywhere; it works in the repository root. Results go to $OUT (default ./device_out),
# kept to at most 8 files, 2 folders deep:
#   run.log          everything this script printed (also streamed to stdout)
#   build.log        the full pip/nvcc/ptxas output of the build
#   junit.xml        pytest's report
#   bench/<name>.md, .json, _fwd.png, _bwd.png   the benchmark (written as it goes)
#   extras.tar.gz    per-step logs, sanitizer reports, the training-curve PNG (refreshed after each step)
#
# Knobs (environment variables):
#   STEPS                 comma list of steps (default all: env,build,check,test,bench,example,cp,sanitize)
#   OUT, WORK             output folder; scratch folder (default /tmp/flashattn_cu_run)
#   PYTHON                interpreter (default python3)
#   FULL_BUILD=1          build setup.py's default archs; otherwise FLASHATTN_CU_ARCHS defaults to 90a
#   FLASHATTN_CU_ARCHS, FLASHATTN_CU_HEAD_DIMS, MAX_JOBS (16)   passed to setup.py
#   FLASHATTN_CU_PTXAS_VERBOSE (default 1)  registers/spills per kernel in build.log, summarised here
#   FLASHATTN_CU_COMMIT   commit shown in the benchmark header when git is unavailable here
#   PYTEST_ARGS           default "tests -q --durations=15"; PYTEST_X=1 adds -x; TEST_TIMEOUT bounds the step
#   BENCH_ARGS            extra benchmarks/bench.py flags (e.g. "--quick", "--dims 128");
#   BENCH_BUDGET          most seconds the bench may time shapes (default 420); it is also cut so that the
#                         steps after it fit before DEADLINE
#   DEADLINE              seconds after the start by which everything should be done (default 570: the
#                         device tool stops a command at 600 s); the bench and sanitizer runs shrink to fit
#   SAVE_SO=1             copy the built flashattn_cu/_C*.so to $OUT (if under 16 MiB), so that a later call
#                         on a fresh machine can carry it into flashattn_cu/ and skip the build
#   TRAIN_ARGS, LONG_ARGS extra flags for examples/train_gpt.py and examples/long_context.py
#   EXAMPLES              which examples the "example" step runs (default train_gpt,long_context,generate)
#   FEATURES_ARGS         flags for benchmarks/bench_features.py (step "features", not in the default
#                         set: varlen and sliding window against padded / causal); table in extras
#   SCHEDULE_ARGS         flags for benchmarks/bench_schedule.py (step "schedule", not in the default
#                         set: the sm90a forward's causal schedules, persistent and one CTA per tile,
#                         through the library against cuDNN); table in extras
#   BWDSTREAM_ARGS        flags for benchmarks/bench_bwd_stream.py (step "bwdstream", not in the default
#                         set: the sm90a backward with its dQ converted streamed against after the
#                         main kernel); table in extras
#   DECODE_SEQLEN_Q       seqlen_q values for benchmarks/bench_decode.py (step "decode", not in the default
#                         set; default "1"); tables (and benchmarks/plot_decode.py charts) in extras;
#                         DECODE_TIMEOUT bounds each run; DECODE_ARGS extra bench_decode.py flags
#                         (e.g. "--l2-flush memset");
#                         DECODE_APPEND=1 also runs each with --append (k, v and rotary per call)
#   SANITIZE_KV_TOOLS, SANITIZE_KV_K   step "sanitize_kv" (not in the default set): compute-sanitizer tools
#                         (default racecheck,memcheck) over SANITIZE_KV_FILE (default tests/test_kvcache.py)
#                         -k SANITIZE_KV_K
#   step "tune_bwd"       (not in the default set): builds and runs benchmarks/tune/tune_bwd90.cu (the
#                         sm90 backward's A/Bs; TUNE_BWD_ARGS: its mode and arguments (the modes are
#                         in the harness's header, e.g. "pdl 64,128"); several runs separated by
#                         ';', e.g. "pdl 128; profile 64"); logs in extras
#   step "tune_decode"    (not in the default set): builds and runs benchmarks/tune/tune_decode90.cu (the
#                         sm90 decode kernel's configurations; TUNE_TIMEOUT bounds it); log in extras;
#                         TUNE_DECODE_ARGS: its arguments ("timeline": the per-CTA stamps of the library
#                         configurations instead of the sweep; "persistent", "producers": A/Bs)
#   TUNE_MODES            step "tune" (not in the default set): builds benchmarks/tune/tune_fwd90.cu and
#                         mufu_rate.cu with nvcc (no torch) and runs tune_fwd90 once per mode (default
#                         "mods"; "-" runs only mufu_rate); outputs in extras (tune_<mode>.log);
#                         TUNE_TIMEOUT (default 300 s) bounds each mode; TUNE_NVCC_FLAGS extra nvcc flags
#                         (-DTUNE_FWD90_SHORT_ONLY compiles only the "short" mode's instances)
#   CP_NPROC, CP_ARGS     GPUs for examples/context_parallel.py (default: all visible) and its flags;
#                         its table goes into extras.tar.gz (context_parallel.md), RESULT lines to the summary
#   SANITIZE_TOOLS        default memcheck,racecheck,synccheck (initcheck also possible)
#   SANITIZE_ARGS         extra flags for scripts/sanitize_case.py; SANITIZE_TIMEOUT (default 150 s each)
#   SANITIZE_FILTER       e.g. "kns=flash" to instrument only kernels whose name contains it
#
# A failing step does not stop later ones; the exit status is 1 when any step failed.
set -u -o pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
REPO=$PWD
OUT=${OUT:-$REPO/device_out}
WORK=${WORK:-/tmp/flashattn_cu_run}
LOGS=$WORK/logs
PY=${PYTHON:-python3}
STEPS=${STEPS:-env,build,check,test,bench,example,cp,sanitize}
DEADLINE=${DEADLINE:-570}
SANITIZE_TOOLS=${SANITIZE_TOOLS:-memcheck,racecheck,synccheck}
export PYTHONUNBUFFERED=1
rm -rf "$LOGS"  # logs of an earlier call on a warm machine would be packed and summarised as this one's
mkdir -p "$OUT" "$LOGS"

RESULTS=()
N_PASS=0
N_FAIL=0
N_SKIP=0
BUILD_SECONDS=-

want() { [[ ",$STEPS," == *",$1,"* ]]; }

record() {  # record NAME pass|fail|skip SECONDS DETAIL
    RESULTS+=("$(printf '%-22s %-5s %5ss  %s' "$1" "$2" "$3" "$4")")
    case $2 in
        pass) N_PASS=$((N_PASS + 1)) ;;
        fail) N_FAIL=$((N_FAIL + 1)) ;;
        *) N_SKIP=$((N_SKIP + 1)) ;;
    esac
}

pack() {  # refresh extras.tar.gz so a run killed later still returns the logs so far
    tar -czf "$OUT/extras.tar.gz.tmp" -C "$WORK" logs 2>/dev/null && mv -f "$OUT/extras.tar.gz.tmp" "$OUT/extras.tar.gz"
}

run_step() {  # run_step NAME LOGFILE COMMAND...   (output to stdout and LOGFILE)
    local name=$1 log=$2
    shift 2
    echo
    echo "===== [$name] $(date -u +%H:%M:%S) $*"
    local t0=$SECONDS
    "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    local dt=$((SECONDS - t0))
    if [ "$rc" -eq 0 ]; then
        record "$name" pass "$dt" ""
    else
        record "$name" fail "$dt" "exit $rc, log ${log#"$WORK"/}"
    fi
    echo "===== [$name] exit $rc after ${dt}s"
    pack
    return "$rc"
}

step_env() {
    echo "===== [env] $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname)"
    nvidia-smi || echo "nvidia-smi failed"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,memory.used,memory.total \
        --format=csv 2>/dev/null
    "$PY" - <<'EOF'
import sys, platform
import torch
print(f"python {platform.python_version()} ({sys.executable})")
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
      f"GPU {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}")
for name in ("triton", "matplotlib", "numpy", "pytest"):
    try:
        mod = __import__(name)
        print(f"{name} {mod.__version__}")
    except Exception as exc:
        print(f"{name}: not importable ({type(exc).__name__})")
EOF
    local rc=$?
    command -v nvcc >/dev/null && nvcc --version | tail -n 2
    command -v compute-sanitizer >/dev/null && compute-sanitizer --version | head -n 2
    echo "cores $(nproc); $(free -g | awk '/Mem:/ {print "memory " $2 " GiB"}'); disk: $(df -h . | awk 'NR==2 {print $4 " free"}')"
    echo "flashattn_cu commit: $FLASHATTN_CU_COMMIT"
    return $rc
}

ptxas_summary() {  # registers / spills per kernel from the ptxas -v lines in build.log
    "$PY" - "$OUT/build.log" <<'EOF'
import re, subprocess, sys
text = open(sys.argv[1], errors="replace").read()
rows, name, arch = [], None, None
for line in text.splitlines():
    m = re.search(r"Compiling entry function '([^']+)' for '(sm_\w+)'", line)
    if m:
        name, arch = m.group(1), m.group(2)
        continue
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m and name:
        rows.append([name, arch, None, int(m.group(1)), int(m.group(2)), int(m.group(3))])
        continue
    m = re.search(r"Used (\d+) registers", line)
    if m and rows and rows[-1][0] == name and rows[-1][2] is None:
        rows[-1][2] = int(m.group(1))
if not rows:
    print("ptxas: no per-kernel report in build.log (FLASHATTN_CU_PTXAS_VERBOSE=0, or nothing recompiled)")
    sys.exit(0)
seen, unique = set(), []
for r in rows:
    if (r[0], r[1]) not in seen:
        seen.add((r[0], r[1]))
        unique.append(r)
try:
    names = subprocess.run(["c++filt"], input="\n".join(r[0] for r in unique), capture_output=True,
                           text=True, timeout=20).stdout.splitlines()
except Exception:
    names = [r[0] for r in unique]
spilling = sum(1 for r in unique if r[4] or r[5])
# ptxas's wgmma serialization notes (C7510-C7520: "wgmma.mma_async instructions are serialized
# due to ..."): each one is a kernel whose GEMMs lost their overlap, whatever its spills say.
serialized = sorted(set(re.findall(r"Performance Loss: (wgmma[^\n]*?) in the function '([^']+)'", text)))
print(f"ptxas: {len(unique)} kernels, {spilling} with spills, {len(serialized)} with wgmma serialized")
for why, fn in serialized:
    print(f"  SERIALIZED {fn[:100]}: {why[:120]}")
print(f"  {'arch':7} {'regs':>4} {'stack':>5} {'spill st':>8} {'spill ld':>8}  kernel")
for r, n in zip(unique, names):
    print(f"  {r[1]:7} {r[2] if r[2] is not None else '-':>4} {r[3]:>5} {r[4]:>8} {r[5]:>8}  {n[:110]}")
EOF
}

step_build() {
    if [ "${FULL_BUILD:-0}" != 1 ]; then
        export FLASHATTN_CU_ARCHS=${FLASHATTN_CU_ARCHS:-90a}
    fi
    export FLASHATTN_CU_PTXAS_VERBOSE=${FLASHATTN_CU_PTXAS_VERBOSE:-1}
    export MAX_JOBS=${MAX_JOBS:-16}
    echo
    echo "===== [build] $(date -u +%H:%M:%S) FLASHATTN_CU_ARCHS=${FLASHATTN_CU_ARCHS:-<setup.py default>}" \
        "FLASHATTN_CU_HEAD_DIMS=${FLASHATTN_CU_HEAD_DIMS:-<all>} MAX_JOBS=$MAX_JOBS -> $OUT/build.log"
    local t0=$SECONDS rc
    {
        echo "FLASHATTN_CU_ARCHS=${FLASHATTN_CU_ARCHS:-} FLASHATTN_CU_HEAD_DIMS=${FLASHATTN_CU_HEAD_DIMS:-} MAX_JOBS=$MAX_JOBS"
        time "$PY" -m pip install --no-build-isolation --no-deps --no-index -e . -v
    } > "$OUT/build.log" 2>&1
    rc=$?
    BUILD_SECONDS=$((SECONDS - t0))
    if [ $rc -eq 0 ]; then
        tail -n 4 "$OUT/build.log"
        "$PY" -c "import flashattn_cu; print('import ok:', flashattn_cu.__file__)" || rc=$?
        if [ "${SAVE_SO:-0}" = 1 ]; then
            local so
            for so in flashattn_cu/_C*.so; do
                if [ -f "$so" ] && [ "$(stat -c %s "$so")" -lt $((16 * 1024 * 1024)) ]; then
                    cp "$so" "$OUT/" && echo "saved $so to \$OUT ($(du -h "$so" | cut -f1))"
                else
                    echo "SAVE_SO: $so missing or over 16 MiB, not saved"
                fi
            done
        fi
    else
        echo "--- build failed; errors from build.log:"
        grep -nE "error|Error|FAILED" "$OUT/build.log" | grep -v "Werror" | head -n 40
        echo "--- last lines of build.log:"
        tail -n 40 "$OUT/build.log"
    fi
    ptxas_summary 2>&1 | tee "$LOGS/ptxas.txt" | head -n 60
    if [ $rc -eq 0 ]; then record build pass "$BUILD_SECONDS" "archs ${FLASHATTN_CU_ARCHS:-default}"; else
        record build fail "$BUILD_SECONDS" "exit $rc, see build.log"; fi
    echo "===== [build] exit $rc after ${BUILD_SECONDS}s"
    pack
}

junit_counts() {
    "$PY" - "$OUT/junit.xml" <<'EOF' 2>/dev/null
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
get = lambda key: sum(int(s.get(key, 0)) for s in suites)
tests, failures, errors, skipped = get("tests"), get("failures"), get("errors"), get("skipped")
# pytest's junit counts an expected failure (xfail) as skipped: told apart here
xfailed = sum(1 for case in root.iter("testcase")
              if any(c.get("type") == "pytest.xfail" for c in case.findall("skipped")))
print(f"{tests - failures - errors - skipped} passed, {failures} failed, {errors} errors, "
      f"{skipped - xfailed} skipped" + (f", {xfailed} xfailed" if xfailed else ""))
EOF
}

main() {
    echo "device_run: STEPS=$STEPS OUT=$OUT WORK=$WORK ($(date -u '+%Y-%m-%d %H:%M:%S UTC'))"
    # The device tool's copy of the tree carries the .git of the last landed commit, not the tree's:
    # pass FLASHATTN_CU_COMMIT for the tree's commit; without it the label says when the library
    # sources differ from the commit git names ("+changes"), so a table is never silently mislabelled.
    if [ -z "${FLASHATTN_CU_COMMIT:-}" ]; then
        FLASHATTN_CU_COMMIT=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
        if [ "$FLASHATTN_CU_COMMIT" != unknown ] &&
            [ -n "$(git -C "$REPO" status --porcelain -- csrc flashattn_cu setup.py 2>/dev/null)" ]; then
            FLASHATTN_CU_COMMIT+="+changes"
        fi
    fi
    export FLASHATTN_CU_COMMIT

    if want env; then
        local t0=$SECONDS
        if step_env 2>&1 | tee "$LOGS/env.log"; then record env pass $((SECONDS - t0)) ""; else
            record env fail $((SECONDS - t0)) "torch not importable?"; fi
    fi

    if want diag; then
        run_step diag "$LOGS/diag.log" "$PY" scripts/diag_torch_check.py
    fi

    want build && step_build

    if want check; then
        run_step check "$LOGS/check.log" "$PY" -m flashattn_cu check
    fi

    if want test; then
        local -a pytest_args extra=()
        read -r -a pytest_args <<< "${PYTEST_ARGS:-tests -q --durations=15}"
        [ "${PYTEST_X:-0}" = 1 ] && extra+=(-x)
        rm -f "$OUT/junit.xml"
        # TEST_TIMEOUT (seconds, default 0: none) bounds the test step: a kernel that hangs
        # leaves the later steps their time
        run_step test "$LOGS/pytest.log" timeout "${TEST_TIMEOUT:-0}" "$PY" -m pytest "${pytest_args[@]}" "${extra[@]}" -p no:cacheprovider \
            --junitxml="$OUT/junit.xml"
        [ -f "$OUT/junit.xml" ] && echo "pytest: $(junit_counts)"
    fi

    if want bench; then
        local -a bench_args
        read -r -a bench_args <<< "${BENCH_ARGS:-}"
        # leave time for the steps after the bench: examples ~90 s, sanitizers ~60-150 s each
        local reserve=30 budget
        want example && reserve=$((reserve + 100))
        want cp && reserve=$((reserve + 90))
        want sanitize && reserve=$((reserve + 120))
        budget=$((DEADLINE - SECONDS - reserve))
        [ "$budget" -gt "${BENCH_BUDGET:-420}" ] && budget=${BENCH_BUDGET:-420}
        if [ "$budget" -lt 45 ]; then
            echo "bench skipped: only ${budget}s left before DEADLINE=$DEADLINE (run it in a call of its own)"
            record bench skip 0 "no time left before DEADLINE"
        else
            run_step bench "$LOGS/bench.log" "$PY" benchmarks/bench.py --out-dir "$OUT/bench" \
                --time-budget "$budget" "${bench_args[@]}"
        fi
    fi

    if want features; then
        local -a features_args
        read -r -a features_args <<< "${FEATURES_ARGS:-}"
        run_step features "$LOGS/features.log" "$PY" benchmarks/bench_features.py \
            --out "$LOGS/features.md" "${features_args[@]}"
    fi

    if want schedule; then
        local -a schedule_args
        read -r -a schedule_args <<< "${SCHEDULE_ARGS:-}"
        run_step schedule "$LOGS/schedule.log" "$PY" benchmarks/bench_schedule.py \
            --out "$LOGS/schedule.md" "${schedule_args[@]}"
    fi

    if want bwdstream; then
        local -a bwdstream_args
        read -r -a bwdstream_args <<< "${BWDSTREAM_ARGS:-}"
        run_step bwdstream "$LOGS/bwd_stream.log" "$PY" benchmarks/bench_bwd_stream.py \
            --out "$LOGS/bwd_stream.md" "${bwdstream_args[@]}"
    fi

    if want decode; then
        local sq
        for sq in ${DECODE_SEQLEN_Q:-1}; do
            # shellcheck disable=SC2086  # DECODE_ARGS: extra flags, word-split on purpose
            run_step "decode:q$sq" "$LOGS/decode_q$sq.log" timeout "${DECODE_TIMEOUT:-0}" "$PY" benchmarks/bench_decode.py \
                --seqlen-q "$sq" --out "$LOGS/decode_q$sq.md" ${DECODE_ARGS:-}
            # The chart (benchmarks/plot_decode.py; matplotlib, no GPU); a missing plot fails no step.
            [ -f "$LOGS/decode_q$sq.md" ] && "$PY" benchmarks/plot_decode.py "$LOGS/decode_q$sq.md" \
                --out "$LOGS/decode_q$sq.png" > /dev/null 2>&1
            if [ "${DECODE_APPEND:-0}" = 1 ]; then
                run_step "decode:q$sq:append" "$LOGS/decode_q${sq}_append.log" timeout "${DECODE_TIMEOUT:-0}" \
                    "$PY" benchmarks/bench_decode.py --seqlen-q "$sq" --append --out "$LOGS/decode_q${sq}_append.md"
            fi
        done
    fi

    if want example; then
        local -a train_args long_args
        read -r -a train_args <<< "${TRAIN_ARGS:-}"
        read -r -a long_args <<< "${LONG_ARGS:-}"
        local ex=",${EXAMPLES:-train_gpt,long_context,generate},"
        [[ $ex == *,train_gpt,* ]] && run_step example:train_gpt "$LOGS/train_gpt.log" "$PY" \
            examples/train_gpt.py --out "$LOGS/train_gpt_loss.png" "${train_args[@]}"
        [[ $ex == *,long_context,* ]] && run_step example:long_context "$LOGS/long_context.log" \
            "$PY" examples/long_context.py "${long_args[@]}"
        [[ $ex == *,generate,* ]] && run_step example:generate "$LOGS/generate.log" "$PY" \
            examples/generate.py
    fi

    if want cp; then
        local -a cp_args
        read -r -a cp_args <<< "${CP_ARGS:-}"
        local nproc=${CP_NPROC:-$(nvidia-smi -L 2>/dev/null | wc -l)}
        [ "$nproc" -ge 1 ] || nproc=1
        run_step "example:context_parallel" "$LOGS/context_parallel.log" \
            "$PY" -m torch.distributed.run --standalone --nproc-per-node "$nproc" \
            examples/context_parallel.py --out "$LOGS/context_parallel.md" "${cp_args[@]}"
    fi

    if want sanitize; then
        local cs
        cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
        if [ -z "$cs" ]; then
            echo "compute-sanitizer not found: sanitize skipped"
            record sanitize skip 0 "compute-sanitizer not found"
        else
            local -a san_args filter=()
            read -r -a san_args <<< "${SANITIZE_ARGS:-}"
            [ -n "${SANITIZE_FILTER:-}" ] && filter=(--kernel-name "$SANITIZE_FILTER")
            local tool limit
            for tool in ${SANITIZE_TOOLS//,/ }; do
                limit=$((DEADLINE - SECONDS - 10))
                [ "$limit" -gt "${SANITIZE_TIMEOUT:-150}" ] && limit=${SANITIZE_TIMEOUT:-150}
                if [ "$limit" -lt 20 ]; then
                    record "sanitize:$tool" skip 0 "no time left before DEADLINE"
                    continue
                fi
                # memcheck: every tensor its own allocation, so overruns hit unowned memory
                run_step "sanitize:$tool" "$LOGS/sanitize_$tool.log" \
                    timeout "$limit" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
                    "$cs" --tool "$tool" --error-exitcode 97 --print-limit 20 "${filter[@]}" \
                    "$PY" scripts/sanitize_case.py --quiet "${san_args[@]}"
            done
        fi
    fi

    if want sanitize_kv; then  # the kvcache kernels under compute-sanitizer, through their tests
        local cs tool tool_list
        cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
        tool_list=${SANITIZE_KV_TOOLS:-racecheck,memcheck}
        for tool in ${tool_list//,/ }; do
            [ -n "$cs" ] || { record "sanitize_kv:$tool" skip 0 "compute-sanitizer not found"; continue; }
            run_step "sanitize_kv:$tool" "$LOGS/sanitize_kv_$tool.log" \
                timeout "${SANITIZE_TIMEOUT:-150}" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
                "$cs" --tool "$tool" --error-exitcode 97 --print-limit 20 \
                "$PY" -m pytest -q -p no:cacheprovider "${SANITIZE_KV_FILE:-tests/test_kvcache.py}" \
                -k "${SANITIZE_KV_K:-test_paged_gather_page_sizes and 16-3 or test_packed_gqa_speculative and 4-causal}"
        done
    fi

    if want tune_decode; then  # torch-free sweep of the sm90 decode kernel's configurations
        run_step tune_decode:build "$LOGS/tune_decode_build.log" nvcc -std=c++17 -O3 --use_fast_math \
            --expt-relaxed-constexpr -DFLASHATTN_CU_HAS_SM90A=1 -gencode arch=compute_90a,code=sm_90a \
            -Icsrc/include -Icsrc/flash benchmarks/tune/tune_decode90.cu csrc/flash/tma_host.cu \
            csrc/flash/fwd/combine.cu -o "$WORK/tune_decode90" &&
            run_step tune_decode "$LOGS/tune_decode.log" timeout "${TUNE_TIMEOUT:-300}" "$WORK/tune_decode90" ${TUNE_DECODE_ARGS:-}
    fi

    if want tune_bwd; then  # torch-free A/B of the sm90 backward's tile order for windows
        run_step tune_bwd:build "$LOGS/tune_bwd_build.log" nvcc -std=c++17 -O3 --use_fast_math \
            --expt-relaxed-constexpr -DFLASHATTN_CU_HAS_SM90A=1 -gencode arch=compute_90a,code=sm_90a \
            -Icsrc/include -Icsrc/flash ${TUNE_BWD_NVCC_FLAGS:-} benchmarks/tune/tune_bwd90.cu \
            csrc/flash/tma_host.cu -o "$WORK/tune_bwd90" &&
            {
                # TUNE_BWD_ARGS: one run, or several separated by ';' ("pdl 128; profile 64")
                IFS=';' read -r -a bwd_runs <<< "${TUNE_BWD_ARGS:-}"
                [ "${#bwd_runs[@]}" -eq 0 ] && bwd_runs=("")
                local i=0 args
                for args in "${bwd_runs[@]}"; do
                    # shellcheck disable=SC2086
                    run_step "tune_bwd${args:+ $args}" "$LOGS/tune_bwd${i/#0/}.log" \
                        timeout "${TUNE_TIMEOUT:-300}" "$WORK/tune_bwd90" $args
                    i=$((i + 1))
                done
            }
    fi

    if want tune; then  # torch-free harnesses: kernel configurations and instruction rates
        local nv=(nvcc -std=c++17 -O3 --use_fast_math --expt-relaxed-constexpr -DFLASHATTN_CU_HAS_SM90A=1
                  -gencode arch=compute_90a,code=sm_90a -Icsrc/include -Icsrc/flash)
        # shellcheck disable=SC2206  # TUNE_NVCC_FLAGS: extra nvcc flags, word-split on purpose
        nv+=(${TUNE_NVCC_FLAGS:-})
        run_step tune:mufu_rate "$LOGS/tune_mufu_rate.log" bash -c \
            "nvcc -O3 -arch=sm_90a benchmarks/tune/mufu_rate.cu -o $WORK/mufu_rate && $WORK/mufu_rate"
        if [ "${TUNE_MODES:-mods}" != "-" ] &&
            run_step tune:build "$LOGS/tune_build.log" "${nv[@]}" benchmarks/tune/tune_fwd90.cu \
                csrc/flash/tma_host.cu -o "$WORK/tune_fwd90"; then
            local mode
            for mode in ${TUNE_MODES:-mods}; do
                # a barrier-protocol error would hang: TUNE_TIMEOUT bounds each mode
                run_step "tune:$mode" "$LOGS/tune_$mode.log" timeout "${TUNE_TIMEOUT:-300}" \
                    "$WORK/tune_fwd90" "$mode"
            done
        fi
    fi

    echo
    echo "===================== device_run summary ====================="
    printf '%s\n' "${RESULTS[@]}"
    echo "steps: $N_PASS passed, $N_FAIL failed, $N_SKIP skipped; build ${BUILD_SECONDS}s (archs ${FLASHATTN_CU_ARCHS:-default})"
    [ -f "$OUT/junit.xml" ] && echo "pytest: $(junit_counts)"
    [ -s "$LOGS/ptxas.txt" ] && head -n 1 "$LOGS/ptxas.txt"
    [ -f "$LOGS/check.log" ] && tail -n 3 "$LOGS/check.log"
    [ -f "$LOGS/bench.log" ] && grep '^SUMMARY' "$LOGS/bench.log" | grep -v '^SUMMARY key' | head -n 30
    [ -f "$LOGS/schedule.log" ] && grep '^SUMMARY' "$LOGS/schedule.log"
    [ -f "$LOGS/bwd_stream.log" ] && grep '^SUMMARY' "$LOGS/bwd_stream.log"
    grep -h '^RESULT' "$LOGS"/train_gpt.log "$LOGS"/long_context.log "$LOGS"/generate.log "$LOGS"/context_parallel.log \
        "$LOGS"/features.log 2>/dev/null
    for f in "$LOGS"/sanitize_*.log; do
        [ -f "$f" ] && echo "$(basename "$f" .log): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|SYNCCHECK SUMMARY|sanitize_case:' "$f" | tr '\n' ' ')"
    done
    pack
    local nfiles
    nfiles=$(find "$OUT" -type f | wc -l)
    [ "$nfiles" -gt 8 ] && echo "warning: $OUT holds $nfiles files; only 8 come back"
    [ "$N_FAIL" -eq 0 ]
}

: > "$OUT/run.log"
main 2>&1 | tee -a "$OUT/run.log"
exit "${PIPESTATUS[0]}"
