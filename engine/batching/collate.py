"""Collate encoded records into one forward pass, plan token-budget batches, split results back.

Two layouts, both invisible to the answers (SPEC section 5):
- `packed`: every record back to back in ONE row `(1, T)`, no padding. Row 0 of the 4-row position ids
  restarts at 0 for each record; transformers turns such position ids into a block-diagonal causal mask
  (sdpa/eager/flex) or variable-length FlashAttention, so records never see each other. Best with
  flash/flex/varlen kernels.
- `padded`: `(B, Lmax)` right-padded with a 2D attention mask. Best for plain sdpa on the GPU, whose dense
  mask would otherwise cost `T^2` attention over a packed row.
Text-only records use the same position for the three multimodal RoPE rows (t, h, w), as `get_rope_index`
does. Records with media get their t/h/w rows and a `MediaBatch` from `engine.batching.collate_media`; a
text-only
batch never builds one, so its tensors are unchanged.

`SpanIndex` holds every gather/scatter index the joint head needs (built here on the CPU, once per batch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt
import torch

from engine.batching.collate_media import MediaBatch, RopeIndex, collate_media
from engine.types import EncodedRequest, map_tensor_fields

Layout = Literal["packed", "padded"]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class SpanIndex:
    """Index tensors for the head. T real tokens, B records, Q questions, N options, M span tokens."""

    num_records: int
    num_questions: int
    num_options: int
    max_length: int
    max_questions: int
    max_options: int
    last_token: torch.Tensor  # (B,) flat index of each record's last token
    token_record: torch.Tensor  # (T,) record of each flat token
    token_position: torch.Tensor  # (T,) position of each flat token inside its record
    memory_padding: torch.Tensor  # (B, Lmax) bool, True = padding
    question_tokens: torch.Tensor  # (Mq,) flat token indices of all question spans
    question_segment: torch.Tensor  # (Mq,) question of each of those tokens
    option_tokens: torch.Tensor  # (Mo,) flat token indices of all option spans
    option_segment: torch.Tensor  # (Mo,) option of each of those tokens
    option_token_ids: torch.Tensor  # (Mo,) token ids at option_tokens (rows of E)
    question_record: torch.Tensor  # (Q,)
    question_slot: torch.Tensor  # (Q,) index of the question inside its record
    question_type: torch.Tensor  # (Q,) 0 noul, 1 choice, 2 score
    question_padding: torch.Tensor  # (B, Kmax) bool, True = padding
    option_record: torch.Tensor  # (N,)
    option_slot: torch.Tensor  # (N,) index of the option inside its record (all questions)
    option_question: torch.Tensor  # (N,) global question index of each option

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> SpanIndex:
        """A copy with `fn` applied to every tensor field (e.g. a device move)."""
        return map_tensor_fields(self, fn)


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
        """Move every tensor to `device`. On CUDA the text tensors travel as one pinned buffer per dtype
        (one non-blocking host-to-device copy each, then views), not one copy per index tensor."""
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


def _to_device_packed(tensors: Sequence[torch.Tensor], dev: torch.device) -> dict[int, torch.Tensor]:
    """Device copies of CPU `tensors`, keyed by `id()` of each source: one pinned staging buffer and one
    non-blocking copy per dtype. The pinned buffer comes from torch's caching host allocator, which keeps
    it alive until the copy has run."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    out: dict[int, torch.Tensor] = {}
    for dtype, group in by_dtype.items():
        sizes = [t.numel() for t in group]
        staging = torch.empty(sum(sizes), dtype=dtype, pin_memory=True)
        torch.cat([t.reshape(-1) for t in group], out=staging)
        flat = staging.to(dev, non_blocking=True)
        for t, part in zip(group, torch.split(flat, sizes), strict=True):
            out[id(t)] = part.view(t.shape)
    return out


def _expand(starts: IntArray, lengths: IntArray) -> IntArray:
    """Concatenate ranges [s, s+n) for every (s, n), vectorised."""
    total = int(lengths.sum())
    offsets = np.repeat(np.cumsum(lengths) - lengths, lengths)  # (total,)
    return np.repeat(starts, lengths) + (np.arange(total, dtype=np.int64) - offsets)  # (total,)


