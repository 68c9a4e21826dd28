#!/usr/bin/env bash
# Dev tool (not part of the product): `bench.e2e_group` on the GPU machine, in one device call.
#
#   device tool:  command  bash scripts/device-group.sh [steady|fault]     carry  [".carry"]
#
# Needs .carry/ built by scripts/device-carry.sh (JRE, broker jars, wheels; see device-e2e.sh). Writes the
# full-size random release in the published layout (`python -m bench.startup write`) to /dev/shm (or /tmp)
# and levels its routers on the GPU (`python -m bench.level_release`), unless a levelled one is there from
# an earlier call on the same machine (KEEP_RELEASE=1 keeps it for the next call). Then, every child a
# `clef-router run` process on the release (FP8 text-only: `GROUP_FP8`, default text-only, so that two
# fit on one GPU), Poisson arrivals, 12 input partitions:
#   steady   (default) one process: a backlog of GROUP_CAPACITY_EVENTS (3,000) sent at once (its drain rate:
#            capacity through Kafka), then GROUP_RATES (default 40,80,110) for GROUP_SECONDS (20) each; then two
#            processes: on a machine with two GPUs one per GPU at twice the rates and backlog (the same load
#            per GPU), on one GPU both sharing it at the same totals (each step bounded by GROUP_STEADY_S, 300);
#            GROUP_SHARES=0.25,0.7 runs shares of each run's measured capacity instead of GROUP_RATES
#   fault    two processes (one per GPU where there are two, else sharing one) at GROUP_FAULT_RATE (60/s)
#            for 55 s; kill -9 of one at 10 s, restarted once the survivor holds its partitions;
#            at-least-once, then exactly-once
# GROUP_GPU_TESTS="tests/gpu/..." runs those GPU tests first (GROUP_GPU_TESTS_S bounds them, default 240 s).
# Results: $OUT/results.tgz (group.jsonl, group.txt and children.log of every step, the levelling lines and
# the machine's description). The release is removed at the end (also on Ctrl-C) unless KEEP_RELEASE=1.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
what="${1:-steady}"
tmp="${DEVICE_GROUP_TMP:-/tmp/clef-group}"
out="${OUT:-$repo/bench-out/group}"
began=$SECONDS
[[ -f .carry/jre.tar.xz ]] || { echo "device-group: no .carry/ (run scripts/device-carry.sh)" >&2; exit 1; }

need_gb=70
shm_gb=$(df -BG --output=avail /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9 || echo 0)
if [[ -d /dev/shm/clef-group-release ]] || (( ${shm_gb:-0} >= need_gb )); then
    release=/dev/shm/clef-group-release
else
    release=/tmp/clef-group-release
fi
results="$tmp/results"
cleanup() {
    [[ -n ${KEEP_RELEASE:-} ]] || rm -rf "$release"
    # the device tool brings back few files: everything travels as one archive
    if [[ -d $results ]]; then tar -C "$results" -czf "$out/results.tgz" . || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rm -rf "$tmp"
mkdir -p "$tmp/cache" "$results" "$out"
tar -C "$tmp" -xJf .carry/jre.tar.xz
tar -C "$tmp/cache" -xJf .carry/kafka-*.tar.xz
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$tmp/site" .carry/whl/*.whl
export PYTHONPATH="$tmp/site${PYTHONPATH:+:$PYTHONPATH}" CLEF_CACHE_DIR="$tmp/cache" PATH="$tmp/jre/bin:$PATH"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # the device notes
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/dev/shm/clef-group-triton}"
{
    echo "device-group: $what; unpacked in $((SECONDS - began)) s; release in $release (/dev/shm free ${shm_gb} GB)"
    nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,power.draw --format=csv,noheader || true
    free -g | sed 's/^/  /'
    nproc
} 2>&1 | tee "$results/machine.txt" >&2

log() { echo "device-group: $* at $((SECONDS - began)) s" | tee -a "$results/steps.txt" >&2; }

if [[ -n ${GROUP_GPU_TESTS:-} ]]; then
    # PyAV is missing there: bench.e2e's placeholder stands in (these tests read no media)
    rc=0
    timeout -k 10 "${GROUP_GPU_TESTS_S:-240}" python3 -c 'import sys, pytest; from bench.e2e import install_av_placeholder
