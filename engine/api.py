"""`systemone(model, processor, request)`: answer one SystemOne request from Python (blocking).

For many requests build an `engine.Engine` once and call `Engine.decide`; this function is the
convenience form of the same path (validate -> prepare -> one forward pass -> response).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from engine.config import EngineConfig, dtype_name
from engine.model.clef import ClefOmniModel
from engine.runner import Engine
from schemas.systemone import SystemOneRequest, SystemOneResponse, parse_request

if TYPE_CHECKING:
    from torch import nn

    from engine.model.release import LoadedModel


def _unwrap(model: LoadedModel | ClefOmniModel, processor: object) -> tuple[ClefOmniModel, object]:
    """The `ClefOmniModel` and the tokenizer to use for (`LoadedModel` or model, processor or tokenizer).

    A `LoadedModel`'s own tokenizer stands in when `processor` is None (no multimodal processor)."""
    from engine.model.release import LoadedModel

    if isinstance(model, LoadedModel):
        return model.model, processor if processor is not None else model.tokenizer
    if processor is None:
        raise TypeError("systemone needs the tokenizer or processor that load_release_model returned")
    return model, processor


def config_for(model: nn.Module, **overrides: Any) -> EngineConfig:
    """An `EngineConfig` matching where `model` lives (device and dtype of its first parameter)."""
    first = next(iter(model.parameters()))
    base = EngineConfig(device=str(first.device), dtype=dtype_name(first.dtype) or "float32")
    return replace(base, **overrides)


def systemone(
    model: LoadedModel | ClefOmniModel,
    processor: object,
    request: SystemOneRequest | Mapping[str, Any] | str | bytes,
    **config: Any,
) -> SystemOneResponse:
    """Answer one request with a loaded model (a `LoadedModel` or its `ClefOmniModel`).

    `processor` is the tokenizer/processor `load_release_model` returned; `request` a `SystemOneRequest`,
    a decoded body (dict) or JSON text. Keyword arguments override `EngineConfig` fields (for example
    `confidence_formula="top"` or `truncate_state=False`). Raises `RequestError` for an invalid or
    over-long request; model errors propagate.
    """
    inner, tokenizer = _unwrap(model, processor)
    engine = Engine(inner, tokenizer, config_for(inner, **config))
    prepared = engine.prepare(parse_request(request))
    return engine.execute([prepared])[0]
