"""The engine: prepare (CPU, any thread) -> execute (one GPU worker thread) -> SystemOne responses.

`Engine.prepare` validates media and encodes a request; `Engine.execute` runs one forward pass over a
batch of prepared records and builds their responses; `Engine.decide` strings both together for the
CLI, tests and the Python API. The Kafka consumer and HTTP server call `prepare`/`execute` directly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from engine.batch import Layout, forward, plan_batches
from engine.encode import DEFAULT_MAX_TOKENS, TextEncoder, encoder_for
from engine.model import ClefOmniModel
from engine.types import EncodedRequest
from schemas.systemone import (
    DlqReason,
    ProbabilityError,
    RequestError,
    SystemOneRequest,
    SystemOneResponse,
    build_response,
    parse_request,
)

DTypeName = Literal["float32", "bfloat16", "float16"]
_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How the engine runs. `max_batch_tokens`/`max_batch_records` bound one forward pass; a record
    longer than `max_batch_tokens` still runs, alone. `layout` picks the collate layout (`auto`: the
    model's `preferred_layout`). `device`/`dtype` apply when loading a release. On CUDA, `fast_path`
    runs text-only batches through the packed varlen decoder (`engine.fastpath`), replaying CUDA graphs
    for batches of up to `max(graph_buckets)` tokens; `compile_ops` lets torch.compile fuse its glue."""

    device: str = "cuda"
    dtype: DTypeName = "bfloat16"
    max_batch_tokens: int = 65_536
    max_batch_records: int = 64
    max_tokens: int = DEFAULT_MAX_TOKENS
    truncate_state: bool = True
    confidence_formula: Literal["typesafe", "top"] = "typesafe"
    layout: Literal["auto", "packed", "padded"] = "auto"
    fast_path: bool = True
    graph_buckets: tuple[int, ...] = (1024, 2048, 4096)
    compile_ops: bool = True

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]


@dataclass(frozen=True, slots=True)
class MediaInput:
    """Decoded media of one request: the expanded media token ids M and the processor tensors."""

    token_ids: Sequence[int]
    tensors: Mapping[str, Any]


MediaHook = Callable[[SystemOneRequest], MediaInput]
"""Decodes a request's media; raises `RequestError` (a media reason code) for bad or forbidden media."""


@dataclass(frozen=True, slots=True)
class Prepared:
    """A validated, encoded request, ready to join a batch."""

    request: SystemOneRequest
    encoded: EncodedRequest

    @property
    def num_tokens(self) -> int:
        return self.encoded.num_tokens


