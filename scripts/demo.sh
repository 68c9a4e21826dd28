#!/usr/bin/env bash
# End-to-end demo on this machine, no GPU needed:
#   set-up -> local Apache Kafka broker -> tiny random-weight Clef-omni release -> `clef-router run` on the CPU
#   -> the sample alert events into alerts.in -> each event's decision: the route topic it went to and why.
# The tiny model has random weights: the routing is real, the answers are not meaningful (its confidences
# are low, so most events go to route.review).
# Every process it starts is stopped on success, on failure and on Ctrl-C (EXIT trap, by pid, then waited).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
# shellcheck source=scripts/env.sh
source "$repo/scripts/env.sh"
say() { printf '[demo] %s\n' "$*" >&2; }

work=""
broker_pid=""
service_pid=""
cleanup() {
    local rc=$?
    trap - INT TERM
    stop_pids "clef-router run=$service_pid" "kafka broker=$broker_pid"
    [[ -z "$work" ]] || rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT
trap 'exit 143' TERM

venv="$("$repo/scripts/setup.sh" | tail -n 1)"
export PATH="$venv/bin:$PATH"
work="$(mktemp -d -t clef-demo-XXXXXX)"

# 1. broker (a free port, so a broker already on 9092 does not get in the way)
say "starting a local Apache Kafka broker"
clef-router kafka-local --port 0 --topics alerts.in,decisions >"$work/broker.out" 2>"$work/broker.err" &
broker_pid=$!
for ((i = 0; i < 1800; i++)); do
    grep -q '^bootstrap=' "$work/broker.out" 2>/dev/null && break
    kill -0 "$broker_pid" 2>/dev/null || { cat "$work/broker.err" >&2; say "the broker failed to start"; exit 1; }
    sleep 0.1
done
bootstrap="$(sed -n 's/^bootstrap=//p' "$work/broker.out")"
[[ -n "$bootstrap" ]] || { say "the broker was not ready within 180 s"; exit 1; }
say "broker ready at $bootstrap ($(grep '^kafka_version=' "$work/broker.out"))"
export CLEF_KAFKA__BOOTSTRAP_SERVERS="$bootstrap"

# 2. tiny release
say "writing a tiny random-weight release"
clef-router make-tiny-release "$work/tiny-release" >/dev/null

# 3. service
http_port="$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
export CLEF_ENGINE__MODEL_PATH="$work/tiny-release" CLEF_ENGINE__DEVICE=cpu CLEF_ENGINE__DTYPE=float32
export CLEF_KAFKA__GROUP_ID="clef-demo" CLEF_HTTP__HOST=127.0.0.1 CLEF_HTTP__PORT="$http_port"
export CLEF_LOG_LEVEL=warning
say "starting clef-router run on the CPU (log: $work/service.log)"
clef-router run >"$work/service.log" 2>&1 &
service_pid=$!
ready=""
for ((i = 0; i < 3000; i++)); do
    kill -0 "$service_pid" 2>/dev/null || { tail -n 5 "$work/service.log" >&2; say "the service exited"; exit 1; }
    if python -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$http_port/readyz', timeout=2)" 2>/dev/null; then
        ready=1
        break
    fi
    sleep 0.1
done
[[ -n "$ready" ]] || { tail -n 5 "$work/service.log" >&2; say "the service was not ready within 300 s"; exit 1; }
say "service ready (http://127.0.0.1:$http_port: /readyz, /metrics, POST /v1/systemone)"

# 4. sample events
say "producing the sample events to alerts.in"
sent="$(clef-router produce --timeout 60)"
say "$sent"
count="$(sed -n 's/^sent \([0-9]*\) events.*/\1/p' <<<"$sent")"

# 5. each event's decision: the route topic it went to, and why
threshold="$(python -c 'from consumer.settings import load_settings; print(load_settings().routing.review_threshold)')"
say "decisions (key, event id -> route topic, why; review threshold $threshold):"
clef-router tail --from-beginning --follow --max "$count" --timeout 180
say "done"
