"""Shared pytest configuration for every test tier (kept small: tier fixtures live in their own conftest).

- ``tests/unit``: fast tests on fakes, no broker, no GPU.
- ``tests/integration``: a real Apache Kafka broker (fixtures in its conftest.py), marker ``kafka``.
- ``tests/gpu``: marker ``gpu``; run on the CUDA device only, skipped here when CUDA is unavailable.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping

import pytest

KEPT_CALLER_VARIABLES = frozenset({"CLEF_CACHE_DIR"})
"""`CLEF_*` variables of the caller that tests keep: where the caller's caches (Kafka jars, ...) live."""


def caller_clef_variables(environ: Mapping[str, str]) -> list[str]:
    """The caller's `CLEF_*` variables that tests must not see: all but `KEPT_CALLER_VARIABLES`."""
    return sorted(name for name in environ if name.startswith("CLEF_") and name not in KEPT_CALLER_VARIABLES)


@pytest.fixture(scope="session", autouse=True)
def _isolated_from_callers_clef_variables() -> Iterator[None]:
    """Tests run as if the caller had exported no `CLEF_*` variable (`CLEF_DEBUG=1`, a broker address, ...):
    each is removed for the whole session, before any other fixture runs, and restored at its end. A test
    sets what it needs itself (`monkeypatch.setenv`), and subprocesses inherit only that."""
    with pytest.MonkeyPatch.context() as patch:
        for name in caller_clef_variables(os.environ):
            patch.delenv(name)
        yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``gpu`` tests when no CUDA device is present (torch is only imported if such tests exist)."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in gpu_items:
        item.add_marker(skip)
