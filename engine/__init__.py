"""Clef-omni inference: release loading, request encoding, joint schema head, batched answers.

The public names are imported lazily so `import engine` stays cheap (no torch or transformers until
used). This package never imports aiokafka.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.api import systemone
    from engine.config import EngineConfig
    from engine.model.release import load_release_model
    from engine.runner import Engine

__all__ = ["Engine", "EngineConfig", "load_release_model", "systemone"]

_HOMES = {
    "Engine": "engine.runner",
    "EngineConfig": "engine.config",
    "load_release_model": "engine.model.release",
    "systemone": "engine.api",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
