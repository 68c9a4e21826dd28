#!/usr/bin/env bash
# Dev tool (not part of the product): the start-up benchmark on the GPU machine, in one device call.
#
#   device tool:  command  bash scripts/device-startup.sh [loads|restart]     carry  [".carry"]
#
# Needs .carry/ built by scripts/device-carry.sh (JRE, broker jars, wheels; see device-e2e.sh). Writes the
# full-size random release in the published layout (`python -m bench.startup write`) to /dev/shm when it
# has room, else to /tmp, then:
#   loads    (default) the loader's GPU tests; three loads in fresh processes (engine.model.release twice with
#            8 and 16 readers, the old one-tensor-at-a-time read once); `clef-router serve` from spawn to
#            /readyz and its first answers, with a cold Triton cache and then warm
#   ready    the loader's and the engine's GPU tests (unless SKIP_GPU_TESTS is set); three loads in fresh
#            processes (read started before the build with 16 and 8 readers, read after the build);
#            `clef-router serve` from spawn to /readyz cold, then warm twice in the image's Python and twice
#            with only the product's dependency closure importable (`bench.closure_site`, `python -S`);
#            the engine bench's two headline rows on the engine from the release and on one built on the
#            GPU, same process (unless SKIP_ENGINE is set)
#   restart  where the import time goes (python -X importtime), `clef-router serve` cold and warm, then
#            `clef-router run` with a 3,000-event backlog, kill -9, restart; the engine bench's two headline
#            rows on the engine from the release and on one built on the GPU (same process)
# Results: $OUT/startup.jsonl (one JSON line per step) and each step's stderr tail in $OUT/*.log.
# The release is removed at the end, also on Ctrl-C.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
what="${1:-loads}"
tmp="${DEVICE_STARTUP_TMP:-/tmp/clef-startup}"
out="${OUT:-$repo/bench-out/startup}"
began=$SECONDS
[[ -f .carry/jre.tar.xz ]] || { echo "device-startup: no .carry/ (run scripts/device-carry.sh)" >&2; exit 1; }

