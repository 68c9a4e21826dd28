#!/usr/bin/env bash
# Dev tool (not part of the product): issues 29 and 30's done-when figures restated on whichever card the
# device tool lends, for the rare call that gets the target card (an H200):
#
#   device tool:  command  bash scripts/device-targets.sh [STEP...]      carry  [".carry"]
#
# All four steps take about 11 minutes, more than the device's limit for one command, so run them as two calls
# on the same warm machine: `bash scripts/device-targets.sh modes one` (about 4.5 minutes; `one` alone took 55 s
# on an H100), then `... e2e mixed` (about 7). Unpack both targets.tar.gz into one folder here and
# `python3 -m bench.targets DIR` prints the whole table.
#
# STEP is one of (default: all four, in this order; each under its own limit):
#   modes  throughput at budget 65,536 and the FP8 text-only peak (bench.fp8_modes --requests 768, bf16 and
#          FP8 text-only, with the sm90 kernels as a mode of their own)           scripts/device-engine.sh
#   one    one 800-token request, FP8 text and bf16 (bench.one_request --reps 20)  scripts/device-engine.sh
#   e2e    through the broker at 25%, 70% and 120% of the measured capacity (bench.e2e --shares, FP8 text; the
#          last load saturates the service: its decisions/s over engine-only is the capacity through Kafka)
#   mixed  Kafka saturated while HTTP and a priority topic arrive (bench.e2e --mixed, FP8 text)
#   ahead  not one of the four: batching.launch_ahead's GPU tests, then bench.e2e at 70%, 70% with it on and
#          off on the same machine (about 7 minutes; BENCHMARKS.md, "Launching ahead, round twenty-three")
#   ahead_mixed  not one of the four: the mixed run (as `mixed`) with batching.launch_ahead on (about 2 minutes;
#          compare with a `mixed` step on the same machine)
# TARGETS_SM90=1 (default; 0: off) runs e2e and mixed with `--sm90`, the service's engine.sm90_experts.
# The device returns a handful of files, so every step writes under a work folder and the call's $OUT gets
# three: targets.tar.gz (everything, packed again after each step: a call cut short keeps what ran),
# targets.txt (`python3 -m bench.targets`: each target, its bound, the reading, met or not) and steps.log.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
out="${OUT:-$repo/bench-out/targets}"
work="${DEVICE_TARGETS_TMP:-/tmp/clef-targets}"
began=$SECONDS
rm -rf "$work"
mkdir -p "$work" "$out"
steps=("$@")
((${#steps[@]})) || steps=(modes one e2e mixed)
sm90=()
[[ "${TARGETS_SM90:-1}" == 1 ]] && sm90=(--sm90)

pack() {  # everything so far into $out; the summary from whatever ran
    tar -C "$work" -czf "$out/targets.tar.gz" .
    python3 -m bench.targets "$work" >"$out/targets.txt" 2>&1 || true
}
trap pack EXIT

step() {  # step NAME CMD...: one step, its output kept, never stopping the others
    local name=$1 rc=0
    shift
    echo "device-targets: $name from $((SECONDS - began)) s" | tee -a "$out/steps.log" >&2
    "$@" >"$work/$name.log" 2>&1 || rc=$?
    echo "device-targets: $name exit $rc at $((SECONDS - began)) s" | tee -a "$out/steps.log" >&2
    tail -n 3 "$work/$name.log" >>"$out/steps.log"
    pack
}

mixed_step() {  # mixed_step NAME [ARG...]: the mixed run (Kafka saturated, HTTP and a priority topic), ARGs added
    local name=$1
    shift
    step "$name" env OUT="$work/$name" bash scripts/device-e2e.sh --mixed --backlog-s 12 --seconds 40 \
        --fp8 text --deadline-s 200 --partitions 6 "${sm90[@]}" "$@"
}

for s in "${steps[@]}"; do
    case $s in
        modes)
            step modes env OUT="$work/modes" MODES_LIMIT=200 \
                MODES_ARGS="--requests 768 --modes bf16,fp8_text_only_attention ${sm90[*]}" \
                bash scripts/device-engine.sh modes ;;
        one)
            step one_fp8 env OUT="$work/one_fp8" ONE_LIMIT=110 ONE_ARGS="--fp8 text --reps 20" \
                bash scripts/device-engine.sh one
            step one_bf16 env OUT="$work/one_bf16" ONE_LIMIT=110 ONE_ARGS="--reps 20" \
                bash scripts/device-engine.sh one ;;
        e2e)
            step e2e env OUT="$work/e2e" bash scripts/device-e2e.sh --arrivals poisson --partitions 6 --fp8 text \
                --shares --rate 0.25,0.7,1.2 --seconds 40 --warmup-s 8 "${sm90[@]}" ;;
        mixed) mixed_step mixed ;;
        ahead)
            step ahead_tests env OUT="$work/ahead_tests" DEVICE_ENGINE_TMP="$work/ahead_engine" TESTS_LIMIT=100 \
                GPU_TESTS="tests/gpu/test_engine_gpu.py::test_batches_launched_ahead_give_their_answers_alone_cuda
                tests/gpu/test_engine_gpu.py::test_an_urgent_batch_between_layers_changes_no_answer_cuda" \
                bash scripts/device-engine.sh tests
            for mode in true false; do
                step "ahead_$mode" env OUT="$work/ahead_$mode" bash scripts/device-e2e.sh --arrivals poisson \
                    --partitions 6 --fp8 text --shares --rate 0.7,0.7 --seconds 25 --warmup-s 6 --deadline-s 150 \
                    "${sm90[@]}" --set "batching.launch_ahead=$mode"
            done ;;
        ahead_mixed) mixed_step mixed_ahead --set batching.launch_ahead=true ;;
        *) echo "device-targets: unknown step $s (modes, one, e2e, mixed, ahead, ahead_mixed)" >&2; exit 2 ;;
    esac
done
echo "device-targets: done after $((SECONDS - began)) s" >&2