class Engine:
    """One loaded Clef model plus its tokenizer; see the module docstring for the threading rules.

    `tokenizer` is the release tokenizer (or a processor carrying it as `.tokenizer`); `processor` the
    multimodal processor the media hook uses (None: text only). Raises `ValueError` when the tokenizer
    lacks the special tokens of Clef's format.
    """

    def __init__(
        self,
        model: ClefOmniModel,
        tokenizer: object,
        config: EngineConfig | None = None,
        *,
        processor: object | None = None,
        media_hook: MediaHook | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.processor = processor
        self.config = config if config is not None else EngineConfig()
        self._encoder: TextEncoder = encoder_for(tokenizer)
        self._media_hook = media_hook
        cfg = self.config
        on_cuda = getattr(getattr(model, "device", None), "type", "cpu") == "cuda"
        if cfg.fast_path and on_cuda and not getattr(model, "fast_path", True):
            model.enable_fast_path(graph_buckets=cfg.graph_buckets, compile_ops=cfg.compile_ops)
        self._layout: Layout | None = None if self.config.layout == "auto" else self.config.layout

    @classmethod
    def from_release(
        cls,
        path: str | Path,
        device: str | None = None,
        dtype: DTypeName | None = None,
        config: EngineConfig | None = None,
    ) -> Engine:
        """Load a release directory (blocking, seconds to minutes) and wrap it in an engine.

        `device`/`dtype` override the ones in `config`. Raises whatever `load_release_model` raises
        for a missing or inconsistent release.
        """
        from dataclasses import replace

        from engine.release import load_release_model

        cfg = config if config is not None else EngineConfig()
        cfg = replace(cfg, device=device or cfg.device, dtype=dtype or cfg.dtype)
        loaded = load_release_model(path, device=cfg.device, dtype=cfg.torch_dtype)
        return cls(loaded.model, loaded.tokenizer, cfg, processor=loaded.processor)

    def _media(self, request: SystemOneRequest) -> MediaInput | None:
        """The one place a request's media is decoded (None for a text-only request).

        Media support plugs in here: pass `media_hook` (built from `self.processor` and the media
        limits/policy); until then a request with media is a permanent 400 error.
        """
        if not request.has_media:
            return None
        if self._media_hook is None:
            raise RequestError(DlqReason.media_undecodable, "media not supported yet", status=400)
        return self._media_hook(request)

    def prepare(self, request: SystemOneRequest) -> Prepared:
        """Decode media and encode `request` (CPU only, thread-safe).

        Raises `RequestError` (permanent, with a reason code) for over-long input or bad media.
        """
        media = self._media(request)
        encoded = self._encoder.encode(
            request,
            media_tokens=media.token_ids if media is not None else None,
            media=media.tensors if media is not None else None,
            max_tokens=self.config.max_tokens,
            truncate_state=self.config.truncate_state,
        )
        return Prepared(request, encoded)

    def execute(self, batch: Sequence[Prepared]) -> list[SystemOneResponse]:
        """Run one forward pass over `batch` and build a response per record, in batch order.

        Call from one worker thread only. May raise `torch.OutOfMemoryError` (the caller splits the
        batch and retries the halves) or `ProbabilityError` when the model produced NaN/inf.
        """
        if not batch:
            return []
        with torch.inference_mode():
            inputs = self.model.collate([p.encoded for p in batch], layout=self._layout)
            probabilities = forward(self.model, inputs)
        return [
            build_response(
                p.request,
                {qid: probs.tolist() for qid, probs in per_question.items()},
                input_tokens=p.num_tokens,
                state_truncated=p.encoded.state_truncated,
                confidence_formula=self.config.confidence_formula,
            )
            for p, per_question in zip(batch, probabilities, strict=True)
        ]

    def decide(
        self, requests: Sequence[SystemOneRequest | Mapping[str, Any] | str | bytes]
    ) -> list[SystemOneResponse | RequestError]:
        """Validate, prepare, pack by token budget and execute `requests` (blocking).

        Results come back in input order: a `SystemOneResponse` per good request and the
        `RequestError` of each bad one; a bad request never affects the others.
        """
        results: list[SystemOneResponse | RequestError | None] = [None] * len(requests)
        ready: list[tuple[int, Prepared]] = []
        for index, raw in enumerate(requests):
            try:
                request = raw if isinstance(raw, SystemOneRequest) else parse_request(raw)
                ready.append((index, self.prepare(request)))
            except RequestError as error:
                results[index] = error
        plan = plan_batches(
            [p.num_tokens for _, p in ready],
            max_tokens=self.config.max_batch_tokens,
            max_records=self.config.max_batch_records,
            packed=(self._layout or getattr(self.model, "preferred_layout", "padded")) == "packed",
        )
        for group in plan:
            batch = [ready[k] for k in group]
            for (index, _), result in zip(batch, self._execute_splitting([p for _, p in batch]), strict=True):
                results[index] = result
        assert all(r is not None for r in results), "every request gets a result"
        return [r for r in results if r is not None]

    def _execute_splitting(self, batch: list[Prepared]) -> list[SystemOneResponse | RequestError]:
        """`execute`, halving the batch on CUDA out-of-memory or unusable model output (NaN); a record
        that still fails alone gets a `RequestError` (500) instead of failing its neighbours."""
        try:
            return list(self.execute(batch))
        except torch.OutOfMemoryError:
            if len(batch) == 1:
                return [RequestError(DlqReason.oom_single_record, "out of GPU memory for this record alone")]
        except ProbabilityError as error:
            if len(batch) == 1:
                return [RequestError(DlqReason.engine_failed, f"model output unusable: {error}")]
        if self.config.device.startswith("cuda"):
            torch.cuda.empty_cache()
        half = len(batch) // 2
        return self._execute_splitting(batch[:half]) + self._execute_splitting(batch[half:])
