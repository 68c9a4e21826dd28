"""Dead-letter side exit: DLQ records, the DLQ guard (circuit breaker) and `dlq replay`.

A DLQ record keeps the original value bytes, key and headers and adds the SPEC section 7 headers
(`schemas.dead_letter`). The guard watches the share of dead-lettered records among the most recent ones
and trips when it exceeds a limit, so a bad deploy stops the service instead of emptying the input topic
into the DLQ (the tripping record is neither dead-lettered nor committed).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Collection
from typing import Any

from consumer.router import InputRecord, OutRecord
from consumer.settings import DlqSettings, KafkaSettings
from schemas.dead_letter import (
    DeadLetterInfo,
    DlqHeaderError,
    parse_dlq_headers,
    strip_dlq_headers,
    with_dlq_headers,
)
from schemas.errors import DlqReason


class DlqGuardTrippedError(RuntimeError):
    """Too many recent records were dead-lettered; the service must stop without committing them."""


class DlqGuard:
    """Sliding-window share of dead-lettered records (pure; event loop only)."""

    def __init__(self, settings: DlqSettings) -> None:
        self._window: deque[bool] = deque(maxlen=settings.guard_window)
        self._dead = 0
        self._min = min(settings.guard_min_records, settings.guard_window)
        self._max_share = settings.guard_max_share

    @property
    def share(self) -> float:
        return self._dead / len(self._window) if self._window else 0.0

    def _push(self, dead: bool) -> None:
        if len(self._window) == self._window.maxlen and self._window[0]:
            self._dead -= 1
        self._window.append(dead)
        self._dead += dead

    def record_ok(self, count: int = 1) -> None:
        """Count `count` answered records (one call for a run of them: same result as `count` calls)."""
        window = self._window
        size = window.maxlen or 0
        if count >= size:
            window.clear()
            self._dead = 0
            window.extend(itertools.repeat(False, size))
            return
        for _ in range(len(window) + count - size):  # the oldest entries the new ones push out
            self._dead -= window.popleft()
        window.extend(itertools.repeat(False, count))

    def record_dead(self) -> None:
        """Count a dead-lettered record; raises `DlqGuardTrippedError` (not counted) if it would trip."""
        n = len(self._window) + (len(self._window) != self._window.maxlen)
        dead = self._dead + 1 - (len(self._window) == self._window.maxlen and self._window[0])
        if n >= self._min and dead / n > self._max_share:
            raise DlqGuardTrippedError(
                f"{dead} of the last {n} records would be dead-lettered (limit {self._max_share:.0%})"
            )
        self._push(True)


def dead_letter(
    record: InputRecord,
    exc: BaseException,
    *,
    topic: str,
    stage: str,
    attempts: int,
    reason: DlqReason | None = None,
) -> tuple[OutRecord, DeadLetterInfo]:
    """The DLQ record for `record` (original bytes, key and headers, plus the DLQ headers)."""
    info = DeadLetterInfo.from_exception(
        exc,
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        stage=stage,
        attempts=attempts,
        reason=reason,
    )
    headers = tuple(with_dlq_headers(record.headers, info))
    return OutRecord(topic, record.key, record.value, headers), info


def reason_filter(reasons: Collection[str]) -> frozenset[DlqReason]:
    """Validate reason codes given on the command line; raises `ValueError` for an unknown one."""
    return frozenset(DlqReason(r) for r in reasons)


async def topic_partitions(kafka: KafkaSettings, topic: str) -> list[int]:
    """Partition ids of `topic` ([] when it does not exist), from the cluster metadata."""
    from aiokafka.admin import AIOKafkaAdminClient

    from consumer.kafka_config import client_options

    admin = AIOKafkaAdminClient(**client_options(kafka))
    await admin.start()
    try:
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    return sorted(p["partition"] for t in described if t["error_code"] == 0 for p in t["partitions"])


async def replay(
    kafka: KafkaSettings,
    dlq_topic: str,
    *,
    group_id: str,
    reasons: frozenset[DlqReason] = frozenset(),
    limit: int | None = None,
    dry_run: bool = False,
) -> dict[str, int]:
    """Send DLQ records back to their original topic (original value, key and headers, DLQ headers removed).

    Reads `dlq_topic` with its own consumer group (so a second replay does not resend) up to the end offsets
    seen at start; records whose reason is not in `reasons` (when given) are skipped; each replayed record
    is acknowledged (`acks=all`) before its DLQ offset is committed. Returns counts.
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from consumer.kafka_config import client_options
    from consumer.producer import Producer

    consumer = AIOKafkaConsumer(
        **client_options(kafka), group_id=group_id, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    producer = Producer(kafka)
    counts = {"replayed": 0, "skipped": 0, "unreadable": 0}
    try:  # both are closed below even when a start fails or is cancelled (no "Unclosed ..." warnings)
        await consumer.start()
        await producer.start()
        parts = [TopicPartition(dlq_topic, p) for p in await topic_partitions(kafka, dlq_topic)]
        if not parts:
            return counts
        consumer.assign(parts)
        ends: dict[Any, int] = await consumer.end_offsets(parts)
        todo = {tp for tp in parts if ends[tp] > await consumer.position(tp)}
        while todo and (limit is None or counts["replayed"] < limit):
            batch = await consumer.getmany(*todo, timeout_ms=500, max_records=200)
            for tp, records in batch.items():
                last: int | None = None
                for rec in records:
                    if rec.offset >= ends[tp] or (limit is not None and counts["replayed"] >= limit):
                        todo.discard(tp)
                        break
                    last = rec.offset
                    headers = [(k, bytes(v) if v is not None else None) for k, v in rec.headers]
                    try:
                        info = parse_dlq_headers(headers)
                    except DlqHeaderError:
                        counts["unreadable"] += 1
                        continue
                    if reasons and info.reason not in reasons:
                        counts["skipped"] += 1
                        continue
                    if not dry_run:
                        out = OutRecord(
                            info.original_topic, rec.key, rec.value, tuple(strip_dlq_headers(headers))
                        )
                        await producer.send_retrying(out, kafka.send_attempts)
                    counts["replayed"] += 1
                    if rec.offset + 1 >= ends[tp]:
                        todo.discard(tp)
                if not dry_run and last is not None:
                    await consumer.commit({tp: last + 1})
            for tp in list(todo):
                if await consumer.position(tp) >= ends[tp]:
                    todo.discard(tp)
    finally:
        await producer.stop()
        await consumer.stop()
    return counts
