"""The one rule that cuts a batch: which leading records of a queue fit the engine's `BatchLimits`.

A batch's cost depends on the collate layout (`engine.batching.collate`): a packed batch costs the plain sum
of its records' tokens, a right-padded one `records x longest` (every row padded to the longest record).
`take` is the rule; `plan_batches` applies it to a whole list, longest first. Both the service's batcher
(`consumer.batching`, arrival order, packed cost) and the engine (`Engine.stage` for a right-padded group,
`Engine.decide`) cut with it. A record larger than `max_tokens` always fits alone.

One type, two entry points with their own defaults: the service configures its engine from
`BatchingSettings` (`SERVICE_LIMITS` unless set) through `consumer.engine_config`, and its batcher reads the
engine's limits; the Python API and `clef-router decide` default to `API_LIMITS` (`EngineConfig.limits`).

Pure: no torch, so the consumer imports it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

Layout = Literal["packed", "padded"]
"""How records share one forward pass: back to back in one row, or right-padded rows (the cost)."""


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """The most one forward pass may hold: `max_tokens` by the layout's cost and `max_records` records.

    Raises `ValueError` for a limit below 1.
    """

    max_tokens: int
    max_records: int

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or self.max_records < 1:
            raise ValueError(
                f"batch limits must be positive: {self.max_tokens} tokens, {self.max_records} records"
            )

    def with_tokens(self, max_tokens: int) -> BatchLimits:
        """These limits with a smaller (or larger) token budget; the record limit stays."""
        return BatchLimits(max_tokens, self.max_records)


SERVICE_LIMITS = BatchLimits(max_tokens=32_768, max_records=256)
"""The service's default (`BatchingSettings.max_batch_tokens` / `max_batch_records`)."""

API_LIMITS = BatchLimits(max_tokens=65_536, max_records=64)
"""The Python API's default (`EngineConfig.limits`, `clef-router decide`)."""


def take(sizes: Iterable[int], limits: BatchLimits, layout: Layout) -> tuple[int, bool]:
    """How many leading records of `sizes` (tokens per record, in the caller's order) form the next batch,
    and whether that batch is full already.

    Full means a limit is reached: `max_records` records, the token budget used exactly or more, or the
    next record not fitting. The first record always fits (alone if it costs more than the budget); no
    records give `(0, False)`.
    """
    padded = layout == "padded"
    count = 0
    total = 0
    longest = 0
    for size in sizes:
        if count == limits.max_records:
            return count, True
        grown = max(longest, size)
        cost = grown * (count + 1) if padded else total + size
        if count > 0 and cost > limits.max_tokens:
            return count, True
        count += 1
        total += size
        longest = grown
        if cost >= limits.max_tokens:
            return count, True
    return count, count >= limits.max_records


def plan_batches(sizes: Sequence[int], limits: BatchLimits, layout: Layout) -> list[list[int]]:
    """Every index of `sizes`, exactly once, grouped into batches that `take` cuts, longest record first.

    Longest first (stable for equal sizes) keeps similar lengths together, so a padded batch's cost
    `records x longest` stays close to its packed cost. Indices inside a batch are in that order.
    """
    order = sorted(range(len(sizes)), key=lambda i: -sizes[i])
    batches: list[list[int]] = []
    start = 0
    while start < len(order):
        count, _ = take((sizes[order[k]] for k in range(start, len(order))), limits, layout)
        batches.append(order[start : start + count])
        start += count
    return batches
