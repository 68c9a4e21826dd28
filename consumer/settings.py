"""Service settings: read once at the edge, passed down as frozen sub-configs.

Sources, highest priority first: keyword arguments, environment (`CLEF_` prefix, `__` nesting, e.g.
`CLEF_KAFKA__BOOTSTRAP_SERVERS`), an optional TOML file (`load_settings(config=...)`), defaults. Unknown keys
are rejected everywhere, including `CLEF_*` environment variables that name no setting (a typo must not be
silently ignored). Secrets are `SecretStr` and print masked (`masked()`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from consumer.kafka.settings import KafkaSecuritySettings, KafkaSettings
from engine.batching.cut import SERVICE_LIMITS, BatchLimits
from schemas.envelope import DEFAULT_DEPARTMENTS, DefaultSchema

__all__ = [
    "ENV_PREFIX",
    "BatchingSettings",
    "DlqSettings",
    "EngineSettings",
    "HttpSettings",
    "KafkaSecuritySettings",
    "KafkaSettings",
    "PrioritySettings",
    "RoutingSettings",
    "Settings",
    "SettingsError",
    "TopicSettings",
    "engine_device",
    "load_settings",
]

ENV_PREFIX = "CLEF_"
#: `CLEF_*` names that belong to the project's scripts and tools, not to the service (README, scripts/*.sh,
#: docker-compose.yml): the unknown-setting check skips them, so exporting them never breaks a command.
TOOL_VARIABLES = frozenset({"CLEF_CACHE_DIR", "CLEF_VENV", "CLEF_DEBUG", "CLEF_MODEL_DIR"})


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TopicSettings(_Frozen):
    input: tuple[str, ...] = ("alerts.in",)
    decisions: str = "decisions"
    route_prefix: str = "route."
    review: str = "route.review"
    unrouted: str = "route.unrouted"
    dlq: str = "alerts.dlq"


class PrioritySettings(_Frozen):
    """Priority classes of the batcher (`batching.priority`, env `CLEF_BATCHING__PRIORITY__*`).

    Class 0 is the most urgent, `levels - 1` the least. HTTP requests get `http` unless they ask for a
    class themselves (the `X-Clef-Priority` header); each input topic gets its class from `topics`, or
    `default`. A batch takes the most urgent records first (FIFO inside a class); a class passed over by
    `starvation_batches` batches in a row heads the next one (`consumer.batching.classes`). Records of a
    class below `urgent_below` waiting while the GPU runs a large batch are cut into an urgent batch of at
    most `urgent_max_tokens` that runs between two decoder layers of the running one. Offsets are still
    committed in order per partition: a class changes when a record runs, never the commit rule.
    """

    levels: int = Field(default=3, ge=1, le=16)
    http: int = Field(default=0, ge=0, description="class of an HTTP request without X-Clef-Priority")
    default: int = Field(default=2, ge=0, description="class of an input topic not named in `topics`")
    topics: dict[str, int] = Field(
        default_factory=dict, description='input topic -> class, e.g. {"alerts.critical": 1}'
    )
    urgent_below: int = Field(
        default=2, ge=0, description="classes below this may run between the layers of a running batch"
    )
    urgent_max_tokens: int = Field(default=8_192, ge=1, description="token budget of an urgent batch")
    starvation_batches: int = Field(default=8, ge=1)

    @model_validator(mode="after")
    def _classes_exist(self) -> PrioritySettings:
        named = {"http": self.http, "default": self.default} | {
            f"topics[{k}]": v for k, v in self.topics.items()
        }
        wrong = [f"{k}={v}" for k, v in named.items() if not 0 <= v < self.levels]
        if wrong:
            raise ValueError(f"priority classes must lie in 0..{self.levels - 1}: {', '.join(wrong)}")
        return self


class BatchingSettings(_Frozen):
    """How the service's batcher cuts and feeds batches. `max_batch_tokens`/`max_batch_records` are the
    engine's batch limits (`limits`, through `consumer.engine_config` into `EngineConfig.limits`); the
    batcher reads them back from the engine (`ServingEngine.limits`), never from here. Their defaults are
    `engine.batching.cut.SERVICE_LIMITS` (the Python API's are `API_LIMITS`)."""

    mode: Literal["adaptive", "fixed"] = Field(
        # adaptive is the default: BENCHMARKS.md, "Latency under load"
        default="adaptive",
        description="adaptive: batches follow the queue and the measured GPU time "
        "(consumer.batching.adaptive); "
        "fixed: flush on max_batch_records, max_batch_tokens or max_wait_ms",
    )
    latency_target_ms: float = Field(
        default=250.0, gt=0, description="adaptive: a batch runs in half of this unless a backlog built"
    )
    backlog_batches: float = Field(
        default=2.0,  # BENCHMARKS.md, "Priority classes and tail latency"
        ge=0,
        description="adaptive: the budget opens to max_batch_tokens once the head waited half the target "
        "and at least this many target-sized batches of tokens wait (0: on the wait alone)",
    )
    max_batch_records: int = Field(default=SERVICE_LIMITS.max_records, ge=1)
    max_batch_tokens: int = Field(default=SERVICE_LIMITS.max_tokens, ge=1)
    max_wait_ms: float = Field(default=20.0, ge=0)
    prepare_workers: int = Field(
        # 1: BENCHMARKS.md, "Priority classes, round three" (more CPU-bound threads starve the loop's GIL)
        default=1,
        ge=1,
        description="threads decoding and preparing records (media-heavy inputs, whose decoding releases "
        "the GIL, may want more)",
    )
    prepare_chunk: int = Field(default=64, ge=1, description="records per thread-pool prepare call")
    max_pending_batches: int = Field(default=2, ge=1, description="batches queued for the GPU thread")
    launch_ahead: bool = Field(
        default=False,
        description="the GPU thread only queues a batch's device work and a thread of its own waits for it, "
        "so the next batch is launched while this one runs; only batches the engine queues whole (CUDA graph "
        "replays) go ahead (consumer.batching.gpu)",
    )
    priority: PrioritySettings = PrioritySettings()

    @property
    def limits(self) -> BatchLimits:
        """The batch limits these settings give the engine."""
        return BatchLimits(max_tokens=self.max_batch_tokens, max_records=self.max_batch_records)


class EngineSettings(_Frozen):
    model_path: Path | None = None
    device: str = "cuda"
    device_index: int | None = Field(
        default=None,
        ge=0,
        description="GPU of this process (one service process per GPU): device becomes cuda:N",
    )
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    model_name: str = "clef-omni"
    max_input_tokens: int = Field(default=64_000, ge=1)
    truncate_state: bool = True
    confidence_formula: Literal["typesafe", "top"] = "typesafe"
    max_message_bytes: int = Field(default=32 * 1024 * 1024, ge=1)
    single_record_attempts: int = Field(default=2, ge=1, description="tries for a record failing alone")
    fp8_experts: bool = Field(
        default=False,
        description="run the MoE experts in FP8 on Hopper GPUs (engine.kernels.fp8; opt-in, "
        "the release is bf16)",
    )
    fp8_text_only: bool = Field(
        default=False,
        description="FP8 experts with the bf16 experts freed (about half the GPU memory); every request "
        "with media is then refused (400 / dead letter media_undecodable). CUDA only",
    )
    fp8_attention: bool = Field(
        default=False,
        description="run the text path's attention projections (fused QKV, output) in FP8 on Hopper GPUs "
        "(engine.kernels.fp8.linear_fp8; opt-in, apart from the experts). CUDA only",
    )
    sm90_experts: bool = Field(
        default=False,
        description="with fp8_experts or fp8_text_only: run the FP8 expert GEMMs of large batches (the down "
        "GEMM from 256 rows an expert, both from 1,024) through the project's CUDA kernels for Hopper "
        "(engine.kernels.moe_fp8_sm90), compiled at start (nvcc and ninja needed; the service stops at start "
        "where they cannot run). Opt-in",
    )
    lane_stream: bool = Field(
        default=False,
        description="urgent batches (HTTP, priority topics) run on a high-priority CUDA stream of their own, "
        "so their copies and kernels do not queue behind the bulk batch's (off: the bulk batch's stream; "
        "opt-in until it is measured on the GPU). CUDA only",
    )


def engine_device(engine: EngineSettings) -> str:
    """The torch device string of the engine: `device`, or `device:device_index` when an index is set
    (an index already in `device`, e.g. `cuda:1`, conflicts: `SettingsError`). Pure."""
    if engine.device_index is None:
        return engine.device
    if ":" in engine.device:
        raise SettingsError(f"engine.device {engine.device!r} already names a device; unset device_index")
    return f"{engine.device}:{engine.device_index}"


class HttpSettings(_Frozen):
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    api_keys: tuple[SecretStr, ...] = ()
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1)
    max_concurrent_requests: int = Field(
        default=256, ge=1, description="POST /v1/systemone requests in flight; beyond: 503 + Retry-After"
    )
    retry_after_s: int = Field(default=1, ge=0, description="Retry-After of an overload 503")
    keep_alive_s: float = Field(default=5.0, gt=0, description="idle keep-alive connections close after")
    shutdown_timeout_s: float = Field(default=10.0, gt=0, description="graceful stop: requests may finish")
    watchdog_s: float = Field(
        default=60.0, gt=0, description="/healthz fails after this long without progress"
    )
    broker_unreachable_s: float = Field(
        default=30.0, gt=0, description="`run`: /readyz fails while the broker is unreachable this long"
    )
    model_description: str = "Clef-omni decision model: joint schema head on Qwen3-Omni-30B-A3B"
    model_release_date: str = Field(default="", description="YYYY-MM-DD shown by GET /v1/models")
    server_timing: bool = Field(default=False, description="Server-Timing header: time in the batcher")


