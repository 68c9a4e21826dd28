"""Failure handling: transient retries (tenacity) and engine batch splitting.

`run_split(execute, batch)` runs a batch through the engine and never lets one record sink the others:
on CUDA out-of-memory or any other exception it splits the batch in halves and retries each; a record
that still fails alone (after `single_attempts` tries) gets an `EngineError` (a permanent error with a
DLQ reason) while its batch-mates get their answers. Synchronous: call it in the GPU worker thread.

`transient_retry(...)` is a tenacity `AsyncRetrying` with exponential backoff and jitter for broker-side
transient errors (aiokafka errors flagged `retriable`, timeouts, connection errors).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from schemas.errors import DlqReason

T = TypeVar("T")
R = TypeVar("R")


class EngineError(Exception):
    """The engine failed on one record even when it ran alone: a permanent error for that record."""

    def __init__(self, reason: DlqReason, cause: BaseException, attempts: int) -> None:
        self.reason = reason
        self.cause = cause
        self.attempts = attempts
        super().__init__(f"{type(cause).__name__}: {str(cause)[:160]}")


def is_oom(exc: BaseException) -> bool:
    """True for CUDA out-of-memory (`torch.OutOfMemoryError`), detected without importing torch."""
    return any(cls.__name__ == "OutOfMemoryError" for cls in type(exc).__mro__) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()
    )


@dataclass(slots=True)
class SplitStats:
    """What `run_split` did: engine calls, splits, and OOMs seen."""

    calls: int = 0
    splits: int = 0
    ooms: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class BatchResult(Generic[R]):
    """Per-record outcomes of one batch, in batch order: a result or an `EngineError`."""

    outcomes: list[R | EngineError]
    stats: SplitStats


def run_split(
    execute: Callable[[Sequence[T]], list[R]],
    batch: Sequence[T],
    *,
    single_attempts: int = 2,
    on_oom: Callable[[], None] | None = None,
    failed: Exception | None = None,
) -> BatchResult[R]:
    """Execute `batch`, bisecting on failure until every record is answered or isolated (blocking).

    `on_oom` is called after each out-of-memory error (e.g. to empty the CUDA cache). `failed` is the error
    of an attempt on the whole batch the caller already made (counted as one call): the batch is not run
    whole again but handled as if `execute` had just raised it. Never raises for an engine error;
    `BaseException`s that are not `Exception` (KeyboardInterrupt) propagate.
    """
    stats = SplitStats()
    outcomes: list[R | EngineError] = []

    def attempt(part: Sequence[T], tries_alone: int) -> None:
        stats.calls += 1
        try:
            results = execute(part)
            if len(results) != len(part):
                raise RuntimeError(f"engine returned {len(results)} results for {len(part)} records")
        except Exception as exc:
            recover(part, tries_alone, exc)
            return
        outcomes.extend(results)

    def recover(part: Sequence[T], tries_alone: int, exc: Exception) -> None:
        oom = is_oom(exc)
        if oom:
            stats.ooms += 1
            if on_oom is not None:
                on_oom()
        stats.errors.append(type(exc).__name__)
        if len(part) > 1:
            stats.splits += 1
            mid = len(part) // 2
            attempt(part[:mid], 0)
            attempt(part[mid:], 0)
        elif tries_alone + 1 < single_attempts:
            attempt(part, tries_alone + 1)
        else:
            reason = DlqReason.oom_single_record if oom else DlqReason.engine_failed
            outcomes.append(EngineError(reason, exc, tries_alone + 1))

    if failed is None:
        attempt(batch, 0)
    else:
        stats.calls += 1
        recover(batch, 0, failed)
    return BatchResult(outcomes, stats)


def is_transient(exc: BaseException) -> bool:
    """Broker-side errors worth retrying: aiokafka `retriable` errors, timeouts, connection errors."""
    if getattr(exc, "retriable", False):
        return True
    return isinstance(exc, (asyncio.TimeoutError, TimeoutError, ConnectionError))


def transient_retry(
    attempts: int,
    *,
    initial_s: float = 0.1,
    max_s: float = 5.0,
    on_retry: Callable[[RetryCallState], None] | None = None,
) -> AsyncRetrying:
    """Tenacity policy: up to `attempts` tries of transient errors, exponential backoff with jitter.

    Non-transient errors and the last transient one are re-raised unchanged.
    """
    return AsyncRetrying(
        stop=stop_after_attempt(attempts),
        wait=wait_exponential_jitter(multiplier=initial_s, max=max_s, jitter=initial_s),
        retry=retry_if_exception(is_transient),
        reraise=True,
        before_sleep=on_retry,
    )
