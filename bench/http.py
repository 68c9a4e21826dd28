"""`python -m bench http`: the HTTP API's requests/s and latency with the stub engine.

Starts `clef-router serve --stub-engine` as a child process on 127.0.0.1 (its own CPU, as in production),
then for each concurrency runs that many keep-alive connections, each sending SystemOne requests back to
back for a fixed time after a warm-up. Per request it records the round trip and the server's
`Server-Timing: batcher;dur=...` (time spent waiting for the batcher and stub engine), so
`overhead = round trip - batcher time` is what the HTTP stack costs per request: client write and read,
loopback, uvicorn, routing, auth, body reading, JSON response bytes, the request-id middleware.
The load generator is a minimal HTTP/1.1 client (Content-Length bodies only) so that it costs little
client CPU; it only talks to the child it started.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from devtools.kafka_local import free_port
from devtools.stub import sample_event

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = {
    "department": {
        "type": "choice",
        "instructions": "Which team must handle this alert?",
        "criteria": {name: f"{name} problems" for name in ("network", "database", "storage", "security")},
    },
    "urgency": {"type": "score", "criteria": ["low", "medium", "high", "critical"]},
    "outage": {"type": "noul", "instructions": "Is a customer-facing service down?"},
}


@dataclass(frozen=True)
class Result:
    concurrency: int
    requests: int
    seconds: float
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    overhead_p50_ms: float
    overhead_p99_ms: float
    server_cpu_ms_per_request: float
    errors: int


def request_body(i: int) -> bytes:
    return json.dumps({"state": json.loads(sample_event(i)), "questions": QUESTIONS}).encode()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, float, bytes]:
    """Status, Server-Timing batcher milliseconds (nan if absent) and body of one response."""
    status = int((await reader.readline()).split()[1])
    length, batcher_ms = 0, float("nan")
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        name = name.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "server-timing" and "dur=" in value:
            batcher_ms = float(value.split("dur=")[1].split(",")[0])
    return status, batcher_ms, await reader.readexactly(length)


async def _worker(port: int, bodies: list[bytes], stop_at: float, out: list[tuple[float, float]]) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    errors = 0
    i = 0
    try:
        while time.perf_counter() < stop_at:
            body = bodies[i % len(bodies)]
            i += 1
            head = "POST /v1/systemone HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            t0 = time.perf_counter()
            writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
            status, batcher_ms, _ = await _read_response(reader)
            took = (time.perf_counter() - t0) * 1000
            if status != 200:
                errors += 1
                continue
            out.append((took, took - batcher_ms))
    finally:
        writer.close()
    return errors


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _load(port: int, pid: int, concurrency: int, seconds: float, warmup_s: float) -> Result:
    bodies = [request_body(i) for i in range(64)]
    await asyncio.gather(
        *(_worker(port, bodies, time.perf_counter() + warmup_s, []) for _ in range(concurrency))
    )
    samples: list[tuple[float, float]] = []
    cpu0 = _cpu_seconds(pid)
    began = time.perf_counter()
    errors = await asyncio.gather(
        *(_worker(port, bodies, began + seconds, samples) for _ in range(concurrency))
    )
    elapsed = time.perf_counter() - began
    cpu = _cpu_seconds(pid) - cpu0
    lat = sorted(s[0] for s in samples)
    over = sorted(s[1] for s in samples)

    def pct(values: list[float], q: float) -> float:
        return round(values[min(len(values) - 1, int(q * len(values)))], 3) if values else float("nan")

    return Result(
        concurrency=concurrency,
        requests=len(samples),
        seconds=round(elapsed, 2),
        requests_per_s=round(len(samples) / elapsed, 1),
        p50_ms=round(statistics.median(lat), 3) if lat else float("nan"),
        p99_ms=pct(lat, 0.99),
        overhead_p50_ms=round(statistics.median(over), 3) if over else float("nan"),
        overhead_p99_ms=pct(over, 0.99),
        server_cpu_ms_per_request=round(cpu * 1000 / max(1, len(samples)), 3),
        errors=sum(errors),
    )


def _start_server(port: int, settings: dict[str, dict[str, Any]]) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "CLEF_HTTP__PORT": str(port),
        "CLEF_HTTP__SERVER_TIMING": "true",
        "CLEF_HTTP__MAX_CONCURRENT_REQUESTS": "1024",
        "CLEF_LOG_LEVEL": "warning",
    }
    for section, values in settings.items():
        for key, value in values.items():
            env[f"CLEF_{section.upper()}__{key.upper()}"] = (
                value if isinstance(value, str) else json.dumps(value)
            )
    cmd = [sys.executable, "-m", "consumer.cli", "serve", "--stub-engine"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited: {proc.stderr.read().decode()[-1000:] if proc.stderr else ''}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("serve did not become ready within 60 s")


def main(
    *, concurrency: tuple[int, ...], seconds: float, warmup_s: float, settings: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """Run the benchmark, print one line per concurrency, return the results."""
    port = free_port()
    proc = _start_server(port, settings)
    results: list[Result] = []
    try:
        print(
            f"clef-router serve --stub-engine on 127.0.0.1:{port}; settings {settings or 'default'}; "
            f"{seconds:g} s per concurrency after {warmup_s:g} s warm-up; cpus {os.cpu_count()}"
        )
        print(
            f"{'conc':>4} {'requests':>9} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
            f"{'overhead p50 ms':>16} {'overhead p99 ms':>16} {'server cpu ms/req':>17} {'errors':>6}"
        )
        for c in concurrency:
            r = asyncio.run(_load(port, proc.pid, c, seconds, warmup_s))
            results.append(r)
            print(
                f"{r.concurrency:>4} {r.requests:>9} {r.requests_per_s:>9} {r.p50_ms:>8} {r.p99_ms:>8} "
                f"{r.overhead_p50_ms:>16} {r.overhead_p99_ms:>16} "
                f"{r.server_cpu_ms_per_request:>17} {r.errors:>6}",
                flush=True,
            )
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return [asdict(r) for r in results]
