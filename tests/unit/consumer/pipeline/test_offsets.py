"""Offset watermark: commit only the contiguous run of acknowledged records."""

from __future__ import annotations

import pytest

from consumer.pipeline.offsets import OffsetTracker


def test_watermark_waits_for_the_oldest_record() -> None:
    t: OffsetTracker[str] = OffsetTracker()
    for off in range(5):
        t.track("p0", off)
    assert t.committable() == {"p0": 0}
    t.done("p0", 1)
    t.done("p0", 2)
    assert t.committable() == {"p0": 0}  # 0 still pending
    t.done("p0", 0)
    assert t.committable() == {"p0": 3}
    t.mark_committed({"p0": 3})
    assert t.committable() == {}
    t.done("p0", 4)
    t.done("p0", 3)
    assert t.committable() == {"p0": 5}
    assert t.pending() == 0


def test_gaps_in_offsets_are_skipped() -> None:
    t: OffsetTracker[str] = OffsetTracker()
    for off in (10, 11, 15):
        t.track("p", off)
    t.done("p", 10)
    t.done("p", 11)
    assert t.committable() == {"p": 15}
    t.done("p", 15)
    assert t.committable() == {"p": 16}


def test_partitions_are_independent_and_forgettable() -> None:
    t: OffsetTracker[tuple[str, int]] = OffsetTracker()
    a, b = ("t", 0), ("t", 1)
    t.track(a, 0)
    t.track(b, 7)
    t.done(b, 7)
    assert t.committable() == {a: 0, b: 8}
    assert t.pending(a) == 1
    assert t.pending(b) == 0
    t.forget(a)
    t.done(a, 0)  # unknown now: ignored
    assert t.committable() == {b: 8}
    assert t.partitions() == [b]


def test_out_of_order_tracking_is_an_error() -> None:
    t: OffsetTracker[str] = OffsetTracker()
    t.track("p", 5)
    with pytest.raises(ValueError, match="out of order"):
        t.track("p", 5)


def test_committed_reports_last_commit() -> None:
    t: OffsetTracker[str] = OffsetTracker()
    t.track("p", 0)
    t.done("p", 0)
    assert t.committed() == {}
    t.mark_committed(t.committable())
    assert t.committed() == {"p": 1}


def test_spans_commit_past_their_end_only_when_done() -> None:
    t: OffsetTracker[str] = OffsetTracker()
    t.track("p", 0, 64)
    t.track("p", 64, 70)  # a run with gaps inside it (e.g. transaction markers) is one span
    t.track("p", 75)
    assert t.pending("p") == 3
    t.done("p", 64)
    assert t.committable() == {"p": 0}  # the first span is still pending
    t.done("p", 0)
    assert t.committable() == {"p": 75}
    t.done("p", 75)
    assert t.committable() == {"p": 76}
    assert t.pending() == 0


def test_spans_must_not_overlap_or_be_empty() -> None:
    t: OffsetTracker[str] = OffsetTracker()
    t.track("p", 10, 20)
    with pytest.raises(ValueError, match="out of order"):
        t.track("p", 19, 25)
    with pytest.raises(ValueError, match="empty span"):
        t.track("p", 30, 30)
