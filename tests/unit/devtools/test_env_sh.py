"""`timed` of scripts/env.sh: a bounded command that a Ctrl-C still reaches.

`timeout` runs its command in a process group of its own, which a terminal's Ctrl-C (SIGINT to the
foreground process group) does not reach: a plain `timeout 3000 pip install ...` in setup.sh went on until
pip was done. These tests run real bash, `timeout` and `sleep`, send SIGINT to the script's whole process
group as a terminal does, and check that the command is gone within seconds and the script's own trap ran.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

from tests.support.procs import marked_processes

ROOT = Path(__file__).resolve().parents[3]
ENV_SH = ROOT / "scripts" / "env.sh"


def _bash(script: str, mark: str) -> subprocess.Popen[str]:
    """`script` in bash after sourcing env.sh, in a session of its own (a terminal's process group)."""
    env = {**os.environ, "TIMED_TEST_MARK": mark}
    return subprocess.Popen(
        ["bash", "-c", f'set -euo pipefail; source "{ENV_SH}"; {script}'],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _marked(mark: str) -> list[str]:
    return marked_processes("TIMED_TEST_MARK", mark)


def _finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out, err


def test_timed_returns_the_status_of_its_command_and_124_past_its_limit() -> None:
    mark = uuid.uuid4().hex
    proc = _bash(
        "rc=0; timed 30 bash -c 'exit 3' || rc=$?; echo \"three $rc\"; "
        'rc=0; timed 1 sleep 20 || rc=$?; echo "limit $rc"; timed 30 true; echo done',
        mark,
    )
    code, out, err = _finish(proc, 60)
    assert code == 0, err
    assert out.split("\n")[:3] == ["three 3", "limit 124", "done"]


def test_ctrl_c_reaches_the_timed_command_and_the_scripts_trap_runs_at_once() -> None:
    mark = uuid.uuid4().hex
    proc = _bash(
        "trap 'echo trapped; exit 130' INT; echo started; timed 300 sleep 120; echo 'not interrupted'",
        mark,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"
    time.sleep(1.0)  # bash is now waiting on `timed`; `sleep` runs in timeout's own process group
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: only the script's own process group
    # the sleep has 119 s to go: a script still waiting for it misses this bound and fails here
    code, out, err = _finish(proc, 30)
    assert code == 130, err
    assert "trapped" in out
    assert "not interrupted" not in out
    assert _marked(mark) == []  # neither timeout nor sleep outlived the script


def test_ctrl_c_without_a_trap_ends_the_script_by_sigint_after_its_exit_trap() -> None:
    mark = uuid.uuid4().hex
    # setup.sh's shape: only an EXIT trap; the shell must end as if sleep had been in its foreground
    proc = _bash("trap 'echo cleaned' EXIT; echo started; timed 300 sleep 120; echo 'not interrupted'", mark)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGINT)
    code, out, err = _finish(proc, 30)
    assert code == -signal.SIGINT, err  # ended by the signal: a calling shell sees an interrupt
    assert "cleaned" in out
    assert "not interrupted" not in out
    assert _marked(mark) == []


def test_timed_restores_the_callers_traps() -> None:
    mark = uuid.uuid4().hex
    proc = _bash("trap 'echo mine' INT; timed 30 true; trap -p INT", mark)
    code, out, err = _finish(proc, 30)
    assert code == 0, err
    assert "echo mine" in out
