"""The engine's start-up of the model's text fast path, as `EngineConfig` asks for it (one place).

`enable(model, config)` builds the packed decoder, its CUDA graphs and the FP8 modes on a CUDA model
(`ModelLike.enable_fast_path`), compiling the sm90 expert kernels first when `config.sm90_experts` asks for
them; off CUDA it changes nothing. Blocking: seconds to minutes at full size (graph capture, the kernels'
compile). Raises `engine.kernels.moe_fp8_sm90.Sm90UnavailableError` when `sm90_experts` is set with FP8
experts on a CUDA model and the kernels cannot run there (not a Hopper GPU, no nvcc or ninja): an explicit
opt-in fails at start, not at the first large batch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.handoff import ModelLike

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FastPath:
    """What `enable` built: `graph_tokens`, the largest CUDA graph bucket captured (0 for none). Whether the
    bf16 experts were freed is the model's to say (`ModelLike.text_only`), however its fast path was built."""

    graph_tokens: int = 0


def enable(model: ModelLike, config: EngineConfig) -> FastPath:
    """Build `model`'s fast path as `config` says (see the module docstring); what it built."""
    cfg = config
    fp8 = cfg.fp8_experts or cfg.fp8_text_only
    if not (cfg.fast_path and model.device.type == "cuda"):
        if cfg.fp8_text_only or cfg.fp8_attention or cfg.sm90_experts:
            log.warning("fp8_text_only, fp8_attention, sm90_experts: CUDA only; this engine runs bf16")
        return FastPath()
    if model.fast_path:  # built before the engine (a bench): kept as it is, whatever `config` says
        return FastPath()
    if cfg.sm90_experts and not fp8:
        log.warning("sm90_experts applies to FP8 experts: without fp8_experts or fp8_text_only, nothing")
    from engine.model.graphs import default_buckets

    buckets = cfg.graph_buckets if cfg.graph_buckets is not None else default_buckets(cfg.limits.max_tokens)
    sm90 = None
    if fp8 and cfg.sm90_experts:
        from engine.kernels.moe_fp8_sm90 import build_for

        sm90 = build_for(model.device)
        log.info("sm90 expert kernels built for %s", model.device)
    built = model.enable_fast_path(
        graph_buckets=buckets,
        fp8_experts=fp8,
        text_only=cfg.fp8_text_only,
        fp8_attention=cfg.fp8_attention,
        sm90_experts=sm90,
    )
    if not built:
        return FastPath()
    return FastPath(graph_tokens=max(buckets, default=0))
