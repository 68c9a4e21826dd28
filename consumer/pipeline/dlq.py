"""Dead-letter side exit: DLQ records and the DLQ guard (circuit breaker); replay:
`consumer.kafka.dlq_replay`.

A DLQ record keeps the original value bytes, key and headers and adds the SPEC section 7 headers
(`schemas.dead_letter`). The guard watches the share of dead-lettered records among the most recent ones
and trips when it exceeds a limit, so a bad deploy stops the service instead of emptying the input topic
into the DLQ (the tripping record is neither dead-lettered nor committed).
"""

from __future__ import annotations

import itertools
from collections import deque

from consumer.records import InputRecord, OutRecord
from consumer.settings import DlqSettings
from schemas.dead_letter import (
    DeadLetterInfo,
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
