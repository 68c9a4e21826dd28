#!/usr/bin/env bash
# The compose smoke test (.ci/run runs it after scripts/test.sh): docker-compose.yml's `demo` profile built
# and run for real on this machine, which reaches no image registry:
#   1. installs Debian's docker.io and debootstrap when missing (root, apt-get);
#   2. starts a Docker daemon of its own (`dockerd --bridge=none --iptables=false`: no bridge, no NAT, no
#      private-range address; socket and state in a temporary folder, images in the cache) and stops it by
#      pid at the end, on failure and on Ctrl-C too;
#   3. builds the images: a Python 3.11 base with debootstrap (deploy/ci/base-image.sh, stand-in for
#      python:3.11-slim-bookworm), the Kafka stand-in (deploy/ci/kafka, for apache/kafka:4.4.0: the Maven
#      jars on Debian's Java 17), the Prometheus stand-in (deploy/ci/prometheus, for prom/prometheus: Debian's
#      package) and the project's own Dockerfile on that base; then that Dockerfile again with SM90_KERNELS=1,
#      compiling and loading the sm90 expert kernels in a container of it (nvcc needs no GPU);
#   4. runs `docker compose --profile demo up` with deploy/ci/compose.ci.yml (every service on the host's
#      network, 127.0.0.1 only, free ports, nothing published, no Grafana: it has no stand-in), waits for the
#      one-shot producer to exit 0 (polling the container, not `docker compose wait`), prints the decisions
#      demo-tail shows, checks `/readyz` and that Prometheus scrapes the service; then `down -v`.
# Everything cacheable stays outside the clone, in ${CLEF_CACHE_DIR:-~/.cache/clef-router}/docker: the base
# root file system (a tarball) and the daemon's data root (image layers: the installed pip wheels and the
# Java and Prometheus packages live in them), next to the Kafka jars. It prints the time of each step.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
# shellcheck source=scripts/env.sh
source "$repo/scripts/env.sh"
say() { printf '[compose-smoke] %s\n' "$*" >&2; }
began=$SECONDS
step() { say "== $* (at $((SECONDS - began)) s)"; }

[[ $(id -u) -eq 0 ]] || { say "needs root: it starts a Docker daemon of its own"; exit 1; }

