"""`engine.batching.collate`: the per-segment softmax and mean, the span checks of `collate`, and the packing
of a batch's tensors into one buffer for the device copy."""

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


def test_device_packing_keeps_every_tensor_across_dtypes_in_one_buffer(records: list[EncodedRequest]) -> None:
    """`_to_device_packed` (the CUDA path of `ModelBatch.to`, run here to the CPU): every tensor of a
    collated batch, int64 and bool, plus odd-sized int32, float32 and empty ones, comes back equal, with its
    dtype and shape, as a view of one buffer whose dtype runs start 16-byte aligned."""
    from engine.batching.collate import _to_device_packed

    batch = collate(records[:3])
    text: list[torch.Tensor] = []
    batch.index.map_tensors(lambda t: text.append(t) or t)
    text += [batch.input_ids, batch.position_ids]
    text += [torch.arange(7, dtype=torch.int32), torch.randn(3, 5), torch.zeros(0, dtype=torch.int64)]
    assert {t.dtype for t in text} >= {torch.int64, torch.bool, torch.int32, torch.float32}
    moved = _to_device_packed(text, torch.device("cpu"))
    bases = {moved[id(t)].untyped_storage().data_ptr() for t in text if t.numel()}
    assert len(bases) == 1
    base = bases.pop()
    for t in text:
        got = moved[id(t)]
        assert got.dtype == t.dtype
        assert got.shape == t.shape
        assert torch.equal(got, t)
    for dtype in {t.dtype for t in text}:
        first = min(moved[id(t)].data_ptr() for t in text if t.dtype == dtype and t.numel())
        assert (first - base) % 16 == 0
