"""`engine.batching.collate`: the per-segment softmax and mean, and the span checks of `collate`."""

from __future__ import annotations

import pytest
import torch

from engine.batching.collate import collate, segment_mean, segment_softmax
from engine.types import EncodedRequest


def test_segment_softmax_matches_per_segment() -> None:
    logits = torch.tensor([1.0, 2.0, 3.0, -50.0, 50.0, 0.5])
    seg = torch.tensor([0, 0, 0, 1, 1, 2])
    out = segment_softmax(logits, seg, 3)
    assert torch.allclose(out[:3], torch.softmax(logits[:3], 0))
    assert torch.allclose(out[3:5], torch.softmax(logits[3:5], 0))
    assert out[5] == 1.0


def test_segment_mean_takes_the_host_lengths_and_matches_per_segment(records: list[EncodedRequest]) -> None:
    """The means divide by `SpanIndex`'s span lengths: each option's mean equals the mean of its own
    span's rows, in float32, for a bf16 input too."""
    batch = collate(records[:3])
    index = batch.index
    values = torch.randn(batch.num_tokens, 8).to(torch.bfloat16)
    got = segment_mean(values, index.option_tokens, index.option_segment, index.option_length)
    assert got.dtype == torch.float32
    assert got.shape == (index.num_options, 8)
    assert int(index.option_length.sum()) == index.option_tokens.shape[0]
    starts = torch.cumsum(index.option_length, 0) - index.option_length
    for n, (start, length) in enumerate(zip(starts.tolist(), index.option_length.tolist(), strict=True)):
        rows = index.option_tokens[start : start + length]
        assert torch.allclose(got[n], values[rows].float().mean(0), atol=1e-6)
    questions = segment_mean(values, index.question_tokens, index.question_segment, index.question_length)
    assert questions.shape == (index.num_questions, 8)


def test_collate_rejects_bad_spans(records: list[EncodedRequest]) -> None:
    from dataclasses import replace

    bad = replace(records[0], question_spans=((0, 10_000),))
    with pytest.raises(ValueError, match="question span"):
        collate([bad])
    with pytest.raises(ValueError, match="at least one record"):
        collate([])
