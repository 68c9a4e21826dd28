"""Service child processes of the benches (`bench.startup`, `bench.e2e_group`): spawned as
`python -m bench.service_main ARGS...` in their own session, their stderr lines collected with arrival
times, polled until `/readyz` answers, and stopped on the way out.

Each `Child`'s `lines` list is written by its stderr pump thread only (appends); readers take snapshots.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

TIMELINE_KEYS = (
    "engine.",
    "release",
    "fast path",
    "settings",
    "listening",
    "started",
    "ready",
    "error",
    "Error",
)


@dataclass
class Child:
    """A service process and its stderr lines, each with the seconds since spawn it arrived at."""

    proc: subprocess.Popen[bytes]
    spawned: float  # time.monotonic() at spawn
    lines: list[tuple[float, str]] = field(default_factory=list)

    def timeline(self, keys: Sequence[str] = TIMELINE_KEYS) -> list[list[Any]]:
        """The lines holding any of `keys` (default: engine progress, settings, server and errors),
        each `[seconds since spawn, line shortened to 240 characters]`."""
        return [[round(t, 2), line[:240]] for t, line in list(self.lines) if any(k in line for k in keys)]

    def events(self, name: str) -> list[tuple[float, dict[str, Any]]]:
        """The child's JSON log lines whose `event` is `name`: `(monotonic time it arrived, fields)`."""
        out = []
        for t, line in list(self.lines):
            if f'"{name}"' not in line:
                continue
            try:
                fields = json.loads(line)
            except ValueError:
                continue
            if isinstance(fields, dict) and fields.get("event") == name:
                out.append((self.spawned + t, fields))
        return out


def spawn(args: Sequence[str], env: dict[str, str]) -> Child:
    """Start `python -m bench.service_main ARGS` with `env` in a new session (a Ctrl-C of the bench
    reaches it through `stopped`, not the terminal); a daemon thread collects its stderr lines."""
    spawned = time.monotonic()
    isolated = ["-S"] if env.get("BENCH_CLOSURE_SITE") else []  # only PYTHONPATH: see `bench.closure_site`
    proc = subprocess.Popen(
        [sys.executable, *isolated, "-m", "bench.service_main", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    child = Child(proc, spawned)

    def pump() -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            child.lines.append((time.monotonic() - spawned, raw.decode("utf-8", "replace").rstrip()))

    threading.Thread(target=pump, name=f"child-{proc.pid}-stderr", daemon=True).start()
    return child


def stop(child: Child, timeout_s: float = 30.0) -> None:
    """SIGTERM the child's process group unless it has exited; SIGKILL after `timeout_s`. Blocks."""
    if child.proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.proc.pid, signal.SIGTERM)
    try:
        child.proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        kill(child)


def kill(child: Child) -> None:
    """SIGKILL the child's process group (kill -9) and reap it. Blocks."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.proc.pid, signal.SIGKILL)
    child.proc.wait(30)


@contextlib.contextmanager
def stopped(child: Child) -> Iterator[Child]:
    """Yield `child`; on the way out `stop` it."""
    try:
        yield child
    finally:
        stop(child)


def http_get(url: str, body: bytes | None = None, timeout: float = 60.0) -> tuple[int, bytes]:
    """(status, body) of a GET (or a POST of JSON `body`); (0, b"") when nothing answered."""
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, b""


def wait_ready(child: Child, port: int, limit_s: float) -> float:
    """Seconds from spawn until `http://127.0.0.1:port/readyz` answers 200 (polled every 50 ms); raises
    `RuntimeError` when the child exits first, `TimeoutError` after `limit_s`. Blocks."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if child.proc.poll() is not None:
            tail = "\n".join(line for _, line in child.lines[-15:])
            raise RuntimeError(f"service exited with {child.proc.returncode} before ready:\n{tail}")
        status, _ = http_get(f"http://127.0.0.1:{port}/readyz", timeout=1.0)
        if status == 200:
            return time.monotonic() - child.spawned
        time.sleep(0.05)
    raise TimeoutError(f"service not ready after {limit_s:.0f} s")