need_gb=70
shm_gb=$(df -BG --output=avail /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9 || echo 0)
if (( ${shm_gb:-0} >= need_gb )); then release=/dev/shm/clef-fullsize; else release="$tmp/release"; fi
cleanup() {
    rm -rf "$release" "$tmp"
    # the device tool brings back few files: the step logs travel as one archive
    if compgen -G "$out/*.log" >/dev/null; then
        tar -C "$out" -czf "$out/logs.tgz" $(cd "$out" && ls ./*.log) && rm -f "$out"/*.log
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rm -rf "$tmp"
mkdir -p "$tmp/cache" "$out"
tar -C "$tmp" -xJf .carry/jre.tar.xz
tar -C "$tmp/cache" -xJf .carry/kafka-*.tar.xz
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$tmp/site" .carry/whl/*.whl
export PYTHONPATH="$tmp/site${PYTHONPATH:+:$PYTHONPATH}" CLEF_CACHE_DIR="$tmp/cache" PATH="$tmp/jre/bin:$PATH"
export PYTHONUNBUFFERED=1
# PYCACHE_PREFIX=1: one bytecode cache, written by the first step and read by the later ones, for an image
# whose packages ship without compiled bytecode and whose Python is told not to write any (the GPU machine's
# torch and sympy: PYTHONDONTWRITEBYTECODE, no __pycache__); a product image has it, as pip compiles at install
if [[ -n ${PYCACHE_PREFIX:-} ]]; then
    export PYTHONPYCACHEPREFIX="$tmp/pycache"
    unset PYTHONDONTWRITEBYTECODE
fi
{
    echo "device-startup: $what; unpacked in $((SECONDS - began)) s; release in $release (/dev/shm free ${shm_gb} GB)"
    nvidia-smi --query-gpu=name,memory.used,clocks.sm,power.draw --format=csv,noheader || true
    df -h /dev/shm /tmp | sed 's/^/  /'
    free -g | sed 's/^/  /'
    nproc
    # whether the image's packages come with compiled bytecode for this Python (a product image has it:
    # pip compiles at install) and whether a run could write it
    python3 - <<'PY' || true
import importlib.util, os, sys
for name in ("transformers", "torch", "sympy"):
    spec = importlib.util.find_spec(name)
    root = os.path.dirname(spec.origin) if spec and spec.origin else ""
    cache = os.path.join(root, "__pycache__")
    tag = sys.implementation.cache_tag
    pycs = [f for f in os.listdir(cache) if tag in f] if os.path.isdir(cache) else []
    print(f"{name}: {root} writable={os.access(root, os.W_OK)} {tag} pycs in its top folder={len(pycs)}")
print("PYTHONPYCACHEPREFIX", os.environ.get("PYTHONPYCACHEPREFIX"), "dontwrite", sys.dont_write_bytecode)
PY
} 2>&1 | tee "$out/machine.txt" >&2

step() {  # step NAME TIMEOUT ARGS...: one bench.startup command, its stderr tail kept in $OUT/NAME.log
    local name=$1 limit=$2 rc=0
    shift 2
    timeout -k 10 "$limit" python3 -m bench.startup "$@" --out "$out" --label "$name" 2>"$tmp/$name.err" || rc=$?
    tail -c 400000 "$tmp/$name.err" >"$out/$name.log"
    echo "device-startup: $name exit $rc at $((SECONDS - began)) s" >&2
    tail -n 3 "$tmp/$name.err" >&2
}

if [[ $what == loads || ( $what == ready && -z ${SKIP_GPU_TESTS:-} ) ]]; then
    # PyAV is missing there: bench.e2e's placeholder stands in (these tests read no media)
    timeout -k 10 240 python3 -c 'import sys, pytest; from bench.e2e import install_av_placeholder
install_av_placeholder(); sys.exit(pytest.main(sys.argv[1:]))' -q -m gpu -p no:cacheprovider \
        tests/gpu/test_release_gpu.py $([[ $what == ready ]] && echo tests/gpu/test_engine_gpu.py) \
        >"$out/gpu-tests.log" 2>&1 || echo "device-startup: GPU tests FAILED" >&2
    tail -n 3 "$out/gpu-tests.log" >&2
fi
step write 240 write --release "$release"
if [[ $what == loads ]]; then
    step load-8 90 load --release "$release" --workers 8
    step load-16 90 load --release "$release" --workers 16
    step load-legacy 150 load --release "$release" --legacy
    step serve-cold 150 serve --release "$release" --triton-cache "$tmp/triton"
    step serve-warm 120 serve --release "$release" --triton-cache "$tmp/triton"
elif [[ $what == ready ]]; then
    python3 -m bench.closure_site "$tmp/closure" >"$out/closure_site.json"
    PYTHONPATH="$PYTHONPATH:$tmp/closure" python3 -S -c 'import importlib.util as u
print({m: u.find_spec(m) is not None for m in ("sklearn", "torchvision", "accelerate", "torch", "transformers")})' \
        >"$out/closure_check.txt" 2>&1 || true
    if [[ -z ${SKIP_LOADS:-} ]]; then
        step load-16 90 load --release "$release" --workers 16
        step load-8 90 load --release "$release" --workers 8
        step load-after-build 90 load --release "$release" --workers 16 --no-early
    fi
    step serve-cold 150 serve --release "$release" --triton-cache "$tmp/triton"
    for i in $(seq "${SERVE_ROUNDS:-2}"); do
        step "serve-warm-$i" 100 serve --release "$release" --triton-cache "$tmp/triton"
        step "serve-closure-$i" 100 serve --release "$release" --triton-cache "$tmp/triton" --site "$tmp/closure"
    done
    [[ -n ${SKIP_ENGINE:-} ]] || step engine 150 engine --release "$release"
else
    python3 -X importtime -c 'import torch; from transformers import Qwen3OmniMoeConfig' 2>"$tmp/imp.txt" || true
    sort -t'|' -k2 -n -r "$tmp/imp.txt" >"$tmp/imp-sorted.txt" || true
    head -n 40 "$tmp/imp-sorted.txt" >"$out/importtime.txt" || true
    step serve-cold 150 serve --release "$release" --triton-cache "$tmp/triton"
    step serve-warm 100 serve --release "$release" --triton-cache "$tmp/triton"
    step restart 200 restart --release "$release" --triton-cache "$tmp/triton" --backlog 3000
    step engine 150 engine --release "$release"
fi
echo "device-startup: done in $((SECONDS - began)) s" >&2