install_av_placeholder(); sys.exit(pytest.main(sys.argv[1:]))' -q -m gpu -p no:cacheprovider $GROUP_GPU_TESTS \
        >"$results/gpu-tests.log" 2>&1 || rc=$?
    log "GPU tests ($GROUP_GPU_TESTS) exit $rc"
    tail -n 5 "$results/gpu-tests.log" >&2
fi
if [[ ! -f $release/WRITTEN ]]; then
    rm -rf "$release"
    rc=0
    timeout -k 10 240 python3 -m bench.startup write --release "$release" >"$results/write.jsonl" \
        2>"$tmp/write.err" || rc=$?
    tail -c 20000 "$tmp/write.err" >"$results/write.log"
    log "write exit $rc"
    (( rc == 0 )) || exit "$rc"
    touch "$release/WRITTEN"
fi
if [[ ! -f $release/LEVELLED ]]; then
    rc=0
    timeout -k 10 300 python3 -m bench.level_release "$release" --device cuda >"$results/level.jsonl" \
        2>"$tmp/level.err" || rc=$?
    tail -c 20000 "$tmp/level.err" >"$results/level.log"
    log "level exit $rc"
    tail -n 3 "$results/level.jsonl" >&2 || true
    (( rc == 0 )) || exit "$rc"
    touch "$release/LEVELLED"
else
    log "levelled release kept from an earlier call"
fi

group() {  # group NAME TIMEOUT ARGS...: one bench.e2e_group run into $results/NAME/
    local name=$1 limit=$2 rc=0
    shift 2
    mkdir -p "$results/$name"
    timeout -k 30 "$limit" python3 -m bench.e2e_group --engine release --release "$release" \
        --fp8 "${GROUP_FP8:-text-only}" --out "$results/$name" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" || rc=$?
    tail -c 200000 "$tmp/$name.err" >"$results/$name/stderr.log"
    log "$name exit $rc"
    [[ -f $results/$name/group.txt ]] && cat "$results/$name/group.txt" >&2
    tail -n 5 "$tmp/$name.err" >&2
}

rates="${GROUP_RATES:-40,80,110}"
seconds="${GROUP_SECONDS:-20}"
backlog="${GROUP_CAPACITY_EVENTS:-3000}"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
gpus=${gpus:-1}
# two GPUs: the second run puts one process on each at twice the rates (the same load per GPU); one GPU:
# both processes share it at the same total rates. NCCL is not used (the processes share nothing but the
# broker); NVLink multicast stays off (exported above, and the children inherit the environment).
if (( gpus >= 2 )); then
    rates2=$(python3 -c 'import sys; print(",".join(f"{2 * float(r):g}" for r in sys.argv[1].split(",")))' "$rates")
    backlog2=$((2 * backlog))
else
    rates2=$rates
    backlog2=$backlog
fi
shares=()
if [[ -n ${GROUP_SHARES:-} ]]; then  # rates as shares of each run's own capacity line
    rates=$GROUP_SHARES rates2=$GROUP_SHARES shares=(--shares)
fi
log "GPUs $gpus; one process at $rates, two at $rates2 ${shares[*]}"
if [[ $what == steady ]]; then
    group steady-1 "${GROUP_STEADY_S:-300}" --scenario steady --processes 1 --gpus 1 --rate "$rates" \
        --seconds "$seconds" --warmup-s 5 --drain-s 30 --capacity-events "$backlog" "${shares[@]}"
    group steady-2 "${GROUP_STEADY_S:-300}" --scenario steady --processes 2 --gpus "$(( gpus >= 2 ? 2 : 1 ))" \
        --rate "$rates2" --seconds "$seconds" --warmup-s 5 --drain-s 30 --capacity-events "$backlog2" "${shares[@]}"
else
    group fault-2 540 --scenario fault --processes 2 --gpus "$(( gpus >= 2 ? 2 : 1 ))" \
        --rate "${GROUP_FAULT_RATE:-60}" --seconds 55 --kill-at-s 10 --restart-after-s 0 --session-timeout-ms 6000 \
        --drain-s 40 --modes "${GROUP_MODES:-alo,eos}"
fi
log "done"
