"""Tests never see the caller's `CLEF_*` variables (tests/conftest.py): with `CLEF_DEBUG=1` (which adds
tracebacks to the CLI's one-line errors) and a stray setting exported, the CLI tests still pass."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import caller_clef_variables

ROOT = Path(__file__).resolve().parents[2]


def test_only_the_cache_location_is_kept() -> None:
    environ = {"CLEF_DEBUG": "1", "CLEF_CACHE_DIR": "/c", "CLEF_KAFKA__GROUP_ID": "g", "PATH": "/bin"}
    assert caller_clef_variables(environ) == ["CLEF_DEBUG", "CLEF_KAFKA__GROUP_ID"]


def test_no_caller_clef_variable_reaches_this_test() -> None:
    assert caller_clef_variables(os.environ) == []


@pytest.mark.slow
def test_cli_tests_pass_with_clef_debug_exported(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "CLEF_DEBUG": "1",  # README: adds the traceback to every error line
        "CLEF_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1",  # a caller's broker, which no test asked for
        "TMPDIR": str(tmp_path),
    }
    files = ["tests/unit/consumer/test_cli.py", "tests/unit/consumer/test_cli_broker.py"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:]
