"""Fixtures for the HTTP conformance tests: real `clef-router serve` processes on the tiny release (CPU).

- ``tiny_release_dir`` (session): a tiny random-weight release written once.
- ``served`` (session): ``served(api_key=None) -> str`` starts (once per key) a `clef-router serve` process
  on 127.0.0.1 with the tiny release on CPU in float32, waits for `/readyz`, and returns its base URL.
  Every process is stopped with SIGTERM at session end and must exit 0 (graceful shutdown).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devtools.kafka_local import free_port

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 180.0
Served = Callable[..., str]


@pytest.fixture(scope="session")
def tiny_release_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from devtools.tiny_release import write_tiny_release

    return write_tiny_release(tmp_path_factory.mktemp("http-tiny-release"))


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"serve not ready within {START_TIMEOUT_S} s: {log.read_text()[-2000:]}")


@pytest.fixture(scope="session")
def served(tiny_release_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    procs: dict[str | None, tuple[subprocess.Popen[bytes], str, Path]] = {}

    def start(api_key: str | None = None) -> str:
        if api_key in procs:
            return procs[api_key][1]
        port = free_port()
        env = {
            **os.environ,
            "CLEF_ENGINE__MODEL_PATH": str(tiny_release_dir),
            "CLEF_ENGINE__DEVICE": "cpu",
            "CLEF_ENGINE__DTYPE": "float32",
            "CLEF_HTTP__PORT": str(port),
            "CLEF_HTTP__MODEL_RELEASE_DATE": "2026-12-01",
            "CLEF_BATCHING__MAX_WAIT_MS": "2",
            "CLEF_LOG_LEVEL": "warning",
        }
        if api_key is not None:
            env["CLEF_HTTP__API_KEYS"] = f'["{api_key}"]'
        log = tmp_path_factory.mktemp("serve") / "serve.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "consumer.cli", "serve"], cwd=ROOT, env=env, stdout=out, stderr=out
            )
        url = f"http://127.0.0.1:{port}"
        procs[api_key] = (proc, url, log)
        _wait_ready(url, proc, log)
        return url

    yield start
    codes = {}
    for key, (proc, _, log) in procs.items():
        proc.send_signal(signal.SIGTERM)
        try:
            codes[key] = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            codes[key] = None
        if codes[key] != 0:
            print(log.read_text()[-3000:])
    assert all(code == 0 for code in codes.values()), f"serve exit codes after SIGTERM: {codes}"
