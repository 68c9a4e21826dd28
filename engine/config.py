"""How the engine runs (`EngineConfig`) and the one map between its dtype names and torch dtypes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from engine.batching.cut import API_LIMITS, BatchLimits
from engine.encoding.encode import DEFAULT_MAX_TOKENS
from engine.media import MediaLimits, MediaPolicy

DTypeName = Literal["float32", "bfloat16", "float16"]
TORCH_DTYPES: dict[DTypeName, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
"""The one map between the engine's dtype names (settings, `EngineConfig.dtype`) and torch dtypes."""


def dtype_name(dtype: torch.dtype) -> DTypeName | None:
    """The name of `dtype` in `TORCH_DTYPES`, or None for a dtype the engine does not run in."""
    return next((name for name, d in TORCH_DTYPES.items() if d == dtype), None)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How the engine runs.

    `limits` bound one forward pass (`engine.batching.cut`; a record longer than `limits.max_tokens` still
    runs, alone); a server's batcher cuts by the same limits (`ServingEngine.limits`). `layout` picks the
    collate layout (`auto`: the model's `layout_for`). `device`/`dtype` apply when loading a release. On
    CUDA, `fast_path` runs text-only batches through the packed varlen decoder (`engine.model.decoder`),
    replaying CUDA graphs captured per token bucket (`graph_buckets`; None:
    `engine.model.graphs.default_buckets(limits.max_tokens)`, empty: no graphs); `fp8_experts` runs the
    MoE experts in FP8 there (`engine.kernels.fp8`, opt-in), and `fp8_text_only` does so with the bf16
    experts freed: about half the GPU memory, and every request with media is refused (a permanent 400,
    `media_undecodable`); `fp8_attention` runs the attention projections of that path in FP8 too
    (opt-in, apart from the experts; media batches keep bf16). `sm90_experts` (with FP8 experts, opt-in)
    runs the FP8 expert GEMMs of large batches (`engine.kernels.moe_fp8_sm90.takes`, `takes_down`) through
    the project's CUDA kernels for Hopper, compiled when the engine starts (nvcc and ninja needed; the
    engine raises `moe_fp8_sm90.Sm90UnavailableError` at start where they cannot run). `lane_stream` gives
    `Engine.lane` a high-priority CUDA stream (opt-in until it is measured on the GPU; off: the lane is a
    no-op context). Off CUDA none of them applies. A record failing alone is tried
    `single_record_attempts` times (`engine.batching.split`). A server maps its own settings onto this in
    one place (`consumer.engine_config`).
    """

    device: str = "cuda"
    dtype: DTypeName = "bfloat16"
    limits: BatchLimits = API_LIMITS
    max_tokens: int = DEFAULT_MAX_TOKENS
    single_record_attempts: int = 2
    truncate_state: bool = True
    confidence_formula: Literal["typesafe", "top"] = "typesafe"
    layout: Literal["auto", "packed", "padded"] = "auto"
    fast_path: bool = True
    fp8_experts: bool = False
    fp8_text_only: bool = False
    fp8_attention: bool = False
    sm90_experts: bool = False
    lane_stream: bool = False
    graph_buckets: tuple[int, ...] | None = None
    media_limits: MediaLimits = field(default_factory=MediaLimits)
    media_policy: MediaPolicy = field(default_factory=MediaPolicy)

    @property
    def torch_dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.dtype]
