#!/usr/bin/env bash
# Dev tool (not part of the product): the engine's GPU tests and benches on the GPU machine, in one device call.
#
#   device tool:  command  bash scripts/device-engine.sh STEP...      carry  [".carry"]
#
# STEP is one of: tests (pytest -m gpu over tests/gpu, or $GPU_TESTS, under $TESTS_LIMIT s), kernels
# (bench.moe_fp8, $KERNELS_ARGS appended, under $KERNELS_LIMIT s), modes
# (bench.fp8_modes, with $TILES_FROM when set and $MODES_ARGS appended), one (bench.one_request, $ONE_ARGS appended,
# under $ONE_LIMIT s),
# sizes (bench.batch_sizes, $SIZES_ARGS appended), il (bench.gate_up_il, $IL_ARGS appended), copy
# (bench.copy_probe, $COPY_ARGS appended), gemm (bench.fp8_gemm_probe --child), down (bench.fp8_down_probe,
# $DOWN_ARGS appended), head (bench.head_probe, $HEAD_ARGS appended), staging (bench.staging_probe,
# $STAGING_ARGS appended), cuda_ext (bench.cuda_ext_probe, with
# ninja and nvidia-cutlass from .carry/toolchain), sm90 (bench.gate_up_sm90_probe, the same toolchain, $SM90_ARGS
# appended, under $SM90_LIMIT s). Installs .carry's wheels into a site folder under /tmp (no
# index, no dependencies; built by scripts/device-carry.sh), runs each step under its own
# `timeout` with its stderr kept, and packs every result into $OUT/results.tar.gz beside the small ones (the
# device returns a handful of files). BENCH_TREE=.carry/base runs the bench steps on an earlier commit's
# packages (scripts/base-tree.sh; its tree has no tests/, so not the tests step). Results go to $OUT when set:
# two runs of this script in one device call (new tree, then BENCH_TREE) need an OUT each (OUT=$OUT/new ...),
# or the second's results.tar.gz and JSON files replace the first's.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
tmp="${DEVICE_ENGINE_TMP:-/tmp/clef-engine}"
out="${OUT:-$repo/bench-out/engine}"
began=$SECONDS
[[ -d .carry/whl ]] || { echo "device-engine: no .carry/ (run scripts/device-carry.sh; carry .carry)" >&2; exit 1; }
rm -rf "$tmp"
mkdir -p "$tmp/res" "$out"
trap 'rm -rf "$tmp/site"' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$tmp/site" .carry/whl/*.whl
export PYTHONPATH="$tmp/site${PYTHONPATH:+:$PYTHONPATH}"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,clocks.sm,power.draw --format=csv,noheader >&2 || true

run() {  # run NAME LIMIT CMD...: one step, its output in $tmp/res/NAME.log
    local name=$1 limit=$2 rc=0
    shift 2
    timeout -k 10 "$limit" "$@" >"$tmp/res/$name.log" 2>&1 || rc=$?
    echo "device-engine: $name exit $rc at $((SECONDS - began)) s" >&2
    tail -n 4 "$tmp/res/$name.log" >&2
    tar -C "$tmp/res" -czf "$out/results.tar.gz" .  # after every step: a call cut short keeps what ran
}

