"""Failure splitting of engine batches: one record never sinks the others (blocking; the GPU thread).

`run_split(execute, batch)` runs a batch and, on out-of-memory or any other exception, splits it in
halves and retries each; a record that still fails alone (after `single_attempts` tries) gets an
`EngineError` (a permanent error with a DLQ reason) while its batch-mates get their answers. Whether an
exception is the device running out of memory is the engine's call (`ServingEngine.out_of_memory`), so
this module needs no torch. The one splitting rule for every caller: the service's batcher and
`Engine.decide`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

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


def never_out_of_memory(exc: BaseException) -> bool:
    """The out-of-memory check of an engine that has no device memory to run out of."""
    return False


@dataclass(slots=True)
class SplitStats:
    """What `run_split` did: engine calls, splits and OOMs seen (the batcher's metrics and log line)."""

    calls: int = 0
    splits: int = 0
    ooms: int = 0


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
    out_of_memory: Callable[[BaseException], bool] = never_out_of_memory,
    failed: Exception | None = None,
) -> BatchResult[R]:
    """Execute `batch`, bisecting on failure until every record is answered or isolated (blocking).

    `out_of_memory` is the engine's own check (`ServingEngine.out_of_memory`, which also frees cached device
    memory); the consumer never inspects engine exceptions itself. `failed` is the error
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
        oom = out_of_memory(exc)
        if oom:
            stats.ooms += 1
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
