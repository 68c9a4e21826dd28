"""`engine.batching.cut`: the one rule that cuts a batch, checked against the three rules it replaced (the
batcher's `plan_next`, the engine's `plan_batches` padded and packed), written out plainly here."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.batching.cut import API_LIMITS, SERVICE_LIMITS, BatchLimits, Layout, plan_batches, take


def old_plan_next(tokens: Sequence[int], max_records: int, max_tokens: int) -> tuple[int, bool]:
    """The service batcher's rule before `take`: leading records in arrival order, plain token sum."""
    count = 0
    used = 0
    for size in tokens:
        if count == max_records:
            return count, True
        if count > 0 and used + size > max_tokens:
            return count, True
        count += 1
        used += size
        if used >= max_tokens:
            return count, True
    return count, count >= max_records


def old_plan_batches(
    lengths: Sequence[int], max_tokens: int, max_records: int, packed: bool
) -> list[list[int]]:
    """The engine's rule before `plan_batches` took `take`: longest first, greedy, padded or packed cost."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    total = 0
    for i in order:
        size = lengths[i]
        longest_if = max(longest, size)
        cost = total + size if packed else longest_if * (len(current) + 1)
        if current and (len(current) >= max_records or cost > max_tokens):
            batches.append(current)
            current, longest_if, total = [], size, 0
        current.append(i)
        longest = longest_if
        total += size
    if current:
        batches.append(current)
    return batches


limits_st = st.builds(BatchLimits, max_tokens=st.integers(1, 3000), max_records=st.integers(1, 12))


@given(st.lists(st.integers(0, 1500), max_size=40), limits_st)
def test_take_packed_is_the_batchers_old_rule(tokens: list[int], limits: BatchLimits) -> None:
    assert take(tokens, limits, "packed") == old_plan_next(tokens, limits.max_records, limits.max_tokens)


@given(st.lists(st.integers(1, 1500), max_size=40), limits_st, st.sampled_from(["packed", "padded"]))
def test_plan_batches_is_the_engines_old_rule(sizes: list[int], limits: BatchLimits, layout: Layout) -> None:
    old = old_plan_batches(sizes, limits.max_tokens, limits.max_records, packed=layout == "packed")
    assert plan_batches(sizes, limits, layout) == old


@given(st.lists(st.integers(1, 1500), max_size=40), limits_st, st.sampled_from(["packed", "padded"]))
def test_every_batch_fits_or_is_one_record(sizes: list[int], limits: BatchLimits, layout: Layout) -> None:
    plan = plan_batches(sizes, limits, layout)
    assert sorted(i for batch in plan for i in batch) == list(range(len(sizes)))
    for batch in plan:
        part = [sizes[i] for i in batch]
        cost = sum(part) if layout == "packed" else max(part) * len(part)
        assert len(batch) <= limits.max_records
        assert len(batch) == 1 or cost <= limits.max_tokens


def test_take_rules() -> None:
    limits = BatchLimits(max_tokens=100, max_records=4)
    assert take([10, 10, 10], limits, "packed") == (3, False)
    assert take([10] * 5, limits, "packed") == (4, True)
    assert take([60, 50], limits, "packed") == (1, True)  # next does not fit
    assert take([500, 10], limits, "packed") == (1, True)  # oversized runs alone
    assert take([50, 50, 1], limits, "packed") == (2, True)  # budget used exactly
    assert take([], limits, "packed") == (0, False)
    assert take([30, 10, 10], limits, "padded") == (3, False)  # 3 x 30 = 90
    assert take([30, 10, 10, 10], limits, "padded") == (3, True)  # 4 x 30 = 120 > 100


def test_plan_batches_keeps_similar_lengths_together() -> None:
    lengths = [100, 900, 300, 300, 50, 2000, 10]
    plan = plan_batches(lengths, BatchLimits(max_tokens=1000, max_records=3), "padded")
    assert plan == [[5], [1], [2, 3, 0], [4, 6]]  # over-long record alone, then longest first


def test_limits_must_be_positive_and_both_defaults_are_valid() -> None:
    with pytest.raises(ValueError, match="positive"):
        BatchLimits(max_tokens=0, max_records=1)
    with pytest.raises(ValueError, match="positive"):
        BatchLimits(max_tokens=1, max_records=0)
    assert (SERVICE_LIMITS.max_tokens, SERVICE_LIMITS.max_records) == (32_768, 256)
    assert (API_LIMITS.max_tokens, API_LIMITS.max_records) == (65_536, 64)
    assert SERVICE_LIMITS.with_tokens(7) == BatchLimits(max_tokens=7, max_records=256)


def test_a_packed_batch_a_little_above_the_largest_graph_is_cut_at_the_graph() -> None:
    limits = BatchLimits(max_tokens=32_768, max_records=256, graph_tokens=8_192)
    # 12 x 800 = 9,600 tokens (eager): cut at the 10 records within 8,192 instead, and full
    assert take([800] * 12, limits, "packed") == (10, True)
    # within the graph, or beyond GRAPH_SNAP x 8,192 = 14,336 (19 x 800 = 15,200): unchanged
    assert take([800] * 10, limits, "packed") == (10, False)
    assert take([800] * 19, limits, "packed") == (19, False)
    assert take([800] * 17, limits, "packed") == (10, True)  # 13,600 <= 14,336
    # one record larger than the graph runs alone as before; the padded layout has no graphs
    assert take([9_000, 800], limits, "packed") == (2, False)
    assert take([800] * 12, limits, "padded") == (12, False)
    # a smaller budget keeps the graph size (`with_tokens`); without a graph nothing changes
    assert take([800] * 12, limits.with_tokens(12_000), "packed") == (10, True)
    assert take([800] * 12, limits.with_graph(0), "packed") == (12, False)
    with pytest.raises(ValueError, match="negative"):
        BatchLimits(max_tokens=1, max_records=1, graph_tokens=-1)


@given(st.lists(st.integers(1, 1500), max_size=40), limits_st, st.integers(0, 3000))
def test_the_graph_rule_only_ever_cuts_a_prefix_within_the_graph(
    sizes: list[int], limits: BatchLimits, graph: int
) -> None:
    plain, _ = take(sizes, limits, "packed")
    count, full = take(sizes, limits.with_graph(graph), "packed")
    assert count == plain or (full and 0 < count < plain and sum(sizes[:count]) <= graph)
