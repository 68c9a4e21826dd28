"""Fixtures shared by the unit tests of several packages: one tiny release per session
(`devtools.tiny_release`), read by the engine's tests and checked by the devtools' own."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.tiny_release import write_tiny_release


@pytest.fixture(scope="session")
def tiny_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_release(tmp_path_factory.mktemp("tiny") / "release", seed=0)
