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

from schemas.envelope import DEFAULT_DEPARTMENTS, DefaultSchema

ENV_PREFIX = "CLEF_"
#: `CLEF_*` names that belong to the project's scripts and tools, not to the service (README, scripts/*.sh,
#: docker-compose.yml): the unknown-setting check skips them, so exporting them never breaks a command.
TOOL_VARIABLES = frozenset({"CLEF_CACHE_DIR", "CLEF_VENV", "CLEF_DEBUG", "CLEF_MODEL_DIR"})
#: Part of `kafka.shutdown_timeout_s` kept, after the drain, for leaving the group, closing the clients and
#: exiting the process (the final commit has its own `kafka.commit_timeout_s` on top).
SHUTDOWN_RESERVE_S = 3.0
#: Between the end of a revoke callback and the broker receiving the member's JoinGroup (round trips and
#: scheduling), counted against the rebalance timeout.
REJOIN_MARGIN_S = 1.0
#: aiokafka's request timeout (its default `request_timeout_ms`, kept): the other members' JoinGroup
#: requests wait for the slowest member's revoke path and are sent again, logged at ERROR, after it.
JOIN_REQUEST_TIMEOUT_S = 40.0


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class KafkaSecuritySettings(_Frozen):
    """How every Kafka client connects (`kafka.security`, env `CLEF_KAFKA__SECURITY__*`).

    A secret can be given inline (`SecretStr`, masked in logs) or as a `*_file` path read at start (one
    value, surrounding whitespace stripped), not both. `consumer.kafka.config` turns this into client
    options and checks that what the protocol needs is there.
    """

    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    sasl_password_file: Path | None = None
    oauth_token_provider: str | None = Field(
        default=None,
        description="OAUTHBEARER: 'module:attribute' naming a callable that returns an "
        "aiokafka AbstractTokenProvider (called once per client)",
    )
    ssl_cafile: Path | None = Field(default=None, description="PEM CA bundle (default: system CAs)")
    ssl_certfile: Path | None = Field(default=None, description="PEM client certificate (mTLS)")
    ssl_keyfile: Path | None = Field(default=None, description="PEM private key of ssl_certfile")
    ssl_key_password: SecretStr | None = None
    ssl_key_password_file: Path | None = None
    ssl_check_hostname: bool = Field(default=True, description="verify the broker name in its certificate")


