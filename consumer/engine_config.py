"""The one mapping from the service's settings to the engine's configuration (`engine.config.EngineConfig`).

`Settings.engine` (`EngineSettings`) and `Settings.batching` (`BatchingSettings`) are the source of every
engine knob the service exposes, the batch limits included (`BatchingSettings.limits` becomes
`EngineConfig.limits`, which the service's batcher then reads from the engine); `EngineConfig`'s own
defaults serve only the Python API (`engine.systemone`, `Engine(...)`). `clef-router run`, `serve` and
`decide` all build their engine here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from consumer.settings import BatchingSettings, EngineSettings, engine_device

if TYPE_CHECKING:
    from engine.config import EngineConfig


def engine_config(engine: EngineSettings, batching: BatchingSettings) -> EngineConfig:
    """The engine configuration of these settings (imports `engine.config`, hence torch). Raises
    `SettingsError` for a device named twice (`engine_device`)."""
    from engine.config import EngineConfig

    return EngineConfig(
        device=engine_device(engine),
        dtype=engine.dtype,
        limits=batching.limits,
        max_tokens=engine.max_input_tokens,
        single_record_attempts=engine.single_record_attempts,
        truncate_state=engine.truncate_state,
        confidence_formula=engine.confidence_formula,
        fp8_experts=engine.fp8_experts,
        fp8_text_only=engine.fp8_text_only,
        fp8_attention=engine.fp8_attention,
        sm90_experts=engine.sm90_experts,
        lane_stream=engine.lane_stream,
    )
