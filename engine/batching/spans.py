"""Where every record, question and option of a batch sits in its flat token order, and the head's
`SpanIndex` built from that (CPU, numpy, once per batch). B records, T tokens, Q questions, N options.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from engine.types import EncodedRequest, map_tensor_fields

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
    question_length: torch.Tensor  # (Q,) tokens of each question span (at least 1; the means' divisor)
    option_tokens: torch.Tensor  # (Mo,) flat token indices of all option spans
    option_segment: torch.Tensor  # (Mo,) option of each of those tokens
    option_token_ids: torch.Tensor  # (Mo,) token ids at option_tokens (rows of E)
    option_length: torch.Tensor  # (N,) tokens of each option span (at least 1; the means' divisor)
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


def _ranges(starts: IntArray, lengths: IntArray) -> IntArray:
    """Concatenate ranges [s, s+n) for every (s, n), vectorised."""
    total = int(lengths.sum())
    offsets = np.repeat(np.cumsum(lengths) - lengths, lengths)  # (total,)
    return np.repeat(starts, lengths) + (np.arange(total, dtype=np.int64) - offsets)  # (total,)


def int_tensor(a: npt.ArrayLike) -> torch.Tensor:
    """`a` as a contiguous int64 CPU tensor (no copy when it already is one)."""
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))


@dataclass(frozen=True, slots=True)
class FlatTokens:
    """The batch's tokens flattened record after record: B records, T tokens in all."""

    lengths: IntArray  # (B,) tokens per record
    starts: IntArray  # (B,) flat offset of each record
    ids: IntArray  # (T,) token ids
    record: IntArray  # (T,) record of each flat token
    position: IntArray  # (T,) position of each flat token inside its record

    @property
    def max_length(self) -> int:
        return int(self.lengths.max())


@dataclass(frozen=True, slots=True)
class FlatSpans:
    """Every question and option span of the batch, flattened: Q questions, N options."""

    question: IntArray  # (Q, 2) [start, end) inside its record
    question_record: IntArray  # (Q,)
    option: IntArray  # (N, 2) [start, end) inside its record
    option_question: IntArray  # (N,) global question index of each option
    option_record: IntArray  # (N,)
    options_per_question: tuple[tuple[int, ...], ...]  # per record, per question


def check_records(encoded: Sequence[EncodedRequest]) -> None:
    """Raises ValueError for an empty batch or a record without questions or options."""
    if not encoded:
        raise ValueError("collate needs at least one record")
    for r, rec in enumerate(encoded):
        if not rec.question_spans or any(len(o) == 0 for o in rec.option_spans):
            raise ValueError(f"record {r}: needs at least one question and one option per question")


def flat_tokens(encoded: Sequence[EncodedRequest]) -> FlatTokens:
    """The flat token layout; raises ValueError for a record without tokens."""
    lengths = np.array([rec.num_tokens for rec in encoded], dtype=np.int64)  # (B,)
    if (lengths <= 0).any():
        raise ValueError("every record needs at least one token")
    starts = np.cumsum(lengths) - lengths  # (B,)
    total = int(lengths.sum())
    ids = np.fromiter((t for rec in encoded for t in rec.input_ids), dtype=np.int64, count=total)  # (T,)
    record = np.repeat(np.arange(len(encoded)), lengths)  # (T,)
    position = np.arange(total) - np.repeat(starts, lengths)  # (T,)
    return FlatTokens(lengths, starts, ids, record, position)


def flat_spans(encoded: Sequence[EncodedRequest], lengths: IntArray) -> FlatSpans:
    """The flattened spans; raises ValueError for a span that is empty or outside its record."""
    q_span = np.array([s for rec in encoded for s in rec.question_spans], dtype=np.int64).reshape(-1, 2)
    q_rec = np.repeat(np.arange(len(encoded)), [len(rec.question_spans) for rec in encoded])  # (Q,)
    opts_per_q = tuple(tuple(len(o) for o in rec.option_spans) for rec in encoded)
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
    return FlatSpans(q_span, q_rec, o_span, o_q, o_rec, opts_per_q)


def _slots(owner: IntArray, num_records: int) -> IntArray:
    """Index of each item within its owner group (`owner` sorted)."""
    counts = np.bincount(owner, minlength=num_records)
    return np.arange(len(owner)) - np.repeat(np.cumsum(counts) - counts, counts)


def span_index(encoded: Sequence[EncodedRequest], tokens: FlatTokens, spans: FlatSpans) -> SpanIndex:
    """Every gather/scatter index of the head, in flat token coordinates."""
    num_records = len(encoded)
    q_rec, o_rec, o_q = spans.question_record, spans.option_record, spans.option_question
    q_len = spans.question[:, 1] - spans.question[:, 0]  # (Q,)
    o_len = spans.option[:, 1] - spans.option[:, 0]  # (N,)
    q_tok = _ranges(tokens.starts[q_rec] + spans.question[:, 0], q_len)  # (Mq,)
    o_tok = _ranges(tokens.starts[o_rec] + spans.option[:, 0], o_len)  # (Mo,)
    q_per_rec = np.bincount(q_rec, minlength=num_records)  # (B,)
    o_per_rec = np.bincount(o_rec, minlength=num_records)  # (B,)
    max_len = tokens.max_length
    return SpanIndex(
        num_records=num_records,
        num_questions=len(q_rec),
        num_options=len(o_q),
        max_length=max_len,
        max_questions=int(q_per_rec.max()),
        max_options=int(o_per_rec.max()),
        last_token=int_tensor(tokens.starts + tokens.lengths - 1),
        token_record=int_tensor(tokens.record),
        token_position=int_tensor(tokens.position),
        memory_padding=torch.from_numpy(np.arange(max_len)[None, :] >= tokens.lengths[:, None]),
        question_tokens=int_tensor(q_tok),
        question_segment=int_tensor(np.repeat(np.arange(len(q_rec)), q_len)),
        question_length=int_tensor(q_len),
        option_tokens=int_tensor(o_tok),
        option_segment=int_tensor(np.repeat(np.arange(len(o_q)), o_len)),
        option_token_ids=int_tensor(tokens.ids[o_tok]),
        option_length=int_tensor(o_len),
        question_record=int_tensor(q_rec),
        question_slot=int_tensor(_slots(q_rec, num_records)),
        question_type=int_tensor([t for rec in encoded for t in rec.question_types]),
        question_padding=torch.from_numpy(np.arange(int(q_per_rec.max()))[None, :] >= q_per_rec[:, None]),
        option_record=int_tensor(o_rec),
        option_slot=int_tensor(_slots(o_rec, num_records)),
        option_question=int_tensor(o_q),
    )