toolchain() {  # ninja and nvidia-cutlass (the CUTLASS/CuTe headers) from .carry/toolchain (scripts/device-carry.sh)
    [[ -d "$tmp/toolchain" ]] || python3 -m pip install -q --no-index --no-deps --no-compile --target "$tmp/toolchain" \
        "$repo"/.carry/toolchain/*.whl
}

# PyAV is missing there: bench.e2e's placeholder stands in for it (nothing run here decodes media)
# module NAME ARGS...: python3 -m NAME ARGS... with the placeholder installed first
module=(python3 -c 'import runpy, sys
from bench.e2e import install_av_placeholder
install_av_placeholder()
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)')

# BENCH_TREE: run every step from that folder's packages instead (an earlier commit's, put in .carry/base by
# scripts/base-tree.sh), for a same-machine baseline; the results are packed the same way
cd "${BENCH_TREE:-$repo}"
[[ -z "${BENCH_TREE:-}" ]] || echo "device-engine: packages from $BENCH_TREE ($(cat COMMIT 2>/dev/null || echo '?'))" >&2
for step in "$@"; do
    case $step in
        tests)
            # with the placeholder, the media tests fail for want of real PyAV
            toolchain  # ninja for the CUDA extension's tests
            PYTHONPATH="$tmp/toolchain:$PYTHONPATH" PATH="$tmp/toolchain/bin:$PATH" \
                run tests "${TESTS_LIMIT:-300}" python3 -c 'import sys, pytest; from bench.e2e import install_av_placeholder
install_av_placeholder(); sys.exit(pytest.main(sys.argv[1:]))' -q -s -m gpu -p no:cacheprovider ${GPU_TESTS:-tests/gpu} ;;
        kernels) run kernels "${KERNELS_LIMIT:-300}" "${module[@]}" bench.moe_fp8 --out "$tmp/res" ${KERNELS_ARGS:-} ;;
        modes)
            toolchain  # ninja, for --sm90
            PYTHONPATH="$tmp/toolchain:$PYTHONPATH" PATH="$tmp/toolchain/bin:$PATH" \
                run modes "${MODES_LIMIT:-540}" "${module[@]}" bench.fp8_modes --out "$tmp/res" ${TILES_FROM:+--tiles-from "$TILES_FROM"} ${MODES_ARGS:-} ;;
        one)
            toolchain  # ninja, for --sm90
            PYTHONPATH="$tmp/toolchain:$PYTHONPATH" PATH="$tmp/toolchain/bin:$PATH" \
                run one "${ONE_LIMIT:-300}" "${module[@]}" bench.one_request --out "$tmp/res" ${ONE_ARGS:-} ;;
        il) run il 300 "${module[@]}" bench.gate_up_il --out "$tmp/res" ${IL_ARGS:-} ;;
        sizes) run sizes 420 "${module[@]}" bench.batch_sizes --out "$tmp/res" ${SIZES_ARGS:-} ;;
        copy) run copy 120 "${module[@]}" bench.copy_probe ${COPY_ARGS:-} ;;
        gemm) run gemm 300 "${module[@]}" bench.fp8_gemm_probe --out "$tmp/res" --child ;;
        down) run down 300 "${module[@]}" bench.fp8_down_probe --out "$tmp/res" ${DOWN_ARGS:-} ;;
        head) run head 400 "${module[@]}" bench.head_probe --out "$tmp/res" ${HEAD_ARGS:-} ;;
        staging) run staging 300 "${module[@]}" bench.staging_probe --out "$tmp/res" ${STAGING_ARGS:-} ;;
        cuda_ext)
            toolchain
            PYTHONPATH="$tmp/toolchain:$PYTHONPATH" PATH="$tmp/toolchain/bin:$PATH" \
                run cuda_ext 500 python3 -m bench.cuda_ext_probe --out "$tmp/res" ;;
        sm90)
            toolchain
            PYTHONPATH="$tmp/toolchain:$PYTHONPATH" PATH="$tmp/toolchain/bin:$PATH" \
                run sm90 "${SM90_LIMIT:-300}" "${module[@]}" bench.gate_up_sm90_probe --out "$tmp/res" ${SM90_ARGS:-} ;;
        *) echo "device-engine: unknown step $step" >&2; exit 2 ;;
    esac
done
cd "$repo"
cp "$tmp"/res/*.jsonl "$tmp"/res/*.json "$out"/ 2>/dev/null || true
echo "device-engine: done after $((SECONDS - began)) s; files in $out: $(ls "$out" | tr '\n' ' ')" >&2
