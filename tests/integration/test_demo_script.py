"""`scripts/demo.sh` end to end: it shows every event's route topic and why, and whether it succeeds or is
interrupted with Ctrl-C, no process it started (broker JVM, `clef-router run`, ...) is left behind.

Every process of a run carries a marker variable in its environment (inherited by all descendants, also
those in a session of their own, like the broker's JVM); after the script exits, `/proc` must hold none.

The demo never installs into the interpreter running the tests: it gets `CLEF_VENV` = a virtualenv of the
test's own, which sees this interpreter's packages through a `.pth` file (read-only: nothing is copied) so
that setup.sh finds nothing missing and only links the clone into it; `pip freeze` of this interpreter must
be the same before and after.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
import time
import uuid
from pathlib import Path

import pytest

from tests.support.procs import marked_processes

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "scripts" / "demo.sh"
SAMPLES = ROOT / "consumer" / "samples" / "events.jsonl"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv of the test's own (no pip, no packages) that sees this interpreter's site-packages."""
    venv = tmp_path_factory.mktemp("demo-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.strip()
    )
    parents = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site / "_clef_test_parent.pth").write_text("\n".join(parents) + "\n")
    return venv


def pip_freeze() -> list[str]:
    """`pip freeze` of the interpreter running the tests (every distribution and version, editables too)."""
    cmd = [sys.executable, "-m", "pip", "freeze", "--all"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.splitlines()


def _env(tmp_path: Path, mark: str, venv: Path) -> dict[str, str]:
    # no service settings, but the cache folder stays where the caller put it (the jars are there)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLEF_") or k == "CLEF_CACHE_DIR"}
    assert venv.resolve() != Path(sys.prefix).resolve()  # never the interpreter running the tests
    env.update(
        DEMO_TEST_MARK=mark,
        CLEF_VENV=str(venv),  # the test's own venv: setup.sh finds nothing missing and only links the clone
        PYTHONPATH=str(ROOT),  # this tree's code, whatever the venv's editable install points at
        TMPDIR=str(tmp_path),  # everything temporary lands here, so the test sees it removed
    )
    return env


def _marked_processes(mark: str) -> list[str]:
    return marked_processes("DEMO_TEST_MARK", mark)


def test_demo_prints_each_route_topic_and_leaves_nothing(tmp_path: Path, demo_venv: Path) -> None:
    mark = uuid.uuid4().hex
    before = pip_freeze()
    proc = subprocess.run(
        ["bash", str(DEMO)],
        env=_env(tmp_path, mark, demo_venv),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert pip_freeze() == before  # the demo installed nothing into the interpreter running the tests
    if "checking what it lacks" in proc.stderr:  # the first run in this venv: it found all it needs
        assert "nothing missing" in proc.stderr, proc.stderr[-3000:]
    assert (demo_venv / "bin" / "clef-router").is_file()  # the clone linked into the test's own venv
    events = sum(1 for line in SAMPLES.read_text().splitlines() if line.strip())
    routed = [line for line in proc.stdout.splitlines() if " -> route." in line]
    assert len(routed) == events, proc.stdout
    # why: every review decision names its confidence and the threshold it fell under
    reviews = [line for line in routed if "-> route.review" in line]
    assert all("< review threshold 0.5" in line for line in reviews), reviews
    assert _marked_processes(mark) == []
    assert list(tmp_path.iterdir()) == []  # its work folder and the broker's data are removed


def test_demo_interrupted_leaves_nothing(tmp_path: Path, demo_venv: Path) -> None:
    mark = uuid.uuid4().hex
    # a session of its own, so the test can send Ctrl-C to the whole process group, as a terminal does
    proc = subprocess.Popen(
        ["bash", str(DEMO)],
        env=_env(tmp_path, mark, demo_venv),
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