cache="$clef_cache/docker"
run_dir=""
dockerd_pid=""
compose=()
compose_started=""
cleanup() {
    local rc=$?
    trap - INT TERM
    if [[ -n "$compose_started" ]]; then
        say "docker compose down -v"
        timeout 180 "${compose[@]}" down -v --remove-orphans --timeout 30 >&2 2>&1 || say "compose down failed"
    fi
    if [[ -n "$dockerd_pid" ]] && ((rc == 0)); then
        timeout 60 "$docker" image prune -f >/dev/null 2>&1 || true  # older builds of the project image
    fi
    stop_pids "dockerd=$dockerd_pid"
    if [[ -n "$run_dir" ]]; then
        if ((rc != 0)) && [[ -f "$run_dir/dockerd.log" ]]; then
            say "dockerd's last log lines:"
            tail -n 15 "$run_dir/dockerd.log" >&2 || true
        fi
        # dockerd leaves its network namespace file mounted in the exec root: unmount what is left
        # under the folder (innermost first), and never delete through a mount
        awk -v dir="$run_dir/" 'index($2, dir) == 1 {print $2}' /proc/mounts | sort -r \
            | while read -r mount; do umount -l "$mount" || true; done
        rm -rf --one-file-system "$run_dir" || say "could not remove $run_dir"
    fi
    say "took $((SECONDS - began)) s in all (exit $rc)"
    exit "$rc"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT
trap 'exit 143' TERM

# ---- 1. tools ----------------------------------------------------------------------------------------------
step "tools"
need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
if ((${#need[@]})); then
    say "installing ${need[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    timed 900 apt-get update -qq >&2
    timed 1800 apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi
# Debian's client matches Debian's daemon (a newer client elsewhere on PATH may want buildx)
docker=/usr/bin/docker
[[ -x "$docker" ]] || docker="$(command -v docker)"
export DOCKER_BUILDKIT=0  # the classic builder: `--network host` builds, no buildx needed
venv="$("$repo/scripts/setup.sh" | tail -n 1)"
compose_bin="$("$venv/bin/python" -c 'import compose, pathlib; print(pathlib.Path(compose.__file__).parent / "docker-compose")')"
jars="$("$venv/bin/python" -m devtools.kafka_jars --with-tools | tail -n 1)"
"$docker" --version >&2
"$compose_bin" version >&2

# ---- 2. our own Docker daemon --------------------------------------------------------------------------------
step "starting dockerd (--bridge=none --iptables=false)"
mkdir -p "$cache/data-root"
run_dir="$(mktemp -d /tmp/clef-docker-XXXXXX)"  # short: the socket path must stay under 108 bytes
dockerd --bridge=none --iptables=false --ip-masq=false \
    --data-root "$cache/data-root" --exec-root "$run_dir/exec" --pidfile "$run_dir/dockerd.pid" \
    --host "unix://$run_dir/docker.sock" >"$run_dir/dockerd.log" 2>&1 &
dockerd_pid=$!
export DOCKER_HOST="unix://$run_dir/docker.sock"
for ((i = 0; i < 600; i++)); do
    "$docker" version >/dev/null 2>&1 && break
    kill -0 "$dockerd_pid" 2>/dev/null || { say "dockerd exited"; exit 1; }
    sleep 0.1
done
"$docker" version --format 'docker daemon {{.Server.Version}} (API {{.Server.APIVersion}})' >&2 \
    || { say "dockerd did not answer within 60 s"; exit 1; }

# ---- 3. images ------------------------------------------------------------------------------------------------
step "base image (debootstrap; stand-in for python:3.11-slim-bookworm)"
key="$(cat deploy/ci/base-image.sh /usr/local/share/ca-certificates/*.crt 2>/dev/null | sha256sum | cut -c1-12)"
base="clef-ci/python:3.11-bookworm-$key"
if ! "$docker" image inspect "$base" >/dev/null 2>&1; then
    tarball="$cache/python3.11-bookworm-$key.tar"
    [[ -s "$tarball" ]] || deploy/ci/base-image.sh "$tarball"
    "$docker" import --change 'CMD ["/bin/bash"]' "$tarball" "$base" >/dev/null
fi
say "base: $base"

step "Kafka stand-in image (apache/kafka:4.4.0: Maven jars on Debian's Java 17)"
mkdir -p "$run_dir/kafka"
cp deploy/ci/kafka/* "$run_dir/kafka/"
mkdir "$run_dir/kafka/libs"
cp "$jars"/*.jar "$run_dir/kafka/libs/"
"$docker" build -q --network host --build-arg "BASE_IMAGE=$base" -t clef-ci/kafka-standin:4.4.0 "$run_dir/kafka" >&2

step "Prometheus stand-in image (prom/prometheus: Debian's package)"
"$docker" build -q --network host --build-arg "BASE_IMAGE=$base" -t clef-ci/prometheus-standin:bookworm \
    deploy/ci/prometheus >&2

step "project image (Dockerfile, PYTHON_IMAGE=$base)"
"$docker" build --network host --build-arg "PYTHON_IMAGE=$base" -t clef-router:latest . >"$run_dir/build.log" 2>&1 \
    || { tail -n 30 "$run_dir/build.log" >&2; say "docker build failed"; exit 1; }
grep -E '^Step [0-9]+/' "$run_dir/build.log" | sed 's/^/  /' >&2 || true
"$docker" images --format '  {{.Repository}}:{{.Tag}}  {{.Size}}' | grep -E 'clef-router|clef-ci' >&2 || true

step "project image with SM90_KERNELS=1, and the sm90 expert kernels compiled in it (no GPU needed to compile)"
"$docker" build --network host --build-arg "PYTHON_IMAGE=$base" --build-arg SM90_KERNELS=1 -t clef-router:sm90 . \
    >"$run_dir/build-sm90.log" 2>&1 || { tail -n 30 "$run_dir/build-sm90.log" >&2; say "docker build (sm90) failed"; exit 1; }
"$docker" images --format '  {{.Repository}}:{{.Tag}}  {{.Size}}' | grep -E 'clef-router:sm90' >&2 || true
sm90_out="$("$docker" run --rm --network host clef-router:sm90 python -c '
import time
from engine.kernels import moe_fp8_sm90
began = time.monotonic()
assert moe_fp8_sm90.toolchain_problem() is None, moe_fp8_sm90.toolchain_problem()
ext = moe_fp8_sm90.build(None)  # where the engine builds: torch per-user extensions folder
assert callable(ext.gate_up_fp8) and callable(ext.down_fp8)
print(f"  sm90 kernels compiled and loaded in the image in {time.monotonic() - began:.1f} s")
' 2>&1)" || { printf '%s\n' "$sm90_out" | tail -n 30 >&2; say "the sm90 kernels did not compile in clef-router:sm90"; exit 1; }
printf '%s\n' "$sm90_out" | grep -v 'No CUDA runtime is found' >&2
# the last line proves the whole program ran (a quote inside it would cut it short and still exit 0)
grep -q 'compiled and loaded in the image' <<<"$sm90_out" || { say "the sm90 check did not finish"; exit 1; }

# ---- 4. the compose demo profile ------------------------------------------------------------------------------
step "docker compose --profile demo up (CI override: host network, 127.0.0.1 only, no Grafana)"
read -r SMOKE_KAFKA_PORT SMOKE_KAFKA_EXTERNAL_PORT SMOKE_KAFKA_CONTROLLER_PORT SMOKE_HTTP_PORT SMOKE_PROMETHEUS_PORT \
    < <("$venv/bin/python" - <<'PY'
import socket
socks = [socket.socket() for _ in range(5)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
PY
)
export SMOKE_KAFKA_PORT SMOKE_KAFKA_EXTERNAL_PORT SMOKE_KAFKA_CONTROLLER_PORT SMOKE_HTTP_PORT SMOKE_PROMETHEUS_PORT
export SMOKE_PROMETHEUS_CONFIG="$run_dir/prometheus.yml"
cat >"$SMOKE_PROMETHEUS_CONFIG" <<EOF
# deploy/prometheus/prometheus.yml with the service on the host's loopback (compose smoke test)
global: {scrape_interval: 2s, evaluation_interval: 5s}
scrape_configs:
  - job_name: clef-router
    metrics_path: /metrics
    static_configs: [{targets: ["127.0.0.1:$SMOKE_HTTP_PORT"]}]
EOF
chmod 644 "$SMOKE_PROMETHEUS_CONFIG"
say "ports on 127.0.0.1: kafka $SMOKE_KAFKA_PORT, service $SMOKE_HTTP_PORT, prometheus $SMOKE_PROMETHEUS_PORT"
compose=("$compose_bin" -p clef-router-ci -f docker-compose.yml -f deploy/ci/compose.ci.yml --profile demo)
compose_started=1
# up -d returns once every service is started, each after its dependencies' conditions (kafka healthy, the
# topics and the tiny release written, the service ready); bounded
timed 900 "${compose[@]}" up -d --no-build --pull never >&2
"$docker" network ls --format '  network {{.Name}} ({{.Driver}})' >&2

step "waiting for demo-producer to exit"
producer="$("${compose[@]}" ps -a -q demo-producer)"
[[ -n "$producer" ]] || { say "no demo-producer container"; exit 1; }
state=""
for ((i = 0; i < 600; i++)); do  # polls the container itself: `compose wait` fails once it has exited
    state="$("$docker" inspect -f '{{.State.Status}} {{.State.ExitCode}}' "$producer")"
    [[ "$state" == exited* ]] && break
    sleep 0.5
done
"${compose[@]}" logs --no-color demo-producer >&2
[[ "$state" == "exited 0" ]] || { say "demo-producer: $state (want: exited 0)"; "${compose[@]}" ps -a >&2; exit 1; }

step "waiting for the decisions in demo-tail"
events="$(grep -c . consumer/samples/events.jsonl)"
seen=0
for ((i = 0; i < 300; i++)); do
    seen="$("${compose[@]}" logs --no-color --no-log-prefix demo-tail 2>/dev/null | grep -c -- ' -> route\.' || true)"
    ((seen >= events)) && break
    sleep 1
done
say "demo-tail printed $seen of $events decisions:"
"${compose[@]}" logs --no-color --no-log-prefix demo-tail | grep -- ' -> route\.' | sed 's/^/  /' >&2 || true
((seen >= events)) || { "${compose[@]}" logs --no-color --tail 20 clef-router-demo >&2; say "decisions missing"; exit 1; }

step "checking /readyz and Prometheus"
"$venv/bin/python" - <<PY
import json, time, urllib.request

with urllib.request.urlopen("http://127.0.0.1:$SMOKE_HTTP_PORT/readyz", timeout=5) as r:
    print(f"[compose-smoke] GET /readyz: {r.status} {r.read().decode()}", flush=True)
deadline = time.monotonic() + 90  # bounded: a few scrape intervals after the start
health = "none"
while time.monotonic() < deadline:
    with urllib.request.urlopen("http://127.0.0.1:$SMOKE_PROMETHEUS_PORT/api/v1/targets", timeout=5) as r:
        targets = json.load(r)["data"]["activeTargets"]
    health = ",".join(t["health"] for t in targets) or "none"
    if health == "up":
        break
    time.sleep(1)
print(f"[compose-smoke] Prometheus target clef-router: {health}", flush=True)
raise SystemExit(0 if health == "up" else 1)
PY
"${compose[@]}" ps -a --format 'table {{.Service}}\t{{.Status}}' >&2
say "compose smoke passed: $seen decisions, /readyz 200, Prometheus scraping, in $((SECONDS - began)) s"
