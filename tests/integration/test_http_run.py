"""`clef-router run --stub-engine` with its HTTP server on a real broker: ready once partitions are assigned
and the broker answers, answers SystemOne requests on the shared batcher, exits 0 on SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from devtools.kafka_local import LocalKafka, free_port

ROOT = Path(__file__).resolve().parents[2]


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def test_run_serves_http_next_to_kafka(kafka_broker: LocalKafka, tmp_path: Path) -> None:
    prefix = f"httprun-{uuid.uuid4().hex[:6]}"
    port = free_port()
    env = {
        **os.environ,
        "CLEF_KAFKA__BOOTSTRAP_SERVERS": kafka_broker.bootstrap_servers,
        "CLEF_KAFKA__GROUP_ID": f"{prefix}.group",
        "CLEF_KAFKA__TOPIC_PARTITIONS": "1",
        "CLEF_TOPICS__INPUT": f'["{prefix}.in"]',
        "CLEF_TOPICS__DECISIONS": f"{prefix}.decisions",
        "CLEF_TOPICS__ROUTE_PREFIX": f"{prefix}.route.",
        "CLEF_TOPICS__REVIEW": f"{prefix}.route.review",
        "CLEF_TOPICS__UNROUTED": f"{prefix}.route.unrouted",
        "CLEF_TOPICS__DLQ": f"{prefix}.dlq",
        "CLEF_HTTP__PORT": str(port),
        "CLEF_LOG_LEVEL": "warning",
    }
    log = tmp_path / "run.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "consumer.cli", "run", "--stub-engine"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=out,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while get(base + "/readyz")[0] != 200:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.3)
        body = json.dumps({"state": "disk full", "questions": {"outage": {"type": "noul"}}}).encode()
        request = urllib.request.Request(base + "/v1/systemone", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=10) as r:
            assert r.status == 200
            assert r.headers["x-typesafe-request-id"]
            assert json.loads(r.read())["answers"]["outage"]["type"] == "noul"
        status, metrics = get(base + "/metrics")
        assert status == 200
        assert b"clef_router_broker_reachable 1.0" in metrics
        lag = re.search(rb"^clef_router_event_loop_lag_seconds_count (\S+)$", metrics, re.M)
        assert lag is not None  # the loop's lag is sampled while the service runs
        assert float(lag.group(1)) > 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
