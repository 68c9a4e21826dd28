"""Broker-talking commands (`produce`, `tail`, `dlq replay`) against a broker that is not there.

Each runs as a real `python -m consumer.cli` process, so what is checked is what a user sees on stderr:
one line, a bounded wait, Ctrl-C at once, and none of aiokafka's own noise.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
COMMANDS = [["produce"], ["tail"], ["dlq", "replay"]]
_IDS = [" ".join(c) for c in COMMANDS]


@pytest.fixture
def silent_broker() -> Iterator[socket.socket]:
    """A loopback port that accepts TCP connections and never answers (like a hung or firewalled broker)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        sock.settimeout(30)
        yield sock


def _start(argv: list[str], bootstrap: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "consumer.cli", *argv, "--bootstrap", bootstrap],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _assert_one_clean_line(err: str) -> None:
    assert err.count("\n") == 1, err
    assert "Unclosed" not in err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv", COMMANDS, ids=_IDS)
def test_unanswering_broker_gives_up_after_timeout(argv: list[str], silent_broker: socket.socket) -> None:
    port = silent_broker.getsockname()[1]
    started = time.monotonic()
    proc = _start([*argv, "--timeout", "2"], f"127.0.0.1:{port}")
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - started
    assert proc.returncode == 1, err
    _assert_one_clean_line(err)
    assert f"127.0.0.1:{port} did not answer within 2 s" in err
    # 2 s bound + closing the clients (<= 5 s each) + interpreter start: far below aiokafka's own minutes
    assert took < 30, took


@pytest.mark.parametrize("argv", COMMANDS, ids=_IDS)
def test_ctrl_c_stops_at_once(argv: list[str], silent_broker: socket.socket) -> None:
    proc = _start(argv, f"127.0.0.1:{silent_broker.getsockname()[1]}")
    try:
        conn, _ = silent_broker.accept()  # the command is now waiting for the broker, which never answers
        interrupted = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        conn.close()  # after the signal: closing first let the command fail (exit 1) before SIGINT landed
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, err
    assert time.monotonic() - interrupted < 10
    _assert_one_clean_line(err)
    assert err.endswith(": interrupted\n")


def test_refused_connection_is_one_line_naming_the_type_once() -> None:
    with socket.socket() as sock:  # a port nobody listens on: bound, never listening
        sock.bind(("127.0.0.1", 0))
        proc = _start(["produce"], f"127.0.0.1:{sock.getsockname()[1]}")
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    _assert_one_clean_line(err)
    assert err.startswith("clef-router produce: error: cannot reach Kafka at 127.0.0.1:")
    assert err.count("KafkaConnectionError") == 1
