"""Collating media records: text-only batches untouched, media tensors concatenated/padded in batch order,
per-record rope rows, placeholders confined to media spans, and the fast-path guard."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from engine.batching.collate import Layout, collate
from engine.runner import Engine
from engine.types import EncodedRequest
from schemas.systemone import parse_request


def encode(engine: Engine, body: dict[str, Any]) -> EncodedRequest:
    return engine.prepare(parse_request(body)).encoded


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_text_only_batches_are_unchanged(
    engine: Engine, requests: dict[str, dict[str, Any]], layout: Layout
) -> None:
    records = [encode(engine, requests[n]) for n in ("text", "text_long")]
    ours = engine.model.collate(records, layout=layout)
    plain = collate(records, layout=layout, pad_token_id=engine.model.pad_token_id)
    assert ours.media is None
    assert torch.equal(ours.input_ids, plain.input_ids)
    assert torch.equal(ours.position_ids, plain.position_ids)
    assert torch.equal(ours.position_ids[1], ours.position_ids[0])


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_media_tensors_and_positions(
    engine: Engine, requests: dict[str, dict[str, Any]], layout: Layout
) -> None:
    names = ("text", "audio", "image", "everything", "short_audio", "video_silent")
    records = [encode(engine, requests[n]) for n in names]
    batch = engine.model.collate(records, layout=layout)
    media = batch.media
    assert media is not None
    with_media = [r.media for r in records if r.media]
    vision = (
        "pixel_values",
        "image_grid_thw",
        "pixel_values_videos",
        "video_grid_thw",
        "video_second_per_grid",
    )
    for key in vision:
        expected = torch.cat([m[key] for m in with_media if key in m])
        assert torch.equal(getattr(media, key), expected), key
    features = [m["input_features"] for m in with_media if "input_features" in m]
    assert media.input_features is not None
    assert media.feature_attention_mask is not None
    longest = max(f.shape[-1] for f in features)
    assert media.input_features.shape == (sum(f.shape[0] for f in features), features[0].shape[1], longest)
    row = 0
    for record_features, m in zip(features, [m for m in with_media if "input_features" in m], strict=True):
        n, width = record_features.shape[0], record_features.shape[-1]
        assert torch.equal(media.input_features[row : row + n, :, :width], record_features)
        assert not media.input_features[row : row + n, :, width:].any()
        assert torch.equal(media.feature_attention_mask[row : row + n, :width], m["feature_attention_mask"])
        assert not media.feature_attention_mask[row : row + n, width:].any()
        row += n
    # short_audio (< one 100-frame chunk) must not share an audio tower call with longer clips
    short_row = row - 1
    assert any(group == (short_row,) for group in media.audio_groups)
    assert sorted(r for g in media.audio_groups for r in g) == list(range(row))

    start = 0
    for index, record in enumerate(records):
        if layout == "packed":
            pos = batch.position_ids[:, 0, start : start + record.num_tokens]
            ids = media.placeholder_ids[0, start : start + record.num_tokens]
        else:
            pos = batch.position_ids[:, index, : record.num_tokens]
            ids = media.placeholder_ids[index, : record.num_tokens]
        start += record.num_tokens
        assert torch.equal(pos[0], torch.arange(record.num_tokens))
        if not record.media:
            assert torch.equal(pos[1], pos[0])
            assert torch.equal(pos[3], pos[0])
            assert (ids == engine.model.pad_token_id).all()
            continue
        assert torch.equal(pos[1:], engine.model.rope_index(record))
        lo, hi = record.media_span  # type: ignore[misc]
        assert ids[lo:hi].tolist() == list(record.input_ids[lo:hi])
        assert (ids[:lo] == engine.model.pad_token_id).all()
        assert (ids[hi:] == engine.model.pad_token_id).all()


def test_video_rope_rows_follow_time_and_grid(engine: Engine, requests: dict[str, dict[str, Any]]) -> None:
    record = encode(engine, requests["video_silent"])
    rope = engine.model.rope_index(record)
    lo, hi = record.media_span  # type: ignore[misc]
    assert torch.equal(rope[:, :lo], torch.arange(lo).expand(3, lo))
    video_pad = engine.tokenizer.convert_tokens_to_ids("<|video_pad|>")  # type: ignore[attr-defined]
    pads = torch.tensor(record.input_ids) == video_pad
    t_values = sorted(set(rope[0, pads].tolist()))
    assert len(t_values) == int(record.media["video_grid_thw"][0, 0])  # type: ignore[index]
    assert t_values[1] - t_values[0] == 13  # one temporal patch = 1 s = 13 position ids
    tail = rope[:, hi:]
    assert torch.equal(tail[0], tail[1])
    assert int(tail[0, 0]) == int(rope[:, :hi].max()) + 1


def test_media_batch_needs_a_rope_index(engine: Engine, requests: dict[str, dict[str, Any]]) -> None:
    with pytest.raises(ValueError, match="rope_index"):
        collate([encode(engine, requests["image"])])


def test_media_batches_never_take_the_fast_path(engine: Engine, requests: dict[str, dict[str, Any]]) -> None:
    model: Any = engine.model
    records = [encode(engine, requests["image"]), encode(engine, requests["text"])]
    batch = model.collate(records, layout="packed")
    expected = model.forward_batch(batch)
    sentinel = object()  # would fail loudly if the fast decoder were called
    model._fast = sentinel
    try:
        with pytest.raises(ValueError, match="fast path"):
            model._fast_hidden_states(model.thinker.model, batch)
        got = model.forward_batch(batch)
    finally:
        model._fast = None
    for a, b in zip(expected, got, strict=True):
        for x, y in zip(a, b, strict=True):
            assert (x == y).all()