class KafkaSettings(_Frozen):
    bootstrap_servers: str = "127.0.0.1:9092"
    group_id: str = "clef-router"
    client_id: str = "clef-router"
    security: KafkaSecuritySettings = KafkaSecuritySettings()
    create_topics: bool = True
    topic_partitions: int = Field(default=3, ge=1)
    replication_factor: int = Field(default=1, ge=1)
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    session_timeout_ms: int = Field(default=30_000, ge=1000)
    max_poll_interval_ms: int = Field(default=300_000, ge=1000)
    fetch_max_records: int = Field(default=500, ge=1)
    commit_interval_ms: int = Field(default=500, ge=10)
    linger_ms: int = Field(default=5, ge=0)
    exactly_once: bool = Field(
        default=False,
        description="transactional outputs with the input offsets, one producer per input partition; "
        "downstream consumers must read committed",
    )
    max_in_flight: int = Field(default=2048, ge=1, description="fetched, not yet committed records")
    send_attempts: int = Field(default=5, ge=1, description="tenacity attempts for transient broker errors")
    rebalance_timeout_ms: int | None = Field(
        default=None,
        ge=1000,
        description="how long the broker waits for every member to rejoin in a rebalance (a member still "
        "in its revoke callback then is dropped from the group); None: max_poll_interval_ms, as the Java "
        "client",
    )
    revoke_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="revoked partitions' drain (and, exactly-once, their last transaction)",
    )
    commit_timeout_s: float = Field(default=5.0, gt=0, description="one offset commit, retries included")
    shutdown_timeout_s: float = Field(
        default=25.0, gt=0, description="stop request to return, drain included"
    )

    @property
    def heartbeat_interval_ms(self) -> int:
        """Heartbeat period: a member learns of a rebalance at its next heartbeat."""
        return max(1000, self.session_timeout_ms // 10)

    @property
    def effective_rebalance_timeout_ms(self) -> int:
        """`rebalance_timeout_ms`, or `max_poll_interval_ms` when unset."""
        return (
            self.rebalance_timeout_ms if self.rebalance_timeout_ms is not None else self.max_poll_interval_ms
        )

    @property
    def revoke_path_s(self) -> float:
        """Upper bound of the revoke callback: the drain, then the commit (at-least-once) or the wait for
        the last transactions (exactly-once, which commits offsets inside them)."""
        if self.exactly_once:
            return 2 * self.revoke_timeout_s
        return self.revoke_timeout_s + self.commit_timeout_s

    @property
    def close_reserve_s(self) -> float:
        """Part of `shutdown_timeout_s` kept after the drain: the final commit (at-least-once), leaving the
        group, closing clients."""
        return SHUTDOWN_RESERVE_S + (0.0 if self.exactly_once else self.commit_timeout_s)

    @model_validator(mode="after")
    def _bounds_fit(self) -> KafkaSettings:
        """Every bound of the revoke path fits inside the rebalance timeout (or the broker drops the member
        while it drains, and hands its partitions on: duplicates), and a stop arriving during a revoke
        still fits inside `shutdown_timeout_s`."""
        path = self.revoke_path_s
        if self.exactly_once:
            parts = f"2 x kafka.revoke_timeout_s ({self.revoke_timeout_s:g} s, drain + last transactions)"
        else:
            parts = (
                f"kafka.revoke_timeout_s ({self.revoke_timeout_s:g} s) + "
                f"kafka.commit_timeout_s ({self.commit_timeout_s:g} s)"
            )
        beat = self.heartbeat_interval_ms / 1000
        need = path + beat + REJOIN_MARGIN_S
        have = self.effective_rebalance_timeout_ms / 1000
        if need > have:
            source = (
                "kafka.rebalance_timeout_ms"
                if self.rebalance_timeout_ms is not None
                else "kafka.max_poll_interval_ms (the rebalance timeout while rebalance_timeout_ms is unset)"
            )
            raise ValueError(
                f"{source} is {have:g} s, but the revoke path needs {need:g} s: {parts} + one heartbeat "
                f"({beat:g} s, kafka.session_timeout_ms / 10) + {REJOIN_MARGIN_S:g} s to rejoin; raise it "
                "or lower those bounds"
            )
        if need > JOIN_REQUEST_TIMEOUT_S:
            raise ValueError(
                f"the revoke path needs {need:g} s ({parts} + heartbeat + rejoin), but the other members' "
                f"JoinGroup requests wait for it and time out after {JOIN_REQUEST_TIMEOUT_S:g} s; lower "
                "those bounds"
            )
        if self.max_poll_interval_ms / 1000 < self.shutdown_timeout_s:
            raise ValueError(
                f"kafka.max_poll_interval_ms ({self.max_poll_interval_ms / 1000:g} s) is below "
                f"kafka.shutdown_timeout_s ({self.shutdown_timeout_s:g} s): the drain at shutdown fetches "
                "nothing, and aiokafka leaves the group after max_poll_interval_ms without a fetch"
            )
        reserve = self.close_reserve_s
        if path + reserve > self.shutdown_timeout_s:
            commit = "" if self.exactly_once else " + kafka.commit_timeout_s for the final commit"
            raise ValueError(
                f"kafka.shutdown_timeout_s is {self.shutdown_timeout_s:g} s, but a stop during a revoke "
                f"needs {path + reserve:g} s: {parts} + {SHUTDOWN_RESERVE_S:g} s to leave and close{commit}; "
                "raise it or lower those bounds"
            )
        return self


class TopicSettings(_Frozen):
    input: tuple[str, ...] = ("alerts.in",)
    decisions: str = "decisions"
    route_prefix: str = "route."
    review: str = "route.review"
    unrouted: str = "route.unrouted"
    dlq: str = "alerts.dlq"


class BatchingSettings(_Frozen):
    mode: Literal["adaptive", "fixed"] = Field(
        # adaptive is the default: on the H200 (BENCHMARKS.md, bench load) it had the lower p50 and p99 at
        # every load up to 70% of capacity (and the lower p50 at 90%), and the best fixed budget's capacity
        default="adaptive",
        description="adaptive: batches follow the queue and the measured GPU time "
        "(consumer.batching.adaptive); "
        "fixed: flush on max_batch_records, max_batch_tokens or max_wait_ms",
    )
    latency_target_ms: float = Field(
        default=250.0, gt=0, description="adaptive: a batch runs in half of this unless a backlog built"
    )
    max_batch_records: int = Field(default=256, ge=1)
    max_batch_tokens: int = Field(default=32_768, ge=1)
    max_wait_ms: float = Field(default=20.0, ge=0)
    prepare_workers: int = Field(default=4, ge=1)
    prepare_chunk: int = Field(default=64, ge=1, description="records per thread-pool prepare call")
    max_pending_batches: int = Field(default=2, ge=1, description="batches queued for the GPU thread")


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
