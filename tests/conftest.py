"""Shared pytest configuration for every test tier (kept small: tier fixtures live in their own conftest).

- ``tests/unit``: fast tests on fakes, no broker, no GPU.
- ``tests/integration``: a real Apache Kafka broker (fixtures in its conftest.py), marker ``kafka``.
- ``tests/gpu``: marker ``gpu``; run on the CUDA device only, skipped here when CUDA is unavailable.
"""

from __future__ import annotations

import pytest


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
