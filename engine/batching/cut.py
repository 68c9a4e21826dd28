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
    """The most one forward pass may hold: `max_tokens` by the layout's cost and `max_records` records;
    `graph_tokens`: a packed batch of at most this many tokens replays a captured CUDA graph (the engine's
    largest graph bucket, `Engine.limits`; 0: none), which `take` prefers to a batch a little larger (see
    `GRAPH_SNAP`).

    Raises `ValueError` for a limit below 1 or a negative `graph_tokens`.
    """

    max_tokens: int
    max_records: int
    graph_tokens: int = 0

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or self.max_records < 1:
            raise ValueError(
                f"batch limits must be positive: {self.max_tokens} tokens, {self.max_records} records"
            )
        if self.graph_tokens < 0:
            raise ValueError(f"graph_tokens must not be negative: {self.graph_tokens}")

    def with_tokens(self, max_tokens: int) -> BatchLimits:
        """These limits with a smaller (or larger) token budget; the record limit and graph size stay."""
        return BatchLimits(max_tokens, self.max_records, self.graph_tokens)

    def with_graph(self, graph_tokens: int) -> BatchLimits:
        """These limits with `graph_tokens` (0: no graph)."""
        return BatchLimits(self.max_tokens, self.max_records, graph_tokens)


SERVICE_LIMITS = BatchLimits(max_tokens=32_768, max_records=256)
"""The service's default (`BatchingSettings.max_batch_tokens` / `max_batch_records`)."""

API_LIMITS = BatchLimits(max_tokens=65_536, max_records=64)
"""The Python API's default (`EngineConfig.limits`, `clef-router decide`)."""


GRAPH_SNAP = 1.75
"""A packed batch that would hold more than `BatchLimits.graph_tokens` but at most this many times as many
tokens is cut at the graph's size instead (full), and the rest waits for the next batch. Just above the
largest graph the decoder runs eagerly, bound by its Python launches, which slow down further while another
thread takes the GIL: on one H100 in FP8 with a prepare thread busy (`bench.batch_sizes`, BENCHMARKS.md
"Priority classes, round five"), 11,838 tokens eagerly took 134.73 ms, the graphed 8,032 and 3,792 tokens
81.47 + 46.9 = 128.38 ms, and most records of the first are answered after 81 ms; 15,897 tokens eagerly
155.01 ms against about 163 in two graphs. So the split pays up to about 1.75 x 8,192 = 14,336 tokens."""


def take(sizes: Iterable[int], limits: BatchLimits, layout: Layout) -> tuple[int, bool]:
    """How many leading records of `sizes` (tokens per record, in the caller's order) form the next batch,
    and whether that batch is full already.

    Full means a limit is reached: `max_records` records, the token budget used exactly or more, or the
    next record not fitting. The first record always fits (alone if it costs more than the budget); no
    records give `(0, False)`. A packed batch that would end above `limits.graph_tokens` and at most
    `GRAPH_SNAP` times it is cut at the most records within `graph_tokens` instead, and is full.
    """
    count, full, total, at_graph = _take(sizes, limits, layout)
    graph = limits.graph_tokens
    if layout == "packed" and at_graph > 0 and graph < total <= GRAPH_SNAP * graph:
        return at_graph, True
    return count, full


def _take(sizes: Iterable[int], limits: BatchLimits, layout: Layout) -> tuple[int, bool, int, int]:
    """`take` without the graph rule: (count, full, the batch's tokens, the most leading records within
    `limits.graph_tokens`)."""
    padded = layout == "padded"
    count = 0
    total = 0
    longest = 0
    at_graph = 0
    for size in sizes:
        if count == limits.max_records:
            return count, True, total, at_graph
        grown = max(longest, size)
        cost = grown * (count + 1) if padded else total + size
        if count > 0 and cost > limits.max_tokens:
            return count, True, total, at_graph
        count += 1
        total += size
        longest = grown
        if total <= limits.graph_tokens:
            at_graph = count
        if cost >= limits.max_tokens:
            return count, True, total, at_graph
    return count, count >= limits.max_records, total, at_graph


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
