"""Typed hand-offs between the engine stages (encode -> batch -> model -> answers).

Plain frozen dataclasses: the encoder produces an `EncodedRequest` on a CPU thread, the GPU worker
collates several of them into one forward pass, and the model returns per-option probabilities in
`schemas.systemone.option_table` order for every question of every record.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, TypeVar

import torch

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_D = TypeVar("_D", bound="DataclassInstance")

# Question type ids, as the joint head's type embedding expects them (SPEC section 4).
TYPE_NOUL = 0
TYPE_CHOICE = 1
TYPE_SCORE = 2

Span = tuple[int, int]
"""Half-open token range [start, end) inside one record's input_ids."""


@dataclass(frozen=True, slots=True)
class EncodedRequest:
    """One request encoded exactly as SPEC section 5 says.

    `question_spans[k]` is question k's instruction span (request order); `option_spans[k][j]` is option j
    of question k in `option_table` order. `media` holds processor outputs (tensors keyed by the names the
    Qwen3-Omni thinker takes, e.g. `pixel_values`, `image_grid_thw`, `input_features`) or is None for a
    text-only record. `media_span` is the half-open range of the media tokens M inside `input_ids` (None
    without media): only placeholders inside it are replaced by media features, so media tokens that a
    state happens to spell out stay plain text.
    """

    input_ids: tuple[int, ...]
    question_ids: tuple[str, ...]
    question_types: tuple[int, ...]
    question_spans: tuple[Span, ...]
    option_spans: tuple[tuple[Span, ...], ...]
    state_truncated: bool = False
    media: Mapping[str, Any] | None = field(default=None)
    media_span: Span | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)


def map_tensor_fields(obj: _D, fn: Callable[[torch.Tensor], torch.Tensor]) -> _D:
    """A copy of dataclass `obj` with `fn` applied to every field holding a tensor (e.g. a device move)."""
    moved = {f.name: fn(v) for f in fields(obj) if isinstance(v := getattr(obj, f.name), torch.Tensor)}
    return replace(obj, **moved)
