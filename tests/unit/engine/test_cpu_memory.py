"""CPU attention memory: no forward pass on the CPU ever asks transformers for a dense attention mask.

A packed row of several records under sdpa/eager becomes a block-diagonal (T, T) mask, quadratic in the pack's
tokens (4.3 GB of bool for a 65k-token pack); a single unpadded record needs none (sdpa's `is_causal`). The
engine therefore runs packed CPU groups one record per pass. The spy below wraps the mask function that the
thinker's `create_causal_mask` calls and records what it returns.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine import Engine, EngineConfig
from schemas.systemone import SystemOneResponse, parse_request

QUESTIONS: dict[str, Any] = {
    "department": {"type": "choice", "criteria": {"net": "Network", "db": None, "api": {"k": ["v"]}}},
    "urgency": {"type": "score", "criteria": ["low", "high", None]},
    "outage": {"type": "noul", "criteria": {"true": None}},
}


@pytest.fixture(scope="module")
def engine(tiny_release: Path) -> Engine:
    return Engine.from_release(tiny_release, config=EngineConfig(device="cpu", dtype="float32"))


@pytest.fixture
def masks(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...] | None]:
    """Shapes of the masks the thinker's attention mask function returns (None: no mask, `is_causal`)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    name = engine.model.attn_implementation
    real: Callable[..., Any] = ALL_MASK_ATTENTION_FUNCTIONS[name]
    seen: list[tuple[int, ...] | None] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        mask = real(*args, **kwargs)
        seen.append(None if mask is None else tuple(mask.shape))
        return mask

    monkeypatch.setitem(ALL_MASK_ATTENTION_FUNCTIONS, name, spy)
    return seen


def body(state: str) -> dict[str, Any]:
    return {"state": state, "questions": QUESTIONS}


def test_cpu_packed_batch_runs_one_record_per_pass_without_a_mask(
    engine: Engine, masks: list[tuple[int, ...] | None]
) -> None:
    states = ["disk full on db-01", "latency " * 300, "a", "replication lag " * 40]
    prepared = [engine.prepare(parse_request(body(s))) for s in states]
    staged = engine.stage(prepared)
    assert [group for group, _ in staged.parts] == [(0,), (1,), (2,), (3,)]
    together = engine.run(staged)
    assert len(masks) == len(states)  # one mask decision per pass (all layers share it) ...
    assert masks == [None] * len(states)  # ... and never a dense mask
    for index, p in enumerate(prepared):
        alone = engine.run(engine.stage([p]))
        for qid, probs in together.probabilities[index].items():
            np.testing.assert_allclose(probs, alone.probabilities[0][qid], rtol=0, atol=1e-5)


def test_long_request_on_cpu_needs_no_dense_mask(engine: Engine, masks: list[tuple[int, ...] | None]) -> None:
    """A long state with short neighbours: every pass maskless, every request answered."""
    long_state = " ".join(f"line {i} host-{i % 97} error timeout" for i in range(800))
    requests = [body("short one"), body(long_state), body("short two")]
    results = engine.decide(requests)
    assert all(isinstance(r, SystemOneResponse) for r in results)
    long_result = results[1]
    assert isinstance(long_result, SystemOneResponse)
    assert long_result.usage.input_tokens > 4_000
    assert masks
    assert all(mask is None for mask in masks)


def test_varlen_attention_still_packs(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only attention that would need a dense mask is split: varlen kernels keep one packed pass."""
    monkeypatch.setattr(type(engine.model), "can_pack", lambda self, with_media: True)
    prepared = [engine.prepare(parse_request(body(s))) for s in ("one", "two", "three")]
    assert [group for group, _ in engine.stage(prepared).parts] == [(0, 1, 2)]
