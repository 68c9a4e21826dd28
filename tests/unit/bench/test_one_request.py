"""`bench.one_request`'s pure timeline helpers on hand-made GPU events (start us, end us, name)."""

from __future__ import annotations

from bench.one_request import by_kernel, per_call


def test_by_kernel_sums_each_name_and_counts_its_launches() -> None:
    events = [(0.0, 10.0, "gate_up"), (12.0, 15.0, "down"), (20.0, 30.0, "gate_up"), (31.0, 32.0, "x" * 80)]
    assert by_kernel(events) == {"gate_up": (20.0, 2), "down": (3.0, 1), "x" * 60: (1.0, 1)}


def test_per_call_splits_at_long_idle_and_sums_the_gaps_by_neighbours() -> None:
    # two calls 10 ms apart; inside the first, 2 us idle between a and b
    events = [(0.0, 5.0, "a"), (7.0, 9.0, "b"), (10_009.0, 10_010.0, "a")]
    spans, busy, kernels, gaps = per_call(events)
    assert spans == [0.009, 0.001]
    assert busy == [0.007, 0.001]
    assert kernels == [2, 1]
    assert gaps == {("a", "b"): 2.0}
