"""Collate encoded records into one forward pass, and split its results back per record.

Two layouts, both invisible to the answers (SPEC section 5):
- `packed`: every record back to back in ONE row `(1, T)`, no padding. Row 0 of the 4-row position ids
  restarts at 0 for each record; transformers turns such position ids into a block-diagonal causal mask
  (sdpa/eager/flex) or variable-length FlashAttention, so records never see each other. Best with
  flash/flex/varlen kernels.
- `padded`: `(B, Lmax)` right-padded with a 2D attention mask. Best for plain sdpa on the GPU, whose dense
  mask would otherwise cost `T^2` attention over a packed row.
Text-only records use the same position for the three multimodal RoPE rows (t, h, w), as `get_rope_index`
does. Records with media get their t/h/w rows and a `MediaBatch` from `engine.batching.collate_media`; a
text-only batch never builds one, so its tensors are unchanged. Which records share a pass is
`engine.batching.cut`'s call.

`SpanIndex` holds every gather/scatter index the joint head needs (built here on the CPU, once per batch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch

from engine.batching.collate_media import MediaBatch, RopeIndex, collate_media
from engine.batching.cut import Layout
from engine.batching.spans import (
    FlatTokens,
    SpanIndex,
    check_records,
    flat_spans,
    flat_tokens,
    int_tensor,
    span_index,
)
from engine.types import Between, EncodedRequest, Launched

__all__ = [
    "Layout",
    "ModelBatch",
    "SpanIndex",
    "collate",
    "forward",
    "launch_forward",
    "segment_mean",
    "segment_softmax",
]


@dataclass(frozen=True, slots=True)
class ModelBatch:
    """One forward pass. `input_ids`/`position_ids`/`attention_mask` go to the thinker's text model."""

    layout: Layout
    input_ids: torch.Tensor  # (1, T) packed or (B, Lmax) padded, int64
    position_ids: torch.Tensor  # (4, rows, cols): text positions, then t/h/w RoPE positions
    attention_mask: torch.Tensor | None  # (B, Lmax) int64 for padded, None for packed
    token_gather: (
        torch.Tensor | None
    )  # (T,) flat index of real tokens in the (rows*cols) grid; None if packed
    index: SpanIndex
    lengths: tuple[int, ...]
    question_ids: tuple[tuple[str, ...], ...]
    options_per_question: tuple[tuple[int, ...], ...]
    media: MediaBatch | None = None  # None for a text-only batch

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)

    def to(self, device: torch.device | str) -> ModelBatch:
        """Move every tensor to `device`. On CUDA the text tensors travel in one pinned buffer (one
        non-blocking host-to-device copy, then views; `_to_device_packed`), not one copy per tensor."""
        dev = torch.device(device)
        if dev.type != "cuda":
            return self._map(lambda t: t.to(dev), lambda t: t.to(dev))
        text: list[torch.Tensor] = []

        def collect(t: torch.Tensor) -> torch.Tensor:
            text.append(t)
            return t

        self._map(collect, lambda t: t)  # lists every text tensor once; media moves on its own below
        moved = _to_device_packed(text, dev)
        return self._map(lambda t: moved[id(t)], lambda t: t.pin_memory().to(dev, non_blocking=True))

    def _map(
        self, text: Callable[[torch.Tensor], torch.Tensor], media: Callable[[torch.Tensor], torch.Tensor]
    ) -> ModelBatch:
        return replace(
            self,
            input_ids=text(self.input_ids),
            position_ids=text(self.position_ids),
            attention_mask=None if self.attention_mask is None else text(self.attention_mask),
            token_gather=None if self.token_gather is None else text(self.token_gather),
            index=self.index.map_tensors(text),
            media=None if self.media is None else self.media.map_tensors(media),
        )


_ALIGN = 16
"""Byte alignment of each dtype's run in `_to_device_packed`'s buffer: every element size divides it, so
each run views as its dtype (inside a run the tensors follow one another, as they did in a buffer of
their own)."""


