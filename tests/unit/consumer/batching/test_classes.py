"""Priority classes of the ready queue: class order, FIFO inside a class, and the starvation bound."""

from __future__ import annotations

import pytest

from consumer.batching.classes import ClassPolicy, ClassQueues


def _queues(levels: int = 3, bound: int = 2) -> ClassQueues[str]:
    return ClassQueues(ClassPolicy(levels=levels, starvation_batches=bound))


def test_most_urgent_class_first_fifo_inside() -> None:
    q = _queues()
    for level, job in [(2, "k1"), (2, "k2"), (0, "h1"), (1, "c1"), (0, "h2")]:
        q.push(level, job)
    assert [job for _, job in q.offered()] == ["h1", "h2", "c1", "k1", "k2"]
    assert q.head(3) == [(0, "h1"), (0, "h2"), (1, "c1")]
    assert q.take(3) == ["h1", "h2", "c1"]
    assert q.take(2) == ["k1", "k2"]
    assert len(q) == 0


def test_a_starving_class_heads_the_order_after_the_bound() -> None:
    """Class 0 refilled before every batch (batches of one record); class 2 waits. It is passed over
    exactly `starvation_batches` times, then its head rides in the next batch, then class 0 again."""
    q = _queues(bound=3)
    q.push(2, "kafka")
    served = []
    for i in range(6):
        q.push(0, f"http{i}")
        served.append(q.take(1)[0])
        if "kafka" not in served:
            assert q.passed[2] == i + 1
    assert served == ["http0", "http1", "http2", "kafka", "http3", "http4"]
    assert q.passed == (0, 0, 0)


def test_a_class_that_rides_along_is_not_passed_over() -> None:
    q = _queues(bound=1)
    q.push(2, "k1")
    q.push(2, "k2")
    q.push(0, "h1")
    assert q.take(2) == ["h1", "k1"]  # the batch had room for the lower class: not passed over
    assert q.passed == (0, 0, 0)


def test_every_waiting_class_is_bounded_at_once() -> None:
    """Two lower classes starving together are both offered ahead of class 0, in class order."""
    q = _queues(bound=1)
    q.push(1, "c")
    q.push(2, "k")
    q.push(0, "h1")
    assert q.take(1) == ["h1"]
    assert q.passed == (0, 1, 1)
    q.push(0, "h2")
    assert [job for _, job in q.offered()] == ["c", "k", "h2"]
    assert q.take(1) == ["c"]
    assert q.passed == (1, 0, 2)  # h2 waited while c rode: both starving now, offered in class order
    assert q.take(1) == ["h2"]
    assert q.take(1) == ["k"]


def test_bad_levels_and_counts_are_refused() -> None:
    q = _queues(levels=2)
    with pytest.raises(ValueError, match=r"outside 0\.\.1"):
        q.push(2, "x")
    with pytest.raises(ValueError, match="1 records asked for, 0 waiting"):
        q.take(1)
    with pytest.raises(ValueError, match="at least 1"):
        ClassPolicy(levels=0)


def test_drain_returns_everything_in_class_order() -> None:
    q = _queues()
    q.push(2, "k")
    q.push(0, "h")
    assert q.drain() == ["h", "k"]
    assert len(q) == 0
    assert q.head(5) == []
