"""Kafka settings (`kafka.*`, env `CLEF_KAFKA__*`): how the clients connect and the bounds of a rebalance and
of a stop, checked against each other when the settings are built.

Part of `consumer.settings.Settings` (importable from there too); frozen, unknown keys rejected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

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
    # 0: a decision is sent at once; under load the producer still batches what queues behind a request
    # in flight (BENCHMARKS.md, "Priority classes and tail latency")
    linger_ms: int = Field(default=0, ge=0)
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
