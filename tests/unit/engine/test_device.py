"""`engine.device.configure_cublaslt`: the engine's cuBLASLt workspace unless the environment names one."""

from __future__ import annotations

import os

import pytest

from engine import device


def test_cublaslt_gets_no_workspace_when_the_environment_names_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(device.CUBLASLT_WORKSPACE_ENV, raising=False)
    assert device.configure_cublaslt() == "0"
    assert os.environ[device.CUBLASLT_WORKSPACE_ENV] == "0"


def test_an_operators_workspace_size_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(device.CUBLASLT_WORKSPACE_ENV, "4096")
    assert device.configure_cublaslt() == "4096"
    assert os.environ[device.CUBLASLT_WORKSPACE_ENV] == "4096"