def _t(a: npt.ArrayLike) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))


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
    questions or options, a span outside its record, or inconsistent media.
    """
    if not encoded:
        raise ValueError("collate needs at least one record")
    for r, rec in enumerate(encoded):
        if not rec.question_spans or any(len(o) == 0 for o in rec.option_spans):
            raise ValueError(f"record {r}: needs at least one question and one option per question")
    lengths = np.array([rec.num_tokens for rec in encoded], dtype=np.int64)  # (B,)
    if (lengths <= 0).any():
        raise ValueError("every record needs at least one token")
    starts = np.cumsum(lengths) - lengths  # (B,) flat offset of each record
    num_records, max_len, total = len(encoded), int(lengths.max()), int(lengths.sum())

    q_span = np.array([s for rec in encoded for s in rec.question_spans], dtype=np.int64).reshape(-1, 2)
    q_rec = np.repeat(np.arange(num_records), [len(rec.question_spans) for rec in encoded])  # (Q,)
    opts_per_q = [tuple(len(o) for o in rec.option_spans) for rec in encoded]
    n_per_q = np.array([n for counts in opts_per_q for n in counts], dtype=np.int64)  # (Q,)
    o_span = np.array(
        [s for rec in encoded for spans in rec.option_spans for s in spans], dtype=np.int64
    ).reshape(-1, 2)
    o_q = np.repeat(np.arange(len(q_rec)), n_per_q)  # (N,)
    o_rec = q_rec[o_q]  # (N,)
    for name, spans, rec_of in (("question", q_span, q_rec), ("option", o_span, o_rec)):
        bad = (spans[:, 0] < 0) | (spans[:, 1] <= spans[:, 0]) | (spans[:, 1] > lengths[rec_of])
        if bad.any():
            raise ValueError(f"record {int(rec_of[bad.argmax()])}: empty or out-of-range {name} span")

    def slots(owner: IntArray) -> IntArray:  # index of each item within its (sorted) owner group
        counts = np.bincount(owner, minlength=num_records)
        return np.arange(len(owner)) - np.repeat(np.cumsum(counts) - counts, counts)

    q_len = q_span[:, 1] - q_span[:, 0]
    o_len = o_span[:, 1] - o_span[:, 0]
    q_tok = _expand(starts[q_rec] + q_span[:, 0], q_len)  # (Mq,)
    o_tok = _expand(starts[o_rec] + o_span[:, 0], o_len)  # (Mo,)
    flat_ids = np.fromiter((t for rec in encoded for t in rec.input_ids), dtype=np.int64, count=total)  # (T,)
    token_record = np.repeat(np.arange(num_records), lengths)  # (T,)
    token_position = np.arange(total) - np.repeat(starts, lengths)  # (T,)
    q_per_rec = np.bincount(q_rec, minlength=num_records)
    o_per_rec = np.bincount(o_rec, minlength=num_records)
    index = SpanIndex(
        num_records=num_records,
        num_questions=len(q_rec),
        num_options=len(o_q),
        max_length=max_len,
        max_questions=int(q_per_rec.max()),
        max_options=int(o_per_rec.max()),
        last_token=_t(starts + lengths - 1),
        token_record=_t(token_record),
        token_position=_t(token_position),
        memory_padding=torch.from_numpy(np.arange(max_len)[None, :] >= lengths[:, None]),
        question_tokens=_t(q_tok),
        question_segment=_t(np.repeat(np.arange(len(q_rec)), q_len)),
        option_tokens=_t(o_tok),
        option_segment=_t(np.repeat(np.arange(len(o_q)), o_len)),
        option_token_ids=_t(flat_ids[o_tok]),
        question_record=_t(q_rec),
        question_slot=_t(slots(q_rec)),
        question_type=_t([t for rec in encoded for t in rec.question_types]),
        question_padding=torch.from_numpy(np.arange(int(q_per_rec.max()))[None, :] >= q_per_rec[:, None]),
        option_record=_t(o_rec),
        option_slot=_t(slots(o_rec)),
        option_question=_t(o_q),
    )
    if layout == "packed":
        text_pos = _t(token_position)[None, None, :]  # (1, 1, T)
        batch = ModelBatch(
            layout=layout,
            input_ids=_t(flat_ids)[None, :],  # (1, T)
            position_ids=text_pos.expand(4, 1, total).contiguous(),  # (4, 1, T)
            attention_mask=None,
            token_gather=None,
            index=index,
            lengths=tuple(int(n) for n in lengths),
            question_ids=tuple(rec.question_ids for rec in encoded),
            options_per_question=tuple(opts_per_q),
        )
    elif layout == "padded":
        grid = token_record * max_len + token_position  # (T,) flat index into (B * Lmax)
        ids = np.full(num_records * max_len, pad_token_id, dtype=np.int64)
        ids[grid] = flat_ids
        mask = (~index.memory_padding).to(torch.int64)  # (B, Lmax)
        pos = torch.arange(max_len, dtype=torch.int64)[None, None, :].expand(4, num_records, max_len)
        batch = ModelBatch(
            layout=layout,
            input_ids=_t(ids).view(num_records, max_len),  # (B, Lmax)
            position_ids=pos.contiguous(),  # (4, B, Lmax)
            attention_mask=mask,
            token_gather=_t(grid),
            index=index,
            lengths=tuple(int(n) for n in lengths),
            question_ids=tuple(rec.question_ids for rec in encoded),
            options_per_question=tuple(opts_per_q),
        )
    else:
        raise ValueError(f"unknown layout {layout!r}")
    if any(rec.media for rec in encoded):
        position_ids, media = collate_media(
            encoded,
            batch.input_ids,
            batch.position_ids,
            [int(s) for s in starts],
            padded=layout == "padded",
            pad_token_id=pad_token_id,
            rope_index=rope_index,
            n_window=n_window,
        )
        batch = replace(batch, position_ids=position_ids, media=media)
    return batch if device is None else batch.to(device)


def plan_batches(
    lengths: Sequence[int], max_tokens: int, max_records: int, *, packed: bool = False
) -> list[list[int]]:
    """Group record indices into batches of at most `max_records` records and `max_tokens` tokens
    (padded tokens `len(batch) * longest`, or the plain sum when `packed`).

    Records are taken longest first (stable), so each batch holds similar lengths and the padded cost
    `len(batch) * longest` stays close to the packed cost; a record longer than `max_tokens` runs alone.
    Every index appears exactly once. Raises ValueError for non-positive limits.
    """
    if max_tokens <= 0 or max_records <= 0:
        raise ValueError("max_tokens and max_records must be positive")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    total = 0
    for i in order:
        size = lengths[i]
        longest_if = max(longest, size)
        cost = total + size if packed else longest_if * (len(current) + 1)
        if current and (len(current) >= max_records or cost > max_tokens):
            batches.append(current)
            current, longest_if, total = [], size, 0
        current.append(i)
        longest = longest_if
        total += size
    if current:
        batches.append(current)
    return batches


def segment_mean(
    values: torch.Tensor, rows: torch.Tensor | None, segment: torch.Tensor, num_segments: int
) -> torch.Tensor:
    """Float32 mean of `values[rows]` (or `values`) per segment id: (num_segments, D)."""
    picked = values if rows is None else values[rows]  # (M, D)
    sums = torch.zeros(num_segments, picked.shape[-1], dtype=torch.float32, device=picked.device)  # (S, D)
    sums.index_add_(0, segment, picked.float())
    # index_add rather than bincount: bincount sizes its output from the data, a device-to-host sync.
    ones = torch.ones(segment.shape[0], dtype=torch.float32, device=segment.device)  # (M,)
    counts = torch.zeros(num_segments, dtype=torch.float32, device=segment.device)  # (S,)
    counts = counts.index_add_(0, segment, ones).clamp_min(1.0)
    return sums / counts[:, None]  # (S, D)


def segment_softmax(logits: torch.Tensor, segment: torch.Tensor, num_segments: int) -> torch.Tensor:
    """Softmax of float32 `logits` (N,) within each segment id; returns (N,) float32."""
    x = logits.float()  # (N,)
    peak = torch.full((num_segments,), float("-inf"), dtype=torch.float32, device=x.device)  # (S,)
    peak = peak.scatter_reduce(0, segment, x, reduce="amax", include_self=True)  # (S,)
    e = torch.exp(x - peak[segment])  # (N,)
    total = torch.zeros(num_segments, dtype=torch.float32, device=x.device).index_add_(0, segment, e)  # (S,)
    return e / total[segment]  # (N,)


class _BatchModel(Protocol):
    def forward_batch(self, batch: ModelBatch) -> list[list[npt.NDArray[np.float32]]]: ...


def forward(model: _BatchModel, batch: ModelBatch) -> list[dict[str, npt.NDArray[np.float32]]]:
    """Run `model.forward_batch` and key each record's probabilities by question id (request order)."""
    per_record = model.forward_batch(batch)
    return [
        dict(zip(qids, probs, strict=True))
        for qids, probs in zip(batch.question_ids, per_record, strict=True)
    ]
