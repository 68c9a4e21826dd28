"""Fixtures for the media end-to-end tests: one tiny release, a float32 CPU engine, tiny media requests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from devtools.tiny_release import write_tiny_release
from engine.runner import Engine, EngineConfig
from tests.unit.engine.media.media_e2e_gen import b64, mp4, png, request, wav


@pytest.fixture(scope="session")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_release(tmp_path_factory.mktemp("tiny-media") / "release", seed=0)


@pytest.fixture(scope="session")
def engine(release: Path) -> Engine:
    return Engine.from_release(release, config=EngineConfig(device="cpu", dtype="float32"))


@pytest.fixture(scope="session")
def requests() -> dict[str, dict[str, Any]]:
    """Named requests: text-only ones and one per media kind (all tiny, decoded in milliseconds)."""
    return {
        "text": request('{"host": "db-1", "message": "disk full"}'),
        "image": request("see the screenshot", images=[b64(png(64, 48, seed=1))]),
        "audio": request("listen", audio=[b64(wav(1.2))]),
        "short_audio": request("listen briefly", audio=[b64(wav(0.5, hz=880.0))]),
        "video_sound": request("watch and listen", videos=[b64(mp4(1.0, sound=True))]),
        "video_silent": request("watch", videos=[b64(mp4(2.0, sound=False, fps=30))]),
        "text_long": request("latency spike " * 40),
        "everything": request(
            "all at once",
            images=[b64(png(40, 40, seed=2)), b64(png(80, 32, seed=3))],
            audio=[b64(wav(0.7, hz=550.0))],
            videos=[b64(mp4(1.0, sound=True)), b64(mp4(2.0, sound=True, fps=30))],
        ),
    }
