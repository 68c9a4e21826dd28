"""A stand-in for PyAV on machines without it (the H200 machine has none, and it is too large to carry), so
that `engine` imports for benches and tests whose requests carry no media. Used by `bench.e2e`,
`bench.service_main` (the child process of `bench.startup`) and `scripts/device-startup.sh`."""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any


def install_av_placeholder() -> bool:
    """Register a placeholder `av` module when PyAV cannot be imported, so `engine` imports (its media code
    imports PyAV at module level and names `av.FFmpegError` there). Any other attribute raises
    `AttributeError` saying PyAV is missing (an AttributeError, so `hasattr` and `inspect` see a module
    without it). Returns True when the placeholder was installed, False when PyAV is there."""
    if "av" in sys.modules:
        return False
    try:
        importlib.import_module("av")
        return False
    except ImportError:  # not installed, or its libraries are missing
        pass
    module = types.ModuleType("av", "placeholder for PyAV (bench): not installed on this machine")

    class FFmpegError(Exception):
        """Never raised: stands in for PyAV's error base class."""

    def missing(name: str) -> Any:
        raise AttributeError(f"PyAV is not installed (bench placeholder): av.{name} is unavailable")

    module.__dict__.update(FFmpegError=FFmpegError, __getattr__=missing)
    sys.modules["av"] = module
    return True
