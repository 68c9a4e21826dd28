"""`bench.loop_lag`: the samples it keeps and their figures (the sampler itself: tests/unit/consumer)."""

from __future__ import annotations

import asyncio

from bench.loop_lag import LoopLag, lag_figures


def test_loop_lag_keeps_every_wake_up_with_its_due_time() -> None:
    async def run() -> LoopLag:
        lag = LoopLag(period=0.002)
        lag.start()
        await asyncio.sleep(0.03)
        await lag.stop()
        return lag

    lag = asyncio.run(run())
    dues = [due for due, _ in lag.samples]
    assert len(dues) >= 3
    assert dues == sorted(dues)
    assert all(late >= 0.0 for _, late in lag.samples)


def test_lag_figures_worst_first_from_the_window_start() -> None:
    samples = [(10.0, 0.001), (10.5, 0.025), (11.0, 0.004), (12.0, 0.1)]
    figures = lag_figures(samples, 10.5, worst=2)
    assert figures["samples"] == 4
    assert figures["max_ms"] == 100.0
    assert figures["over_20ms_s"] == 0.125
    assert figures["worst"] == [{"at_s": 1.5, "ms": 100.0}, {"at_s": 0.0, "ms": 25.0}]
    assert lag_figures([], 0.0)["worst"] == []
