"""Collate the media side of a batch: processor tensors across records and media-aware position ids.

`engine.batching.collate.collate` calls in here only when a record carries media; text-only batches never
touch
this module, so their tensors stay exactly what the fast path expects.

- Vision tensors (`pixel_values`, `image_grid_thw`, `pixel_values_videos`, `video_grid_thw`,
  `video_second_per_grid`) are concatenated in batch order: the towers see every image (video) of the
  batch in one call, and features land on the placeholders in the same (flat token) order.
- Audio: `input_features` are right-padded on their last axis to the batch's longest and concatenated,
  `feature_attention_mask` padded with 0. The audio tower pads its chunks to the longest chunk of its
  call, which changes a short clip's convolutions, so its rows are grouped by record "chunk key" (the
  longest chunk of the record alone): each tower call then pads exactly as the record alone would.
- Positions: row 0 stays the token position inside the record (it drives the block-diagonal mask);
  rows 1..3 of a media record come from `RopeIndex` (Qwen3-Omni's 3D rope index, computed per record,
  so one record's flags such as use_audio_in_video never leak into another's).
- `placeholder_ids`: the batch's input ids with every token outside a record's media span replaced by
  the pad id, so a state that spells out `<|image_pad|>` never receives image features.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.media.features import audio_output_length
from engine.types import EncodedRequest, map_tensor_fields

RopeIndex = Callable[[EncodedRequest], torch.Tensor]
"""(record) -> (3, L) int64 t/h/w rope positions of a media record (see `model_media.rope_positions`)."""


@dataclass(frozen=True, slots=True)
class MediaBatch:
    """The thinker's media inputs for one batch (records in batch order; None = no such media).

    `audio_groups[g]` lists the rows of `input_features` the audio tower runs together in call g;
    `audio_tokens[a]` is the number of audio tokens row a yields.
    """

    placeholder_ids: torch.Tensor  # (rows, cols) int64 ids, pad id outside media spans
    pixel_values: torch.Tensor | None  # (image patches, C*tp*p*p)
    image_grid_thw: torch.Tensor | None  # (images, 3)
    pixel_values_videos: torch.Tensor | None  # (video patches, C*tp*p*p)
    video_grid_thw: torch.Tensor | None  # (videos, 3)
    video_second_per_grid: torch.Tensor | None  # (videos,)
    input_features: torch.Tensor | None  # (audios, mel, Fmax)
    feature_attention_mask: torch.Tensor | None  # (audios, Fmax) int64, 0 = padding
    audio_groups: tuple[tuple[int, ...], ...] = ()
    audio_tokens: tuple[int, ...] = ()

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> MediaBatch:
        """A copy with `fn` applied to every tensor field (e.g. a device move)."""
        return map_tensor_fields(self, fn)


def has_media(record: EncodedRequest) -> bool:
    """True when the record carries media tensors and a non-empty media span."""
    span = record.media_span
    return bool(record.media) and span is not None and span[1] > span[0]


def check_media_record(index: int, record: EncodedRequest) -> None:
    """Raise ValueError unless a record with media tensors also has a valid media span."""
    if not record.media:
        return
    span = record.media_span
    if span is None or not 0 <= span[0] < span[1] <= record.num_tokens:
        raise ValueError(f"record {index}: media tensors without a valid media span")


def _cat(media: Sequence[Mapping[str, Any]], key: str) -> torch.Tensor | None:
    parts = [m[key] for m in media if m.get(key) is not None]
    return torch.cat(parts, dim=0) if parts else None


def _audio(
    media: Sequence[Mapping[str, Any]], n_window: int
) -> tuple[torch.Tensor | None, torch.Tensor | None, tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """Padded features, padded mask, tower call groups and per-row token counts."""
    features = [m["input_features"] for m in media if m.get("input_features") is not None]
    masks = [m["feature_attention_mask"] for m in media if m.get("input_features") is not None]
    if not features:
        return None, None, (), ()
    longest = max(int(f.shape[-1]) for f in features)
    pad = torch.nn.functional.pad
    padded = torch.cat([pad(f, (0, longest - f.shape[-1])) for f in features])  # (A, mel, F)
    mask = torch.cat([pad(m.to(torch.int64), (0, longest - m.shape[-1])) for m in masks])  # (A, F)
    lengths = [int(n) for n in mask.sum(-1).tolist()]
    groups: dict[int, list[int]] = {}
    row = 0
    for m in masks:
        rows = list(range(row, row + m.shape[0]))
        key = max(min(lengths[r], 2 * n_window) for r in rows)  # the record's longest tower chunk
        groups.setdefault(key, []).extend(rows)
        row += m.shape[0]
    tokens = tuple(audio_output_length(n, n_window) for n in lengths)
    return padded, mask, tuple(tuple(g) for g in groups.values()), tokens


def collate_media(
    encoded: Sequence[EncodedRequest],
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    starts: Sequence[int],
    *,
    padded: bool,
    pad_token_id: int,
    rope_index: RopeIndex | None,
    n_window: int = 50,
) -> tuple[torch.Tensor, MediaBatch]:
    """Media tensors of a batch and its position ids with media records' rope rows filled in.

    `input_ids`/`position_ids` are the text collate's (1, T)/(4, 1, T) packed or (B, L)/(4, B, L)
    padded tensors; `starts[r]` is record r's flat offset (packed). Returns new position ids (the input
    is not modified) and the `MediaBatch`. Raises ValueError when a record's media is inconsistent or
    `rope_index` is missing.
    """
    if rope_index is None:
        raise ValueError("a batch with media needs a rope_index (use ClefOmniModel.collate)")
    positions = position_ids.clone()
    keep = torch.zeros(input_ids.shape, dtype=torch.bool)  # (rows, cols) True inside media spans
    media: list[Mapping[str, Any]] = []
    for r, rec in enumerate(encoded):
        check_media_record(r, rec)
        if not has_media(rec):
            continue
        assert rec.media is not None
        assert rec.media_span is not None
        media.append(rec.media)
        rope = rope_index(rec)  # (3, L)
        if tuple(rope.shape) != (3, rec.num_tokens):
            raise ValueError(f"record {r}: rope index shape {tuple(rope.shape)} != (3, {rec.num_tokens})")
        lo, hi = rec.media_span
        if padded:
            positions[1:, r, : rec.num_tokens] = rope
            keep[r, lo:hi] = True
        else:
            positions[1:, 0, starts[r] : starts[r] + rec.num_tokens] = rope
            keep[0, starts[r] + lo : starts[r] + hi] = True
    features, mask, groups, tokens = _audio(media, n_window)
    batch = MediaBatch(
        placeholder_ids=torch.where(keep, input_ids, torch.full_like(input_ids, pad_token_id)),
        pixel_values=_cat(media, "pixel_values"),
        image_grid_thw=_cat(media, "image_grid_thw"),
        pixel_values_videos=_cat(media, "pixel_values_videos"),
        video_grid_thw=_cat(media, "video_grid_thw"),
        video_second_per_grid=_cat(media, "video_second_per_grid"),
        input_features=features,
        feature_attention_mask=mask,
        audio_groups=groups,
        audio_tokens=tokens,
    )
    return positions, batch
