#!/usr/bin/env bash
# End-to-end demo on this machine, no GPU needed:
#   set-up -> local Apache Kafka broker -> tiny random-weight Clef-omni release -> `clef-router run`
#   -> sample alert events into alerts.in -> print the routed decisions -> stop everything cleanly.
# The tiny model has random weights: the routing is real, the answers are not meaningful.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
venv="$("$repo/scripts/setup.sh" | tail -n 1)"
export PATH="$venv/bin:$PATH"
say() { printf '[demo] %s\n' "$*" >&2; }

work="$(mktemp -d -t clef-demo-XXXXXX)"
broker_pid=""
service_pid=""

stop_pid() {  # stop_pid PID NAME: SIGTERM, wait up to 40 s, then SIGKILL
    local pid="$1" name="$2" i
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 0
    say "stopping $name"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 80; i++)); do
        kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
        sleep 0.5
    done
    say "$name did not stop within 40 s; killing it"
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
cleanup() {
    stop_pid "$service_pid" "clef-router run"
    stop_pid "$broker_pid" "kafka broker"
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

has_command() { clef-router "$@" --help >/dev/null 2>&1; }
# the service rejects CLEF_* variables that are not settings; these belong to the scripts
svc() { env -u CLEF_VENV -u CLEF_CACHE_DIR -u CLEF_DEBUG clef-router "$@"; }

# 1. broker
say "starting a local Apache Kafka broker"
clef-router kafka-local --topics alerts.in >"$work/broker.out" 2>"$work/broker.err" &
broker_pid=$!
for ((i = 0; i < 360; i++)); do
    if grep -q '^bootstrap=' "$work/broker.out" 2>/dev/null; then break; fi
    kill -0 "$broker_pid" 2>/dev/null || { cat "$work/broker.err" >&2; say "the broker failed to start"; exit 1; }
    sleep 0.5
done
bootstrap="$(sed -n 's/^bootstrap=//p' "$work/broker.out")"
[[ -n "$bootstrap" ]] || { say "the broker was not ready within 180 s"; exit 1; }
say "broker ready at $bootstrap ($(grep '^kafka_version=' "$work/broker.out"))"
export CLEF_KAFKA__BOOTSTRAP_SERVERS="$bootstrap"

# 2. tiny release
if ! has_command make-tiny-release || ! has_command run; then
    say "this checkout has no 'make-tiny-release'/'run' commands yet; the demo stops after the broker"
    exit 0
fi
say "writing a tiny random-weight release"
clef-router make-tiny-release "$work/tiny-release" >&2

# 3. service
http_port="$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
export CLEF_ENGINE__MODEL_PATH="$work/tiny-release" CLEF_ENGINE__DEVICE=cpu CLEF_ENGINE__DTYPE=float32
export CLEF_KAFKA__GROUP_ID="clef-demo" CLEF_HTTP__HOST=127.0.0.1 CLEF_HTTP__PORT="$http_port"
say "starting clef-router run (logs: $work/service.log)"
svc run >"$work/service.log" 2>&1 &
service_pid=$!
ready=0
for ((i = 0; i < 600; i++)); do
    kill -0 "$service_pid" 2>/dev/null || { tail -n 20 "$work/service.log" >&2; say "the service exited"; exit 1; }
    if python -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$http_port/readyz', timeout=2)" 2>/dev/null; then
        ready=1
        break
    fi
    sleep 0.5
done
((ready)) || { tail -n 20 "$work/service.log" >&2; say "the service was not ready within 300 s"; exit 1; }
say "service ready (http://127.0.0.1:$http_port)"

# 4. sample events
count=5
say "producing sample events to alerts.in"
if ! svc produce >&2; then
    say "'clef-router produce' failed; producing $count built-in sample events instead"
    python - "$bootstrap" <<'PY'
import asyncio, json, sys
from aiokafka import AIOKafkaProducer

EVENTS = [
    {"event_id": "demo-1", "service": "edge-lb", "summary": "packet loss 40% between POP and origin"},
    {"event_id": "demo-2", "service": "orders-db", "summary": "replication lag 900 s on replica 2"},
    {"event_id": "demo-3", "service": "auth", "summary": "500 suspicious logins from one ASN"},
    {"event_id": "demo-4", "service": "dc-fra1", "summary": "CRAC unit 3 failed, inlet temperature rising"},
    {"event_id": "demo-5", "service": "checkout", "summary": "deploy 4121 raised error rate to 12%"},
]

async def main() -> None:
    producer = AIOKafkaProducer(bootstrap_servers=sys.argv[1], acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for event in EVENTS:
            await producer.send_and_wait("alerts.in", json.dumps(event).encode(), key=event["event_id"].encode())
    finally:
        await producer.stop()

asyncio.run(asyncio.wait_for(main(), 60))
PY
fi

# 5. routed decisions
say "routed decisions (topic 'decisions'):"
python - "$bootstrap" <<'PY'
import asyncio, json, sys, time
from aiokafka import AIOKafkaConsumer

async def main() -> int:
    consumer = AIOKafkaConsumer("decisions", bootstrap_servers=sys.argv[1], group_id=None,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    seen, last, deadline = 0, time.monotonic(), time.monotonic() + 180
    try:
        while time.monotonic() < deadline and not (seen and time.monotonic() - last > 10):
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                for rec in records:
                    seen, last = seen + 1, time.monotonic()
                    d = json.loads(rec.value)
                    r = d.get("route", {})
                    key = rec.key.decode() if rec.key else "-"
                    print(f"{key:<12} department={r.get('department')} ({r.get('department_confidence')})"
                          f"  urgency={r.get('urgency_label')}  outage={r.get('outage')}")
    finally:
        await consumer.stop()
    print(f"{seen} decisions")
    return 0 if seen else 1

sys.exit(asyncio.run(main()))
PY
say "done; stopping"
