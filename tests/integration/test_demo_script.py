"""`scripts/demo.sh` end to end: it shows every event's route topic and why, and whether it succeeds or is
interrupted with Ctrl-C, no process it started (broker JVM, `clef-router run`, ...) is left behind.

Every process of a run carries a marker variable in its environment (inherited by all descendants, also
those in a session of their own, like the broker's JVM); after the script exits, `/proc` must hold none.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "scripts" / "demo.sh"
SAMPLES = ROOT / "consumer" / "samples" / "events.jsonl"

pytestmark = pytest.mark.slow


def _env(tmp_path: Path, mark: str) -> dict[str, str]:
    # no service settings, but the cache folder stays where the caller put it (the jars are there)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLEF_") or k == "CLEF_CACHE_DIR"}
    env.update(
        DEMO_TEST_MARK=mark,
        CLEF_VENV=sys.prefix,  # this venv (complete after scripts/setup.sh): the set-up step is instant
        PYTHONPATH=str(ROOT),  # this tree's code, whatever the venv's editable install points at
        TMPDIR=str(tmp_path),  # everything temporary lands here, so the test sees it removed
    )
    return env


def _marked_processes(mark: str) -> list[str]:
    needle = f"DEMO_TEST_MARK={mark}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle in (proc / "environ").read_bytes().split(b"\0"):
                found.append(f"{proc.name}: {(proc / 'cmdline').read_bytes()[:120]!r}")
        except OSError:  # gone meanwhile, or a kernel thread
            continue
    return found


def test_demo_prints_each_route_topic_and_leaves_nothing(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    proc = subprocess.run(
        ["bash", str(DEMO)],
        env=_env(tmp_path, mark),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = sum(1 for line in SAMPLES.read_text().splitlines() if line.strip())
    routed = [line for line in proc.stdout.splitlines() if " -> route." in line]
    assert len(routed) == events, proc.stdout
    # why: every review decision names its confidence and the threshold it fell under
    reviews = [line for line in routed if "-> route.review" in line]
    assert all("< review threshold 0.5" in line for line in reviews), reviews
    assert _marked_processes(mark) == []
    assert list(tmp_path.iterdir()) == []  # its work folder and the broker's data are removed


def test_demo_interrupted_leaves_nothing(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    # a session of its own, so the test can send Ctrl-C to the whole process group, as a terminal does
    proc = subprocess.Popen(
        ["bash", str(DEMO)],
        env=_env(tmp_path, mark),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    seen: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # bounded: the script's own waits are bounded, and the test has a timeout
            seen.append(line)
            if "starting clef-router run" in line:  # broker up, service loading: both must be stopped
                break
        assert any("starting clef-router run" in line for line in seen), "".join(seen)
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGINT)
        rest = proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, "".join(seen) + rest
    assert _marked_processes(mark) == []
    assert list(tmp_path.iterdir()) == []
