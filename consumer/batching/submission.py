"""What the batcher keeps per `submit` call and per waiting record (event loop only, the batcher writes it).

A submission's records may ride in different batches; its one future resolves once every record has an
outcome: the engine's response, the prepare call's own exception (e.g. `RequestError`), or an
`EngineError` when the record failed even alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TypeVar, cast

from schemas.response import SystemOneResponse

P = TypeVar("P")
ItemT = TypeVar("ItemT")

Outcome = SystemOneResponse | BaseException
"""What one submitted item ends as: the engine's response, its prepare error, or an `EngineError`."""


class Submission:
    """One `submit` call: its priority class, its outcomes, how many are still missing, its future, when
    it was submitted and when its records became ready (clock seconds)."""

    __slots__ = ("future", "left", "outcomes", "priority", "ready_at", "submitted_at")

    def __init__(
        self, future: asyncio.Future[list[Outcome]], size: int, priority: int, submitted_at: float
    ) -> None:
        self.future = future
        self.outcomes: list[Outcome | None] = [None] * size
        self.left = size
        self.priority = priority
        self.submitted_at = submitted_at
        self.ready_at = submitted_at

    def settle(self, index: int, outcome: Outcome) -> None:
        """Store one outcome; resolves the future with every outcome once the last one arrives."""
        self.outcomes[index] = outcome
        self.left -= 1
        if self.left == 0 and not self.future.done():
            self.future.set_result(cast("list[Outcome]", self.outcomes))


Job = tuple[P, Submission, int]
"""A prepared record waiting for its batch: (prepared, its submission, its index in the submission)."""


def prepare_all(prepare: Callable[[ItemT], P], items: Sequence[ItemT]) -> list[P | BaseException]:
    """Prepare every item in a pool thread; an exception is returned in place of its record's result."""
    out: list[P | BaseException] = []
    for item in items:
        try:
            out.append(prepare(item))
        except Exception as exc:
            out.append(exc)
    return out
