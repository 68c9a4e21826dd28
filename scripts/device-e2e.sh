#!/usr/bin/env bash
# Dev tool (not part of the product): the end-to-end benchmark on the GPU machine, in one device call.
#
#   device tool:  command  bash scripts/device-e2e.sh        carry  [".carry"]
#   here, CPU:    DEVICE_E2E_LOCAL=1 scripts/device-e2e.sh --engine tiny --rate 4 --seconds 10 ...
#
# Needs .carry/ built by scripts/device-carry.sh (JRE, broker jars, wheels). Unpacks the JRE and the jars
# under $DEVICE_E2E_TMP (default /tmp/clef-e2e, recreated), installs the wheels into a site folder there
# (no index, no dependencies), points CLEF_CACHE_DIR at the jars (devtools/kafka_jars.py: jar_dir() is
# $CLEF_CACHE_DIR/kafka-4.4.0) and PATH at the JRE, then runs `python3 -m bench.e2e --out $OUT` with any
# arguments given (defaults: full-size model, 10 s warm-up, then 25, 50, 75 and 90 events/s, 60 s each;
# about 5 minutes in all, bounded by bench.e2e's --deadline-s 400 and `timeout` below).
# DEVICE_E2E_LOCAL=1 skips the wheels (this machine's venv has the packages, for another Python).
# BENCH_TREE=.carry/base runs an earlier commit's packages (scripts/base-tree.sh) with the same set-up.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
tmp="${DEVICE_E2E_TMP:-/tmp/clef-e2e}"
out="${OUT:-$repo/bench-out/e2e}"
began=$SECONDS
[[ -f .carry/jre.tar.xz ]] || { echo "device-e2e: no .carry/ (run scripts/device-carry.sh; carry .carry)" >&2; exit 1; }

rm -rf "$tmp"
mkdir -p "$tmp/cache" "$out"
tar -C "$tmp" -xJf .carry/jre.tar.xz
tar -C "$tmp/cache" -xJf .carry/kafka-*.tar.xz
if [[ "${DEVICE_E2E_LOCAL:-0}" != 1 ]]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$tmp/site" .carry/whl/*.whl
    export PYTHONPATH="$tmp/site${PYTHONPATH:+:$PYTHONPATH}"
    # ninja (and the CUTLASS headers) from .carry/toolchain, for `--sm90`'s CUDA extension build
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$tmp/toolchain" .carry/toolchain/*.whl
    export PYTHONPATH="$tmp/toolchain:$PYTHONPATH" PATH="$tmp/toolchain/bin:$PATH"
fi
export CLEF_CACHE_DIR="$tmp/cache"
export PATH="$tmp/jre/bin:$PATH"
echo "device-e2e: unpacked in $((SECONDS - began)) s; java: $(command -v java), $(java -version 2>&1 | head -1)" >&2
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,clocks.sm,power.draw --format=csv,noheader >&2 || true

rc=0
# BENCH_TREE: run the bench (and the service it starts) from that folder's packages instead, e.g. an earlier
# commit's put in .carry/base by scripts/base-tree.sh, for a same-machine baseline
cd "${BENCH_TREE:-$repo}"
[[ -z "${BENCH_TREE:-}" ]] || echo "device-e2e: packages from $BENCH_TREE ($(cat COMMIT 2>/dev/null || echo '?'))" >&2
timeout -k 20 450 python3 -m bench.e2e --out "$out" "$@" 2>"$tmp/stderr.log" || rc=$?
cd "$repo"
tail -c 2000000 "$tmp/stderr.log" >"$out/stderr.log"  # the device returns files of 16 MiB at most
tail -n 20 "$tmp/stderr.log" >&2
echo "device-e2e: bench.e2e exit $rc after $((SECONDS - began)) s; files in $out: $(ls "$out" | tr '\n' ' ')" >&2
exit "$rc"