def _to_device_packed(tensors: Sequence[torch.Tensor], dev: torch.device) -> dict[int, torch.Tensor]:
    """Device copies of CPU `tensors`, keyed by `id()` of each source: one staging buffer of bytes (pinned
    on CUDA), every dtype's tensors back to back from an offset aligned to `_ALIGN` bytes, and one
    non-blocking copy of the whole, then views (before, one buffer and one copy per dtype: a text batch
    has int64 and bool tensors, so two). The pinned buffer comes from torch's caching host allocator,
    which keeps it alive until the copy has run."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    spans: list[tuple[torch.dtype, list[torch.Tensor], int, int]] = []  # dtype, tensors, byte offset, bytes
    offset = 0
    for dtype, group in by_dtype.items():
        nbytes = sum(t.numel() for t in group) * group[0].element_size()
        spans.append((dtype, group, offset, nbytes))
        offset += -(-nbytes // _ALIGN) * _ALIGN
    staging = torch.empty(offset, dtype=torch.uint8, pin_memory=dev.type == "cuda")
    for dtype, group, start, nbytes in spans:
        torch.cat([t.reshape(-1) for t in group], out=staging[start : start + nbytes].view(dtype))
    flat = staging.to(dev, non_blocking=True)
    out: dict[int, torch.Tensor] = {}
    for dtype, group, start, nbytes in spans:
        sizes = [t.numel() for t in group]
        parts = torch.split(flat[start : start + nbytes].view(dtype), sizes)
        for t, part in zip(group, parts, strict=True):  # a 1-D tensor's part has its shape already
            out[id(t)] = part if t.dim() == 1 else part.view(t.shape)
    return out


_TextInputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]
"""`input_ids`, `position_ids`, `attention_mask`, `token_gather` of a `ModelBatch`."""


def _packed_inputs(tokens: FlatTokens) -> _TextInputs:
    """One row of every token; text positions restart at 0 per record. No mask, no gather."""
    total = len(tokens.ids)
    text_pos = int_tensor(tokens.position)[None, None, :]  # (1, 1, T)
    input_ids = int_tensor(tokens.ids)[None, :]  # (1, T)
    return input_ids, text_pos.expand(4, 1, total).contiguous(), None, None  # position_ids (4, 1, T)


def _padded_inputs(tokens: FlatTokens, index: SpanIndex, pad_token_id: int) -> _TextInputs:
    """One right-padded row per record, its 2D mask, and where each real token sits in the grid."""
    num_records, max_len = len(tokens.lengths), tokens.max_length
    grid = tokens.record * max_len + tokens.position  # (T,) flat index into (B * Lmax)
    ids = np.full(num_records * max_len, pad_token_id, dtype=np.int64)  # (B * Lmax,)
    ids[grid] = tokens.ids
    mask = (~index.memory_padding).to(torch.int64)  # (B, Lmax)
    pos = torch.arange(max_len, dtype=torch.int64)[None, None, :].expand(4, num_records, max_len)
    input_ids = int_tensor(ids).view(num_records, max_len)  # (B, Lmax)
    return input_ids, pos.contiguous(), mask, int_tensor(grid)  # position_ids (4, B, Lmax)


def collate(
    encoded: Sequence[EncodedRequest],
    *,
    layout: Layout = "packed",
    pad_token_id: int = 0,
    device: torch.device | str | None = None,
    rope_index: RopeIndex | None = None,
    n_window: int = 50,
) -> ModelBatch:
    """Collate records for one forward pass (CPU work; moved to `device` when given).

    Records with media also need `rope_index` (their 3D rope positions) and the audio tower's
    `n_window`; see `engine.batching.collate_media`. Raises ValueError for an empty batch, a record without
    questions or options, a span outside its record, an unknown layout, or inconsistent media.
    """
    check_records(encoded)
    tokens = flat_tokens(encoded)
    spans = flat_spans(encoded, tokens.lengths)
    index = span_index(encoded, tokens, spans)
    if layout == "packed":
        input_ids, position_ids, attention_mask, token_gather = _packed_inputs(tokens)
    elif layout == "padded":
        input_ids, position_ids, attention_mask, token_gather = _padded_inputs(tokens, index, pad_token_id)
    else:
        raise ValueError(f"unknown layout {layout!r}")
    batch = ModelBatch(
        layout=layout,
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=attention_mask,
        token_gather=token_gather,
        index=index,
        lengths=tuple(int(n) for n in tokens.lengths),
        question_ids=tuple(rec.question_ids for rec in encoded),
        options_per_question=spans.options_per_question,
    )
    if any(rec.media for rec in encoded):
        position_ids, media = collate_media(
            encoded,
            batch.input_ids,
            batch.position_ids,
            [int(s) for s in tokens.starts],
            padded=layout == "padded",
            pad_token_id=pad_token_id,
            rope_index=rope_index,
            n_window=n_window,
        )
        batch = replace(batch, position_ids=position_ids, media=media)
    return batch if device is None else batch.to(device)


def segment_mean(
    values: torch.Tensor, rows: torch.Tensor | None, segment: torch.Tensor, counts: torch.Tensor
) -> torch.Tensor:
    """Float32 mean of `values[rows]` (or `values`) per segment id: (S, D) for `counts` (S,), the rows of
    each segment (at least 1; int64 from the host's `SpanIndex`, so no device work counts them)."""
    picked = values if rows is None else values[rows]  # (M, D)
    sums = torch.zeros(counts.shape[0], picked.shape[-1], dtype=torch.float32, device=picked.device)  # (S, D)
    sums.index_add_(0, segment, picked.float())
    return sums / counts[:, None]  # (S, D) float32: an int64 divisor is cast exactly in the division


def segment_softmax(logits: torch.Tensor, segment: torch.Tensor, num_segments: int) -> torch.Tensor:
    """Softmax of float32 `logits` (N,) within each segment id; returns (N,) float32."""
    x = logits.float()  # (N,)
    peak = torch.full((num_segments,), float("-inf"), dtype=torch.float32, device=x.device)  # (S,)
    peak = peak.scatter_reduce(0, segment, x, reduce="amax", include_self=True)  # (S,)
    e = torch.exp(x - peak[segment])  # (N,)
    total = torch.zeros(num_segments, dtype=torch.float32, device=x.device).index_add_(0, segment, e)  # (S,)
    return e / total[segment]  # (N,)


class _BatchModel(Protocol):
    def launch_batch(
        self, batch: ModelBatch, between: Between | None = None
    ) -> Launched[list[list[npt.NDArray[np.float32]]]]: ...


class _Keyed:
    """`launch_forward`'s result: the model's launched probabilities keyed by question id once they landed."""

    def __init__(
        self, launched: Launched[list[list[npt.NDArray[np.float32]]]], question_ids: Sequence[Sequence[str]]
    ) -> None:
        self._launched = launched
        self._question_ids = question_ids

    def wait(self) -> tuple[list[dict[str, npt.NDArray[np.float32]]], float | None]:
        per_record, seconds = self._launched.wait()
        keyed = [
            dict(zip(qids, probs, strict=True))
            for qids, probs in zip(self._question_ids, per_record, strict=True)
        ]
        return keyed, seconds


def launch_forward(
    model: _BatchModel, batch: ModelBatch, between: Between | None = None
) -> Launched[list[dict[str, npt.NDArray[np.float32]]]]:
    """Launch `model.launch_batch` (passing `between` on); its `wait()` gives each record's probabilities
    keyed by question id (request order)."""
    return _Keyed(model.launch_batch(batch, between), batch.question_ids)


def forward(
    model: _BatchModel, batch: ModelBatch, between: Between | None = None
) -> list[dict[str, npt.NDArray[np.float32]]]:
    """`launch_forward` and wait for it (blocking)."""
    return launch_forward(model, batch, between).wait()[0]
