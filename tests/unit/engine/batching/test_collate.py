"""`engine.batching.collate`: the per-segment softmax and the span checks of `collate`."""

from __future__ import annotations

import pytest
import torch

from engine.batching.collate import collate, segment_softmax
from engine.types import EncodedRequest


def test_segment_softmax_matches_per_segment() -> None:
    logits = torch.tensor([1.0, 2.0, 3.0, -50.0, 50.0, 0.5])
    seg = torch.tensor([0, 0, 0, 1, 1, 2])
    out = segment_softmax(logits, seg, 3)
    assert torch.allclose(out[:3], torch.softmax(logits[:3], 0))
    assert torch.allclose(out[3:5], torch.softmax(logits[3:5], 0))
    assert out[5] == 1.0


def test_collate_rejects_bad_spans(records: list[EncodedRequest]) -> None:
    from dataclasses import replace

    bad = replace(records[0], question_spans=((0, 10_000),))
    with pytest.raises(ValueError, match="question span"):
        collate([bad])
    with pytest.raises(ValueError, match="at least one record"):
        collate([])