class DlqSettings(_Frozen):
    guard_window: int = Field(default=500, ge=1, description="recent records the guard looks at")
    guard_min_records: int = Field(default=100, ge=1)
    guard_max_share: float = Field(default=0.5, gt=0, le=1)
    exception_message_chars: int = Field(default=200, ge=16)


class RoutingSettings(_Frozen):
    """Default schema for plain events and how answers map to `route.*` topics."""

    default_schema: DefaultSchema = Field(default_factory=DefaultSchema)
    question: str = "department"
    department_map: dict[str, str] = Field(
        default_factory=lambda: {name: name for name in DEFAULT_DEPARTMENTS},
        description="routing answer -> topic suffix (route_prefix + suffix); unmapped answers go to unrouted",
    )
    review_threshold: float = Field(default=0.5, ge=0, le=1)
    urgency_question: str = "urgency"
    outage_question: str = "outage"
    outage_threshold: float = Field(default=0.5, ge=0, le=1)


class Settings(BaseSettings):
    """Every setting of `clef-router run`; see the module docstring for sources and priority."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", frozen=True, toml_file=None
    )

    kafka: KafkaSettings = KafkaSettings()
    topics: TopicSettings = TopicSettings()
    batching: BatchingSettings = BatchingSettings()
    engine: EngineSettings = EngineSettings()
    http: HttpSettings = HttpSettings()
    dlq: DlqSettings = DlqSettings()
    routing: RoutingSettings = RoutingSettings()
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    gc_gen0_threshold: int = Field(
        default=10_000, ge=0, description="cyclic GC generation-0 threshold set at start (0: Python's 700)"
    )
    gc_freeze: bool = Field(default=True, description="gc.freeze() what start-up left alive")
    gil_switch_interval_ms: float = Field(
        default=5.0,
        gt=0,
        le=100,
        description="GIL switch interval set at start (ms; Python's default 5): how long another thread's"
        " Python may hold the GIL while the GPU thread waits to launch its next kernel",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if settings_cls.model_config.get("toml_file"):
            sources.append(TomlConfigSettingsSource(settings_cls))
        return tuple(sources)

    @model_validator(mode="after")
    def _priority_topics_are_inputs(self) -> Settings:
        unknown = sorted(set(self.batching.priority.topics) - set(self.topics.input))
        if unknown:
            raise ValueError(
                f"batching.priority.topics names topics that are not inputs: {', '.join(unknown)}"
            )
        return self

    def masked(self) -> dict[str, Any]:
        """A JSON-able dump with every secret shown as `**********`."""
        return self.model_dump(mode="json")


class SettingsError(ValueError):
    """Settings could not be loaded (unknown key, bad value, unreadable file)."""


def _check_env_keys(environ: Mapping[str, str]) -> None:
    """Reject `CLEF_*` variables that name no setting (pydantic-settings ignores them), except the names in
    `TOOL_VARIABLES`."""
    for name in environ:
        if not name.upper().startswith(ENV_PREFIX) or name.upper() in TOOL_VARIABLES:
            continue
        parts = name[len(ENV_PREFIX) :].lower().split("__")
        model: type[BaseModel] = Settings
        for depth, part in enumerate(parts):
            field = model.model_fields.get(part)
            if field is None:
                raise SettingsError(f"unknown setting {name}")
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                model = ann
            elif depth != len(parts) - 1:
                raise SettingsError(f"unknown setting {name}")


def load_settings(config: Path | None = None, **overrides: Any) -> Settings:
    """Build `Settings` from overrides, the process environment and an optional TOML file.

    Raises `SettingsError` on an unknown key, a missing TOML file or an invalid value.
    """
    _check_env_keys(os.environ)
    cls: type[Settings] = Settings
    if config is not None:
        if not config.is_file():
            raise SettingsError(f"config file not found: {config}")
        cls = type(
            "FileSettings", (Settings,), {"model_config": {**Settings.model_config, "toml_file": config}}
        )
    try:
        return cls(**overrides)
    except ValidationError as exc:
        raise SettingsError(str(exc)) from exc
