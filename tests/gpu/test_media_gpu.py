"""GPU: media records through the tiny release on CUDA in bf16 keep their probabilities within 2e-3 in a
batch mixed with text-only records (transformers path, packed and padded), and the engine's split of a
mixed batch between the text fast path and the media path gives the same answers."""

from __future__ import annotations

import base64
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from devtools.tiny_release import write_tiny_release
from engine.batching.collate import Layout
from engine.runner import Engine, EngineConfig, Prepared
from schemas.systemone import SystemOneResponse, parse_request

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "engine" / "media"))
from media_e2e_gen import mp4, png, wav  # noqa: E402

QUESTIONS: dict[str, Any] = {
    "department": {"type": "choice", "criteria": {"net": "network", "db": "database", "sec": "security"}},
    "outage": {"type": "noul"},
}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _bodies() -> list[dict[str, Any]]:
    return [
        {"state": "text " * 50, "questions": QUESTIONS},
        {"state": "image", "questions": QUESTIONS, "images": [_b64(png(64, 48, seed=1))]},
        {"state": "audio", "questions": QUESTIONS, "audio": [_b64(wav(1.2))]},
        {"state": "short audio", "questions": QUESTIONS, "audio": [_b64(wav(0.5))]},
        {"state": "video+sound", "questions": QUESTIONS, "videos": [_b64(mp4(1.0, sound=True))]},
        {"state": "video", "questions": QUESTIONS, "videos": [_b64(mp4(2.0))]},
        {"state": "more text " * 200, "questions": QUESTIONS},
    ]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    path = write_tiny_release(tmp_path_factory.mktemp("tiny") / "release")
    config = EngineConfig(device="cuda", dtype="bfloat16", graph_buckets=())
    return Engine.from_release(path, config=config)


def _probs(engine: Engine, batch: list[Prepared], layout: Layout) -> list[np.ndarray]:
    model = engine.model
    return [np.concatenate(r) for r in model.forward_batch(model.collate([p.encoded for p in batch], layout))]


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_media_batch_invariance_bf16_cuda(engine: Engine, layout: Layout) -> None:
    batch = [engine.prepare(parse_request(b)) for b in _bodies()]
    together = _probs(engine, batch, layout)
    worst = 0.0
    for prepared, mixed in zip(batch, together, strict=True):
        worst = max(worst, float(np.abs(_probs(engine, [prepared], layout)[0] - mixed).max()))
    print(f"{layout}: media max |dp| alone vs mixed = {worst:.2e}")
    assert worst <= 2e-3


def test_engine_mixed_decide_matches_alone_bf16_cuda(engine: Engine) -> None:
    bodies = _bodies()
    mixed = engine.decide(bodies)
    worst = 0.0
    for body, result in zip(bodies, mixed, strict=True):
        alone = engine.decide([body])[0]
        assert isinstance(result, SystemOneResponse)
        assert isinstance(alone, SystemOneResponse)
        for qid, answer in result.answers.items():
            a = getattr(alone.answers[qid], "probabilities", None) or {"p": alone.answers[qid].noul}  # type: ignore[union-attr]
            b = getattr(answer, "probabilities", None) or {"p": answer.noul}  # type: ignore[union-attr]
            worst = max(worst, max(abs(a[k] - b[k]) for k in a))
    print(f"engine (fast path {engine.model.clef.fast_path}): max |dp| = {worst:.2e}")
    assert worst <= 2e-3 + 1e-4  # + response rounding
