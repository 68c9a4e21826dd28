"""What the engine's stages drive and hand on: the model (`ModelLike`), the media hook, and the typed
values passed prepare -> stage -> run -> respond (`Prepared`, `StagedBatch`, `RunResult`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt
import torch

from engine.batching.collate import Layout, ModelBatch
from engine.types import Between, EncodedRequest, Launched
from schemas.systemone import SystemOneRequest

if TYPE_CHECKING:
    from engine.kernels.moe_fp8_sm90 import Extension as Sm90Extension


class ModelLike(Protocol):
    """What `engine.runner.Engine` uses of its model; `engine.model.clef.ClefOmniModel` is the real one.

    - `device`: where `collate` puts a batch; `fast_path`: whether the text fast path is built;
      `text_only`: whether its bf16 experts were freed (then no batch with media can run).
    - `enable_fast_path(...)`: build it (CUDA only); returns False and changes nothing where it cannot.
      `text_only` (with `fp8_experts`) frees the bf16 experts: the model then runs no media;
      `fp8_attention` runs the text path's attention projections in FP8; `sm90_experts` (a built
      `engine.kernels.moe_fp8_sm90` extension) runs the FP8 expert calls it takes through its CUDA kernels.
    - `layout_for(with_media)`: the layout a batch gets when the engine names none.
    - `can_pack(with_media)`: whether records packed in one row need no dense attention mask.
    - `collate(encoded, layout)`: one forward pass's inputs, on `device`.
    - `forward_batch(batch, between)`: probabilities per record, per question, per option (blocking; may
      raise `torch.OutOfMemoryError`); `between` is called between decoder layers where the model runs them
      one by one (the text fast path's eager forward), never inside a CUDA graph.
    - `launch_batch(batch, between)`: `forward_batch` with the device work only queued; its `wait()` (any
      thread) gives the same value once the device ran it.
    - `queues_whole(batch)`: whether `launch_batch` queues all of it without an eager decoder layer (CUDA
      graph replays), never waiting on the device or calling `between`.
    """

    @property
    def device(self) -> torch.device: ...

    @property
    def fast_path(self) -> bool: ...

    @property
    def text_only(self) -> bool: ...

    def enable_fast_path(
        self,
        *,
        graph_buckets: tuple[int, ...] = (),
        fp8_experts: bool = False,
        text_only: bool = False,
        fp8_attention: bool = False,
        sm90_experts: Sm90Extension | None = None,
    ) -> bool: ...

    def layout_for(self, with_media: bool) -> Layout: ...

    def can_pack(self, with_media: bool) -> bool: ...

    def collate(self, encoded: Sequence[EncodedRequest], layout: Layout | None = None) -> ModelBatch: ...

    def forward_batch(
        self, batch: ModelBatch, between: Between | None = None
    ) -> list[list[npt.NDArray[np.float32]]]: ...

    def launch_batch(
        self, batch: ModelBatch, between: Between | None = None
    ) -> Launched[list[list[npt.NDArray[np.float32]]]]: ...

    def queues_whole(self, batch: ModelBatch) -> bool: ...


class MediaInputLike(Protocol):
    """What a media hook returns (e.g. `engine.media.expand.PreparedMedia`)."""

    @property
    def token_ids(self) -> Sequence[int]: ...
    @property
    def tensors(self) -> Mapping[str, Any]: ...


MediaHook = Callable[[SystemOneRequest], MediaInputLike]
"""Decodes a request's media; raises `RequestError` (a media reason code) for bad or forbidden media."""


@dataclass(frozen=True, slots=True)
class Prepared:
    """A validated, encoded request, ready to join a batch."""

    request: SystemOneRequest
    encoded: EncodedRequest

    @property
    def num_tokens(self) -> int:
        return self.encoded.num_tokens


@dataclass(frozen=True, slots=True)
class StagedBatch:
    """A collated batch whose tensors are on (or being copied to) the model's device; see `Engine.stage`.

    `parts` holds one collated pass per group of record indices: one for a uniform batch, more when the
    text fast path splits off the media records or a right-padded group is cut to the token budget.
    """

    prepared: tuple[Prepared, ...]
    parts: tuple[tuple[tuple[int, ...], ModelBatch], ...]


@dataclass(frozen=True, slots=True)
class RunResult:
    """Per record of a staged batch (batch order), its option probabilities keyed by question id."""

    prepared: tuple[Prepared, ...]
    probabilities: tuple[dict[str, npt.NDArray[np.float32]], ...]
